//! One bisection end to end, as `start` runs it and `nightly` runs it for a regression: plan, lock,
//! search, the stages at the first bad commit, the report and the bundle. The result is written as soon as it is known, the report and the `finished` event come
//! before any fallible cleanup, and cleanup failures are warnings.

use crate::report::event::PlanNote;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::host::environment;
use crate::report::event::{Event, Reporter};
use crate::report::record::short_sha;
use crate::report::record::{CommitRef, Report, RunResult, FORMAT_VERSION};

use crate::atomic_file::write_atomic;
use crate::config::{ExecutorKind, Jobs};
use crate::exec::child_env::WorkerSlot;
use crate::host::devices::visible_devices;
use crate::run::cancel::with_cancel_passed_on;
use crate::run::ci::start_outputs;
use crate::run::journal::{self, Journal, JournaledProbe};
use crate::run::outputs::{bundle_root, write_bundle};
use crate::run::plan::{plan, Plan, RunError, StartOptions};
use crate::run::probe::prober::WorktreeProber;
use crate::run::probe::workers::plan_slots;
use crate::run::search::{
    search_with_workers, SearchEnd, SearchInput, SearchOutcome, Sharing, Worker,
};
use crate::run::stages::pipeline::{
    cross_check_beside_stages, stages_beside_environment, Early, StageChoice, StageContext, Staged,
};
use crate::run::workspace::{Opening, Workspace};

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs a whole bisection. `Err` only for problems found before anything ran (bad input, a held lock);
/// once the search starts, every outcome is in the report.
pub fn bisect(
    opts: &StartOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Report, RunError> {
    let mut plan = plan(opts)?;
    apply_options(&mut plan, opts);
    let slots = worker_slots(&plan, cancel)?;
    let before = Before::of(&plan, opts);
    let mut ws = open_workspace((&plan.repo, &plan.config), opts)?;
    let (state_dir, run_dir, log_dir) =
        (ws.state_dir.clone(), ws.run_dir.clone(), ws.log_dir.clone());
    let worktree = ws.worktree("worktree")?;
    let candidates = plan.range.len();
    let slots = slots.unwrap_or_default();
    let (slots, places) = settle_slots((&mut plan.notes, candidates), slots, &state_dir)?;
    // Each further worker has a worktree of its own (sharing the object store), so its build directory
    // stays warm from probe to probe; all go at the end unless --keep-worktree.
    let extra_worktrees = extra_worktrees(&ws, &slots)?;
    let stops: Vec<AtomicBool> = slots.iter().map(|_| AtomicBool::new(false)).collect();
    let warm_pool = warm_pool_for(&plan, &run_dir);
    // One prober per worker: its worktree, devices, stop flag and warm interpreter.
    let worker = |worktree, stop, slot: Option<&WorkerSlot>| WorktreeProber {
        slot: slot.cloned(),
        warm: warm_pool.as_ref(),
        ..ws.prober(worktree, &plan.config, stop)
    };
    let mut prober = worker(&worktree, stops.first().unwrap_or(cancel), slots.first());
    let mut others: Vec<WorktreeProber> = extra_worktrees
        .iter()
        .zip(slots.iter().skip(1))
        .zip(stops.iter().skip(1))
        .map(|((w, slot), stop)| worker(w, stop, Some(slot)))
        .collect();
    announce(&plan, opts, &run_dir, reporter);
    let gauge = crate::host::gpu_memory::NvidiaSmiGauge::default();
    let input = search_input(&plan, opts, &gauge, places);
    let (journal, journal_path, fingerprint) =
        open_journal(&plan, opts, &state_dir, reporter, cancel);
    let (outcome, staged) = search_and_cross_check(
        Searching {
            plan: &plan,
            opts,
            input: &input,
            journal: Some(journal),
            journal_path: &journal_path,
            fingerprint: &fingerprint,
            log_dir: &log_dir,
            stops: &stops,
        },
        (&mut prober, &mut others),
        &run_dir,
        reporter,
        cancel,
    );
    let at_once = outcome.at_once;
    let (mut report, first_bad) = report_of(outcome, &plan, opts, &run_dir);
    // The result is on disk before anything else can fail.
    save_report(&report, &run_dir, None, reporter);
    // A fix is clean at the commit found: there is nothing there to triage, shrink or hand off.
    if let Some(oid) = first_bad.filter(|_| !opts.find_fix) {
        let at = (oid, at_once, staged.filter(|s| s.commit == oid));
        let (workers, stage) = ((&prober, others.as_slice()), (run_dir.as_path(), cancel));
        at_the_first_bad((&plan, opts), workers, at, stage, &mut report, reporter);
    }
    report.interrupted |= cancel.load(Ordering::SeqCst);
    finish(&mut report, (&plan, opts), &before, &run_dir, reporter);
    if opts.keep_worktree {
        ws.keep_worktrees();
    }
    ws.close(reporter);
    Ok(report)
}

/// The run's workspace, locked for this range unless the caller holds the lock, old runs pruned.
fn open_workspace<'p>(
    (repo, config): (&'p crate::git::Repo, &'p crate::config::Config),
    opts: &StartOptions,
) -> Result<Workspace<'p>, RunError> {
    let lock_name = format!("start {}", opts.range);
    let ws = Workspace::open(
        repo,
        config,
        Opening {
            lock: (!opts.state_locked).then_some(lock_name.as_str()),
            ..Opening::default()
        },
    )?;
    ws.prune_runs();
    Ok(ws)
}

/// The workers the range needs (the plan notes a cut), each with its scratch directories; and the places
/// planned on the first worker's GPU, which the runs after the search may use where that GPU holds them.
fn settle_slots(
    (notes, candidates): (&mut Vec<PlanNote>, usize),
    mut slots: Vec<WorkerSlot>,
    state_dir: &Path,
) -> Result<(Vec<WorkerSlot>, usize), RunError> {
    let places = slots.first().map_or(0, |first| {
        slots.iter().filter(|s| s.devices == first.devices).count()
    });
    cap_workers(notes, candidates, &mut slots);
    give_scratch_dirs(&mut slots, state_dir)?;
    Ok((slots, places))
}

/// Which stages the options ask for.
fn stage_choice(opts: &StartOptions) -> StageChoice {
    StageChoice {
        triage: !opts.no_triage,
        shrink: !opts.no_shrink,
    }
}

/// Triage and the shrink at the first bad commit (`at`: it, the probes the GPU held at once, and what the
/// stages started beside the cross-check gave there), then the bundle: in `prober`'s worktree, the shrink
/// in the second worker's when the GPU held two probes at once, and its check at the parent in the
/// third's, beside its final check, when it held three.
fn at_the_first_bad(
    (plan, opts): (&Plan, &StartOptions),
    (prober, others): (&WorktreeProber, &[WorktreeProber]),
    (oid, at_once, staged): (Oid, usize, Option<Staged>),
    (run_dir, cancel): (&Path, &AtomicBool),
    report: &mut Report,
    reporter: &mut dyn Reporter,
) {
    let beside = others.first().filter(|_| at_once >= 2);
    let spare = others.get(1).filter(|_| at_once >= 3);
    let ctx = StageContext {
        config: &plan.config,
        prober,
        beside,
        spare,
        run_dir,
        cancel,
        at_once: u32::try_from(at_once).unwrap_or(1),
    };
    let choice = stage_choice(opts);
    stages_then_bundle(&ctx, (plan, opts), (choice, oid, staged), report, reporter);
}

/// The user's checkout as the run found it (its stash, refs, index and files, the run's own outputs
/// left out): what the run must leave as it was.
struct Before {
    stash: Option<Oid>,
    own_outputs: Vec<PathBuf>,
    user: crate::git::UserState,
}

impl Before {
    fn of(plan: &Plan, opts: &StartOptions) -> Self {
        let own_outputs = own_outputs(plan, opts);
        Before {
            stash: plan.repo.stash_tip(),
            user: plan.repo.user_state(&own_outputs),
            own_outputs,
        }
    }
}

/// A worktree of its own for each worker after the first.
fn extra_worktrees(
    ws: &Workspace,
    slots: &[WorkerSlot],
) -> Result<Vec<crate::git::ProbeWorktree>, RunError> {
    slots
        .iter()
        .skip(1)
        .map(|slot| ws.worktree(&format!("worktree-{}", slot.worker)))
        .collect()
}

/// The run's end: what it changed of the user's checkout said (a warning and a note), the report saved
/// (and written where `--report` asks), the CI outputs written, and the last event.
fn finish(
    report: &mut Report,
    (plan, opts): (&Plan, &StartOptions),
    before: &Before,
    run_dir: &Path,
    reporter: &mut dyn Reporter,
) {
    let was = (before.stash, &before.user);
    for message in what_the_run_changed(plan, was, &before.own_outputs) {
        reporter.event(&Event::Warning {
            message: message.clone(),
        });
        report.notes.push(message);
    }
    save_report(report, run_dir, opts.report.as_deref(), reporter);
    start_outputs(report, &plan.config, opts.junit.as_deref(), reporter);
    reporter.event(&Event::Finished {
        report: Box::new(report.clone()),
    });
}

/// Warm interpreters for a Python repro and a Python build, per worker, ended with the run (a pool that
/// cannot be set up means cold runs, as before).
fn warm_pool_for(plan: &Plan, run_dir: &Path) -> Option<crate::run::probe::warm::WarmPool> {
    let build_warm = plan.config.build.as_ref().is_some_and(|b| b.warm);
    (plan.config.repro.warm || build_warm)
        .then(|| {
            crate::run::probe::warm::WarmPool::new(
                &run_dir.join("warm"),
                plan.config.repro.preload.clone(),
            )
            .ok()
        })
        .flatten()
}

/// The run's first events: what it bisects, and the plan's notes.
fn announce(plan: &Plan, opts: &StartOptions, run_dir: &Path, reporter: &mut dyn Reporter) {
    reporter.event(&Event::RunStarted {
        candidates: plan.range.len(),
        run_dir: run_dir.display().to_string(),
        launch_blocking: plan.config.repro.launch_blocking,
        terms: opts.terms.clone(),
    });
    for note in &plan.notes {
        reporter.event(&Event::Planned { note: note.clone() });
    }
}

/// The search's input from the plan: its range and ends, the same-bug policy, and how the GPU is shared
/// (`places`: the workers planned on the first worker's GPU).
fn search_input<'a>(
    plan: &'a Plan,
    opts: &StartOptions,
    gauge: &'a dyn crate::host::gpu_memory::MemoryGauge,
    places: usize,
) -> SearchInput<'a> {
    SearchInput {
        range: &plan.range,
        bad: (&plan.bad.0, plan.bad.1),
        goods: &plan.goods,
        merge_bases: &plan.merge_bases,
        policy: &plan.config.match_policy,
        goods_may_show_other_bugs: opts.goods_may_show_other_bugs,
        flaky: plan.config.flaky,
        fix_of: None,
        steps_before: 0,
        sharing: Sharing {
            gauge,
            asked: matches!(plan.config.workers.jobs, Jobs::Count(_))
                || plan.config.workers.devices.is_some(),
            places,
        },
    }
}

/// What the search of `start` runs with, besides its workers.
struct Searching<'a> {
    plan: &'a Plan,
    opts: &'a StartOptions,
    input: &'a SearchInput<'a>,
    /// The journal (until the search takes it), its path and the fingerprint of what judges a probe.
    journal: Option<Journal>,
    journal_path: &'a Path,
    fingerprint: &'a str,
    log_dir: &'a Path,
    /// The workers' stop flags, in worker order.
    stops: &'a [AtomicBool],
}

/// The search (or the search for a fix) over every worker, each journaled, then, when probes ran side by
/// side or the ends were old and new, the cross-check of its answer on the first worker and, where there is
/// room, a second (with the stages `early` names started beside it, where there is room).
fn search_and_cross_check<'w>(
    mut s: Searching,
    (prober, others): (&mut WorktreeProber<'w>, &mut [WorktreeProber<'w>]),
    run_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> (SearchOutcome, Option<Staged>) {
    let outcome = search(&mut s, (&mut *prober, &mut *others), reporter, cancel);
    if others.is_empty() && !s.opts.find_fix {
        return (outcome, None);
    }
    // A worker stopped because its answer no longer mattered is free again.
    for stop in s.stops {
        stop.store(cancel.load(Ordering::SeqCst), Ordering::SeqCst);
    }
    cross_check_answer(&s, outcome, (prober, others), run_dir, reporter, cancel)
}

/// The search (or the search for a fix) over every worker, each journaled; the journal's warnings said.
fn search<'w>(
    s: &mut Searching,
    (prober, others): (&mut WorktreeProber<'w>, &mut [WorktreeProber<'w>]),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> SearchOutcome {
    let (plan, input, stops) = (s.plan, s.input, s.stops);
    let journal = s
        .journal
        .take()
        .unwrap_or_else(|| Journal::empty(s.journal_path, s.fingerprint));
    let journal = std::sync::Mutex::new(journal);
    let mut journaled: Vec<JournaledProbe> = std::iter::once(prober)
        .chain(others.iter_mut())
        .map(|p| {
            let stop = p.cancel;
            JournaledProbe {
                inner: p,
                journal: &journal,
                warnings: Vec::new(),
                cancel: stop,
                log_dir: Some(s.log_dir.to_path_buf()),
            }
        })
        .collect();
    let outcome = if s.opts.find_fix {
        with_cancel_passed_on(cancel, stops, || {
            crate::run::find_fix::search_for_fix(plan, input, &mut journaled, reporter, cancel)
        })
    } else {
        let mut workers: Vec<Worker> = journaled
            .iter_mut()
            .map(|j| {
                let stop = j.cancel;
                Worker { probe: j, stop }
            })
            .collect();
        with_cancel_passed_on(cancel, stops, || {
            search_with_workers(input, &mut workers, reporter, cancel)
        })
    };
    for message in journaled.into_iter().flat_map(|j| j.warnings) {
        reporter.event(&Event::Warning { message });
    }
    outcome
}

/// The cross-check of the search's answer on the first worker (and the next free one, which runs the
/// parent beside it where the GPU has the room); the stages start at that answer beside it (in `run_dir`)
/// where three more workers and the GPU's room allow (one for triage, one for the shrink, one for its
/// check at the parent).
fn cross_check_answer<'w>(
    s: &Searching,
    outcome: SearchOutcome,
    (prober, others): (&mut WorktreeProber<'w>, &mut [WorktreeProber<'w>]),
    run_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> (SearchOutcome, Option<Staged>) {
    let (plan, opts) = (s.plan, s.opts);
    let culprit = match outcome.end {
        SearchEnd::Found(c) if !opts.find_fix && outcome.flaky.is_none() => Some(c),
        _ => None,
    };
    let at_once = outcome.at_once;
    let early = culprit.filter(|_| others.len() >= 3 && at_once >= 4);
    let spec = early.map(|_| report_of(outcome.clone(), plan, opts, run_dir).0);
    // The stages' three workers first; the next one runs the parent beside the first bad commit when the
    // GPU holds them both too.
    let (stage_workers, spare) = others.split_at_mut(if early.is_some() { 3 } else { 0 });
    let room = if early.is_some() { 5 } else { 2 };
    let beside = spare.first_mut().filter(|_| at_once >= room);
    let checking = 1 + usize::from(beside.is_some());
    let cross_check = |reporter: &mut dyn Reporter, disagreed: &dyn Fn()| {
        with_cancel_passed_on(cancel, s.stops, || {
            crate::run::cross_check::cross_checked(
                outcome,
                opts,
                plan,
                s.input,
                s.journal_path,
                s.fingerprint,
                s.log_dir,
                (prober, beside),
                (reporter, disagreed),
                cancel,
            )
        })
    };
    match (early, spec) {
        (Some(culprit), Some(spec)) => {
            let early = Early {
                config: &plan.config,
                choice: stage_choice(opts),
                run_dir,
                workers: stage_workers,
                // The cross-check's runs hold as many of the GPU's places.
                at_once: u32::try_from(at_once - checking).unwrap_or(1),
                bundle: plan.config.bundle.enabled,
            };
            cross_check_beside_stages(early, (culprit, spec), cross_check, reporter, cancel)
        }
        _ => (cross_check(reporter, &|| {}), None),
    }
}

/// The report of a search's outcome, and the first bad commit it names (the fix, with `--find-fix`, with
/// what to know before backporting it).
fn report_of(
    outcome: SearchOutcome,
    plan: &Plan,
    opts: &StartOptions,
    run_dir: &Path,
) -> (Report, Option<Oid>) {
    let mut report = empty_report(plan, opts, run_dir);
    report.target = outcome.target;
    report.probes = outcome.probes;
    report.other_bugs = outcome.other_bugs;
    report.flaky = outcome.flaky;
    let first_bad = fill_result(plan, &outcome.end, &mut report);
    if plan.config.flaky.asked {
        report.confidence = reached_confidence(&report, plan);
        if let Some(c) = report.confidence {
            report.message = format!("{} (confidence {c:.3})", report.message);
        }
    }
    if let Some(oid) = first_bad.filter(|_| opts.find_fix) {
        report.notes.extend(crate::run::find_fix::fix_caveats(
            plan,
            oid,
            opts.first_parent,
        ));
    }
    (report, first_bad)
}

/// The stages at the first bad commit (or what they gave when they started beside the cross-check), then
/// the bundle, with the environment asked beside the stages so the bundle does not wait for it after.
fn stages_then_bundle(
    ctx: &StageContext,
    (plan, opts): (&Plan, &StartOptions),
    (choice, oid, staged): (StageChoice, Oid, Option<Staged>),
    report: &mut Report,
    reporter: &mut dyn Reporter,
) {
    let (cancel, bundle) = (ctx.cancel, plan.config.bundle.enabled);
    let (stopped, asked) = match staged {
        // Started at the answer while the cross-check ran (their events are passed on already).
        Some(staged) => {
            report.triage = staged.triage;
            report.shrink = staged.shrink;
            (staged.interrupted, staged.asked)
        }
        None => stages_beside_environment(ctx, (choice, oid, bundle), report, reporter),
    };
    report.interrupted |= stopped;
    if !bundle || cancel.load(Ordering::SeqCst) {
        return;
    }
    let root = bundle_root(&plan.repo, &plan.config, opts.bundle_dir.as_deref());
    let at = ctx.prober.executor.as_ref();
    match write_bundle(
        plan,
        report,
        (ctx.run_dir, root),
        (asked, at),
        reporter,
        cancel,
    ) {
        Ok(dir) => {
            // What a maintainer is handed, and its size (attachable or not).
            reporter.event(&Event::BundleWritten {
                bytes: crate::report::bundle::dir_bytes(&dir),
                path: dir.display().to_string(),
            });
            report.bundle = Some(dir.display().to_string());
        }
        Err(e) => reporter.event(&Event::Warning {
            message: e.to_string(),
        }),
    }
}

/// The command line's layer over the config: `--clean` and `--jobs`.
fn apply_options(plan: &mut Plan, opts: &StartOptions) {
    if opts.clean {
        if let Some(b) = plan.config.build.as_mut() {
            b.clean = true;
        }
    }
    if let Some(jobs) = opts.jobs {
        plan.config.workers.jobs = jobs;
    }
}

/// The parallel workers, checked before anything is written (`None`: probes one at a time).
fn worker_slots(plan: &Plan, cancel: &AtomicBool) -> Result<Option<Vec<WorkerSlot>>, RunError> {
    let slurm = matches!(plan.config.executor.kind, ExecutorKind::Slurm(_));
    if plan.config.workers.jobs == Jobs::One {
        return Ok(None);
    }
    // Slurm gives each job its GPUs itself: nothing here is pinned.
    let visible = if slurm || plan.config.workers.devices.is_some() {
        Vec::new()
    } else {
        visible_devices(cancel)
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let slots = plan_slots(&plan.config.workers, &visible, cores).map_err(RunError::Usage)?;
    // One worker is probes one at a time, as with `jobs = 1`: the repro sees every GPU.
    Ok((slots.len() > 1).then_some(slots))
}

/// What cudabisect itself writes into the checkout on request (a bundle or report placed there): not the
/// repro's doing when the checkout is compared after the run.
fn own_outputs(plan: &Plan, opts: &StartOptions) -> Vec<PathBuf> {
    [
        opts.bundle_dir.clone(),
        plan.config
            .bundle
            .dir
            .as_ref()
            .map(|d| plan.repo.workdir().join(d)),
        opts.report.clone(),
        opts.junit.clone(),
    ]
    .into_iter()
    .flatten()
    .map(|p| std::path::absolute(&p).unwrap_or(p))
    .collect()
}

/// More workers than candidates would only make checkouts (each worker costs a full worktree): capped,
/// and said.
fn cap_workers(notes: &mut Vec<PlanNote>, candidates: usize, slots: &mut Vec<WorkerSlot>) {
    let useful = candidates.max(2);
    if slots.len() > useful {
        notes.push(PlanNote::WorkersCapped {
            asked: slots.len(),
            candidates,
            used: useful,
        });
        slots.truncate(useful);
    }
}

/// Parallel workers each get a scratch directory of their own (temporary files, JIT caches), kept between
/// runs so a worker's caches stay warm.
fn give_scratch_dirs(slots: &mut [WorkerSlot], state_dir: &Path) -> Result<(), RunError> {
    if slots.len() < 2 {
        return Ok(());
    }
    for slot in slots {
        let dir = state_dir.join("workers").join(slot.worker.to_string());
        for (_, sub) in crate::exec::child_env::WORKER_PRIVATE_DIRS {
            std::fs::create_dir_all(dir.join(sub)).map_err(io_err(&dir))?;
        }
        slot.scratch = Some(dir);
    }
    Ok(())
}

/// The journal of earlier runs killed before they finished, whose probes this run reuses (none with
/// `--fresh`; one that cannot be used is said, and the run journals nothing): with its path and the
/// fingerprint of what judges a probe.
fn open_journal(
    plan: &Plan,
    opts: &StartOptions,
    state_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> (Journal, PathBuf, String) {
    let path = opts
        .journal
        .clone()
        .unwrap_or_else(|| journal::journal_path(state_dir));
    let fingerprint = journal::fingerprint(
        &plan.config.text,
        &journal::outside_programs(&plan.config, &plan.repo.workdir()),
        &environment::fingerprint(cancel),
    );
    let opened = if opts.fresh {
        Ok((Journal::empty(&path, &fingerprint), Vec::new()))
    } else {
        Journal::open(&path, &fingerprint)
    };
    let journal = match opened {
        Ok((journal, warnings)) => {
            for message in warnings {
                reporter.event(&Event::Warning { message });
            }
            resume_notes(&journal, plan, reporter);
            journal
        }
        Err(e) => {
            reporter.event(&Event::Warning {
                message: format!(
                    "{}: the probe journal cannot be used ({e}); this run starts from scratch and journals nothing",
                    path.display()
                ),
            });
            Journal::off(&fingerprint)
        }
    };
    (journal, path, fingerprint)
}

/// What changed in the user's repository during the run, in words: cudabisect touches neither the stash
/// nor the checkout and refs, so a build or repro did (a `git stash` in a probe worktree, which shares
/// refs; a path like `../../..`). Said, not undone: the user decides.
fn what_the_run_changed(
    plan: &Plan,
    (stash_before, user_before): (Option<Oid>, &crate::git::UserState),
    own_outputs: &[PathBuf],
) -> Vec<String> {
    let mut said = Vec::new();
    let stash_changed = plan.repo.stash_tip() != stash_before;
    if stash_changed {
        said.push("the repository's stash changed during this run: a repro ran `git stash` in a probe worktree, and worktrees share refs with your checkout. Check `git stash list` before your next `git stash pop`".to_string());
    }
    let changed: Vec<String> = plan
        .repo
        .user_state(own_outputs)
        .changes_since(user_before)
        .into_iter()
        .filter(|c| !(stash_changed && c == "refs refs/stash"))
        .collect();
    if !changed.is_empty() {
        said.push(format!(
            "your repository changed during this run (cudabisect changes neither your refs nor your checkout): {}. If you did not change them yourself, a build or repro wrote outside its probe worktree (a path like ../../.., or git commands on the refs the worktrees share)",
            changed.join("; ")
        ));
    }
    said
}

/// Says what the journal lets this run reuse, and what it runs again.
fn resume_notes(journal: &Journal, plan: &Plan, reporter: &mut dyn Reporter) {
    let commits: std::collections::HashSet<String> = plan
        .range
        .iter()
        .map(|c| c.oid.to_string())
        .chain(std::iter::once(plan.bad.1.to_string()))
        .chain(plan.goods.iter().map(|g| g.1.to_string()))
        .chain(plan.merge_bases.iter().map(|o| o.to_string()))
        .collect();
    let reusable = journal.reusable_among(&commits);
    let retried = journal.retried();
    if reusable > 0 || retried > 0 {
        reporter.event(&Event::Resumed { reusable, retried });
    }
}

/// Writes report.json into the run directory (and `--report` when given); failures are warnings, since
/// the result is also in the `finished` event.
fn save_report(report: &Report, run_dir: &Path, extra: Option<&Path>, reporter: &mut dyn Reporter) {
    let json = match serde_json::to_string_pretty(report) {
        Ok(j) => j + "\n",
        Err(e) => {
            reporter.event(&Event::Warning {
                message: format!("the report could not be serialised: {e}"),
            });
            return;
        }
    };
    // The run directory again if something removed it mid-run: the result is never lost to that.
    let _ = std::fs::create_dir_all(run_dir);
    for path in std::iter::once(run_dir.join("report.json")).chain(extra.map(Path::to_path_buf)) {
        if let Err(e) = write_atomic(&path, json.as_bytes()) {
            reporter.event(&Event::Warning {
                message: format!("cannot write {}: {e}", path.display()),
            });
        }
    }
}

fn commit_ref(plan: &Plan, oid: Oid) -> CommitRef {
    CommitRef {
        commit: oid.to_string(),
        subject: plan.repo.subject(oid),
    }
}

/// The confidence an answer reached: the flaky search's posterior, or, for a fault that showed on every
/// run, 1 - 0.5^n where n is the clean runs of the culprit's parent: a parent faulting in at least half
/// its runs would have shown the fault in one of them.
fn reached_confidence(report: &Report, plan: &Plan) -> Option<f64> {
    if let Some(f) = &report.flaky {
        return Some(f.posterior);
    }
    report.first_bad.as_ref()?;
    let parent = report
        .good_parents
        .first()
        .map(|p| p.commit.clone())
        .or_else(|| plan.goods.first().map(|g| g.1.to_string()))?;
    let clean = report
        .probes
        .iter()
        .filter(|p| p.commit == parent && p.verdict == crate::bisect::Verdict::Good)
        .count()
        .min(64) as i32;
    Some(1.0 - 0.5f64.powi(clean))
}

/// Fills the result fields from how the search ended; returns the first bad commit when found.
fn fill_result(plan: &Plan, end: &SearchEnd, report: &mut Report) -> Option<Oid> {
    match end {
        SearchEnd::Found(oid) => {
            report.result = RunResult::Found;
            report.candidates = vec![commit_ref(plan, *oid)];
            match plan.repo.info(*oid) {
                Ok(info) => {
                    report.good_parents = info
                        .parents
                        .iter()
                        .filter_map(|p| Oid::from_str(p).ok())
                        .map(|p| commit_ref(plan, p))
                        .collect();
                    report.message = format!(
                        "first {} commit: {} {}",
                        report.terms.new,
                        short_sha(&info.commit),
                        info.subject
                    );
                    report.first_bad = Some(info);
                }
                Err(e) => {
                    report.message = format!("first bad commit: {oid} (cannot describe it: {e})")
                }
            }
            Some(*oid)
        }
        SearchEnd::Ambiguous(oids) => {
            report.result = RunResult::Ambiguous;
            report.candidates = oids.iter().map(|o| commit_ref(plan, *o)).collect();
            report.message = match &report.flaky {
                Some(f) => format!(
                    "a flaky fault: {} runs spent before any commit reached the confidence asked ({}); the most likely first bad commits",
                    f.runs, f.confidence
                ),
                None => format!(
                    "skipped commits leave {} candidates; the first bad commit is one of them",
                    oids.len()
                ),
            };
            None
        }
        SearchEnd::EndpointsInvalid(problem) => {
            report.result = RunResult::EndpointsInvalid;
            report.message = report.terms.speak(&problem.to_string());
            None
        }
        SearchEnd::EndpointInfra(msg) => {
            report.result = RunResult::EndpointInfra;
            report.message = msg.clone();
            None
        }
        SearchEnd::HostFailure(msg) => {
            report.result = RunResult::HostFailure;
            report.message = msg.clone();
            None
        }
        SearchEnd::Unverified(oid, why) => {
            report.result = RunResult::Inconclusive;
            report.candidates = vec![commit_ref(plan, *oid)];
            report.message = format!(
                "the search named {} as the first {} commit, but {why}: the answer does not hold",
                short_sha(&oid.to_string()),
                report.terms.new
            );
            None
        }
        SearchEnd::Interrupted => {
            report.result = RunResult::Inconclusive;
            report.interrupted = true;
            report.message = "interrupted before the search finished".into();
            None
        }
    }
}

fn empty_report(plan: &Plan, opts: &StartOptions, run_dir: &Path) -> Report {
    Report {
        format_version: FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        result: RunResult::Inconclusive,
        message: String::new(),
        good: plan.all_goods.iter().map(|o| o.to_string()).collect(),
        bad: plan.bad.1.to_string(),
        target: None,
        match_policy: plan.config.match_policy.describe(),
        launch_blocking: plan.config.repro.launch_blocking,
        first_bad: None,
        good_parents: Vec::new(),
        candidates: Vec::new(),
        probes: Vec::new(),
        range_size: plan.range.len(),
        run_dir: run_dir.display().to_string(),
        triage: None,
        shrink: None,
        bundle: None,
        notes: plan.notes.iter().map(ToString::to_string).collect(),
        other_bugs: Vec::new(),
        flaky: None,
        interrupted: false,
        confidence: None,
        terms: opts.terms.clone(),
        first_parent: opts.first_parent,
        pathspec: opts.pathspec.clone(),
        find_fix: opts.find_fix,
    }
}
