//! The PyTorch harness's warm server, seen from the driver: started once per shrink, it imports torch and
//! the user's package and builds the model; every protocol call then runs in a child forked from it
//! (`--via`), which pays for CUDA's start-up but not for Python's imports.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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
    /// `log`, and waits until it listens.
    pub fn start(
        argv: &[String],
        cwd: &Path,
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self, WarmError> {
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
        let mut child = Command::new(program)
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
            .process_group(0)
            .spawn()?;
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        let server = Self {
            child,
            socket,
            _dir: dir,
        };
        match read {
            Some(Ok(_)) if line.trim() == READY => Ok(server),
            Some(Err(e)) => Err(WarmError::Io(e)),
            _ => Err(WarmError::NotReady(line.trim().to_string())),
        }
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

    #[test]
    fn a_server_that_ends_before_listening_is_reported_not_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            "echo broken; exit 3".into(),
            "sh".into(),
        ];
        let e = WarmServer::start(&argv, dir.path(), &[], &dir.path().join("log"))
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
        let server =
            WarmServer::start(&argv, dir.path(), &[], &dir.path().join("log")).expect("starts");
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
