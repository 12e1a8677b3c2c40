//! The search step: the run announced, the search over every worker (each probe journaled),
//! and the cross-check of a parallel answer (with the stages started beside it where there is room).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::report::event::{Event, Reporter};

use super::culprit::stage_choice;
use super::journaled::StartJournal;
use super::result::report_of;
use crate::config::Jobs;
use crate::run::cancel::with_cancel_passed_on;
use crate::run::journal::{Journal, JournaledProbe};
use crate::run::plan::{Plan, StartOptions};
use crate::run::probe::prober::WorktreeProber;
use crate::run::search::{
    search_with_workers, SearchEnd, SearchInput, SearchOutcome, Sharing, Worker,
};
use crate::run::stages::pipeline::{cross_check_beside_stages, Early, Staged};
use crate::run::workspace::Workspace;

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
        finding_fix: opts.find_fix,
        steps_before: 0,
        checkout: Some(plan.repo.workdir()),
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
    let (input, stops) = (s.input, s.stops);
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
    // A search for a fix is the same search (`finding_fix` in its input).
    let mut workers: Vec<Worker> = journaled
        .iter_mut()
        .map(|j| {
            let stop = j.cancel;
            Worker { probe: j, stop }
        })
        .collect();
    let outcome = with_cancel_passed_on(cancel, stops, || {
        search_with_workers(input, &mut workers, reporter, cancel)
    });
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
    // GPU holds them both too, beside the stages' runs.
    let (stage_workers, spare) = others.split_at_mut(if early.is_some() { 3 } else { 0 });
    let beside = spare
        .first_mut()
        .filter(|_| at_once >= stage_workers.len() + 2);
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

/// The search step: the run announced (then what its journal says), the search over `workers` and the
/// cross-check of its answer (with the stages started beside it where there is room).
pub(super) fn searched<'w>(
    (plan, opts): (&Plan, &StartOptions),
    (ws, journal): (&Workspace, StartJournal),
    (places, stops): (usize, &[AtomicBool]),
    workers: (&mut WorktreeProber<'w>, &mut [WorktreeProber<'w>]),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> (SearchOutcome, Option<Staged>) {
    announce(plan, opts, &ws.run_dir, reporter);
    for event in &journal.said {
        reporter.event(event);
    }
    let gauge = crate::host::gpu_memory::NvidiaSmiGauge::default();
    let input = search_input(plan, opts, &gauge, places);
    let searching = Searching {
        plan,
        opts,
        input: &input,
        journal: Some(journal.journal),
        journal_path: &journal.path,
        fingerprint: &journal.fingerprint,
        log_dir: &ws.log_dir,
        stops,
    };
    search_and_cross_check(searching, workers, &ws.run_dir, reporter, cancel)
}
