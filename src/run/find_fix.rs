//! `start --find-fix OLD..NEW`: the first commit where a fault is gone. The search is the ordinary one on
//! the same graph, with the states swapped: a commit that shows the fault (as the OLD end shows it) is in
//! the older state, a clean one in the newer, anything else a skip. The first OLD end opens the search's
//! first round in the bad end's place (its fault is what every probe is measured by), with the NEW end
//! checked beside the first probes (`SearchInput::finding_fix`). The search's judge swaps the verdicts
//! around; the journal underneath keeps what each commit did, not the swapped verdicts. What is here: the
//! caveats a fix carries for a backport.

use git2::Oid;

use super::plan::Plan;
use crate::report::record::short_sha;

/// What to know before backporting a fix, as git's bisect says it for merges: a fix that is a merge
/// commit (its parents still fault: the fix is how the branches met), or a fix that reached NEW
/// through a merge (not on NEW's first-parent line).
pub fn fix_caveats(plan: &Plan, fix: Oid, first_parent: bool) -> Vec<String> {
    let mut notes = Vec::new();
    let parents = plan.repo.parents(fix).unwrap_or_default();
    if parents.len() > 1 && first_parent {
        notes.push(format!(
            "the fix {} is the merge that brought it to this line (--first-parent judges a merge by its first parent): the commit that fixed it is on the merged branch; run without --first-parent to name it",
            short_sha(&fix.to_string())
        ));
    } else if parents.len() > 1 {
        notes.push(format!(
            "the fix {} is a merge, and each of its parents still shows the fault: the fault is gone only where the branches meet, so backport what the merge combines, not one side",
            short_sha(&fix.to_string())
        ));
    }
    let mut on_line = false;
    let mut at = Some(plan.bad.1);
    let mut steps = 0usize;
    while let Some(c) = at {
        if c == fix {
            on_line = true;
            break;
        }
        steps += 1;
        if steps > 1_000_000 {
            break;
        }
        at = plan.repo.parents(c).ok().and_then(|p| p.first().copied());
        if plan.goods.iter().any(|g| Some(g.1) == at) {
            break;
        }
    }
    if !on_line {
        notes.push(format!(
            "the fix {} is on a side branch that reached {} through a merge: that merge is where the fix arrived on this line",
            short_sha(&fix.to_string()),
            plan.bad.0
        ));
    }
    notes
}
