//! Where a probe's build and repro run: processes on this machine (`local`, the default) or Slurm jobs
//! (`[executor] kind = "slurm"`). The prober sees only this trait; both executors take the same command
//! spec (the child environment contract included) and give back the same run output.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::config::{Config, ExecutorKind};
use crate::process::{self, CommandSpec, ProcessError, RunOutput};

/// Runs one command to completion, timeout or cancellation.
pub trait Executor {
    /// Runs `spec`; `cancel` is polled, and when set the command is stopped.
    fn run(&self, spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError>;

    /// True when commands run on this machine (so its GPUs are theirs, and worth checking after a run).
    fn is_local(&self) -> bool;
}

/// Processes on this machine, in their own process group.
pub struct Local;

impl Executor for Local {
    fn run(&self, spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError> {
        process::run(spec, cancel)
    }

    fn is_local(&self) -> bool {
        true
    }
}

/// The configured executor. `spool` is where a scheduler's job files go when `[executor] workdir` is not
/// set (the run's log directory).
pub fn for_config(config: &Config, spool: &Path) -> Box<dyn Executor + Send + Sync> {
    match config.executor.kind {
        ExecutorKind::Local => Box::new(Local),
        ExecutorKind::Slurm => Box::new(crate::slurm::Slurm::new(
            config.executor.clone(),
            config.workers.gpus_per_probe,
            spool,
        )),
    }
}
