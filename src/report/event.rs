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
    /// Something worth telling that does not stop the run.
    Warning {
        /// The text.
        message: String,
    },
    /// What the plan decided that the user should know (merge bases, implied good commits).
    Note {
        /// The text.
        message: String,
    },
    /// The hand-off bundle was written.
    BundleWritten {
        /// Its directory.
        path: String,
        /// The bytes of its files (`bundle pack` warns above 25 MB).
        bytes: u64,
    },
    /// A stage after the search started (triage, shrink, the bundle's environment probes).
    StageStarted {
        /// What it does.
        message: String,
    },
    /// Triage finished.
    TriageFinished {
        /// Its one-line summary.
        summary: String,
    },
    /// Shrinking started on a graph of this many nodes.
    ShrinkStarted {
        /// Nodes in the full model.
        nodes: usize,
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
    },
    /// `cudabisect shrink` is over.
    ShrinkDone {
        /// Its report.
        report: Box<ShrinkReport>,
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
