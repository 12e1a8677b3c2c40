//! `cudabisect nightly`: the regression job. It tests the branch head the way `start` judges a probe and
//! keeps, per branch, config and machine, the last good commit and the open regression, written
//! atomically. A new fault is bisected with the whole pipeline from the last good commit; the same bug as
//! the open regression is not bisected again; a clean head closes it.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use crate::classify::{FaultClass, Sameness, Signature};
use crate::config::Config;
use crate::git::Repo;
use crate::report::environment;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ProbeRole, Report, RunResult};

use super::job::{start, write_atomic};
use super::journal::{self, journal_path, Journal, JournaledProbe};
use super::lock::lock_state_dir;
use super::plan::{config_path, RunError, StartOptions};
use super::probe::{Probe, ProbeContext, WorktreeProber};
use super::verdict::is_host_problem;

/// What `nightly` is asked to do.
#[derive(Clone, Debug, Default)]
pub struct NightlyOptions {
    /// The repository.
    pub dir: PathBuf,
    /// Config file (default: bisect.toml at the repository root).
    pub config: Option<PathBuf>,
    /// The branch to test (default: the checkout's current branch).
    pub branch: Option<String>,
    /// Where the state lives (default: `nightly/` in the state directory under the git directory).
    pub state: Option<PathBuf>,
    /// The last good commit, for the first night.
    pub since: Option<String>,
    /// Skip triage and shrinking in the bisection.
    pub no_stages: bool,
}

/// How a night ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NightlyStatus {
    /// First night: the head is clean and becomes the last good commit.
    Baseline,
    /// The head is clean.
    Clean,
    /// The head is clean again: the open regression is closed.
    Fixed,
    /// The head faults and the fault was bisected.
    Regression,
    /// The head still faults with the open regression's bug: not bisected again.
    StillFailing,
    /// The head could not be judged (a build break, the machine), or the bisection could not name a commit.
    Inconclusive,
}

/// The regression that is open.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OpenRegression {
    /// The first bad commit the bisection named (`None` when skips left several).
    pub first_bad: Option<String>,
    /// The bug.
    pub signature: Signature,
    /// The first head that showed it.
    pub open_since: String,
    /// The last head that showed it.
    pub last_failing: String,
    /// Nights it has failed.
    pub nights: u32,
}

/// What is kept between nights, per branch, config and machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NightlyState {
    /// The last head that was clean.
    pub last_good: Option<String>,
    /// The open regression.
    pub open: Option<OpenRegression>,
}

/// The `nightly` section of the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NightlyRecord {
    /// How the night ended.
    pub status: NightlyStatus,
    /// One line saying what happened.
    pub message: String,
    /// The branch tested.
    pub branch: String,
    /// The head tested.
    pub head: String,
    /// The last good commit after this night.
    pub last_good: Option<String>,
    /// The open regression's first bad commit.
    pub first_bad: Option<String>,
    /// The first head that showed the open regression.
    pub open_since: Option<String>,
    /// Nights the open regression has failed.
    pub nights_failing: u32,
    /// For `fixed`: the commits between the last failing head and this one, one of which fixed it.
    pub fixed_range: Option<String>,
    /// The head's signature.
    pub signature: Signature,
}

/// What a night produced: the record, and the bisection's report when there was one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NightlyReport {
    /// The night.
    pub nightly: NightlyRecord,
    /// The bisection, when the night ran one.
    pub bisect: Option<Report>,
}

/// Runs `[nightly] notify` after a `regression` or a `fixed` night, with what happened in its environment:
/// `CUDABISECT_NIGHTLY_STATUS`, `CUDABISECT_NIGHTLY_MESSAGE`, `CUDABISECT_BRANCH`, `CUDABISECT_HEAD`,
/// `CUDABISECT_FIRST_BAD`, and the paths `CUDABISECT_REPORT`, `CUDABISECT_JUNIT`, `CUDABISECT_BUNDLE` when
/// there are such files. Returns a warning when it could not run or failed; nothing otherwise.
pub fn notify(
    opts: &NightlyOptions,
    night: &NightlyReport,
    files: &[(&str, Option<&Path>)],
    cancel: &AtomicBool,
) -> Option<String> {
    let n = &night.nightly;
    if !matches!(n.status, NightlyStatus::Regression | NightlyStatus::Fixed) {
        return None;
    }
    let repo = Repo::open(&opts.dir).ok()?;
    let config = match Config::load(&config_path(&repo, opts.config.as_deref())) {
        Ok(c) => c,
        Err(e) => return Some(format!("[nightly] notify: {e}")),
    };
    let command = config.nightly.notify.clone()?;
    let workdir = repo.workdir();
    let word = serde_json::to_value(n.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut env = vec![
        ("CUDABISECT_NIGHTLY_STATUS".to_string(), word),
        ("CUDABISECT_NIGHTLY_MESSAGE".to_string(), n.message.clone()),
        ("CUDABISECT_BRANCH".to_string(), n.branch.clone()),
        ("CUDABISECT_HEAD".to_string(), n.head.clone()),
        (
            "CUDABISECT_FIRST_BAD".to_string(),
            n.first_bad.clone().unwrap_or_default(),
        ),
    ];
    let bundle = night.bisect.as_ref().and_then(|b| b.bundle.clone());
    for (name, path) in files {
        if let Some(p) = path {
            env.push((name.to_string(), p.display().to_string()));
        }
    }
    if let Some(b) = bundle {
        env.push(("CUDABISECT_BUNDLE".to_string(), b));
    }
    let spec = crate::process::CommandSpec {
        command,
        cwd: workdir,
        env,
        timeout: config.nightly.notify_timeout,
        grace: std::time::Duration::from_secs(2),
    };
    match crate::process::run(&spec, cancel) {
        Ok(run) if run.exit == crate::classify::Exit::Code(0) => None,
        Ok(run) => Some(format!(
            "[nightly] notify {:?}: {}",
            run.exit,
            run.output.lines().last().unwrap_or("")
        )),
        Err(e) => Some(format!("[nightly] notify could not run: {e}")),
    }
}

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
        };
        let ctx = ProbeContext {
            step: 1,
            role: ProbeRole::BadEndpoint,
            remaining: 1,
            estimated_steps: 1,
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
        let mut journaled = JournaledProbe {
            inner: &mut prober,
            journal,
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
                    .map(|c| format!("; first bad commit {}", &c[..12.min(c.len())]))
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
    Ok(NightlyReport {
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
    })
}
