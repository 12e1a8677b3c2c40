//! The cross-check of a parallel answer: with several workers, the first bad commit and its parents are
//! run once more with no probe of the search beside them (the commit and its parent side by side on two
//! workers where the GPU holds two, else one after the other). A repro that only works one at a time (it
//! writes a path every worker shares) disagrees with itself here, and the search is done again serially
//! instead of naming a commit the workers' interference chose.

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::{MatchPolicy, Signature};
use crate::report::event::{Event, Reporter, SendingReporter};
use crate::report::record::{short_sha, ProbeRecord, ProbeRole};

use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::journal::{Journal, JournaledProbe};
use super::plan::{Plan, StartOptions};
use super::probe::prober::{Probe, ProbeContext, ProbeOutcome, WorktreeProber};
use super::search::judge::{judge, swapped, Kernel, Terms};
use super::search::{search_with_workers, SearchEnd, SearchInput, SearchOutcome, Worker};

/// What the serial runs said.
#[derive(Debug, PartialEq, Eq)]
pub enum CrossCheck {
    /// The culprit faults with the target and its parents are clean, run again apart from the search.
    Agrees,
    /// Run again apart from the search, a commit did not do what the parallel search saw: which, and what
    /// it did.
    Disagrees(String),
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

/// One commit to run again and what it must do: `Bad` shows the target fault, `Good` runs clean.
pub struct Expect<'a> {
    /// The commit.
    pub oid: Oid,
    /// What it must do.
    pub verdict: Verdict,
    /// What it is, for the message (`the first bad commit`, `its parent`).
    pub what: &'a str,
}

/// Runs each commit of `runs` once, fresh (never from the journal), judged against `target`: as many at
/// once as there are `probers` (the first commit on the first), in order, and stops after the first group
/// with a commit that does not do what it must. The records are appended to `probes` in the order of
/// `runs`, numbered from `step`; with `swap` (finding a fix) they are recorded in the search's swapped
/// terms.
pub fn cross_check(
    probers: &mut [&mut dyn Probe],
    runs: &[Expect],
    (target, policy): (&Signature, &MatchPolicy),
    (step, swap): (usize, bool),
    probes: &mut Vec<ProbeRecord>,
    reporter: &mut dyn Reporter,
) -> CrossCheck {
    let width = probers.len().max(1);
    for (group, wave) in runs.chunks(width).enumerate() {
        let first = step + group * width;
        let outs = run_side_by_side(probers, wave, (first, target), reporter);
        if outs.iter().any(|o| o.interrupted) {
            return CrossCheck::Interrupted;
        }
        let mut disagreed = None;
        for (k, (run, out)) in wave.iter().zip(outs).enumerate() {
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
                step: first + k,
                record: Box::new(record.clone()),
            });
            probes.push(record);
            if got != run.verdict && disagreed.is_none() {
                disagreed = Some(format!(
                    "{} {} run again {} ({summary})",
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
        if let Some(why) = disagreed {
            return CrossCheck::Disagrees(why);
        }
    }
    CrossCheck::Agrees
}

/// One group of the cross-check's runs, each on its own prober at the same time (numbered from `first`),
/// their events passed on as they come; the outcomes in the order of `wave`.
fn run_side_by_side(
    probers: &mut [&mut dyn Probe],
    wave: &[Expect],
    (first, target): (usize, &Signature),
    reporter: &mut dyn Reporter,
) -> Vec<ProbeOutcome> {
    let ctx = |k: usize| ProbeContext {
        step: first + k,
        role: ProbeRole::Verify,
        remaining: 1,
        estimated_steps: 1,
        worker: None,
        repeat: None,
        crowded: false,
    };
    if let ([run], [prober, ..]) = (wave, &mut *probers) {
        return vec![prober.probe(run.oid, &ctx(0), Some(target), reporter)];
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<Event>();
        let running: Vec<_> = probers
            .iter_mut()
            .zip(wave)
            .enumerate()
            .map(|(k, (prober, run))| {
                let mut events = SendingReporter(tx.clone());
                let ctx = ctx(k);
                s.spawn(move || prober.probe(run.oid, &ctx, Some(target), &mut events))
            })
            .collect();
        drop(tx);
        for event in rx {
            reporter.event(&event);
        }
        running
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// What the cross-check runs: the answer (called `first`), then its parents (its first alone along
/// first parents, as the search judged a merge), each with what it must do in fault terms: the first bad
/// commit shows the fault and its parents run clean; finding a fix, the first fixed commit runs clean and
/// its parents show it.
fn expectations<'a>(
    plan: &Plan,
    opts: &StartOptions,
    culprit: Oid,
    first: &'a str,
) -> Vec<Expect<'a>> {
    let mut parents = plan.repo.parents(culprit).unwrap_or_default();
    if opts.first_parent {
        parents.truncate(1);
    }
    let (at, before) = if opts.find_fix {
        (Verdict::Good, Verdict::Bad)
    } else {
        (Verdict::Bad, Verdict::Good)
    };
    std::iter::once(Expect {
        oid: culprit,
        verdict: at,
        what: first,
    })
    .chain(parents.into_iter().map(|p| Expect {
        oid: p,
        verdict: before,
        what: "its parent",
    }))
    .collect()
}

/// A parallel search's first bad commit, run again with its parents apart from the search (see
/// [`cross_check`]), or, finding a fix, the fix verified the same way. When those runs disagree, the
/// repro does not bear parallel probes: `disagreed` is called (what was started on the answer stops), and
/// the search is done again with one worker, reusing nothing the workers journaled, and the answer says
/// so.
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
    (prober, beside): (&mut WorktreeProber, Option<&mut WorktreeProber>),
    (reporter, disagreed): (&mut dyn Reporter, &dyn Fn()),
    cancel: &AtomicBool,
) -> SearchOutcome {
    let (SearchEnd::Found(culprit), Some(target), None) =
        (&outcome.end, outcome.target.clone(), &outcome.flaky)
    else {
        return outcome;
    };
    let culprit = *culprit;
    let mut probes = outcome.probes.clone();
    let step = outcome.steps + 1;
    let first = format!("the first {} commit", opts.terms.new);
    let runs = expectations(plan, opts, culprit, &first);
    let mut probers: Vec<&mut dyn Probe> = std::iter::once(&mut *prober as &mut dyn Probe)
        .chain(beside.map(|p| p as &mut dyn Probe))
        .collect();
    let check = cross_check(
        &mut probers,
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
