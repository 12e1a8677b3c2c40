//! The search: probes the bad endpoint (its signature becomes the target), the good endpoints and any
//! merge bases, then runs one loop over a strategy (plain bisection, or the Bayesian search for a flaky
//! fault) that keeps every worker busy, one worker or many. It sees the world only through the
//! [`crate::run::probe::prober::Probe`] trait, so it is tested in-process with scripted fakes, and one pure
//! function, [`judge::judge`], decides every verdict.

mod contract;
mod driver;
mod end_check;
mod endpoints;
pub mod judge;
mod pool;
pub mod settled;
mod strategy;

use std::sync::atomic::AtomicBool;

use git2::Oid;

use crate::bisect::{Bisector, Verdict};
use crate::report::event::{Event, Reporter};
use crate::report::record::ProbeRole;

pub use contract::{EndpointProblem, RanAgain, SearchEnd, SearchInput, SearchOutcome, Sharing};
use driver::Driver;
pub use pool::Worker;
use settled::{SettledStacks, REMEMBERED};

/// Runs the whole search with one prober, one probe at a time.
pub fn search(
    input: &SearchInput,
    prober: &mut dyn crate::run::probe::prober::Probe,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> SearchOutcome {
    let mut workers = [Worker {
        probe: prober,
        stop: cancel,
    }];
    search_with_workers(input, &mut workers, reporter, cancel)
}

/// Runs the whole search. The endpoints are probed by the first worker; the bisection then keeps every
/// worker busy (one worker: one probe at a time, as `git bisect` does).
pub fn search_with_workers(
    input: &SearchInput,
    workers: &mut [Worker],
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> SearchOutcome {
    if workers.is_empty() {
        let settled = SettledStacks::off();
        let d = Driver::new(input, reporter, &settled, cancel, 0);
        return d.outcome(SearchEnd::HostFailure("no probe worker".into()));
    }
    pool::with_pool(workers, cancel, |pool| {
        let settled = SettledStacks::default();
        let outcome = search_once(input, pool, reporter, cancel, &settled);
        let mut outcome = match judged_from_memory(&outcome) {
            Some(culprit) => recheck_culprit(input, pool, reporter, cancel, outcome, culprit),
            None => outcome,
        };
        outcome.at_once = match pool.first_shared() {
            Some(_) => pool.room(),
            None => pool.size(),
        };
        outcome
    })
}

/// Runs each commit of `runs` once more, fresh, on `workers` side by side in groups as wide as they are
/// (the first commit on the first worker), through the one loop: each judged against `target` in the
/// search's terms by its own output (no sanitizer run), and expected to give its verdict (in those terms
/// too). Ends after the first group in which one did not. Numbered on from `input.steps_before`.
pub fn run_again(
    input: &SearchInput,
    target: &crate::classify::Signature,
    runs: &[(Oid, Verdict)],
    workers: &mut [Worker],
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> RanAgain {
    if workers.is_empty() {
        return RanAgain {
            said: Err(SearchEnd::HostFailure("no probe worker".into())),
            probes: Vec::new(),
            steps: input.steps_before,
        };
    }
    pool::with_pool(workers, cancel, |pool| {
        // The caller gave as many workers as the GPU holds runs at once.
        pool.set_limit(pool.size());
        pool.set_measured();
        let off = SettledStacks::off();
        // Its pool is not the search's: a worker number would name another of the search's workers.
        let mut d = Driver::new(input, reporter, &off, cancel, 1);
        d.target = Some(target.clone());
        d.sanitizes = false;
        let picks: Vec<(usize, Verdict)> =
            runs.iter().map(|&(oid, v)| (d.index_of(oid), v)).collect();
        let strategy = strategy::RunAgain::new(picks);
        let said = match d.drive(pool, Box::new(strategy), driver::Checks::default()) {
            Ok(strategy::Answer::RanAgain(disagreed)) => Ok(disagreed),
            Ok(_) => Err(SearchEnd::HostFailure(
                "the runs again ended with another strategy's answer".into(),
            )),
            Err(end) => Err(end),
        };
        let place = |commit: &str| runs.iter().position(|(oid, _)| oid.to_string() == commit);
        let mut probes = std::mem::take(&mut d.probes);
        probes.sort_by_key(|p| place(&p.commit));
        RanAgain {
            said,
            probes,
            steps: d.steps,
        }
    })
}

/// Probes `oid` once on `worker` through the search's driver, judged on its own (no target: what it shows
/// is a fault to search for; no sanitizer run), its record said as every probe's is: the nightly job's
/// look at its branch head. `Err` when Ctrl-C stopped it.
pub fn probe_alone(
    input: &SearchInput,
    (oid, role): (Oid, ProbeRole),
    worker: Worker,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<crate::report::record::ProbeRecord, SearchEnd> {
    pool::with_pool(&mut [worker], cancel, |pool| {
        // One worker: nothing to measure on its GPU.
        pool.set_measured();
        let off = SettledStacks::off();
        let mut d = Driver::new(input, reporter, &off, cancel, 1);
        d.sanitizes = false;
        d.progress = (1, 1);
        d.probe_alone(pool, oid, role, false)
    })
}

/// One search with `settled` as its memory of sanitizer answers.
fn search_once(
    input: &SearchInput,
    pool: &mut pool::Pool,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
    settled: &SettledStacks,
) -> SearchOutcome {
    let mut d = Driver::new(input, reporter, settled, cancel, pool.size());
    let end = run(&mut d, pool).unwrap_or_else(|end| end);
    d.outcome(end)
}

/// The endpoints, then the one loop.
fn run(d: &mut Driver, pool: &mut pool::Pool) -> Result<SearchEnd, SearchEnd> {
    let input = d.input;
    let parents: Vec<Vec<usize>> = input.range.iter().map(|c| c.parents.clone()).collect();
    let bisector = Bisector::new(&parents);
    let progress = (bisector.remaining(), bisector.estimated_steps());
    d.progress = progress;
    let mut bisector = bisector;
    let mut checks = driver::Checks::of(endpoints::end_checks(d));
    let ends = endpoints::probe_endpoints(d, pool, &mut bisector, &mut checks)?;
    let strategy: Box<dyn strategy::Strategy> = if ends.flaky() {
        // The Bayesian search takes the first round's runs as it takes any: once all are in.
        d.hold_all(pool);
        d.reporter.event(&Event::FlakyDetected {
            faults: ends.bad_runs.iter().filter(|&&f| f).count(),
            runs: ends.bad_runs.len(),
            confidence: input.flaky.confidence,
            max_runs: input.flaky.max_runs,
            workers: pool.size(),
        });
        let tip = input.range.len() - 1;
        let runs: Vec<(usize, bool)> = ends.bad_runs.iter().map(|&f| (tip, f)).collect();
        Box::new(d.flaky(&runs, progress))
    } else {
        Box::new(bisector)
    };
    let answer = d.drive(pool, strategy, checks)?;
    Ok(d.end_of(answer))
}

/// The culprit of a search that found one, when its bad verdict came from a remembered fault stack
/// rather than a sanitizer run of its own.
fn judged_from_memory(outcome: &SearchOutcome) -> Option<Oid> {
    let SearchEnd::Found(culprit) = outcome.end else {
        return None;
    };
    let sha = culprit.to_string();
    outcome
        .probes
        .iter()
        .rev()
        .find(|p| p.commit == sha && p.verdict == Verdict::Bad)
        .filter(|p| {
            p.sanitizer
                .as_deref()
                .is_some_and(|s| s.starts_with(REMEMBERED))
        })
        .map(|_| culprit)
}

/// The culprit's fault was judged by a stack the sanitizer settled at another commit. Before it is named,
/// the sanitizer looks at the culprit itself: one op can launch two kernels from the same lines. When it
/// names another kernel, the search runs again with nothing remembered (the journal replays the probes,
/// so only the sanitizer runs are paid again).
fn recheck_culprit(
    input: &SearchInput,
    pool: &mut pool::Pool,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
    mut outcome: SearchOutcome,
    culprit: Oid,
) -> SearchOutcome {
    let Some(target) = outcome.target.clone() else {
        return outcome;
    };
    let off = SettledStacks::off();
    let named = {
        let mut d = Driver::new(input, &mut *reporter, &off, cancel, pool.size());
        d.steps = outcome.steps;
        d.progress = (1, 0);
        let Ok((ctx, Some(s))) = d.sanitize_alone(pool, culprit, ProbeRole::Verify) else {
            return outcome;
        };
        let named = s.finding.as_ref().and_then(|f| f.kernel.clone());
        outcome.steps = ctx.step;
        let mut record = s.endpoint_record(culprit, &target, Verdict::Bad);
        record.role = ProbeRole::Verify;
        d.finish(ctx.step, &record);
        outcome.probes.push(record);
        named
    };
    match (named, target.kernel.as_deref()) {
        (Some(k), Some(want)) if k != want => {
            reporter.event(&Event::RememberedStackMisled {
                culprit: culprit.to_string(),
                named: k,
                expected: want.to_string(),
            });
            let again_input = SearchInput {
                steps_before: outcome.steps,
                ..input.clone()
            };
            let mut again = search_once(&again_input, pool, reporter, cancel, &off);
            let mut probes = std::mem::take(&mut outcome.probes);
            probes.append(&mut again.probes);
            again.probes = probes;
            again
        }
        _ => outcome,
    }
}
