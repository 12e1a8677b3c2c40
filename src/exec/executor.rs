//! Where a probe's build and repro run: processes on this machine (`local`, the default) or steps of a
//! Slurm allocation (`[executor] kind = "slurm"`). The prober sees only these traits: it opens a session
//! per probe, runs its commands in it, and drops it at the end (which, for Slurm, releases the
//! allocation). Both executors take the same command spec, the child environment contract included, and
//! give back the same run output.

use std::sync::atomic::AtomicBool;

use crate::exec::process::{self, CommandSpec, ProcessError, RunOutput};

/// Where commands run. Built once per job from the config (`run::workspace`) and handed to whoever
/// runs user code; nothing builds one for itself.
pub trait Executor: Send + Sync {
    /// A session for one probe: its commands share it (for Slurm, one allocation, made when the first
    /// command needs it).
    fn session(&self) -> Box<dyn Session>;

    /// True when commands run on this machine (so its GPUs are theirs, and worth checking after a run).
    fn is_local(&self) -> bool;

    /// Checks, before anything is written, that commands can run where this executor sends them: a
    /// refusal is bad input (one line), not a skipped probe per commit.
    fn preflight(&self) -> Result<(), String> {
        Ok(())
    }
}

/// One probe's place to run commands. Dropping it releases whatever it holds.
pub trait Session {
    /// Runs `spec` to completion, timeout or cancellation; `cancel` is polled.
    fn run(&mut self, spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError>;
}

/// Processes on this machine, in their own process group.
pub struct Local;

impl Executor for Local {
    fn session(&self) -> Box<dyn Session> {
        Box::new(Local)
    }

    fn is_local(&self) -> bool {
        true
    }
}

impl Session for Local {
    fn run(&mut self, spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError> {
        process::run(spec, cancel)
    }
}
