//! The nightly job's records: what it is asked, how a night ended, the state kept between nights and the
//! report. Plain data, shared by the job and the outputs CI reads.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::classify::Signature;
use crate::report::record::Report;

/// What `nightly` is asked to do.
#[derive(Clone, Debug, Default)]
pub struct NightlyOptions {
    /// The repository.
    pub dir: PathBuf,
    /// Config file (default: bisect.toml at the repository root).
    pub config: Option<PathBuf>,
    /// The branch to test (default: the checkout's current branch).
    pub branch: Option<String>,
    /// Where the state lives (default: `nightly/` in the state directory under the git directory).
    pub state: Option<PathBuf>,
    /// The last good commit, for the first night.
    pub since: Option<String>,
    /// Skip triage and shrinking in the bisection.
    pub no_stages: bool,
    /// Write the JSON report here.
    pub report: Option<PathBuf>,
    /// Write JUnit XML here.
    pub junit: Option<PathBuf>,
}

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

/// The regression that is open.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OpenRegression {
    /// The first bad commit the bisection named (`None` when skips left several).
    pub first_bad: Option<String>,
    /// The bug.
    pub signature: Signature,
    /// The first head that showed it.
    pub open_since: String,
    /// The last head that showed it.
    pub last_failing: String,
    /// Nights it has failed.
    pub nights: u32,
}

/// What is kept between nights, per branch, config and machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NightlyState {
    /// The last head that was clean.
    pub last_good: Option<String>,
    /// The open regression.
    pub open: Option<OpenRegression>,
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

/// What a night produced: the record, and the bisection's report when there was one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NightlyReport {
    /// The night.
    pub nightly: NightlyRecord,
    /// The bisection, when the night ran one.
    pub bisect: Option<Report>,
}
