//! End-to-end tests of distributed repros on the CPU: a fake launcher (a real shell script) that starts
//! its ranks in its process group, as torchrun does, plus a helper that escapes the group twice; ranks that
//! print PyTorch's `[rankN]:` prefixes. A real git repository, the real binary. The same on two real GPUs
//! with torchrun is in tests/gpu.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::histories::history_of_modes;
use crate::common::repo_builder::{put, Files};
use cudabisect::classify::FaultClass;
use cudabisect::report::record::{ProbeRecord, Report, Verdict};
use git2::Oid;

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

fn start(repo: &Repo) -> (i32, String, Report) {
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
        crate::common::first_bad(&report),
        Some(repo.commits[8].to_string()),
        "{text}"
    );
    let probes = &report.probes;
    let bad = probes
        .iter()
        .find(|p| p.commit == repo.commits[8].to_string())
        .unwrap();
    // The kernel fault on rank 1, not the NCCL error rank 0 printed first, and not the launcher's frame.
    assert_eq!(bad.signature.class, FaultClass::IllegalAddress, "{bad:#?}");
    assert_eq!(bad.signature.rank, Some(1), "{bad:#?}");
    assert_eq!(
        bad.signature.site.as_deref(),
        Some("train.py:40"),
        "{bad:#?}"
    );
    // Each rank's own lines are written beside the run's log.
    let log = bad.log.as_deref().unwrap();
    let rank1 = std::fs::read_to_string(log.replace(".log", ".rank1.log")).unwrap();
    assert!(
        rank1.starts_with("Traceback") && rank1.contains("illegal memory access"),
        "{rank1}"
    );
    // The rank's own files from the launcher's log directory are collected under it too.
    assert!(rank1.contains("step 7: loss 2.31"), "{rank1}");
    let hangs: Vec<&ProbeRecord> = probes
        .iter()
        .filter(|p| p.signature.class == FaultClass::Hang)
        .collect();
    assert!(
        !hangs.is_empty(),
        "the search never met the hang stretch: {text}"
    );
    for hang in &hangs {
        assert_eq!(hang.verdict, Verdict::Skip, "{hang:#?}");
        let detail = hang.signature.detail.as_deref().unwrap_or_default();
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

/// Two real PyTorch ranks started as the tutorials start them (`torch.multiprocessing.spawn`, the
/// rendezvous from `MASTER_ADDR`/`MASTER_PORT`, 29500 unless the environment says otherwise), meeting
/// over gloo on the CPU; from `bad` commits on, rank 1 raises the CUDA error a faulting kernel gives.
const GLOO_RANKS: &str = r#"import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank):
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2)
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    if open("mode.txt").read().strip() == "bad" and rank == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    dist.barrier()
    dist.destroy_process_group()
    print("ok", float(t.sum()))


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    mp.spawn(main, nprocs=2)
"#;

#[test]
fn several_workers_run_real_distributed_repros_at_once_each_on_a_rendezvous_port_of_its_own() {
    crate::common::require_python("import torch.distributed", "torch");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let config = "[repro]\ncommand = [\"python3\", \"ranks.py\"]\ntimeout = \"60s\"\n\n[triage]\nenabled = false\n";
    let mut fixed = Files::new();
    put(&mut fixed, "ranks.py", GLOO_RANKS, false);
    let modes: Vec<&str> = (0..8)
        .map(|i| if i >= 5 { "bad" } else { "good" })
        .collect();
    let commits = history_of_modes(&path, &modes, &fixed, config).unwrap();
    let report = tmp.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{}..main", commits[0]), "--no-shrink"])
        .args(["--jobs", "3", "-C"])
        .arg(&path)
        .arg("--report")
        .arg(&report)
        .env_remove("MASTER_PORT")
        .env_remove("PET_MASTER_PORT")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let report: cudabisect::report::record::Report =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(
        report.first_bad.as_ref().map(|c| c.commit.clone()),
        Some(commits[5].to_string()),
        "{text}"
    );
    // The workers' runs overlapped (the first round holds the bad end, the good end and a cut), and
    // none of them failed to meet its ranks.
    assert!(report.probes.len() >= 3, "{text}");
    for p in &report.probes {
        let log = p
            .log
            .as_ref()
            .and_then(|l| std::fs::read_to_string(l).ok())
            .unwrap_or_default();
        assert!(
            !log.contains("address already in use") && !log.contains("EADDRINUSE"),
            "{}: {log}",
            p.commit
        );
    }
}
