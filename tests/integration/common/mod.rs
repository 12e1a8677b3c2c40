//! Helpers shared by the integration tests: the binary under test, `cudabisect shrink` and `start` run
//! through it, and a bounded wait.

pub mod histories;
#[path = "../../../src/sample/repo_builder.rs"]
pub mod repo_builder;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cudabisect")
}

/// Runs `cudabisect shrink` in `dir` (with `env` added) and returns its exit status, the report of its
/// `shrink_done` event (null when there was none) and everything it printed.
pub fn shrink(dir: &Path, env: &[(&str, &str)]) -> (i32, Value, String) {
    let mut cmd = Command::new(bin());
    cmd.args(["shrink", "--message-format", "json", "-C"])
        .arg(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let done = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "shrink_done")
        .map(|v| v["data"]["report"].clone())
        .unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        done,
        stdout + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The ids of a shrink report's kept nodes.
pub fn kept(report: &Value) -> Vec<String> {
    report["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect()
}

/// Runs `cudabisect start ARGS…` in `dir` with `--report` in `scratch`; its exit status, the report (null
/// when none was written) and everything it printed.
pub fn start_report(dir: &Path, args: &[&str], scratch: &Path) -> (i32, Value, String) {
    let (out, report) = start_with_report(dir, args, &scratch.join("report.json"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (
        out.status.code().unwrap_or(-1),
        report.unwrap_or(Value::Null),
        text,
    )
}

/// Runs `cudabisect start ARGS…` in `dir` with `--report REPORT` (removed first); what it did, and the
/// report it wrote (`None` when it wrote none; a report that is not JSON fails the test).
pub fn start_with_report(
    dir: &Path,
    args: &[&str],
    report: &Path,
) -> (std::process::Output, Option<Value>) {
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
        .map(|t| serde_json::from_str(&t).expect("the report is JSON"));
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

/// Copies a shrink report's minimal repro folder into a fresh directory, away from the project, and runs
/// its `repro.py` there with `env` added (and the project on `PYTHONPATH` only when `project` is given);
/// its exit status and everything it printed.
pub fn run_repro_alone(
    report: &Value,
    project: Option<&Path>,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let repro = std::path::PathBuf::from(report["minimal_model"].as_str().expect("a repro.py"));
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
