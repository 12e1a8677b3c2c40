//! The run's record: every probe in one place, and the JSON report written with `--report`.

use serde::Serialize;

use crate::classify::Signature;
use crate::git::CommitInfo;

/// Version of the JSON report format; bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

/// Why a probe was run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeRole {
    /// Checking that the bad endpoint reproduces (it defines the target).
    BadEndpoint,
    /// Checking that a good endpoint passes.
    GoodEndpoint,
    /// A step of the search.
    Search,
}

/// What a probe says about its commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeVerdict {
    /// No target fault.
    Good,
    /// The target fault.
    Bad,
    /// Could not be judged.
    Skip,
}

/// One probe: checkout, build, repro (with retries), classified.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeRecord {
    /// Full sha.
    pub commit: String,
    /// Why it ran.
    pub role: ProbeRole,
    /// The verdict fed to the search.
    pub verdict: ProbeVerdict,
    /// The signature class (`illegal_address`, `build_failure`, `none`, …).
    pub outcome: String,
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
    /// Repro runs made (more than one when infrastructure failures were retried).
    pub attempts: u32,
}

/// How a `start` run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunResult {
    /// One first bad commit.
    Found,
    /// Skips left several candidates.
    Ambiguous,
    /// GOOD does not pass or BAD does not reproduce.
    EndpointsInvalid,
    /// The run could not finish (interrupted).
    Inconclusive,
}

/// A commit named in the result.
#[derive(Clone, Debug, Serialize)]
pub struct CommitRef {
    /// Full sha.
    pub commit: String,
    /// Subject line.
    pub subject: String,
}

/// The JSON report.
#[derive(Clone, Debug, Serialize)]
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
    pub triage: Option<serde_json::Value>,
    /// The shrink to a minimal subgraph at the first bad commit, when run.
    pub shrink: Option<crate::shrink_run::ShrinkReport>,
    /// The hand-off bundle's directory, when one was written.
    pub bundle: Option<String>,
}
