//! The search driver: probes the bad endpoint (its signature becomes the target), the good endpoints and
//! any merge bases, then feeds the bisection state machine probe by probe, or, with several workers, keeps
//! every worker busy with the commits that split the candidates most evenly and uses each answer the
//! moment it lands. It sees the world only through the [`Probe`] trait, so it is tested in-process with
//! scripted fakes.

use crate::report::record::short_sha;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use git2::Oid;

use crate::bisect::{rates_differ, BayesSearch, BayesStep};
use crate::bisect::{Bisector, NextStep, SearchResult, Verdict};
use crate::classify::{FaultClass, MatchPolicy, Sameness, Signature};
use crate::git::RangeCommit;
use crate::report::event::{Event, Reporter};
use crate::report::record::{FlakyAnswer, OtherBug, ProbeRecord, ProbeRole, Verification};
use crate::run::settled::{SettledStacks, REMEMBERED};

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
    /// Runs of the bad end at the start, and what a flaky search needs.
    pub flaky: crate::config::FlakySettings,
    /// Finding a fix: the bad end's probe is the fault being gone (a clean run), which is its newer
    /// state, and the target is what every probe is measured by.
    pub find_fix: bool,
}

/// How the search ended.
#[derive(Clone, Debug, PartialEq)]
pub enum SearchEnd {
    /// One first bad commit.
    Found(Oid),
    /// The search named a commit, and running it and its parents alone did not bear it out (finding a
    /// fix: the fixed commit faults, or its parent is clean): why.
    Unverified(Oid, String),
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
    /// When the fault showed on only some runs of the bad end: the flaky search's answer.
    pub flaky: Option<FlakyAnswer>,
}

/// A bad endpoint reproduces when it fails in a way that can be a target: not clean, not a build break,
/// not the machine's fault.
fn reproduces(sig: &Signature) -> bool {
    !matches!(sig.class, FaultClass::None | FaultClass::BuildFailure) && !is_host_problem(sig.class)
}

/// One parallel worker as the search sees it: a prober of its own (its own worktree, warm build directory
/// and devices) and the flag that stops its probe (set on Ctrl-C, or when its answer no longer matters).
pub struct Worker<'a> {
    /// The prober.
    pub probe: &'a mut dyn Probe,
    /// Stops the probe in flight.
    pub stop: &'a AtomicBool,
}

/// One probe's result, with the other bug its sanitizer run found, if any.
struct Probed {
    record: ProbeRecord,
    interrupted: bool,
    other_bug: Option<OtherBug>,
}

/// Probes one commit. A probe that fails like the target but cannot be told apart from it by its own
/// output is rerun under compute-sanitizer (once) when one is at hand, and a fault in another kernel is
/// then a skip, recorded as another bug. Runs on the driver's thread or a worker's.
fn probe_commit(
    prober: &mut dyn Probe,
    policy: &MatchPolicy,
    settled: &SettledStacks,
    oid: Oid,
    ctx: &ProbeContext,
    target: Option<&Signature>,
    reporter: &mut dyn Reporter,
) -> Probed {
    let out = prober.probe(oid, ctx, target, reporter);
    let mut record = out.record;
    let mut other_bug = None;
    if let Some(t) = target.filter(|_| record.verdict == Verdict::Bad && !out.interrupted) {
        if policy.compare(t, &record.signature, "") == Sameness::Unconfirmed {
            // The same fault stack as one the sanitizer settled earlier in this run takes its answer;
            // any other is settled now, once, and remembered.
            let before = record.signature.clone();
            if let Some(known) = settled.get(&before) {
                record.sanitizer = Some(format!(
                    "{REMEMBERED} {} ({})",
                    short_sha(&known.commit),
                    known.kernel
                ));
                other_bug = judge_by_kernel(oid, t, &mut record, known.kernel);
            } else {
                other_bug = settle(prober, oid, ctx, t, &mut record, reporter);
                if let Some(k) = record
                    .signature
                    .kernel
                    .as_deref()
                    .filter(|_| record.sanitizer.is_some())
                {
                    settled.remember(&before, k, &oid.to_string());
                }
            }
        }
    }
    // A device fault told apart from the target by its own output (another kernel named at launch,
    // another launch site or exception) is another bug, as one the sanitizer told apart is.
    if other_bug.is_none() && target.is_some() && !out.interrupted {
        if let (Verdict::Skip, true) = (record.verdict, record.signature.class.is_device_fault()) {
            other_bug = Some(OtherBug {
                commit: oid.to_string(),
                signature: record.signature.clone(),
                reason: record
                    .reason
                    .clone()
                    .unwrap_or_else(|| "a different bug".into()),
            });
        }
    }
    Probed {
        record,
        interrupted: out.interrupted,
        other_bug,
    }
}

/// Asks the sanitizer which kernel a probe faulted in and turns a different one into a skip.
pub(crate) fn settle(
    prober: &mut dyn Probe,
    oid: Oid,
    ctx: &ProbeContext,
    target: &Signature,
    record: &mut ProbeRecord,
    reporter: &mut dyn Reporter,
) -> Option<OtherBug> {
    let s = prober.sanitize(oid, ctx, reporter)?;
    record.duration_s += s.duration_s;
    record.sanitizer = Some(s.summary.clone());
    let kernel = s.finding.as_ref().and_then(|f| f.kernel.clone())?;
    judge_by_kernel(oid, target, record, kernel)
}

/// Judges a probe by the kernel its fault is known to be in: the target's keeps its verdict (with the
/// kernel named), another one's is a skip, recorded as another bug.
fn judge_by_kernel(
    oid: Oid,
    target: &Signature,
    record: &mut ProbeRecord,
    kernel: String,
) -> Option<OtherBug> {
    let want = target.kernel.as_deref()?;
    if kernel == want {
        record.signature.kernel = Some(kernel);
        return None;
    }
    let reason = format!(
        "a different bug: this commit's fault is in {kernel}, the bad endpoint's in {want}"
    );
    record.signature.kernel = Some(kernel);
    record.verdict = Verdict::Skip;
    record.matched_target = false;
    record.reason = Some(reason.clone());
    Some(OtherBug {
        commit: oid.to_string(),
        signature: record.signature.clone(),
        reason,
    })
}

/// Forwards a worker's events to the driver, which hands them to the real reporter in order of arrival.
struct ChannelReporter {
    tx: mpsc::Sender<Message>,
}

impl Reporter for ChannelReporter {
    fn event(&mut self, event: &Event) {
        let _ = self.tx.send(Message::Event(event.clone()));
    }
}

/// What workers tell the driver.
enum Message {
    Event(Event),
    Done {
        worker: usize,
        index: usize,
        step: usize,
        probed: Box<Probed>,
    },
}

/// A probe handed to a worker.
struct Job {
    index: usize,
    oid: Oid,
    ctx: ProbeContext,
    target: Signature,
}

/// How often the driver looks at Ctrl-C while every worker is busy.
const POLL: Duration = Duration::from_millis(50);

struct Driver<'p, 'r> {
    reporter: &'r mut dyn Reporter,
    policy: &'p MatchPolicy,
    /// The fault stacks the sanitizer settled in this search.
    settled: &'p SettledStacks,
    probes: Vec<ProbeRecord>,
    other_bugs: Vec<OtherBug>,
    /// Probe numbers handed out so far (probes in flight included).
    steps: usize,
    /// Workers there are: progress names the worker of every probe when there are several.
    workers: usize,
}

impl Driver<'_, '_> {
    fn context(&mut self, role: ProbeRole, search: &Bisector, worker: usize) -> ProbeContext {
        self.steps += 1;
        ProbeContext {
            step: self.steps,
            role,
            remaining: search.remaining(),
            estimated_steps: search.estimated_steps(),
            worker: (self.workers > 1).then_some(worker + 1),
            repeat: None,
        }
    }

    /// Probes one commit on the first worker; `None` when the probe was interrupted.
    fn probe(
        &mut self,
        prober: &mut dyn Probe,
        oid: Oid,
        role: ProbeRole,
        search: &Bisector,
        target: Option<&Signature>,
    ) -> Option<ProbeRecord> {
        let ctx = self.context(role, search, 0);
        self.probe_in(prober, oid, &ctx, target)
    }

    /// Probes one commit on the driver's thread in `ctx`; `None` when the probe was interrupted.
    fn probe_in(
        &mut self,
        prober: &mut dyn Probe,
        oid: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
    ) -> Option<ProbeRecord> {
        let probed = probe_commit(
            prober,
            self.policy,
            self.settled,
            oid,
            ctx,
            target,
            self.reporter,
        );
        if probed.interrupted {
            // A stopped probe judged nothing: it is neither reported as a verdict nor recorded.
            return None;
        }
        Some(self.finish(ctx.step, probed))
    }

    /// Reports and keeps a finished probe.
    fn finish(&mut self, step: usize, probed: Probed) -> ProbeRecord {
        self.other_bugs.extend(probed.other_bug);
        self.reporter.event(&Event::ProbeFinished {
            step,
            record: Box::new(probed.record.clone()),
        });
        self.probes.push(probed.record.clone());
        probed.record
    }

    /// Learns the target's kernel from the bad endpoint under compute-sanitizer, when its own output does
    /// not name one, and records that run as an endpoint check.
    fn learn_kernel(
        &mut self,
        prober: &mut dyn Probe,
        oid: Oid,
        search: &Bisector,
        target: &mut Signature,
    ) {
        if target.kernel.is_some() {
            return;
        }
        let ctx = self.context(ProbeRole::EndpointSanitizer, search, 0);
        let Some(s) = prober.sanitize(oid, &ctx, self.reporter) else {
            // No sanitizer run, no probe: its number goes to the next one.
            self.steps -= 1;
            return;
        };
        let kernel = s.finding.as_ref().and_then(|f| f.kernel.clone());
        if let Some(k) = &kernel {
            // The target's own fault stack is now settled: a probe that faults with exactly that stack
            // is the target without a sanitizer run of its own.
            self.settled.remember(target, k, &oid.to_string());
        }
        if kernel.is_some() {
            target.kernel = kernel;
        }
        let record = s.endpoint_record(oid, target, Verdict::Bad);
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
            flaky: None,
        }
    }

    /// The number the next run at `oid` gets: how many runs of it this search has made (the journal keeps
    /// each run of a commit apart by it, so a resumed search replays the same runs).
    fn next_repeat(&self, oid: Oid) -> u32 {
        let commit = oid.to_string();
        self.probes
            .iter()
            .filter(|r| r.commit == commit && r.role != ProbeRole::EndpointSanitizer)
            .count() as u32
    }

    /// One run of the repro at `oid`, for a search that runs commits several times.
    fn run_once(
        &mut self,
        prober: &mut dyn Probe,
        oid: Oid,
        role: ProbeRole,
        search: &Bisector,
        target: Option<&Signature>,
    ) -> Option<ProbeRecord> {
        let repeat = self.next_repeat(oid);
        let mut ctx = self.context(role, search, 0);
        ctx.repeat = Some(repeat);
        self.probe_in(prober, oid, &ctx, target)
    }
}

/// Runs the whole search with one prober, one probe at a time.
pub fn search(
    input: &SearchInput,
    prober: &mut dyn Probe,
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
    let settled = SettledStacks::default();
    let mut outcome = search_once(input, workers, reporter, cancel, &settled);
    let Some(culprit) = judged_from_memory(&outcome) else {
        return outcome;
    };
    // The culprit's fault was judged by a stack the sanitizer settled at another commit. Before it is
    // named, the sanitizer looks at the culprit itself: one op can launch two kernels from the same lines.
    let (Some(first), Some(target)) = (workers.first_mut(), outcome.target.clone()) else {
        return outcome;
    };
    let ctx = ProbeContext {
        step: outcome.probes.len() + 1,
        role: ProbeRole::Verify,
        remaining: 1,
        estimated_steps: 0,
        worker: None,
        repeat: None,
    };
    let Some(s) = first.probe.sanitize(culprit, &ctx, reporter) else {
        return outcome;
    };
    let named = s.finding.as_ref().and_then(|f| f.kernel.clone());
    let mut record = s.endpoint_record(culprit, &target, Verdict::Bad);
    record.role = ProbeRole::Verify;
    reporter.event(&Event::ProbeFinished {
        step: ctx.step,
        record: Box::new(record.clone()),
    });
    outcome.probes.push(record);
    match (named, target.kernel.as_deref()) {
        (Some(k), Some(want)) if k != want => {
            reporter.event(&Event::Warning {
                message: format!(
                    "the sanitizer names {k} at {}, where the search took a remembered fault stack for {want}'s: the same lines launch more than one kernel. Searching again, every lookalike settled by the sanitizer itself",
                    short_sha(&culprit.to_string())
                ),
            });
            let mut again = search_once(input, workers, reporter, cancel, &SettledStacks::off());
            let mut probes = std::mem::take(&mut outcome.probes);
            probes.append(&mut again.probes);
            again.probes = probes;
            again
        }
        _ => outcome,
    }
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

/// One search with `settled` as its memory of sanitizer answers.
fn search_once(
    input: &SearchInput,
    workers: &mut [Worker],
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
    settled: &SettledStacks,
) -> SearchOutcome {
    let parents: Vec<Vec<usize>> = input.range.iter().map(|c| c.parents.clone()).collect();
    let mut bisector = Bisector::new(&parents);
    let count = workers.len();
    let mut d = Driver {
        reporter,
        policy: input.policy,
        settled,
        probes: Vec::new(),
        other_bugs: Vec::new(),
        steps: 0,
        workers: count,
    };
    // The bad endpoint first: what it shows is the target.
    let Some(first) = workers.first_mut() else {
        return d.end(SearchEnd::HostFailure("no probe worker".into()), None);
    };
    let Some(mut bad) = d.probe(
        first.probe,
        input.bad.1,
        ProbeRole::BadEndpoint,
        &bisector,
        None,
    ) else {
        return d.end(SearchEnd::Interrupted, None);
    };
    // A flaky fault may not show on the bad end's first run: with `endpoint-runs`, run it again until it
    // does (each clean run counts as one of them).
    let mut bad_runs = Vec::new();
    while bad.signature.class == FaultClass::None
        && (bad_runs.len() as u32 + 1) < input.flaky.endpoint_runs
    {
        bad_runs.push(false);
        let run = d.run_once(
            first.probe,
            input.bad.1,
            ProbeRole::BadEndpoint,
            &bisector,
            None,
        );
        let Some(run) = run else {
            return d.end(SearchEnd::Interrupted, None);
        };
        bad = run;
    }
    if is_host_problem(bad.signature.class) {
        let msg = format!(
            "bad commit {} could not be judged: {}",
            input.bad.0, bad.signature.summary
        );
        return d.end(SearchEnd::EndpointInfra(msg), None);
    }
    if bad.verdict != Verdict::Bad || (!input.find_fix && !reproduces(&bad.signature)) {
        let runs = if bad_runs.is_empty() {
            String::new()
        } else {
            format!(" in {} runs", bad_runs.len() + 1)
        };
        let msg = format!(
            "bad commit {} does not reproduce{runs}: {}",
            input.bad.0, bad.signature.summary
        );
        return d.end(SearchEnd::EndpointsInvalid(msg), None);
    }
    let mut target = bad.signature.clone();
    d.learn_kernel(first.probe, input.bad.1, &bisector, &mut target);
    if cancel.load(Ordering::SeqCst) {
        return d.end(SearchEnd::Interrupted, Some(target));
    }
    // More runs of the bad end: a clean one says the fault is flaky, and the search is the Bayesian one.
    bad_runs.push(true);
    while (bad_runs.len() as u32) < input.flaky.endpoint_runs {
        let Some(rec) = d.run_once(
            first.probe,
            input.bad.1,
            ProbeRole::BadEndpoint,
            &bisector,
            Some(&target),
        ) else {
            return d.end(SearchEnd::Interrupted, Some(target));
        };
        if let Some(msg) = host_failure(&rec) {
            return d.end(SearchEnd::EndpointInfra(msg), Some(target));
        }
        bad_runs.push(rec.verdict == Verdict::Bad);
    }
    let flaky = bad_runs.iter().any(|&f| !f);
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
        let Some(rec) = d.probe(first.probe, oid, role, &bisector, Some(&target)) else {
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
    if flaky {
        d.reporter.event(&Event::Note {
            message: format!(
                "the bad end showed the fault on {} of {} runs: a flaky fault; searching for the most likely first bad commit (confidence {}, at most {} runs, {} at once)",
                bad_runs.iter().filter(|&&f| f).count(),
                bad_runs.len(),
                input.flaky.confidence,
                input.flaky.max_runs,
                count
            ),
        });
        let tip = input.range.len() - 1;
        let runs: Vec<(usize, bool)> = bad_runs.iter().map(|&f| (tip, f)).collect();
        return flaky_search(d, workers, input, &bisector, target, &runs, cancel);
    }
    if count > 1 {
        let end = parallel(&mut d, &mut bisector, input, &target, workers, cancel);
        if let SearchEnd::Found(oid) = end {
            if let Some(i) = input.range.iter().position(|c| c.oid == oid) {
                return settle_plain(d, workers, input, &bisector, target, i, cancel);
            }
        }
        return d.end(end, Some(target));
    }
    loop {
        if cancel.load(Ordering::SeqCst) {
            return d.end(SearchEnd::Interrupted, Some(target));
        }
        match bisector.next_step() {
            NextStep::Evaluate(i) => {
                let oid = input.range[i].oid;
                let Some(rec) = d.probe(
                    first.probe,
                    oid,
                    ProbeRole::Search,
                    &bisector,
                    Some(&target),
                ) else {
                    return d.end(SearchEnd::Interrupted, Some(target));
                };
                // Infrastructure failures were retried inside the probe: what is left says the machine
                // is broken, and so would every probe after it. A missing object is the clone's, not the
                // host's: that commit alone is skipped.
                if let Some(msg) = host_failure(&rec) {
                    return d.end(SearchEnd::HostFailure(msg), Some(target));
                }
                bisector.mark(i, rec.verdict);
            }
            // One probe at a time is in flight, and it was just marked: the machine always has a step.
            NextStep::Wait | NextStep::EvaluateMany(_) => {
                return d.end(SearchEnd::Interrupted, Some(target))
            }
            NextStep::Done(SearchResult::Found(i)) => {
                return settle_plain(d, workers, input, &bisector, target, i, cancel)
            }
            NextStep::Done(SearchResult::Ambiguous(ix)) => {
                let oids = ix.iter().map(|&i| input.range[i].oid).collect();
                return d.end(SearchEnd::Ambiguous(oids), Some(target));
            }
        }
    }
}

/// A probe whose class says the host is broken (infrastructure failures outlasted their retries, the repro
/// cannot start): every probe after it would fail the same way. A missing object is the clone's, not the
/// host's: that commit alone is skipped.
fn host_failure(rec: &ProbeRecord) -> Option<String> {
    matches!(
        rec.signature.class,
        FaultClass::Infra | FaultClass::ExecFailure
    )
    .then(|| {
        format!(
            "stopped: the host failed at {}: {}",
            short_sha(&rec.commit),
            rec.signature.summary
        )
    })
}

/// How a search ended by the state machine.
fn done(input: &SearchInput, result: SearchResult) -> SearchEnd {
    match result {
        SearchResult::Found(i) => SearchEnd::Found(input.range[i].oid),
        SearchResult::Ambiguous(ix) => {
            SearchEnd::Ambiguous(ix.iter().map(|&i| input.range[i].oid).collect())
        }
    }
}

/// Worker threads, each running the probes the driver hands it on its own prober, inside a thread scope.
struct Pool<'s> {
    jobs: Vec<mpsc::Sender<Job>>,
    rx: mpsc::Receiver<Message>,
    stops: Vec<&'s AtomicBool>,
    /// Idle workers, the first on top.
    idle: Vec<usize>,
    /// Which commit each busy worker is probing.
    busy: HashMap<usize, usize>,
}

/// A probe that came back from a worker.
struct Landed {
    worker: usize,
    index: usize,
    step: usize,
    probed: Box<Probed>,
}

/// Runs `f` with a pool of threads, one per worker; the threads end when `f` returns.
fn with_pool<R>(
    workers: &mut [Worker],
    policy: &MatchPolicy,
    settled: &SettledStacks,
    f: impl FnOnce(&mut Pool) -> R,
) -> R {
    let stops: Vec<&AtomicBool> = workers.iter().map(|w| w.stop).collect();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Message>();
        let mut jobs: Vec<mpsc::Sender<Job>> = Vec::new();
        for (w, worker) in workers.iter_mut().enumerate() {
            let (job_tx, job_rx) = mpsc::channel::<Job>();
            jobs.push(job_tx);
            let tx = tx.clone();
            let prober = &mut *worker.probe;
            scope.spawn(move || {
                let mut reporter = ChannelReporter { tx: tx.clone() };
                for job in job_rx {
                    let probed = probe_commit(
                        prober,
                        policy,
                        settled,
                        job.oid,
                        &job.ctx,
                        Some(&job.target),
                        &mut reporter,
                    );
                    let done = Message::Done {
                        worker: w,
                        index: job.index,
                        step: job.ctx.step,
                        probed: Box::new(probed),
                    };
                    if tx.send(done).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut pool = Pool {
            jobs,
            rx,
            idle: (0..stops.len()).rev().collect(),
            stops,
            busy: HashMap::new(),
        };
        let out = f(&mut pool);
        // Closing the job channels ends the threads; the scope waits for them.
        pool.jobs.clear();
        out
    })
}

impl Pool<'_> {
    /// Hands commit `index` to an idle worker (its stop flag cleared); false when none is idle.
    fn dispatch(
        &mut self,
        d: &mut Driver,
        input: &SearchInput,
        target: &Signature,
        search: &Bisector,
        (index, role, repeated): (usize, ProbeRole, bool),
    ) -> bool {
        let Some(w) = self.idle.pop() else {
            return false;
        };
        // Runs still in flight are not in the driver's records yet: a round never holds one commit twice.
        let repeat = repeated.then(|| d.next_repeat(input.range[index].oid));
        let mut ctx = d.context(role, search, w);
        ctx.repeat = repeat;
        self.stops[w].store(false, Ordering::SeqCst);
        let job = Job {
            index,
            oid: input.range[index].oid,
            ctx,
            target: target.clone(),
        };
        if self.jobs[w].send(job).is_ok() {
            self.busy.insert(w, index);
            true
        } else {
            self.idle.push(w);
            false
        }
    }

    /// Stops every probe in flight.
    fn stop_all(&self) {
        for &w in self.busy.keys() {
            self.stops[w].store(true, Ordering::SeqCst);
        }
    }

    /// The next probe to come back, passing workers' events on to the reporter meanwhile; `None` after
    /// a short wait with nothing back (so the caller can look at Ctrl-C), or when every worker is gone.
    fn land(&mut self, d: &mut Driver) -> Option<Landed> {
        loop {
            match self.rx.recv_timeout(POLL) {
                Ok(Message::Event(e)) => d.reporter.event(&e),
                Ok(Message::Done {
                    worker,
                    index,
                    step,
                    probed,
                }) => {
                    self.busy.remove(&worker);
                    self.idle.push(worker);
                    return Some(Landed {
                        worker,
                        index,
                        step,
                        probed,
                    });
                }
                Err(_) => return None,
            }
        }
    }
}

/// The bisection with several workers, each on a thread of its own running probes the driver hands it.
/// Idle workers get the commits that, with those in flight, split the candidates most evenly; an answer is
/// used the moment it lands, and a probe in flight whose commit is no longer a candidate is stopped (its
/// answer carries no news). When the search ends (found, Ctrl-C, a broken host), every probe still in
/// flight is stopped, and the driver waits for each worker to come back before it returns.
fn parallel(
    d: &mut Driver,
    bisector: &mut Bisector,
    input: &SearchInput,
    target: &Signature,
    workers: &mut [Worker],
    cancel: &AtomicBool,
) -> SearchEnd {
    let policy = d.policy;
    with_pool(workers, policy, d.settled, |pool| {
        let mut end: Option<SearchEnd> = None;
        loop {
            if end.is_none() && cancel.load(Ordering::SeqCst) {
                end = Some(SearchEnd::Interrupted);
            }
            if end.is_some() {
                pool.stop_all();
                if pool.busy.is_empty() {
                    break;
                }
            } else if !pool.idle.is_empty() {
                let picks = match bisector.propose(pool.idle.len()) {
                    NextStep::Evaluate(i) => vec![i],
                    NextStep::EvaluateMany(v) => v,
                    NextStep::Wait => Vec::new(),
                    NextStep::Done(result) => {
                        end = Some(done(input, result));
                        continue;
                    }
                };
                for i in picks {
                    if !pool.dispatch(d, input, target, bisector, (i, ProbeRole::Search, false)) {
                        bisector.abandon(i);
                    }
                }
            }
            let Some(Landed {
                worker,
                index,
                step,
                probed,
            }) = pool.land(d)
            else {
                continue;
            };
            let stopped_by_us = probed.interrupted && !cancel.load(Ordering::SeqCst);
            if stopped_by_us || (probed.interrupted && end.is_some()) {
                // Abandoned: its answer no longer mattered. Nothing is recorded or learned.
                bisector.abandon(index);
                d.reporter.event(&Event::Note {
                    message: format!(
                        "step {step}: stopped the probe of {} (worker {}): its answer no longer matters",
                        short_sha(&probed.record.commit),
                        worker + 1
                    ),
                });
                continue;
            }
            let record = d.finish(step, *probed);
            if end.is_some() {
                continue;
            }
            if let Some(msg) = host_failure(&record) {
                end = Some(SearchEnd::HostFailure(msg));
                continue;
            }
            bisector.mark(index, record.verdict);
            for (&w, &i) in &pool.busy {
                if !bisector.is_candidate(i) {
                    pool.stops[w].store(true, Ordering::SeqCst);
                }
            }
        }
        end.unwrap_or(SearchEnd::Interrupted)
    })
}

/// The search for a flaky fault: one run at a time where the expected information is largest, until the
/// most likely first bad commit reaches the confidence asked (or the run budget is spent); then the culprit
/// and its parent are run again until their reproduction rates separate at that confidence.
fn flaky_search(
    mut d: Driver,
    workers: &mut [Worker],
    input: &SearchInput,
    bisector: &Bisector,
    target: Signature,
    earlier: &[(usize, bool)],
    cancel: &AtomicBool,
) -> SearchOutcome {
    let parents: Vec<Vec<usize>> = input.range.iter().map(|c| c.parents.clone()).collect();
    let budget = input.flaky.max_runs as usize;
    let mut bayes = BayesSearch::new(&parents, None, input.flaky.confidence, budget);
    for &(i, fault) in earlier {
        bayes.record(i, fault);
    }
    let result = if workers.len() > 1 {
        match flaky_rounds(
            &mut d, workers, input, bisector, &target, &mut bayes, cancel,
        ) {
            Ok(r) => r,
            Err(end) => return d.end(end, Some(target)),
        }
    } else {
        let prober = &mut *workers[0].probe;
        loop {
            if cancel.load(Ordering::SeqCst) {
                return d.end(SearchEnd::Interrupted, Some(target));
            }
            match bayes.next_step() {
                BayesStep::Run(i) => {
                    let oid = input.range[i].oid;
                    let Some(rec) =
                        d.run_once(prober, oid, ProbeRole::Search, bisector, Some(&target))
                    else {
                        return d.end(SearchEnd::Interrupted, Some(target));
                    };
                    if let Some(msg) = host_failure(&rec) {
                        return d.end(SearchEnd::HostFailure(msg), Some(target));
                    }
                    match rec.verdict {
                        Verdict::Bad => bayes.record(i, true),
                        Verdict::Good => bayes.record(i, false),
                        Verdict::Skip => bayes.skip(i),
                    }
                }
                BayesStep::Done(r) => break r,
            }
        }
    };
    let name = |i: usize| input.range[i].oid.to_string();
    let mut answer = FlakyAnswer {
        p: result.p,
        culprit: name(result.culprit),
        posterior: result.confidence,
        confidence: input.flaky.confidence,
        reached: result.reached,
        runners_up: result
            .runners_up
            .iter()
            .map(|&(i, v)| (name(i), v))
            .collect(),
        runs: result.runs,
        verification: None,
    };
    if result.reached {
        answer.verification = verify(
            &mut d,
            workers,
            input,
            bisector,
            &target,
            result.culprit,
            cancel,
        );
    }
    let end = if cancel.load(Ordering::SeqCst) {
        SearchEnd::Interrupted
    } else if result.reached {
        SearchEnd::Found(input.range[result.culprit].oid)
    } else {
        let mut most_likely = vec![input.range[result.culprit].oid];
        most_likely.extend(result.runners_up.iter().map(|&(i, _)| input.range[i].oid));
        SearchEnd::Ambiguous(most_likely)
    };
    let mut out = d.end(end, Some(target));
    out.flaky = Some(answer);
    out
}

/// The culprit and its parent, run in turn until P(culprit's rate > parent's) reaches the confidence or
/// each has had `VERIFY_RUNS` runs. The parent is the culprit's first parent in the range, else the good
/// end's side (a run at the good end).
#[allow(clippy::too_many_arguments)]
fn verify(
    d: &mut Driver,
    workers: &mut [Worker],
    input: &SearchInput,
    bisector: &Bisector,
    target: &Signature,
    culprit: usize,
    cancel: &AtomicBool,
) -> Option<Verification> {
    const VERIFY_RUNS: u32 = 30;
    let parent_oid = match input.range[culprit].parents.first() {
        Some(&p) => input.range[p].oid,
        None => input.goods.first()?.1,
    };
    let parent_index = input.range[culprit].parents.first().copied();
    let mut rates = [(0u32, 0u32), (0u32, 0u32)];
    let mut separation = 0.5;
    if let (Some(p), true) = (parent_index, workers.len() > 1) {
        // Both at once, a round at a time, on two workers.
        let policy = d.policy;
        with_pool(workers, policy, d.settled, |pool| {
            while rates[0].1 < VERIFY_RUNS && !cancel.load(Ordering::SeqCst) {
                for i in [culprit, p] {
                    pool.dispatch(d, input, target, bisector, (i, ProbeRole::Verify, true));
                }
                while !pool.busy.is_empty() {
                    if cancel.load(Ordering::SeqCst) {
                        pool.stop_all();
                    }
                    let Some(l) = pool.land(d) else { continue };
                    if l.probed.interrupted {
                        continue;
                    }
                    let k = usize::from(l.index != culprit);
                    let rec = d.finish(l.step, *l.probed);
                    tally(&mut rates[k], rec.verdict);
                }
                separation = rates_differ(rates[0], rates[1]);
                if separation >= input.flaky.confidence {
                    break;
                }
            }
        });
        return Some(Verification {
            parent: parent_oid.to_string(),
            culprit_rate: rates[0],
            parent_rate: rates[1],
            separation,
        });
    }
    let prober = &mut *workers[0].probe;
    while rates[0].1 < VERIFY_RUNS && !cancel.load(Ordering::SeqCst) {
        for (k, oid) in [input.range[culprit].oid, parent_oid]
            .into_iter()
            .enumerate()
        {
            let rec = d.run_once(prober, oid, ProbeRole::Verify, bisector, Some(target))?;
            tally(&mut rates[k], rec.verdict);
        }
        separation = rates_differ(rates[0], rates[1]);
        if separation >= input.flaky.confidence {
            break;
        }
    }
    Some(Verification {
        parent: parent_oid.to_string(),
        culprit_rate: rates[0],
        parent_rate: rates[1],
        separation,
    })
}

/// The end of a plain search that found commit `i`, when the bad end was run several times
/// (`endpoint-runs`) and faulted every time: its parent is run as many times. A fault there says the fault
/// is flaky after all (a bad commit ran clean and misled the search), and the Bayesian search takes over
/// with every run made so far; otherwise the plain answer stands.
fn settle_plain(
    mut d: Driver,
    workers: &mut [Worker],
    input: &SearchInput,
    bisector: &Bisector,
    target: Signature,
    i: usize,
    cancel: &AtomicBool,
) -> SearchOutcome {
    let found = input.range[i].oid;
    let checks = input.flaky.endpoint_runs;
    // The culprit's parent in the range, else the good end below it.
    let parent = input.range[i]
        .parents
        .first()
        .map(|&p| input.range[p].oid)
        .or_else(|| input.goods.first().map(|g| g.1));
    let (Some(parent_oid), true) = (parent, checks > 1) else {
        return d.end(SearchEnd::Found(found), Some(target));
    };
    for _ in 0..checks {
        let Some(rec) = d.run_once(
            &mut *workers[0].probe,
            parent_oid,
            ProbeRole::Verify,
            bisector,
            Some(&target),
        ) else {
            return d.end(SearchEnd::Interrupted, Some(target));
        };
        if rec.verdict == Verdict::Bad {
            d.reporter.event(&Event::Note {
                message: format!(
                    "the parent of {} shows the fault too: a flaky fault after all; searching for the most likely first bad commit with every run so far",
                    short_sha(&found.to_string())
                ),
            });
            let index: HashMap<String, usize> = input
                .range
                .iter()
                .enumerate()
                .map(|(k, c)| (c.oid.to_string(), k))
                .collect();
            let earlier: Vec<(usize, bool)> = d
                .probes
                .iter()
                .filter(|r| {
                    matches!(
                        r.role,
                        ProbeRole::BadEndpoint | ProbeRole::Search | ProbeRole::Verify
                    ) && r.verdict != Verdict::Skip
                })
                .filter_map(|r| {
                    index
                        .get(&r.commit)
                        .map(|&k| (k, r.verdict == Verdict::Bad))
                })
                .collect();
            return flaky_search(d, workers, input, bisector, target, &earlier, cancel);
        }
        if cancel.load(Ordering::SeqCst) {
            return d.end(SearchEnd::Interrupted, Some(target));
        }
    }
    d.end(SearchEnd::Found(found), Some(target))
}

/// The flaky search's runs with several workers, in rounds: each round runs the commits with the most
/// expected information at once, one per worker, and the posterior takes all their outcomes before the
/// next round. `Err` when the search must stop (Ctrl-C, a broken host).
#[allow(clippy::too_many_arguments)]
fn flaky_rounds(
    d: &mut Driver,
    workers: &mut [Worker],
    input: &SearchInput,
    bisector: &Bisector,
    target: &Signature,
    bayes: &mut BayesSearch,
    cancel: &AtomicBool,
) -> Result<crate::bisect::BayesResult, SearchEnd> {
    let policy = d.policy;
    with_pool(workers, policy, d.settled, |pool| loop {
        if cancel.load(Ordering::SeqCst) {
            return Err(SearchEnd::Interrupted);
        }
        let runs = match bayes.propose(pool.idle.len()) {
            Ok(runs) => runs,
            Err(result) => return Ok(result),
        };
        for i in runs {
            pool.dispatch(d, input, target, bisector, (i, ProbeRole::Search, true));
        }
        let mut end = None;
        while !pool.busy.is_empty() {
            if cancel.load(Ordering::SeqCst) || end.is_some() {
                pool.stop_all();
            }
            let Some(l) = pool.land(d) else { continue };
            if l.probed.interrupted {
                end.get_or_insert(SearchEnd::Interrupted);
                continue;
            }
            let rec = d.finish(l.step, *l.probed);
            if let Some(msg) = host_failure(&rec) {
                end = Some(SearchEnd::HostFailure(msg));
                continue;
            }
            match rec.verdict {
                Verdict::Bad => bayes.record(l.index, true),
                Verdict::Good => bayes.record(l.index, false),
                Verdict::Skip => bayes.skip(l.index),
            }
        }
        if let Some(end) = end {
            return Err(end);
        }
    })
}

/// Counts one verification run in a (faults, runs) rate; a skip counts for neither.
fn tally(rate: &mut (u32, u32), verdict: Verdict) {
    if verdict != Verdict::Skip {
        rate.1 += 1;
        rate.0 += u32::from(verdict == Verdict::Bad);
    }
}
