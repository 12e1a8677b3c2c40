//! Everything a job sets up before it runs user code, in one place: the state directory's lock, the run's
//! id and directory with a copy of its config, the worktree base (honouring `[executor] workdir`, so a
//! node that does not see the repository sees the worktrees), the executor every command goes through, the
//! workers (their scratch directories, worktrees, warm interpreters and probers), and the probe
//! worktrees, removed when the job ends (or when the workspace is dropped on an early return).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::config::{Config, ExecutorKind};
use crate::exec::executor::{Executor, Local};
use crate::exec::slurm::Slurm;
use crate::git::{ProbeWorktree, Repo};
use crate::report::event::{Event, Reporter};

use super::error::RunError;
use super::lock::{alive_cudabisect, lock_state_dir, StateLock};
use super::probe::prober::WorktreeProber;
use super::probe::warm::WarmPool;
use crate::exec::child_env::WorkerSlot;

/// The configured executor, built here only: every job's commands go through its workspace's. `spool`
/// is where a scheduler's job files go when `[executor] workdir` is not set (the run's log directory).
fn executor_for(config: &Config, spool: &Path) -> Arc<dyn Executor> {
    match &config.executor.kind {
        ExecutorKind::Local => Arc::new(Local),
        ExecutorKind::Slurm(settings) => Arc::new(Slurm::new(settings, config, spool)),
    }
}

/// A run's directory name: time and pid, unique per machine.
pub fn run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}-{}", now.as_secs(), std::process::id())
}

/// What a job asks of its workspace.
#[derive(Clone, Debug, Default)]
pub struct Opening<'a> {
    /// Take the state directory's lock, naming the job (`start v1..v2`); `None` when the job holds it
    /// already or touches no shared state.
    pub lock: Option<&'a str>,
    /// The run directory's name before its id (`shrink-`, `nightly-`; empty for `start`).
    pub prefix: &'a str,
    /// Where logs go instead of `<run dir>/logs`.
    pub log_dir: Option<PathBuf>,
}

/// A job's workspace. Worktrees made through it are removed by [`Workspace::close`] (which reports a
/// failure) or, on an early return, when it is dropped.
pub struct Workspace<'r> {
    repo: &'r Repo,
    /// `.git/cudabisect`.
    pub state_dir: PathBuf,
    /// This run's directory: its config copy, logs, report.
    pub run_dir: PathBuf,
    /// Where the logs go.
    pub log_dir: PathBuf,
    /// Where the worktrees go: the state directory, or a directory of this repository's own under a
    /// shared `[executor] workdir`.
    pub worktree_base: PathBuf,
    /// Where every command of the job runs.
    pub executor: Arc<dyn Executor>,
    _lock: Option<StateLock>,
    made: RefCell<Vec<PathBuf>>,
    keep: bool,
}

impl<'r> Workspace<'r> {
    /// Sets the job up: the executor, asked whether it can run anything (before anything is written),
    /// the lock (so a second run writes nothing), the run directory with the config's text and the
    /// worktree base.
    pub fn open(repo: &'r Repo, config: &Config, opening: Opening) -> Result<Self, RunError> {
        let state_dir = repo.state_dir();
        let run_dir = state_dir
            .join("runs")
            .join(format!("{}{}", opening.prefix, run_id()));
        let log_dir = opening.log_dir.unwrap_or_else(|| run_dir.join("logs"));
        let worktree_base = worktree_base(repo, &state_dir, config.executor.workdir.as_deref());
        // The executor is asked first, before anything is written: a cluster that would refuse every
        // probe (an unknown partition, no sbatch) is bad input.
        let executor = executor_for(config, &log_dir);
        executor.preflight().map_err(RunError::Usage)?;
        let lock = opening
            .lock
            .map(|what| lock_state_dir(&state_dir, what))
            .transpose()?;
        std::fs::create_dir_all(&log_dir).map_err(RunError::io(&log_dir))?;
        std::fs::create_dir_all(&run_dir).map_err(RunError::io(&run_dir))?;
        std::fs::write(run_dir.join("bisect.toml"), &config.text)
            .map_err(RunError::io(&run_dir))?;
        Ok(Workspace {
            repo,
            state_dir,
            run_dir,
            log_dir,
            worktree_base,
            executor,
            _lock: lock,
            made: RefCell::new(Vec::new()),
            keep: false,
        })
    }

    /// A probe worktree named `name` under the worktree base (reused when it is already there).
    pub fn worktree(&self, name: &str) -> Result<ProbeWorktree, RunError> {
        let path = self.worktree_base.join(name);
        let worktree = self.repo.probe_worktree(&path)?;
        self.made.borrow_mut().push(worktree.path().to_path_buf());
        Ok(worktree)
    }

    /// Each parallel worker's own places: a scratch directory (temporary files, JIT caches), kept between
    /// runs so its caches stay warm, and a worktree for each after the first (sharing the object store, so
    /// its build directory stays warm from probe to probe). Nothing for probes one at a time.
    pub fn worker_places(&self, slots: &mut [WorkerSlot]) -> Result<Vec<ProbeWorktree>, RunError> {
        if slots.len() < 2 {
            return Ok(Vec::new());
        }
        for slot in slots.iter_mut() {
            let dir = self.state_dir.join("workers").join(slot.worker.to_string());
            for (_, sub) in crate::exec::child_env::WORKER_PRIVATE_DIRS {
                std::fs::create_dir_all(dir.join(sub)).map_err(RunError::io(&dir))?;
            }
            slot.scratch = Some(dir);
        }
        slots
            .iter()
            .skip(1)
            .map(|slot| self.worktree(&format!("worktree-{}", slot.worker)))
            .collect()
    }

    /// Warm interpreters for a Python repro and a Python build, per worker, ended with the run (a pool
    /// that cannot be set up means cold runs, as before); what their runs teach is kept in the state
    /// directory for the next run.
    pub fn warm_pool(&self, config: &Config) -> Option<WarmPool> {
        let build_warm = config.build.as_ref().is_some_and(|b| b.warm);
        let memory = self.state_dir.join("warm");
        (config.repro.warm || build_warm)
            .then(|| {
                WarmPool::new(
                    &self.run_dir.join("warm"),
                    config.repro.preload.clone(),
                    Some(&memory),
                )
                .ok()
            })
            .flatten()
    }

    /// A prober of one worktree, one probe at a time, with this job's executor and logs.
    pub fn prober<'a>(
        &'a self,
        worktree: &'a ProbeWorktree,
        config: &'a Config,
        cancel: &'a AtomicBool,
    ) -> WorktreeProber<'a> {
        WorktreeProber {
            worktree,
            config,
            log_dir: self.log_dir.clone(),
            cancel,
            slot: None,
            lingering: Vec::new(),
            warm: None,
            executor: self.executor.clone(),
            last_seen: None,
        }
    }

    /// The workers of a run: one prober per worktree (`first`, then `extra`, one for each slot after the
    /// first), each with its slot's devices, its stop flag and the run's warm interpreters. Without slots
    /// (probes one at a time) the first stops on `cancel`.
    pub fn workers<'a>(
        &'a self,
        config: &'a Config,
        (first, extra): (&'a ProbeWorktree, &'a [ProbeWorktree]),
        (slots, stops): (&'a [WorkerSlot], &'a [AtomicBool]),
        (warm, cancel): (Option<&'a WarmPool>, &'a AtomicBool),
    ) -> (WorktreeProber<'a>, Vec<WorktreeProber<'a>>) {
        let worker = |worktree, stop, slot: Option<&WorkerSlot>| WorktreeProber {
            slot: slot.cloned(),
            warm,
            ..self.prober(worktree, config, stop)
        };
        let prober = worker(first, stops.first().unwrap_or(cancel), slots.first());
        let others = extra
            .iter()
            .zip(slots.iter().skip(1))
            .zip(stops.iter().skip(1))
            .map(|((w, slot), stop)| worker(w, stop, Some(slot)))
            .collect();
        (prober, others)
    }

    /// Tidies `runs/` when a job that holds the state lock starts (no other job writes there then): see
    /// `prune_runs`. What the journal or a night's state still names is kept, as the results it is.
    pub fn prune_runs(&self) {
        let mut named = String::new();
        let nightly = self.state_dir.join("nightly");
        let states = std::fs::read_dir(&nightly)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path());
        for file in std::iter::once(super::journal::journal_path(&self.state_dir)).chain(states) {
            named.push_str(&regular_text(&file, NAMED_BYTES));
        }
        prune_runs(
            &self.state_dir.join("runs"),
            KEEP_RUNS,
            &self.run_dir,
            &named,
        );
    }

    /// Leaves the worktrees registered after the job (`--keep-worktree`): the next run reuses them.
    pub fn keep_worktrees(&mut self) {
        self.keep = true;
    }

    /// Ends the job: removes its worktrees (unless kept), reporting any that could not be removed.
    pub fn close(mut self, reporter: &mut dyn Reporter) {
        for path in self.take_worktrees() {
            if let Err(e) = self.repo.remove_worktree(&path) {
                reporter.event(&Event::WorktreeNotRemoved {
                    path: path.display().to_string(),
                    error: e.to_string(),
                });
            }
        }
    }

    fn take_worktrees(&mut self) -> Vec<PathBuf> {
        let made = std::mem::take(&mut *self.made.borrow_mut());
        if self.keep {
            Vec::new()
        } else {
            made
        }
    }
}

impl Drop for Workspace<'_> {
    fn drop(&mut self) {
        // An early return (an error before the job's end): its worktrees go all the same.
        for path in self.take_worktrees() {
            let _ = self.repo.remove_worktree(&path);
        }
    }
}

/// Run directories kept under `runs/`: the oldest beyond these go when a run starts (a resumed run copies
/// the logs it reuses, so nothing it reports lives only in an old directory).
const KEEP_RUNS: usize = 50;

/// The most read of one file that names runs: a journal is capped well below it.
const NAMED_BYTES: u64 = 256 << 20;

/// The text of `path` when it is a regular file, up to `cap` bytes; empty otherwise. A FIFO would block
/// and a device (`/dev/zero`) would never end: neither is read.
fn regular_text(path: &Path, cap: u64) -> String {
    use std::io::Read;
    let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    let mut text = String::new();
    if regular {
        if let Ok(f) = std::fs::File::open(path) {
            let mut bytes = Vec::new();
            let _ = f.take(cap).read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

/// Tidies the run directories of `start` and `nightly` (`<secs>-<pid>`, `nightly-<secs>-<pid>`; a
/// `shrink` of the checkout takes no lock, so its own are never touched): a killed run's directory (no
/// `report.json`, its process gone) goes unless `named` (the journal's and the nights' text) mentions it, then all but
/// the newest `keep`. `current` is never removed; failures are ignored.
fn prune_runs(runs: &Path, keep: usize, current: &Path, named: &str) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    let mut dirs: Vec<(u64, PathBuf)> = Vec::new();
    for path in entries.filter_map(Result::ok).map(|e| e.path()) {
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let Some(secs) = name
            .trim_start_matches("nightly-")
            .split('-')
            .next()
            .and_then(|s| s.parse().ok())
        else {
            continue;
        };
        let pid: Option<u32> = name.rsplit('-').next().and_then(|p| p.parse().ok());
        // This process's own (a night's head probe before its bisection) or a live cudabisect's.
        let live = pid.is_some_and(|p| p == std::process::id() || alive_cudabisect(p));
        if !path.is_dir() || path == current || live {
            continue;
        }
        let killed = !path.join("report.json").exists();
        if killed && !named.contains(&path.display().to_string()) {
            let _ = std::fs::remove_dir_all(&path);
        } else {
            dirs.push((secs, path));
        }
    }
    dirs.sort();
    let surplus = (dirs.len() + 1).saturating_sub(keep);
    for (_, old) in dirs.iter().take(surplus) {
        let _ = std::fs::remove_dir_all(old);
    }
}

/// The worktree base: the state directory, or, with a scheduler whose nodes do not see this repository,
/// a directory of this repository's own under the shared workdir (named after the repository and a hash
/// of its state directory, so two clones never share one).
fn worktree_base(repo: &Repo, state_dir: &Path, shared: Option<&Path>) -> PathBuf {
    match shared {
        Some(shared) => {
            let name = repo
                .workdir()
                .file_name()
                .map_or_else(|| "repo".into(), |n| n.to_string_lossy().into_owned());
            let digest = state_dir
                .to_string_lossy()
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
            shared.join(format!("{name}-{:08x}", digest as u32))
        }
        None => state_dir.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        left
    }

    fn finished(dir: &Path, name: &str) {
        std::fs::create_dir_all(dir.join(name)).expect("mkdir");
        std::fs::write(dir.join(name).join("report.json"), "{}").expect("write");
    }

    #[test]
    fn only_the_newest_run_directories_are_kept_with_the_current_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (secs, pid) in [(5, 1), (1, 9), (3, 2), (4, 4), (2, 7)] {
            finished(dir.path(), &format!("{secs}-{pid}"));
        }
        finished(dir.path(), "nightly-6-3");
        let current = dir.path().join("7-1");
        std::fs::create_dir_all(&current).expect("mkdir");
        prune_runs(dir.path(), 3, &current, "");
        assert_eq!(names(dir.path()), ["5-1", "7-1", "nightly-6-3"]);
    }

    #[test]
    fn only_a_regular_file_is_read_for_the_runs_it_names_and_no_more_than_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("journal.jsonl");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(regular_text(&file, 4), "0123");
        assert_eq!(regular_text(&dir.path().join("none"), 4), "");
        assert_eq!(regular_text(dir.path(), 4), "", "a directory");
        // A FIFO: opening it would block until a writer came; it is never opened.
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        assert_eq!(regular_text(&fifo, 4), "");
        assert_eq!(regular_text(Path::new("/dev/zero"), 4), "", "a device");
    }

    #[test]
    fn a_killed_runs_directory_goes_unless_the_journal_names_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = format!("nightly-8-{}", std::process::id());
        for name in ["1-5", "2-5", "3-5", "shrink-4-5", own.as_str()] {
            std::fs::create_dir_all(dir.path().join(name).join("logs")).expect("mkdir");
        }
        finished(dir.path(), "0-5");
        let journal = format!(
            r#"{{"record":{{"log":"{}"}}}}"#,
            dir.path().join("2-5/logs/001-abc-repro.log").display()
        );
        let current = dir.path().join("3-5");
        prune_runs(dir.path(), 50, &current, &journal);
        // 1-5 was killed before it found anything; 2-5's probe is in the journal; 3-5 is this run; a
        // shrink of the checkout holds no lock and may be running; the night's head probe is this
        // process's own.
        assert_eq!(
            names(dir.path()),
            ["0-5", "2-5", "3-5", own.as_str(), "shrink-4-5"]
        );
    }
}
