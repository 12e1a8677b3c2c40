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

/// One commit to run alone and what it must do: `Bad` shows the target fault, `Good` runs clean.
pub struct Expect<'a> {
    /// The commit.
    pub oid: Oid,
    /// What it must do.
    pub verdict: Verdict,
    /// What it is, for the message (`the first bad commit`, `its parent`).
    pub what: &'a str,
}

/// Runs each commit of `runs` once on `prober`, fresh (never from the journal), judged against `target`,
/// and stops at the first that does not do what it must. The records are appended to `probes`, numbered
/// from `step`; with `swap` (finding a fix) they are recorded in the search's swapped terms.
pub fn cross_check(
    prober: &mut dyn Probe,
    runs: &[Expect],
    target: &Signature,
    (step, swap): (usize, bool),
    probes: &mut Vec<ProbeRecord>,
    reporter: &mut dyn Reporter,
) -> CrossCheck {
    for (k, run) in runs.iter().enumerate() {
        let ctx = ProbeContext {
            step: step + k,
            role: ProbeRole::Verify,
            remaining: 1,
            estimated_steps: 1,
            worker: None,
            repeat: None,
        };
        let out = prober.probe(run.oid, &ctx, Some(target), reporter);
        if out.interrupted {
            return CrossCheck::Interrupted;
        }
        let got = out.record.verdict;
        let summary = out.record.signature.short();
        let mut record = out.record;
        if swap {
            record.verdict = super::find_fix::swapped(record.verdict);
        }
        reporter.event(&Event::ProbeFinished {
            step: ctx.step,
            record: Box::new(record.clone()),
        });
        probes.push(record);
        if got != run.verdict {
            return CrossCheck::Disagrees(format!(
                "{} {} run alone {} ({summary})",
                run.what,
                short_sha(&run.oid.to_string()),
                match got {
                    Verdict::Bad => "shows the fault",
                    Verdict::Good => "runs clean",
                    Verdict::Skip => "fails another way",
                }
            ));
        }
    }
    CrossCheck::Agrees
}
