//! The cross-check of a parallel answer: with several workers, the first bad commit and its parents are
//! run once more with no probe of the search beside them (the commit and its parent side by side on two
//! workers where the GPU holds two, else one after the other). A repro that only works one at a time (it
//! writes a path every worker shares) disagrees with itself here, and the search is done again serially
//! instead of naming a commit the workers' interference chose. The runs themselves go through the
//! search's one loop ([`run_again`]): this module says what to run and what the answer makes of it.

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::Signature;
use crate::report::event::{Event, Reporter};
use crate::report::record::{short_sha, ProbeRecord};

use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::journal::{Journal, JournaledProbe};
use super::plan::{Plan, StartOptions};
use super::probe::prober::{Probe, WorktreeProber};
use super::search::judge::swapped;
use super::search::{
    run_again, search_with_workers, SearchEnd, SearchInput, SearchOutcome, Worker,
};

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

/// What the cross-check said, its records (in the order of the runs) and the last step number it used.
pub struct Checked {
    /// What it said.
    pub said: CrossCheck,
    /// The records of its runs.
    pub probes: Vec<ProbeRecord>,
    /// The last step number it used.
    pub steps: usize,
}

/// Runs each commit of `runs` once more, fresh (never from the journal), through the search's one loop
/// ([`run_again`]): judged against `target` in `input`'s terms (swapped, finding a fix) by its own output,
/// as many at once as there are `workers` (the first commit on the first), in order, and stops after the
/// first group with a commit that does not do what it must. Numbered on from `input.steps_before`.
pub fn cross_check(
    workers: &mut [Worker],
    runs: &[Expect],
    target: &Signature,
    input: &SearchInput,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Checked {
    // Between the fault's terms and the search's (swapped, finding a fix), either way.
    let other_terms = |v: Verdict| if input.finding_fix { swapped(v) } else { v };
    let expected: Vec<(Oid, Verdict)> = runs
        .iter()
        .map(|r| (r.oid, other_terms(r.verdict)))
        .collect();
    let ran = run_again(input, target, &expected, workers, reporter, cancel);
    let said = match ran.said {
        Ok(None) => CrossCheck::Agrees,
        Ok(Some(place)) => {
            let run = &runs[place];
            let commit = run.oid.to_string();
            let record = ran.probes.iter().rev().find(|p| p.commit == commit);
            // Compared in the fault's terms.
            let got = record.map_or(Verdict::Skip, |r| other_terms(r.verdict));
            let summary = record.map(|r| r.signature.short()).unwrap_or_default();
            CrossCheck::Disagrees(format!(
                "{} {} run again {} ({summary})",
                run.what,
                short_sha(&commit),
                match got {
                    Verdict::Bad => "shows the fault",
                    Verdict::Good => "runs clean",
                    Verdict::Skip => "fails another way",
                }
            ))
        }
        Err(SearchEnd::Interrupted) => CrossCheck::Interrupted,
        Err(SearchEnd::HostFailure(why)) => {
            CrossCheck::Disagrees(format!("its runs again could not be made: {why}"))
        }
        Err(_) => CrossCheck::Disagrees("its runs again could not be made".into()),
    };
    Checked {
        said,
        probes: ran.probes,
        steps: ran.steps,
    }
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
pub fn cross_checked<'w>(
    outcome: SearchOutcome,
    opts: &StartOptions,
    plan: &Plan,
    input: &SearchInput,
    journal_path: &Path,
    fingerprint: &str,
    log_dir: &Path,
    (prober, beside): (&mut WorktreeProber<'w>, Option<&mut WorktreeProber<'w>>),
    (reporter, disagreed): (&mut dyn Reporter, &dyn Fn()),
    cancel: &AtomicBool,
) -> SearchOutcome {
    let (SearchEnd::Found(culprit), Some(target), None) =
        (&outcome.end, outcome.target.clone(), &outcome.flaky)
    else {
        return outcome;
    };
    let culprit = *culprit;
    let first = format!("the first {} commit", opts.terms.new);
    let runs = expectations(plan, opts, culprit, &first);
    let mut workers: Vec<Worker> = std::iter::once(&mut *prober)
        .chain(beside)
        .map(|p| {
            let stop = p.cancel;
            Worker {
                probe: p as &mut dyn Probe,
                stop,
            }
        })
        .collect();
    let again = SearchInput {
        steps_before: outcome.steps,
        ..input.clone()
    };
    let checked = cross_check(&mut workers, &runs, &target, &again, reporter, cancel);
    drop(workers);
    let mut probes = outcome.probes.clone();
    probes.extend(checked.probes);
    // Numbered as far as every run it could make (one that disagreed ends it early), and any it sent
    // again.
    let (check, steps) = (checked.said, checked.steps.max(outcome.steps + runs.len()));
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
