//! The Slurm edge: each probe gets an allocation (a batch job that holds its node and GPUs, submitted with
//! `sbatch` when the probe's first command needs it and watched with `scontrol` while it queues), and its
//! build and repro run in it as job steps (`srun --jobid … --overlap`), so they share one node and its
//! GPUs. A step runs under the local process runner (its output streams back, bounded, and its timeout
//! counts from the step's start: queue time never counts). The allocation is cancelled (`scancel`) when
//! the probe ends, on Ctrl-C, after a timed-out step, and on any early return. Node failure, preemption,
//! Slurm's own kills (memory, its time limit) and a job stuck in the queue come back as infrastructure
//! lines the classifier reads, never as good or bad.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::classify::Exit;
use crate::config::{CommandLine, Config, SlurmSettings};
use crate::exec::executor::{Executor, Session};
use crate::exec::process::{CommandSpec, HostEnd, JobInfo, ProcessError, RunOutput};

/// How often a job's state is asked for.
const POLL: Duration = Duration::from_millis(250);
/// Slurm's time limit beyond a probe's own timeouts, when `[executor] time` is not set.
const TIME_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Slurm states that say the machine, not the code, ended the job.
const INFRA_STATES: &[&str] = &[
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "TIMEOUT",
    "REVOKED",
];

/// Pending reasons that mean the job cannot start as things stand (not merely waiting its turn).
const STUCK_REASONS: &[&str] = &[
    "ReqNodeNotAvail",
    // ReqNodeNotAvail as `scontrol show job` spells it.
    "Nodes_required_for_job_are_DOWN",
    "NodeDown",
    "PartitionDown",
    "PartitionInactive",
    "PartitionNodeLimit",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
];

/// Builds and repros as steps of a Slurm allocation per probe.
#[derive(Clone)]
pub struct Slurm {
    settings: SlurmSettings,
    gpus_per_probe: u32,
    /// Slurm's time limit for an allocation when `[executor] time` is not set: a probe's build and
    /// repro runs, with retries, plus a margin.
    default_limit: Duration,
    spool: PathBuf,
}

impl Slurm {
    /// An executor with `settings` for `config`'s probes; the allocation's output file goes to
    /// `[executor] workdir`/jobs, else to `spool`.
    pub fn new(settings: &SlurmSettings, config: &Config, spool: &Path) -> Self {
        let settings = settings.clone();
        let spool = config
            .executor
            .workdir
            .as_ref()
            .map_or_else(|| spool.to_path_buf(), |w| w.join("jobs"));
        let runs = config.repro.attempts.max(1) + config.repro.infra_retries;
        let build = config.build.as_ref().map_or(Duration::ZERO, |b| b.timeout);
        Self {
            default_limit: build + config.repro.timeout * runs + TIME_MARGIN,
            gpus_per_probe: config.workers.gpus_per_probe,
            settings,
            spool,
        }
    }

    /// The `sbatch` arguments of a probe's allocation (without what it runs).
    pub fn sbatch_args(&self, output: &Path) -> Vec<String> {
        let mut args = vec![
            "--parsable".to_string(),
            "--job-name=cudabisect-probe".to_string(),
            // A node failure ends the allocation (NODE_FAIL, which cudabisect reruns as infrastructure)
            // rather than silently requeueing it under a step that died with it.
            "--no-requeue".to_string(),
            format!("--output={}", output.display()),
        ];
        if let Some(p) = &self.settings.partition {
            args.push(format!("--partition={p}"));
        }
        if let Some(a) = &self.settings.account {
            args.push(format!("--account={a}"));
        }
        // One GPU per GPU the probe needs, unless the config says what to ask for.
        let gres = match &self.settings.gres {
            Some(g) => Some(g.clone()).filter(|g| !g.is_empty()),
            None => Some(format!("gpu:{}", self.gpus_per_probe)),
        };
        if let Some(g) = gres {
            args.push(format!("--gres={g}"));
        }
        let limit = self.settings.time.unwrap_or(self.default_limit);
        args.push(format!("--time={}", limit.as_secs().div_ceil(60).max(1)));
        args.extend(self.settings.sbatch_args.iter().cloned());
        args
    }

    /// Submits an allocation and waits until it runs: its id, node and queue time, or why it never ran
    /// (stuck, cancelled, refused).
    fn allocate(&self, cancel: &AtomicBool) -> Result<Allocation, Unallocated> {
        let submitted_at = Instant::now();
        let id = self.submit()?;
        // From here on, any way out of this function that does not hand the allocation over cancels it.
        let mut held = Allocation {
            id,
            node: None,
            queue_s: 0.0,
        };
        loop {
            let info = scontrol_job(&held.id).unwrap_or_default();
            let state = info.get("JobState").map(String::as_str).unwrap_or("");
            let reason = info.get("Reason").map(String::as_str).unwrap_or("");
            if state == "RUNNING" {
                held.node = info
                    .get("NodeList")
                    .cloned()
                    .filter(|n| n != "(null)" && !n.is_empty());
                held.queue_s = submitted_at.elapsed().as_secs_f64();
                return Ok(held);
            }
            if is_terminal(state) {
                return Err(Unallocated::Infra(HostEnd {
                    scheduler: "slurm".into(),
                    job: held.id.clone(),
                    node: None,
                    state: format!("ENDED before it started ({state}, {reason})"),
                    reason: None,
                }));
            }
            if cancel.load(Ordering::SeqCst) {
                return Err(Unallocated::Interrupted);
            }
            if state == "PENDING"
                && STUCK_REASONS.iter().any(|r| reason.starts_with(r))
                && submitted_at.elapsed() >= self.settings.stuck_timeout
            {
                return Err(Unallocated::Infra(HostEnd {
                    scheduler: "slurm".into(),
                    job: held.id.clone(),
                    node: None,
                    state: format!(
                        "STUCK in the queue for {:.0} s",
                        submitted_at.elapsed().as_secs_f64()
                    ),
                    reason: Some(reason.to_string()),
                }));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Submits the placeholder job that holds the allocation; its id.
    fn submit(&self) -> Result<String, Unallocated> {
        let refused = |message: String| {
            Unallocated::Refused(ProcessError::Scheduler {
                scheduler: "slurm",
                message,
            })
        };
        std::fs::create_dir_all(&self.spool)
            .map_err(|e| refused(format!("cannot create {}: {e}", self.spool.display())))?;
        let out = Command::new("sbatch")
            .args(self.sbatch_args(&self.spool.join("allocation-%j.out")))
            .args(["--wrap", "exec sleep 2147483647"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| refused(format!("cannot run sbatch: {e}")))?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            return Err(refused(format!("sbatch refused the job: {}", said.trim())));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id = stdout
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        if id.is_empty() {
            return Err(refused(format!(
                "sbatch printed no job id: {}",
                stdout.trim()
            )));
        }
        Ok(id)
    }
}

/// A running allocation; cancelled when dropped.
struct Allocation {
    id: String,
    node: Option<String>,
    queue_s: f64,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        scancel(&self.id);
        // Wait (bounded) until the queue no longer lists it, even as completing: when cudabisect is
        // done, `squeue` shows none of its jobs.
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until && in_queue(&self.id) {
            std::thread::sleep(POLL);
        }
    }
}

/// True while `squeue` still lists the job (pending, running or completing).
fn in_queue(id: &str) -> bool {
    Command::new("squeue")
        .args(["-h", "-j", id, "-o", "%T"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && !String::from_utf8_lossy(&o.stdout).trim().is_empty())
}

/// Why a probe got no allocation.
enum Unallocated {
    /// The machine's fault.
    Infra(HostEnd),
    /// Ctrl-C or an abandoned probe while it queued.
    Interrupted,
    /// `sbatch` refused or could not be run.
    Refused(ProcessError),
}

/// One probe's allocation, made when its first command runs, and made again after a step that ended it
/// (a timeout, a node failure).
pub struct SlurmSession {
    slurm: Slurm,
    allocation: Option<Allocation>,
}

impl Executor for Slurm {
    fn session(&self) -> Box<dyn Session> {
        Box::new(SlurmSession {
            slurm: self.clone(),
            allocation: None,
        })
    }

    fn is_local(&self) -> bool {
        false
    }

    fn preflight(&self) -> Result<(), String> {
        preflight(self)
    }
}

/// A run that never started, with what to say about it.
fn not_run(ended_by: Option<HostEnd>, interrupted: bool) -> RunOutput {
    RunOutput {
        exit: if interrupted {
            Exit::Signal(libc::SIGTERM)
        } else {
            Exit::Unknown
        },
        duration: Duration::ZERO,
        total_bytes: 0,
        output: String::new(),
        interrupted,
        lingering: Vec::new(),
        job: None,
        ended_by,
    }
}

impl Session for SlurmSession {
    fn run(&mut self, spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError> {
        if self.allocation.is_none() {
            match self.slurm.allocate(cancel) {
                Ok(a) => self.allocation = Some(a),
                Err(Unallocated::Refused(e)) => return Err(e),
                Err(Unallocated::Interrupted) => return Ok(not_run(None, true)),
                Err(Unallocated::Infra(end)) => return Ok(not_run(Some(end), false)),
            }
        }
        let Some(alloc) = self.allocation.as_ref() else {
            return Ok(not_run(None, false));
        };
        // The step: this process's srun client, in its own group under the local runner, so the timeout
        // and Ctrl-C end it as they end a local command; its environment is the spec's (srun passes it on).
        let (prog, args) = spec.command.argv();
        let mut argv = vec![
            "srun".to_string(),
            format!("--jobid={}", alloc.id),
            "--overlap".into(),
            "--ntasks=1".into(),
            "--quiet".into(),
            format!("--chdir={}", spec.cwd.display()),
            "--".into(),
            prog,
        ];
        argv.extend(args);
        let step = CommandSpec {
            command: CommandLine::Argv(argv),
            cwd: spec.cwd.clone(),
            env: spec.env.clone(),
            timeout: spec.timeout,
            grace: spec.grace,
            // The step's processes are on the node, out of reach of a local stack dump.
            stack_dump: None,
        };
        let mut run = crate::exec::process::run(&step, cancel)?;
        // How the allocation stands after the step: still running, or ended by Slurm under it.
        let info = scontrol_job(&alloc.id).unwrap_or_default();
        let state = info.get("JobState").cloned().unwrap_or_default();
        let reason = info
            .get("Reason")
            .cloned()
            .filter(|r| r != "None" && !r.is_empty());
        // Anything but still running, when cudabisect did not end the step itself, means Slurm took the
        // allocation away under it: the step's result says nothing about the commit.
        let ended_by_slurm = state != "RUNNING";
        if ended_by_slurm && !run.interrupted && run.exit != Exit::Timeout {
            let what = if INFRA_STATES.contains(&state.as_str()) {
                state.clone()
            } else {
                format!("LOST ({})", if state.is_empty() { "gone" } else { &state })
            };
            run.ended_by = Some(HostEnd {
                scheduler: "slurm".into(),
                job: alloc.id.clone(),
                node: alloc.node.clone(),
                state: what,
                reason: reason.clone(),
            });
        }
        run.job = Some(JobInfo {
            scheduler: "slurm".into(),
            id: alloc.id.clone(),
            node: alloc.node.clone(),
            state: if state.is_empty() {
                "UNKNOWN".into()
            } else {
                state.clone()
            },
            reason,
            queue_s: alloc.queue_s,
            run_s: run.duration.as_secs_f64(),
        });
        // A step that timed out or was interrupted may leave tasks behind on the node, and an allocation
        // Slurm ended is gone: either way the next command gets a fresh allocation.
        if run.exit == Exit::Timeout || run.interrupted || state != "RUNNING" {
            self.allocation = None;
        }
        Ok(run)
    }
}

/// Checks before a run that Slurm can be reached and would take a probe's allocation with these
/// settings (`sbatch --test-only`), so a wrong partition or account is one line of bad input, not a skipped
/// probe per commit.
fn preflight(slurm: &Slurm) -> Result<(), String> {
    let mut args = slurm.sbatch_args(&std::env::temp_dir().join("cudabisect-test-only.out"));
    args.retain(|a| a != "--parsable");
    let out = Command::new("sbatch")
        .arg("--test-only")
        .args(args)
        .args(["--wrap", "true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("[executor] kind = \"slurm\", but sbatch cannot be run: {e}"))?;
    let said = String::from_utf8_lossy(&out.stderr);
    // Only what no waiting can fix is refused here (an unknown partition, account, QOS, GRES); nodes that
    // are busy, drained or down now are the queue's business.
    if out.status.success() || !said.to_lowercase().contains("invalid") {
        Ok(())
    } else {
        let line = said
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string();
        Err(format!(
            "[executor]: Slurm would not take a probe job: {line}"
        ))
    }
}

/// `scontrol show job -o` output as key=value pairs (values may not hold spaces, except the last fields,
/// which are not read).
pub fn parse_job(text: &str) -> BTreeMap<String, String> {
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn scontrol_job(id: &str) -> Option<BTreeMap<String, String>> {
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", id])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| parse_job(&String::from_utf8_lossy(&out.stdout)))
}

fn scancel(id: &str) {
    let _ = Command::new("scancel")
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn is_terminal(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "RESIZING"
    ) && !state.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ExecutorKind;

    fn config(extra: &str) -> Config {
        let text = format!(
            "[build]\ncommand = \"make\"\ntimeout = \"10m\"\n\n[repro]\ncommand = \"./r\"\ntimeout = \"5m\"\ninfra-retries = 1\n\n[search]\ngpus-per-probe = 2\n\n[executor]\nkind = \"slurm\"\n{extra}"
        );
        Config::parse(Path::new("bisect.toml"), &text).unwrap()
    }

    fn slurm_with(extra: &str) -> Slurm {
        let config = config(extra);
        let ExecutorKind::Slurm(settings) = &config.executor.kind else {
            panic!("a Slurm config");
        };
        Slurm::new(settings, &config, Path::new("/tmp"))
    }

    #[test]
    fn an_allocation_asks_for_partition_account_gres_and_a_limit_covering_the_probe() {
        let slurm =
            slurm_with("partition = \"gpu\"\naccount = \"ml\"\nsbatch-args = [\"--qos=high\"]\n");
        let args = slurm.sbatch_args(Path::new("/tmp/o.out"));
        // 10 m build + 2 × 5 m repro runs (one retry) + 5 m margin.
        for want in [
            "--parsable",
            "--partition=gpu",
            "--account=ml",
            "--gres=gpu:2",
            "--time=25",
            "--qos=high",
            "--output=/tmp/o.out",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        let none = slurm_with("gres = \"\"\ntime = \"2h\"\n");
        let args = none.sbatch_args(Path::new("/tmp/o.out"));
        assert!(!args.iter().any(|a| a.starts_with("--gres")), "{args:?}");
        assert!(args.iter().any(|a| a == "--time=120"), "{args:?}");
    }

    #[test]
    fn scontrol_records_are_read_and_states_sorted() {
        let j = parse_job("JobId=12 JobName=x JobState=PENDING Reason=Nodes_required_for_job_are_DOWN,_DRAINED Dependency=(null) NodeList=(null)");
        assert_eq!(j["JobState"], "PENDING");
        assert!(STUCK_REASONS.iter().any(|r| j["Reason"].starts_with(r)));
        assert!(is_terminal("NODE_FAIL") && !is_terminal("PENDING") && !is_terminal(""));
    }
}
