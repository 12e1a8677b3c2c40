//! The search driver: probes the bad endpoint (its signature becomes the target), the good endpoints and
//! any merge bases, then feeds the bisection state machine probe by probe. It sees the world only through
//! the [`Probe`] trait, so it is tested in-process with scripted fakes.

use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::bisect::{Bisector, NextStep, SearchResult, Verdict};
use crate::classify::{FaultClass, Signature};
use crate::git::RangeCommit;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ProbeRecord, ProbeRole};

use super::probe::{Probe, ProbeContext};
use super::verdict::is_host_problem;

/// What the search starts from, validated by the plan.
#[derive(Clone, Debug)]
pub struct SearchInput<'a> {
    /// The candidates, in topological order with the bad endpoint last.
    pub range: &'a [RangeCommit],
    /// The bad revision as given, and its commit.
    pub bad: (&'a str, Oid),
    /// Good revisions to check (those implied by another good one are left out).
    pub goods: &'a [(String, Oid)],
    /// Merge bases of goods that are not ancestors of the bad commit: they must be good too.
    pub merge_bases: &'a [Oid],
}

/// How the search ended.
#[derive(Clone, Debug, PartialEq)]
pub enum SearchEnd {
    /// One first bad commit.
    Found(Oid),
    /// Skips left several candidates, in topological order.
    Ambiguous(Vec<Oid>),
    /// An endpoint says the range is wrong (a message saying which and why).
    EndpointsInvalid(String),
    /// An endpoint could not be judged because the machine or the clone failed.
    EndpointInfra(String),
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

/// The search's result and every probe it ran.
#[derive(Clone, Debug)]
pub struct SearchOutcome {
    /// How it ended.
    pub end: SearchEnd,
    /// The bad endpoint's signature, once probed and reproducing.
    pub target: Option<Signature>,
    /// Every probe, in the order run.
    pub probes: Vec<ProbeRecord>,
}

/// A bad endpoint reproduces when it fails in a way that can be a target: not clean, not a build break,
/// not the machine's fault.
fn reproduces(sig: &Signature) -> bool {
    !matches!(sig.class, FaultClass::None | FaultClass::BuildFailure) && !is_host_problem(sig.class)
}

struct Driver<'p, 'r> {
    prober: &'p mut dyn Probe,
    reporter: &'r mut dyn Reporter,
    probes: Vec<ProbeRecord>,
}

impl Driver<'_, '_> {
    /// Probes one commit; `None` when the probe was interrupted.
    fn probe(
        &mut self,
        oid: Oid,
        role: ProbeRole,
        search: &Bisector,
        target: Option<&Signature>,
    ) -> Option<ProbeRecord> {
        let ctx = ProbeContext {
            step: self.probes.len() + 1,
            role,
            remaining: search.remaining(),
            estimated_steps: search.estimated_steps(),
        };
        let out = self.prober.probe(oid, &ctx, target, self.reporter);
        self.reporter.event(&Event::ProbeFinished {
            step: ctx.step,
            record: Box::new(out.record.clone()),
        });
        self.probes.push(out.record.clone());
        (!out.interrupted).then_some(out.record)
    }

    fn end(self, end: SearchEnd, target: Option<Signature>) -> SearchOutcome {
        SearchOutcome {
            end,
            target,
            probes: self.probes,
        }
    }
}

/// Runs the whole search.
pub fn search(
    input: &SearchInput,
    prober: &mut dyn Probe,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> SearchOutcome {
    let parents: Vec<Vec<usize>> = input.range.iter().map(|c| c.parents.clone()).collect();
    let mut bisector = Bisector::new(&parents);
    let mut d = Driver {
        prober,
        reporter,
        probes: Vec::new(),
    };
    // The bad endpoint first: what it shows is the target.
    let Some(bad) = d.probe(input.bad.1, ProbeRole::BadEndpoint, &bisector, None) else {
        return d.end(SearchEnd::Interrupted, None);
    };
    if is_host_problem(bad.signature.class) {
        let msg = format!(
            "bad commit {} could not be judged: {}",
            input.bad.0, bad.signature.summary
        );
        return d.end(SearchEnd::EndpointInfra(msg), None);
    }
    if bad.verdict != Verdict::Bad || !reproduces(&bad.signature) {
        let msg = format!(
            "bad commit {} does not reproduce: {}",
            input.bad.0, bad.signature.summary
        );
        return d.end(SearchEnd::EndpointsInvalid(msg), None);
    }
    let target = bad.signature.clone();
    let checks = input
        .goods
        .iter()
        .map(|(name, oid)| (format!("good commit {name}"), *oid, ProbeRole::GoodEndpoint))
        .chain(input.merge_bases.iter().map(|oid| {
            let short = oid.to_string()[..12].to_string();
            (format!("merge base {short}"), *oid, ProbeRole::MergeBase)
        }));
    for (what, oid, role) in checks.collect::<Vec<_>>() {
        if cancel.load(Ordering::SeqCst) {
            return d.end(SearchEnd::Interrupted, Some(target));
        }
        let Some(rec) = d.probe(oid, role, &bisector, Some(&target)) else {
            return d.end(SearchEnd::Interrupted, Some(target));
        };
        if is_host_problem(rec.signature.class) {
            let msg = format!("{what} could not be judged: {}", rec.signature.summary);
            return d.end(SearchEnd::EndpointInfra(msg), Some(target));
        }
        match (rec.verdict, role) {
            (Verdict::Good, _) => {}
            (Verdict::Bad, ProbeRole::MergeBase) => {
                // git's wording: the good commit is on another line of history where the bug was fixed.
                let msg = format!(
                    "{what} is bad: the bug was fixed between it and the good commit; bisect from the merge base or give another good commit"
                );
                return d.end(SearchEnd::EndpointsInvalid(msg), Some(target));
            }
            _ => {
                let msg = format!("{what} does not pass: {}", rec.signature.short());
                return d.end(SearchEnd::EndpointsInvalid(msg), Some(target));
            }
        }
    }
    loop {
        if cancel.load(Ordering::SeqCst) {
            return d.end(SearchEnd::Interrupted, Some(target));
        }
        match bisector.next_step() {
            NextStep::Evaluate(i) => {
                let oid = input.range[i].oid;
                let Some(rec) = d.probe(oid, ProbeRole::Search, &bisector, Some(&target)) else {
                    return d.end(SearchEnd::Interrupted, Some(target));
                };
                bisector.mark(i, rec.verdict);
            }
            // One probe at a time is in flight, and it was just marked: the machine always has a step.
            NextStep::Wait => return d.end(SearchEnd::Interrupted, Some(target)),
            NextStep::Done(SearchResult::Found(i)) => {
                return d.end(SearchEnd::Found(input.range[i].oid), Some(target))
            }
            NextStep::Done(SearchResult::Ambiguous(ix)) => {
                let oids = ix.iter().map(|&i| input.range[i].oid).collect();
                return d.end(SearchEnd::Ambiguous(oids), Some(target));
            }
        }
    }
}
