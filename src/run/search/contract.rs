//! What the search takes and what it gives: its input (the range, the ends, the policy, how a shared GPU
//! is measured), how it ended, and its outcome. Every part of the search speaks these; only `mod.rs`
//! runs it.

use git2::Oid;

use crate::classify::{MatchPolicy, Signature};
use crate::git::RangeCommit;
use crate::report::record::{FlakyAnswer, OtherBug, ProbeRecord};

/// What the search starts from, validated by the plan.
#[derive(Clone, Debug)]
pub struct SearchInput<'a> {
    /// The candidates, in topological order with the bad endpoint last.
    pub range: &'a [RangeCommit],
    /// The bad revision as given, and its commit.
    pub bad: (&'a str, Oid),
    /// Good revisions to check (those implied by another good one are left out).
    pub goods: &'a [(String, Oid)],
    /// Merge bases of goods that are not ancestors of the bad commit: they must be good too.
    pub merge_bases: &'a [Oid],
    /// The same-bug policy.
    pub policy: &'a MatchPolicy,
    /// A good endpoint that fails with a bug told apart from the target (another class, kernel, launch
    /// site or exception) still counts as good: it does not show *this* bug. For the nightly job, which
    /// bisects a new bug from the last head that showed only an older one.
    pub goods_may_show_other_bugs: bool,
    /// Runs of the bad end at the start, and what a flaky search needs.
    pub flaky: crate::config::FlakySettings,
    /// Finding a fix (`--find-fix`): the first of `goods` (the OLD ends) opens the first round in the bad
    /// end's place, and its fault is what every probe is measured by (showing it is the older state, a
    /// clean run the newer); `bad` (the NEW end) is then checked beside the first probes, and must run
    /// clean.
    pub finding_fix: bool,
    /// Several workers on one GPU: how the search learns how many run at once.
    pub sharing: Sharing<'a>,
    /// Steps the run numbered before this search (an earlier search, run again after a cross-check):
    /// its probes are numbered on from there, so no two runs share a number.
    pub steps_before: usize,
    /// Your checkout's work tree: a fault in code read from there (not from the probe's worktree, which
    /// lies under its `.git`) is not the commit's code, and a refused good end says so.
    pub checkout: Option<std::path::PathBuf>,
}

/// How the search learns how many probes one GPU holds at once, when several workers share it: the first
/// fresh probe that runs alone on the first shared GPU is watched by `gauge`, and
/// [`crate::run::probe::workers::probes_at_once`] turns what it used into the number. Until then, one probe per
/// shared GPU runs at a time.
#[derive(Clone, Copy, Debug)]
pub struct Sharing<'a> {
    /// Reads a probe's device memory while it runs.
    pub gauge: &'a dyn crate::host::gpu_memory::MemoryGauge,
    /// The workers were asked for (a number, devices listed), not chosen by `auto`: when nothing can be
    /// read, they all run.
    pub asked: bool,
    /// The places the plan gave the GPU before the workers were capped by the candidates: what the
    /// stages after the search may use at once where the GPU's memory holds them (0: the workers).
    pub places: usize,
}

impl Sharing<'static> {
    /// Nothing measured (workers that share no GPU need nothing).
    pub const NONE: Sharing<'static> = Sharing {
        gauge: &crate::host::gpu_memory::NoGauge,
        asked: false,
        places: 0,
    };
}

/// How the search ended.
#[derive(Clone, Debug, PartialEq)]
pub enum SearchEnd {
    /// One first bad commit.
    Found(Oid),
    /// The search named a commit, and running it and its parents alone did not bear it out (finding a
    /// fix: the fixed commit faults, or its parent is clean): why.
    Unverified(Oid, String),
    /// Skips left several candidates, in topological order.
    Ambiguous(Vec<Oid>),
    /// An endpoint says the range is wrong: which, and why.
    EndpointsInvalid(EndpointProblem),
    /// An endpoint could not be judged because the machine or the clone failed.
    EndpointInfra(String),
    /// The host broke during the search (the repro cannot start, the device is gone, infrastructure
    /// failures outlasted their retries): stopped, rather than skip every commit left.
    HostFailure(String),
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

/// Why the endpoints say the range is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointProblem {
    /// The bad end does not show a fault that can be a target (clean, a build break), in `runs` runs.
    BadDoesNotReproduce {
        /// The bad revision as given.
        bad: String,
        /// Runs of it.
        runs: usize,
        /// What it showed.
        seen: String,
    },
    /// A merge base shows the fault: it was fixed between it and the good commit.
    MergeBaseBad {
        /// Which (`merge base 1a2b3c4d5e6f`).
        what: String,
    },
    /// A good end does not pass.
    GoodDoesNotPass {
        /// Which (`good commit v1`).
        what: String,
        /// What it showed.
        seen: String,
    },
    /// A good end fails in code read from your checkout, not from the probe's worktree: an installed
    /// copy of the project (`pip install -e .`) is imported before the commit's own code.
    CheckoutCodeRan {
        /// Which (`good commit v1`).
        what: String,
        /// The file of your checkout the failure was in.
        path: String,
    },
    /// Finding a fix: the fault does not show at the OLD end.
    FaultNotAtOld {
        /// The old revision as given.
        old: String,
        /// What it showed.
        seen: String,
    },
    /// Finding a fix: the fault is not gone at the NEW end.
    FaultNotGone {
        /// The new revision as given.
        new: String,
        /// What it showed.
        seen: String,
    },
    /// Finding a fix with no OLD end.
    NoOldCommit,
}

impl std::fmt::Display for EndpointProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const FIX: &str = "--find-fix needs OLD to fault and NEW to be clean";
        match self {
            Self::BadDoesNotReproduce { bad, runs, seen } => {
                let runs = if *runs > 1 {
                    format!(" in {runs} runs")
                } else {
                    String::new()
                };
                write!(f, "bad commit {bad} does not reproduce{runs}: {seen}")
            }
            Self::MergeBaseBad { what } => write!(
                f,
                "{what} is bad: the bug was fixed between it and the good commit; bisect from the merge base or give another good commit"
            ),
            Self::GoodDoesNotPass { what, seen } => write!(f, "{what} does not pass: {seen}"),
            Self::CheckoutCodeRan { what, path } => write!(
                f,
                "{what} does not pass, but the code that failed is your checkout's ({path}), not the commit's: \
                 an installed copy of the project (`pip install -e .`) is imported before the worktree's code; \
                 put the worktree's source first in [repro] env (`PYTHONPATH = \"src\"` for a src layout)"
            ),
            Self::FaultNotAtOld { old, seen } => {
                write!(f, "the fault does not show at old commit {old} ({seen}): {FIX}")
            }
            Self::FaultNotGone { new, seen } => {
                write!(f, "the fault is not gone at new commit {new} ({seen}): {FIX}")
            }
            Self::NoOldCommit => write!(f, "no old commit: {FIX}"),
        }
    }
}

/// The search's result and every probe it ran.
#[derive(Clone, Debug)]
pub struct SearchOutcome {
    /// How it ended.
    pub end: SearchEnd,
    /// The bad endpoint's signature, once probed and reproducing.
    pub target: Option<Signature>,
    /// Every probe, in the order run.
    pub probes: Vec<ProbeRecord>,
    /// Bugs met that are not the target.
    pub other_bugs: Vec<OtherBug>,
    /// When the fault showed on only some runs of the bad end: the flaky search's answer.
    pub flaky: Option<FlakyAnswer>,
    /// The last step number the search used (probes stopped before they answered included).
    pub steps: usize,
    /// Runs that may go at once at the search's end: the workers, or on a GPU they share what its memory
    /// holds of the probe measured there (up to the places planned, even where fewer candidates needed
    /// fewer workers). The stages after the search overlap only where two fit.
    pub at_once: usize,
}

/// What the runs of an answer made again (its cross-check) gave.
#[derive(Clone, Debug)]
pub struct RanAgain {
    /// `Ok`: the first run, by its place among them, that did not give its verdict, if one did not;
    /// `Err`: how they were cut short (Ctrl-C, no worker).
    pub said: Result<Option<usize>, SearchEnd>,
    /// Their records, in the order of the runs (a run sent again after it was stopped counts once).
    pub probes: Vec<ProbeRecord>,
    /// The last step number they used.
    pub steps: usize,
}
