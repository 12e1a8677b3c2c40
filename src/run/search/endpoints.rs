//! The endpoints: the bad end first, alone (its fault is the target, run again under `endpoint-runs` to
//! tell a flaky fault; the target's kernel learned under the sanitizer; on a shared GPU, the probe whose
//! memory is measured), then the good ends and the merge bases, which run in the search's first round
//! beside its first probes ([`EndCheck`]: the loop settles them before it gives any answer). Each way the
//! range can be wrong ends the search through `?`.

use git2::Oid;

use crate::bisect::Verdict;
use crate::classify::{FaultClass, Sameness};
use crate::report::event::Event;
use crate::report::record::{short_sha, ProbeRecord, ProbeRole};

use super::driver::{host_failure, Driver};
use super::judge::{is_host_problem, reproduces};
use super::pool::Pool;
use super::{EndpointProblem, SearchEnd};

/// What the bad end settled: the target (kept by the driver) and the bad end's runs; and the checks of
/// the other ends, still to run.
pub(super) struct Endpoints {
    /// Whether each run of the bad end showed the target, in order.
    pub(super) bad_runs: Vec<bool>,
    /// The good ends and merge bases, each to run once and pass.
    pub(super) checks: Vec<EndCheck>,
}

/// A good end or merge base the search's first round runs: it must not show the target.
#[derive(Clone, Debug)]
pub(super) struct EndCheck {
    /// What it is, for messages (`good commit v1`, `merge base 1a2b3c4d5e6f`).
    pub(super) what: String,
    /// The commit.
    pub(super) oid: Oid,
    /// `GoodEndpoint` or `MergeBase`.
    pub(super) role: ProbeRole,
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

/// Settles one check by its judged record: the good ends and merge bases must not show the target.
pub(super) fn settle_check(
    d: &mut Driver,
    check: &EndCheck,
    rec: &ProbeRecord,
) -> Result<(), SearchEnd> {
    let input = d.input;
    let what = check.what.clone();
    let role = check.role;
    if is_host_problem(rec.signature.class) {
        let msg = format!("{what} could not be judged: {}", rec.signature.summary);
        return Err(SearchEnd::EndpointInfra(msg));
    }
    let other_bug = input.goods_may_show_other_bugs
        && role == ProbeRole::GoodEndpoint
        && reproduces(&rec.signature)
        && d.target
            .as_ref()
            .is_some_and(|t| input.policy.compare(t, &rec.signature, "") == Sameness::Different);
    if other_bug {
        d.reporter.event(&Event::GoodShowsOtherBug {
            what,
            commit: rec.commit.clone(),
            signature: rec.signature.short(),
        });
        return Ok(());
    }
    match (rec.verdict, role) {
        (Verdict::Good, _) => Ok(()),
        // git's wording: the good commit is on another line of history where the bug was fixed.
        (Verdict::Bad, ProbeRole::MergeBase) => {
            Err(SearchEnd::EndpointsInvalid(EndpointProblem::MergeBaseBad {
                what,
            }))
        }
        _ => Err(SearchEnd::EndpointsInvalid(
            EndpointProblem::GoodDoesNotPass {
                what,
                seen: rec.signature.short(),
            },
        )),
    }
}
