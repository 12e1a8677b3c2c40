//! One run at a time per state directory: `start`, `shrink --at`, `triage --at` and `nightly` share the
//! probe worktree, so each takes an exclusive lock first and a second one is told who holds it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another run holds it.
    #[error("another cudabisect run holds {path} ({holder}); wait for it to finish")]
    Held {
        /// The lock file.
        path: PathBuf,
        /// What the holder wrote into it.
        holder: String,
    },
    /// The lock file could not be opened.
    #[error("cannot open the lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something that is not a directory sits where the state directory goes.
    #[error(
        "{path} is not a directory: cudabisect keeps its state there (move what is there away)"
    )]
    NotADirectory {
        /// The state directory's path.
        path: PathBuf,
    },
}

/// The held lock; released when dropped (or when the process dies, however it dies).
#[derive(Debug)]
pub struct StateLock {
    file: File,
    path: PathBuf,
    owner: String,
}

impl Drop for StateLock {
    fn drop(&mut self) {
        // A finished run leaves nothing behind in the git directory. The file goes while it is still
        // locked; a run that opened it meanwhile sees its lock on a removed file and tries again.
        let mut now = String::new();
        if self.file.rewind().is_ok()
            && self.file.read_to_string(&mut now).is_ok()
            && now.trim() == self.owner.trim()
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether `file` is still what `path` names (not removed or replaced since it was opened).
fn still_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// Where the lock of `state_dir` lives: beside it, not inside it, so a repro or a user removing the state
/// directory mid-run does not let a second run in.
pub fn lock_path(state_dir: &Path) -> PathBuf {
    let name = state_dir
        .file_name()
        .map_or_else(|| "cudabisect".into(), |n| n.to_string_lossy().into_owned());
    match state_dir.parent() {
        Some(parent) => parent.join(format!("{name}.lock")),
        None => state_dir.join("lock"),
    }
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Whether `pid` on this host is a live cudabisect process (not a recycled pid).
pub(super) fn alive_cudabisect(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("cudabisect"))
}

/// Reads `pid P on host H: …` back.
fn parse_owner(text: &str) -> Option<(u32, String)> {
    let rest = text.trim().strip_prefix("pid ")?;
    let (pid, rest) = rest.split_once(" on host ")?;
    let (host, _) = rest.split_once(':')?;
    Some((pid.parse().ok()?, host.to_string()))
}

/// Takes the lock of `state_dir`, writing who holds it (pid, host and command) for a second run to read.
/// The file lock is the guard; the owner line written into it is a second one for file systems whose
/// locks are per host or per mount (NFS without a lock manager): a live owner there still refuses.
pub fn lock_state_dir(state_dir: &Path, what: &str) -> Result<StateLock, LockError> {
    let path = lock_path(state_dir);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    if state_dir.exists() && !state_dir.is_dir() {
        // The state directory itself is in the way, not the lock beside it: name it.
        return Err(LockError::NotADirectory {
            path: state_dir.to_path_buf(),
        });
    }
    std::fs::create_dir_all(state_dir).map_err(io)?;
    if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(io(std::io::Error::other(
            "not a regular file (remove it; cudabisect creates it)",
        )));
    }
    let mut file = locked_file(&path)?;
    let mut previous = String::new();
    let _ = file.read_to_string(&mut previous);
    check_owner(&previous, &path)?;
    let owner = format!(
        "pid {} on host {}: cudabisect {what}\n",
        std::process::id(),
        host()
    );
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    file.write_all(owner.as_bytes()).map_err(io)?;
    Ok(StateLock { file, path, owner })
}

/// The lock is held by `holder` (what its file says).
fn held(path: &Path, holder: &str) -> LockError {
    LockError::Held {
        path: path.to_path_buf(),
        holder: if holder.is_empty() {
            "a run that is starting".into()
        } else {
            holder.to_string()
        },
    }
}

/// The lock file at `path`, opened (created when missing) and locked by this process.
fn locked_file(path: &Path) -> Result<std::fs::File, LockError> {
    let io = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    for _ in 0..=100 {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut previous = String::new();
                let _ = file.read_to_string(&mut previous);
                return Err(held(path, previous.trim()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        // The holder removed the file as it finished, after this run opened it: lock the new one.
        if still_at(&file, path) {
            return Ok(file);
        }
    }
    Err(io(std::io::Error::other(
        "the lock file keeps being replaced",
    )))
}

/// Refuses a lock whose file names another live owner: the file lock was granted although its owner
/// lives (this file system's locks do not see each other: two mounts of one repository), or the
/// owner is on another host, where file locks do not reach.
fn check_owner(previous: &str, path: &Path) -> Result<(), LockError> {
    let me = host();
    let Some((pid, owner_host)) = parse_owner(previous) else {
        return Ok(());
    };
    if pid == std::process::id() {
        return Ok(());
    }
    if owner_host == me && alive_cudabisect(pid) {
        return Err(held(path, previous.trim()));
    }
    if owner_host != me {
        return Err(held(
            path,
            &format!(
                "{}; file locks do not reach across hosts here, so if that run is gone, remove {}",
                previous.trim(),
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = lock_state_dir(dir.path(), "start a..b").expect("first");
        match lock_state_dir(dir.path(), "shrink --at x") {
            Err(LockError::Held { holder, .. }) => {
                assert!(holder.contains("start a..b"), "{holder}");
                assert!(holder.contains(&std::process::id().to_string()));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        lock_state_dir(dir.path(), "again").expect("free after drop");
    }

    #[test]
    fn the_lock_outlives_its_state_directory_and_a_live_owner_refuses_without_a_file_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("cudabisect");
        let first = lock_state_dir(&state, "start a..b").expect("first");
        std::fs::remove_dir_all(&state).expect("rm");
        assert!(matches!(
            lock_state_dir(&state, "start"),
            Err(LockError::Held { .. })
        ));
        drop(first);
        // An owner line naming a live cudabisect on this host (a second mount whose file lock is not
        // shared): refused. This test binary's own pid is not cudabisect's, so use a parent that is not
        // alive as cudabisect either: the stale line is taken over.
        std::fs::write(
            lock_path(&state),
            format!("pid 1 on host {}: cudabisect start\n", host()),
        )
        .expect("write");
        let taken = lock_state_dir(&state, "start").expect("a stale owner is taken over");
        drop(taken);
        assert!(
            !lock_path(&state).exists(),
            "a finished run leaves no lock file"
        );
        std::fs::write(
            lock_path(&state),
            "pid 4242 on host elsewhere: cudabisect start\n",
        )
        .expect("write");
        match lock_state_dir(&state, "start") {
            Err(LockError::Held { holder, .. }) => {
                assert!(holder.contains("elsewhere"), "{holder}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lock_path_that_is_not_a_file_is_an_error_not_a_held_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("cudabisect");
        std::fs::create_dir_all(lock_path(&state)).expect("mkdir");
        assert!(matches!(
            lock_state_dir(&state, "x"),
            Err(LockError::Io { .. })
        ));
    }
}
