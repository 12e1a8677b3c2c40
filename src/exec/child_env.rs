//! The environment contract of every command cudabisect starts: the user's variables first, then the
//! variables cudabisect promises (documented in docs/reference/child-environment.md), in one place so the probe,
//! triage and harness runs can never drift apart.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::config::{CommandLine, Config};
use crate::exec::process::CommandSpec;

/// Which phase a command belongs to. Every phase but the build talks to the GPU and gets
/// `CUDA_LAUNCH_BLOCKING`, so a fault surfaces at the launch that caused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildPhase {
    /// Building the commit.
    Build,
    /// Running the repro.
    Repro,
    /// Running the repro under compute-sanitizer.
    Triage,
    /// Running the shrink harness (`describe`, `run`, `extract`).
    Shrink,
}

impl ChildPhase {
    /// The value of `CUDABISECT_PHASE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Build => "build",
            Self::Repro => "repro",
            Self::Triage => "triage",
            Self::Shrink => "shrink",
        }
    }
}

/// One command of a phase, as the config gives it.
#[derive(Clone, Copy, Debug)]
pub struct ChildCommand<'a> {
    /// What to run.
    pub command: &'a CommandLine,
    /// Time allowed.
    pub timeout: Duration,
    /// The user's extra environment variables for this phase.
    pub env: &'a BTreeMap<String, String>,
}

/// Where and for what a child runs.
#[derive(Clone, Copy, Debug)]
pub struct ChildContext<'a> {
    /// The working directory: the probe worktree (or the user's checkout for `shrink` without `--at`).
    pub worktree: &'a Path,
    /// The commit checked out there, full sha (empty when unknown).
    pub commit: &'a str,
    /// The phase.
    pub phase: ChildPhase,
    /// Which run of this command for this commit, from 1.
    pub attempt: u32,
    /// The parallel worker running it, and the devices it owns (`CUDA_VISIBLE_DEVICES`); `None` when
    /// probes run one at a time.
    pub slot: Option<&'a WorkerSlot>,
}

impl<'a> ChildContext<'a> {
    /// A shrink-phase child (the harness, a capture of the repro) in `worktree` at `commit`.
    pub fn shrink(worktree: &'a Path, commit: &'a str) -> Self {
        Self {
            worktree,
            commit,
            phase: ChildPhase::Shrink,
            attempt: 1,
            slot: None,
        }
    }
}

/// One parallel probe worker: its number and the devices pinned to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSlot {
    /// From 1.
    pub worker: usize,
    /// Device ids for `CUDA_VISIBLE_DEVICES` (comma-separated); `None` where no GPU is visible (no pinning).
    pub devices: Option<String>,
    /// True when another worker is pinned to the same devices (several probes at once on one GPU).
    pub shares_gpu: bool,
    /// The worker's own scratch directory: its temporary files and the JIT and kernel caches go there, so
    /// workers never read what another wrote (a shared extension build directory names wrong culprits).
    pub scratch: Option<std::path::PathBuf>,
}

/// The variables that point temporary files and the JIT and kernel caches that are not content-addressed
/// into a worker's scratch directory: (variable, subdirectory). A cache keyed by a name or a path (an
/// extension build directory, Inductor's graph and autotuning caches, Numba's index) could hand one
/// worker's build of another commit to the next. Triton's cache (`TRITON_CACHE_DIR`), the driver's PTX cache
/// (`CUDA_CACHE_PATH`) and CuPy's (`CUPY_CACHE_DIR`) are keyed by a hash of the kernel's source and options,
/// so they are left shared: a kernel no commit changed is compiled once, for every worker.
pub const WORKER_PRIVATE_DIRS: [(&str, &str); 5] = [
    ("TMPDIR", "tmp"),
    ("XDG_CACHE_HOME", "cache"),
    ("TORCH_EXTENSIONS_DIR", "cache/torch_extensions"),
    ("NUMBA_CACHE_DIR", "cache/numba"),
    ("TORCHINDUCTOR_CACHE_DIR", "cache/torchinductor"),
];

/// What a child with these extra variables sees for `key`: the last value set there, else this
/// process's own.
pub fn seen_value(env: &[(String, String)], key: &str) -> Option<String> {
    env.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var(key).ok())
}

/// The virtual environment of a probe worktree (`[build] venv`): beside it, named after it, so each
/// worker's worktree has its own and the next run reuses it.
pub fn venv_dir(worktree: &Path) -> std::path::PathBuf {
    let name = worktree
        .file_name()
        .map_or_else(|| "worktree".into(), |n| n.to_string_lossy().into_owned());
    worktree.with_file_name(format!("{name}.venv"))
}

/// The variables cudabisect sets, in the order it sets them (after the user's own, so they win).
pub fn contract_vars(config: &Config, ctx: &ChildContext) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    if ctx.phase != ChildPhase::Build {
        let blocking = if config.repro.launch_blocking {
            "1"
        } else {
            "0"
        };
        vars.push(("CUDA_LAUNCH_BLOCKING".into(), blocking.into()));
    }
    vars.push(("CUDABISECT_COMMIT".into(), ctx.commit.to_string()));
    vars.push((
        "CUDABISECT_WORKTREE".into(),
        ctx.worktree.display().to_string(),
    ));
    vars.push(("CUDABISECT_PHASE".into(), ctx.phase.as_str().to_string()));
    vars.push(("CUDABISECT_ATTEMPT".into(), ctx.attempt.to_string()));
    if ctx.phase != ChildPhase::Build {
        vars.push((
            "CUDABISECT_GPUS".into(),
            config.workers.gpus_per_probe.to_string(),
        ));
    }
    if let Some(slot) = ctx.slot {
        vars.push(("CUDABISECT_WORKER".into(), slot.worker.to_string()));
        if let Some(devices) = &slot.devices {
            vars.push(("CUDA_VISIBLE_DEVICES".into(), devices.clone()));
        }
    }
    vars
}

/// Defaults for distributed repros, set only where neither cudabisect's own environment nor the phase's
/// `env` says otherwise: NCCL prints its warnings (the lines that name a failed collective), and PyTorch
/// tears a process group down when a collective fails or times out instead of leaving the rank waiting.
const DISTRIBUTED_DEFAULTS: [(&str, &str); 2] = [
    ("NCCL_DEBUG", "WARN"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
];

/// The full spec of a child: the user's env for the phase, the distributed defaults they left unset,
/// then the contract variables.
pub fn command_spec(config: &Config, command: ChildCommand, ctx: &ChildContext) -> CommandSpec {
    let mut env: Vec<(String, String)> = command
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if ctx.phase != ChildPhase::Build {
        for (k, v) in DISTRIBUTED_DEFAULTS {
            if std::env::var_os(k).is_none() && !command.env.contains_key(k) {
                env.push((k.into(), v.into()));
            }
        }
    }
    env.extend(contract_vars(config, ctx));
    if let Some(scratch) = ctx.slot.and_then(|s| s.scratch.as_ref()) {
        // What the user's `env` sets for the phase stays theirs.
        for (var, sub) in WORKER_PRIVATE_DIRS {
            if !command.env.contains_key(var) {
                env.push((var.into(), scratch.join(sub).display().to_string()));
            }
        }
    }
    if config.build.as_ref().is_some_and(|b| b.uses_venv()) {
        // The worktree's own virtual environment first on PATH, for every child of the probe: what the
        // build installs goes there, and the repro's `python` is the one that sees it.
        let venv = venv_dir(ctx.worktree);
        let path = seen_value(&env, "PATH").unwrap_or_default();
        env.push((
            "PATH".into(),
            format!("{}:{path}", venv.join("bin").display()),
        ));
        env.push(("VIRTUAL_ENV".into(), venv.display().to_string()));
    }
    let stack_dump = (ctx.phase == ChildPhase::Repro && config.repro.stack_dump)
        .then(|| crate::exec::tools::find_program("py-spy", &[]))
        .flatten();
    CommandSpec {
        stack_dump,
        command: command.command.clone(),
        cwd: ctx.worktree.to_path_buf(),
        env,
        timeout: command.timeout,
        grace: config.repro.grace_period,
    }
}
