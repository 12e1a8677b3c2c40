//! The records a run produces and every consumer reads (reporters, the bundle, report.json): typed from
//! end to end, so nothing is read back out of JSON.

use serde::{Deserialize, Serialize};

use crate::classify::sanitizer::FoldedFinding;
use crate::classify::{FaultClass, Signature};
use crate::git::CommitInfo;
use crate::protocol::types::GraphNode;

/// Version of the JSON report format; bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

/// Why a probe was run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeRole {
    /// Checking that the bad endpoint reproduces (it defines the target).
    BadEndpoint,
    /// Checking that a good endpoint passes.
    GoodEndpoint,
    /// Checking that a merge base of a good commit and the bad one passes.
    MergeBase,
    /// The bad endpoint under compute-sanitizer, to learn which kernel the target faults in.
    EndpointSanitizer,
    /// A step of the search.
    Search,
    /// A flaky fault's culprit or its parent, rerun until their reproduction rates separate.
    Verify,
    /// `nightly`: the branch head, judged on its own before anything is known of it.
    Head,
}

pub use crate::bisect::Verdict;

/// One probe: checkout, build, repro (with retries), classified.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// Full sha.
    pub commit: String,
    /// Why it ran.
    pub role: ProbeRole,
    /// The verdict fed to the search.
    pub verdict: Verdict,
    /// The whole signature.
    pub signature: Signature,
    /// Whether the signature is the target bug.
    pub matched_target: bool,
    /// Why it was skipped, when it was.
    pub reason: Option<String>,
    /// Exit status of the last command run, when it exited.
    pub exit_code: Option<i32>,
    /// Signal that killed the last command run, when one did.
    pub signal: Option<i32>,
    /// Wall time of checkout, build and repro together.
    pub duration_s: f64,
    /// Build log, when there was a build.
    pub build_log: Option<String>,
    /// Log of the last run (the repro, or the build when it failed).
    pub log: Option<String>,
    /// What compute-sanitizer said when the probe's fault had to be told apart from the target's.
    #[serde(default)]
    pub sanitizer: Option<String>,
    /// Repro runs made: more than one when an infrastructure failure was retried or a clean run was
    /// repeated under `[repro] attempts`.
    pub attempts: u32,
    /// Taken from the probe journal of an earlier, killed or interrupted run with the same config and
    /// machine, not run again.
    #[serde(default)]
    pub reused: bool,
    /// The scheduler job that ran the last command, when a scheduler ran it (`[executor] kind = "slurm"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobInfo>,
    /// For a Python repro: `warm` (a child of the warm interpreter) or `cold: <why>` (a fresh process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    /// For a Python build command (`[build] warm`): `warm` or `cold: <why>`, as for the repro.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_runner: Option<String>,
}

pub use crate::exec::process::JobInfo;

/// How a `start` run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunResult {
    /// One first bad commit.
    Found,
    /// Skips left several candidates.
    Ambiguous,
    /// GOOD does not pass or BAD does not reproduce.
    EndpointsInvalid,
    /// An endpoint could not be judged: the machine or the clone failed, not the commit.
    EndpointInfra,
    /// The host broke during the search (a repro that cannot start, a lost device, a full disk): the
    /// search stopped rather than skip every commit left.
    HostFailure,
    /// The run could not finish (interrupted).
    Inconclusive,
}

/// A commit named in the result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitRef {
    /// Full sha.
    pub commit: String,
    /// Subject line.
    pub subject: String,
}

/// The JSON report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Report format version.
    pub format_version: u32,
    /// cudabisect's version.
    pub tool_version: String,
    /// How the run ended.
    pub result: RunResult,
    /// One line saying why.
    pub message: String,
    /// The good revisions as given, resolved.
    pub good: Vec<String>,
    /// The bad revision, resolved.
    pub bad: String,
    /// The target signature (what the bad endpoint shows).
    pub target: Option<Signature>,
    /// The same-bug policy used.
    pub match_policy: String,
    /// Whether `CUDA_LAUNCH_BLOCKING=1` was set for repro runs.
    pub launch_blocking: bool,
    /// The first bad commit, when found.
    pub first_bad: Option<CommitInfo>,
    /// Its parents (the last good state), when found.
    pub good_parents: Vec<CommitRef>,
    /// Commits that may still be the first bad one (one when found).
    pub candidates: Vec<CommitRef>,
    /// Every probe, in the order run.
    pub probes: Vec<ProbeRecord>,
    /// Commits in the initial search range.
    pub range_size: usize,
    /// The run's state directory (logs, config copy).
    pub run_dir: String,
    /// The compute-sanitizer triage at the first bad commit, when run.
    pub triage: Option<TriageResult>,
    /// The shrink to a minimal subgraph at the first bad commit, when run.
    pub shrink: Option<ShrinkReport>,
    /// The hand-off bundle's directory, when one was written.
    pub bundle: Option<String>,
    /// What the plan decided that the user should know (merge bases tested, implied goods).
    pub notes: Vec<String>,
    /// Other bugs met on the way: commits that failed with the target's class but elsewhere.
    #[serde(default)]
    pub other_bugs: Vec<OtherBug>,
    /// The fault showed on only some runs of the bad end: how sure the answer is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flaky: Option<FlakyAnswer>,
    /// True when Ctrl-C or SIGTERM stopped the run (during the search or a stage after it).
    pub interrupted: bool,
    /// The names of the older and newer states (`good`/`bad`, `broken`/`fixed` with `--find-fix`).
    #[serde(default)]
    pub terms: Terms,
    /// Whether the run followed first parents only (`--first-parent`).
    #[serde(default)]
    pub first_parent: bool,
    /// The pathspec the range was limited to.
    #[serde(default)]
    pub pathspec: Vec<String>,
    /// `--find-fix`: the answer is the first commit where the fault is gone.
    #[serde(default)]
    pub find_fix: bool,
    /// With `[search] confidence` written: the confidence the answer reached (the flaky search's
    /// posterior, or for a fault that showed every time, how unlikely the parent's clean runs would be
    /// if it were bad).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
}

/// The answer of the search for a flaky fault, with its confidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlakyAnswer {
    /// The estimated probability that a run of a bad commit shows the fault.
    pub p: f64,
    /// The most likely first bad commit and its posterior probability.
    pub culprit: String,
    /// Its posterior.
    pub posterior: f64,
    /// The confidence asked (`[search] confidence`).
    pub confidence: f64,
    /// Whether the posterior reached it (else the run budget ran out).
    pub reached: bool,
    /// The next most likely commits, with their posteriors.
    pub runners_up: Vec<(String, f64)>,
    /// Repro runs the search made (the bad end's included).
    pub runs: usize,
    /// The culprit verified against its parent: (faults, runs) at each, and the probability that the
    /// culprit's rate is the higher.
    pub verification: Option<Verification>,
}

/// The culprit and its parent rerun until their reproduction rates separate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// The parent commit.
    pub parent: String,
    /// Faults and runs at the culprit.
    pub culprit_rate: (u32, u32),
    /// Faults and runs at the parent.
    pub parent_rate: (u32, u32),
    /// P(culprit's rate > parent's rate).
    pub separation: f64,
}

/// How a shrink ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShrinkStatus {
    /// A minimal subgraph was found.
    Minimal,
    /// The full model did not fail the expected way under the harness.
    NotReproduced,
    /// The harness could not describe or run the model.
    Failed,
    /// Ctrl-C or SIGTERM stopped it.
    Interrupted,
    /// There was nothing to shrink with: the repro is not a Python program of a framework the shipped
    /// harnesses read, and bisect.toml names no model (the summary says so in words).
    NotApplicable,
}

/// One way to a minimal repro the shrink stage tried, and how it ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShrinkPathTried {
    /// `factories`, `factories (the training step)` or `capture of the repro command`.
    pub path: String,
    /// How it ended, in words.
    pub outcome: String,
}

/// A candidate that failed, but differently: rejected, and kept on record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Rejected {
    /// Nodes in the candidate.
    pub nodes: usize,
    /// The class it failed with.
    pub class: FaultClass,
    /// Its summary line.
    pub summary: String,
}

/// The final check of a minimal subgraph.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Confirmation {
    /// Runs made.
    pub runs: u32,
    /// Runs that showed the target.
    pub reproduced: u32,
}

/// The minimal subgraph run at the first bad commit's parent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum ParentCheck {
    /// It ran clean at the parent: the subgraph shows what the commit changed.
    Passed,
    /// It faulted the same way at the parent too.
    Reproduced,
    /// It failed another way (the signature, short form).
    FailedDifferently(String),
    /// It could not be run (why).
    NotRun(String),
    /// A captured step faulted the same way at the parent: on the values captured at the first bad
    /// commit (its model, batch and data), which the commit may have changed, so it tells nothing.
    ReproducedOnCapturedValues,
}

impl std::fmt::Display for ParentCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Passed => f.write_str("passed"),
            Self::Reproduced => f.write_str("reproduced"),
            Self::ReproducedOnCapturedValues => f.write_str(
                "reproduced on the values captured at the first bad commit (its model, batch and data, which the commit may have changed): this tells nothing about the parent's own run",
            ),
            Self::FailedDifferently(s) => write!(f, "failed differently: {s}"),
            Self::NotRun(why) => write!(f, "not run: {why}"),
        }
    }
}

/// Everything a shrink found, for the report and the bundle.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShrinkReport {
    /// How it ended.
    pub status: ShrinkStatus,
    /// One line for humans.
    pub summary: String,
    /// The signature kept while shrinking.
    pub signature: Option<Signature>,
    /// The node the locating run charged the fault to.
    pub located_node: Option<String>,
    /// Nodes in the full model.
    pub nodes_before: usize,
    /// Nodes in the minimal subgraph.
    pub nodes_after: usize,
    /// The minimal subgraph, in execution order.
    pub kept: Vec<GraphNode>,
    /// Ids of the nodes cut.
    pub removed: Vec<String>,
    /// Harness runs to reach the minimal subgraph: the locating run and every candidate run.
    pub runs_to_minimal: usize,
    /// All harness runs, the final check included (describe and extract not counted).
    pub harness_runs: usize,
    /// Distinct candidates tried by the reducer.
    pub candidates: usize,
    /// Candidates that failed another way.
    pub rejected: Vec<Rejected>,
    /// The final check.
    pub confirmation: Option<Confirmation>,
    /// The minimal subgraph at the first bad commit's parent.
    pub parent_check: Option<ParentCheck>,
    /// Wall time: of the whole shrink stage (every way tried, the capture's runs included) when it ran
    /// as a stage of `start`, `nightly` or `shrink`.
    pub duration_s: f64,
    /// Where the recording, the minimal model and the logs are.
    pub out_dir: String,
    /// The standalone minimal model, when the harness can extract one.
    pub minimal_model: Option<String>,
    /// One line that reproduces the minimal subgraph.
    pub reproduce: Option<String>,
    /// How the harness obtained the graph it shrank, when it says.
    #[serde(default)]
    pub graph: Option<String>,
    /// Why the harness could not write a standalone minimal model (a custom op or function whose
    /// definition it cannot carry, a value it cannot save safely).
    #[serde(default)]
    pub extract_error: Option<String>,
    /// The size of the minimal repro, and whether its large values are generated instead of shipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ReproData>,
    /// The training step the model was taken from, when it was captured from the repro command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<CapturedFault>,
    /// The way to the model this report's shrink took (see `paths`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Every way tried, in order, with how each ended: the factories, then the capture.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<ShrinkPathTried>,
    /// Why the shrink's runs (and repro.py's) ran under compute-sanitizer's memcheck: the harness's full
    /// run did not show the fault by itself (an overrun that lands in memory its process maps), and
    /// under memcheck it did. `None`: they ran as the repro does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcheck: Option<String>,
}

impl ShrinkReport {
    /// Makes the project paths it quotes (a kept node's source line, the capture's traceback) relative to
    /// `root`, the checkout the shrink ran in: a maintainer reads `toy/ops.py:47`, not a worktree's path.
    pub fn relativize(&mut self, root: &std::path::Path) {
        let prefix = format!("{}/", root.display().to_string().trim_end_matches('/'));
        for node in &mut self.kept {
            if let Some(source) = &mut node.source {
                *source = source.replace(&prefix, "");
            }
        }
        if let Some(captured) = &mut self.captured {
            captured.relativize(root);
        }
    }
}

impl ShrinkReport {
    /// The way that gave this result and how each way before it ended, one line each (`Made from: the
    /// capture of the repro command`, `Tried first: the factories: …`); none when no way was named.
    pub fn way_lines(&self) -> Vec<String> {
        let Some(path) = &self.path else {
            return vec![];
        };
        std::iter::once(format!("Made from: the {path}"))
            .chain(
                self.paths
                    .iter()
                    .filter(|t| &t.path != path)
                    .map(|t| format!("Tried first: the {}: {}", t.path, t.outcome)),
            )
            .collect()
    }
}

/// What the minimal repro ships.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ReproData {
    /// Bytes of the minimal repro's directory, as written.
    pub bytes: u64,
    /// Bytes it took with every recorded value exact.
    pub exact_bytes: u64,
    /// Its large values are generated from their recorded shape, dtype and range (the fault was checked
    /// to show that way).
    pub generated: bool,
    /// Why they are not, when a reduction was tried and did not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The written `repro.py` run by itself, in fresh processes, as a maintainer runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone: Option<AloneRuns>,
}

/// Fresh-process runs of the written `repro.py` on its own.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct AloneRuns {
    /// How many ran.
    pub runs: u32,
    /// How many showed the target's fault.
    pub reproduced: u32,
    /// The last line of the last run that did not, when one did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<String>,
}

impl ReproData {
    /// Whether the written repro.py was run alone and never showed the fault.
    pub fn missed_alone(&self) -> bool {
        self.alone.as_ref().is_some_and(|a| a.reproduced == 0)
    }
}

/// Where a run of the user's own training script failed, as the capture saw it (`fault.json`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct CapturedFault {
    /// The training step (1-based: optimizer steps done before it, plus one).
    pub step: u64,
    /// forward, loss, backward, optimizer, data or setup.
    pub phase: String,
    /// The model call of that step (several with gradient accumulation).
    pub call: u64,
    /// The innermost module whose call raised, when the failure came out of one.
    #[serde(default)]
    pub module: Option<String>,
    /// The Triton kernel launched last.
    #[serde(default)]
    pub kernel: Option<String>,
    /// The exception.
    #[serde(default)]
    pub exception: Option<String>,
    /// For a backward failure: anomaly mode's traceback of the forward call that created the node.
    #[serde(default)]
    pub forward_trace: Option<String>,
    /// The framework whose code failed: `torch` (a model call, its loss, backward or update) or `jax`
    /// (a call of a jitted function: `step` is then that function's call number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// JAX: the jitted function whose call failed (`module:qualname`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// What the replay noticed about the step that the harness runs differently (a `torch.compile`d
    /// model run eagerly, autocast): the reason to give when the harness does not reproduce the fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// How its two runs ran: `warm` (forked from the worker's warm interpreter), `cold` (fresh
    /// processes), or `cold after warm: <why>` (the warm capture saved nothing and was run again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<String>,
}

impl CapturedFault {
    /// Makes the paths the capture recorded relative to `root` (the probe worktree): a maintainer reads
    /// `mylib/model.py:17`, not a path into cudabisect's worktree.
    pub fn relativize(&mut self, root: &std::path::Path) {
        let root = format!("{}/", root.display().to_string().trim_end_matches('/'));
        for text in [&mut self.forward_trace, &mut self.exception]
            .into_iter()
            .flatten()
        {
            *text = text.replace(&root, "");
        }
        for note in &mut self.notes {
            *note = note.replace(&root, "");
        }
    }

    /// The last line of the user's code in the forward traceback: where the failing backward node was made.
    pub fn forward_line(&self) -> Option<String> {
        let trace = self.forward_trace.as_deref()?;
        trace
            .lines()
            .rev()
            .filter_map(|l| l.trim().strip_prefix("File \""))
            .filter_map(|l| {
                let (path, rest) = l.split_once('"')?;
                let line = rest.trim_start_matches(", line ").split(',').next()?;
                let user = !(path.contains("-packages/")
                    || path.contains("/lib/python3")
                    || path.ends_with("sitecustomize.py"));
                user.then(|| format!("{path}:{line}"))
            })
            .next()
    }
}

/// A compute-sanitizer tool, in escalation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SanitizerTool {
    /// Out-of-bounds and misaligned accesses, device asserts.
    Memcheck,
    /// Shared-memory data races.
    Racecheck,
    /// Reads of uninitialised global memory.
    Initcheck,
    /// Invalid synchronisation.
    Synccheck,
}

impl SanitizerTool {
    /// Every tool, in the order triage escalates through them.
    pub const ESCALATION: [SanitizerTool; 4] = [
        Self::Memcheck,
        Self::Racecheck,
        Self::Initcheck,
        Self::Synccheck,
    ];

    /// The name compute-sanitizer's `--tool` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memcheck => "memcheck",
            Self::Racecheck => "racecheck",
            Self::Initcheck => "initcheck",
            Self::Synccheck => "synccheck",
        }
    }
}

impl std::fmt::Display for SanitizerTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What triage concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriageStatus {
    /// A tool reported the fault.
    Found,
    /// No tool found anything.
    Clean,
    /// compute-sanitizer is not installed.
    Unavailable,
    /// Triage could not run or read its result.
    Error,
    /// Ctrl-C or SIGTERM stopped it.
    Interrupted,
}

/// A folded finding as the report shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FoldedLine {
    /// The one-line description.
    pub line: String,
    /// The folded records.
    #[serde(flatten)]
    pub folded: FoldedFinding,
}

/// What triage found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TriageResult {
    /// How it ended.
    pub status: TriageStatus,
    /// One line for humans.
    pub summary: String,
    /// The tool whose findings are reported.
    pub tool: Option<SanitizerTool>,
    /// Tools run, in order.
    pub tools_run: Vec<SanitizerTool>,
    /// The signature from the first finding.
    pub signature: Option<Signature>,
    /// Findings folded by (kernel, pc, kind).
    pub findings: Vec<FoldedLine>,
    /// Errors counted by the sanitizer's summary line.
    pub error_count: Option<u64>,
    /// Logs and XML reports written.
    pub files: Vec<String>,
    /// The command sanitized.
    pub command: String,
}

impl TriageResult {
    /// A result that says only why triage did not get anywhere.
    pub fn failed(status: TriageStatus, summary: String, command: String) -> Self {
        Self {
            status,
            summary,
            tool: None,
            tools_run: Vec::new(),
            signature: None,
            findings: Vec::new(),
            error_count: None,
            files: Vec::new(),
            command,
        }
    }
}

/// A bug that is not the target, met during the search.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OtherBug {
    /// The commit that showed it.
    pub commit: String,
    /// Its signature.
    pub signature: Signature,
    /// Why it is not the target.
    pub reason: String,
}

/// A commit's first 12 hex digits (kept with git's edge, where every layer may reach it).
pub use crate::git::short_sha;

/// How a night ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NightlyStatus {
    /// First night: the head is clean and becomes the last good commit.
    Baseline,
    /// The head is clean.
    Clean,
    /// The head is clean again: the open regression is closed.
    Fixed,
    /// The head faults and the fault was bisected.
    Regression,
    /// The head still faults with the open regression's bug: not bisected again.
    StillFailing,
    /// The head could not be judged (a build break, the machine), or the bisection could not name a commit.
    Inconclusive,
}

impl NightlyStatus {
    /// The status's name, as in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            NightlyStatus::Baseline => "baseline",
            NightlyStatus::Clean => "clean",
            NightlyStatus::Fixed => "fixed",
            NightlyStatus::Regression => "regression",
            NightlyStatus::StillFailing => "still_failing",
            NightlyStatus::Inconclusive => "inconclusive",
        }
    }
}

/// The `nightly` section of the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NightlyRecord {
    /// How the night ended.
    pub status: NightlyStatus,
    /// One line saying what happened.
    pub message: String,
    /// The branch tested.
    pub branch: String,
    /// The head tested.
    pub head: String,
    /// The last good commit after this night.
    pub last_good: Option<String>,
    /// The open regression's first bad commit.
    pub first_bad: Option<String>,
    /// The first head that showed the open regression.
    pub open_since: Option<String>,
    /// Nights the open regression has failed.
    pub nights_failing: u32,
    /// For `fixed`: the commits between the last failing head and this one, one of which fixed it.
    pub fixed_range: Option<String>,
    /// The head's signature.
    pub signature: Signature,
}

/// The names of the two states a search tells apart: the older (`good`, or `broken` when finding a fix)
/// and the newer (`bad`, or `fixed`), as git's `--term-old` and `--term-new`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    /// The older state.
    pub old: String,
    /// The newer state.
    pub new: String,
}

impl Default for Terms {
    fn default() -> Self {
        Self {
            old: "good".into(),
            new: "bad".into(),
        }
    }
}

impl Terms {
    /// `message` in these terms: "good commit"/"bad commit" become "<old> commit"/"<new> commit"
    /// (`broken`/`fixed` with `--find-fix`), so a refusal speaks the run's own words.
    pub fn speak(&self, message: &str) -> String {
        if self.old == "good" && self.new == "bad" {
            return message.to_string();
        }
        message
            .replace("good commit", &format!("{} commit", self.old))
            .replace("bad commit", &format!("{} commit", self.new))
            .replace("good and bad", &format!("{} and {}", self.old, self.new))
    }

    /// The terms `start` was given: git's rules for a term (one word, not a bisect subcommand, the two
    /// different) checked here.
    pub fn from_flags(
        find_fix: bool,
        old: Option<String>,
        new: Option<String>,
    ) -> Result<Terms, String> {
        let (d_old, d_new) = if find_fix {
            ("broken", "fixed")
        } else {
            ("good", "bad")
        };
        let terms = Terms {
            old: old.unwrap_or_else(|| d_old.into()),
            new: new.unwrap_or_else(|| d_new.into()),
        };
        const RESERVED: [&str; 11] = [
            "help",
            "start",
            "skip",
            "next",
            "reset",
            "visualize",
            "view",
            "replay",
            "log",
            "run",
            "terms",
        ];
        for t in [&terms.old, &terms.new] {
            let word = !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !word || RESERVED.contains(&t.as_str()) {
                return Err(format!(
                    "`{t}` cannot be a term: one word of letters, digits, `-` or `_`, not a `git bisect` subcommand"
                ));
            }
        }
        if terms.old == terms.new {
            return Err(format!(
                "--term-old and --term-new are both `{}`",
                terms.old
            ));
        }
        // git allows good/bad only in their own roles.
        if (terms.old == "bad" || terms.new == "good")
            && !(terms.old == "good" && terms.new == "bad")
        {
            return Err("`good` can only name the older state and `bad` the newer".into());
        }
        Ok(terms)
    }

    /// The word for a verdict: the older term for good, the newer for bad.
    pub fn word(&self, verdict: crate::bisect::Verdict) -> &str {
        match verdict {
            crate::bisect::Verdict::Good => &self.old,
            crate::bisect::Verdict::Bad => &self.new,
            crate::bisect::Verdict::Skip => "skip",
        }
    }
}
