//! The nightly job's records: what it is asked, how a night ended, the state kept between nights and the
//! report. Plain data, shared by the job and the outputs CI reads.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::classify::Signature;
use crate::report::record::Report;
pub use crate::report::record::{NightlyRecord, NightlyStatus};

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

/// What a night produced: the record, and the bisection's report when there was one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NightlyReport {
    /// The night.
    pub nightly: NightlyRecord,
    /// The bisection, when the night ran one.
    pub bisect: Option<Report>,
}
