//! A good end or merge base that the search's first round runs beside its first probes, and the one rule
//! that settles it from its judged record: it must not show the target. Pure: the driver reports what
//! it returns.

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::{Sameness, Signature};
use crate::report::event::Event;
use crate::report::record::{ProbeRecord, ProbeRole};

use super::contract::{EndpointProblem, SearchEnd, SearchInput};
use super::judge::{is_host_problem, reproduces};

/// A good end or merge base the search's first round runs: it must not show the target.
#[derive(Clone, Debug)]
pub(super) struct EndCheck {
    /// What it is, for messages (`good commit v1`, `merge base 1a2b3c4d5e6f`).
    pub(super) what: String,
    /// The revision as given (`v1`), for the refusals of a search for a fix.
    pub(super) name: String,
    /// The commit.
    pub(super) oid: Oid,
    /// `GoodEndpoint` or `MergeBase`; finding a fix, `BadEndpoint` for the NEW end.
    pub(super) role: ProbeRole,
}

/// Settles one check by its judged record against `target`: `Ok` when it passes, with the event to
/// report when it passes only because it shows another bug (a nightly's good end may).
pub(super) fn settle(
    input: &SearchInput,
    target: Option<&Signature>,
    check: &EndCheck,
    rec: &ProbeRecord,
) -> Result<Option<Event>, SearchEnd> {
    let what = check.what.clone();
    let role = check.role;
    if is_host_problem(rec.signature.class) {
        let msg = format!("{what} could not be judged: {}", rec.signature.summary);
        return Err(SearchEnd::EndpointInfra(msg));
    }
    let other_bug = input.goods_may_show_other_bugs
        && role == ProbeRole::GoodEndpoint
        && reproduces(&rec.signature)
        && target
            .is_some_and(|t| input.policy.compare(t, &rec.signature, "") == Sameness::Different);
    if other_bug {
        return Ok(Some(Event::GoodShowsOtherBug {
            what,
            commit: rec.commit.clone(),
            signature: rec.signature.short(),
        }));
    }
    if input.finding_fix {
        return settle_for_fix(check, rec);
    }
    match (rec.verdict, role) {
        (Verdict::Good, _) => Ok(None),
        // git's wording: the good commit is on another line of history where the bug was fixed.
        (Verdict::Bad, ProbeRole::MergeBase) => {
            Err(SearchEnd::EndpointsInvalid(EndpointProblem::MergeBaseBad {
                what,
            }))
        }
        _ => Err(SearchEnd::EndpointsInvalid(
            match input
                .checkout
                .as_deref()
                .and_then(|c| checkout_file(&rec.signature, c))
            {
                Some(path) => EndpointProblem::CheckoutCodeRan { what, path },
                None => EndpointProblem::GoodDoesNotPass {
                    what,
                    seen: rec.signature.short(),
                },
            },
        )),
    }
}

/// The first file of `checkout` that the failure's frames name (its site, launch site, then its stack
/// from the innermost frame), outside the checkout's `.git` (where the probe worktrees are). Paths inside
/// the probe's worktree were made relative to it before: an absolute one under the checkout was read from
/// your working tree. The repro's own script (the outermost frame) is left out: one kept in the checkout
/// and named by its absolute path runs from there by design; what it imports from there does not.
fn checkout_file(sig: &crate::classify::Signature, checkout: &std::path::Path) -> Option<String> {
    let file = |frame: &str| frame.split(':').next().unwrap_or("").to_string();
    let script = sig.stack.first().map(|f| file(f));
    let mut frames = [&sig.site, &sig.launch]
        .into_iter()
        .flatten()
        .chain(sig.stack.iter().rev());
    frames.find_map(|frame| {
        let name = file(frame);
        let path = std::path::Path::new(&name);
        let inside = path.is_absolute()
            && path.starts_with(checkout)
            && !path.starts_with(checkout.join(".git"))
            && script.as_deref() != Some(name.as_str());
        inside.then(|| path.display().to_string())
    })
}

/// A check of a search for a fix, judged in its swapped terms: another OLD end must show the fault (the
/// older state), the NEW end must run clean (the newer state), a merge base must show it too.
fn settle_for_fix(check: &EndCheck, rec: &ProbeRecord) -> Result<Option<Event>, SearchEnd> {
    let seen = rec.signature.short();
    match (check.role, rec.verdict) {
        (ProbeRole::BadEndpoint, Verdict::Bad) => Ok(None),
        (ProbeRole::BadEndpoint, _) => {
            Err(SearchEnd::EndpointsInvalid(EndpointProblem::FaultNotGone {
                new: check.name.clone(),
                seen,
            }))
        }
        (_, Verdict::Good) => Ok(None),
        (ProbeRole::MergeBase, Verdict::Bad) => {
            Err(SearchEnd::EndpointsInvalid(EndpointProblem::MergeBaseBad {
                what: check.what.clone(),
            }))
        }
        (ProbeRole::MergeBase, _) => Err(SearchEnd::EndpointsInvalid(
            EndpointProblem::GoodDoesNotPass {
                what: check.what.clone(),
                seen,
            },
        )),
        _ => Err(SearchEnd::EndpointsInvalid(
            EndpointProblem::FaultNotAtOld {
                old: check.name.clone(),
                seen,
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{FaultClass, Signature};
    use std::path::Path;

    fn failing(site: &str, stack: &[&str]) -> Signature {
        let mut sig = Signature::new(FaultClass::IllegalAddress, "CUDA error");
        sig.site = Some(site.to_string());
        sig.stack = stack.iter().map(|s| s.to_string()).collect();
        sig
    }

    #[test]
    fn a_failure_in_a_file_of_the_users_checkout_is_named_and_one_in_the_worktree_is_not() {
        let checkout = Path::new("/home/u/proj");
        // The probe's own files were made relative to its worktree: the commit's code.
        assert_eq!(
            checkout_file(&failing("src/pkg/ops.py:12", &[]), checkout),
            None
        );
        // An installed copy pointing at the checkout (an editable install).
        assert_eq!(
            checkout_file(&failing("/home/u/proj/src/pkg/ops.py:12", &[]), checkout).as_deref(),
            Some("/home/u/proj/src/pkg/ops.py")
        );
        // The site is a library's; the stack's innermost frame of the checkout is named.
        let stack = [
            "train.py:3 in <module>: step()",
            "/home/u/proj/src/pkg/model.py:8 in step: ops.run()",
            "/home/u/proj/src/pkg/ops.py:12 in run: launch()",
        ];
        assert_eq!(
            checkout_file(
                &failing("/usr/lib/python3/site-packages/torch/x.py:1", &stack),
                checkout
            )
            .as_deref(),
            Some("/home/u/proj/src/pkg/ops.py")
        );
        // The repro's own script kept in the checkout, named by its absolute path: it runs from there by
        // design. What it imports from there is the checkout's code all the same.
        let script = "/home/u/proj/repro.py:3 in <module>: step()";
        assert_eq!(
            checkout_file(&failing("/home/u/proj/repro.py:3", &[script]), checkout),
            None
        );
        assert_eq!(
            checkout_file(
                &failing(
                    "/home/u/proj/pkg/ops.py:12",
                    &[script, "/home/u/proj/pkg/ops.py:12 in run: x"]
                ),
                checkout
            )
            .as_deref(),
            Some("/home/u/proj/pkg/ops.py")
        );
        // cudabisect's own worktrees live under the checkout's .git; another project beside it is not it.
        let ours = "/home/u/proj/.git/cudabisect/worktrees/w1/src/pkg/ops.py:12";
        assert_eq!(checkout_file(&failing(ours, &[]), checkout), None);
        assert_eq!(
            checkout_file(&failing("/home/u/proj2/ops.py:1", &[]), checkout),
            None
        );
    }
}
