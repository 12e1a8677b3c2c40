//! The `start` job: one bisection of `GOOD..BAD` with its stages and outputs. The pipeline is
//! [`crate::run::bisection`], shared with `nightly`, which runs it for the regression it finds.

use std::sync::atomic::AtomicBool;

use crate::report::event::Reporter;
use crate::report::record::Report;
use crate::run::bisection::bisect;
use crate::run::plan::{RunError, StartOptions};

/// Runs `start`. `Err` only for problems found before anything ran (bad input, a held lock); once the
/// search starts, every outcome is in the report.
pub fn start(
    opts: &StartOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Report, RunError> {
    bisect(opts, reporter, cancel)
}
