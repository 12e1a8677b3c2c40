//! The endpoints: the bad end first, alone (its fault is the target, run again under `endpoint-runs` to
//! tell a flaky fault; the target's kernel learned under the sanitizer; on a shared GPU, the probe whose
//! memory is measured), then the good ends and the merge bases, which run in the search's first round
//! beside its first probes ([`EndCheck`]: the loop settles them before it gives any answer). Each way the
//! range can be wrong ends the search through `?`.

use crate::bisect::Verdict;
use crate::classify::FaultClass;
use crate::report::record::{short_sha, ProbeRole};

use super::contract::{EndpointProblem, SearchEnd};
use super::driver::Driver;
use super::end_check::EndCheck;
use super::judge::{host_failure, is_host_problem, reproduces};
use super::pool::Pool;

/// What the bad end settled: the target (kept by the driver) and the bad end's runs; and the checks of
/// the other ends, still to run.
pub(super) struct Endpoints {
    /// Whether each run of the bad end showed the target, in order.
    pub(super) bad_runs: Vec<bool>,
    /// The good ends and merge bases, each to run once and pass.
    pub(super) checks: Vec<EndCheck>,
}

impl Endpoints {
    /// The bad end ran clean at least once: the fault is flaky.
    pub(super) fn flaky(&self) -> bool {
        self.bad_runs.iter().any(|&f| !f)
    }
}

/// Probes the bad end on the first worker, alone; the checks of the other ends are returned to run in the
/// first round.
pub(super) fn probe_endpoints(d: &mut Driver, pool: &mut Pool) -> Result<Endpoints, SearchEnd> {
    let input = d.input;
    let (bad_name, bad_oid) = input.bad;
    let mut bad = d.probe_alone(pool, bad_oid, ProbeRole::BadEndpoint, false)?;
    // A flaky fault may not show on the bad end's first run: with `endpoint-runs`, run it again until it
    // does (each clean run counts as one of them).
    let mut bad_runs = Vec::new();
    while bad.signature.class == FaultClass::None
        && (bad_runs.len() as u32 + 1) < input.flaky.endpoint_runs
    {
        bad_runs.push(false);
        bad = d.probe_alone(pool, bad_oid, ProbeRole::BadEndpoint, true)?;
    }
    if is_host_problem(bad.signature.class) {
        let msg = format!(
            "bad commit {bad_name} could not be judged: {}",
            bad.signature.summary
        );
        return Err(SearchEnd::EndpointInfra(msg));
    }
    let finding_fix = input.fix_of.is_some();
    if bad.verdict != Verdict::Bad || (!finding_fix && !reproduces(&bad.signature)) {
        return Err(SearchEnd::EndpointsInvalid(
            EndpointProblem::BadDoesNotReproduce {
                bad: bad_name.to_string(),
                runs: bad_runs.len() + 1,
                seen: bad.signature.summary.clone(),
            },
        ));
    }
    d.target = Some(bad.signature.clone());
    // Finding a fix, every probe is measured by the older end's fault, whose kernel is known already.
    if !finding_fix {
        learn_kernel(d, pool)?;
    }
    if d.cancelled() {
        return Err(SearchEnd::Interrupted);
    }
    // More runs of the bad end: a clean one says the fault is flaky, and the search is the Bayesian one.
    bad_runs.push(true);
    while (bad_runs.len() as u32) < input.flaky.endpoint_runs {
        let rec = d.probe_alone(pool, bad_oid, ProbeRole::BadEndpoint, true)?;
        if let Some(msg) = host_failure(&rec) {
            return Err(SearchEnd::EndpointInfra(msg));
        }
        bad_runs.push(rec.verdict == Verdict::Bad);
    }
    Ok(Endpoints {
        bad_runs,
        checks: end_checks(d),
    })
}

/// Learns the target's kernel from the bad endpoint under compute-sanitizer, when its own output does
/// not name one, and records that run as an endpoint check.
fn learn_kernel(d: &mut Driver, pool: &mut Pool) -> Result<(), SearchEnd> {
    let Some(mut target) = d.target.clone().filter(|t| t.kernel.is_none()) else {
        return Ok(());
    };
    let oid = d.input.bad.1;
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
    let record = s.endpoint_record(oid, &target, Verdict::Bad);
    d.finish(ctx.step, &record);
    d.target = Some(target);
    Ok(())
}

/// The good ends and merge bases to check.
fn end_checks(d: &Driver) -> Vec<EndCheck> {
    let input = d.input;
    input
        .goods
        .iter()
        .map(|(name, oid)| EndCheck {
            what: format!("good commit {name}"),
            oid: *oid,
            role: ProbeRole::GoodEndpoint,
        })
        .chain(input.merge_bases.iter().map(|oid| EndCheck {
            what: format!("merge base {}", short_sha(&oid.to_string())),
            oid: *oid,
            role: ProbeRole::MergeBase,
        }))
        .collect()
}
