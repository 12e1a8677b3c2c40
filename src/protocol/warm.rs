//! The PyTorch harness's warm server, seen from the driver: started once per shrink, it imports torch and
//! the user's package and builds the model; every protocol call then runs in a child forked from it
//! (`--via`), which pays for CUDA's start-up but not for Python's imports.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The line the server prints once it listens (before it imports anything heavy).
const READY: &str = "harness: listening";

/// Why the warm server did not start; the calls then run cold, as before.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The server process or its socket directory could not be made.
    #[error("cannot start the warm harness server: {0}")]
    Io(#[from] std::io::Error),
    /// It ended, or said something else, before it listened.
    #[error("the warm harness server did not start: {0:?} (see its log)")]
    NotReady(String),
}

/// How long a server may take to listen, and the flag that stops the wait (Ctrl-C).
#[derive(Clone, Copy, Debug)]
pub struct Wait<'a> {
    /// At most this long.
    pub limit: Duration,
    /// Set: stop waiting.
    pub cancel: Option<&'a AtomicBool>,
}

/// How often a wait for the server looks at its cancel flag.
const POLL: Duration = Duration::from_millis(50);

/// A warm server that has not said it listens yet (it imports its preloads first); dropping it ends it.
pub struct Starting {
    server: WarmServer,
    first_line: Receiver<std::io::Result<String>>,
    started: Instant,
}

/// How a wait for a starting server ended.
pub enum Ready {
    /// It listens.
    Listening(WarmServer),
    /// The wait was stopped first; the server is still starting (its imports paid for, to be waited for
    /// again by the next who needs it).
    Stopped(Starting),
    /// It will not listen (ended, said something else, or took too long): it is ended.
    Failed(WarmError),
}

impl Starting {
    /// Waits until the server listens, at most `wait.limit` from its start in all, and hands it back
    /// still starting when `wait.cancel` is set first: the one who asked no longer waits, but the
    /// imports it has paid for need not be paid again by the next.
    pub fn ready(self, wait: Wait) -> Ready {
        loop {
            let left = wait.limit.saturating_sub(self.started.elapsed());
            if left.is_zero() {
                let why = format!(
                    "it did not listen within {}",
                    humantime::format_duration(wait.limit)
                );
                return Ready::Failed(WarmError::NotReady(why));
            }
            if wait.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
                return Ready::Stopped(self);
            }
            match self.first_line.recv_timeout(left.min(POLL)) {
                Ok(Ok(line)) if line.trim() == READY => return Ready::Listening(self.server),
                Ok(Ok(line)) => return Ready::Failed(WarmError::NotReady(line.trim().to_string())),
                Ok(Err(e)) => return Ready::Failed(WarmError::Io(e)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Ready::Failed(WarmError::NotReady(String::new()))
                }
            }
        }
    }
}

/// A running warm server; dropping it ends the server and any child it still has.
pub struct WarmServer {
    child: Child,
    socket: PathBuf,
    // The socket lives in a private directory of its own: a short path (sockets have a length limit)
    // that nobody else can write to, removed with the server.
    _dir: tempfile::TempDir,
}

impl WarmServer {
    /// Starts `argv … serve --socket <path>` in `cwd` with `env` on top of this process's, its output in
    /// `log`, and waits until it listens: at most `wait.limit`, and no longer once `wait.cancel` is set
    /// (a preload whose import hangs must not hang the run; the server is then ended with its group).
    pub fn start(
        argv: &[String],
        cwd: &Path,
        env: &[(String, String)],
        log: &Path,
        wait: Wait,
    ) -> Result<Self, WarmError> {
        match Self::spawn(argv, cwd, env, log)?.ready(wait) {
            Ready::Listening(server) => Ok(server),
            Ready::Stopped(_) => Err(WarmError::NotReady("interrupted".into())),
            Ready::Failed(e) => Err(e),
        }
    }

    /// Starts the server as [`WarmServer::start`] does, without waiting for it to listen.
    pub fn spawn(
        argv: &[String],
        cwd: &Path,
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Starting, WarmError> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| WarmError::NotReady("no command".into()))?;
        let dir = tempfile::Builder::new()
            .prefix("cudabisect-warm-")
            .tempdir()?;
        let socket = dir.path().join("harness.sock");
        let log = std::fs::File::create(log)?;
        let mut program = PathBuf::from(program);
        if program.components().count() > 1 && program.is_relative() {
            program = cwd.join(program);
        }
        let mut command = Command::new(program);
        command
            .args(args)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .current_dir(cwd)
            .envs(env.iter().map(|(k, v)| (k, v)))
            // Its stdin is how it knows the driver is alive: it ends when the pipe closes, even when
            // this process was killed without running any destructor.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0);
        let mut child = crate::exec::process::spawn_unless_busy(|| command.spawn())?;
        // The first line is read on a thread of its own, so the wait can end: ending the server (its
        // drop) closes the pipe, and the thread's read returns.
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut line = String::new();
                let read = BufReader::new(out).read_line(&mut line);
                let _ = tx.send(read.map(|_| line));
            });
        }
        Ok(Starting {
            server: Self {
                child,
                socket,
                _dir: dir,
            },
            first_line: rx,
            started: Instant::now(),
        })
    }

    /// The socket clients pass as `--via`.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for WarmServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: signals the process group this struct started (its own group, led by the child).
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Wait = Wait {
        limit: Duration::from_secs(60),
        cancel: None,
    };

    #[test]
    fn a_server_that_never_listens_is_ended_at_its_limit_or_at_ctrl_c() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 600", pidfile.display());
        let argv = vec!["sh".to_string(), "-c".into(), script, "sh".into()];
        let short = Wait {
            limit: Duration::from_millis(300),
            cancel: None,
        };
        let e = WarmServer::start(&argv, dir.path(), &[], &dir.path().join("log"), short)
            .err()
            .expect("not ready");
        assert!(e.to_string().contains("did not listen within 300ms"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("pid")
            .trim()
            .parse()
            .expect("pid");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty() || stat.contains(") Z"), "ended: {stat}");
        let cancel = AtomicBool::new(true);
        let stopped = Wait {
            limit: Duration::from_secs(600),
            cancel: Some(&cancel),
        };
        let e = WarmServer::start(&argv, dir.path(), &[], &dir.path().join("log"), stopped)
            .err()
            .expect("not ready");
        assert!(e.to_string().contains("interrupted"), "{e}");
    }

    #[test]
    fn a_server_that_ends_before_listening_is_reported_not_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            "echo broken; exit 3".into(),
            "sh".into(),
        ];
        let e = WarmServer::start(&argv, dir.path(), &[], &dir.path().join("log"), MINUTE)
            .err()
            .expect("not ready");
        assert!(e.to_string().contains("broken"), "{e}");
    }

    #[test]
    fn a_listening_server_is_ended_with_its_group_when_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("pid");
        // Leaves a grandchild in its group that would outlive a plain kill, then says it is ready.
        let script = format!(
            "sleep 600 & echo $! > {}; echo '{READY}'; wait",
            pidfile.display()
        );
        let argv = vec!["sh".to_string(), "-c".into(), script, "sh".into()];
        let server = WarmServer::start(&argv, dir.path(), &[], &dir.path().join("log"), MINUTE)
            .expect("starts");
        assert!(server.socket().starts_with(std::env::temp_dir()));
        let leader = server.child.id();
        drop(server);
        // SAFETY: kill with signal 0 only asks whether the process exists.
        assert_ne!(unsafe { libc::kill(leader as i32, 0) }, 0);
        let text =
            std::fs::read_to_string(&pidfile).expect("pid file written before the ready line");
        let pid: i32 = text.trim().parse().expect("pid");
        // The signal may still be on its way: wait (blocked in poll, bounded) until the grandchild ends.
        // SAFETY: pidfd_open and poll on a descriptor we own, closed after.
        unsafe {
            let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
            if fd >= 0 {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                libc::poll(&mut p, 1, 10_000);
                libc::close(fd);
            }
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for its (now reparented) parent to reap it.
        assert!(stat.is_empty() || stat.contains(") Z"), "{stat}");
    }
}
