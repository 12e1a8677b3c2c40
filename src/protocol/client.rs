//! The client side of the harness protocol: runs a harness command (the native harness, the shipped
//! PyTorch one, or the user's own) for `describe`, `run` and `extract`, behind the [`HarnessClient`] trait
//! the shrink driver sees.

use crate::exec::executor::{Executor, Local};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::backend::BackendChoice;
use crate::classify::{Exit, FaultClass, Signature};
use crate::config::{CommandLine, Config, Harness, ShrinkFramework, ShrinkSection};
use crate::exec::child_env::{command_spec, ChildCommand, ChildContext};
use crate::exec::process::{self, ProcessError, RunOutput};

use super::types::{Description, DescriptionError};
use super::warm::WarmServer;

/// Why a protocol call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The harness could not be started.
    #[error(transparent)]
    Spawn(#[from] ProcessError),
    /// `describe` wrote nothing readable where it was asked to.
    #[error("`{command}` wrote no description to {path}: {detail}")]
    NoDescription {
        /// The command run.
        command: String,
        /// The file it was asked to write.
        path: PathBuf,
        /// How it ended and its last line.
        detail: String,
    },
    /// The description is unusable.
    #[error("`{command}`: {source}")]
    Description {
        /// The command run.
        command: String,
        /// What is wrong.
        #[source]
        source: DescriptionError,
    },
    /// `extract` failed.
    #[error("extract failed: {0}")]
    Extract(String),
    /// The shipped harness could not be installed.
    #[error("cannot install the shipped harness in {path}: {source}")]
    Install {
        /// Where.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What the shrink driver needs from a harness. The process-backed client implements it; tests drive the
/// shrink with scripted fakes.
pub trait HarnessClient: Sync {
    /// The directory the harness runs in (the probe worktree): paths in its runs' signatures are made
    /// relative to it, as the bisection's are. `None`: the paths are left as printed.
    fn cwd(&self) -> Option<&Path> {
        None
    }
    /// `describe`: the graph, checked.
    fn describe(&self, cancel: &AtomicBool) -> Result<Description, ProtocolError>;
    /// `describe --recording`: the graph as the recorded run saw it, descended into the modules the plain
    /// description kept whole, along the recorded fault. `None`: this harness does not descend.
    fn describe_recorded(
        &self,
        _recording: &Path,
        _cancel: &AtomicBool,
    ) -> Result<Option<Description>, ProtocolError> {
        Ok(None)
    }
    /// `run`: the whole model (recording it into `record` when given), or the kept nodes on recorded inputs.
    fn run(&self, request: &RunRequest, cancel: &AtomicBool) -> Result<RunOutput, ProtocolError>;
    /// `extract`: the kept nodes as a standalone model in `out`.
    fn extract(
        &self,
        keep: &[String],
        recording: &Path,
        out: &Path,
        cancel: &AtomicBool,
    ) -> Result<(), ProtocolError>;
    /// `extract --generate-over BYTES`: like `extract`, with the recorded values over `over` bytes
    /// written as their shape, dtype and range for repro.py to generate. `Ok(false)`: this harness does
    /// not generate values.
    fn extract_generated(
        &self,
        _keep: &[String],
        _recording: &Path,
        _out: &Path,
        _over: u64,
        _cancel: &AtomicBool,
    ) -> Result<bool, ProtocolError> {
        Ok(false)
    }
    /// Whether `extract` takes `--generate-over` (the shipped PyTorch harness does).
    fn generates_values(&self) -> bool {
        false
    }
    /// Runs a written `repro.py` by itself, in a fresh process in its own directory, as a maintainer
    /// would (with the project on `PYTHONPATH` only when the file says it needs it). `Ok(None)`: this
    /// harness writes no such file.
    fn run_alone(
        &self,
        _repro: &Path,
        _cancel: &AtomicBool,
    ) -> Result<Option<RunOutput>, ProtocolError> {
        Ok(None)
    }
    /// The line a maintainer runs to reproduce the kept nodes.
    fn reproduce_line(
        &self,
        minimal_model: Option<&Path>,
        keep: &[String],
        recording: &Path,
    ) -> String;
    /// This harness with its runs (and `repro.py`'s runs alone) under compute-sanitizer's memcheck, its
    /// memory-access findings read as faults of class `as_class` (the target's). For a fault that shows
    /// in the repro's own process only by where its buffers sit (an overrun just past a buffer, into
    /// memory the repro's process leaves unmapped and the harness's maps): memcheck sees every overrun
    /// wherever it lands. `None`: no sanitizer to run it under.
    fn memchecked(&self, _as_class: FaultClass) -> Option<Box<dyn HarnessClient + '_>> {
        None
    }
    /// Reads one of its runs itself: `Some` where the output is not the program's alone (memcheck's
    /// report). `None`: the run is classified as the program's output.
    fn judge(&self, _run: &RunOutput) -> Option<Signature> {
        None
    }
}

/// One `run` request.
#[derive(Clone, Debug, Default)]
pub struct RunRequest<'a> {
    /// Nodes to run (all when `None`).
    pub keep: Option<&'a [String]>,
    /// The recording boundary inputs come from.
    pub recording: Option<&'a Path>,
    /// Record every node's output here.
    pub record: Option<&'a Path>,
}

/// A harness run as a child process, speaking the protocol on its command line.
pub struct ProcessHarness {
    /// The shipped PyTorch harness (it generates values: `--generate-over`).
    torch: bool,
    /// The Python of a shipped harness (its `repro.py` runs alone with it); `None` for a harness of the
    /// user's own or the native one.
    python: Option<String>,
    prefix: CommandLine,
    /// The native harness's backend, for the reproduce line.
    native: Option<BackendChoice>,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    timeout: std::time::Duration,
    grace: std::time::Duration,
    /// Where `describe` writes its JSON.
    scratch: PathBuf,
    /// The PyTorch harness's warm server, when it started: calls run in children forked from it.
    warm: Option<WarmServer>,
    /// Where its calls run (each in a session of its own, as confirmation runs go at once): this machine
    /// unless the job's executor is handed in ([`ProcessHarness::on`]).
    executor: Arc<dyn Executor>,
    /// compute-sanitizer, when triage may use it: runs go under its memcheck when the fault shows only
    /// there ([`HarnessClient::memchecked`]).
    sanitizer: Option<PathBuf>,
}

impl ProcessHarness {
    /// The configured harness, run in `cwd` (the probe worktree, or the user's checkout). `run_dir` is
    /// the run's own directory: the shipped PyTorch harness and the description file go there.
    /// `fault_rank` is the rank of a distributed repro that faulted on its own: the harness runs that
    /// rank's work alone, told which rank through `CUDABISECT_FAULT_RANK` (and `CUDABISECT_WORLD_SIZE`),
    /// so the model's factories can build that rank's inputs.
    pub fn from_config(
        config: &Config,
        shrink: &ShrinkSection,
        cwd: &Path,
        commit: &str,
        run_dir: &Path,
        fault_rank: Option<u32>,
        capture: Option<&Path>,
    ) -> Result<Self, ProtocolError> {
        let torch = |source: Vec<String>| torch_command(shrink, run_dir, source);
        // Another framework's shipped harness: no warm server, its `repro.py` run alone with the
        // section's Python.
        let shipped = |framework, factory: &str, inputs: &str| -> Result<Self, ProtocolError> {
            let prefix = shipped_command(shrink, run_dir, framework, (factory, inputs))?;
            let mut harness = Self::new(
                config, shrink, cwd, commit, run_dir, fault_rank, prefix, None, false,
            );
            harness.python = Some(shrink.python.clone());
            Ok(harness)
        };
        // A capture's recording goes to the PyTorch harness, unless the user's own harness is named.
        let (prefix, native, shipped) = match (shrink.named_harness(), capture) {
            (
                Harness::Shipped {
                    framework,
                    factory,
                    inputs,
                },
                _,
            ) => return shipped(framework, factory, inputs),
            (Harness::Own(command), _) => (command.clone(), None, false),
            (_, Some(dir)) => (
                torch(vec!["--capture".into(), dir.display().to_string()])?,
                None,
                true,
            ),
            (Harness::Torch { model, inputs }, None) => (
                torch(vec![
                    "--model".into(),
                    model.into(),
                    "--example-inputs".into(),
                    inputs.into(),
                ])?,
                None,
                true,
            ),
            (Harness::Native(model), None) => (
                native_command(model, shrink.backend),
                Some(shrink.backend),
                false,
            ),
            (Harness::Capture, None) => {
                return Err(ProtocolError::Extract(
                    "the capture's recording is needed before its harness can run".into(),
                ))
            }
        };
        let mut harness = Self::new(
            config, shrink, cwd, commit, run_dir, fault_rank, prefix, native, shipped,
        );
        harness.python = shipped.then(|| shrink.python.clone());
        // A server that does not start costs nothing but its log: every call then runs cold.
        harness.warm = match (&harness.prefix, shipped && shrink.warm_start) {
            (CommandLine::Argv(argv), true) => {
                // One log per commit: the parent check's server does not overwrite the shrink's.
                let short = crate::git::short_sha(commit);
                let log = run_dir.join(format!("harness-server-{short}.log"));
                let wait = super::warm::Wait {
                    limit: harness.timeout,
                    cancel: None,
                };
                WarmServer::start(argv, cwd, &harness.env, &log, wait).ok()
            }
            _ => None,
        };
        Ok(harness)
    }

    /// The harness command `prefix` run in `cwd` with the shrink's environment (no warm server yet).
    #[expect(
        clippy::too_many_arguments,
        reason = "the parts of one call, named where it is made"
    )]
    fn new(
        config: &Config,
        shrink: &ShrinkSection,
        cwd: &Path,
        commit: &str,
        run_dir: &Path,
        fault_rank: Option<u32>,
        prefix: CommandLine,
        native: Option<BackendChoice>,
        torch: bool,
    ) -> Self {
        let ctx = ChildContext::harness(cwd, commit);
        // What the model needs to import and run as the repro ran it (`PYTHONPATH = "src"`, a library's
        // flags), its relative paths the worktree's.
        let mut env = config.repro_env_under(&shrink.env);
        if let Some(path) = env.get_mut("PYTHONPATH") {
            *path = crate::exec::child_env::pythonpath_under(path, cwd);
        }
        if let Some(rank) = fault_rank {
            env.insert("CUDABISECT_FAULT_RANK".into(), rank.to_string());
            env.insert(
                "CUDABISECT_WORLD_SIZE".into(),
                config.workers.gpus_per_probe.to_string(),
            );
        }
        let spec = command_spec(
            config,
            ChildCommand {
                command: &prefix,
                timeout: shrink.timeout,
                env: &env,
            },
            &ctx,
        );
        Self {
            torch,
            python: None,
            prefix,
            native,
            cwd: cwd.to_path_buf(),
            env: spec.env,
            timeout: shrink.timeout,
            grace: spec.grace,
            scratch: run_dir.to_path_buf(),
            warm: None,
            executor: Arc::new(Local),
            sanitizer: config
                .triage
                .enabled
                .then(|| crate::exec::tools::find_sanitizer(config.triage.sanitizer.as_deref()))
                .flatten(),
        }
    }

    /// Runs every call through a session of the job's `executor`. The warm server forks its children on
    /// this machine, so with an executor elsewhere it is stopped and every call runs cold there.
    pub fn on(mut self, executor: Arc<dyn Executor>) -> Self {
        if !executor.is_local() {
            self.warm = None;
        }
        self.executor = executor;
        self
    }

    fn extract_with(
        &self,
        keep: &[String],
        recording: &Path,
        out: &Path,
        extra: &[String],
        cancel: &AtomicBool,
    ) -> Result<(), ProtocolError> {
        let mut args = vec![
            "extract".into(),
            "--keep".into(),
            keep.join(","),
            "--recording".into(),
            recording.display().to_string(),
            "--out".into(),
            out.display().to_string(),
        ];
        args.extend_from_slice(extra);
        let run = self.exec(&args, cancel)?;
        // The writer's output beside what it wrote (`minimal.log` for `minimal/`): what it said, and with
        // CUDABISECT_HARNESS_TIMING=1 when each part of it ran.
        let _ = std::fs::write(out.with_extension("log"), &run.output);
        match run.exit {
            Exit::Code(0) => Ok(()),
            _ => Err(ProtocolError::Extract(ended(&run))),
        }
    }

    /// Whether calls go through a warm server.
    pub fn is_warm(&self) -> bool {
        self.warm.is_some()
    }

    fn command(&self, args: &[String]) -> CommandLine {
        match &self.prefix {
            CommandLine::Argv(v) => CommandLine::Argv(v.iter().chain(args).cloned().collect()),
            CommandLine::Shell(s) => {
                let tail: Vec<String> = args.iter().map(|a| quote(a)).collect();
                CommandLine::Shell(format!("{s} {}", tail.join(" ")))
            }
        }
    }

    fn exec(&self, args: &[String], cancel: &AtomicBool) -> Result<RunOutput, ProtocolError> {
        self.exec_under(args, None, cancel)
    }

    /// Runs a protocol call, under compute-sanitizer's memcheck when `sanitizer` is given (cold then: a
    /// forked child of the warm server is not the sanitizer's).
    fn exec_under(
        &self,
        args: &[String],
        sanitizer: Option<&Path>,
        cancel: &AtomicBool,
    ) -> Result<RunOutput, ProtocolError> {
        // Through the warm server when there is one (the client falls back to a cold run by itself when
        // the server cannot serve); the reproduce line never names the server.
        let command = match (&self.warm, sanitizer) {
            (_, Some(s)) => crate::exec::tools::under_memcheck(s, &self.command(args)),
            (Some(w), None) => {
                let via = ["--via".to_string(), w.socket().display().to_string()];
                self.command(&via.iter().chain(args).cloned().collect::<Vec<_>>())
            }
            (None, None) => self.command(args),
        };
        let spec = process::CommandSpec {
            command,
            cwd: self.cwd.clone(),
            env: match sanitizer {
                Some(_) => crate::exec::tools::pools_off(&self.env),
                None => self.env.clone(),
            },
            timeout: self.timeout,
            grace: self.grace,
            stack_dump: None,
        };
        Ok(self.executor.session().run(&spec, cancel)?)
    }

    /// The arguments of a `run` call.
    fn run_args(request: &RunRequest) -> Vec<String> {
        let mut args = vec!["run".to_string()];
        if let Some(k) = request.keep {
            args.extend(["--keep".into(), k.join(",")]);
        }
        if let Some(i) = request.recording {
            args.extend(["--recording".into(), i.display().to_string()]);
        }
        if let Some(r) = request.record {
            args.extend(["--record".into(), r.display().to_string()]);
        }
        args
    }

    /// A written `repro.py` run by itself, in a fresh process in its own directory (under memcheck when
    /// `sanitizer` is given). `None`: this harness writes no such file.
    fn run_alone_under(
        &self,
        repro: &Path,
        sanitizer: Option<&Path>,
        cancel: &AtomicBool,
    ) -> Result<Option<RunOutput>, ProtocolError> {
        let (Some(python), Some(dir)) = (&self.python, repro.parent()) else {
            return Ok(None);
        };
        let mut env = self.env.clone();
        // The project (the worktree, and its folders the repro's PYTHONPATH names) only when the file
        // says it imports it, as reproduce.sh gives it; every other entry as the harness had it.
        let path = crate::exec::child_env::seen_value(&env, "PYTHONPATH").unwrap_or_default();
        let (project, rest): (Vec<&str>, Vec<&str>) = path
            .split(':')
            .filter(|e| !e.is_empty())
            .partition(|e| Path::new(e).starts_with(&self.cwd));
        let mut entries: Vec<String> = Vec::new();
        if super::torch::needs_project(repro).is_some() {
            entries.push(self.cwd.display().to_string());
            entries.extend(project.iter().map(|e| e.to_string()));
        }
        entries.extend(rest.iter().map(|e| e.to_string()));
        env.retain(|(k, _)| k != "PYTHONPATH");
        if !entries.is_empty() {
            env.push(("PYTHONPATH".into(), entries.join(":")));
        }
        let command = CommandLine::Argv(vec![python.clone(), repro.display().to_string()]);
        let (command, env) = match sanitizer {
            Some(s) => (
                crate::exec::tools::under_memcheck(s, &command),
                crate::exec::tools::pools_off(&env),
            ),
            None => (command, env),
        };
        let spec = process::CommandSpec {
            command,
            cwd: dir.to_path_buf(),
            env,
            timeout: self.timeout,
            grace: self.grace,
            stack_dump: None,
        };
        Ok(Some(self.executor.session().run(&spec, cancel)?))
    }
}

/// The command of `framework`'s shipped harness (a row of `protocol::SHIPPED`) on `factory` and
/// `inputs`, installed into `run_dir`.
fn shipped_command(
    shrink: &ShrinkSection,
    run_dir: &Path,
    framework: ShrinkFramework,
    (factory, inputs): (&str, &str),
) -> Result<CommandLine, ProtocolError> {
    let harness = super::shipped_for(framework).ok_or_else(|| {
        ProtocolError::Extract(format!(
            "no harness is shipped for framework = \"{}\"",
            framework.name()
        ))
    })?;
    let script = harness
        .install(run_dir)
        .map_err(|source| ProtocolError::Install {
            path: run_dir.to_path_buf(),
            source,
        })?;
    let mut argv = vec![shrink.python.clone(), script.display().to_string()];
    argv.extend([harness.factory_flag.into(), factory.into()]);
    argv.extend(["--example-inputs".into(), inputs.into()]);
    if shrink.trains() {
        argv.push("--train".into());
    }
    if let Some(loss) = &shrink.loss {
        argv.extend(["--loss".into(), loss.clone()]);
    }
    argv.extend(["--device".into(), shrink.device_arg().to_string()]);
    Ok(CommandLine::Argv(argv))
}

/// The native harness (this binary's `harness` command) on a model file.
fn native_command(model: &str, backend: BackendChoice) -> CommandLine {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "cudabisect".into());
    CommandLine::Argv(vec![
        exe,
        "harness".into(),
        "--model".into(),
        model.into(),
        "--backend".into(),
        backend.as_str().into(),
    ])
}

/// Shell-quotes one argument (for shell-line harnesses and the reproduce line).
pub fn quote(arg: &str) -> String {
    shlex::try_quote(arg)
        .map(|q| q.into_owned())
        .unwrap_or_else(|_| format!("'{}'", arg.replace('\0', "").replace('\'', r"'\''")))
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// How a run ended, in words, with its last line of output.
pub fn ended(run: &RunOutput) -> String {
    let how = match run.exit {
        Exit::Code(c) => format!("exited {c}"),
        Exit::Signal(s) => format!("killed by signal {s}"),
        Exit::Timeout => "timed out".into(),
        Exit::Unknown => "ended".into(),
    };
    match last_line(&run.output) {
        "" => how,
        last => format!("{how}: {last}"),
    }
}

impl ProcessHarness {
    /// `describe [extra…] --out <file>`, read back and checked.
    fn describe_with(
        &self,
        extra: &[String],
        cancel: &AtomicBool,
    ) -> Result<Description, ProtocolError> {
        let file = tempfile::Builder::new()
            .prefix("describe-")
            .suffix(".json")
            .tempfile_in(&self.scratch)
            .or_else(|_| tempfile::NamedTempFile::new())
            .map_err(|source| ProtocolError::Install {
                path: self.scratch.clone(),
                source,
            })?;
        let path = file.path().to_path_buf();
        let mut args = vec!["describe".to_string()];
        args.extend(extra.iter().cloned());
        args.extend(["--out".into(), path.display().to_string()]);
        let command = self.command(&args).display();
        let run = self.exec(&args, cancel)?;
        let bytes = std::fs::read(&path).unwrap_or_default();
        if run.exit != Exit::Code(0) || bytes.is_empty() {
            return Err(ProtocolError::NoDescription {
                command,
                path,
                detail: ended(&run),
            });
        }
        Description::parse(&bytes).map_err(|source| ProtocolError::Description { command, source })
    }
}

impl HarnessClient for ProcessHarness {
    fn cwd(&self) -> Option<&Path> {
        Some(&self.cwd)
    }

    fn describe(&self, cancel: &AtomicBool) -> Result<Description, ProtocolError> {
        self.describe_with(&[], cancel)
    }

    fn describe_recorded(
        &self,
        recording: &Path,
        cancel: &AtomicBool,
    ) -> Result<Option<Description>, ProtocolError> {
        let extra = ["--recording".to_string(), recording.display().to_string()];
        self.describe_with(&extra, cancel).map(Some)
    }

    fn run(&self, request: &RunRequest, cancel: &AtomicBool) -> Result<RunOutput, ProtocolError> {
        self.exec(&Self::run_args(request), cancel)
    }

    fn generates_values(&self) -> bool {
        self.torch
    }

    fn extract_generated(
        &self,
        keep: &[String],
        recording: &Path,
        out: &Path,
        over: u64,
        cancel: &AtomicBool,
    ) -> Result<bool, ProtocolError> {
        if !self.torch {
            return Ok(false);
        }
        self.extract_with(
            keep,
            recording,
            out,
            &["--generate-over".into(), over.to_string()],
            cancel,
        )?;
        Ok(true)
    }

    fn extract(
        &self,
        keep: &[String],
        recording: &Path,
        out: &Path,
        cancel: &AtomicBool,
    ) -> Result<(), ProtocolError> {
        self.extract_with(keep, recording, out, &[], cancel)
    }

    fn run_alone(
        &self,
        repro: &Path,
        cancel: &AtomicBool,
    ) -> Result<Option<RunOutput>, ProtocolError> {
        self.run_alone_under(repro, None, cancel)
    }

    fn memchecked(&self, as_class: FaultClass) -> Option<Box<dyn HarnessClient + '_>> {
        let sanitizer = self.sanitizer.clone()?;
        Some(Box::new(Memchecked {
            inner: self,
            sanitizer,
            as_class,
        }))
    }

    fn reproduce_line(
        &self,
        minimal_model: Option<&Path>,
        keep: &[String],
        recording: &Path,
    ) -> String {
        if let Some(py) = minimal_model.filter(|m| m.extension().is_some_and(|e| e == "py")) {
            return format!(
                "CUDA_LAUNCH_BLOCKING=1 python {}",
                quote(&py.display().to_string())
            );
        }
        match (self.native, minimal_model) {
            (Some(backend), Some(m)) => {
                let backend = match backend {
                    BackendChoice::Cpu => "cpu",
                    BackendChoice::Cuda | BackendChoice::Auto => "cuda",
                };
                format!(
                    "CUDA_LAUNCH_BLOCKING=1 cudabisect harness run {} --backend {backend}",
                    quote(&m.display().to_string())
                )
            }
            _ => {
                let cmd = self.command(&[
                    "run".into(),
                    "--keep".into(),
                    keep.join(","),
                    "--recording".into(),
                    recording.display().to_string(),
                ]);
                format!("CUDA_LAUNCH_BLOCKING=1 {}", cmd.display())
            }
        }
    }
}

/// A [`ProcessHarness`] with every `run` and every run of `repro.py` alone under memcheck, the
/// frameworks' pooling allocators off; describing and extracting run as they do without it.
pub struct Memchecked<'a> {
    /// The harness itself.
    inner: &'a ProcessHarness,
    /// compute-sanitizer.
    sanitizer: PathBuf,
    /// The class memcheck's memory-access findings are read as: the target's.
    as_class: FaultClass,
}

impl HarnessClient for Memchecked<'_> {
    fn cwd(&self) -> Option<&Path> {
        self.inner.cwd()
    }

    fn describe(&self, cancel: &AtomicBool) -> Result<Description, ProtocolError> {
        self.inner.describe(cancel)
    }

    fn describe_recorded(
        &self,
        recording: &Path,
        cancel: &AtomicBool,
    ) -> Result<Option<Description>, ProtocolError> {
        self.inner.describe_recorded(recording, cancel)
    }

    fn run(&self, request: &RunRequest, cancel: &AtomicBool) -> Result<RunOutput, ProtocolError> {
        let args = ProcessHarness::run_args(request);
        self.inner.exec_under(&args, Some(&self.sanitizer), cancel)
    }

    fn extract(
        &self,
        keep: &[String],
        recording: &Path,
        out: &Path,
        cancel: &AtomicBool,
    ) -> Result<(), ProtocolError> {
        self.inner.extract(keep, recording, out, cancel)
    }

    fn extract_generated(
        &self,
        keep: &[String],
        recording: &Path,
        out: &Path,
        over: u64,
        cancel: &AtomicBool,
    ) -> Result<bool, ProtocolError> {
        self.inner
            .extract_generated(keep, recording, out, over, cancel)
    }

    fn generates_values(&self) -> bool {
        self.inner.generates_values()
    }

    fn run_alone(
        &self,
        repro: &Path,
        cancel: &AtomicBool,
    ) -> Result<Option<RunOutput>, ProtocolError> {
        self.inner
            .run_alone_under(repro, Some(&self.sanitizer), cancel)
    }

    fn reproduce_line(
        &self,
        minimal_model: Option<&Path>,
        keep: &[String],
        recording: &Path,
    ) -> String {
        let line = self.inner.reproduce_line(minimal_model, keep, recording);
        let bare = line
            .strip_prefix("CUDA_LAUNCH_BLOCKING=1 ")
            .unwrap_or(&line);
        format!(
            "CUDA_LAUNCH_BLOCKING=1 {} {bare}",
            super::memcheck::memcheck_prefix()
        )
    }

    fn judge(&self, run: &RunOutput) -> Option<Signature> {
        Some(super::memcheck::memcheck_signature(run, self.as_class))
    }
}

/// The shipped PyTorch harness, installed under `run_dir`, on the model `source` names (a capture, or
/// factories), training when the section does, with its loss, optimizer and device.
fn torch_command(
    shrink: &ShrinkSection,
    run_dir: &Path,
    source: Vec<String>,
) -> Result<CommandLine, ProtocolError> {
    let script = super::torch::install(run_dir).map_err(|source| ProtocolError::Install {
        path: run_dir.to_path_buf(),
        source,
    })?;
    let mut argv = vec![shrink.python.clone(), script.display().to_string()];
    argv.extend(source);
    if shrink.trains() {
        argv.push("--train".into());
    }
    for (flag, value) in [("--loss", &shrink.loss), ("--optimizer", &shrink.optimizer)] {
        if let Some(v) = value {
            argv.extend([flag.to_string(), v.clone()]);
        }
    }
    argv.extend(["--device".into(), shrink.device_arg().to_string()]);
    Ok(CommandLine::Argv(argv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips_through_a_shell_split() {
        for arg in ["plain", "with space", "it's", "$HOME", "a\"b", ""] {
            let q = quote(arg);
            assert_eq!(shlex::split(&q), Some(vec![arg.to_string()]), "{q}");
        }
    }
}
