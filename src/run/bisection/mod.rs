//! One bisection end to end, as `start` runs it and `nightly` runs it for a regression, as a short
//! pipeline of steps, each in a file of its own: the plan and the workspace with its workers
//! (`opening`), the search and the cross-check of its answer (`searching`), the report of the result,
//! saved as soon as it is known (`result`), the stages at the first bad commit and the bundle
//! (`culprit`), and the end (`finish`): the report and the `finished` event come before any fallible
//! cleanup, and cleanup failures are warnings.

mod culprit;
mod finish;
mod opening;
mod result;
mod searching;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::report::event::Reporter;
use crate::report::record::Report;

use crate::run::plan::{RunError, StartOptions};
use culprit::at_the_first_bad;
use finish::{finish, Before};
use opening::{extra_worktrees, open_workspace, planned, settle_slots, warm_pool_for};
use result::{report_of, save_report};
use searching::searched;

/// Runs a whole bisection. `Err` only for problems found before anything ran (bad input, a held lock);
/// once the search starts, every outcome is in the report.
pub fn bisect(
    opts: &StartOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Report, RunError> {
    let (mut plan, slots) = planned(opts, cancel)?;
    let before = Before::of(&plan, opts);
    let mut ws = open_workspace((&plan.repo, &plan.config), opts)?;
    let worktree = ws.worktree("worktree")?;
    let candidates = plan.range.len();
    let (slots, places) = settle_slots((&mut plan.notes, candidates), slots, &ws.state_dir)?;
    // Each further worker has a worktree of its own (sharing the object store), so its build directory
    // stays warm from probe to probe; all go at the end unless --keep-worktree.
    let extra_worktrees = extra_worktrees(&ws, &slots)?;
    let stops: Vec<AtomicBool> = slots.iter().map(|_| AtomicBool::new(false)).collect();
    let warm_pool = warm_pool_for(&plan, &ws.run_dir);
    let (mut prober, mut others) = ws.workers(
        &plan.config,
        (&worktree, &extra_worktrees),
        (&slots, &stops),
        (warm_pool.as_ref(), cancel),
    );
    let workers = (&mut prober, others.as_mut_slice());
    let (outcome, staged) = searched(
        (&plan, opts),
        &ws,
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
