//! The serial cross-check of a parallel answer: with several workers, the first bad commit and its parent
//! are run once more, one at a time with every other worker idle. A repro that only works serially (it
//! writes a path every worker shares) disagrees with itself here, and the search is done again serially
//! instead of naming a commit the workers' interference chose.

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::{MatchPolicy, Signature};
use crate::report::event::{Event, Reporter};
use crate::report::record::{short_sha, ProbeRecord, ProbeRole};

use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::journal::{Journal, JournaledProbe};
use super::plan::{Plan, StartOptions};
use super::probe::prober::{Probe, ProbeContext, WorktreeProber};
use super::search::judge::{judge, swapped, Kernel, Terms};
use super::search::{search_with_workers, SearchEnd, SearchInput, SearchOutcome, Worker};

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
    (target, policy): (&Signature, &MatchPolicy),
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
            crowded: false,
        };
        let out = prober.probe(run.oid, &ctx, Some(target), reporter);
        if out.interrupted {
            return CrossCheck::Interrupted;
        }
        // Judged in the search's terms (swapped when finding a fix), and compared in the fault's.
        let terms = Terms {
            target: Some(target),
            policy,
            swapped: swap,
        };
        let j = judge(&out.record.signature, &out.output, terms, Kernel::Unknown);
        let got = if swap { swapped(j.verdict) } else { j.verdict };
        let summary = out.record.signature.short();
        let mut record = out.record;
        record.verdict = j.verdict;
        record.matched_target = j.matched_target;
        record.reason = j.reason;
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

/// A parallel search's first bad commit, run again alone with its parents (see [`cross_check`]), or,
/// finding a fix, the fix verified the same way. When the serial runs disagree, the repro does not bear
/// parallel probes: `disagreed` is called (what was started on the answer stops), and the search is done
/// again with one worker, reusing nothing the workers journaled, and the answer says so.
#[expect(
    clippy::too_many_arguments,
    reason = "the parts of one call, named where it is made"
)]
pub fn cross_checked(
    outcome: SearchOutcome,
    opts: &StartOptions,
    plan: &Plan,
    input: &SearchInput,
    journal_path: &Path,
    fingerprint: &str,
    log_dir: &Path,
    prober: &mut WorktreeProber,
    (reporter, disagreed): (&mut dyn Reporter, &dyn Fn()),
    cancel: &AtomicBool,
) -> SearchOutcome {
    let (SearchEnd::Found(culprit), Some(target), None) =
        (&outcome.end, outcome.target.clone(), &outcome.flaky)
    else {
        return outcome;
    };
    let culprit = *culprit;
    let mut parents = plan.repo.parents(culprit).unwrap_or_default();
    if opts.first_parent {
        // Along first parents a merge is judged against its first parent alone, as the search did.
        parents.truncate(1);
    }
    let mut probes = outcome.probes.clone();
    let step = outcome.steps + 1;
    // In fault terms: the first bad commit shows it and its parents run clean; finding a fix, the
    // first fixed commit runs clean and its parents show it.
    let (at, before) = if opts.find_fix {
        (Verdict::Good, Verdict::Bad)
    } else {
        (Verdict::Bad, Verdict::Good)
    };
    let first = format!("the first {} commit", opts.terms.new);
    let runs: Vec<Expect> = std::iter::once(Expect {
        oid: culprit,
        verdict: at,
        what: &first,
    })
    .chain(parents.iter().map(|&p| Expect {
        oid: p,
        verdict: before,
        what: "its parent",
    }))
    .collect();
    let check = cross_check(
        prober,
        &runs,
        (&target, input.policy),
        (step, opts.find_fix),
        &mut probes,
        reporter,
    );
    // Numbered as far as every run it could make (one that disagreed ends it early).
    let steps = outcome.steps + runs.len();
    match check {
        CrossCheck::Agrees => SearchOutcome {
            probes,
            steps,
            ..outcome
        },
        CrossCheck::Interrupted => SearchOutcome {
            probes,
            steps,
            end: SearchEnd::Interrupted,
            ..outcome
        },
        CrossCheck::Disagrees(why) if opts.find_fix => SearchOutcome {
            probes,
            steps,
            end: SearchEnd::Unverified(culprit, why),
            ..outcome
        },
        CrossCheck::Disagrees(why) => {
            disagreed();
            reporter.event(&Event::ParallelAnswerDisagrees { why });
            let serial_input = SearchInput {
                steps_before: steps,
                ..input.clone()
            };
            let mut serial = serial_search(
                &serial_input,
                (journal_path, fingerprint, log_dir),
                prober,
                reporter,
                cancel,
            );
            probes.append(&mut serial.probes);
            serial.probes = probes;
            serial
        }
    }
}

/// The search again, one probe at a time in `prober`'s worktree, journaled beside the parallel one's.
fn serial_search(
    input: &SearchInput,
    (journal_path, fingerprint, log_dir): (&Path, &str, &Path),
    prober: &mut WorktreeProber,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> SearchOutcome {
    let journal = std::sync::Mutex::new(Journal::empty(journal_path, fingerprint));
    let mut journaled = JournaledProbe {
        inner: prober,
        journal: &journal,
        warnings: Vec::new(),
        cancel,
        log_dir: Some(log_dir.to_path_buf()),
    };
    let mut workers = [Worker {
        probe: &mut journaled,
        stop: cancel,
    }];
    search_with_workers(input, &mut workers, reporter, cancel)
}
