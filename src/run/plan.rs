//! `start`'s input: the options, and the plan built from them before anything is written — revisions
//! resolved, the range listed as git sees it, merge bases to check, implied good commits dropped, the
//! config read and its commands checked. Any problem is a [`RunError`] naming it.

use crate::report::event::PlanNote;
use std::path::{Path, PathBuf};

use git2::Oid;

use std::sync::atomic::AtomicBool;

use crate::config::{CommandLine, Config, ExecutorKind};
use crate::exec::child_env::WorkerSlot;
use crate::git::{GitError, RangeCommit, RangeOptions, Repo};
use crate::host::devices::visible_devices;
use crate::run::probe::workers::worker_slots;

/// What `start` was asked to do.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// A directory inside the repository.
    pub dir: PathBuf,
    /// `GOOD..BAD`.
    pub range: String,
    /// More known-good revisions.
    pub goods: Vec<String>,
    /// Only commits touching these paths are probed.
    pub pathspec: Vec<String>,
    /// Follow only first parents.
    pub first_parent: bool,
    /// Config file; default `bisect.toml` at the repository root (relative paths: against the cwd).
    pub config: Option<PathBuf>,
    /// Where to write the JSON report.
    pub report: Option<PathBuf>,
    /// Leave the probe worktree registered at the end.
    pub keep_worktree: bool,
    /// Clean the worktree before each build, whatever the config says.
    pub clean: bool,
    /// Skip the compute-sanitizer triage.
    pub no_triage: bool,
    /// Skip shrinking the model at the first bad commit.
    pub no_shrink: bool,
    /// Ignore the probe journal of earlier runs (probe every commit again).
    pub fresh: bool,
    /// Write the result as JUnit XML here.
    pub junit: Option<PathBuf>,
    /// A good revision that fails with a bug told apart from the target still counts as good (the nightly
    /// job's bug-on-top case).
    pub goods_may_show_other_bugs: bool,
    /// The probe journal (default: `journal.jsonl` in the state directory under the git directory). The
    /// nightly job keeps it in its own state directory, which CI caches between fresh checkouts.
    pub journal: Option<PathBuf>,
    /// Write the bundle under this directory instead of `[bundle] dir`.
    pub bundle_dir: Option<PathBuf>,
    /// Probes at once, overriding `[search] jobs`.
    pub jobs: Option<crate::config::Jobs>,
    /// The caller already holds the state directory's lock (the nightly job, for its whole night).
    pub state_locked: bool,
    /// Find the fix: the range is OLD..NEW, the fault shows at OLD and is gone at NEW.
    pub find_fix: bool,
    /// The names of the two states (git's `--term-old`/`--term-new`).
    pub terms: crate::report::record::Terms,
}

pub use super::error::RunError;

/// Everything validated before anything is written.
pub struct Plan {
    /// The repository.
    pub repo: Repo,
    /// The config.
    pub config: Config,
    /// Good revisions to probe, as given and resolved (those implied by another good are left out).
    pub goods: Vec<(String, Oid)>,
    /// Every good revision, resolved (for the report).
    pub all_goods: Vec<Oid>,
    /// Merge bases that must be checked good (goods that are not ancestors of the bad commit).
    pub merge_bases: Vec<Oid>,
    /// The bad revision, as given and resolved.
    pub bad: (String, Oid),
    /// The candidates.
    pub range: Vec<RangeCommit>,
    /// Notes for the user about what the plan did (merge bases, implied goods, workers capped).
    pub notes: Vec<PlanNote>,
    /// The workers' slots (none: probes one at a time), from [`worker_slots`].
    pub slots: Vec<WorkerSlot>,
    /// The workers planned on the first worker's GPU: the places the runs after the search may use there.
    pub places: usize,
}

/// Splits `GOOD..BAD`.
pub fn split_range(range: &str) -> Result<(&str, &str), RunError> {
    range
        .split_once("..")
        .filter(|(g, b)| !g.is_empty() && !b.is_empty() && !b.starts_with('.'))
        .ok_or_else(|| RunError::Usage(format!("expected GOOD..BAD, got `{range}`")))
}

/// Opens the repository containing `dir` and its config.
pub fn load(dir: &Path, config: Option<&Path>) -> Result<(Repo, Config), RunError> {
    let repo = Repo::open(dir)?;
    let config = Config::load_at(&repo.workdir(), config)?;
    Ok((repo, config))
}

/// Checks the input and builds the plan, with its workers' slots; writes nothing.
pub fn plan(opts: &StartOptions, cancel: &AtomicBool) -> Result<Plan, RunError> {
    // A refusal speaks the run's own terms (`broken`/`fixed` with --find-fix, --term-old/--term-new).
    let mut plan = plan_in_good_and_bad(opts).map_err(|e| match e {
        RunError::Usage(m) => RunError::Usage(opts.terms.speak(&m)),
        RunError::Git(g) if g.is_usage() && opts.terms != Default::default() => {
            RunError::Usage(opts.terms.speak(&g.to_string()))
        }
        other => other,
    })?;
    // Slurm gives each job its GPUs itself: nothing here is pinned.
    let scheduled = matches!(plan.config.executor.kind, ExecutorKind::Slurm(_));
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (plan.slots, plan.places) = worker_slots(
        &plan.config.workers,
        (scheduled, || visible_devices(cancel)),
        (cores, plan.range.len()),
        &mut plan.notes,
    )
    .map_err(RunError::Usage)?;
    Ok(plan)
}

fn plan_in_good_and_bad(opts: &StartOptions) -> Result<Plan, RunError> {
    check_outputs(opts)?;
    let (good, bad) = split_range(&opts.range)?;
    let repo = Repo::open(&opts.dir)?;
    let bad = (bad.to_string(), repo.resolve(bad)?);
    let mut given = Vec::new();
    for rev in std::iter::once(good).chain(opts.goods.iter().map(String::as_str)) {
        let oid = repo.resolve(rev)?;
        if oid == bad.1 {
            return Err(GitError::SameCommit(rev.to_string()).into());
        }
        given.push((rev.to_string(), oid));
    }
    let mut notes = Vec::new();
    let merge_bases = merge_bases_of(&repo, &given, &bad, &mut notes)?;
    let all_goods: Vec<Oid> = given.iter().map(|(_, o)| *o).collect();
    let goods = goods_to_probe(&repo, &given, &mut notes)?;
    let checked_bases = bases_to_test(&repo, merge_bases, &all_goods, bad.1)?;
    let range_opts = RangeOptions {
        first_parent: opts.first_parent,
        pathspec: opts.pathspec.clone(),
    };
    let range = repo.range(&all_goods, bad.1, &range_opts)?;
    let mut config = Config::load_at(&repo.workdir(), opts.config.as_deref())?;
    for command in config
        .build
        .iter()
        .map(|b| &b.command)
        .chain([&config.repro.command])
    {
        check_command(&repo, bad.1, command, &mut notes)?;
    }
    // The command line's layer over the config: `--clean` and `--jobs`.
    if let Some(b) = config.build.as_mut().filter(|_| opts.clean) {
        b.clean = true;
    }
    config.workers.jobs = opts.jobs.unwrap_or(config.workers.jobs);
    // A native-harness model must be in the bad commit: found out now, not after a three-hour search.
    let shrink = config
        .shrink
        .as_ref()
        .filter(|s| s.enabled && !opts.no_shrink);
    if let Some(crate::config::Harness::Native(model)) = shrink.map(|s| s.named_harness()) {
        if repo.executable_at(bad.1, model).is_none() {
            return Err(RunError::Usage(format!(
                "[shrink] model `{model}` does not exist at the bad commit (or pass --no-shrink)"
            )));
        }
    }
    // A flaky search for a fix would read every statement the other way round (a clean run is the
    // fault's "not shown"), so it is refused before anything runs.
    if opts.find_fix && (config.flaky.asked || config.flaky.endpoint_runs > 1) {
        return Err(RunError::Usage(
            "--find-fix needs a fault that shows on every run: [search] confidence and endpoint-runs (the flaky search) cannot be used with it; remove them for this run"
                .into(),
        ));
    }
    Ok(Plan {
        repo,
        config,
        goods,
        all_goods,
        merge_bases: checked_bases,
        bad,
        range,
        notes,
        slots: Vec::new(),
        places: 0,
    })
}

/// The merge bases to look at for given good commits that are not ancestors of the bad one (noted);
/// a good commit after the bad one, or one with no common history, is refused.
fn merge_bases_of(
    repo: &Repo,
    given: &[(String, Oid)],
    bad: &(String, Oid),
    notes: &mut Vec<PlanNote>,
) -> Result<Vec<Oid>, RunError> {
    let mut merge_bases: Vec<Oid> = Vec::new();
    for (name, oid) in given {
        if repo.is_ancestor(*oid, bad.1)? {
            continue;
        }
        if repo.is_ancestor(bad.1, *oid)? {
            return Err(GitError::Reversed {
                good: name.clone(),
                bad: bad.0.clone(),
            }
            .into());
        }
        let bases = repo.merge_bases(*oid, bad.1)?;
        if bases.is_empty() {
            return Err(GitError::Unrelated {
                good: name.clone(),
                bad: bad.0.clone(),
            }
            .into());
        }
        notes.push(PlanNote::MergeBasesTested {
            good: name.clone(),
            bad: bad.0.clone(),
            bases: bases.iter().map(|b| b.to_string()).collect(),
        });
        merge_bases.extend(bases);
    }
    Ok(merge_bases)
}

/// The given good commits to probe: one that is an ancestor of another good one is implied good (noted),
/// not built and run again.
fn goods_to_probe(
    repo: &Repo,
    given: &[(String, Oid)],
    notes: &mut Vec<PlanNote>,
) -> Result<Vec<(String, Oid)>, RunError> {
    let mut goods: Vec<(String, Oid)> = Vec::new();
    for (name, oid) in given {
        let mut implied = false;
        for (other_name, other) in given {
            if other != oid && repo.is_ancestor(*oid, *other)? {
                notes.push(PlanNote::GoodImplied {
                    good: name.clone(),
                    by: other_name.clone(),
                });
                implied = true;
                break;
            }
        }
        if !implied && !goods.iter().any(|(_, o)| o == oid) {
            goods.push((name.clone(), *oid));
        }
    }
    Ok(goods)
}

/// As git does, a merge base is tested unless it is itself good by implication: given good, or an
/// ancestor of a good commit on the bad commit's own line of history.
fn bases_to_test(
    repo: &Repo,
    merge_bases: Vec<Oid>,
    all_goods: &[Oid],
    bad: Oid,
) -> Result<Vec<Oid>, RunError> {
    let mut checked_bases = Vec::new();
    for base in merge_bases {
        let mut implied = all_goods.contains(&base);
        for g in all_goods {
            if implied {
                break;
            }
            implied = repo.is_ancestor(*g, bad)? && repo.is_ancestor(base, *g)?;
        }
        if !implied && !checked_bases.contains(&base) {
            checked_bases.push(base);
        }
    }
    Ok(checked_bases)
}

/// The outputs asked on the command line, which must be writable when the run ends: refused now.
fn check_outputs(opts: &StartOptions) -> Result<(), RunError> {
    if let Some(report) = &opts.report {
        check_writable_file(report, "--report")?;
    }
    if let Some(dir) = &opts.bundle_dir {
        if dir.exists() && !dir.is_dir() {
            return Err(RunError::Usage(format!(
                "--bundle-dir {} exists and is not a directory",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// A file we will write at the end must be writable now: its directory exists and it is not a directory.
fn check_writable_file(path: &Path, what: &str) -> Result<(), RunError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if path.is_dir() {
        return Err(RunError::Usage(format!(
            "{what} {} is a directory",
            path.display()
        )));
    }
    if !parent.is_dir() {
        return Err(RunError::Usage(format!(
            "{what} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        )));
    }
    Ok(())
}

/// Refuses commands that cannot run: a missing program on PATH, or a relative path that the bad commit
/// does not have as an executable file. Shell lines are left to the shell.
/// The words of a command as far as a plain reading goes: an argv as given, a shell line split the way
/// the shell would when it is one simple command (no operators, no expansions), its leading `VAR=value`
/// assignments left out. `None` for a shell line that is more than that.
fn simple_words(command: &CommandLine) -> Option<Vec<String>> {
    match command {
        CommandLine::Argv(argv) => Some(argv.clone()),
        CommandLine::Shell(line) => {
            if line.contains(['&', '|', ';', '$', '`', '(', ')', '<', '>', '\n', '*', '?']) {
                return None;
            }
            let words = shlex::split(line)?;
            let skip = words
                .iter()
                .take_while(|w| w.contains('=') && !w.starts_with('-') && !w.contains('/'))
                .count();
            Some(words[skip..].to_vec()).filter(|w| !w.is_empty())
        }
    }
}

/// Whether `program` is an interpreter whose first argument is the script it runs.
fn is_interpreter(program: &str) -> bool {
    let name = Path::new(program)
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    matches!(trimmed, "python" | "bash" | "sh" | "zsh")
}

/// A relative file the command runs that the bad commit lacks: said now, with what is wrong (the file
/// sitting untracked in the checkout is the usual cause).
fn missing_at(repo: &Repo, bad: Oid, file: &str) -> Option<String> {
    if repo.executable_at(bad, file).is_some() {
        return None;
    }
    let hint = if repo.workdir().join(file).exists() {
        " (it is in your checkout but not in the commit: commit it, or give its absolute path)"
    } else {
        ""
    };
    Some(format!("`{file}` does not exist at the bad commit{hint}"))
}

fn check_command(
    repo: &Repo,
    bad: Oid,
    command: &CommandLine,
    notes: &mut Vec<PlanNote>,
) -> Result<(), RunError> {
    let Some(words) = simple_words(command) else {
        return Ok(());
    };
    // The checkout's own file by its absolute path runs the same copy at every commit.
    let root = repo.workdir();
    for word in words.iter().take(2) {
        if let Ok(relative) = Path::new(word).strip_prefix(&root) {
            if !relative.starts_with(".git") && Path::new(word).is_file() {
                notes.push(PlanNote::CheckoutCopy {
                    path: word.clone(),
                    relative: relative.display().to_string(),
                });
            }
        }
    }
    // An interpreter's script, relative to the worktree, must be in the commit.
    if let (true, Some(script)) = (is_interpreter(&words[0]), words.get(1)) {
        if !script.starts_with('-') && !script.starts_with('/') {
            if let Some(problem) = missing_at(repo, bad, script) {
                return Err(RunError::Usage(format!(
                    "command `{}`: {problem}",
                    words.join(" ")
                )));
            }
        }
    }
    let CommandLine::Argv(argv) = command else {
        // A shell line's own program: a relative path must be in the commit; a name is looked up on the
        // PATH the run gives it (a per-worktree environment may add one), so it is not judged here.
        let program = &words[0];
        if program.contains('/') && !program.starts_with('/') {
            if let Some(problem) = missing_at(repo, bad, program) {
                return Err(RunError::Usage(format!("command {problem}")));
            }
        }
        return Ok(());
    };
    let program = &argv[0];
    let problem = if program.starts_with('/') {
        match std::fs::metadata(program) {
            Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0 => None,
            Ok(_) => Some("is not executable"),
            Err(_) => Some("does not exist"),
        }
    } else if program.contains('/') {
        match repo.executable_at(bad, program) {
            Some(true) => None,
            Some(false) => Some("is not executable at the bad commit"),
            None => Some("does not exist at the bad commit"),
        }
    } else if which::which(program).is_ok() {
        None
    } else {
        Some("is not on PATH")
    };
    match problem {
        Some(p) => Err(RunError::Usage(format!("command `{program}` {p}"))),
        None => Ok(()),
    }
}
