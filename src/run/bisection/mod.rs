//! One bisection end to end, as `start` runs it and `nightly` runs it for a regression, as a short
//! pipeline: the plan ([`crate::run::plan`]: the range, the config with the command line's layer, the
//! workers' slots, every refusal before anything is written), the workspace (which builds the workers),
//! the journal of earlier runs (`journaled`), the search and the cross-check of its answer
//! (`searching`), the report of the result, saved as soon as it is known (`result`), the stages at the
//! first bad commit and the bundle (`culprit`), and the end (`finish`): the report and the `finished`
//! event come before any fallible cleanup, and cleanup failures are warnings.

mod culprit;
mod finish;
mod journaled;
mod result;
mod searching;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::report::event::Reporter;
use crate::report::record::Report;

use crate::run::plan::{plan, RunError, StartOptions};
use crate::run::workspace::{Opening, Workspace};
use culprit::at_the_first_bad;
use finish::{finish, Before};
use journaled::open_for_start;
use result::{report_of, save_report};
use searching::searched;

/// Runs a whole bisection. `Err` only for problems found before anything ran (bad input, a held lock);
/// once the search starts, every outcome is in the report.
pub fn bisect(
    opts: &StartOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Report, RunError> {
    let mut plan = plan(opts, cancel)?;
    let before = Before::of(&plan, opts);
    let (mut slots, places) = (std::mem::take(&mut plan.slots), plan.places);
    // Locked for this range, unless the caller (the nightly job) holds the state directory's lock already.
    let lock = format!("start {}", opts.range);
    let opening = Opening {
        lock: (!opts.state_locked).then_some(lock.as_str()),
        ..Opening::default()
    };
    let mut ws = Workspace::open(&plan.repo, &plan.config, opening)?;
    ws.prune_runs();
    let worktree = ws.worktree("worktree")?;
    // Every worker's worktree, like the first, goes at the end unless --keep-worktree.
    let extra_worktrees = ws.worker_places(&mut slots)?;
    let stops: Vec<AtomicBool> = slots.iter().map(|_| AtomicBool::new(false)).collect();
    let warm_pool = ws.warm_pool(&plan.config);
    let (mut prober, mut others) = ws.workers(
        &plan.config,
        (&worktree, &extra_worktrees),
        (&slots, &stops),
        (warm_pool.as_ref(), cancel),
    );
    let workers = (&mut prober, others.as_mut_slice());
    let journal = open_for_start(&plan, opts, &ws.state_dir, cancel);
    let (outcome, staged) = searched(
        (&plan, opts),
        (&ws, journal),
        (places, &stops),
        workers,
        reporter,
        cancel,
    );
    let at_once = outcome.at_once;
    let (mut report, first_bad) = report_of(outcome, &plan, opts, &ws.run_dir);
    // The result is on disk before anything else can fail.
    save_report(&report, &ws.run_dir, None, reporter);
    // A fix is clean at the commit found: there is nothing there to triage, shrink or hand off.
    if let Some(oid) = first_bad.filter(|_| !opts.find_fix) {
        let at = (oid, at_once, staged.filter(|s| s.commit == oid));
        let (workers, stage) = ((&prober, others.as_slice()), (ws.run_dir.as_path(), cancel));
        at_the_first_bad((&plan, opts), workers, at, stage, &mut report, reporter);
    }
    report.interrupted |= cancel.load(Ordering::SeqCst);
    finish(&mut report, (&plan, opts), &before, &ws.run_dir, reporter);
    if opts.keep_worktree {
        ws.keep_worktrees();
    }
    ws.close(reporter);
    Ok(report)
}
