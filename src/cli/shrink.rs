//! `cudabisect shrink`: runs the shrink job and maps its result to an exit code.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use cudabisect::report::event::Reporter;
use cudabisect::report::record::ShrinkStatus;
use cudabisect::run::jobs::shrink::shrink_job;

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
    let no_device = report
        .signature
        .as_ref()
        .is_some_and(|s| s.class == cudabisect::classify::FaultClass::Infra);
    Ok(match report.status {
        ShrinkStatus::Minimal => exit_codes::OK,
        // The harness's full run met no usable device or driver: unavailable, not "does not fault".
        ShrinkStatus::NotReproduced if no_device => exit_codes::UNAVAILABLE,
        ShrinkStatus::NotReproduced => exit_codes::ENDPOINTS_INVALID,
        // Stopped mid-way, whatever the harness then said.
        _ if cancel.load(std::sync::atomic::Ordering::SeqCst) => exit_codes::INTERRUPTED,
        // A model or harness that cannot be described or run is the config's to fix: nothing was shrunk.
        ShrinkStatus::Failed | ShrinkStatus::NotApplicable => exit_codes::USAGE,
        ShrinkStatus::Interrupted => exit_codes::INTERRUPTED,
    })
}
