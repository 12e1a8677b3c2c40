//! `cudabisect triage`: runs the triage job, prints what it found and maps it to an exit code.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use cudabisect::config::CommandLine;
use cudabisect::report::event::{Event, Reporter};
use cudabisect::report::human::HumanReporter;
use cudabisect::report::json::JsonReporter;
use cudabisect::report::record::TriageStatus;
use cudabisect::run::jobs::triage::triage_job;

use super::common::print_stdout;
use super::error::CommandResult;
use super::exit_codes;

/// Exit 5 found, 0 clean, 6 no compute-sanitizer, 70 error, 130 interrupted.
pub fn run(
    dir: &Path,
    config: Option<&Path>,
    at: Option<&str>,
    command: Vec<String>,
    json: bool,
    cancel: &AtomicBool,
) -> CommandResult {
    let command = (!command.is_empty()).then_some(CommandLine::Argv(command));
    // Human: progress (bundle, warnings) on stderr, the result on stdout. JSON: JSON Lines on stdout, the
    // progress events, then `triage_done` with the result.
    let mut progress: Box<dyn Reporter> = if json {
        Box::new(JsonReporter::new())
    } else {
        Box::new(HumanReporter::new())
    };
    let result = triage_job(dir, config, at, command, progress.as_mut(), cancel)?;
    let mut out = String::new();
    if json {
        progress.event(&Event::TriageDone {
            result: Box::new(result.clone()),
        });
    } else {
        out.push_str(&format!("{}\n", result.summary));
        for f in &result.findings {
            out.push_str(&format!("  {}\n", f.line));
        }
        if let Some(sig) = &result.signature {
            out.push_str(&format!("signature: {}\n", sig.short()));
        }
        for file in &result.files {
            out.push_str(&format!("  log: {file}\n"));
        }
    }
    print_stdout(&out);
    Ok(match result.status {
        TriageStatus::Found => exit_codes::FAULT_FOUND,
        TriageStatus::Clean => exit_codes::OK,
        TriageStatus::Unavailable => exit_codes::UNAVAILABLE,
        TriageStatus::Interrupted => exit_codes::INTERRUPTED,
        // The sanitizer could not run the program, or wrote a report that cannot be read: no
        // conclusion, and not a failure of cudabisect.
        TriageStatus::Error => exit_codes::INCONCLUSIVE,
    })
}
