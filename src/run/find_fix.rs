//! `start --find-fix OLD..NEW`: the first commit where a fault is gone. The search is the ordinary one on
//! the same graph, with the states swapped: a commit that shows the fault (as the OLD end shows it) is in
//! the older state, a clean one in the newer, anything else a skip. [`FixProbe`] turns the prober's
//! verdicts around; the journal underneath keeps what each commit did, not the swapped verdicts.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::{MatchPolicy, Sameness, Signature};
use crate::report::event::Reporter;

use super::probe::{Probe, ProbeContext, ProbeOutcome, Sanitized};

/// A [`Probe`] judging every commit against the fault seen at the OLD end, with the verdicts swapped:
/// the fault there is `Good` (the older state), a clean run `Bad` (the newer).
pub struct FixProbe<'a> {
    /// The prober (journaled) that runs the commits.
    pub inner: &'a mut dyn Probe,
    /// The fault at the OLD end.
    pub fault: Signature,
    /// The same-bug policy: a lookalike the output cannot tell apart is settled by the sanitizer, so
    /// another bug of the fault's class never passes for the fault still being there.
    pub policy: &'a MatchPolicy,
    /// The flag that stops this worker's probe.
    pub stop: &'a AtomicBool,
    /// Endpoints already probed before the search, by commit (their records as the prober gave them).
    pub known: HashMap<Oid, ProbeOutcome>,
}

/// The verdict in find-fix terms: showing the fault is the older state, clean the newer.
pub fn swapped(verdict: Verdict) -> Verdict {
    match verdict {
        Verdict::Bad => Verdict::Good,
        Verdict::Good => Verdict::Bad,
        Verdict::Skip => Verdict::Skip,
    }
}

impl Probe for FixProbe<'_> {
    fn probe(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        _target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let mut out = match self.known.remove(&oid) {
            Some(mut known) => {
                known.record.role = ctx.role;
                known
            }
            None => {
                let mut out = self.inner.probe(oid, ctx, Some(&self.fault), reporter);
                let unconfirmed = out.record.verdict == Verdict::Bad
                    && !out.interrupted
                    && self.policy.compare(&self.fault, &out.record.signature, "")
                        == Sameness::Unconfirmed;
                if unconfirmed {
                    super::search::settle(
                        self.inner,
                        oid,
                        ctx,
                        &self.fault,
                        &mut out.record,
                        reporter,
                    );
                }
                out
            }
        };
        out.record.verdict = swapped(out.record.verdict);
        out
    }

    fn sanitize(
        &mut self,
        _oid: Oid,
        _ctx: &ProbeContext,
        _reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        // Lookalikes are settled inside `probe`, against the OLD end's fault; the search's own target is
        // the NEW end's clean run, which has no kernel to learn.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swapping_twice_is_the_identity_and_a_skip_stays_a_skip() {
        for v in [Verdict::Good, Verdict::Bad, Verdict::Skip] {
            assert_eq!(swapped(swapped(v)), v);
        }
        assert_eq!(swapped(Verdict::Skip), Verdict::Skip);
        assert_eq!(swapped(Verdict::Bad), Verdict::Good);
    }
}
