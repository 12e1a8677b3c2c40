//! Runs user commands as nextest does: each in its own process group, output read while it runs and kept
//! bounded, and on timeout or interruption SIGTERM to the whole group, a grace period, then SIGKILL.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

use crate::classify::Exit;
use crate::config::CommandLine;

/// Bytes kept from the start of the output (where the first fault usually is).
const HEAD_BYTES: usize = 256 * 1024;
/// Bytes kept from the end of the output (where the exception and exit lines are).
const TAIL_BYTES: usize = 1024 * 1024;
/// How often the waiting loop looks at the deadline and the cancel flag while output is still open.
const POLL: Duration = Duration::from_millis(20);

/// How long to wait for the output pipe after killing escaped descendants.
const ESCAPE_GRACE: Duration = Duration::from_secs(2);

/// How long a spawn is tried again while its program is "text file busy".
const BUSY_FOR: Duration = Duration::from_secs(2);

/// Spawns with `spawn`, again while the program is "text file busy" (`ETXTBSY`, for up to [`BUSY_FOR`]).
/// Workers check out commits in this process while others start their commands: a child forked while
/// another thread writes a script of a checkout holds that write descriptor until it execs, and the exec
/// of that script in the meantime fails. The script is whole a moment later; that failure says nothing of
/// the commit, and taken as the host's failure it would end the search.
pub fn spawn_unless_busy<T>(mut spawn: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let until = Instant::now() + BUSY_FOR;
    let mut pause = Duration::from_millis(5);
    loop {
        match spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < until => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            done => return done,
        }
    }
}

static SUBREAPER: Once = Once::new();

/// Makes this process the subreaper of everything it starts (Linux), so a descendant that leaves the
/// process group with `setsid` is re-parented here instead of to init, and can still be found and killed.
fn become_subreaper() {
    SUBREAPER.call_once(|| {
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) only sets a flag on the calling process.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
    });
}

/// This process's children: from each thread's `children` list when the kernel keeps one (cheap), else
/// from a scan of every process.
fn children() -> Vec<i32> {
    let from_tasks: Option<Vec<i32>> =
        std::fs::read_dir("/proc/self/task").ok().and_then(|tasks| {
            let mut pids = Vec::new();
            for task in tasks.flatten() {
                let text = std::fs::read_to_string(task.path().join("children")).ok()?;
                pids.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
            Some(pids)
        });
    from_tasks.unwrap_or_else(|| {
        std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Kills and reaps this process's children that a finished command left behind: members of its group
/// `pgid`, and descendants that escaped into a session of their own (setsid) and were re-parented here.
/// Commands in flight on other threads stay in this process's session and their own groups: untouched.
fn reap_leftovers(pgid: Option<i32>) {
    let me = std::process::id();
    for pid in children() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces): state, ppid, pgrp, session.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<i64> = rest
            .split_whitespace()
            .skip(1)
            .take(3)
            .filter_map(|f| f.parse().ok())
            .collect();
        let [ppid, pgrp, session] = fields[..] else {
            continue;
        };
        if ppid != i64::from(me) {
            continue;
        }
        let escaped = session == i64::from(pid);
        let leftover = pgid.is_some_and(|g| pgrp == i64::from(g));
        if escaped || leftover {
            // SAFETY: signalling a group or process that is our own child, then reaping that child; plain
            // syscalls with no memory handed over.
            unsafe {
                if escaped {
                    libc::killpg(pid, libc::SIGKILL);
                } else {
                    libc::kill(pid, libc::SIGKILL);
                }
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// The variable that marks every process of one run, whatever group or session it moved to: a run's
/// processes are found by it after the run, and killed.
pub const RUN_TAG: &str = "CUDABISECT_RUN_TAG";

/// A tag no other run of this process shares.
fn new_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A process's environment variable, when its environment is readable (same user, still alive).
pub fn env_of(pid: i32, name: &str) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    bytes.split(|&b| b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        kv.strip_prefix(name)?.strip_prefix('=').map(str::to_string)
    })
}

/// Every live process that carries `tag`.
fn tagged(tag: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && env_of(pid, RUN_TAG).as_deref() == Some(tag))
        .collect()
}

/// True while `pid` is a live process; a zombie (exited, not yet reaped) counts as gone: it holds no
/// memory, GPU or otherwise.
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Kills every process still carrying the run's tag (one that left both the group and this process's
/// care, like a grandchild that called `setsid` under a parent still alive), and returns them.
fn kill_tagged(tag: &str) -> Vec<i32> {
    let pids = tagged(tag);
    for &pid in &pids {
        // SAFETY: kill only sends a signal to a process of this run.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    pids
}

/// Dumps the Python stacks of the run's processes with `py_spy`, each line prefixed with the process's
/// rank (`[rank1]: `) when it has one, so the classifier files each dump under its rank.
fn dump_stacks(py_spy: &std::path::Path, tag: &str, capture: &Mutex<BoundedCapture>) {
    const LIMIT: Duration = Duration::from_secs(10);
    for pid in tagged(tag) {
        let is_python = std::fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|exe| exe.to_string_lossy().contains("python"));
        if !is_python {
            continue;
        }
        let prefix = env_of(pid, "RANK").map_or(String::new(), |r| format!("[rank{r}]: "));
        let Ok(mut child) = std::process::Command::new(py_spy)
            .args(["dump", "--pid", &pid.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        else {
            return;
        };
        let until = Instant::now() + LIMIT;
        while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(POLL);
        }
        let _ = child.kill();
        let Ok(out) = child.wait_with_output() else {
            continue;
        };
        let mut text = format!(
            "{prefix}[cudabisect] stack of pid {pid} when the run timed out (py-spy dump):\n"
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            text.push_str(&prefix);
            text.push_str(line);
            text.push('\n');
        }
        if let Ok(mut c) = capture.lock() {
            c.push(text.as_bytes());
        }
    }
}

/// Everything needed to run one command.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    /// What to run.
    pub command: CommandLine,
    /// Working directory.
    pub cwd: PathBuf,
    /// Extra environment variables, on top of the inherited environment.
    pub env: Vec<(String, String)>,
    /// Time allowed before the group is terminated.
    pub timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// A `py-spy` to dump the Python stacks of the run's processes with when it times out, before they are
    /// killed: a hang then says where each rank was.
    pub stack_dump: Option<PathBuf>,
}

/// A command run as a scheduler job: which job, where, how it ended and how long it queued.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobInfo {
    /// The scheduler (`slurm`).
    pub scheduler: String,
    /// The job id.
    pub id: String,
    /// The node it ran on, once it started.
    pub node: Option<String>,
    /// The scheduler's final state (`COMPLETED`, `FAILED`, `NODE_FAIL`, `OUT_OF_MEMORY`, …).
    pub state: String,
    /// The scheduler's reason, when it gives one (`NonZeroExitCode`, a pending reason, …).
    pub reason: Option<String>,
    /// Seconds from submission to start: queue time, never counted toward the command's timeout.
    pub queue_s: f64,
    /// Seconds it ran.
    pub run_s: f64,
}

/// What a finished command left behind.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// How it ended.
    pub exit: Exit,
    /// Wall time.
    pub duration: Duration,
    /// Interleaved stdout and stderr, bounded: the head and the tail, with a marker where bytes were dropped.
    pub output: String,
    /// Bytes the command printed in all.
    pub total_bytes: u64,
    /// True when the command was stopped because the run was interrupted.
    pub interrupted: bool,
    /// Processes of this run still found after it ended (killed then, but perhaps not yet gone: a process
    /// whose GPU context the driver is tearing down lingers): what the device-idle check waits for.
    pub lingering: Vec<i32>,
    /// The scheduler job that ran it, when a scheduler did (its `duration` is then the run time only).
    pub job: Option<JobInfo>,
    /// The host (a scheduler) ended it, or never started it, whatever the command did: the machine's
    /// doing, never the commit's.
    pub ended_by: Option<HostEnd>,
}

/// How a scheduler ended a command, apart from the command's own exit.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostEnd {
    /// The scheduler (`slurm`).
    pub scheduler: String,
    /// Its job id.
    pub job: String,
    /// The node, when it had one.
    pub node: Option<String>,
    /// What happened, in the scheduler's terms (`NODE_FAIL`, `PREEMPTED`, `LOST (PENDING)`, `STUCK in the
    /// queue for 3600 s`, `ENDED before it started (CANCELLED, None)`).
    pub state: String,
    /// The scheduler's reason, when it gave one.
    pub reason: Option<String>,
}

impl HostEnd {
    /// One line: `slurm job 41 on gpu-3: NODE_FAIL (NodeDown)`.
    pub fn summary(&self) -> String {
        format!(
            "{} job {} on {}: {}{}",
            self.scheduler,
            self.job,
            self.node.as_deref().unwrap_or("no node"),
            self.state,
            self.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )
    }
}

impl RunOutput {
    /// What the run showed: the host's end when the host ended it (an infrastructure failure, read from
    /// the type before any text), else the classification of its exit and output.
    pub fn signature(&self) -> crate::classify::Signature {
        match &self.ended_by {
            Some(end) => {
                crate::classify::Signature::new(crate::classify::FaultClass::Infra, end.summary())
            }
            None => crate::classify::classify(self.exit, &self.output),
        }
    }
}

/// Why a command could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program does not exist or cannot be executed.
    #[error("cannot run `{program}`: {source}")]
    Spawn {
        /// The program as given.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The scheduler refused the job or could not be asked about it.
    #[error("{scheduler}: {message}")]
    Scheduler {
        /// Which scheduler (`slurm`).
        scheduler: &'static str,
        /// What it said.
        message: String,
    },
    /// Waiting on the child failed.
    #[error("lost track of `{program}`: {source}")]
    Wait {
        /// The program as given.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Fault lines kept from the dropped middle of the output, at most.
const KEPT_LINES: usize = 64;
/// Longest line (or unterminated run of bytes) the middle scan assembles.
const LONGEST_LINE: usize = 8 * 1024;

/// Keeps the first and last bytes of a stream of any length in bounded memory, and the fault lines of
/// the bytes in between: a fault printed after the first 256 KiB and before the last 1 MiB is not lost.
/// A run's output is read this way, and so is a log `classify` reads.
#[derive(Default)]
pub struct BoundedCapture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    /// The line being assembled from bytes leaving the tail.
    partial: Vec<u8>,
    /// Fault lines found in the dropped bytes, in order.
    kept: Vec<String>,
    /// Fault lines found beyond `KEPT_LINES`.
    kept_over: u64,
}

impl BoundedCapture {
    /// Takes the next bytes of the stream.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < HEAD_BYTES {
            let take = bytes.len().min(HEAD_BYTES - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.len() >= TAIL_BYTES {
            let dropped: Vec<u8> = self.tail.drain(..).collect();
            self.scan(&dropped);
            self.scan(&bytes[..bytes.len() - TAIL_BYTES]);
            bytes = &bytes[bytes.len() - TAIL_BYTES..];
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        let dropped: Vec<u8> = self.tail.drain(..overflow).collect();
        self.scan(&dropped);
        self.tail.extend(bytes);
    }

    /// Reads bytes leaving the capture for good, keeping whole lines that name a fault.
    fn scan(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            if self.partial.len() < LONGEST_LINE {
                let room = LONGEST_LINE - self.partial.len();
                self.partial.extend_from_slice(&rest[..nl.min(room)]);
            }
            let line = String::from_utf8_lossy(&self.partial).into_owned();
            self.partial.clear();
            if crate::classify::is_fault_line(&line) {
                if self.kept.len() < KEPT_LINES {
                    self.kept.push(line);
                } else {
                    self.kept_over += 1;
                }
            }
            rest = &rest[nl + 1..];
        }
        let room = LONGEST_LINE.saturating_sub(self.partial.len());
        self.partial
            .extend_from_slice(&rest[..rest.len().min(room)]);
    }

    /// The kept text: the head, a line for what was left out with the fault lines found there, the tail.
    pub fn render(self) -> String {
        let dropped = self.total - self.head.len() as u64 - self.tail.len() as u64;
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if dropped > 0 {
            text.push_str(&format!(
                "\n[cudabisect: {dropped} bytes of output omitted; {} fault line(s) from them kept]\n",
                self.kept.len() as u64 + self.kept_over
            ));
            for line in &self.kept {
                text.push_str(line);
                text.push('\n');
            }
            if self.kept_over > 0 {
                text.push_str(&format!(
                    "[cudabisect: {} more fault lines omitted]\n",
                    self.kept_over
                ));
            }
        }
        let tail: Vec<u8> = self.tail.into_iter().collect();
        text.push_str(&String::from_utf8_lossy(&tail));
        text
    }
}

/// Runs `spec` to completion, timeout or cancellation. `cancel` is polled; when set, the group is stopped.
pub fn run(spec: &CommandSpec, cancel: &AtomicBool) -> Result<RunOutput, ProcessError> {
    become_subreaper();
    let started = Instant::now();
    let program = spec.command.display();
    let (mut prog, args) = spec.command.argv();
    // A relative path like `./run.sh` means the worktree's file, not one next to wherever cudabisect runs.
    if prog.contains('/') && !prog.starts_with('/') {
        prog = spec.cwd.join(&prog).display().to_string();
    }
    let tag = new_tag();
    let mut expr = duct::cmd(prog, args)
        .dir(&spec.cwd)
        .stdin_null()
        .stderr_to_stdout()
        .unchecked();
    for (k, v) in &spec.env {
        expr = expr.env(k, v);
    }
    expr = expr.env(RUN_TAG, &tag);
    // Its own process group, so that the whole tree (compute-sanitizer and its target, a Python launcher and
    // its workers) can be signalled at once and no orphan keeps a GPU busy.
    let expr = expr.before_spawn(|c| {
        c.process_group(0);
        Ok(())
    });
    let handle =
        Arc::new(
            spawn_unless_busy(|| expr.reader()).map_err(|source| ProcessError::Spawn {
                program: program.clone(),
                source,
            })?,
        );
    let pgid = handle.pids().first().map(|&p| p as i32);

    // The capture is shared with the reader thread, so what was read is kept even when a descendant that
    // escaped the group holds the pipe open and EOF never comes.
    let shared = Arc::new(Mutex::new(BoundedCapture::default()));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let reader = Arc::clone(&handle);
    let sink = Arc::clone(&shared);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match (&*reader).read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Ok(mut c) = sink.lock() {
                        c.push(&buf[..n]);
                    }
                }
            }
        }
        let _ = done_tx.send(());
    });

    let deadline = started + spec.timeout;
    let mut timed_out = false;
    let mut interrupted = false;
    let mut eof = false;
    let status = loop {
        // Output EOF usually means the child is done: waking on it (not on a timer) keeps short runs fast.
        if !eof {
            match done_rx.recv_timeout(POLL) {
                Ok(()) => eof = true,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(POLL),
            }
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
        match handle.try_wait() {
            Ok(Some(output)) => break output.status,
            Ok(None) => {}
            Err(source) => return Err(ProcessError::Wait { program, source }),
        }
        if cancel.load(Ordering::SeqCst) && !interrupted {
            interrupted = true;
            terminate_group(pgid, &handle, spec.grace);
        } else if Instant::now() >= deadline && !timed_out {
            timed_out = true;
            if let Some(py_spy) = &spec.stack_dump {
                dump_stacks(py_spy, &tag, &shared);
            }
            terminate_group(pgid, &handle, spec.grace);
        }
    };
    // The leader is gone; anything it left behind in its group goes too, and releases the output pipe.
    signal_group(pgid, libc::SIGKILL);
    // As the subreaper, this process inherited what the leader left: its group's leftovers and any
    // descendant that escaped into a session of its own. Kill and reap them, so none survives the run
    // and no zombie piles up over a long bisection.
    reap_leftovers(pgid);
    let lingering = kill_tagged(&tag);
    if !eof {
        let _ = done_rx.recv_timeout(ESCAPE_GRACE);
    }
    let capture = std::mem::take(&mut *shared.lock().unwrap_or_else(|e| e.into_inner()));
    let exit = if timed_out {
        Exit::Timeout
    } else if let Some(sig) = status.signal() {
        Exit::Signal(sig)
    } else {
        Exit::Code(status.code().unwrap_or(-1))
    };
    let total_bytes = capture.total;
    Ok(RunOutput {
        exit,
        duration: started.elapsed(),
        output: capture.render(),
        total_bytes,
        interrupted,
        lingering,
        job: None,
        ended_by: None,
    })
}

fn signal_group(pgid: Option<i32>, signal: i32) {
    if let Some(pgid) = pgid.filter(|&p| p > 0) {
        // SAFETY: killpg only sends a signal; a stale group id yields ESRCH, which is fine.
        unsafe { libc::killpg(pgid, signal) };
    }
}

/// SIGTERM to the group, then SIGKILL if the leader is still alive after the grace period.
fn terminate_group(pgid: Option<i32>, handle: &duct::ReaderHandle, grace: Duration) {
    signal_group(pgid, libc::SIGTERM);
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if matches!(handle.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(POLL);
    }
    signal_group(pgid, libc::SIGKILL);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_run_the_host_ended_is_the_machine_s_failure_whatever_it_printed() {
        let mut run = sh(
            "echo 'CUDA error: an illegal memory access was encountered'; exit 1",
            5_000,
        );
        assert_eq!(
            run.signature().class,
            crate::classify::FaultClass::IllegalAddress
        );
        run.ended_by = Some(HostEnd {
            scheduler: "slurm".into(),
            job: "41".into(),
            node: Some("gpu-3".into()),
            state: "NODE_FAIL".into(),
            reason: Some("NodeDown".into()),
        });
        let sig = run.signature();
        assert_eq!(sig.class, crate::classify::FaultClass::Infra);
        assert_eq!(sig.summary, "slurm job 41 on gpu-3: NODE_FAIL (NodeDown)");
        // The same words in a log are read back the same way.
        let line = format!("[cudabisect] {}", sig.summary);
        assert_eq!(
            crate::classify::classify(Exit::Code(1), &line).class,
            crate::classify::FaultClass::Infra
        );
    }

    use super::*;

    fn sh(script: &str, timeout_ms: u64) -> RunOutput {
        let spec = CommandSpec {
            command: CommandLine::Shell(script.into()),
            cwd: std::env::temp_dir(),
            env: vec![("CUDABISECT_TEST_VAR".into(), "42".into())],
            timeout: Duration::from_millis(timeout_ms),
            grace: Duration::from_millis(200),
            stack_dump: None,
        };
        run(&spec, &AtomicBool::new(false)).expect("sh runs")
    }

    #[test]
    fn exit_codes_signals_and_env_come_through() {
        let out = sh(
            "echo out; echo err >&2; echo $CUDABISECT_TEST_VAR; exit 3",
            10_000,
        );
        assert_eq!(out.exit, Exit::Code(3));
        assert!(
            out.output.contains("out") && out.output.contains("err") && out.output.contains("42")
        );
        assert_eq!(sh("kill -SEGV $$", 10_000).exit, Exit::Signal(11));
    }

    /// The pid in `file`, once the script has written it.
    fn pid_in(file: &std::path::Path) -> i32 {
        std::fs::read_to_string(file)
            .expect("pid written")
            .trim()
            .parse()
            .expect("a pid")
    }

    /// True when `pid` is gone: no process, or a zombie nobody will run again.
    fn gone(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }

    #[test]
    fn a_timeout_kills_the_whole_group_and_reaps_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("bg.pid");
        // The background child writes its pid before the script starts waiting, so the timeout always
        // finds it running.
        let script = format!(
            "sh -c 'echo $$ > {p}; exec sleep 30' & while [ ! -s {p} ]; do :; done; sleep 30",
            p = pidfile.display()
        );
        let out = sh(&script, 1_000);
        assert_eq!(out.exit, Exit::Timeout);
        let pid = pid_in(&pidfile);
        assert!(gone(pid), "the background child {pid} survived the timeout");
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the background child {pid} was left a zombie"
        );
    }

    #[test]
    fn output_survives_a_descendant_that_escapes_the_group_and_the_escapee_dies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("escaped.pid");
        let script = format!(
            "echo 'RuntimeError: CUDA error: an illegal memory access was encountered'; setsid sh -c 'echo $$ > {}; exec sleep 120' & while [ ! -s {} ]; do :; done; exit 1",
            pidfile.display(),
            pidfile.display()
        );
        let out = sh(&script, 60_000);
        assert_eq!(out.exit, Exit::Code(1));
        assert!(
            out.output.contains("illegal memory access"),
            "the capture was lost: {:?}",
            out.output
        );
        let pid = pid_in(&pidfile);
        assert!(gone(pid), "the escaped process {pid} survived the run");
    }

    #[test]
    fn a_fault_in_the_middle_of_a_huge_output_is_kept() {
        let out = sh(
            "head -c 2000000 /dev/zero | tr '\\0' 'x' | fold -w 100; echo 'RuntimeError: CUDA error: misaligned address'; head -c 2000000 /dev/zero | tr '\\0' 'y' | fold -w 100; exit 1",
            60_000,
        );
        assert!(out.output.len() < HEAD_BYTES + TAIL_BYTES + 64 * LONGEST_LINE);
        assert!(
            out.output.contains("1 fault line(s) from them kept"),
            "{}",
            &out.output[HEAD_BYTES - 200..HEAD_BYTES + 400]
        );
        assert_eq!(
            crate::classify::classify(out.exit, &out.output).class,
            crate::classify::FaultClass::MisalignedAddress
        );
    }

    #[test]
    fn huge_output_is_kept_bounded() {
        let out = sh(
            "head -c 8000000 /dev/zero | tr '\\0' x; echo; echo LAST",
            30_000,
        );
        assert_eq!(out.total_bytes, 8_000_006);
        assert!(out.output.len() < HEAD_BYTES + TAIL_BYTES + 200);
        assert!(
            out.output.contains("bytes of output omitted")
                && out.output.trim_end().ends_with("LAST")
        );
    }

    #[test]
    fn a_spawn_of_a_busy_program_is_tried_again_and_any_other_error_is_not() {
        let busy = || std::io::Error::from_raw_os_error(libc::ETXTBSY);
        let mut tries = 0;
        let out = spawn_unless_busy(|| {
            tries += 1;
            if tries < 3 {
                Err(busy())
            } else {
                Ok(tries)
            }
        });
        assert_eq!(out.unwrap(), 3);
        let mut tries = 0;
        let out: std::io::Result<()> = spawn_unless_busy(|| {
            tries += 1;
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        });
        assert!(out.is_err());
        assert_eq!(tries, 1);
    }

    #[test]
    fn a_script_held_open_for_writing_stays_a_spawn_error_once_the_retries_are_spent() {
        // A real ETXTBSY: the script is still open for writing as it is run. Held to the end, the run is
        // refused after the bounded retries, with the OS's reason.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("busy.sh");
        let mut f = std::fs::File::create(&script).unwrap();
        std::io::Write::write_all(&mut f, b"#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let spec = CommandSpec {
            command: CommandLine::Argv(vec![script.display().to_string()]),
            cwd: dir.path().to_path_buf(),
            env: vec![],
            timeout: Duration::from_secs(5),
            grace: Duration::from_secs(1),
            stack_dump: None,
        };
        let err = run(&spec, &AtomicBool::new(false)).unwrap_err();
        assert!(
            matches!(&err, ProcessError::Spawn { source, .. } if source.raw_os_error() == Some(libc::ETXTBSY)),
            "{err}"
        );
        drop(f);
        assert_eq!(
            run(&spec, &AtomicBool::new(false)).unwrap().exit,
            Exit::Code(0)
        );
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let spec = CommandSpec {
            command: CommandLine::Argv(vec!["/nonexistent/cudabisect-nothing".into()]),
            cwd: std::env::temp_dir(),
            env: vec![],
            timeout: Duration::from_secs(5),
            grace: Duration::from_secs(1),
            stack_dump: None,
        };
        assert!(matches!(
            run(&spec, &AtomicBool::new(false)),
            Err(ProcessError::Spawn { .. })
        ));
    }
}
