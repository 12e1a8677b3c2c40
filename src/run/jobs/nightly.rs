//! `cudabisect nightly`: the regression job. It tests the branch head the way `start` judges a probe and
//! keeps, per branch, config and machine, the last good commit and the open regression, written
//! atomically. A new fault is bisected with the whole pipeline from the last good commit (a bug on top of
//! an open one: from the last head that showed only the older bug); the same bug as the open regression is
//! not bisected again; a clean head closes it.

use crate::report::record::{short_sha, ProbeRecord};
use git2::Oid;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::classify::{FaultClass, Sameness};
use crate::config::Config;
use crate::git::Repo;
use crate::host::environment;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ProbeRole, RunResult};

use crate::atomic_file::write_atomic;
use crate::exec::executor::Executor;
use crate::run::bisection::bisect;
use crate::run::ci::nightly_outputs;
use crate::run::journal::{self, journal_path, Journal, JournaledProbe};
use crate::run::lock::lock_state_dir;
use crate::run::plan::{RunError, StartOptions};
use crate::run::search::judge::is_host_problem;
use crate::run::search::{probe_alone, SearchInput, Sharing, Worker};
use crate::run::workspace::{Opening, Workspace};
use std::sync::Arc;

pub use crate::run::nightly_state::*;

/// The state file of one repository, branch and config. The branch is escaped injectively (`feature/x`
/// and `feature_x` stay apart); the key holds only what changes verdicts: the repository, and the
/// config's meaning without the sections that judge nothing (`[nightly]`, `[bundle]`, `[triage]`,
/// `[shrink]`) and without comments. A failing `nvidia-smi`, a driver or cudabisect upgrade keep it.
fn state_file(dir: &Path, repo_key: &str, branch: &str, config_text: &str) -> PathBuf {
    let mut safe = String::new();
    for c in branch.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
            safe.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                safe.push_str(&format!("_{b:02x}"));
            }
        }
    }
    let judged = match config_text.parse::<toml::Table>() {
        Ok(mut t) => {
            for section in ["nightly", "bundle", "triage", "shrink"] {
                t.remove(section);
            }
            toml::to_string(&t).unwrap_or_else(|_| config_text.to_string())
        }
        Err(_) => config_text.to_string(),
    };
    let key = journal::config_digest(&format!("{repo_key}\0{judged}"));
    dir.join(format!("{safe}-{}.json", &key[..16]))
}

/// What names the repository across clones: its root commits (the same in every clone, different in
/// another project sharing a `--state` directory), or, in a shallow clone whose root moves every night,
/// its `origin` URL without credentials, else its path.
fn repo_key(repo: &Repo) -> String {
    let out = |args: &[&str]| {
        crate::git::git(&repo.workdir())
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|u| !u.is_empty())
    };
    let shallow = out(&["rev-parse", "--is-shallow-repository"]).as_deref() == Some("true");
    if !shallow {
        if let Some(roots) = out(&["rev-list", "--max-parents=0", "HEAD"]) {
            return format!("roots {roots}");
        }
    }
    match out(&["config", "--get", "remote.origin.url"]) {
        Some(u) => match u.split_once("://") {
            Some((scheme, rest)) => {
                let host = rest.split_once('@').map_or(rest, |(_, h)| h);
                format!("{scheme}://{host}")
            }
            None => u,
        },
        None => repo.workdir().display().to_string(),
    }
}

fn load_state(path: &Path) -> Result<NightlyState, RunError> {
    let unreadable = |e: String| {
        RunError::Usage(format!(
            "{}: not a nightly state file ({e}); remove it to start a new baseline",
            path.display()
        ))
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NightlyState::default()),
        Err(e) => Err(unreadable(e.to_string())),
    }
}

/// A state's commit still on the branch: it exists in this clone and is an ancestor of the head. When it
/// is not (a force-push, a reset behind it), why, for a warning.
fn still_on_branch(repo: &Repo, commit: &str, head: Oid) -> Result<(), &'static str> {
    let oid = Oid::from_str(commit).map_err(|_| "is not a commit id")?;
    if repo.resolve(&oid.to_string()).is_err() {
        return Err("no longer exists (the history was rewritten)");
    }
    match repo.is_ancestor(oid, head) {
        Ok(true) => Ok(()),
        _ => Err("is not an ancestor of the head (the branch was reset or rewritten)"),
    }
}

/// The merge bases of a state's last good commit that still exists but left the branch (a force-push
/// without gc) with the head, when they are older than the head: the part of the history both share.
/// `None` when the commit is on the branch, gone, or the head itself is behind it (a reset).
fn rewritten_but_shared(repo: &Repo, commit: &str, head: Oid) -> Option<Vec<Oid>> {
    let oid = Oid::from_str(commit).ok()?;
    repo.resolve(&oid.to_string()).ok()?;
    if repo.is_ancestor(oid, head).unwrap_or(true) {
        return None;
    }
    let bases = repo.merge_bases(oid, head).ok()?;
    (!bases.is_empty() && !bases.contains(&head)).then_some(bases)
}

/// Runs one night. `Err` only for bad input or a held lock; what the night found is in the record. A
/// night says each warning once (its head probe and its bisection each open the journal, and a full disk
/// fails both).
pub fn nightly(
    opts: &NightlyOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<NightlyReport, RunError> {
    night(
        opts,
        &mut crate::report::event::WarningsOnce::new(reporter),
        cancel,
    )
}

/// The branch the night watches (`--branch`, else the checkout's) by its full name, and its head. A
/// branch by its name (or full ref name), looked up as a reference: `main~2` or a tag is no branch.
fn branch_and_head(repo: &Repo, opts: &NightlyOptions) -> Result<(String, Oid), RunError> {
    let branch = match &opts.branch {
        Some(b) => b.clone(),
        None => repo.current_branch().ok_or_else(|| {
            RunError::Usage("the checkout is not on a branch: pass --branch".into())
        })?,
    };
    repo.branch(&branch).ok_or_else(|| {
        RunError::Usage(format!(
            "--branch {branch} is not a branch (a local or remote-tracking branch name, such as main, origin/main or refs/heads/main)"
        ))
    })
}

/// The state directory (`--state`, else the repository's), created. The journal lives beside the state,
/// so a night cut short in CI resumes in the next job's fresh checkout from the cached directory.
fn state_dir_of(opts: &NightlyOptions, repo: &Repo) -> Result<PathBuf, RunError> {
    let state_dir = opts
        .state
        .clone()
        .unwrap_or_else(|| repo.state_dir().join("nightly"));
    if std::fs::metadata(&state_dir).is_ok_and(|m| !m.is_dir()) {
        return Err(RunError::Usage(format!(
            "--state {} exists and is not a directory",
            state_dir.display()
        )));
    }
    std::fs::create_dir_all(&state_dir).map_err(|e| {
        RunError::Usage(format!(
            "cannot create the state directory {}: {e}",
            state_dir.display()
        ))
    })?;
    Ok(state_dir)
}

/// A clean head: the last good commit now, closing the open regression (fixed), or the first night's
/// baseline, or one more clean night. The night's status, message and the range the fix is in.
fn clean_head(state: &mut NightlyState, head: &str) -> (NightlyStatus, String, Option<String>) {
    let first = state.last_good.is_none() && state.open.is_none();
    let closed = state.open.take();
    state.last_good = Some(head.to_string());
    match closed {
        Some(open) => (
            NightlyStatus::Fixed,
            format!(
                "the head is clean again after {} night(s) of {}",
                open.nights,
                open.signature.short()
            ),
            Some(format!("{}..{head}", open.last_failing)),
        ),
        None if first => (
            NightlyStatus::Baseline,
            format!("{} is clean and is the last good commit", short_sha(head)),
            None,
        ),
        None => (NightlyStatus::Clean, "the head is clean".to_string(), None),
    }
}

fn night(
    opts: &NightlyOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<NightlyReport, RunError> {
    let repo = Repo::open(&opts.dir)?;
    let (branch, head) = branch_and_head(&repo, opts)?;
    let since = opts.since.as_deref().map(|s| repo.resolve(s)).transpose()?;
    let config = crate::config::Config::load_at(&repo.workdir(), opts.config.as_deref())?;
    check_notify(&config, &repo)?;
    let state_dir = state_dir_of(opts, &repo)?;
    let path = state_file(&state_dir, &repo_key(&repo), &branch, &config.text);
    let fingerprint = journal::fingerprint(
        &config.text,
        &journal::outside_programs(&config, &repo.workdir()),
        &environment::fingerprint(cancel),
    );
    // One lock for the whole night: no second night slips in between the head probe and the bisection.
    let _lock = lock_state_dir(&repo.state_dir(), &format!("nightly {branch}"))?;
    let journal_file = journal_path(&state_dir);
    let mut state = load_state(&path)?;
    let lost_last_good = repair_state(&repo, &mut state, (head, since.is_some()), &path, reporter);
    if state == NightlyState::default() && !path.exists() {
        say_new_state(&path, &state_dir, &branch, reporter);
    }
    let last_good = state
        .last_good
        .clone()
        .or_else(|| since.map(|s| s.to_string()));
    let of = NightOf {
        path: &path,
        branch: &branch,
        config: &config,
        repo: &repo,
        opts,
    };

    // The head, judged on its own (no target): its signature decides the night.
    reporter.event(&Event::StageBegan {
        stage: crate::report::event::Stage::NightlyHead {
            branch: branch.to_string(),
            commit: head.to_string(),
        },
    });
    let (record, executor) = probe_head(
        &repo,
        &config,
        head,
        (&journal_file, &fingerprint),
        reporter,
        cancel,
    )?;
    let sig = record.signature.clone();
    let head_s = head.to_string();
    let night = judge_the_night(
        &of,
        (&mut state, &sig, &head_s),
        (last_good, lost_last_good),
        &journal_file,
        reporter,
        cancel,
    )?;
    Ok(finish_night(
        night,
        (&state, head_s, sig),
        (&of, executor.as_ref()),
        reporter,
        cancel,
    ))
}

/// What the head's signature makes of the night: inconclusive (it could not be judged), clean, still
/// failing the open regression, or a new one, bisected.
fn judge_the_night(
    of: &NightOf,
    (state, sig, head): (&mut NightlyState, &crate::classify::Signature, &str),
    last_good: (Option<String>, bool),
    journal_file: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Night, RunError> {
    let mut bisect = None;
    let judged = !matches!(sig.class, FaultClass::BuildFailure) && !is_host_problem(sig.class);
    let (status, message, fixed_range) = if !judged {
        (
            NightlyStatus::Inconclusive,
            format!("the head could not be judged: {}", sig.short()),
            None,
        )
    } else if sig.class == FaultClass::None {
        clean_head(state, head)
    } else if let Some(open) = state
        .open
        .as_mut()
        .filter(|o| of.config.match_policy.compare(&o.signature, sig, "") == Sameness::Same)
    {
        still_failing(open, sig, head)
    } else {
        let bisected = new_regression(
            of,
            (state, sig, head),
            last_good,
            journal_file,
            reporter,
            cancel,
        )?;
        bisect = bisected.3;
        (bisected.0, bisected.1, bisected.2)
    };
    Ok(Night {
        status,
        message,
        fixed_range,
        bisect,
    })
}

/// The open regression shows again tonight: one more night of it. The night's status and message.
fn still_failing(
    open: &mut crate::run::nightly_state::OpenRegression,
    sig: &crate::classify::Signature,
    head: &str,
) -> (NightlyStatus, String, Option<String>) {
    open.nights += 1;
    open.last_failing = head.to_string();
    (
        NightlyStatus::StillFailing,
        format!(
            "{} nights: {}{}",
            open.nights,
            sig.short(),
            open.first_bad
                .as_deref()
                .map(|c| format!("; first bad commit {}", short_sha(c)))
                .unwrap_or_default()
        ),
        None,
    )
}

/// A fault that is not the open one: bisected from the last head that showed only the open, older bug
/// when the two are told apart (another bug on top), else from the last good commit (`last_good`; lost
/// to rewritten history when `lost`). The night's status, message, and the bisection's report.
fn new_regression(
    of: &NightOf,
    (state, sig, head): (&mut NightlyState, &crate::classify::Signature, &str),
    (last_good, lost_last_good): (Option<String>, bool),
    journal_file: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<
    (
        NightlyStatus,
        String,
        Option<String>,
        Option<crate::report::record::Report>,
    ),
    RunError,
> {
    // Another bug on top of the open one: bisect from the last head that showed only the older bug,
    // when the two are told apart; otherwise from the last good commit.
    let on_top = state
        .open
        .as_ref()
        .filter(|o| of.config.match_policy.compare(&o.signature, sig, "") == Sameness::Different);
    let (last_good, goods_may_show_other_bugs) = match on_top {
        Some(o) => (Some(o.last_failing.clone()), true),
        None => (last_good.clone(), false),
    };
    match last_good {
        // A first night that faults: nothing was ever good here, and only the user knows since when.
        None if !lost_last_good => Err(RunError::Usage(format!(
            "the head of {} faults ({}) and there is no last good commit yet: pass --since REV",
            of.branch,
            sig.short()
        ))),
        // The last good commit was lost to rewritten history (said above): this night is
        // inconclusive, not an error that repeats every night; the state no longer holds it.
        None => Ok((
            NightlyStatus::Inconclusive,
            format!(
                "the head of {} faults ({}) and there is no last good commit to bisect from: pass --since REV",
                of.branch,
                sig.short()
            ),
            None,
            None,
        )),
        Some(good) => {
            let (status, report) = bisect_tonight(
                of.opts,
                (&good, head, goods_may_show_other_bugs),
                journal_file,
                (state, sig),
                reporter,
                cancel,
            )?;
            Ok((status, report.message.clone(), None, Some(report)))
        }
    }
}

/// Tonight's fault bisected from `good` to the head with `start` (its journal the night's, so the head's
/// probe is its bad end); a regression found opens in the state. The night's status and the report.
fn bisect_tonight(
    opts: &NightlyOptions,
    (good, head, goods_may_show_other_bugs): (&str, &str, bool),
    journal_file: &Path,
    (state, sig): (&mut NightlyState, &crate::classify::Signature),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<(NightlyStatus, crate::report::record::Report), RunError> {
    let start_opts = StartOptions {
        dir: opts.dir.clone(),
        range: format!("{good}..{head}"),
        config: opts.config.clone(),
        no_triage: opts.no_stages,
        no_shrink: opts.no_stages,
        goods_may_show_other_bugs,
        journal: Some(journal_file.to_path_buf()),
        state_locked: true,
        ..StartOptions::default()
    };
    let report = bisect(&start_opts, reporter, cancel)?;
    let status = match report.result {
        RunResult::Found | RunResult::Ambiguous => NightlyStatus::Regression,
        _ => NightlyStatus::Inconclusive,
    };
    if status == NightlyStatus::Regression {
        state.open = Some(OpenRegression {
            first_bad: report.first_bad.as_ref().map(|c| c.commit.clone()),
            signature: report.target.clone().unwrap_or_else(|| sig.clone()),
            open_since: head.to_string(),
            last_failing: head.to_string(),
            nights: 1,
        });
    }
    Ok((status, report))
}

/// A notify hook that cannot run is found before the night, not after it.
fn check_notify(config: &crate::config::Config, repo: &Repo) -> Result<(), RunError> {
    if let Some(crate::config::CommandLine::Argv(argv)) = &config.nightly.notify {
        let program = &argv[0];
        let runs = if program.contains('/') {
            let path = Path::new(program);
            let path = if path.is_absolute() {
                path.to_path_buf()
            } else {
                repo.workdir().join(path)
            };
            path.is_file()
        } else {
            which::which(program).is_ok()
        };
        if !runs {
            return Err(RunError::Usage(format!(
                "[nightly] notify: `{program}` cannot be run (not found)"
            )));
        }
    }
    Ok(())
}

/// Mends the kept state against tonight's history: a last good commit or an open regression's first bad
/// commit that left the branch is a stale fact, dropped and said (never reported as the old answer); a
/// force-push without gc is bisected from the merge base. Returns whether the last good commit was lost
/// (a faulting head is then inconclusive, not an error).
fn repair_state(
    repo: &Repo,
    state: &mut NightlyState,
    (head, since): (Oid, bool),
    path: &Path,
    reporter: &mut dyn Reporter,
) -> bool {
    let warn =
        |reporter: &mut dyn Reporter, message: String| reporter.event(&Event::Warning { message });
    let mut lost_last_good = false;
    if let Some(lg) = state.last_good.clone() {
        if let Some(bases) = rewritten_but_shared(repo, &lg, head) {
            // A force-push without gc: the last good commit is off the branch, but the history before
            // the rewrite is shared. A fault tonight is bisected from there: the search tests the merge
            // base first, as any good commit on another line.
            warn(
                reporter,
                format!(
                    "the last good commit {} kept in {} is not an ancestor of the head (the branch was rewritten): a fault tonight is bisected from its merge base with the head ({})",
                    short_sha(&lg),
                    path.display(),
                    bases
                        .iter()
                        .map(|b| short_sha(&b.to_string()).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        } else if let Err(why) = still_on_branch(repo, &lg, head) {
            lost_last_good = true;
            warn(
                reporter,
                format!(
                    "the last good commit {} kept in {} {why}: {}",
                    short_sha(&lg),
                    path.display(),
                    if since {
                        "using --since instead"
                    } else {
                        "a clean head becomes the new baseline; pass --since REV to bisect a fault before then"
                    }
                ),
            );
            state.last_good = None;
        }
    }
    // An open regression whose first bad commit left the branch is a stale fact: it is dropped, and a
    // fault tonight is bisected afresh (from --since or the last good commit), never reported as the
    // old answer.
    let stale_first_bad = state.open.as_ref().and_then(|open| {
        let fb = open.first_bad.as_deref()?;
        still_on_branch(repo, fb, head)
            .err()
            .map(|why| (fb.to_string(), why))
    });
    if let Some((fb, why)) = stale_first_bad {
        warn(
            reporter,
            format!(
                "the open regression's first bad commit {} {why}: the regression is closed in {}, and a fault tonight is bisected again",
                short_sha(&fb),
                path.display()
            ),
        );
        state.open = None;
        lost_last_good |= state.last_good.is_none();
    }
    if let Some(open) = state.open.as_mut() {
        if still_on_branch(repo, &open.last_failing, head).is_err() {
            // The open bug is still known by its signature; only its last failing head is gone.
            open.last_failing = head.to_string();
        }
    }
    lost_last_good
}

/// A first night on a branch whose other state files exist (another config gave them): said, so a
/// changed config is not mistaken for a lost history.
fn say_new_state(path: &Path, state_dir: &Path, branch: &str, reporter: &mut dyn Reporter) {
    let prefix = path
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .rsplit_once('-')
                .map(|(b, _)| format!("{b}-"))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let others = std::fs::read_dir(state_dir)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(&prefix) && n.ends_with(".json") && n.len() == prefix.len() + 21
                })
                .count()
        })
        .unwrap_or(0);
    if others > 0 {
        reporter.event(&Event::NightlyNewState {
            branch: branch.to_string(),
            others,
            state_dir: state_dir.display().to_string(),
        });
    }
}

/// The head, probed on its own and judged with no target (its signature decides the night), through the
/// journal: a night killed after this probe does not redo it, and the bisection that follows reuses it
/// as its bad end; with it, the executor of the night's workspace, which the notify hook runs through.
/// `Err` when Ctrl-C stopped it: nothing is decided, the state is left as it was.
fn probe_head(
    repo: &Repo,
    config: &crate::config::Config,
    head: Oid,
    (journal_file, fingerprint): (&Path, &str),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<(ProbeRecord, Arc<dyn Executor>), RunError> {
    // The night holds the state lock already.
    let ws = Workspace::open(
        repo,
        config,
        Opening {
            lock: None,
            prefix: "nightly-",
            log_dir: None,
        },
    )?;
    ws.prune_runs();
    let worktree = ws.worktree("worktree")?;
    let mut prober = ws.prober(&worktree, config, cancel);
    // Through the journal: a night killed after this probe does not redo it, and the bisection that
    // follows reuses it as its bad endpoint (same commit, no target, same fingerprint).
    let journal = std::sync::Mutex::new(night_journal(journal_file, fingerprint, reporter));
    let mut journaled = JournaledProbe {
        inner: &mut prober,
        journal: &journal,
        warnings: Vec::new(),
        cancel,
        log_dir: None,
    };
    // The head is judged on its own (no target yet): what it shows is tonight's fault.
    let input = SearchInput {
        range: &[],
        bad: ("HEAD", head),
        goods: &[],
        merge_bases: &[],
        policy: &config.match_policy,
        goods_may_show_other_bugs: false,
        flaky: config.flaky,
        finding_fix: false,
        sharing: Sharing::NONE,
        steps_before: 0,
        checkout: None,
    };
    let worker = Worker {
        probe: &mut journaled,
        stop: cancel,
    };
    let probed = probe_alone(&input, (head, ProbeRole::Head), worker, reporter, cancel);
    for message in std::mem::take(&mut journaled.warnings) {
        reporter.event(&Event::Warning { message });
    }
    drop(journaled);
    drop(prober);
    let executor = ws.executor.clone();
    ws.close(reporter);
    // A stopped head says nothing: nothing is decided and the state is left as it was.
    let record = match probed {
        Ok(record) if !cancel.load(std::sync::atomic::Ordering::SeqCst) => record,
        _ => return Err(RunError::Interrupted),
    };
    Ok((record, executor))
}

/// The night's journal beside its state (one that cannot be read is said, and the night starts it
/// afresh).
fn night_journal(path: &Path, fingerprint: &str, reporter: &mut dyn Reporter) -> Journal {
    let (journal, warnings) = Journal::open(path, fingerprint).unwrap_or_else(|e| {
        (
            Journal::empty(path, fingerprint),
            vec![format!("the probe journal cannot be read ({e})")],
        )
    });
    for message in warnings {
        reporter.event(&Event::Warning { message });
    }
    journal
}

/// How a night was decided, before it is written.
struct Night {
    status: NightlyStatus,
    message: String,
    fixed_range: Option<String>,
    bisect: Option<crate::report::record::Report>,
}

/// What a night is of: its state file, branch, config, repository and options.
struct NightOf<'a> {
    path: &'a Path,
    branch: &'a str,
    config: &'a Config,
    repo: &'a Repo,
    opts: &'a NightlyOptions,
}

/// Writes the state (a failure is a warning: the night's outputs still go out), announces the night and
/// writes what CI reads.
fn finish_night(
    night: Night,
    (state, head, sig): (&NightlyState, String, crate::classify::Signature),
    (of, executor): (&NightOf, &dyn Executor),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> NightlyReport {
    let NightOf {
        path,
        branch,
        config,
        repo,
        opts,
    } = *of;
    let written = serde_json::to_vec_pretty(state)
        .map_err(std::io::Error::other)
        .and_then(|json| write_atomic(path, &json));
    if let Err(e) = written {
        reporter.event(&Event::Warning {
            message: format!(
                "the nightly state was not saved ({}: {e}): the next night will not know this one",
                path.display()
            ),
        });
    }
    let open = state.open.as_ref();
    let report = NightlyReport {
        nightly: NightlyRecord {
            status: night.status,
            message: night.message,
            branch: branch.to_string(),
            head,
            last_good: state.last_good.clone(),
            first_bad: open.and_then(|o| o.first_bad.clone()),
            open_since: open.map(|o| o.open_since.clone()),
            nights_failing: open.map(|o| o.nights).unwrap_or(0),
            fixed_range: night.fixed_range,
            signature: sig,
        },
        bisect: night.bisect,
    };
    reporter.event(&Event::Nightly {
        record: Box::new(report.nightly.clone()),
    });
    // What CI reads, and the team's hook, from the config this night ran with.
    nightly_outputs(
        &report,
        config,
        (&repo.workdir(), executor),
        opts,
        reporter,
        cancel,
    );
    report
}
