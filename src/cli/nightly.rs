//! `cudabisect nightly`: one night of the regression job, and its status as a documented exit code
//! (one per status, or CI's pass/fail).

use std::sync::atomic::{AtomicBool, Ordering};

use cudabisect::report::event::Reporter;
use cudabisect::run::jobs::nightly::{nightly, NightlyOptions, NightlyStatus};

use super::args::NightlyExitCodes;
use super::error::CommandResult;
use super::exit_codes;

/// Runs one night (its report, JUnit, step summary and notify hook are written by the library).
pub fn run(
    opts: &NightlyOptions,
    style: NightlyExitCodes,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> CommandResult {
    let night = nightly(opts, reporter, cancel)?;
    let n = &night.nightly;
    if cancel.load(Ordering::SeqCst) {
        return Ok(exit_codes::INTERRUPTED);
    }
    Ok(match n.status {
        // A good night passes a CI step that was not written for cudabisect's codes.
        NightlyStatus::Baseline | NightlyStatus::Fixed if style == NightlyExitCodes::Ci => {
            exit_codes::OK
        }
        NightlyStatus::Clean => exit_codes::OK,
        NightlyStatus::Baseline => exit_codes::BASELINE,
        NightlyStatus::Fixed => exit_codes::FIXED,
        NightlyStatus::Regression => exit_codes::REGRESSION,
        NightlyStatus::StillFailing => exit_codes::STILL_FAILING,
        NightlyStatus::Inconclusive => exit_codes::INCONCLUSIVE,
    })
}
