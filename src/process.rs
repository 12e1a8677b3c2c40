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

/// Kills and reaps the descendants that escaped their process group into a session of their own and were
/// re-parented to this process (the subreaper).
fn kill_orphans() {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces): state, ppid, pgrp, session.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (ppid, session) = match (fields.get(1), fields.get(3)) {
            (Some(p), Some(s)) => (p.parse::<u32>().ok(), s.parse::<i32>().ok()),
            _ => continue,
        };
        // An escaped descendant leads a session of its own (setsid) and was re-parented to us; the commands
        // we start ourselves stay in our session, so a run in flight on another thread is never touched.
        if ppid == Some(me) && session == Some(pid) {
            // SAFETY: signalling a process group we own, then reaping our own child; both are plain syscalls.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
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

/// Keeps the first and last bytes of a stream of any length in bounded memory.
#[derive(Default)]
struct BoundedCapture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl BoundedCapture {
    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < HEAD_BYTES {
            let take = bytes.len().min(HEAD_BYTES - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.len() >= TAIL_BYTES {
            self.tail.clear();
            bytes = &bytes[bytes.len() - TAIL_BYTES..];
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    fn render(self) -> String {
        let dropped = self.total - self.head.len() as u64 - self.tail.len() as u64;
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if dropped > 0 {
            text.push_str(&format!(
                "\n[cudabisect: {dropped} bytes of output omitted]\n"
            ));
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
    let mut expr = duct::cmd(prog, args)
        .dir(&spec.cwd)
        .stdin_null()
        .stderr_to_stdout()
        .unchecked();
    for (k, v) in &spec.env {
        expr = expr.env(k, v);
    }
    // Its own process group, so that the whole tree (compute-sanitizer and its target, a Python launcher and
    // its workers) can be signalled at once and no orphan keeps a GPU busy.
    let expr = expr.before_spawn(|c| {
        c.process_group(0);
        Ok(())
    });
    let handle = Arc::new(expr.reader().map_err(|source| ProcessError::Spawn {
        program: program.clone(),
        source,
    })?);
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
            terminate_group(pgid, &handle, spec.grace);
        }
    };
    // The leader is gone; anything it left behind in its group goes too, and releases the output pipe.
    signal_group(pgid, libc::SIGKILL);
    if !eof {
        // Descendants that left the group (setsid, daemons) still hold the pipe: as this process is the
        // subreaper of everything it started, they are its children now; kill them so none survives.
        kill_orphans();
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
    use super::*;

    fn sh(script: &str, timeout_ms: u64) -> RunOutput {
        let spec = CommandSpec {
            command: CommandLine::Shell(script.into()),
            cwd: std::env::temp_dir(),
            env: vec![("CUDABISECT_TEST_VAR".into(), "42".into())],
            timeout: Duration::from_millis(timeout_ms),
            grace: Duration::from_millis(200),
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

    #[test]
    fn a_timeout_kills_the_whole_group() {
        let marker = std::env::temp_dir().join(format!("cudabisect-orphan-{}", std::process::id()));
        let script = format!("(sleep 1; touch {}) & sleep 30", marker.display());
        let out = sh(&script, 300);
        assert_eq!(out.exit, Exit::Timeout);
        assert!(out.duration < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !marker.exists(),
            "the background child survived the timeout"
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
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("pid written")
            .trim()
            .parse()
            .expect("a pid");
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "the escaped process {pid} survived the run");
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
    fn a_missing_program_is_a_spawn_error() {
        let spec = CommandSpec {
            command: CommandLine::Argv(vec!["/nonexistent/cudabisect-nothing".into()]),
            cwd: std::env::temp_dir(),
            env: vec![],
            timeout: Duration::from_secs(5),
            grace: Duration::from_secs(1),
        };
        assert!(matches!(
            run(&spec, &AtomicBool::new(false)),
            Err(ProcessError::Spawn { .. })
        ));
    }
}
