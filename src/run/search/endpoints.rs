//! The endpoints, in the search's first round: the bad end on the first worker (its fault is the
//! target; on a shared GPU, the probe whose memory is measured) beside the good ends, the merge bases
//! ([`EndCheck`]: the loop settles them before it gives any answer) and the first probes of the range,
//! which are held until the bad end is settled. Then, where it needs them, the bad end's runs alone: run
//! again under `endpoint-runs` to tell a flaky fault, the target's kernel learned under the sanitizer.
//! Finding a fix, the first OLD end takes the bad end's place (its fault is the target) and the NEW end
//! is one of the checks. Each way the range can be wrong ends the search through `?`, every probe of the
//! round stopped.

use crate::bisect::Verdict;
use crate::classify::FaultClass;
use crate::report::record::{short_sha, ProbeRecord, ProbeRole};

use super::contract::{EndpointProblem, SearchEnd};
use super::driver::{Checks, Driver};
use super::end_check::EndCheck;
use super::judge::{host_failure, is_host_problem, reproduces};
use super::pool::Pool;
use super::strategy::Strategy;

/// What the bad end settled: the target (kept by the driver) and the bad end's runs.
pub(super) struct Endpoints {
    /// Whether each run of the bad end showed the target, in order.
    pub(super) bad_runs: Vec<bool>,
}

impl Endpoints {
    /// The bad end ran clean at least once: the fault is flaky.
    pub(super) fn flaky(&self) -> bool {
        self.bad_runs.iter().any(|&f| !f)
    }
}

/// Probes the bad end (finding a fix, the first OLD end) with the first round beside it (`strategy`'s
/// first picks, `checks` sent to idle workers). A refused range, or an interrupted one, stops every probe
/// of the round before it returns.
pub(super) fn probe_endpoints(
    d: &mut Driver,
    pool: &mut Pool,
    strategy: &mut dyn Strategy,
    checks: &mut Checks,
) -> Result<Endpoints, SearchEnd> {
    let opened = if d.input.finding_fix {
        probe_old_end(d, pool, strategy, checks)
    } else {
        probe_bad_end(d, pool, strategy, checks)
    };
    opened.inspect_err(|_| d.drop_round(pool))
}

/// Finding a fix: the first OLD end's run, whose fault every probe is measured by. It must show a fault
/// (one it shows only beside other probes runs again alone first); its kernel, when its output names
/// none, is learned under the sanitizer.
fn probe_old_end(
    d: &mut Driver,
    pool: &mut Pool,
    strategy: &mut dyn Strategy,
    checks: &mut Checks,
) -> Result<Endpoints, SearchEnd> {
    let Some((name, oid)) = d.input.goods.first().cloned() else {
        return Err(SearchEnd::EndpointsInvalid(EndpointProblem::NoOldCommit));
    };
    let role = ProbeRole::GoodEndpoint;
    let mut old = d.probe_opening(pool, (oid, role), strategy, checks)?;
    if pool.size() > 1 && !shows_the_fault(&old) {
        d.set_aside(
            oid,
            "ran beside other probes without showing the fault whose fix is looked for; run again alone",
        );
        pool.stop_all();
        d.hold_all(pool);
        old = d.probe_alone(pool, oid, role, true)?;
    }
    if is_host_problem(old.signature.class) {
        let msg = format!(
            "old commit {name} could not be judged: {}",
            old.signature.summary
        );
        return Err(SearchEnd::EndpointInfra(msg));
    }
    if !shows_the_fault(&old) {
        return Err(SearchEnd::EndpointsInvalid(
            EndpointProblem::FaultNotAtOld {
                old: name,
                seen: old.signature.short(),
            },
        ));
    }
    d.target = Some(old.signature.clone());
    learn_kernel(d, pool, (oid, Verdict::Good))?;
    if d.cancelled() {
        return Err(SearchEnd::Interrupted);
    }
    Ok(Endpoints {
        bad_runs: vec![true],
    })
}

/// Whether an OLD end's run (judged in find-fix terms, with nothing to compare it with yet) shows a fault
/// to find the fix of: the older state, and a fault, not a clean run or a build that failed.
fn shows_the_fault(old: &ProbeRecord) -> bool {
    old.verdict == Verdict::Good
        && !is_host_problem(old.signature.class)
        && !matches!(
            old.signature.class,
            FaultClass::None | FaultClass::BuildFailure
        )
}

/// The bad end's runs, and the target they settle.
fn probe_bad_end(
    d: &mut Driver,
    pool: &mut Pool,
    strategy: &mut dyn Strategy,
    checks: &mut Checks,
) -> Result<Endpoints, SearchEnd> {
    let input = d.input;
    let (bad_name, bad_oid) = input.bad;
    let mut bad = d.probe_opening(pool, (bad_oid, ProbeRole::BadEndpoint), strategy, checks)?;
    // One that would refuse the range beside other probes runs again alone before it does (a repro that
    // writes a path every worker shares can fail because of them): the crowded run says nothing, and
    // the round's probes still out are stopped (given back to the search, which runs them again).
    if pool.size() > 1 && refuses(&bad) {
        d.set_aside(
            bad_oid,
            "ran beside other probes without showing a fault to search for; run again alone",
        );
        pool.stop_all();
        d.hold_all(pool);
        bad = d.probe_alone(pool, bad_oid, ProbeRole::BadEndpoint, true)?;
    }
    // A flaky fault may not show on the bad end's first run: with `endpoint-runs`, run it again until it
    // does (each clean run counts as one of them), alone once the first round is in.
    let mut bad_runs = Vec::new();
    while bad.signature.class == FaultClass::None
        && (bad_runs.len() as u32 + 1) < input.flaky.endpoint_runs
    {
        bad_runs.push(false);
        d.hold_all(pool);
        bad = d.probe_alone(pool, bad_oid, ProbeRole::BadEndpoint, true)?;
    }
    if is_host_problem(bad.signature.class) {
        let msg = format!(
            "bad commit {bad_name} could not be judged: {}",
            bad.signature.summary
        );
        return Err(SearchEnd::EndpointInfra(msg));
    }
    if shows_nothing_to_search(&bad) {
        return Err(SearchEnd::EndpointsInvalid(
            EndpointProblem::BadDoesNotReproduce {
                bad: bad_name.to_string(),
                runs: bad_runs.len() + 1,
                seen: bad.signature.summary.clone(),
            },
        ));
    }
    d.target = Some(bad.signature.clone());
    learn_kernel(d, pool, (bad_oid, Verdict::Bad))?;
    if d.cancelled() {
        return Err(SearchEnd::Interrupted);
    }
    // More runs of the bad end: a clean one says the fault is flaky, and the search is the Bayesian one.
    bad_runs.push(true);
    while (bad_runs.len() as u32) < input.flaky.endpoint_runs {
        d.hold_all(pool);
        let rec = d.probe_alone(pool, bad_oid, ProbeRole::BadEndpoint, true)?;
        if let Some(msg) = host_failure(&rec) {
            return Err(SearchEnd::EndpointInfra(msg));
        }
        bad_runs.push(rec.verdict == Verdict::Bad);
    }
    Ok(Endpoints { bad_runs })
}

/// Whether the bad end's run refuses the range: the host could not judge it, or it shows no fault the
/// search can look for.
fn refuses(bad: &ProbeRecord) -> bool {
    is_host_problem(bad.signature.class) || shows_nothing_to_search(bad)
}

/// Whether the bad end's run is not bad, or (looking for a culprit) faults in no way a search can
/// follow.
fn shows_nothing_to_search(bad: &ProbeRecord) -> bool {
    bad.verdict != Verdict::Bad || !reproduces(&bad.signature)
}

/// Learns the target's kernel from the end that showed it (`oid`, judged `verdict`: the bad end, or
/// finding a fix the OLD end) under compute-sanitizer, when its own output does not name one, and
/// records that run as an endpoint check. The first worker ran that end last: the run is of its commit.
fn learn_kernel(
    d: &mut Driver,
    pool: &mut Pool,
    (oid, verdict): (git2::Oid, Verdict),
) -> Result<(), SearchEnd> {
    let Some(mut target) = d.target.clone().filter(|t| t.kernel.is_none()) else {
        return Ok(());
    };
    let (ctx, sanitized) = d.sanitize_alone(pool, oid, ProbeRole::EndpointSanitizer)?;
    let Some(s) = sanitized else {
        return Ok(());
    };
    let kernel = s.finding.as_ref().and_then(|f| f.kernel.clone());
    if let Some(k) = &kernel {
        // The target's own fault stack is now settled: a probe that faults with exactly that stack is
        // the target without a sanitizer run of its own.
        d.settled().remember(&target, k, &oid.to_string());
        target.kernel = kernel;
    }
    let record = s.endpoint_record(oid, &target, verdict);
    d.finish(ctx.step, &record);
    d.target = Some(target);
    Ok(())
}

/// The good ends and merge bases to check; finding a fix, the OLD ends after the first (which opens
/// the round), the NEW end and the merge bases.
pub(super) fn end_checks(d: &Driver) -> Vec<EndCheck> {
    let input = d.input;
    let (skip, kind) = if input.finding_fix {
        (1, "old")
    } else {
        (0, "good")
    };
    let new_end = input.finding_fix.then(|| EndCheck {
        what: format!("new commit {}", input.bad.0),
        name: input.bad.0.to_string(),
        oid: input.bad.1,
        role: ProbeRole::BadEndpoint,
    });
    input
        .goods
        .iter()
        .skip(skip)
        .map(|(name, oid)| EndCheck {
            what: format!("{kind} commit {name}"),
            name: name.clone(),
            oid: *oid,
            role: ProbeRole::GoodEndpoint,
        })
        .chain(new_end)
        .chain(input.merge_bases.iter().map(|oid| EndCheck {
            what: format!("merge base {}", short_sha(&oid.to_string())),
            name: oid.to_string(),
            oid: *oid,
            role: ProbeRole::MergeBase,
        }))
        .collect()
}
