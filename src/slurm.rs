//! The Slurm edge: a probe's build or repro as a Slurm batch job. The job script carries the child
//! environment contract and the working directory; cudabisect watches the job with `scontrol`, counts the
//! repro's timeout from the moment the job starts (queue time never counts), cancels it with `scancel` on
//! a timeout, Ctrl-C or any early return, and reads its output file as a local run's output. Node failure,
//! preemption and Slurm's own kills (memory, its time limit) come back as infrastructure lines the
//! classifier reads, never as good or bad.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::classify::Exit;
use crate::config::ExecutorSection;
use crate::executor::Executor;
use crate::process::{bounded_file, CommandSpec, ProcessError, RunOutput, RUN_TAG};
use crate::report::record::JobInfo;

/// How often a job's state is asked for.
const POLL: Duration = Duration::from_millis(250);
/// How long to wait for a cancelled job to end before giving up on it.
const CANCEL_WAIT: Duration = Duration::from_secs(60);
/// Slurm's time limit beyond the command's own timeout, when `[executor] time` is not set.
const TIME_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The line cudabisect appends to a job's output when Slurm, not the command, ended it: the classifier
/// reads it as an infrastructure failure (see `classify::patterns`).
pub const INFRA_LINE: &str = "[cudabisect] slurm job";

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

/// Builds and repros as Slurm batch jobs.
pub struct Slurm {
    settings: ExecutorSection,
    gpus_per_probe: u32,
    spool: PathBuf,
}

impl Slurm {
    /// An executor with these settings; job files go to `[executor] workdir`/jobs, else to `spool`.
    pub fn new(settings: ExecutorSection, gpus_per_probe: u32, spool: &Path) -> Self {
        let spool = settings
            .workdir
            .as_ref()
            .map_or_else(|| spool.to_path_buf(), |w| w.join("jobs"));
        Self {
            settings,
            gpus_per_probe,
            spool,
        }
    }

    /// The `sbatch` arguments for `spec` (without the script).
    pub fn sbatch_args(&self, spec: &CommandSpec, output: &Path) -> Vec<String> {
        let phase = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "CUDABISECT_PHASE")
            .map_or("repro", |(_, v)| v.as_str());
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name=cudabisect-{phase}"),
            format!("--output={}", output.display()),
            format!("--chdir={}", spec.cwd.display()),
        ];
        if let Some(p) = &self.settings.partition {
            args.push(format!("--partition={p}"));
        }
        if let Some(a) = &self.settings.account {
            args.push(format!("--account={a}"));
        }
        // A build needs no GPU; the repro (and triage) get the configured GRES, by default one GPU per
        // GPU the probe needs.
        let gres = match &self.settings.gres {
            Some(g) => Some(g.clone()).filter(|g| !g.is_empty()),
            None => Some(format!("gpu:{}", self.gpus_per_probe)),
        };
        if let Some(g) = gres.filter(|_| phase != "build") {
            args.push(format!("--gres={g}"));
        }
        let limit = self.settings.time.unwrap_or(spec.timeout + TIME_MARGIN);
        args.push(format!("--time={}", limit.as_secs().div_ceil(60).max(1)));
        args.extend(self.settings.sbatch_args.iter().cloned());
        args
    }
}

/// Checks before a run that Slurm can be reached and would take a job with these settings
/// (`sbatch --test-only`), so a wrong partition or account is one line of bad input, not a skipped probe per
/// commit.
pub fn preflight(settings: &ExecutorSection, gpus_per_probe: u32) -> Result<(), String> {
    let slurm = Slurm::new(settings.clone(), gpus_per_probe, &std::env::temp_dir());
    let spec = CommandSpec {
        command: crate::config::CommandLine::Argv(vec!["true".into()]),
        cwd: std::env::temp_dir(),
        env: Vec::new(),
        timeout: Duration::from_secs(60),
        grace: Duration::from_secs(1),
        stack_dump: None,
    };
    let mut args = slurm.sbatch_args(
        &spec,
        &std::env::temp_dir().join("cudabisect-test-only.out"),
    );
    args.retain(|a| a != "--parsable");
    let out = Command::new("sbatch")
        .arg("--test-only")
        .args(args)
        .args(["--wrap", "true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("[executor] kind = \"slurm\", but sbatch cannot be run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&out.stderr);
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

/// A shell word, single-quoted.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The job script: the child's environment, its directory, then its command.
pub fn job_script(spec: &CommandSpec, tag: &str) -> String {
    let mut script = String::from("#!/bin/sh\n# A cudabisect probe job.\n");
    for (k, v) in spec
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([(RUN_TAG, tag)])
    {
        // Names come from the config; one that is not a shell name cannot be exported and is skipped.
        if !k.is_empty()
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit())
        {
            script.push_str(&format!("export {k}={}\n", quote(v)));
        }
    }
    script.push_str(&format!(
        "cd {} || exit 125\n",
        quote(&spec.cwd.display().to_string())
    ));
    let (prog, args) = spec.command.argv();
    script.push_str("exec");
    for word in std::iter::once(prog).chain(args) {
        script.push(' ');
        script.push_str(&quote(&word));
    }
    script.push('\n');
    script
}

/// `scontrol show job -o` output as key=value pairs (values may not hold spaces, except the last fields,
/// which are not read).
pub fn parse_job(text: &str) -> BTreeMap<String, String> {
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The exit of a finished job from Slurm's `ExitCode=status:signal`.
pub fn exit_of(code: &str) -> Exit {
    let (status, signal) = code.split_once(':').unwrap_or((code, "0"));
    match (status.parse::<i32>(), signal.parse::<i32>()) {
        (_, Ok(sig)) if sig > 0 => Exit::Signal(sig),
        (Ok(status), _) => Exit::Code(status),
        _ => Exit::Unknown,
    }
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

/// Cancels its job when dropped before the job was seen to end: no early return, panic or error leaves a
/// job in the queue.
struct Submitted {
    id: String,
    ended: bool,
}

impl Drop for Submitted {
    fn drop(&mut self) {
        if !self.ended {
            scancel(&self.id);
        }
    }
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

impl Executor for Slurm {
    fn run(&self, spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError> {
        let err = |message: String| ProcessError::Scheduler {
            scheduler: "slurm",
            message,
        };
        std::fs::create_dir_all(&self.spool)
            .map_err(|e| err(format!("cannot create {}: {e}", self.spool.display())))?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let tag = format!(
            "{}.slurm.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let script_path = self.spool.join(format!("job-{tag}.sh"));
        let output = self.spool.join(format!("job-{tag}.out"));
        std::fs::File::create(&script_path)
            .and_then(|mut f| f.write_all(job_script(spec, &tag).as_bytes()))
            .map_err(|e| err(format!("cannot write {}: {e}", script_path.display())))?;
        let submitted_at = Instant::now();
        let out = Command::new("sbatch")
            .args(self.sbatch_args(spec, &output))
            .arg(&script_path)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| err(format!("cannot run sbatch: {e}")))?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr);
            return Err(err(format!("sbatch refused the job: {}", said.trim())));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id = stdout
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        if id.is_empty() {
            return Err(err(format!("sbatch printed no job id: {}", stdout.trim())));
        }
        let mut job = Submitted {
            id: id.clone(),
            ended: false,
        };
        let (mut started, mut timed_out, mut interrupted, mut stuck) = (None, false, false, None);
        let mut cancelled_at: Option<Instant> = None;
        let mut last = BTreeMap::new();
        loop {
            let info = scontrol_job(&id);
            let state = info
                .as_ref()
                .and_then(|i| i.get("JobState").cloned())
                .unwrap_or_default();
            if let Some(i) = info {
                last = i;
            } else if started.is_some() || cancelled_at.is_some() {
                // The controller no longer knows the job: it ended long enough ago to be purged.
                break;
            }
            if is_terminal(&state) {
                break;
            }
            if matches!(state.as_str(), "RUNNING" | "COMPLETING") && started.is_none() {
                started = Some(Instant::now());
            }
            if cancelled_at.is_none() {
                let reason = last.get("Reason").map(String::as_str).unwrap_or("");
                if cancel.load(Ordering::SeqCst) {
                    interrupted = true;
                } else if started.is_some_and(|s| s.elapsed() >= spec.timeout) {
                    timed_out = true;
                } else if state == "PENDING"
                    && STUCK_REASONS.iter().any(|r| reason.starts_with(r))
                    && submitted_at.elapsed() >= self.settings.stuck_timeout
                {
                    stuck = Some(reason.to_string());
                }
                if interrupted || timed_out || stuck.is_some() {
                    scancel(&id);
                    cancelled_at = Some(Instant::now());
                }
            } else if cancelled_at.is_some_and(|c| c.elapsed() >= CANCEL_WAIT) {
                break;
            }
            std::thread::sleep(POLL);
        }
        job.ended = true;
        let state = last.get("JobState").cloned().unwrap_or_default();
        let reason = last
            .get("Reason")
            .cloned()
            .filter(|r| r != "None" && !r.is_empty());
        let node = last
            .get("NodeList")
            .cloned()
            .filter(|n| n != "(null)" && !n.is_empty());
        let run_s = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let queue_s = match started {
            Some(s) => s.duration_since(submitted_at).as_secs_f64(),
            None => submitted_at.elapsed().as_secs_f64(),
        };
        let (mut text, total_bytes) = bounded_file(&output);
        let infra = match &stuck {
            Some(r) => Some(format!(
                "STUCK in the queue for {:.0} s ({r})",
                submitted_at.elapsed().as_secs_f64()
            )),
            None => INFRA_STATES
                .iter()
                .find(|s| state == **s)
                .filter(|_| !timed_out && !interrupted)
                .map(|s| match &reason {
                    Some(r) => format!("{s} ({r})"),
                    None => s.to_string(),
                }),
        };
        if let Some(what) = infra {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "{INFRA_LINE} {id} on {}: {what}\n",
                node.as_deref().unwrap_or("no node")
            ));
        }
        let exit = if timed_out {
            Exit::Timeout
        } else if interrupted {
            Exit::Signal(libc::SIGTERM)
        } else {
            last.get("ExitCode").map_or(Exit::Unknown, |c| exit_of(c))
        };
        Ok(RunOutput {
            exit,
            duration: Duration::from_secs_f64(run_s),
            output: text,
            total_bytes,
            interrupted,
            lingering: Vec::new(),
            job: Some(JobInfo {
                scheduler: "slurm".into(),
                id,
                node,
                state,
                reason,
                queue_s,
                run_s,
            }),
        })
    }

    fn is_local(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CommandLine;

    fn spec() -> CommandSpec {
        CommandSpec {
            command: CommandLine::Argv(vec!["./repro.sh".into(), "it's".into()]),
            cwd: PathBuf::from("/shared/wt 1"),
            env: vec![
                ("CUDA_LAUNCH_BLOCKING".into(), "1".into()),
                ("CUDABISECT_PHASE".into(), "repro".into()),
                ("A".into(), "x'y z".into()),
                ("bad name".into(), "v".into()),
            ],
            timeout: Duration::from_secs(90),
            grace: Duration::from_secs(1),
            stack_dump: None,
        }
    }

    #[test]
    fn the_job_script_carries_the_environment_directory_and_command_quoted() {
        let s = job_script(&spec(), "t1");
        assert!(s.starts_with("#!/bin/sh\n"), "{s}");
        assert!(s.contains("export CUDA_LAUNCH_BLOCKING='1'\n"), "{s}");
        assert!(s.contains("export A='x'\\''y z'\n"), "{s}");
        assert!(s.contains(&format!("export {RUN_TAG}='t1'\n")), "{s}");
        assert!(!s.contains("bad name"), "{s}");
        assert!(s.contains("cd '/shared/wt 1' || exit 125\n"), "{s}");
        assert!(s.ends_with("exec './repro.sh' 'it'\\''s'\n"), "{s}");
    }

    #[test]
    fn sbatch_gets_partition_account_gres_and_a_time_limit_above_the_timeout() {
        let settings = ExecutorSection {
            partition: Some("gpu".into()),
            account: Some("ml".into()),
            sbatch_args: vec!["--qos=high".into()],
            ..ExecutorSection::default()
        };
        let slurm = Slurm::new(settings, 2, Path::new("/tmp"));
        let args = slurm.sbatch_args(&spec(), Path::new("/tmp/o.out"));
        for want in [
            "--parsable",
            "--partition=gpu",
            "--account=ml",
            "--gres=gpu:2",
            "--time=7",
            "--qos=high",
            "--chdir=/shared/wt 1",
            "--output=/tmp/o.out",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        let mut build = spec();
        build.env.push(("CUDABISECT_PHASE".into(), "build".into()));
        let args = slurm.sbatch_args(&build, Path::new("/tmp/o.out"));
        assert!(!args.iter().any(|a| a.starts_with("--gres")), "{args:?}");
    }

    #[test]
    fn scontrol_records_and_exit_codes_are_read() {
        let j = parse_job("JobId=12 JobName=x JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 NodeList=vm");
        assert_eq!(j["JobState"], "FAILED");
        assert_eq!(j["NodeList"], "vm");
        assert_eq!(exit_of(&j["ExitCode"]), Exit::Code(3));
        assert_eq!(exit_of("0:9"), Exit::Signal(9));
        assert_eq!(exit_of("x"), Exit::Unknown);
        assert!(is_terminal("NODE_FAIL") && !is_terminal("PENDING") && !is_terminal(""));
    }
}
