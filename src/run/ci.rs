//! What CI systems and a team's hooks read at the end of a run: JUnit XML, the Markdown summary appended
//! to `$GITHUB_STEP_SUMMARY`, the nightly report file and the `[nightly] notify` command. Every failure here
//! is a warning: the result is already on disk.

use crate::report::record::short_sha;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::classify::Exit;
use crate::config::Config;
use crate::exec::executor::Executor;
use crate::exec::process::CommandSpec;
use crate::report::event::{Event, Reporter};
use crate::report::junit::{junit_case, junit_xml, probe_time, Outcome};
use crate::report::record::Report;

use super::nightly_state::{NightlyOptions, NightlyReport, NightlyStatus};
use crate::atomic_file::write_atomic;

fn warn(reporter: &mut dyn Reporter, message: String) {
    reporter.event(&Event::Warning { message });
}

/// The bundle's REPORT.md, when the run wrote a bundle.
fn report_md(report: Option<&Report>) -> Option<String> {
    report
        .and_then(|r| r.bundle.as_ref())
        .and_then(|b| std::fs::read_to_string(Path::new(b).join("REPORT.md")).ok())
}

/// What CI systems read: JUnit XML (`--junit`), and the Markdown summary appended to
/// `$GITHUB_STEP_SUMMARY` when that is set. Failures are warnings: the result is already on disk.
pub fn start_outputs(
    report: &Report,
    config: &Config,
    junit: Option<&Path>,
    reporter: &mut dyn Reporter,
) {
    let body = report_md(Some(report));
    if let Some(path) = junit {
        let written = junit_xml(report, &config.repro.command.display(), body.as_deref())
            .map_err(std::io::Error::other)
            .and_then(|xml| write_atomic(path, xml.as_bytes()));
        if let Err(e) = written {
            reporter.event(&Event::Warning {
                message: format!("cannot write {}: {e}", path.display()),
            });
        }
    }
    let text = body.unwrap_or_else(|| format!("## cudabisect\n\n{}\n", report.message));
    if let Err(e) = append_step_summary(&text) {
        reporter.event(&Event::Warning {
            message: format!("cannot append to $GITHUB_STEP_SUMMARY: {e}"),
        });
    }
}

/// Appends Markdown to `$GITHUB_STEP_SUMMARY` when that is set (GitHub Actions shows it on the run's
/// page); nothing otherwise.
pub fn append_step_summary(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()) else {
        return Ok(());
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()))
}

/// A night's outputs: the JSON report (`--report`), JUnit (`--junit`: `regression` and `still_failing` are
/// failures with REPORT.md as body, `inconclusive` an error), the step summary, and `[nightly] notify`
/// after a `regression` or a `fixed` night.
pub fn nightly_outputs(
    night: &NightlyReport,
    config: &Config,
    (workdir, executor): (&Path, &dyn Executor),
    opts: &NightlyOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) {
    let n = &night.nightly;
    let body = report_md(night.bisect.as_ref());
    if let Some(path) = &opts.report {
        let written = serde_json::to_vec_pretty(night)
            .map_err(std::io::Error::other)
            .and_then(|json| write_atomic(path, &json));
        if let Err(e) = written {
            warn(reporter, format!("cannot write {}: {e}", path.display()));
        }
    }
    if let Some(path) = &opts.junit {
        let kind = n.status.as_str().to_string();
        let outcome = match n.status {
            NightlyStatus::Regression | NightlyStatus::StillFailing => Outcome::Failure {
                message: n.message.clone(),
                body: body.clone().unwrap_or_else(|| n.message.clone()),
                kind,
            },
            NightlyStatus::Inconclusive => Outcome::Error {
                message: n.message.clone(),
                kind,
            },
            _ => Outcome::Pass,
        };
        let written = junit_case(
            &format!("cudabisect nightly {}", n.branch),
            &format!("{} at {}", n.branch, short_sha(&n.head)),
            &outcome,
            night.bisect.as_ref().map(probe_time).unwrap_or_default(),
        )
        .map_err(std::io::Error::other)
        .and_then(|xml| write_atomic(path, xml.as_bytes()));
        if let Err(e) = written {
            warn(reporter, format!("cannot write {}: {e}", path.display()));
        }
    }
    let text = format!(
        "## cudabisect nightly: {}\n\n{}\n\n{}",
        n.status.as_str(),
        n.message,
        body.as_deref().unwrap_or("")
    );
    if let Err(e) = append_step_summary(&text) {
        warn(
            reporter,
            format!("cannot append to $GITHUB_STEP_SUMMARY: {e}"),
        );
    }
    if let Some(message) = notify(night, config, (workdir, executor), opts, cancel) {
        warn(reporter, message);
    }
}

/// What the notify hook is told of the night, in its environment.
fn notify_env(night: &NightlyReport, opts: &NightlyOptions) -> Vec<(String, String)> {
    let n = &night.nightly;
    let mut env = vec![
        (
            "CUDABISECT_NIGHTLY_STATUS".to_string(),
            n.status.as_str().to_string(),
        ),
        ("CUDABISECT_NIGHTLY_MESSAGE".to_string(), n.message.clone()),
        ("CUDABISECT_BRANCH".to_string(), n.branch.clone()),
        ("CUDABISECT_HEAD".to_string(), n.head.clone()),
        (
            "CUDABISECT_FIRST_BAD".to_string(),
            n.first_bad.clone().unwrap_or_default(),
        ),
    ];
    let files = [
        (
            "CUDABISECT_REPORT",
            opts.report.as_ref().map(|p| p.display().to_string()),
        ),
        (
            "CUDABISECT_JUNIT",
            opts.junit.as_ref().map(|p| p.display().to_string()),
        ),
        (
            "CUDABISECT_BUNDLE",
            night.bisect.as_ref().and_then(|b| b.bundle.clone()),
        ),
    ];
    for (name, value) in files {
        if let Some(v) = value {
            env.push((name.to_string(), v));
        }
    }
    env
}

/// Runs `[nightly] notify` after a `regression` or a `fixed` night, with what happened in its environment:
/// `CUDABISECT_NIGHTLY_STATUS`, `CUDABISECT_NIGHTLY_MESSAGE`, `CUDABISECT_BRANCH`, `CUDABISECT_HEAD`,
/// `CUDABISECT_FIRST_BAD`, and the paths `CUDABISECT_REPORT`, `CUDABISECT_JUNIT`, `CUDABISECT_BUNDLE` when
/// there are such files. Returns a warning when it could not run or failed; nothing otherwise.
fn notify(
    night: &NightlyReport,
    config: &Config,
    (workdir, executor): (&Path, &dyn Executor),
    opts: &NightlyOptions,
    cancel: &AtomicBool,
) -> Option<String> {
    let n = &night.nightly;
    if !matches!(n.status, NightlyStatus::Regression | NightlyStatus::Fixed) {
        return None;
    }
    let command = config.nightly.notify.clone()?;
    let env = notify_env(night, opts);
    let spec = CommandSpec {
        command,
        cwd: workdir.to_path_buf(),
        env,
        timeout: config.nightly.notify_timeout,
        grace: std::time::Duration::from_secs(2),
        stack_dump: None,
    };
    // Through the night's executor, like every command of the user's (with a scheduler, a step of its
    // own).
    let result = executor.session().run(&spec, cancel);
    match result {
        Ok(run) if run.exit == Exit::Code(0) => None,
        Ok(run) => {
            let how = match run.exit {
                Exit::Code(c) => format!("exited {c}"),
                Exit::Signal(s) => format!("was killed by {}", crate::classify::signal_name(s)),
                Exit::Timeout => format!(
                    "ran past its {}s timeout and was stopped",
                    config.nightly.notify_timeout.as_secs()
                ),
                Exit::Unknown => "ended".to_string(),
            };
            // A hook that prints a megabyte on one line gets a line's worth of warning.
            let last: String = run
                .output
                .lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect();
            Some(format!("[nightly] notify {how}: {last}"))
        }
        Err(e) => Some(format!("[nightly] notify could not run: {e}")),
    }
}
