//! The search driver: probes the bad endpoint (its signature becomes the target), the good endpoints and
//! any merge bases, then feeds the bisection state machine probe by probe. It sees the world only through
//! the [`Probe`] trait, so it is tested in-process with scripted fakes.

use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::bisect::{Bisector, NextStep, SearchResult, Verdict};
use crate::classify::{FaultClass, MatchPolicy, Sameness, Signature};
use crate::git::RangeCommit;
use crate::report::event::{Event, Reporter};
use crate::report::record::{OtherBug, ProbeRecord, ProbeRole};

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
    /// The same-bug policy.
    pub policy: &'a MatchPolicy,
    /// A good endpoint that fails with a bug told apart from the target (another class, kernel, launch
    /// site or exception) still counts as good: it does not show *this* bug. For the nightly job, which
    /// bisects a new bug from the last head that showed only an older one.
    pub goods_may_show_other_bugs: bool,
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
    /// The host broke during the search (the repro cannot start, the device is gone, infrastructure
    /// failures outlasted their retries): stopped, rather than skip every commit left.
    HostFailure(String),
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
    /// Bugs met that are not the target.
    pub other_bugs: Vec<OtherBug>,
}

/// A bad endpoint reproduces when it fails in a way that can be a target: not clean, not a build break,
/// not the machine's fault.
fn reproduces(sig: &Signature) -> bool {
    !matches!(sig.class, FaultClass::None | FaultClass::BuildFailure) && !is_host_problem(sig.class)
}

struct Driver<'p, 'r> {
    prober: &'p mut dyn Probe,
    reporter: &'r mut dyn Reporter,
    policy: &'p MatchPolicy,
    probes: Vec<ProbeRecord>,
    other_bugs: Vec<OtherBug>,
}

impl Driver<'_, '_> {
    fn context(&self, role: ProbeRole, search: &Bisector) -> ProbeContext {
        ProbeContext {
            step: self.probes.len() + 1,
            role,
            remaining: search.remaining(),
            estimated_steps: search.estimated_steps(),
        }
    }

    /// Probes one commit; `None` when the probe was interrupted. A probe that fails like the target but
    /// cannot be told apart from it by its own output is rerun under compute-sanitizer (once) when one is
    /// at hand, and a fault in another kernel is then a skip, recorded as another bug.
    fn probe(
        &mut self,
        oid: Oid,
        role: ProbeRole,
        search: &Bisector,
        target: Option<&Signature>,
    ) -> Option<ProbeRecord> {
        let ctx = self.context(role, search);
        let out = self.prober.probe(oid, &ctx, target, self.reporter);
        let mut record = out.record;
        if let Some(t) = target.filter(|_| record.verdict == Verdict::Bad && !out.interrupted) {
            if self.policy.compare(t, &record.signature, "") == Sameness::Unconfirmed {
                self.settle(oid, &ctx, t, &mut record);
            }
        }
        self.reporter.event(&Event::ProbeFinished {
            step: ctx.step,
            record: Box::new(record.clone()),
        });
        self.probes.push(record.clone());
        (!out.interrupted).then_some(record)
    }

    /// Asks the sanitizer which kernel a probe faulted in and turns a different one into a skip.
    fn settle(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        target: &Signature,
        record: &mut ProbeRecord,
    ) {
        let Some(s) = self.prober.sanitize(oid, ctx, self.reporter) else {
            return;
        };
        record.duration_s += s.duration_s;
        record.sanitizer = Some(s.summary.clone());
        let (Some(kernel), Some(want)) = (
            s.finding.as_ref().and_then(|f| f.kernel.clone()),
            target.kernel.as_deref(),
        ) else {
            return;
        };
        if kernel == want {
            record.signature.kernel = Some(kernel);
            return;
        }
        let reason = format!(
            "a different bug: this commit's fault is in {kernel}, the bad endpoint's in {want}"
        );
        record.signature.kernel = Some(kernel);
        record.verdict = Verdict::Skip;
        record.matched_target = false;
        record.reason = Some(reason.clone());
        self.other_bugs.push(OtherBug {
            commit: oid.to_string(),
            signature: record.signature.clone(),
            reason,
        });
    }

    /// Learns the target's kernel from the bad endpoint under compute-sanitizer, when its own output does
    /// not name one, and records that run as an endpoint check.
    fn learn_kernel(&mut self, oid: Oid, search: &Bisector, target: &mut Signature) {
        if target.kernel.is_some() {
            return;
        }
        let ctx = self.context(ProbeRole::EndpointSanitizer, search);
        let Some(s) = self.prober.sanitize(oid, &ctx, self.reporter) else {
            return;
        };
        let kernel = s.finding.as_ref().and_then(|f| f.kernel.clone());
        if kernel.is_some() {
            target.kernel = kernel;
        }
        let record = ProbeRecord {
            commit: oid.to_string(),
            role: ProbeRole::EndpointSanitizer,
            verdict: Verdict::Bad,
            signature: s.finding.unwrap_or_else(|| target.clone()),
            matched_target: true,
            reason: None,
            exit_code: None,
            signal: None,
            duration_s: s.duration_s,
            build_log: None,
            log: None,
            sanitizer: Some(s.summary),
            attempts: 1,
            reused: false,
        };
        self.reporter.event(&Event::ProbeFinished {
            step: ctx.step,
            record: Box::new(record.clone()),
        });
        self.probes.push(record);
    }

    fn end(self, end: SearchEnd, target: Option<Signature>) -> SearchOutcome {
        SearchOutcome {
            end,
            target,
            probes: self.probes,
            other_bugs: self.other_bugs,
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
        policy: input.policy,
        probes: Vec::new(),
        other_bugs: Vec::new(),
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
    let mut target = bad.signature.clone();
    d.learn_kernel(input.bad.1, &bisector, &mut target);
    if cancel.load(Ordering::SeqCst) {
        return d.end(SearchEnd::Interrupted, Some(target));
    }
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
        let other_bug = input.goods_may_show_other_bugs
            && role == ProbeRole::GoodEndpoint
            && reproduces(&rec.signature)
            && input.policy.compare(&target, &rec.signature, "") == Sameness::Different;
        if other_bug {
            d.reporter.event(&Event::Note {
                message: format!(
                    "{what} shows another bug ({}), not this one: it counts as good for this search",
                    rec.signature.short()
                ),
            });
            continue;
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
                // Infrastructure failures were retried inside the probe: what is left says the machine
                // is broken, and so would every probe after it. A missing object is the clone's, not the
                // host's: that commit alone is skipped.
                if matches!(
                    rec.signature.class,
                    FaultClass::Infra | FaultClass::ExecFailure
                ) {
                    let msg = format!(
                        "stopped: the host failed at {}: {}",
                        &rec.commit[..12.min(rec.commit.len())],
                        rec.signature.summary
                    );
                    return d.end(SearchEnd::HostFailure(msg), Some(target));
                }
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
