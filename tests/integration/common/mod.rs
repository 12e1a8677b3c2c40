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
    let report = scratch.join("report.json");
    let _ = std::fs::remove_file(&report);
    let out = Command::new(bin())
        .arg("start")
        .args(args)
        .arg("-C")
        .arg(dir)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let r = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), r, text)
}

/// Fails the test, naming what to install, unless `python3 -c CODE` succeeds: these tests must never
/// pass unrun. (Only the binaries that run Python use it.)
#[allow(dead_code)]
pub fn require_python(code: &str, install: &str) {
    let ok = Command::new("python3")
        .args(["-c", code])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "these tests need {install} (CI installs it)");
}

/// A fixture file's text: `fixtures/<dir>/<rel>`. (Only the binaries that run Python use it.)
#[allow(dead_code)]
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
/// its exit status and everything it printed. (Only the binaries that run Python use it.)
#[allow(dead_code)]
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

/// Waits until `ready()` holds, looking every 20 ms, and fails with `never` after `within`. What the
/// tests wait for (a pid file a fake wrote, a Slurm job's state, a flag the driver sets) gives no event
/// to block on; a bounded look at a fixed pace keeps a core free where a spin would take it.
pub fn wait_until(within: std::time::Duration, never: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "{never}");
        std::thread::park_timeout(std::time::Duration::from_millis(20));
    }
}
