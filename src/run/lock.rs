//! One run at a time per state directory: `start`, `shrink --at` and `triage --at` share the probe
//! worktree, so each takes an exclusive lock first and a second one is told who holds it.

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
}

/// The held lock; released when dropped (or when the process dies, however it dies).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

/// Takes the lock of `state_dir`, writing who holds it (pid and command) for a second run to read.
pub fn lock_state_dir(state_dir: &Path, what: &str) -> Result<StateLock, LockError> {
    let path = state_dir.join("lock");
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(LockError::Held {
                path,
                holder: if holder.is_empty() {
                    "a run that is starting".into()
                } else {
                    holder.to_string()
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "pid {}: cudabisect {what}", std::process::id()).map_err(io)?;
    Ok(StateLock { _file: file })
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
}
