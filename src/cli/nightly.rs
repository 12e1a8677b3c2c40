//! `cudabisect nightly`: one night of the regression job, its report, JUnit and step summary, and the
//! status as a documented exit code.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use cudabisect::report::event::{Event, Reporter};
use cudabisect::report::junit::{junit_case, probe_time, Outcome};
use cudabisect::run::job::{append_step_summary, write_atomic};
use cudabisect::run::nightly::{nightly, notify, NightlyOptions, NightlyReport, NightlyStatus};

use super::common::print_stdout;
use super::error::CommandResult;
use super::exit_codes;

/// Runs one night and writes what CI reads.
pub fn run(
    opts: &NightlyOptions,
    report_path: Option<&Path>,
    junit: Option<&Path>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> CommandResult {
    let night = nightly(opts, reporter, cancel)?;
    let n = &night.nightly;
    let body = night
        .bisect
        .as_ref()
        .and_then(|b| b.bundle.as_ref())
        .and_then(|b| std::fs::read_to_string(Path::new(b).join("REPORT.md")).ok());
    let mut warn = |message: String| reporter.event(&Event::Warning { message });
    if let Some(path) = report_path {
        match serde_json::to_vec_pretty(&night) {
            Ok(json) => {
                if let Err(e) = write_atomic(path, &json) {
                    warn(format!("cannot write {}: {e}", path.display()));
                }
            }
            Err(e) => warn(format!("the report could not be serialised: {e}")),
        }
    }
    if let Some(path) = junit {
        let written = junit_case(
            &format!("cudabisect nightly {}", n.branch),
            &format!("{} at {}", n.branch, &n.head[..12.min(n.head.len())]),
            &outcome(&night, body.as_deref()),
            night.bisect.as_ref().map(probe_time).unwrap_or_default(),
        )
        .map_err(std::io::Error::other)
        .and_then(|xml| write_atomic(path, xml.as_bytes()));
        if let Err(e) = written {
            warn(format!("cannot write {}: {e}", path.display()));
        }
    }
    let text = format!(
        "## cudabisect nightly: {}\n\n{}\n\n{}",
        status_word(n.status),
        n.message,
        body.as_deref().unwrap_or("")
    );
    if let Err(e) = append_step_summary(&text) {
        warn(format!("cannot append to $GITHUB_STEP_SUMMARY: {e}"));
    }
    if let Some(message) = notify(
        opts,
        &night,
        &[
            ("CUDABISECT_REPORT", report_path),
            ("CUDABISECT_JUNIT", junit),
        ],
        cancel,
    ) {
        warn(message);
    }
    print_stdout(&format!(
        "Nightly: {}: {}\n",
        status_word(n.status),
        n.message
    ));
    if cancel.load(Ordering::SeqCst) {
        return Ok(exit_codes::INTERRUPTED);
    }
    Ok(match n.status {
        NightlyStatus::Clean => exit_codes::OK,
        NightlyStatus::Baseline => exit_codes::BASELINE,
        NightlyStatus::Fixed => exit_codes::FIXED,
        NightlyStatus::Regression => exit_codes::REGRESSION,
        NightlyStatus::StillFailing => exit_codes::STILL_FAILING,
        NightlyStatus::Inconclusive => exit_codes::INCONCLUSIVE,
    })
}

fn status_word(s: NightlyStatus) -> &'static str {
    match s {
        NightlyStatus::Baseline => "baseline",
        NightlyStatus::Clean => "clean",
        NightlyStatus::Fixed => "fixed",
        NightlyStatus::Regression => "regression",
        NightlyStatus::StillFailing => "still_failing",
        NightlyStatus::Inconclusive => "inconclusive",
    }
}

fn outcome(night: &NightlyReport, body: Option<&str>) -> Outcome {
    let n = &night.nightly;
    let kind = status_word(n.status).to_string();
    match n.status {
        NightlyStatus::Regression | NightlyStatus::StillFailing => Outcome::Failure {
            message: n.message.clone(),
            body: body.unwrap_or(&n.message).to_string(),
            kind,
        },
        NightlyStatus::Inconclusive => Outcome::Error {
            message: n.message.clone(),
            kind,
        },
        _ => Outcome::Pass,
    }
}
