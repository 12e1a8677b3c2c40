//! The event stream: the library's logic emits events and never prints; reporters render them (progress
//! bar, plain lines, JSON Lines).

use serde::{Deserialize, Serialize};

use super::record::{ProbeRecord, ProbeRole, Report, ShrinkReport};

/// The phase a probe is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Checking out the commit.
    Checkout,
    /// Building.
    Build,
    /// Running the repro.
    Repro,
}

/// A stage after the search (or the nightly job's own probe).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stage {
    /// The first bad commit rerun under compute-sanitizer.
    Triage,
    /// The faulting training step captured from the repro command, for the shrink.
    ShrinkCapture,
    /// `nightly` probes the head of its branch.
    NightlyHead {
        /// The branch.
        branch: String,
        /// Full sha.
        commit: String,
    },
}

/// What the plan decided that the user should know.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanNote {
    /// A good commit is not an ancestor of the bad one: its merge bases must be good too, and are tested
    /// first.
    MergeBasesTested {
        /// The good revision as given.
        good: String,
        /// The bad revision as given.
        bad: String,
        /// The merge bases (full shas).
        bases: Vec<String>,
    },
    /// A good commit is an ancestor of another good one: implied good, not probed.
    GoodImplied {
        /// The implied one.
        good: String,
        /// The one that implies it.
        by: String,
    },
    /// More probes at once were asked for than there are candidates.
    WorkersCapped {
        /// Probes at once asked for.
        asked: usize,
        /// Candidates.
        candidates: usize,
        /// Workers used.
        used: usize,
    },
    /// The command names a file of the user's checkout by its absolute path: every probe runs that copy,
    /// not the commit's.
    CheckoutCopy {
        /// The path as given.
        path: String,
        /// The same file relative to the repository.
        relative: String,
    },
}

impl std::fmt::Display for PlanNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MergeBasesTested { good, bad, bases } => {
                let shorts: Vec<&str> = bases.iter().map(|b| super::record::short_sha(b)).collect();
                let one = bases.len() == 1;
                write!(
                    f,
                    "good commit {good} is not an ancestor of {bad}: its merge base{} {} must be good too, and {} tested first",
                    if one { "" } else { "s" },
                    shorts.join(", "),
                    if one { "is" } else { "are" },
                )
            }
            Self::GoodImplied { good, by } => {
                write!(
                    f,
                    "good commit {good} is implied by good commit {by}: not probed"
                )
            }
            Self::WorkersCapped {
                asked,
                candidates,
                used,
            } => write!(
                f,
                "{asked} probes at once asked for, {candidates} candidates: {used} workers are used"
            ),
            Self::CheckoutCopy { path, relative } => write!(
                f,
                "the command runs {path}, your checkout's own copy, at every commit (not each commit's {relative}): give it as ./{relative} to run each commit's"
            ),
        }
    }
}

/// Something that happened during a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum Event {
    /// The range was read and the run is starting.
    RunStarted {
        /// Commits that may be the first bad one.
        candidates: usize,
        /// Where logs go.
        run_dir: String,
        /// Whether launches are synchronous.
        launch_blocking: bool,
        /// The names of the older and newer states (`good`/`bad`; `broken`/`fixed` finding a fix).
        #[serde(default)]
        terms: crate::report::record::Terms,
    },
    /// A probe entered a phase.
    PhaseStarted {
        /// Probe number, from 1.
        step: usize,
        /// Full sha.
        commit: String,
        /// Why the probe runs.
        role: ProbeRole,
        /// Which phase.
        phase: Phase,
        /// Candidates left.
        remaining: usize,
        /// Probes git would estimate are left.
        estimated_steps: usize,
        /// The parallel worker running it (from 1); absent when probes run one at a time.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        worker: Option<usize>,
    },
    /// A probe finished.
    ProbeFinished {
        /// Probe number, from 1.
        step: usize,
        /// The record.
        record: Box<ProbeRecord>,
    },
    /// A probe in flight was stopped because its answer no longer mattered (its commit stopped being a
    /// candidate, or the search ended): nothing was recorded or learned from it.
    ProbeAbandoned {
        /// Probe number, from 1.
        step: usize,
        /// Full sha.
        commit: String,
        /// The worker that ran it (from 1).
        worker: usize,
    },
    /// A commit is run again under compute-sanitizer to learn which kernel faulted.
    SanitizerRerun {
        /// Probe number, from 1.
        step: usize,
        /// Full sha.
        commit: String,
    },
    /// The bad end showed the fault on only some of its runs: the search is the Bayesian one.
    FlakyDetected {
        /// Runs that showed the fault.
        faults: usize,
        /// Runs of the bad end.
        runs: usize,
        /// The confidence the answer must reach.
        confidence: f64,
        /// The budget of runs.
        max_runs: u32,
        /// Runs at once.
        workers: usize,
    },
    /// The parent of the commit a plain search named shows the fault too: the fault is flaky after all,
    /// and the Bayesian search takes over with every run made so far.
    FlakyAfterAll {
        /// The commit the plain search named.
        culprit: String,
    },
    /// A good endpoint fails with a bug told apart from the target: it counts as good for this search.
    GoodShowsOtherBug {
        /// Which endpoint (`good commit NAME`).
        what: String,
        /// Full sha.
        commit: String,
        /// The other bug, short form.
        signature: String,
    },
    /// Several workers share a GPU: how many of them probe at once from now on, and why.
    ProbesAtOnce {
        /// The GPU the workers share (`CUDA_VISIBLE_DEVICES` ids).
        gpu: String,
        /// Probes that may now run on it at once.
        probes: usize,
        /// Workers pinned to it.
        workers: usize,
        /// Why that many (the memory the measured probe used, or what made it fall back to one).
        reason: String,
    },
    /// The culprit's own sanitizer run names another kernel than the fault stack remembered from another
    /// commit: the same lines launch more than one kernel, and the search runs again with nothing
    /// remembered.
    RememberedStackMisled {
        /// The culprit that was about to be named.
        culprit: String,
        /// The kernel the sanitizer named there.
        named: String,
        /// The target's kernel.
        expected: String,
    },
    /// The probe journal of earlier runs of this range is reused.
    Resumed {
        /// Commits of this range with journaled results.
        reusable: usize,
        /// Journaled outcomes of the machine (not of a commit) that run again.
        retried: usize,
    },
    /// Run alone, a parallel search's answer did not hold: the search runs again one probe at a time.
    ParallelAnswerDisagrees {
        /// What did not hold.
        why: String,
    },
    /// A probe worktree could not be removed at the end of a run.
    WorktreeNotRemoved {
        /// Its path.
        path: String,
        /// Why.
        error: String,
    },
    /// A stage after the search started.
    StageBegan {
        /// Which.
        stage: Stage,
    },
    /// The bundle asks a tool about the environment.
    EnvironmentProbe {
        /// What is asked (`nvidia-smi`, `the CUDA driver`, `python -m torch.utils.collect_env`, …).
        tool: String,
    },
    /// `nightly` found no state for this repository, branch and judging config.
    NightlyNewState {
        /// The branch.
        branch: String,
        /// State files of this branch for another config or repository.
        others: usize,
        /// Where they are.
        state_dir: String,
    },
    /// Something worth telling that does not stop the run.
    Warning {
        /// The text.
        message: String,
    },
    /// What the plan decided that the user should know.
    Planned {
        /// What it decided.
        note: PlanNote,
    },
    /// The hand-off bundle was written.
    BundleWritten {
        /// Its directory.
        path: String,
        /// The bytes of its files (`bundle pack` warns above 25 MB).
        bytes: u64,
    },
    /// Triage finished.
    TriageFinished {
        /// Its one-line summary.
        summary: String,
        /// Its status (`found`, `clean`, `unavailable`, …).
        status: super::record::TriageStatus,
        /// What it found: the first finding's signature (class, kernel, site, access).
        signature: Option<crate::classify::Signature>,
    },
    /// Shrinking started on a graph of this many nodes.
    ShrinkStarted {
        /// Nodes in the full model.
        nodes: usize,
    },
    /// The harness's full run did not show the fault by itself: the shrink's runs go under
    /// compute-sanitizer's memcheck from here on.
    ShrinkUnderMemcheck {
        /// What the full run showed.
        why: String,
    },
    /// The recorded run located the fault.
    ShrinkLocated {
        /// The node the fault was charged to.
        node: String,
        /// Its signature, short form.
        signature: String,
    },
    /// A candidate subgraph was judged.
    ShrinkCandidate {
        /// Candidates run so far.
        run: usize,
        /// Which stage proposed it.
        stage: crate::shrink::Stage,
        /// Its size.
        nodes: usize,
        /// Whether it failed the same way.
        reproduced: bool,
    },
    /// Shrinking finished.
    ShrinkFinished {
        /// Its one-line summary.
        summary: String,
        /// How it ended (`minimal`, `not_reproduced`, …).
        status: super::record::ShrinkStatus,
        /// The nodes kept.
        kept: Vec<String>,
    },
    /// `cudabisect shrink` is over.
    ShrinkDone {
        /// Its report.
        report: Box<ShrinkReport>,
    },
    /// `cudabisect triage` is over.
    TriageDone {
        /// Its result.
        result: Box<super::record::TriageResult>,
    },
    /// `cudabisect bundle pack` wrote an archive.
    BundlePacked {
        /// The archive.
        path: String,
        /// Its size.
        bytes: u64,
        /// Files in it.
        files: usize,
        /// Whether bin/ (the cudabisect binary) went in.
        binary: bool,
    },
    /// `cudabisect init` wrote a config.
    ConfigWritten {
        /// The file written (a new bisect.toml, or the pyproject.toml it added `[tool.cudabisect]` to).
        path: String,
        /// The repro command written.
        repro: String,
        /// The build command written, if any.
        build: Option<String>,
        /// Frameworks the repro's code imports.
        frameworks: Vec<String>,
        /// GPUs this machine shows.
        gpus: usize,
        /// What the user should know.
        notes: Vec<String>,
    },
    /// A night of `nightly` is decided: its status (the exit code's meaning) and what it kept.
    Nightly {
        /// The night.
        record: Box<crate::report::record::NightlyRecord>,
    },
    /// The run is over.
    Finished {
        /// The report.
        report: Box<Report>,
    },
}

/// Receives events; implementations render them.
pub trait Reporter {
    /// Handles one event.
    fn event(&mut self, event: &Event);
}

/// Sends each event to another thread, whose reporter renders them: how work running beside the job's
/// own thread (a stage, a run of the cross-check) reports.
pub struct SendingReporter(pub std::sync::mpsc::Sender<Event>);

impl Reporter for SendingReporter {
    fn event(&mut self, event: &Event) {
        // The receiving side gone means the job stopped listening: nothing is left to tell.
        let _ = self.0.send(event.clone());
    }
}

/// Passes events on, each warning text once: a job made of several (a night's head probe, then its
/// bisection) meets the same trouble in each (a full disk under the journal) and says it once.
pub struct WarningsOnce<'a> {
    inner: &'a mut dyn Reporter,
    said: std::collections::HashSet<String>,
}

impl<'a> WarningsOnce<'a> {
    /// Around `inner`.
    pub fn new(inner: &'a mut dyn Reporter) -> Self {
        Self {
            inner,
            said: Default::default(),
        }
    }
}

impl Reporter for WarningsOnce<'_> {
    fn event(&mut self, event: &Event) {
        if let Event::Warning { message } = event {
            if !self.said.insert(message.clone()) {
                return;
            }
        }
        self.inner.event(event);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_warning_is_passed_on_once_and_every_other_event_each_time() {
        use super::Reporter;
        struct Seen(Vec<super::Event>);
        impl super::Reporter for Seen {
            fn event(&mut self, event: &super::Event) {
                self.0.push(event.clone());
            }
        }
        let mut seen = Seen(Vec::new());
        let mut once = super::WarningsOnce::new(&mut seen);
        let warning = |m: &str| super::Event::Warning { message: m.into() };
        for e in [
            warning("disk full"),
            warning("disk full"),
            warning("other"),
            warning("disk full"),
        ] {
            once.event(&e);
        }
        let other = super::Event::Resumed {
            reusable: 1,
            retried: 0,
        };
        once.event(&other);
        once.event(&other);
        assert_eq!(
            seen.0.len(),
            4,
            "two warnings and two other events: {:?}",
            seen.0
        );
    }

    /// Every event type is in the JSON reference, and the reference names no type that is gone.
    #[test]
    fn the_json_reference_lists_every_event_type() {
        let source = include_str!("event.rs");
        let page = include_str!("../../docs/reference/json.md");
        let body = &source[source.find("pub enum Event {").expect("the enum")..];
        let body = &body[..body.find("\n}\n").expect("its end")];
        let snake = |name: &str| {
            let mut out = String::new();
            for (i, c) in name.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_lowercase());
            }
            out
        };
        let variants: Vec<String> = body
            .lines()
            .filter_map(|l| l.strip_prefix("    ")?.strip_suffix(" {"))
            .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric()))
            .map(snake)
            .collect();
        assert!(variants.len() > 20, "{variants:?}");
        for v in &variants {
            assert!(
                page.contains(&format!("`{v}`")),
                "docs/reference/json.md lacks `{v}`"
            );
        }
        let table: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .flat_map(|l| l.split(" |").next().unwrap_or("").split(", "))
            .map(|n| n.trim_matches('`'))
            .collect();
        for name in table {
            assert!(
                variants.iter().any(|v| v == name),
                "docs/reference/json.md names `{name}`, which is no event type"
            );
        }
    }
}
