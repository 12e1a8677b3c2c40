//! `cudabisect start GOOD..BAD`: runs the bisection and maps its result to an exit code.

use std::sync::atomic::{AtomicBool, Ordering};

use cudabisect::report::event::Reporter;
use cudabisect::report::record::RunResult;
use cudabisect::run::jobs::start::start;
use cudabisect::run::plan::StartOptions;

use super::error::CommandResult;
use super::exit_codes;

/// Runs `start`: 0 found, 3 endpoints invalid, 4 inconclusive, 8 endpoint infra, 130 interrupted (even
/// after a found result, so a script knows the later stages did not finish).
pub fn run(opts: &StartOptions, reporter: &mut dyn Reporter, cancel: &AtomicBool) -> CommandResult {
    let report = start(opts, reporter, cancel)?;
    if report.interrupted || cancel.load(Ordering::SeqCst) {
        return Ok(exit_codes::INTERRUPTED);
    }
    Ok(match report.result {
        RunResult::Found => exit_codes::OK,
        RunResult::EndpointsInvalid => exit_codes::ENDPOINTS_INVALID,
        RunResult::EndpointInfra | RunResult::HostFailure => exit_codes::INFRA,
        RunResult::Ambiguous | RunResult::Inconclusive => exit_codes::INCONCLUSIVE,
    })
}
