//! The run's end: the user's checkout compared with what it was when the run began, the report saved
//! where asked, the CI outputs and the last event.

use std::path::{Path, PathBuf};

use git2::Oid;

use crate::report::event::{Event, Reporter};
use crate::report::record::Report;

use super::result::save_report;
use crate::run::ci::start_outputs;
use crate::run::plan::{Plan, StartOptions};

/// The user's checkout as the run found it (its stash, refs, index and files, the run's own outputs
/// left out): what the run must leave as it was.
pub(super) struct Before {
    stash: Option<Oid>,
    own_outputs: Vec<PathBuf>,
    user: crate::git::UserState,
}

impl Before {
    pub(super) fn of(plan: &Plan, opts: &StartOptions) -> Self {
        let own_outputs = own_outputs(plan, opts);
        Before {
            stash: plan.repo.stash_tip(),
            user: plan.repo.user_state(&own_outputs),
            own_outputs,
        }
    }
}

/// The run's end: what it changed of the user's checkout said (a warning and a note), the report saved
/// (and written where `--report` asks), the CI outputs written, and the last event.
pub(super) fn finish(
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
