//! End-to-end tests against a real Slurm (slurmctld and slurmd on this machine, started by
//! `ci/slurm-up.sh`: one node, a `debug` partition, four count-only GPUs): bisections whose builds and
//! repros run as Slurm jobs, serial and parallel, a probe timeout that queue time does not eat into, a job
//! Slurm kills for its memory (infrastructure, retried), a drained node, and Ctrl-C leaving no job behind.
//! They are ignored unless asked for, as the GPU tests are (a skipped test never counts as passed):
//! `cargo test --release --test integration -- --ignored slurm::` runs them, and fails without a node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::common::histories::history_of_modes;
use crate::common::repo_builder::{put, Files};
use cudabisect::classify::FaultClass;
use cudabisect::report::environment::Environment;
use cudabisect::report::record::{Report, Verdict};
use git2::Oid;

/// The cluster is one node: tests that drain it or fill its queue must not overlap.
static CLUSTER: Mutex<()> = Mutex::new(());

/// Fails unless a Slurm node is up: these tests run only when asked for, and then must not pass vacuously.
fn require_slurm() {
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%t"])
        .output()
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout).to_string();
            s.contains("idle") || s.contains("mix") || s.contains("alloc")
        })
        .unwrap_or(false);
    assert!(up, "no Slurm node is up here (run ci/slurm-up.sh)");
}

/// Each commit's mode: `clean`, `fault`, `hang`, `oom-once` (the first run blows its memory limit, the
/// next is clean), `oom-once-fault`. Every run logs its Slurm job, attempt, devices and times.
const REPRO: &str = include_str!("fakes/slurm_repro.sh");

struct Repo {
    _tmp: tempfile::TempDir,
    path: PathBuf,
    log: PathBuf,
    commits: Vec<Oid>,
}

fn repo(modes: &[&str], extra: &str) -> Repo {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let log = tmp.path().join("runs.log");
    let config = format!(
        "[build]\ncommand = [\"sh\", \"-c\", \"echo built\"]\ntimeout = \"1m\"\n\n[repro]\ncommand = [\"./repro.sh\"]\ntimeout = \"20s\"\ngrace-period = \"1s\"\ninfra-retries = 1\nenv = {{ RUN_LOG = \"{}\" }}\n\n[triage]\nenabled = false\n\n[executor]\nkind = \"slurm\"\npartition = \"debug\"\nsbatch-args = [\"--mem=200M\"]\n{extra}",
        log.display()
    );
    let mut fixed = Files::new();
    put(&mut fixed, "repro.sh", REPRO, true);
    let commits = history_of_modes(&path, modes, &fixed, &config).unwrap();
    Repo {
        _tmp: tmp,
        path,
        log,
        commits,
    }
}

fn start_cmd(repo: &Repo, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cudabisect"));
    cmd.args([
        "start",
        &format!("{}..main", repo.commits[0]),
        "--no-shrink",
    ])
    .args(extra)
    .arg("-C")
    .arg(&repo.path)
    .arg("--report")
    .arg(repo.path.parent().unwrap().join("report.json"));
    cmd
}

fn report(repo: &Repo) -> Report {
    let text = std::fs::read_to_string(repo.path.parent().unwrap().join("report.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// cudabisect's jobs still in the queue.
fn our_jobs() -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%i %j %T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("cudabisect-"))
        .map(String::from)
        .collect()
}

fn node() -> String {
    let out = Command::new("sinfo")
        .args(["-h", "-N", "-o", "%N"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_string()
}

/// A running `cudabisect start`, interrupted (so it cancels its jobs) if the test fails before it ends.
struct Running(Option<std::process::Child>);

impl Running {
    fn spawn(mut cmd: Command) -> Self {
        Running(Some(
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        ))
    }

    fn id(&self) -> i32 {
        self.0.as_ref().map_or(0, |c| c.id() as i32)
    }

    fn wait(mut self) -> std::process::Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: signals our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let _ = child.wait();
        }
    }
}

/// Resumes the node when dropped, so a failed test never leaves it drained for the next.
struct Resume(String);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("scontrol")
            .args(["update", &format!("nodename={}", self.0), "state=resume"])
            .status();
    }
}

fn run_ok(repo: &Repo, extra: &[&str]) -> (Report, String) {
    let out = start_cmd(repo, extra).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    (report(repo), text)
}

fn first_bad(report: &Report) -> &str {
    &report.first_bad.as_ref().unwrap().commit
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn a_serial_bisection_runs_every_probe_as_a_slurm_job_and_retries_a_job_killed_for_memory() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    // Commit 4 is where the search looks first after the endpoints.
    let modes = [
        "clean", "clean", "clean", "clean", "oom-once", "fault", "fault", "fault", "fault",
    ];
    let repo = repo(&modes, "");
    let (report, text) = run_ok(&repo, &[]);
    assert_eq!(first_bad(&report), repo.commits[5].to_string(), "{text}");
    let probes = &report.probes;
    for p in probes {
        let job = p
            .job
            .as_ref()
            .unwrap_or_else(|| panic!("not a job: {p:#?}"));
        assert_eq!(job.scheduler, "slurm", "{p:#?}");
        assert!(!job.id.is_empty(), "{p:#?}");
        assert!(job.node.is_some(), "{p:#?}");
    }
    // Slurm killed the first run of commit 4 for its memory: infrastructure, run again, then judged.
    let oom = probes
        .iter()
        .find(|p| p.commit == repo.commits[4].to_string())
        .unwrap_or_else(|| panic!("commit 4 never probed: {text}"));
    assert_eq!(oom.attempts, 2, "{oom:#?}");
    assert_eq!(oom.verdict, Verdict::Good, "{oom:#?}");
    // The child environment is the local one, and Slurm gave each repro its GPU.
    let runs = std::fs::read_to_string(&repo.log).unwrap();
    assert!(
        runs.lines()
            .all(|l| l.starts_with("end=") || l.contains("blocking=1")),
        "{runs}"
    );
    assert!(runs.contains("devices=0"), "{runs}");
    assert!(text.contains("[slurm job "), "{text}");
    // The bundle's environment was asked as steps of an allocation, and names the node.
    let bundle = report
        .bundle
        .as_deref()
        .unwrap_or_else(|| panic!("no bundle: {text}"));
    let env: Environment = serde_json::from_str(
        &std::fs::read_to_string(Path::new(bundle).join("environment.json")).unwrap(),
    )
    .unwrap();
    assert!(env.elsewhere, "{env:#?}");
    assert!(
        env.host.as_deref().is_some_and(|h| !h.is_empty()),
        "{env:#?}"
    );
    assert!(our_jobs().is_empty(), "jobs left: {:?}", our_jobs());
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn parallel_probes_are_concurrent_jobs() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let mut modes = vec!["clean"; 10];
    modes.extend(["fault"; 6]);
    let repo = repo(&modes, "");
    std::fs::write(
        repo.path.join("bisect.toml"),
        std::fs::read_to_string(repo.path.join("bisect.toml"))
            .unwrap()
            .replace("env = {", "env = { SLEEP = \"2\", "),
    )
    .unwrap();
    let (report, text) = run_ok(&repo, &["--jobs", "2"]);
    assert_eq!(first_bad(&report), repo.commits[10].to_string(), "{text}");
    // Two clean runs overlapped in time: two jobs ran at once.
    let runs = std::fs::read_to_string(&repo.log).unwrap();
    let mut spans = Vec::new();
    let mut start = None;
    for line in runs.lines() {
        if let Some(s) = line.split("start=").nth(1) {
            start = s.trim().parse::<f64>().ok();
        } else if let (Some(e), Some(s)) = (line.strip_prefix("end="), start) {
            spans.push((s, e.trim().parse::<f64>().unwrap()));
        }
    }
    let overlap = spans
        .iter()
        .enumerate()
        .any(|(i, a)| spans.iter().skip(i + 1).any(|b| a.0 < b.1 && b.0 < a.1));
    assert!(overlap, "no two jobs ran at once: {runs}");
    assert!(our_jobs().is_empty(), "jobs left: {:?}", our_jobs());
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn queue_time_does_not_count_toward_the_repro_timeout_and_a_hang_is_cancelled() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let repo = repo(&["clean", "clean", "hang", "clean", "fault"], "");
    // A 3 s timeout, and a blocker job holding every GPU for longer than that while the first probe
    // queues behind it.
    let toml = repo.path.join("bisect.toml");
    std::fs::write(
        &toml,
        std::fs::read_to_string(&toml)
            .unwrap()
            .replace("timeout = \"20s\"", "timeout = \"3s\""),
    )
    .unwrap();
    let release = repo.path.parent().unwrap().join("release");
    let blocker = Command::new("sbatch")
        .args([
            "--parsable",
            "--gres=gpu:4",
            "--job-name=blocker",
            "--mem=10M",
            "--output=/dev/null",
        ])
        .arg("--wrap")
        .arg(format!(
            "while [ ! -e {} ]; do sleep 0.1; done",
            release.display()
        ))
        .output()
        .unwrap();
    let blocker_id = String::from_utf8_lossy(&blocker.stdout).trim().to_string();
    let child = Running::spawn(start_cmd(&repo, &[]));
    // Release the blocker once a probe job has queued behind it for longer than the repro's timeout.
    let queued_since = std::time::Instant::now();
    crate::common::poll_until(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(120),
        "no probe ever queued",
        || {
            queued_since.elapsed() > std::time::Duration::from_secs(5)
                && our_jobs().iter().any(|j| j.ends_with("PENDING"))
        },
    );
    std::fs::write(&release, "").unwrap();
    let out = child.wait();
    let _ = Command::new("scancel").arg(&blocker_id).status();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    let report = report(&repo);
    assert_eq!(first_bad(&report), repo.commits[4].to_string(), "{text}");
    let probes = &report.probes;
    let queued = probes
        .iter()
        .find(|p| p.job.as_ref().is_some_and(|j| j.queue_s > 3.0))
        .unwrap_or_else(|| panic!("no probe queued past the timeout: {text}"));
    assert_ne!(queued.signature.class, FaultClass::Hang, "{queued:#?}");
    let hang = probes
        .iter()
        .find(|p| p.commit == repo.commits[2].to_string())
        .unwrap_or_else(|| panic!("the hanging commit was never probed: {text}"));
    assert_eq!(hang.signature.class, FaultClass::Hang, "{hang:#?}");
    assert_eq!(hang.verdict, Verdict::Skip, "{hang:#?}");
    assert!(our_jobs().is_empty(), "jobs left: {:?}", our_jobs());
}

/// Puts the node in `state` while a probe's allocation runs on it, waits until a probe's log shows
/// `seen`, brings the node back, and checks that the run went on to the right culprit with nothing
/// blamed or skipped for the machine's trouble.
fn node_trouble_mid_run(state: &str, seen: &str) {
    let repo = repo(
        &["clean", "clean", "clean", "fault", "fault"],
        "stuck-timeout = \"1s\"\n",
    );
    let toml = repo.path.join("bisect.toml");
    std::fs::write(
        &toml,
        std::fs::read_to_string(&toml)
            .unwrap()
            .replace("infra-retries = 1", "infra-retries = 8")
            .replace("env = {", "env = { SLEEP = \"2\", "),
    )
    .unwrap();
    let node = node();
    let child = Running::spawn(start_cmd(&repo, &[]));
    crate::common::poll_until(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(120),
        "no probe job ever ran",
        || our_jobs().iter().any(|j| j.ends_with("RUNNING")),
    );
    let resume = Resume(node.clone());
    Command::new("scontrol")
        .args([
            "update",
            &format!("nodename={node}"),
            &format!("state={state}"),
            "reason=cudabisect-test",
        ])
        .status()
        .unwrap();
    let logs = repo.path.join(".git/cudabisect/runs");
    crate::common::poll_until(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(120),
        &format!("no log ever said {seen}"),
        || log_says(&logs, seen),
    );
    drop(resume);
    let out = child.wait();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    let report = report(&repo);
    assert_eq!(first_bad(&report), repo.commits[3].to_string(), "{text}");
    for p in &report.probes {
        assert_ne!(p.verdict, Verdict::Skip, "{p:#?}");
    }
    assert!(our_jobs().is_empty(), "jobs left: {:?}", our_jobs());
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn a_node_drained_mid_run_makes_the_waiting_probe_infrastructure_and_the_run_goes_on() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    // The running allocation finishes; the next cannot start, and is given up as infrastructure.
    node_trouble_mid_run("drain", "STUCK in the queue");
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn a_node_failing_under_a_probe_is_infrastructure_and_the_probe_is_run_again() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    // The node goes down under a running step: Slurm ends the allocation NODE_FAIL.
    node_trouble_mid_run("down", "NODE_FAIL");
}

/// True once some log under `dir` (the run directories) holds `text`.
fn log_says(dir: &Path, text: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            log_says(&p, text)
        } else {
            p.extension().is_some_and(|x| x == "log")
                && std::fs::read_to_string(&p).is_ok_and(|t| t.contains(text))
        }
    })
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn ctrl_c_cancels_every_job_it_submitted() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let repo = repo(&["clean", "hang"], "");
    let child = Running::spawn(start_cmd(&repo, &[]));
    // The bad end's repro hangs: interrupt once its job runs.
    crate::common::poll_until(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(120),
        "the job never ran",
        || our_jobs().iter().any(|j| j.ends_with("RUNNING")),
    );
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id(), libc::SIGINT) };
    let out = child.wait();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(our_jobs().is_empty(), "jobs left: {:?}", our_jobs());
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn a_partition_slurm_does_not_have_is_one_line_of_bad_input() {
    require_slurm();
    let repo = repo(&["clean", "fault"], "");
    let toml = repo.path.join("bisect.toml");
    std::fs::write(
        &toml,
        std::fs::read_to_string(&toml)
            .unwrap()
            .replace("partition = \"debug\"", "partition = \"nosuch\""),
    )
    .unwrap();
    // Every job that runs user code asks the same before it writes anything: `shrink --at` too.
    let mut shrink_at = Command::new(env!("CARGO_BIN_EXE_cudabisect"));
    shrink_at
        .args(["shrink", "--at", "main", "-C"])
        .arg(&repo.path);
    for (name, mut cmd) in [("start", start_cmd(&repo, &[])), ("shrink --at", shrink_at)] {
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.contains("Slurm would not take a probe job"),
            "{name}: {stderr}"
        );
        // The refusal names what Slurm refused.
        assert!(name != "start" || stderr.contains("artition"), "{stderr}");
        assert!(!repo.path.join(".git/cudabisect/runs").exists(), "{name}");
    }
}

#[test]
#[ignore = "needs a Slurm cluster: ci/slurm-up.sh, then --ignored slurm::"]
fn a_shared_workdir_holds_the_worktrees_and_the_allocations_files() {
    require_slurm();
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let shared = tempfile::tempdir().unwrap();
    let repo = repo(
        &["clean", "fault"],
        &format!("workdir = \"{}\"\n", shared.path().display()),
    );
    let (report, text) = run_ok(&repo, &["--keep-worktree"]);
    assert_eq!(first_bad(&report), repo.commits[1].to_string(), "{text}");
    let dirs: Vec<PathBuf> = std::fs::read_dir(shared.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    // One directory for this repository (named after it), holding its worktree; the allocations'
    // output files beside it.
    let own = dirs
        .iter()
        .find(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("repo-"))
        })
        .unwrap_or_else(|| panic!("no directory for the repository in {dirs:?}"));
    assert!(own.join("worktree/mode.txt").is_file(), "{own:?}");
    assert!(
        std::fs::read_dir(shared.path().join("jobs"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("allocation-")),
        "no allocation output under the shared jobs directory"
    );
    assert!(!repo.path.join(".git/cudabisect/worktree").exists());
}
