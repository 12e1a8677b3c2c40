//! `bisect.toml`: how to build a probe and how to run the GPU repro, parsed strictly (unknown keys and wrong
//! types are errors with file, line and column) into checked settings.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::backend::BackendChoice;
use crate::classify::{MatchPolicy, MatchPolicyError};

/// A command: an argv array run directly, or a string run by `sh -c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandLine {
    /// Program and arguments, no shell involved.
    Argv(Vec<String>),
    /// A shell line for `sh -c`.
    Shell(String),
}

impl CommandLine {
    /// The program and its arguments as they will be executed.
    pub fn argv(&self) -> (String, Vec<String>) {
        match self {
            Self::Argv(v) => (v[0].clone(), v[1..].to_vec()),
            Self::Shell(s) => ("sh".into(), vec!["-c".into(), s.clone()]),
        }
    }

    /// A readable form for messages and reports.
    pub fn display(&self) -> String {
        match self {
            Self::Argv(v) => v.join(" "),
            Self::Shell(s) => s.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for CommandLine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CommandVisitor;
        impl<'de> Visitor<'de> for CommandVisitor {
            type Value = CommandLine;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command: an array of strings (argv) or a string (run by `sh -c`)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CommandLine, E> {
                if v.trim().is_empty() {
                    return Err(E::custom("the command is empty"));
                }
                Ok(CommandLine::Shell(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CommandLine, A::Error> {
                let mut argv = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    argv.push(arg);
                }
                match argv.first() {
                    None => return Err(de::Error::custom("the command array is empty")),
                    Some(p) if p.trim().is_empty() => {
                        return Err(de::Error::custom(
                            "the command's program (its first word) is empty",
                        ))
                    }
                    Some(_) => {}
                }
                Ok(CommandLine::Argv(argv))
            }
        }
        d.deserialize_any(CommandVisitor)
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map_err(|e| de::Error::custom(format!("invalid duration `{text}`: {e}")))
}

/// A time limit: a duration of at least a second (a zero or sub-second limit would end every command at
/// once or before it started: a typo, as `1ns` for `1m`).
fn timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let value = duration(d)?;
    if value.is_zero() {
        return Err(de::Error::custom(
            "a zero timeout would stop every command at once: give a positive duration such as \"10m\"",
        ));
    }
    if value < Duration::from_secs(1) {
        return Err(de::Error::custom(format!(
            "a timeout of {} would stop every command before it started: give at least a second, such as \"10m\"",
            humantime::format_duration(value)
        )));
    }
    Ok(value)
}

fn default_build_timeout() -> Duration {
    Duration::from_secs(20 * 60)
}
fn default_repro_timeout() -> Duration {
    Duration::from_secs(10 * 60)
}
fn default_triage_timeout() -> Duration {
    Duration::from_secs(60 * 60)
}
fn default_grace() -> Duration {
    Duration::from_secs(5)
}
fn yes() -> bool {
    true
}
fn default_infra_retries() -> u32 {
    1
}

/// `[build]`: how to build a probe commit. Optional: without it nothing is built.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BuildSection {
    /// The build command, run in the probe worktree.
    pub command: CommandLine,
    /// Time allowed for one build.
    #[serde(default = "default_build_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Remove untracked and ignored files before each build (cold but clean builds).
    #[serde(default)]
    pub clean: bool,
    /// Build and run each worktree in a Python virtual environment of its own, layered over the user's
    /// (`--system-site-packages`), so `pip install -e .` never writes into the user's environment.
    /// Default: on when the build command installs a Python package into the running interpreter.
    #[serde(default)]
    pub venv: Option<bool>,
}

impl BuildSection {
    /// Whether worktrees get a virtual environment of their own.
    pub fn uses_venv(&self) -> bool {
        self.venv
            .unwrap_or_else(|| installs_into_python(&self.command))
    }
}

/// Whether a build command installs a Python package into the interpreter it finds (`pip install`,
/// `python -m pip install`, `uv pip install`, `setup.py develop|install`), not into a directory it names.
pub fn installs_into_python(command: &CommandLine) -> bool {
    static INSTALL: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(^|[\s/;&|])(pip3?(\.\d+)?\s+install|-m\s+pip\s+install|uv\s+pip\s+install|setup\.py\s+(develop|install))\b")
            .expect("pattern")
    });
    static ELSEWHERE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\s(--target|-t|--prefix|--root)(\s|=)").expect("pattern")
    });
    let text = match command {
        CommandLine::Shell(s) => s.clone(),
        CommandLine::Argv(v) => v.join(" "),
    };
    INSTALL.is_match(&text) && !ELSEWHERE.is_match(&text)
}

/// `[repro]`: how to run the GPU repro.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReproSection {
    /// The repro command, run in the probe worktree.
    pub command: CommandLine,
    /// Time allowed for one run; past it the run is a hang.
    #[serde(default = "default_repro_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Set `CUDA_LAUNCH_BLOCKING=1` (the default). Turning it off is recorded in the report.
    #[serde(default = "yes")]
    pub launch_blocking: bool,
    /// Time between SIGTERM and SIGKILL when a run is stopped.
    #[serde(default = "default_grace", deserialize_with = "duration")]
    pub grace_period: Duration,
    /// How often to rerun a probe whose failure is an infrastructure problem before skipping it.
    #[serde(default = "default_infra_retries")]
    pub infra_retries: u32,
    /// Runs of a probe before it counts as clean: a fault that shows only some of the time is caught when
    /// any run shows it. 1 (the default) trusts a single clean run.
    #[serde(default = "one")]
    pub attempts: u32,
    /// GPUs one run of a distributed repro needs (torchrun's `--nproc-per-node`): reserved per probe,
    /// composing with parallel workers, and passed on as `CUDABISECT_GPUS`. Same as `[search]
    /// gpus-per-probe`; give one or the other.
    pub gpus: Option<u32>,
    /// How long to wait after a run for its processes to leave the GPU before the next run; past it the
    /// probe is an infrastructure failure.
    #[serde(default = "default_idle_timeout", deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// When a run times out, dump its Python processes' stacks with `py-spy` (when installed) before they
    /// are killed, so a hang says where each rank was.
    #[serde(default = "yes")]
    pub stack_dump: bool,
    /// Python repros (`python script.py`, `python -m mod`, `pytest`) run in children forked from a warm
    /// interpreter that has already imported the heavy modules outside the worktree. Default on.
    #[serde(default = "yes")]
    pub warm: bool,
    /// What the warm interpreter imports; default: what the first warm run imported from outside the
    /// worktree.
    #[serde(default)]
    pub preload: Option<Vec<String>>,
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

/// `[search]`: how probe outcomes steer the search.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SearchSection {
    /// Same-bug policy: `class+kernel` (default), `class`, or `regex:<pattern>`.
    #[serde(rename = "match")]
    pub match_policy: Option<String>,
    /// Probes at once: a number (a cap), or `"auto"` (the default: workers on every visible GPU, or
    /// group of `gpus-per-probe` of them, as many at once on each as its memory holds at the bad end's
    /// peak; one where no GPU is visible).
    #[serde(default)]
    pub jobs: Jobs,
    /// The GPUs to use (`CUDA_VISIBLE_DEVICES` ids); default: those visible.
    pub devices: Option<Vec<DeviceId>>,
    /// GPUs each probe needs (a multi-GPU repro); each worker gets that many of its own.
    #[serde(default = "one", rename = "gpus-per-probe")]
    pub gpus_per_probe: u32,
    /// Runs of the bad end at the start. When any of them is clean, the fault is flaky and the search is
    /// the Bayesian one. Default 1 (a fault taken to show every time).
    #[serde(default, rename = "endpoint-runs")]
    pub endpoint_runs: Option<u32>,
    /// The flaky search stops when its answer is this likely. Writing it says the fault may be flaky:
    /// the search is flaky-aware from the start.
    #[serde(default)]
    pub confidence: Option<f64>,
    /// The flaky search's budget of repro runs.
    #[serde(default = "default_max_runs", rename = "max-runs")]
    pub max_runs: u32,
}

fn default_confidence() -> f64 {
    0.99
}

fn default_max_runs() -> u32 {
    300
}

impl Default for SearchSection {
    fn default() -> Self {
        Self {
            match_policy: None,
            jobs: Jobs::Auto,
            devices: None,
            gpus_per_probe: 1,
            endpoint_runs: None,
            confidence: None,
            max_runs: default_max_runs(),
        }
    }
}

/// Runs of the bad end (all faulting) and of the culprit's parent (all clean) that make a plain answer
/// trustworthy at `confidence`: a fault that shows in at least half the runs would have shown in one of
/// them with that probability.
pub fn runs_for_confidence(confidence: f64) -> u32 {
    (1.0 / (1.0 - confidence)).log2().ceil().max(1.0) as u32
}

/// `[search] jobs`: how many probes run at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Jobs {
    /// One at a time.
    One,
    /// At most this many (fewer on a GPU whose memory holds fewer).
    Count(u32),
    /// Workers on every visible GPU (or group of `gpus-per-probe`), as many at once as memory and half
    /// the cores allow; one when no GPU is visible.
    #[default]
    Auto,
}

impl Jobs {
    /// `auto` or a number of at least 1.
    pub fn parse(text: &str) -> Result<Jobs, String> {
        if text == "auto" {
            return Ok(Jobs::Auto);
        }
        match text.parse::<u32>() {
            Ok(0) | Err(_) => Err(format!(
                "jobs: expected \"auto\" or a number of at least 1, got {text:?}"
            )),
            Ok(1) => Ok(Jobs::One),
            Ok(n) => Ok(Jobs::Count(n)),
        }
    }
}

impl<'de> Deserialize<'de> for Jobs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Any TOML value, so that a wrong one is named in the message (not serde's internal enum).
        let text = match toml::Value::deserialize(d)? {
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::String(t) => t,
            other => {
                return Err(serde::de::Error::custom(format!(
                    "jobs = {other}: give a whole number of probes at once, or \"auto\""
                )))
            }
        };
        Jobs::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A device id as `CUDA_VISIBLE_DEVICES` takes it: an index (`0`) or a UUID (`GPU-…`, `MIG-…`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceId(pub String);

impl<'de> Deserialize<'de> for DeviceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = match toml::Value::deserialize(d)? {
            toml::Value::Integer(n) if n >= 0 => n.to_string(),
            toml::Value::String(t) => t,
            other => {
                return Err(serde::de::Error::custom(format!(
                    "devices: {other} is not a device id (an index such as 0, or a UUID such as \"GPU-…\")"
                )))
            }
        };
        if text.is_empty() || text.contains([',', ' ']) {
            return Err(serde::de::Error::custom(format!(
                "devices: {text:?} is not one device id"
            )));
        }
        Ok(DeviceId(text))
    }
}

fn default_shrink_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_confirm() -> u32 {
    5
}

fn one() -> u32 {
    1
}

fn default_python() -> String {
    "python3".into()
}

/// `[shrink]`: the harness that can describe the model and run parts of it (the harness protocol).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ShrinkSection {
    /// Shrink at the end of `start`.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A command speaking the harness protocol (`… describe`, `… run`, `… extract`).
    pub harness: Option<CommandLine>,
    /// The native harness on this model file (relative to the repository root); or, with `inputs`, the
    /// PyTorch harness on this model factory (`package.module:build`).
    pub model: Option<String>,
    /// The factory of the example inputs (`package.module:example_inputs`): for the PyTorch harness the
    /// model's inputs; for `framework = "jax"` the function's arguments; for `"keras"` the model's
    /// inputs (with `train`, its `(x, y)` batch).
    pub inputs: Option<String>,
    /// Which shipped harness the factories speak to: `torch` (the default), `jax` (a JAX function,
    /// split into the equations of its jaxpr) or `keras` (a Keras 3 model, split into its layers).
    #[serde(default)]
    pub framework: ShrinkFramework,
    /// `framework = "jax"`: the function to shrink (`package.module:train_step`), called with the
    /// example inputs. A training step is shrunk through its forward, backward and update equations.
    pub function: Option<String>,
    /// The PyTorch harness: shrink the whole training step (forward, loss, backward and, with
    /// `optimizer`, the update), not the forward pass alone. Left out, the training step is shrunk when
    /// the fault was met in the backward, loss or optimizer phase; `false` is never overridden.
    #[serde(default)]
    pub train: Option<bool>,
    /// The PyTorch harness with factories: the loss (`package.module:loss`, the model's output -> a
    /// scalar; default the sum of the outputs). Implies `train`.
    pub loss: Option<String>,
    /// The PyTorch harness with factories: the optimizer's factory (`package.module:make`, the model ->
    /// its optimizer). Implies `train`.
    pub optimizer: Option<String>,
    /// The user's own training step (`package.module:train_step`, called with no arguments): captured
    /// like a training script, in its own process.
    pub step: Option<String>,
    /// Take the model, optimizer and batch from the repro command itself (the default when no model,
    /// harness or step is named).
    #[serde(default)]
    pub capture: bool,
    /// The PyTorch harness: the Python interpreter (default `python3`).
    #[serde(default = "default_python")]
    pub python: String,
    /// The shipped harnesses: the device. Left out, the one the fault happened on: a captured step's
    /// own device, else `cuda` when a GPU is usable and `cpu` when not.
    #[serde(default)]
    pub device: Option<String>,
    /// The PyTorch harness: build the model once in a warm server and fork each run from it, instead of
    /// importing torch and building the model again for every run.
    #[serde(default = "yes")]
    pub warm_start: bool,
    /// The native harness's backend: cuda, cpu or auto.
    #[serde(default)]
    pub backend: BackendChoice,
    /// Time allowed for one harness run.
    #[serde(default = "default_shrink_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Runs of a candidate before it counts as not reproducing (for faults that do not show every time).
    #[serde(default = "one")]
    pub attempts: u32,
    /// Runs of the minimal subgraph in the final check.
    #[serde(default = "default_confirm")]
    pub confirm: u32,
    /// Confirmation runs at once (they are independent). Left out: as many as the search ran at once on
    /// the GPU (one for a `shrink` on its own, or where probes ran one at a time). A run that does not
    /// reproduce while others share the GPU (an out-of-memory, a fault disturbed by another's) is run again
    /// alone, so running them together never changes the verdict.
    #[serde(default)]
    pub confirm_jobs: Option<u32>,
    /// Also run the minimal subgraph at the first bad commit's parent, where it should pass.
    #[serde(default = "yes")]
    pub check_parent: bool,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Not written by the user: the section `start` and `nightly` shrink with when bisect.toml has none
    /// (a capture of the repro command).
    #[serde(skip)]
    pub implicit: bool,
}

/// Which shipped harness `[shrink]`'s factories are for.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ShrinkFramework {
    /// The PyTorch harness (an `nn.Module`, or a captured training step).
    #[default]
    Torch,
    /// The JAX harness on a function: its jaxpr, equation by equation.
    Jax,
    /// The JAX harness on a Keras 3 model: its layers (or, with `train`, its training step's jaxpr).
    Keras,
}

impl ShrinkSection {
    /// The model comes from a capture of the repro command (or of `step`), not from factories, a model
    /// file or a harness of the user's own.
    pub fn captures(&self) -> bool {
        self.framework == ShrinkFramework::Torch
            && (self.capture
                || self.step.is_some()
                || (self.harness.is_none() && self.model.is_none()))
    }

    /// The PyTorch harness runs the whole training step.
    pub fn trains(&self) -> bool {
        // An explicit `train = false` is never overridden (the config refuses it beside loss or optimizer).
        self.train
            .unwrap_or(self.loss.is_some() || self.optimizer.is_some())
    }

    /// Whether the training step may be chosen for the user (`train` left out, no loss or optimizer).
    pub fn train_left_out(&self) -> bool {
        self.train.is_none() && self.loss.is_none() && self.optimizer.is_none()
    }

    /// Factories, a model file or a harness of the user's own name the model (a `step` with factories
    /// names its `model` too: the config requires it).
    pub fn has_factories(&self) -> bool {
        self.harness.is_some() || self.model.is_some() || self.function.is_some()
    }

    /// The device argument of the shipped harnesses (`auto`: the fault's own device).
    pub fn device_arg(&self) -> &str {
        self.device.as_deref().unwrap_or("auto")
    }

    /// The section used when bisect.toml has no `[shrink]`: capture the faulting step from the repro
    /// command, every other key at its default.
    pub fn implicit() -> Self {
        Self {
            enabled: yes(),
            harness: None,
            model: None,
            inputs: None,
            framework: ShrinkFramework::Torch,
            function: None,
            train: None,
            loss: None,
            optimizer: None,
            step: None,
            capture: true,
            python: default_python(),
            device: None,
            warm_start: yes(),
            backend: BackendChoice::default(),
            timeout: default_shrink_timeout(),
            attempts: one(),
            confirm: default_confirm(),
            confirm_jobs: None,
            check_parent: yes(),
            env: BTreeMap::new(),
            implicit: true,
        }
    }
}

/// `[bundle]`: where the hand-off bundle goes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BundleSection {
    /// Write a bundle at the end of start, shrink and triage.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The bundle root, relative to the repository root (or absolute); bundles go in `<dir>/<short sha>/`.
    /// Default: `bundles/` in the state directory under the git directory, never the working tree.
    pub dir: Option<String>,
    /// Copy the cudabisect binary into the bundle (for native-harness repros on machines without it).
    #[serde(default)]
    pub include_binary: bool,
}

impl Default for BundleSection {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: None,
            include_binary: false,
        }
    }
}

/// `[nightly]`: hooks of the nightly job.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NightlySection {
    /// Run after a night that ends in `regression` or `fixed` (chat or issue-tracker hooks the team owns),
    /// with the status and the report's paths in its environment.
    pub notify: Option<CommandLine>,
    /// Time allowed for the notify command.
    #[serde(default = "default_notify_timeout", deserialize_with = "timeout")]
    pub notify_timeout: Duration,
}

fn default_notify_timeout() -> Duration {
    Duration::from_secs(120)
}

impl Default for NightlySection {
    fn default() -> Self {
        Self {
            notify: None,
            notify_timeout: default_notify_timeout(),
        }
    }
}

/// `[triage]`: the compute-sanitizer rerun on the first bad commit.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TriageSection {
    /// Run triage at the end of `start`.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The command to sanitize; defaults to the repro command.
    pub command: Option<CommandLine>,
    /// Time allowed for one sanitizer run (they are 10–100× slower than plain runs).
    #[serde(default = "default_triage_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The compute-sanitizer executable.
    pub sanitizer: Option<String>,
}

impl Default for TriageSection {
    fn default() -> Self {
        Self {
            enabled: true,
            command: None,
            timeout: default_triage_timeout(),
            env: BTreeMap::new(),
            sanitizer: None,
        }
    }
}

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    build: Option<BuildSection>,
    repro: ReproSection,
    #[serde(default)]
    search: SearchSection,
    #[serde(default)]
    triage: TriageSection,
    shrink: Option<ShrinkSection>,
    #[serde(default)]
    bundle: BundleSection,
    #[serde(default)]
    nightly: NightlySection,
    #[serde(default)]
    executor: ExecutorSection,
}

/// `[executor]`: where probes' builds and repros run.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExecutorSection {
    /// `local` (the default: processes on this machine) or `slurm` (a Slurm allocation per probe, its
    /// build and repro run in it as job steps).
    #[serde(default)]
    pub kind: ExecutorKind,
    /// Slurm partition (`--partition`).
    pub partition: Option<String>,
    /// Slurm account (`--account`).
    pub account: Option<String>,
    /// Generic resources per allocation (`--gres`, e.g. `gpu:2`); default `gpu:<gpus-per-probe>`. `""`
    /// asks for none.
    pub gres: Option<String>,
    /// Slurm's own time limit per allocation (`--time`); default: the probe's build and repro runs
    /// (retries included) plus 5 minutes. Queue time never counts toward the repro's timeout, which
    /// cudabisect keeps itself.
    #[serde(default, deserialize_with = "opt_duration")]
    pub time: Option<Duration>,
    /// Extra `sbatch` arguments, as given.
    #[serde(default)]
    pub sbatch_args: Vec<String>,
    /// A directory the compute nodes see (a shared filesystem): probe worktrees and the allocations'
    /// output files go there instead of the repository's `.git/cudabisect/`.
    pub workdir: Option<PathBuf>,
    /// How long an allocation may wait in the queue for a reason that means it cannot start (its nodes
    /// down or drained, a partition down) before the probe is an infrastructure failure. Default 1 hour.
    #[serde(
        default = "default_stuck_timeout",
        deserialize_with = "duration",
        rename = "stuck-timeout"
    )]
    pub stuck_timeout: Duration,
}

fn default_stuck_timeout() -> Duration {
    Duration::from_secs(60 * 60)
}

/// `[executor] kind`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// Processes on this machine.
    #[default]
    Local,
    /// Slurm jobs.
    Slurm,
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// Checked settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// The file's text, copied into the run's records.
    pub text: String,
    /// Build settings, when there is a build step.
    pub build: Option<BuildSection>,
    /// Repro settings.
    pub repro: ReproSection,
    /// Same-bug policy.
    pub match_policy: MatchPolicy,
    /// Parallel probes: `[search] jobs`, `devices`, `gpus-per-probe`.
    pub workers: WorkerSettings,
    /// Flaky faults: `[search] endpoint-runs`, `confidence`, `max-runs`.
    pub flaky: FlakySettings,
    /// Triage settings.
    pub triage: TriageSection,
    /// The `[shrink]` section as written, when there is one (see [`Config::shrink_section`]).
    pub shrink: Option<ShrinkSection>,
    /// Bundle settings.
    pub bundle: BundleSection,
    /// Nightly-job settings.
    pub nightly: NightlySection,
    /// Where builds and repros run.
    pub executor: ExecutorSection,
}

/// A `[search]` message, prefixed with its section unless it names one itself (`[repro] gpus …`).
fn in_section(message: &str) -> String {
    if message.starts_with('[') {
        message.to_string()
    } else {
        format!("[search] {message}")
    }
}

/// `[search]`'s flaky-fault settings, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlakySettings {
    /// Runs of the bad end at the start, at least 1.
    pub endpoint_runs: u32,
    /// The confidence the answer must reach, in (0.5, 1).
    pub confidence: f64,
    /// Whether the config wrote a confidence (then every answer states the one it reached).
    pub asked: bool,
    /// The budget of repro runs.
    pub max_runs: u32,
}

/// `[repro] attempts` above this is refused: it is a flaky fault, and the flaky search's job.
pub const MAX_ATTEMPTS: u32 = 100;

impl Default for FlakySettings {
    fn default() -> Self {
        Self {
            endpoint_runs: 1,
            confidence: default_confidence(),
            asked: false,
            max_runs: default_max_runs(),
        }
    }
}

/// `[search]`'s parallel-probe settings, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Probes at once.
    pub jobs: Jobs,
    /// The GPUs to use; `None`: those visible.
    pub devices: Option<Vec<String>>,
    /// GPUs per probe, at least 1.
    pub gpus_per_probe: u32,
}

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No config was found where one is looked for.
    #[error("no config: {} has no bisect.toml and its pyproject.toml no [tool.cudabisect] section; `cudabisect init -- <repro command>` writes one", root.display())]
    Missing {
        /// The repository root.
        root: PathBuf,
    },
    /// A `pyproject.toml` given as the config has no `[tool.cudabisect]` table.
    #[error("{path} has no [tool.cudabisect] section: add one (the keys of bisect.toml, under [tool.cudabisect], [tool.cudabisect.repro], …) or give a bisect.toml")]
    NoToolSection {
        /// The file.
        path: PathBuf,
    },
    /// The file is missing or unreadable.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The path tried.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys or wrong types.
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The `[shrink]` section is inconsistent.
    #[error("{path}: [shrink] {message}")]
    Shrink {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A search or repro setting is invalid (the message names its section when it is not `[search]`).
    #[error("{path}: {}", in_section(message))]
    Search {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The match policy is invalid.
    #[error("{path}: [search] match: {source}")]
    Match {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: MatchPolicyError,
    },
}

impl Config {
    /// The shrink to run at the first bad commit: the `[shrink]` section unless it says
    /// `enabled = false`, and with no section a capture of the repro command.
    pub fn shrink_section(&self) -> Option<ShrinkSection> {
        match &self.shrink {
            Some(section) => section.enabled.then(|| section.clone()),
            None => Some(ShrinkSection::implicit()),
        }
    }

    /// Where a job's config is: an explicit path as given (relative to the current directory, as every
    /// other path on the command line); else `bisect.toml` at the repository root; else the root's
    /// `pyproject.toml` when it has a `[tool.cudabisect]` table. bisect.toml wins when both exist.
    pub fn find(root: &Path, given: Option<&Path>) -> Result<PathBuf, ConfigError> {
        if let Some(path) = given {
            return Ok(path.to_path_buf());
        }
        let own = root.join("bisect.toml");
        if own.exists() {
            return Ok(own);
        }
        let pyproject = root.join("pyproject.toml");
        if std::fs::read_to_string(&pyproject).is_ok_and(|t| has_tool_section(&t)) {
            return Ok(pyproject);
        }
        Err(ConfigError::Missing {
            root: root.to_path_buf(),
        })
    }

    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Checks config text; `path` names it in errors. A file named `pyproject.toml` is read for its
    /// `[tool.cudabisect]` table, with the same keys, checks and errors (lines and columns of the whole
    /// file); its records then hold that table alone, written as a bisect.toml.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let parse_error = |e: toml::de::Error| {
            let (line, column) = e
                .span()
                .map(|s| line_column(text, s.start))
                .unwrap_or((1, 1));
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().trim().to_string(),
            }
        };
        if is_pyproject(path) {
            let doc: Pyproject = toml::from_str(text).map_err(parse_error)?;
            let no_section = || ConfigError::NoToolSection {
                path: path.to_path_buf(),
            };
            let raw = doc.tool.and_then(|t| t.cudabisect).ok_or_else(no_section)?;
            // The table alone, as the bisect.toml it stands for: what the records, the bundle and the
            // journal's fingerprint see, so editing the rest of pyproject.toml changes none of them.
            let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
            let own = table
                .get("tool")
                .and_then(|t| t.get("cudabisect"))
                .and_then(toml::Value::as_table)
                .ok_or_else(no_section)?;
            let standalone = toml::to_string(own).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                line: 1,
                column: 1,
                message: format!("[tool.cudabisect] cannot be written as bisect.toml: {e}"),
            })?;
            return Self::checked(path, raw, text, standalone);
        }
        let raw: RawConfig = toml::from_str(text).map_err(parse_error)?;
        Self::checked(path, raw, text, text.to_string())
    }

    /// Checks what was read; `text` is the file (for positions), `record` what the run keeps of it.
    fn checked(
        path: &Path,
        mut raw: RawConfig,
        text: &str,
        record: String,
    ) -> Result<Self, ConfigError> {
        let match_policy =
            MatchPolicy::parse(raw.search.match_policy.as_deref().unwrap_or("class+kernel"))
                .map_err(|source| ConfigError::Match {
                    path: path.to_path_buf(),
                    source,
                })?;
        if raw.repro.attempts == 0 {
            // Point at the key itself, as a parse error would.
            let offset = text
                .match_indices("attempts")
                .map(|(i, _)| i)
                .find(|&i| {
                    text[..i]
                        .rfind("repro]")
                        .is_some_and(|r| !text[r..i].contains("\n["))
                })
                .unwrap_or(0);
            let (line, column) = line_column(text, offset);
            return Err(ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: "[repro] attempts must be at least 1".into(),
            });
        }
        let search_err = |message: String| ConfigError::Search {
            path: path.to_path_buf(),
            message,
        };
        if raw.search.endpoint_runs == Some(0) || raw.search.max_runs == 0 {
            return Err(search_err(
                "endpoint-runs and max-runs must be at least 1".into(),
            ));
        }
        if let Some(c) = raw.search.confidence {
            if !(c > 0.5 && c < 1.0) {
                return Err(search_err(format!(
                    "confidence must be between 0.5 and 1 (exclusive), not {}",
                    if c.is_finite() && c.abs() < 1e6 && c.abs() > 1e-6 {
                        c.to_string()
                    } else {
                        format!("{c:e}")
                    }
                )));
            }
        }
        // A confidence written down says the fault may not show every time: the bad end runs enough
        // times for a clean run there not to mislead at that confidence.
        let needed = raw.search.confidence.map(runs_for_confidence);
        let endpoint_runs = match (raw.search.endpoint_runs, needed) {
            (Some(given), Some(needed)) if given < needed => {
                return Err(search_err(format!(
                    "confidence = {} needs at least {needed} runs of the bad end to tell a flaky fault, and endpoint-runs = {given}: remove endpoint-runs (cudabisect then runs it {needed} times) or raise it",
                    raw.search.confidence.unwrap_or_default()
                )));
            }
            (Some(given), _) => given,
            (None, Some(needed)) => needed,
            (None, None) => 1,
        };
        if endpoint_runs > raw.search.max_runs {
            return Err(search_err(format!(
                "endpoint-runs = {endpoint_runs} is more than the max-runs budget ({}): raise max-runs or lower endpoint-runs",
                raw.search.max_runs
            )));
        }
        if raw.repro.attempts > MAX_ATTEMPTS {
            return Err(search_err(format!(
                "[repro] attempts = {} is more than {MAX_ATTEMPTS}: a fault that needs more runs than that is a flaky one; set [search] confidence instead",
                raw.repro.attempts
            )));
        }
        if raw.repro.gpus == Some(0) {
            return Err(ConfigError::Search {
                path: path.to_path_buf(),
                message: "[repro] gpus must be at least 1".into(),
            });
        }
        if let Some(gpus) = raw.repro.gpus {
            if raw.search.gpus_per_probe != 1 && raw.search.gpus_per_probe != gpus {
                return Err(ConfigError::Search {
                    path: path.to_path_buf(),
                    message: format!(
                        "[repro] gpus = {gpus} and [search] gpus-per-probe = {} disagree: give one of them",
                        raw.search.gpus_per_probe
                    ),
                });
            }
            raw.search.gpus_per_probe = gpus;
        }
        if raw.search.gpus_per_probe == 0 {
            return Err(ConfigError::Search {
                path: path.to_path_buf(),
                message: "gpus-per-probe must be at least 1".into(),
            });
        }
        if let Some(devices) = &raw.search.devices {
            // A device may be listed twice (two workers share it), but never twice for one probe.
            let per = raw.search.gpus_per_probe.max(1) as usize;
            for group in devices.chunks(per) {
                let mut seen = std::collections::HashSet::new();
                if let Some(twice) = group
                    .iter()
                    .map(|d| d.0.clone())
                    .find(|d| !seen.insert(d.clone()))
                {
                    return Err(ConfigError::Search {
                        path: path.to_path_buf(),
                        message: format!(
                            "devices gives GPU {twice} twice to one probe: a probe of gpus-per-probe = {per} needs {per} different GPUs"
                        ),
                    });
                }
            }
        }
        if raw.search.devices.as_ref().is_some_and(Vec::is_empty) {
            return Err(ConfigError::Search {
                path: path.to_path_buf(),
                message: "devices: give at least one device, or leave it out to use those visible"
                    .into(),
            });
        }
        if let Some(shrink) = &raw.shrink {
            let err = |message: &str| ConfigError::Shrink {
                path: path.to_path_buf(),
                message: message.to_string(),
            };
            // The shipped JAX harness first: its own words for keys that belong to the PyTorch one.
            match shrink.framework {
                ShrinkFramework::Torch if shrink.function.is_some() => {
                    return Err(err(
                        "function is for framework = \"jax\": set it, or name a model",
                    ))
                }
                ShrinkFramework::Torch => {}
                other => {
                    let (name, field, what) = match other {
                        ShrinkFramework::Jax => ("jax", "function", &shrink.function),
                        _ => ("keras", "model", &shrink.model),
                    };
                    if shrink.harness.is_some() || shrink.capture || shrink.step.is_some() {
                        return Err(err(&format!(
                            "framework = \"{name}\" uses the shipped JAX harness: leave harness, capture and step out"
                        )));
                    }
                    if !what.as_deref().is_some_and(|f| f.contains(':')) || shrink.inputs.is_none()
                    {
                        return Err(err(&format!(
                            "framework = \"{name}\" needs {field} = \"package.module:name\" and inputs = \"package.module:example_inputs\""
                        )));
                    }
                    if other == ShrinkFramework::Jax && shrink.model.is_some() {
                        return Err(err("framework = \"jax\" shrinks a function: name it as function, not model"));
                    }
                    if shrink.optimizer.is_some() {
                        return Err(err(&format!(
                            "framework = \"{name}\" takes no optimizer: a JAX step does its own update, a compiled Keras model has its own"
                        )));
                    }
                    if other == ShrinkFramework::Jax && shrink.trains() {
                        return Err(err("framework = \"jax\": the function is what runs (name the training step itself); train and loss are for models"));
                    }
                }
            }
            if shrink.train == Some(false) && (shrink.loss.is_some() || shrink.optimizer.is_some())
            {
                return Err(err(
                    "train = false shrinks the forward pass alone: loss and optimizer are for the training step (remove them, or set train = true)",
                ));
            }
            match (&shrink.harness, &shrink.model) {
                (Some(_), Some(_)) => return Err(err("give either harness or model, not both")),
                (Some(_), None) if shrink.capture || shrink.step.is_some() => {
                    return Err(err(
                        "capture and step use the PyTorch harness: leave harness out",
                    ))
                }
                (None, Some(_))
                    if shrink.capture || (shrink.step.is_some() && shrink.inputs.is_none()) =>
                {
                    return Err(err(
                        "capture takes the model from the repro command: leave model and inputs out",
                    ));
                }
                _ => {}
            }
            if shrink.step.as_deref().is_some_and(|s| !s.contains(':')) {
                return Err(err("step: expected `package.module:function`"));
            }
            if shrink.framework == ShrinkFramework::Torch
                && shrink.inputs.is_some()
                && !shrink.model.as_deref().is_some_and(|m| m.contains(':'))
            {
                return Err(err("model: with inputs (the PyTorch harness), model is a factory, `package.module:build`"));
            }
            if shrink.attempts == 0 || shrink.confirm == 0 || shrink.confirm_jobs == Some(0) {
                return Err(err("attempts, confirm and confirm-jobs must be at least 1"));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            text: record,
            build: raw.build,
            repro: raw.repro,
            match_policy,
            flaky: FlakySettings {
                endpoint_runs,
                confidence: raw.search.confidence.unwrap_or_else(default_confidence),
                asked: raw.search.confidence.is_some(),
                max_runs: raw.search.max_runs,
            },
            workers: WorkerSettings {
                jobs: raw.search.jobs,
                devices: raw
                    .search
                    .devices
                    .map(|d| d.into_iter().map(|DeviceId(id)| id).collect()),
                gpus_per_probe: raw.search.gpus_per_probe,
            },
            triage: raw.triage,
            shrink: raw.shrink,
            bundle: raw.bundle,
            nightly: raw.nightly,
            executor: raw.executor,
        })
    }
}

/// Whether a config path is a Python project's `pyproject.toml` (read for `[tool.cudabisect]`).
pub fn is_pyproject(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "pyproject.toml")
}

/// Whether a `pyproject.toml`'s text has a `[tool.cudabisect]` table (true when it does not parse but
/// mentions one, so its parse error is what the user sees).
pub fn has_tool_section(text: &str) -> bool {
    match text.parse::<toml::Table>() {
        Ok(table) => table
            .get("tool")
            .and_then(|t| t.get("cudabisect"))
            .is_some(),
        Err(_) => text.contains("tool.cudabisect"),
    }
}

/// A `pyproject.toml`: only `[tool.cudabisect]` is read; every other table belongs to other tools.
#[derive(Deserialize)]
struct Pyproject {
    tool: Option<PyprojectTools>,
}

/// `[tool]` of a `pyproject.toml`.
#[derive(Deserialize)]
struct PyprojectTools {
    cudabisect: Option<RawConfig>,
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("bisect.toml"), text)
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse("[repro]\ncommand = \"python step.py\"\n").unwrap();
        assert!(c.build.is_none());
        assert_eq!(c.repro.command, CommandLine::Shell("python step.py".into()));
        assert_eq!(c.repro.timeout, Duration::from_secs(600));
        assert!(c.repro.launch_blocking);
        assert_eq!(c.match_policy.describe(), "class+kernel");
    }

    #[test]
    fn an_empty_command_says_which_part_is_empty() {
        let err = |command: &str| {
            parse(&format!("[repro]\ncommand = {command}\n"))
                .unwrap_err()
                .to_string()
        };
        assert!(err("[]").ends_with("the command array is empty"));
        assert!(err("[\"\", \"x\"]").ends_with("the command's program (its first word) is empty"));
        assert!(err("\"  \"").ends_with("the command is empty"));
    }

    #[test]
    fn zero_attempts_are_reported_at_the_key() {
        let text = "[build]\ncommand = \"make\"\n\n[repro]\ncommand = \"./r.sh\"\nattempts = 0\n";
        let e = Config::parse(Path::new("b.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b.toml:6:1: [repro] attempts must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn a_build_that_installs_into_the_running_python_gets_a_venv_by_default() {
        let shell = |s: &str| CommandLine::Shell(s.into());
        for yes in [
            "pip install -e . --no-deps -q",
            "python -m pip install .",
            "cd sub && pip3 install -e .",
            "uv pip install -e .",
            "python setup.py develop",
            "/opt/conda/bin/pip install .",
        ] {
            assert!(installs_into_python(&shell(yes)), "{yes}");
        }
        for no in [
            "make -j8",
            "pip install --target build/site .",
            "pip install --prefix=/tmp/p .",
            "python setup.py build_ext --inplace",
            "echo pip installation notes",
        ] {
            assert!(!installs_into_python(&shell(no)), "{no}");
        }
        assert!(installs_into_python(&CommandLine::Argv(vec![
            "pip".into(),
            "install".into(),
            "-e".into(),
            ".".into()
        ])));
        let config = parse(
            "[build]\ncommand = \"pip install -e .\"\nvenv = false\n[repro]\ncommand = \"x\"\n",
        )
        .unwrap();
        assert!(
            !config.build.unwrap().uses_venv(),
            "an explicit venv = false stands"
        );
        let config =
            parse("[build]\ncommand = \"make\"\nvenv = true\n[repro]\ncommand = \"x\"\n").unwrap();
        assert!(config.build.unwrap().uses_venv());
    }

    #[test]
    fn the_jax_and_keras_frameworks_need_their_factories_and_take_no_pytorch_keys() {
        let base = "[repro]\ncommand = \"python3 train.py\"\n[shrink]\n";
        let ok = parse(&format!(
            "{base}framework = \"jax\"\nfunction = \"m:step\"\ninputs = \"m:inputs\"\n"
        ))
        .unwrap();
        let shrink = ok.shrink.unwrap();
        assert_eq!(shrink.framework, ShrinkFramework::Jax);
        assert!(!shrink.captures(), "factories, not a capture");
        parse(&format!(
            "{base}framework = \"keras\"\nmodel = \"m:build\"\ninputs = \"m:x\"\ntrain = true\n"
        ))
        .unwrap();
        for (extra, says) in [
            (
                "framework = \"jax\"\ninputs = \"m:inputs\"\n",
                "needs function",
            ),
            (
                "framework = \"keras\"\nmodel = \"m:build\"\n",
                "needs model",
            ),
            (
                "framework = \"jax\"\nfunction = \"m:f\"\ninputs = \"m:i\"\nmodel = \"m:b\"\n",
                "not model",
            ),
            (
                "framework = \"jax\"\nfunction = \"m:f\"\ninputs = \"m:i\"\ntrain = true\n",
                "train and loss are for models",
            ),
            (
                "framework = \"keras\"\nmodel = \"m:b\"\ninputs = \"m:i\"\noptimizer = \"m:o\"\n",
                "takes no optimizer",
            ),
            // An explicit train = false beside a loss is a contradiction, not a training step (SK04).
            (
                "framework = \"keras\"\nmodel = \"m:b\"\ninputs = \"m:i\"\ntrain = false\nloss = \"m:loss\"\n",
                "train = false shrinks the forward pass alone",
            ),
            (
                "model = \"m:b\"\ninputs = \"m:i\"\ntrain = false\noptimizer = \"m:o\"\n",
                "train = false shrinks the forward pass alone",
            ),
            (
                "framework = \"keras\"\nmodel = \"m:b\"\ninputs = \"m:i\"\ncapture = true\n",
                "leave harness, capture and step out",
            ),
            ("function = \"m:f\"\n", "function is for framework"),
            ("framework = \"tensorflow\"\n", "unknown variant"),
        ] {
            let e = parse(&format!("{base}{extra}")).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
    }

    #[test]
    fn full_config_is_read() {
        let c = parse(
            "[build]\ncommand = [\"make\", \"-j8\"]\ntimeout = \"20m\"\nenv = { CC = \"gcc\" }\nclean = true\n\
             [repro]\ncommand = [\"./run\"]\ntimeout = \"90s\"\nlaunch-blocking = false\n\
             [search]\nmatch = \"class\"\n[triage]\nenabled = false\n",
        )
        .unwrap();
        let b = c.build.unwrap();
        assert_eq!(
            b.command,
            CommandLine::Argv(vec!["make".into(), "-j8".into()])
        );
        assert_eq!(
            (b.timeout, b.clean, b.env["CC"].as_str()),
            (Duration::from_secs(1200), true, "gcc")
        );
        assert_eq!(c.repro.timeout, Duration::from_secs(90));
        assert!(!c.repro.launch_blocking && !c.triage.enabled);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_line_and_column() {
        let e = parse("[repro]\ncommand = \"x\"\ncomand = \"y\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bisect.toml:3:1: unknown field `comand`"),
            "{e}"
        );
        let e = parse("[repro]\ncommand = 5\n").unwrap_err().to_string();
        assert!(e.starts_with("bisect.toml:2:11:"), "{e}");
        let e = parse("[repro]\ncommand = \"x\"\ntimeout = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bisect.toml:3:11") && e.contains("invalid duration"),
            "{e}"
        );
        let e = parse("[build]\ncommand = []\n[repro]\ncommand = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
        assert!(parse("[build]\ncommand = \"make\"\n")
            .unwrap_err()
            .to_string()
            .contains("repro"));
        assert!(parse("[repro]\ncommand = \"x\"\n[search]\nmatch = \"nope\"\n").is_err());
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../bisect.toml.example");
        parse(text).expect("bisect.toml.example is valid");
    }

    fn pyproject(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("proj/pyproject.toml"), text)
    }

    const PYPROJECT: &str = "[project]\nname = \"mylib\"\nversion = \"0.1\"\n\n[tool.ruff]\nline-length = 100\n\n[tool.cudabisect.repro]\ncommand = \"python3 train.py\"\ntimeout = \"5m\"\n\n[tool.cudabisect.search]\nmatch = \"class\"\n";

    #[test]
    fn pyproject_tool_table_reads_like_bisect_toml() {
        let from_py = pyproject(PYPROJECT).unwrap();
        let own = parse("[repro]\ncommand = \"python3 train.py\"\ntimeout = \"5m\"\n[search]\nmatch = \"class\"\n").unwrap();
        assert_eq!(format!("{:?}", from_py.repro), format!("{:?}", own.repro));
        assert_eq!(
            format!("{:?}", from_py.match_policy),
            format!("{:?}", own.match_policy)
        );
        // What the run keeps is the table alone, as a bisect.toml that parses to the same config.
        assert!(
            !from_py.text.contains("ruff") && !from_py.text.contains("[project]"),
            "{}",
            from_py.text
        );
        let again = parse(&from_py.text).unwrap();
        assert_eq!(format!("{:?}", again.repro), format!("{:?}", own.repro));
    }

    #[test]
    fn pyproject_errors_point_into_the_whole_file() {
        let typo = PYPROJECT.replace("timeout = \"5m\"", "comand = \"x\"");
        let e = pyproject(&typo).unwrap_err().to_string();
        assert!(
            e.starts_with("proj/pyproject.toml:10:1: unknown field `comand`"),
            "{e}"
        );
        let none = pyproject("[project]\nname = \"x\"\n[tool.ruff]\nx = 1\n").unwrap_err();
        assert!(matches!(none, ConfigError::NoToolSection { .. }), "{none}");
        let zero = format!("{PYPROJECT}\n[tool.cudabisect.repro.x]\n");
        assert!(pyproject(&zero).is_err());
        let attempts = PYPROJECT.replace("timeout = \"5m\"", "attempts = 0");
        let e = pyproject(&attempts).unwrap_err().to_string();
        assert!(
            e.starts_with("proj/pyproject.toml:10:1: [repro] attempts"),
            "{e}"
        );
    }

    #[test]
    fn config_is_found_in_bisect_toml_then_pyproject() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(matches!(
            Config::find(root, None),
            Err(ConfigError::Missing { .. })
        ));
        std::fs::write(root.join("pyproject.toml"), "[project]\nname = \"x\"\n").unwrap();
        let e = Config::find(root, None).unwrap_err().to_string();
        assert!(e.contains("cudabisect init"), "{e}");
        std::fs::write(root.join("pyproject.toml"), PYPROJECT).unwrap();
        assert_eq!(
            Config::find(root, None).unwrap(),
            root.join("pyproject.toml")
        );
        std::fs::write(root.join("bisect.toml"), "[repro]\ncommand = \"x\"\n").unwrap();
        assert_eq!(Config::find(root, None).unwrap(), root.join("bisect.toml"));
        let given = Path::new("elsewhere.toml");
        assert_eq!(Config::find(root, Some(given)).unwrap(), given);
    }
}
