//! `cudabisect shrink`: runs the shrink job and maps its result to an exit code.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use cudabisect::report::event::Reporter;
use cudabisect::report::record::ShrinkStatus;
use cudabisect::run::shrink_job::shrink_job;

use super::error::CommandResult;
use super::exit_codes;

/// Exit 0 minimal subgraph found, 3 the model does not fault, 70 the harness failed, 130 interrupted.
pub fn run(
    dir: &Path,
    config: Option<&Path>,
    at: Option<&str>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> CommandResult {
    let report = shrink_job(dir, config, at, reporter, cancel)?;
    Ok(match report.status {
        ShrinkStatus::Minimal => exit_codes::OK,
        ShrinkStatus::NotReproduced => exit_codes::ENDPOINTS_INVALID,
        ShrinkStatus::Failed => exit_codes::INTERNAL,
        ShrinkStatus::Interrupted => exit_codes::INTERRUPTED,
    })
}
