//! What earlier runs taught a command's warm interpreters, kept in the state directory for the next run:
//! the modules its runs imported from outside the worktree, and those that started CUDA when preloaded.
//! A hint, never a fact: it only decides what a server imports before its first fork (a module no longer
//! installed costs one failed import; one that starts CUDA is found and left out as on any first run), so
//! a nightly job's or a second `start`'s first round is forked from a server that has already imported
//! what the runs import, instead of each first run importing it itself. Each run's lesson replaces the
//! last run's: a module the history stopped importing is not preloaded night after night.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::warm::Serves;

/// Where the lessons are kept: one file per command, interpreter and environment.
pub struct WarmMemory {
    dir: PathBuf,
    /// The keys this run has kept a lesson under: the first replaces the last run's, later ones add to it.
    kept: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// What the runs of one command taught.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taught {
    /// Module names, submodules included, in the order they were first imported.
    pub preload: Vec<String>,
    /// Modules that started CUDA when preloaded: each run's child imports them itself.
    pub never: Vec<String>,
}

/// The key of a command's lessons: its server's key (interpreter and environment), which of a worker's
/// commands it is, and its argv (another script imports other modules).
pub fn memory_key(server_key: &str, serves: Serves, argv: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(server_key.as_bytes());
    h.update([0]);
    h.update(format!("{serves:?}").as_bytes());
    for a in argv {
        h.update([0]);
        h.update(a.as_bytes());
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl WarmMemory {
    /// Lessons kept in `dir` (made when the first is kept).
    pub fn new(dir: &Path) -> WarmMemory {
        WarmMemory {
            dir: dir.to_path_buf(),
            kept: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// What earlier runs of `key` taught; nothing when none did or the file cannot be read.
    pub fn recall(&self, key: &str) -> Taught {
        std::fs::read(self.path(key))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Adds `taught` to what this run kept for `key` (what was kept first, in its order; the first lesson
    /// of a run replaces the last run's), writing only when that changes it. A lesson that cannot be kept
    /// is lost, and costs the next run only time.
    pub fn keep(&self, key: &str, taught: &Taught) {
        let first = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string());
        let kept = if first {
            Taught::default()
        } else {
            self.recall(key)
        };
        let mut merged = kept.clone();
        merge(&mut merged.preload, taught.preload.clone());
        merge(&mut merged.never, taught.never.clone());
        if merged == kept || std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        // Renamed into place, never torn; not synced to disk: this runs between a probe's end and its
        // answer, and a hint lost with the machine costs only time.
        let written = serde_json::to_vec(&merged).ok().and_then(|bytes| {
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).ok()?;
            std::io::Write::write_all(&mut tmp, &bytes).ok()?;
            tmp.persist(self.path(key)).ok()
        });
        drop(written);
    }
}

/// Adds what a run taught to what is known, in order, each name once.
pub fn merge(known: &mut Vec<String>, taught: Vec<String>) {
    let seen: std::collections::HashSet<String> = known.iter().cloned().collect();
    known.extend(taught.into_iter().filter(|n| !seen.contains(n)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn lessons_add_up_per_command_and_run_each_run_replacing_the_last_a_torn_file_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let memory = WarmMemory::new(&dir.path().join("warm"));
        let argv = names(&["python3", "train.py"]);
        let key = memory_key("k1", Serves::Repro, &argv);
        assert_eq!(memory.recall(&key), Taught::default());
        memory.keep(
            &key,
            &Taught {
                preload: names(&["torch", "transformers"]),
                never: Vec::new(),
            },
        );
        memory.keep(
            &key,
            &Taught {
                preload: names(&["torch", "peft", "transformers"]),
                never: names(&["apex"]),
            },
        );
        assert_eq!(
            memory.recall(&key),
            Taught {
                preload: names(&["torch", "transformers", "peft"]),
                never: names(&["apex"]),
            }
        );
        // Another script, another interpreter or the build: lessons of their own.
        for other in [
            memory_key("k1", Serves::Repro, &names(&["python3", "eval.py"])),
            memory_key("k2", Serves::Repro, &argv),
            memory_key("k1", Serves::Build, &argv),
        ] {
            assert_ne!(other, key);
            assert_eq!(memory.recall(&other), Taught::default());
        }
        // The next run: what it teaches replaces the last run's lesson, then adds up again.
        let next = WarmMemory::new(&dir.path().join("warm"));
        assert_eq!(
            next.recall(&key).preload,
            names(&["torch", "transformers", "peft"])
        );
        next.keep(
            &key,
            &Taught {
                preload: names(&["torch", "jax"]),
                never: Vec::new(),
            },
        );
        next.keep(
            &key,
            &Taught {
                preload: names(&["flax"]),
                never: Vec::new(),
            },
        );
        assert_eq!(
            next.recall(&key),
            Taught {
                preload: names(&["torch", "jax", "flax"]),
                never: Vec::new(),
            }
        );
        std::fs::write(
            dir.path().join("warm").join(format!("{key}.json")),
            b"{\"pre",
        )
        .expect("tear");
        assert_eq!(memory.recall(&key), Taught::default());
    }
}
