//! `cudabisect nightly`: the regression job. It tests the branch head the way `start` judges a probe and
//! keeps, per branch, config and machine, the last good commit and the open regression, written
//! atomically. A new fault is bisected with the whole pipeline from the last good commit (a bug on top of
//! an open one: from the last head that showed only the older bug); the same bug as the open regression is
//! not bisected again; a clean head closes it.

use crate::report::record::short_sha;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::classify::{FaultClass, Sameness};
use crate::config::Config;
use crate::git::Repo;
use crate::report::environment;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ProbeRole, RunResult};

use super::ci::nightly_outputs;
use super::job::start;
use super::journal::{self, journal_path, Journal, JournaledProbe};
use super::lock::lock_state_dir;
use super::plan::{config_path, RunError, StartOptions};
use super::probe::{Probe, ProbeContext, WorktreeProber};
use super::verdict::is_host_problem;
use crate::atomic_file::write_atomic;

pub use super::nightly_state::*;

fn state_file(dir: &Path, branch: &str, fingerprint: &str) -> PathBuf {
    let safe: String = branch
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{safe}-{fingerprint}.json"))
}

fn load_state(path: &Path) -> Result<NightlyState, RunError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            RunError::Usage(format!("{}: not a nightly state file: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NightlyState::default()),
        Err(source) => Err(RunError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Runs one night. `Err` only for bad input or a held lock; what the night found is in the record.
pub fn nightly(
    opts: &NightlyOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<NightlyReport, RunError> {
    let repo = Repo::open(&opts.dir)?;
    let branch = match &opts.branch {
        Some(b) => b.clone(),
        None => repo.current_branch().ok_or_else(|| {
            RunError::Usage("the checkout is not on a branch: pass --branch".into())
        })?,
    };
    let head = repo.resolve(&branch)?;
    let since = opts.since.as_deref().map(|s| repo.resolve(s)).transpose()?;
    let config = Config::load(&config_path(&repo, opts.config.as_deref()))?;
    let state_dir = opts
        .state
        .clone()
        .unwrap_or_else(|| repo.state_dir().join("nightly"));
    let fingerprint = journal::fingerprint(&config.text, &environment::fingerprint(cancel));
    let path = state_file(&state_dir, &branch, &fingerprint);
    // The journal lives beside the state, so a night cut short in CI resumes in the next job's fresh
    // checkout from the cached state directory.
    std::fs::create_dir_all(&state_dir).map_err(|source| RunError::Io {
        path: state_dir.clone(),
        source,
    })?;
    let journal_file = journal_path(&state_dir);
    let mut state = load_state(&path)?;
    let last_good = state
        .last_good
        .clone()
        .or_else(|| since.map(|s| s.to_string()));

    // The head, judged on its own (no target): its signature decides the night.
    reporter.event(&Event::StageStarted {
        message: format!("nightly: testing {branch} at {}", &head.to_string()[..12]),
    });
    let record = {
        let _lock = lock_state_dir(&repo.state_dir(), &format!("nightly {branch}"))?;
        let log_dir = repo
            .state_dir()
            .join("runs")
            .join(format!("nightly-{}", super::job::run_id()))
            .join("logs");
        std::fs::create_dir_all(&log_dir).map_err(|source| RunError::Io {
            path: log_dir.clone(),
            source,
        })?;
        let worktree = repo.probe_worktree(&repo.state_dir().join("worktree"))?;
        let mut prober = WorktreeProber {
            worktree: &worktree,
            config: &config,
            log_dir,
            cancel,
            slot: None,
            lingering: Vec::new(),
        };
        let ctx = ProbeContext {
            step: 1,
            role: ProbeRole::BadEndpoint,
            remaining: 1,
            estimated_steps: 1,
            worker: None,
            repeat: None,
        };
        // Through the journal: a night killed after this probe does not redo it, and the bisection that
        // follows reuses it as its bad endpoint (same commit, no target, same fingerprint).
        let (journal, warnings) = Journal::open(&journal_file, &fingerprint).unwrap_or_else(|e| {
            (
                Journal::empty(&journal_file, &fingerprint),
                vec![format!("the probe journal cannot be read ({e})")],
            )
        });
        for message in warnings {
            reporter.event(&Event::Warning { message });
        }
        let journal = std::sync::Mutex::new(journal);
        let mut journaled = JournaledProbe {
            inner: &mut prober,
            journal: &journal,
            warnings: Vec::new(),
            cancel,
        };
        let out = journaled.probe(head, &ctx, None, reporter);
        for message in std::mem::take(&mut journaled.warnings) {
            reporter.event(&Event::Warning { message });
        }
        if let Err(e) = repo.remove_worktree(worktree.path()) {
            reporter.event(&Event::Warning {
                message: format!("the probe worktree was not removed: {e}"),
            });
        }
        out.record
    };
    let sig = record.signature.clone();
    let head_s = head.to_string();
    let mut bisect = None;
    let judged = !matches!(sig.class, FaultClass::BuildFailure) && !is_host_problem(sig.class);
    let (status, message, fixed_range) = if !judged {
        (
            NightlyStatus::Inconclusive,
            format!("the head could not be judged: {}", sig.short()),
            None,
        )
    } else if sig.class == FaultClass::None {
        let first = state.last_good.is_none() && state.open.is_none();
        let closed = state.open.take();
        state.last_good = Some(head_s.clone());
        match closed {
            Some(open) => (
                NightlyStatus::Fixed,
                format!(
                    "fixed: the head is clean again after {} night(s) of {}",
                    open.nights,
                    open.signature.short()
                ),
                Some(format!("{}..{head_s}", open.last_failing)),
            ),
            None if first => (
                NightlyStatus::Baseline,
                format!(
                    "baseline: {} is clean and is the last good commit",
                    &head_s[..12]
                ),
                None,
            ),
            None => (NightlyStatus::Clean, "clean".to_string(), None),
        }
    } else if let Some(open) = state
        .open
        .as_mut()
        .filter(|o| config.match_policy.compare(&o.signature, &sig, "") == Sameness::Same)
    {
        open.nights += 1;
        open.last_failing = head_s.clone();
        (
            NightlyStatus::StillFailing,
            format!(
                "still failing ({} nights): {}{}",
                open.nights,
                sig.short(),
                open.first_bad
                    .as_deref()
                    .map(|c| format!("; first bad commit {}", short_sha(c)))
                    .unwrap_or_default()
            ),
            None,
        )
    } else {
        // Another bug on top of the open one: bisect from the last head that showed only the older bug,
        // when the two are told apart; otherwise from the last good commit.
        let on_top = state
            .open
            .as_ref()
            .filter(|o| config.match_policy.compare(&o.signature, &sig, "") == Sameness::Different);
        let (last_good, goods_may_show_other_bugs) = match on_top {
            Some(o) => (Some(o.last_failing.clone()), true),
            None => (last_good, false),
        };
        let Some(good) = last_good else {
            return Err(RunError::Usage(format!(
                "the head of {branch} faults ({}) and there is no last good commit yet: pass --since REV",
                sig.short()
            )));
        };
        let start_opts = StartOptions {
            dir: opts.dir.clone(),
            range: format!("{good}..{head_s}"),
            config: opts.config.clone(),
            no_triage: opts.no_stages,
            no_shrink: opts.no_stages,
            goods_may_show_other_bugs,
            journal: Some(journal_file.clone()),
            ..StartOptions::default()
        };
        let report = start(&start_opts, reporter, cancel)?;
        let first_bad = report.first_bad.as_ref().map(|c| c.commit.clone());
        let status = match report.result {
            RunResult::Found | RunResult::Ambiguous => NightlyStatus::Regression,
            _ => NightlyStatus::Inconclusive,
        };
        if status == NightlyStatus::Regression {
            state.open = Some(OpenRegression {
                first_bad: first_bad.clone(),
                signature: report.target.clone().unwrap_or_else(|| sig.clone()),
                open_since: head_s.clone(),
                last_failing: head_s.clone(),
                nights: 1,
            });
        }
        let message = format!("regression: {}", report.message);
        bisect = Some(report);
        (status, message, None)
    };
    std::fs::create_dir_all(&state_dir).map_err(|source| RunError::Io {
        path: state_dir.clone(),
        source,
    })?;
    let json = serde_json::to_vec_pretty(&state).map_err(|e| RunError::Usage(e.to_string()))?;
    write_atomic(&path, &json).map_err(|source| RunError::Io {
        path: path.clone(),
        source,
    })?;
    let open = state.open.as_ref();
    let night = NightlyReport {
        nightly: NightlyRecord {
            status,
            message,
            branch,
            head: head_s,
            last_good: state.last_good.clone(),
            first_bad: open.and_then(|o| o.first_bad.clone()),
            open_since: open.map(|o| o.open_since.clone()),
            nights_failing: open.map(|o| o.nights).unwrap_or(0),
            fixed_range,
            signature: sig,
        },
        bisect,
    };
    // What CI reads, and the team's hook, from the config this night ran with.
    nightly_outputs(&night, &config, &repo.workdir(), opts, reporter, cancel);
    Ok(night)
}
