//! Helpers shared by the integration tests: the binary under test, `cudabisect shrink` and `start` run
//! through it, and a bounded wait.

pub mod histories;
#[path = "../../../src/sample/repo_builder.rs"]
pub mod repo_builder;

use std::path::Path;
use std::process::Command;

use cudabisect::report::event::Event;
use cudabisect::report::json::Envelope;
use cudabisect::report::record::{
    AloneRuns, CapturedFault, ProbeRole, Report, ReproData, ShrinkReport,
};

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cudabisect")
}

/// The events of JSON Lines output, typed: every line that opens an object must be an event of the
/// documented format, so a renamed field fails here, not as a lookup that quietly reads null.
pub fn events(stdout: &str) -> Vec<Event> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            serde_json::from_str::<Envelope>(l)
                .unwrap_or_else(|e| panic!("not an event ({e}): {l}"))
                .event
        })
        .collect()
}

/// Checks that each step number of a run's events names one probe: one commit in one role, whatever
/// phases, reruns or stop it had. `Err` says which number was given twice.
pub fn one_probe_per_step(events: &[Event]) -> Result<(), String> {
    let mut seen: std::collections::BTreeMap<usize, (String, Option<ProbeRole>)> =
        Default::default();
    for e in events {
        let (step, commit, role) = match e {
            Event::PhaseStarted {
                step, commit, role, ..
            } => (*step, commit.clone(), Some(*role)),
            Event::ProbeFinished { step, record } => {
                (*step, record.commit.clone(), Some(record.role))
            }
            Event::ProbeAbandoned { step, commit, .. } => (*step, commit.clone(), None),
            _ => continue,
        };
        let was = seen.entry(step).or_insert((commit.clone(), role));
        if was.0 != commit || (was.1.is_some() && role.is_some() && was.1 != role) {
            return Err(format!(
                "step {step} is {} ({:?}) and {commit} ({role:?})",
                was.0, was.1
            ));
        }
        was.1 = was.1.or(role);
    }
    Ok(())
}

/// Runs `cudabisect shrink` in `dir` (with `env` added) and returns its exit status, the report of its
/// `shrink_done` event (the test fails when there was none) and everything it printed.
pub fn shrink(dir: &Path, env: &[(&str, &str)]) -> (i32, ShrinkReport, String) {
    let (code, done, text) = shrink_run(dir, env);
    let done = done.unwrap_or_else(|| panic!("no shrink_done event: {text}"));
    (code, done, text)
}

/// `shrink`, for a run that may end before any shrink (bad input): the report is `None` then.
pub fn shrink_run(dir: &Path, env: &[(&str, &str)]) -> (i32, Option<ShrinkReport>, String) {
    let mut cmd = Command::new(bin());
    cmd.args(["shrink", "--message-format", "json", "-C"])
        .arg(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let done = events(&stdout).into_iter().find_map(|e| match e {
        Event::ShrinkDone { report } => Some(*report),
        _ => None,
    });
    let text = stdout + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), done, text)
}

/// The ids of a shrink report's kept nodes.
pub fn kept(report: &ShrinkReport) -> Vec<String> {
    report.kept.iter().map(|n| n.id.clone()).collect()
}

/// The first bad commit a report names, in full.
pub fn first_bad(report: &Report) -> Option<String> {
    report.first_bad.as_ref().map(|c| c.commit.clone())
}

/// A report's shrink, which the caller expects (`text`, what the run printed, when there is none).
pub fn shrink_of<'r>(report: &'r Report, text: &str) -> &'r ShrinkReport {
    report
        .shrink
        .as_ref()
        .unwrap_or_else(|| panic!("no shrink: {text}"))
}

/// What a shrink captured of the training step, which the caller expects.
pub fn captured(s: &ShrinkReport) -> &CapturedFault {
    s.captured
        .as_ref()
        .unwrap_or_else(|| panic!("nothing captured: {s:?}"))
}

/// Runs `cudabisect start ARGS…` in `dir` with `--report` in `scratch`; its exit status, the report
/// (`None` when none was written) and everything it printed.
pub fn start_report(dir: &Path, args: &[&str], scratch: &Path) -> (i32, Option<Report>, String) {
    let (out, report) = start_with_report(dir, args, &scratch.join("report.json"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), report, text)
}

/// Runs `cudabisect start ARGS…` in `dir` with `--report REPORT` (removed first); what it did, and the
/// report it wrote (`None` when it wrote none; a report that is not one of the documented format fails the
/// test).
pub fn start_with_report(
    dir: &Path,
    args: &[&str],
    report: &Path,
) -> (std::process::Output, Option<Report>) {
    let _ = std::fs::remove_file(report);
    let out = Command::new(bin())
        .arg("start")
        .args(args)
        .arg("-C")
        .arg(dir)
        .arg("--report")
        .arg(report)
        .output()
        .unwrap();
    let written = std::fs::read_to_string(report)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap_or_else(|e| panic!("not a report ({e}): {t}")));
    (out, written)
}

/// Fails the test, naming what to install, unless `python3 -c CODE` succeeds: these tests must never
/// pass unrun.
pub fn require_python(code: &str, install: &str) {
    let ok = Command::new("python3")
        .args(["-c", code])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "these tests need {install} (CI installs it)");
}

/// A fixture file's text: `fixtures/<dir>/<rel>`.
pub fn fixture_text(dir: &str, rel: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(dir)
            .join(rel),
    )
    .unwrap()
}

/// What a shrink's minimal repro ships, which the caller expects.
pub fn data(s: &ShrinkReport) -> &ReproData {
    s.data
        .as_ref()
        .unwrap_or_else(|| panic!("no repro data: {s:?}"))
}

/// The fresh-process runs of a shrink's minimal repro, which the caller expects.
pub fn alone(s: &ShrinkReport) -> &AloneRuns {
    data(s)
        .alone
        .as_ref()
        .unwrap_or_else(|| panic!("never run alone: {s:?}"))
}

/// A shrink report's minimal `repro.py`, which the caller expects.
pub fn repro_py(s: &ShrinkReport) -> &Path {
    Path::new(
        s.minimal_model
            .as_deref()
            .unwrap_or_else(|| panic!("no repro.py: {s:?}")),
    )
}

/// Copies a minimal repro's folder (the one `repro` is in) into a fresh directory, away from the
/// project, and runs its `repro.py` there with `env` added (and the project on `PYTHONPATH` only when `project` is given);
/// its exit status and everything it printed.
pub fn run_repro_alone(
    repro: &Path,
    project: Option<&Path>,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let fresh = tempfile::tempdir().unwrap();
    cudabisect::report::bundle::copy_dir(repro.parent().unwrap(), fresh.path()).unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg(fresh.path().join("repro.py"))
        .current_dir(fresh.path())
        .env_remove("PYTHONPATH");
    if let Some(p) = project {
        cmd.env("PYTHONPATH", p);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Runs a bundle's `reproduce.sh` against the repository `repo` from a fresh directory, with no
/// `PYTHONPATH` of ours and `env` added: its exit status and everything it printed.
pub fn reproduce_from_elsewhere(
    bundle: &Path,
    repo: &Path,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let elsewhere = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bundle.join("reproduce.sh"));
    cmd.arg(repo)
        .current_dir(elsewhere.path())
        .env("TMPDIR", elsewhere.path())
        .env_remove("PYTHONPATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Waits until `ready()` holds, looking again each time a file in `dir` is created, written and closed,
/// or moved in (inotify): the fakes say how far they got by writing files there. Fails with `never` after
/// `within`.
pub fn wait_for_files(
    dir: &Path,
    within: std::time::Duration,
    never: &str,
    mut ready: impl FnMut() -> bool,
) {
    use std::os::unix::ffi::OsStrExt;
    let deadline = std::time::Instant::now() + within;
    std::fs::create_dir_all(dir).unwrap();
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: plain system calls on a descriptor this function opens, owns and closes.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(fd >= 0, "inotify_init1 failed");
    let mask = libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO | libc::IN_CREATE;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let wd = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), mask) };
    assert!(wd >= 0, "inotify_add_watch {} failed", dir.display());
    let mut events = [0u8; 4096];
    while !ready() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "{never}");
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: one pollfd, valid for the call.
        if unsafe { libc::poll(&mut pfd, 1, ms) } > 0 {
            // SAFETY: reads into a buffer of the given length.
            unsafe { libc::read(fd, events.as_mut_ptr().cast(), events.len()) };
        }
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
}

/// Asks `ready()` every `every` until it holds, failing with `never` after `within`: for a state only an
/// outside system knows and tells no one (a Slurm job's), asked at a pace that system can bear.
pub fn poll_until(
    every: std::time::Duration,
    within: std::time::Duration,
    never: &str,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + within;
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "{never}");
        std::thread::park_timeout(every);
    }
}
