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
    /// Whether it shares the GPU with runs of its own kind whatever its slot says: a shrink harness's
    /// runs (the final check's confirmations at once, repro.py's writer, the parent check, triage beside).
    pub side_by_side: bool,
}

impl<'a> ChildContext<'a> {
    /// A shrink-phase child (a capture of the repro) in `worktree` at `commit`.
    pub fn shrink(worktree: &'a Path, commit: &'a str) -> Self {
        Self {
            worktree,
            commit,
            phase: ChildPhase::Shrink,
            attempt: 1,
            slot: None,
            side_by_side: false,
        }
    }

    /// A run of the shrink's harness in `worktree` at `commit`, one of several side by side on the GPU.
    pub fn harness(worktree: &'a Path, commit: &'a str) -> Self {
        Self {
            side_by_side: true,
            ..Self::shrink(worktree, commit)
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

/// `PYTHONPATH`'s entries (`value`) with the relative ones resolved against `dir`, where the repro runs:
/// `src` in a worktree is that worktree's `src` for a process started anywhere else.
pub fn pythonpath_under(value: &str, dir: &Path) -> String {
    value
        .split(':')
        .filter(|e| !e.is_empty())
        .map(|e| dir.join(e).display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// The relative entries of `[repro] env`'s `PYTHONPATH` (`src` of a src layout): the project's own
/// folders, found under wherever the project is checked out.
pub fn relative_pythonpath(env: &BTreeMap<String, String>) -> Vec<String> {
    env.get("PYTHONPATH")
        .map(|p| {
            p.split(':')
                .filter(|e| !e.is_empty() && !Path::new(e).is_absolute())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
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

/// Defaults for a worker that shares its GPU with others, set where neither cudabisect's own environment
/// nor the phase's `env` says otherwise: JAX takes 75% of the GPU at start and TensorFlow nearly all of
/// it, so a second probe on the GPU could not start; both then take memory as the run needs it.
const SHARED_GPU_DEFAULTS: [(&str, &str); 2] = [
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
    ("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
];

/// The variables that name the port a run's ranks meet on: `init_process_group`'s, and torchrun's
/// `--master-port` default.
const RENDEZVOUS_PORTS: [&str; 2] = ["MASTER_PORT", "PET_MASTER_PORT"];

/// Whether `name` is one of the variables set here that differ from run to run whatever the config says:
/// the contract's (`CUDABISECT_COMMIT`, `_ATTEMPT`, `_RANK_LOG_DIR`…) and the rendezvous port each run of
/// several workers gets. What a run imports never depends on them, so a warm interpreter started for one
/// run serves the next.
pub fn differs_per_run(name: &str) -> bool {
    name.starts_with("CUDABISECT_") || RENDEZVOUS_PORTS.contains(&name)
}

/// A TCP port free on this machine now (the system picks one).
fn free_port() -> Option<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).ok()?;
    listener.local_addr().ok().map(|a| a.port())
}

/// The full spec of a child: the user's env for the phase, the distributed defaults (and a shared GPU's)
/// they left unset, then the contract variables.
pub fn command_spec(config: &Config, command: ChildCommand, ctx: &ChildContext) -> CommandSpec {
    let mut env: Vec<(String, String)> = command
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if ctx.phase != ChildPhase::Build {
        let shared = ctx.side_by_side || ctx.slot.is_some_and(|s| s.shares_gpu);
        let defaults = DISTRIBUTED_DEFAULTS
            .iter()
            .chain(SHARED_GPU_DEFAULTS.iter().filter(|_| shared))
            .map(|&(k, v)| (k, v.to_string()));
        // Runs of several workers at once each get a rendezvous port of their own: torchrun and
        // `init_process_group` would all listen on 29500, and every run but one would fail to start.
        let port = ctx.slot.and_then(|_| free_port());
        let ports = port
            .iter()
            .flat_map(|p| RENDEZVOUS_PORTS.map(|k| (k, p.to_string())));
        for (k, v) in defaults.chain(ports) {
            if std::env::var_os(k).is_none() && !command.env.contains_key(k) {
                env.push((k.into(), v));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_of(shares_gpu: bool, user: &[(&str, &str)]) -> Vec<(String, String)> {
        spec_in(Some(shares_gpu), user)
    }

    /// A repro's environment in a worker's slot (`Some(shares its GPU)`), or with no slot (`None`: one
    /// probe at a time).
    fn spec_in(slot: Option<bool>, user: &[(&str, &str)]) -> Vec<(String, String)> {
        let config = Config::parse(
            Path::new("bisect.toml"),
            "[repro]\ncommand = \"python3 train.py\"\n",
        )
        .unwrap();
        let env: BTreeMap<String, String> = user
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let slot = slot.map(|shares_gpu| WorkerSlot {
            worker: 2,
            devices: Some("0".into()),
            shares_gpu,
            scratch: None,
        });
        let ctx = ChildContext {
            worktree: Path::new("/w"),
            commit: "abc",
            phase: ChildPhase::Repro,
            attempt: 1,
            slot: slot.as_ref(),
            side_by_side: false,
        };
        let command = ChildCommand {
            command: &config.repro.command,
            timeout: Duration::from_secs(1),
            env: &env,
        };
        command_spec(&config, command, &ctx).env
    }

    fn get<'a>(env: &'a [(String, String)], key: &str) -> Vec<&'a str> {
        env.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    #[test]
    fn a_worker_sharing_its_gpu_keeps_jax_and_tensorflow_from_taking_it_whole() {
        // Only where this process's own environment leaves them unset (it decides, as a user's would).
        for key in ["XLA_PYTHON_CLIENT_PREALLOCATE", "TF_FORCE_GPU_ALLOW_GROWTH"] {
            if std::env::var_os(key).is_some() {
                return;
            }
        }
        let env = spec_of(true, &[]);
        assert_eq!(get(&env, "XLA_PYTHON_CLIENT_PREALLOCATE"), ["false"]);
        assert_eq!(get(&env, "TF_FORCE_GPU_ALLOW_GROWTH"), ["true"]);
        // A GPU of its own: the frameworks' own defaults.
        let env = spec_of(false, &[]);
        assert!(get(&env, "XLA_PYTHON_CLIENT_PREALLOCATE").is_empty());
        assert!(get(&env, "TF_FORCE_GPU_ALLOW_GROWTH").is_empty());
        // What the user's env says stays theirs.
        let env = spec_of(true, &[("XLA_PYTHON_CLIENT_PREALLOCATE", "true")]);
        assert_eq!(get(&env, "XLA_PYTHON_CLIENT_PREALLOCATE"), ["true"]);
        // A shrink harness's run, with no slot: its runs go side by side on the GPU.
        let config = Config::parse(
            Path::new("bisect.toml"),
            "[repro]\ncommand = \"python3 train.py\"\n",
        )
        .unwrap();
        let command = ChildCommand {
            command: &config.repro.command,
            timeout: Duration::from_secs(1),
            env: &BTreeMap::new(),
        };
        let harness = ChildContext::harness(Path::new("/w"), "abc");
        let env = command_spec(&config, command, &harness).env;
        assert_eq!(get(&env, "XLA_PYTHON_CLIENT_PREALLOCATE"), ["false"]);
        let capture = ChildContext::shrink(Path::new("/w"), "abc");
        let env = command_spec(&config, command, &capture).env;
        assert!(get(&env, "XLA_PYTHON_CLIENT_PREALLOCATE").is_empty());
    }

    #[test]
    fn runs_of_several_workers_meet_their_ranks_on_ports_of_their_own() {
        for key in RENDEZVOUS_PORTS {
            if std::env::var_os(key).is_some() {
                return;
            }
        }
        let port = |env: &[(String, String)]| -> u16 {
            let ports: Vec<&str> = RENDEZVOUS_PORTS.iter().flat_map(|k| get(env, k)).collect();
            assert_eq!(ports.len(), 2, "{env:?}");
            assert_eq!(ports[0], ports[1], "{env:?}");
            ports[0].parse().unwrap()
        };
        let (a, b) = (port(&spec_of(true, &[])), port(&spec_of(false, &[])));
        assert!(a > 0 && b > 0);
        // One probe at a time: torchrun's own default.
        assert!(get(&spec_in(None, &[]), "MASTER_PORT").is_empty());
        // A port the user's env names stays theirs.
        let env = spec_of(true, &[("MASTER_PORT", "29600")]);
        assert_eq!(get(&env, "MASTER_PORT"), ["29600"]);
    }
}
