//! End-to-end tests of distributed repros on the CPU: a fake launcher (a real shell script) that starts
//! its ranks in its process group, as torchrun does, plus a helper that escapes the group twice; ranks that
//! print PyTorch's `[rankN]:` prefixes. A real git repository, the real binary. The same on two real GPUs
//! with torchrun is in tests/gpu.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::histories::history_of_modes;
use crate::common::repo_builder::{put, Files};
use git2::Oid;
use serde_json::Value;

/// The launcher: two ranks in its group, and a helper that leaves the group with `setsid` and whose own
/// child leaves that session again, so only the run's tag can find it.
const LAUNCHER: &str = include_str!("fakes/distributed_launcher.sh");

/// One rank. `fault`: rank 0 reports the collective its peer abandoned before rank 1 reports the kernel
/// fault that caused it (a handshake through a file orders them); `hang`: both wait in a collective.
const RANK: &str = include_str!("fakes/distributed_rank.py");

struct Repo {
    _tmp: tempfile::TempDir,
    path: PathBuf,
    pids: PathBuf,
    commits: Vec<Oid>,
}

fn repo(modes: &[&str]) -> Repo {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let pids = tmp.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let config = format!(
        "[repro]\ncommand = [\"./launch.sh\"]\ntimeout = \"3s\"\ngrace-period = \"200ms\"\ngpus = 2\nenv = {{ PID_DIR = \"{}\" }}\n\n[triage]\nenabled = false\n",
        pids.display()
    );
    let mut fixed = Files::new();
    put(&mut fixed, "launch.sh", LAUNCHER, true);
    put(&mut fixed, "rank.py", RANK, false);
    let commits = history_of_modes(&path, modes, &fixed, &config).unwrap();
    Repo {
        _tmp: tmp,
        path,
        pids,
        commits,
    }
}

use cudabisect::exec::process::is_alive as alive;

/// `cudabisect start` over the whole history, writing its report beside the repository.
fn start_command(repo: &Repo) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cudabisect"));
    cmd.args([
        "start",
        &format!("{}..main", repo.commits[0]),
        "--no-shrink",
    ])
    .arg("-C")
    .arg(&repo.path)
    .arg("--report")
    .arg(repo.path.parent().unwrap().join("report.json"));
    cmd
}

fn start(repo: &Repo) -> (i32, String, Value) {
    let report = repo.path.parent().unwrap().join("report.json");
    let out = start_command(repo).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(&report)
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or_else(|_| panic!("no report: {text}"));
    (out.status.code().unwrap_or(-1), text, report)
}

fn py_spy() -> bool {
    Command::new("py-spy").arg("--version").output().is_ok()
}

fn pid_in(dir: &Path, name: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

#[test]
fn a_rank_one_kernel_fault_is_the_culprit_through_a_hang_stretch_and_no_process_survives() {
    let modes = [
        "clean", "clean", "clean", "hang", "hang", "hang", "clean", "clean", "fault", "fault",
        "fault", "fault",
    ];
    let repo = repo(&modes);
    let (code, text, report) = start(&repo);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        report["first_bad"]["commit"].as_str(),
        Some(repo.commits[8].to_string().as_str()),
        "{text}"
    );
    let probes = report["probes"].as_array().unwrap();
    let bad = probes
        .iter()
        .find(|p| p["commit"] == repo.commits[8].to_string())
        .unwrap();
    // The kernel fault on rank 1, not the NCCL error rank 0 printed first, and not the launcher's frame.
    assert_eq!(bad["signature"]["class"], "illegal_address", "{bad:#}");
    assert_eq!(bad["signature"]["rank"], 1, "{bad:#}");
    assert_eq!(bad["signature"]["site"], "train.py:40", "{bad:#}");
    // Each rank's own lines are written beside the run's log.
    let log = bad["log"].as_str().unwrap();
    let rank1 = std::fs::read_to_string(log.replace(".log", ".rank1.log")).unwrap();
    assert!(
        rank1.starts_with("Traceback") && rank1.contains("illegal memory access"),
        "{rank1}"
    );
    // The rank's own files from the launcher's log directory are collected under it too.
    assert!(rank1.contains("step 7: loss 2.31"), "{rank1}");
    let hangs: Vec<&Value> = probes
        .iter()
        .filter(|p| p["signature"]["class"] == "hang")
        .collect();
    assert!(
        !hangs.is_empty(),
        "the search never met the hang stretch: {text}"
    );
    for hang in &hangs {
        assert_eq!(hang["verdict"], "skip", "{hang:#}");
        let detail = hang["signature"]["detail"].as_str().unwrap_or_default();
        if py_spy() {
            // Stacks dumped before the kill say where each rank waited.
            assert!(
                detail.contains("rank 0 in all_reduce") && detail.contains("rank 1 in all_reduce"),
                "{detail}"
            );
        }
    }
    // Every rank, and the helper that escaped the group twice, is gone.
    for name in ["rank0.pid", "rank1.pid", "escapee.pid"] {
        let pid = pid_in(&repo.pids, name).unwrap_or_else(|| panic!("{name} never written"));
        assert!(!alive(pid), "{name} {pid} survived the run");
    }
}

#[test]
fn a_probe_needing_more_gpus_than_there_are_is_refused_before_anything_runs() {
    let repo = repo(&["clean", "fault"]);
    let toml = repo.path.join("bisect.toml");
    let config = std::fs::read_to_string(&toml).unwrap();
    let bad = repo.path.parent().unwrap().join("bad.toml");
    std::fs::write(
        &bad,
        config.replace("[triage]", "[search]\ngpus-per-probe = 4\n\n[triage]"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{}..main", repo.commits[0]), "--config"])
        .arg(&bad)
        .arg("-C")
        .arg(&repo.path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("[repro] gpus = 2 and [search] gpus-per-probe = 4 disagree"),
        "{stderr}"
    );
}

#[test]
fn ctrl_c_stops_every_rank_the_launcher_and_what_escaped_it() {
    let repo = repo(&["clean", "hang"]);
    let mut child = start_command(&repo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The bad end's ranks hang in their collective: interrupt once both ranks and the escapee are up.
    crate::common::wait_for_files(
        &repo.pids,
        std::time::Duration::from_secs(60),
        "the ranks never started",
        || {
            ["rank0.pid", "rank1.pid", "escapee.pid"]
                .iter()
                .all(|n| pid_in(&repo.pids, n).is_some())
        },
    );
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    for name in ["rank0.pid", "rank1.pid", "escapee.pid"] {
        let pid = pid_in(&repo.pids, name).unwrap();
        assert!(!alive(pid), "{name} {pid} survived Ctrl-C");
    }
}
