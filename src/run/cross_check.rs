//! The serial cross-check of a parallel answer: with several workers, the first bad commit and its parent
//! are run once more, one at a time with every other worker idle. A repro that only works serially (it
//! writes a path every worker shares) disagrees with itself here, and the search is done again serially
//! instead of naming a commit the workers' interference chose.

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::Signature;
use crate::report::event::{Event, Reporter};
use crate::report::record::{short_sha, ProbeRecord, ProbeRole};

use super::probe::{Probe, ProbeContext};

/// What the serial runs said.
#[derive(Debug, PartialEq, Eq)]
pub enum CrossCheck {
    /// The culprit faults with the target and its parents are clean, run alone.
    Agrees,
    /// Run alone, a commit did not do what the parallel search saw: which, and what it did.
    Disagrees(String),
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

/// Runs `culprit` (expected to fault with `target`) and `parents` (expected clean) once each on `prober`,
/// fresh (never from the journal). The records are appended to `probes`, numbered from `step`.
#[allow(clippy::too_many_arguments)]
pub fn cross_check(
    prober: &mut dyn Probe,
    culprit: Oid,
    parents: &[Oid],
    target: &Signature,
    step: usize,
    probes: &mut Vec<ProbeRecord>,
    reporter: &mut dyn Reporter,
) -> CrossCheck {
    let runs = std::iter::once((culprit, Verdict::Bad)).chain(parents.iter().map(|&p| (p, Verdict::Good)));
    for (k, (oid, expected)) in runs.enumerate() {
        let ctx = ProbeContext {
            step: step + k,
            role: ProbeRole::Verify,
            remaining: 1,
            estimated_steps: 1,
            worker: None,
            repeat: None,
        };
        let out = prober.probe(oid, &ctx, Some(target), reporter);
        if out.interrupted {
            return CrossCheck::Interrupted;
        }
        reporter.event(&Event::ProbeFinished {
            step: ctx.step,
            record: Box::new(out.record.clone()),
        });
        let got = out.record.verdict;
        let summary = out.record.signature.short();
        probes.push(out.record);
        if got != expected {
            let what = if expected == Verdict::Bad {
                "the first bad commit"
            } else {
                "its parent"
            };
            return CrossCheck::Disagrees(format!(
                "{what} {} run alone was {} ({summary})",
                short_sha(&oid.to_string()),
                match got {
                    Verdict::Bad => "bad",
                    Verdict::Good => "good",
                    Verdict::Skip => "a skip",
                }
            ));
        }
    }
    CrossCheck::Agrees
}
