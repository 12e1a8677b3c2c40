//! `start --find-fix OLD..NEW`: the first commit where a fault is gone. The search is the ordinary one on
//! the same graph, with the states swapped: a commit that shows the fault (as the OLD end shows it) is in
//! the older state, a clean one in the newer, anything else a skip. The search's judge swaps the
//! verdicts around; the journal underneath keeps what each commit did, not the swapped verdicts.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

use git2::Oid;

use crate::classify::Signature;
use crate::report::event::Reporter;

use super::journal::JournaledProbe;
use super::plan::Plan;
use super::probe::prober::{Probe, ProbeContext, ProbeOutcome, Sanitized};
use super::search::judge::{judge, swapped, Kernel, Terms};
use super::search::{
    search_with_workers, EndpointProblem, SearchEnd, SearchInput, SearchOutcome, Worker,
};
use crate::report::event::Event;
use crate::report::record::{short_sha, ProbeRole};

/// A [`Probe`] that answers for the OLD ends from what was seen of them before the search (so they are
/// not run twice) and passes everything else to the prober. The search's judge measures every probe by
/// the OLD end's fault with the verdicts swapped ([`SearchInput::fix_of`]).
pub struct FixProbe<'a> {
    /// The prober (journaled) that runs the commits.
    pub inner: &'a mut dyn Probe,
    /// The flag that stops this worker's probe.
    pub stop: &'a AtomicBool,
    /// Endpoints already probed before the search, by commit (their observations as the prober gave
    /// them).
    pub known: HashMap<Oid, ProbeOutcome>,
}

impl Probe for FixProbe<'_> {
    fn probe(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        match self.known.remove(&oid) {
            Some(mut known) => {
                known.record.role = ctx.role;
                known
            }
            None => self.inner.probe(oid, ctx, target, reporter),
        }
    }

    fn sanitize(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        self.inner.sanitize(oid, ctx, reporter)
    }

    fn shared_gpu(&self) -> Option<String> {
        self.inner.shared_gpu()
    }
}

/// What to know before backporting a fix, as git's bisect says it for merges: a fix that is a merge
/// commit (its parents still fault: the fix is how the branches met), or a fix that reached NEW
/// through a merge (not on NEW's first-parent line).
pub fn fix_caveats(plan: &Plan, fix: Oid, first_parent: bool) -> Vec<String> {
    let mut notes = Vec::new();
    let parents = plan.repo.parents(fix).unwrap_or_default();
    if parents.len() > 1 && first_parent {
        notes.push(format!(
            "the fix {} is the merge that brought it to this line (--first-parent judges a merge by its first parent): the commit that fixed it is on the merged branch; run without --first-parent to name it",
            short_sha(&fix.to_string())
        ));
    } else if parents.len() > 1 {
        notes.push(format!(
            "the fix {} is a merge, and each of its parents still shows the fault: the fault is gone only where the branches meet, so backport what the merge combines, not one side",
            short_sha(&fix.to_string())
        ));
    }
    let mut on_line = false;
    let mut at = Some(plan.bad.1);
    let mut steps = 0usize;
    while let Some(c) = at {
        if c == fix {
            on_line = true;
            break;
        }
        steps += 1;
        if steps > 1_000_000 {
            break;
        }
        at = plan.repo.parents(c).ok().and_then(|p| p.first().copied());
        if plan.goods.iter().any(|g| Some(g.1) == at) {
            break;
        }
    }
    if !on_line {
        notes.push(format!(
            "the fix {} is on a side branch that reached {} through a merge: that merge is where the fix arrived on this line",
            short_sha(&fix.to_string()),
            plan.bad.0
        ));
    }
    notes
}

/// `--find-fix`: the OLD end is probed first and must show the fault; the search then runs on the same
/// graph with every probe judged against that fault and its verdict swapped ([`FixProbe`]).
pub fn search_for_fix(
    plan: &Plan,
    input: &SearchInput,
    journaled: &mut [JournaledProbe],
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> SearchOutcome {
    let ended =
        |end: SearchEnd, probes: Vec<crate::report::record::ProbeRecord>, target| SearchOutcome {
            end,
            target,
            steps: plan.goods.len(),
            probes,
            other_bugs: Vec::new(),
            flaky: None,
            at_once: 1,
        };
    let Some(first) = journaled.first_mut() else {
        return ended(
            SearchEnd::HostFailure("no probe worker".into()),
            Vec::new(),
            None,
        );
    };
    let mut known = HashMap::new();
    let mut probes = Vec::new();
    let mut fault = match probe_old_ends(plan, first, (&mut probes, &mut known), reporter) {
        Ok(fault) => fault,
        Err(stop) => {
            let (end, fault) = *stop;
            return ended(end, probes, fault);
        }
    };
    // The fault's kernel, when its output names none, from the OLD end under compute-sanitizer: what
    // tells it from another bug of its class at the commits after the fix.
    if fault.kernel.is_none() {
        kernel_from_the_old_end(plan, first, &mut fault, &mut probes, reporter);
    }
    // Every worker knows them: the search's first round checks the OLD ends on whichever worker is
    // idle, while the first probes the NEW end.
    let mut fixers: Vec<FixProbe> = journaled
        .iter_mut()
        .map(|j| {
            let stop = j.cancel;
            FixProbe {
                inner: j,
                stop,
                known: known.clone(),
            }
        })
        .collect();
    // The search numbers its probes after the OLD ends'.
    let input = &SearchInput {
        fix_of: Some(fault.clone()),
        steps_before: plan.goods.len(),
        ..input.clone()
    };
    let mut workers: Vec<Worker> = fixers
        .iter_mut()
        .map(|f| {
            let stop = f.stop;
            Worker { probe: f, stop }
        })
        .collect();
    let mut outcome = search_with_workers(input, &mut workers, reporter, cancel);
    drop(workers);
    // The search's target is the NEW end's clean run; the fault it measured by is the OLD end's.
    outcome.target = Some(fault);
    // The search's bad end is the NEW end: not reproducing there means the fault is not gone.
    if let SearchEnd::EndpointsInvalid(EndpointProblem::BadDoesNotReproduce { .. }) = &outcome.end {
        let still = outcome
            .probes
            .iter()
            .find(|p| p.role == ProbeRole::BadEndpoint)
            .map(|p| p.signature.short())
            .unwrap_or_default();
        outcome.end = SearchEnd::EndpointsInvalid(EndpointProblem::FaultNotGone {
            new: input.bad.0.to_string(),
            seen: still,
        });
    }
    probes.append(&mut outcome.probes);
    outcome.probes = probes;
    outcome
}

/// The old ends probed in turn, in the first worker: each must show the fault (the first's signature is
/// the fault whose fix is looked for), and is kept in `known` for the search to reuse. `Err`: the run
/// ends there (how, and the fault as far as it was known).
fn probe_old_ends(
    plan: &Plan,
    first: &mut JournaledProbe,
    (probes, known): (
        &mut Vec<crate::report::record::ProbeRecord>,
        &mut std::collections::HashMap<git2::Oid, super::probe::prober::ProbeOutcome>,
    ),
    reporter: &mut dyn Reporter,
) -> Result<crate::classify::Signature, Box<(SearchEnd, Option<crate::classify::Signature>)>> {
    let mut fault: Option<crate::classify::Signature> = None;
    for (k, (name, oid)) in plan.goods.iter().enumerate() {
        let ctx = super::probe::prober::ProbeContext {
            step: k + 1,
            role: ProbeRole::GoodEndpoint,
            remaining: plan.range.len(),
            estimated_steps: 1,
            worker: None,
            repeat: None,
            crowded: false,
        };
        let out = super::probe::prober::Probe::probe(first, *oid, &ctx, fault.as_ref(), reporter);
        if out.interrupted {
            return Err(Box::new((SearchEnd::Interrupted, fault)));
        }
        let terms = Terms {
            target: fault.as_ref(),
            policy: &plan.config.match_policy,
            swapped: false,
        };
        let j = judge(&out.record.signature, &out.output, terms, Kernel::Unknown);
        let mut rec = out.record.clone();
        rec.verdict = j.verdict;
        rec.matched_target = j.matched_target;
        rec.reason = j.reason;
        // Reported here only when it ends the run; otherwise the search reports it as its old end.
        let mut report_it = |probes: &mut Vec<crate::report::record::ProbeRecord>| {
            let shown = crate::report::record::ProbeRecord {
                verdict: swapped(rec.verdict),
                ..rec.clone()
            };
            reporter.event(&Event::ProbeFinished {
                step: ctx.step,
                record: Box::new(shown.clone()),
            });
            probes.push(shown);
        };
        let class = rec.signature.class;
        if super::search::judge::is_host_problem(class) {
            report_it(probes);
            let msg = format!(
                "old commit {name} could not be judged: {}",
                rec.signature.summary
            );
            return Err(Box::new((SearchEnd::EndpointInfra(msg), fault)));
        }
        if rec.verdict != crate::bisect::Verdict::Bad
            || matches!(
                class,
                crate::classify::FaultClass::None | crate::classify::FaultClass::BuildFailure
            )
        {
            report_it(probes);
            let problem = EndpointProblem::FaultNotAtOld {
                old: name.clone(),
                seen: rec.signature.short(),
            };
            return Err(Box::new((SearchEnd::EndpointsInvalid(problem), fault)));
        }
        fault.get_or_insert(rec.signature.clone());
        known.insert(*oid, out);
    }
    fault.ok_or_else(|| {
        Box::new((
            SearchEnd::EndpointsInvalid(EndpointProblem::NoOldCommit),
            None,
        ))
    })
}

/// The fault's kernel, when its output names none, from the first old end under compute-sanitizer.
fn kernel_from_the_old_end(
    plan: &Plan,
    first: &mut JournaledProbe,
    fault: &mut crate::classify::Signature,
    probes: &mut Vec<crate::report::record::ProbeRecord>,
    reporter: &mut dyn Reporter,
) {
    let old = plan.goods[0].1;
    let ctx = super::probe::prober::ProbeContext {
        step: 1,
        role: ProbeRole::EndpointSanitizer,
        remaining: plan.range.len(),
        estimated_steps: 1,
        worker: None,
        repeat: None,
        crowded: false,
    };
    if let Some(s) = super::probe::prober::Probe::sanitize(first, old, &ctx, reporter) {
        let kernel = s.finding.as_ref().and_then(|f| f.kernel.clone());
        probes.push(s.endpoint_record(old, fault, crate::bisect::Verdict::Good));
        if kernel.is_some() {
            fault.kernel = kernel;
        }
    }
}
