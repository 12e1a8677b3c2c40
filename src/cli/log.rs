//! `cudabisect log [RUN]`: a finished run's probes, for people, as JSON, or for `git bisect replay`.

use std::path::{Path, PathBuf};

use cudabisect::git::Repo;
use cudabisect::report::event::Event;
use cudabisect::report::json::Envelope;
use cudabisect::report::log::{git_bisect_log, human_log};
use cudabisect::report::record::{Report, FORMAT_VERSION};

use super::args::LogFormat;
use super::common::print_stdout;
use super::error::{CommandError, CommandResult, ErrorKind};
use super::exit_codes;

/// Prints the log of `run` (default: the latest run with a report) in `format`.
pub fn run(dir: &Path, run: Option<&str>, format: LogFormat) -> CommandResult {
    let runs = Repo::open(dir)
        .map_err(|e| CommandError::new(ErrorKind::Usage, e))?
        .state_dir()
        .join("runs");
    let run_dir = match run {
        Some(r) if Path::new(r).is_dir() => PathBuf::from(r),
        Some(r) => runs.join(r),
        None => {
            let found = latest(&runs).ok_or_else(|| {
                CommandError::usage(format!(
                    "no finished run in {}: run `cudabisect start` first",
                    runs.display()
                ))
            })?;
            if let Some(unfinished) = newer_without_report(&runs, &found) {
                eprintln!(
                    "note: the latest run, {}, has no report (it was killed or is still running; the next `start` resumes it): showing the one before it",
                    unfinished.display()
                );
            }
            found
        }
    };
    let path = run_dir.join("report.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        CommandError::usage(format!(
            "{}: no report ({e}); a run that was killed has none, and the next `start` resumes it",
            path.display()
        ))
    })?;
    let report: Report = serde_json::from_str(&text).map_err(|e| {
        CommandError::usage(format!("{}: not a cudabisect report: {e}", path.display()))
    })?;
    print_stdout(&match format {
        LogFormat::Human => human_log(&report),
        // JSON Lines, as every command's `--message-format json`: the run's `finished` event.
        LogFormat::Json => {
            let envelope = Envelope {
                format_version: FORMAT_VERSION,
                event: Event::Finished {
                    report: Box::new(report.clone()),
                },
            };
            serde_json::to_string(&envelope).unwrap_or_default() + "\n"
        }
        LogFormat::Git => git_bisect_log(&report),
    });
    Ok(exit_codes::OK)
}

/// A run directory newer than `shown` that has no report.
fn newer_without_report(runs: &Path, shown: &Path) -> Option<PathBuf> {
    let shown_at = shown.metadata().ok()?.modified().ok()?;
    std::fs::read_dir(runs)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.join("report.json").exists())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| !n.to_string_lossy().starts_with("nightly-"))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .filter(|(t, _)| *t > shown_at)
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
}

/// The most recently written run directory that holds a `start` report.
fn latest(runs: &Path) -> Option<PathBuf> {
    std::fs::read_dir(runs)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("report.json"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .and_then(|(_, p)| p.parent().map(Path::to_path_buf))
}
