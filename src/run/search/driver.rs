//! The one search loop: a strategy proposes commits, the pool's workers probe them, the judge decides each
//! verdict, and the strategy takes it; when a strategy ends, the next one may take over (a plain answer
//! re-checked at its parent, a fault found flaky after all, a flaky answer verified). Every exit is an
//! `Err(SearchEnd)` passed up with `?`, or the last strategy's answer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::bisect::{BayesResult, BayesSearch, SearchResult, Verdict};
use crate::classify::{FaultClass, Signature};
use crate::report::event::{Event, Reporter};
use crate::report::record::{short_sha, FlakyAnswer, OtherBug, ProbeRecord, ProbeRole};
use crate::run::probe::prober::{ProbeContext, ProbeOutcome, Sanitized};
use crate::run::probe::workers::probes_at_once;

use super::contract::{SearchEnd, SearchInput, SearchOutcome};
use super::end_check::{self, EndCheck};
use super::judge::host_failure;
use super::judge::{judge, Judgement, Kernel, Terms};
use super::pool::{Done, Landed, Pool, Task};
use super::settled::{SettledStacks, REMEMBERED};
use super::strategy::{Answer, Flaky, ParentCheck, Proposal, Strategy, Verify};

/// A probe waiting for its sanitizer run before it is judged.
struct Pending {
    outcome: ProbeOutcome,
    target: Option<Signature>,
}

/// What came of a job that landed.
pub(super) enum Landing {
    /// A probe, judged and recorded.
    Judged(usize, Box<ProbeRecord>),
    /// A probe that was stopped: nothing was judged or recorded.
    Stopped(usize),
    /// A probe that went on to its sanitizer run (the worker stays busy).
    Pending,
    /// A sanitizer run asked alone (not part of a probe).
    Sanitized(Option<Box<Sanitized>>),
}

/// The search's state around the strategies: records, the probe count, the sanitizer's settled stacks.
pub(super) struct Driver<'a, 'r> {
    pub(super) input: &'a SearchInput<'a>,
    /// Every commit the search may run, by index: the range, then endpoints outside it.
    commits: Vec<Oid>,
    pub(super) reporter: &'r mut dyn Reporter,
    settled: &'a SettledStacks,
    cancel: &'a AtomicBool,
    pub(super) probes: Vec<ProbeRecord>,
    pub(super) other_bugs: Vec<OtherBug>,
    /// The target, once the bad endpoint showed it.
    pub(super) target: Option<Signature>,
    /// The flaky search's answer, once it has one, and the result it came from (while it is verified).
    flaky: Option<FlakyAnswer>,
    flaky_result: Option<BayesResult>,
    /// Probe numbers handed out so far (probes in flight included).
    pub(super) steps: usize,
    /// Workers there are: progress names the worker of every probe when there are several.
    workers: usize,
    /// Probes waiting for their sanitizer run, by worker.
    pending: HashMap<usize, Pending>,
    /// Candidates left and probes left, as the running strategy says.
    pub(super) progress: (usize, usize),
    /// The worker whose probe the gauge watches (alone on the first shared GPU).
    watching: Option<usize>,
    /// Whether the first round was opened (once, beside the bad end's first probe).
    opened: bool,
    /// The most probes that ran at once on the watched probe's GPU while it was watched: its reading
    /// is shared among them.
    crowd: usize,
    /// Probes sent beside others before the GPU's limit was measured (the first round), by number: one
    /// of them crowded out says the round was too wide, not that the GPU holds one probe at a time.
    unmeasured: std::collections::HashSet<usize>,
    /// Probes whose fault stack a sanitizer run in flight (of another probe) will settle: judged once it
    /// lands, their workers kept for them meanwhile (a stack it leaves unsettled gets a run of its own).
    awaiting: Vec<Landed>,
    /// Probes that landed while the bad end was still being settled: judged, in order, once it is
    /// (their workers get nothing new until then, so a sanitizer run of theirs finds their commit).
    held: VecDeque<Landed>,
    /// Held probes (by number) whose clean run the strategy already took while the bad end was being
    /// settled: judged and recorded with the others once it is, not marked twice.
    marked_early: std::collections::HashSet<usize>,
    /// Whether a probe that fails like the target but cannot be told apart by its output goes on to a
    /// sanitizer run (the runs of an answer made again are judged by their own output).
    pub(super) sanitizes: bool,
}

impl<'a, 'r> Driver<'a, 'r> {
    pub(super) fn new(
        input: &'a SearchInput<'a>,
        reporter: &'r mut dyn Reporter,
        settled: &'a SettledStacks,
        cancel: &'a AtomicBool,
        workers: usize,
    ) -> Self {
        Driver {
            input,
            commits: input.range.iter().map(|c| c.oid).collect(),
            reporter,
            settled,
            cancel,
            probes: Vec::new(),
            other_bugs: Vec::new(),
            target: None,
            flaky: None,
            flaky_result: None,
            steps: input.steps_before,
            workers,
            pending: HashMap::new(),
            progress: (input.range.len(), 0),
            watching: None,
            opened: false,
            crowd: 1,
            unmeasured: Default::default(),
            awaiting: Vec::new(),
            held: VecDeque::new(),
            marked_early: Default::default(),
            sanitizes: true,
        }
    }

    /// The search's outcome, ended by `end`.
    pub(super) fn outcome(self, end: SearchEnd) -> SearchOutcome {
        SearchOutcome {
            end,
            target: self.target,
            probes: self.probes,
            other_bugs: self.other_bugs,
            flaky: self.flaky,
            steps: self.steps,
            at_once: 1,
        }
    }

    /// The fault stacks the sanitizer settled in this search.
    pub(super) fn settled(&self) -> &SettledStacks {
        self.settled
    }

    pub(super) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// The index of `oid` among the commits the search may run (an endpoint outside the range is added).
    pub(super) fn index_of(&mut self, oid: Oid) -> usize {
        match self.commits.iter().position(|&c| c == oid) {
            Some(i) => i,
            None => {
                self.commits.push(oid);
                self.commits.len() - 1
            }
        }
    }

    /// The next probe's context.
    pub(super) fn context(&mut self, role: ProbeRole, worker: usize) -> ProbeContext {
        self.steps += 1;
        ProbeContext {
            step: self.steps,
            role,
            remaining: self.progress.0,
            estimated_steps: self.progress.1,
            worker: (self.workers > 1).then_some(worker + 1),
            repeat: None,
            crowded: false,
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

    /// Hands commit `index` to worker `w` (already claimed); false when the worker is gone.
    fn send(
        &mut self,
        pool: &mut Pool,
        w: usize,
        index: usize,
        role: ProbeRole,
        repeated: bool,
    ) -> bool {
        let (mut ctx, task) = self.probe_job(index, role, w, repeated);
        self.mark_crowded(pool, w, &mut ctx);
        self.watch(pool, w);
        let sent = pool.send(w, index, self.commits[index], ctx, task);
        self.count_crowd(pool);
        sent
    }

    /// Says whether a probe on worker `w` may have others beside it on its GPU, and notes it among the
    /// first round's when no limit was measured yet.
    fn mark_crowded(&mut self, pool: &Pool, w: usize, ctx: &mut ProbeContext) {
        ctx.crowded = pool.crowded(w);
        if ctx.crowded && !pool.measured() {
            self.unmeasured.insert(ctx.step);
        }
    }

    /// Notes how many probes run on the watched probe's GPU now.
    fn count_crowd(&mut self, pool: &Pool) {
        let Some(gpu) = self.watching.and_then(|w| pool.shared_gpu(w)) else {
            return;
        };
        self.crowd = self.crowd.max(pool.busy_on(gpu));
    }

    /// Starts the gauge on worker `w`'s probe when it is the one to measure: the first probe alone on the
    /// first shared GPU, before the number of probes at once there is known.
    fn watch(&mut self, pool: &Pool, w: usize) {
        let Some((gpu, _)) = pool.first_shared().filter(|_| !pool.measured()) else {
            return;
        };
        if self.watching.is_none()
            && pool.shared_gpu(w) == Some(gpu.as_str())
            && !pool.busy_on_gpu(&gpu)
        {
            self.input.sharing.gauge.start(&gpu);
            self.watching = Some(w);
            self.crowd = 1;
        }
    }

    /// What a probe that landed tells of its GPU. The watched probe's memory sets how many probes run at
    /// once on a shared GPU (a probe that never reached its repro, or a reading of a GPU that filled
    /// up, measures nothing: the next probe alone is watched). A crowded probe that ran out of memory,
    /// was killed or timed out says nothing of its commit and is run again (true); sent under a
    /// measured limit, it also leaves one probe at a time from now on (sent in the first round, before
    /// any limit was measured, it says only that the round was too wide).
    fn crowd_check(
        &mut self,
        pool: &mut Pool,
        worker: usize,
        ctx: &ProbeContext,
        outcome: &ProbeOutcome,
    ) -> bool {
        let class = outcome.record.signature.class;
        if self.watching == Some(worker) {
            self.watching = None;
            // Probes that ran beside it (the first round) share the reading.
            let reading = self.input.sharing.gauge.stop();
            let measured = !outcome.interrupted
                && !reading.is_some_and(|r| r.filled())
                && !outcome.record.reused
                && !matches!(
                    class,
                    FaultClass::BuildFailure
                        | FaultClass::ExecFailure
                        | FaultClass::MissingObject
                        | FaultClass::Infra
                );
            if let (true, Some((gpu, workers))) = (measured, pool.first_shared()) {
                let asked = self.input.sharing.asked;
                let places = self.input.sharing.places.max(workers);
                pool.set_room(probes_at_once(reading, self.crowd, places, asked).0);
                let (k, reason) = probes_at_once(reading, self.crowd, workers, asked);
                pool.set_limit(k);
                pool.set_measured();
                self.reporter.event(&Event::ProbesAtOnce {
                    gpu,
                    probes: k,
                    workers,
                    reason,
                });
            } else if !pool.measured() {
                // Nothing measured: one probe at a time until one alone is.
                pool.set_limit(1);
            }
        }
        // A probe the search stopped itself (its answer no longer mattered) was killed by it, not by
        // the crowd.
        if outcome.interrupted || outcome.record.reused || !ctx.crowded_out(class) {
            return false;
        }
        if self.unmeasured.contains(&ctx.step) {
            return true;
        }
        if pool.limit() == 1 {
            return false;
        }
        pool.set_limit(1);
        pool.set_measured();
        if let Some((gpu, workers)) = pool.first_shared() {
            self.reporter.event(&Event::ProbesAtOnce {
                gpu,
                probes: 1,
                workers,
                reason: format!(
                    "the probe of {} {} while others ran on its GPU; it runs again alone",
                    short_sha(&outcome.record.commit),
                    match class {
                        FaultClass::OutOfMemory => "ran out of memory",
                        FaultClass::Hang => "ran past its timeout",
                        _ => "was killed",
                    }
                ),
            });
        }
        true
    }

    /// The context and task of a probe of commit `index` on worker `w`.
    fn probe_job(
        &mut self,
        index: usize,
        role: ProbeRole,
        w: usize,
        repeated: bool,
    ) -> (ProbeContext, Task) {
        // Runs still in flight are not in the records yet: a round never holds one commit twice.
        let repeat = repeated.then(|| self.next_repeat(self.commits[index]));
        let mut ctx = self.context(role, w);
        ctx.repeat = repeat;
        (ctx, Task::Probe(self.target.clone().map(Box::new)))
    }

    /// The terms every probe is judged in (finding a fix, the target is the OLD end's fault and the
    /// verdicts are swapped).
    fn terms<'t>(&'t self, target: Option<&'t Signature>) -> Terms<'t> {
        Terms {
            target,
            policy: self.input.policy,
            swapped: self.input.finding_fix,
        }
    }

    /// Judges a job that came back. A probe that fails like the target but cannot be told apart from it
    /// by its own output takes the kernel the sanitizer named for the same fault stack earlier in this
    /// search, or goes back to its worker for a sanitizer run of its own (once).
    pub(super) fn land(&mut self, pool: &mut Pool, landed: Landed) -> Landing {
        let Landed {
            worker,
            index,
            ctx,
            done,
        } = landed;
        match done {
            Done::Probed(outcome) => self.land_probe(pool, (worker, index, ctx), outcome),
            Done::Sanitized(s) => self.land_sanitized(pool, (worker, index, ctx), s),
        }
    }

    /// A probe's observation: judged from its output, from what a sanitizer run of its stack settled,
    /// or held while its worker runs the sanitizer (or waits for the run of the same stack).
    fn land_probe(
        &mut self,
        pool: &mut Pool,
        (worker, index, ctx): (usize, usize, ProbeContext),
        outcome: Box<ProbeOutcome>,
    ) -> Landing {
        let crowded_out = self.crowd_check(pool, worker, &ctx, &outcome);
        if outcome.interrupted || crowded_out {
            return Landing::Stopped(index);
        }
        let target = self.target.clone();
        let j = judge(
            &outcome.record.signature,
            &outcome.output,
            self.terms(target.as_ref()),
            if self.sanitizes {
                Kernel::NotAsked
            } else {
                Kernel::Unknown
            },
        );
        if !j.ask_sanitizer {
            return self.judged(index, &ctx, *outcome, j, None);
        }
        if let Some(known) = self.settled.get(&outcome.record.signature) {
            let note = format!(
                "{REMEMBERED} {} ({})",
                short_sha(&known.commit),
                known.kernel
            );
            let mut outcome = *outcome;
            outcome.record.sanitizer = Some(note);
            let j = self.judge_kernel(&outcome, target.as_ref(), Some(&known.kernel));
            return self.judged(index, &ctx, outcome, j, Some(known.kernel));
        }
        let settling = self.pending.values().any(|p| {
            self.settled
                .same_stack(&p.outcome.record.signature, &outcome.record.signature)
        });
        if settling && pool.claim(worker) {
            self.awaiting.push(Landed {
                worker,
                index,
                ctx,
                done: Done::Probed(outcome),
            });
            return Landing::Pending;
        }
        if pool.claim(worker) && pool.send(worker, index, self.commits[index], ctx, Task::Sanitize)
        {
            self.pending.insert(
                worker,
                Pending {
                    outcome: *outcome,
                    target,
                },
            );
            return Landing::Pending;
        }
        let j = self.judge_kernel(&outcome, target.as_ref(), None);
        self.judged(index, &ctx, *outcome, j, None)
    }

    /// A sanitizer run of the probe its worker holds: the probe judged with the kernel it named (which
    /// the run remembers for the stack), and the probes that waited on it handed back.
    fn land_sanitized(
        &mut self,
        pool: &mut Pool,
        (worker, index, ctx): (usize, usize, ProbeContext),
        s: Option<Box<Sanitized>>,
    ) -> Landing {
        let Some(Pending {
            mut outcome,
            target,
        }) = self.pending.remove(&worker)
        else {
            return Landing::Sanitized(s);
        };
        // The probes that waited on this stack are judged next, from what it settled.
        for landed in std::mem::take(&mut self.awaiting) {
            pool.release(landed.worker);
            self.held.push_back(landed);
        }
        // Stopped before it named a kernel: the probe is abandoned, never judged without it.
        if s.as_ref().is_some_and(|s| s.interrupted) {
            return Landing::Stopped(index);
        }
        let before = outcome.record.signature.clone();
        let kernel = s.as_ref().and_then(|s| s.finding.as_ref()?.kernel.clone());
        if let Some(s) = &s {
            outcome.record.duration_s += s.duration_s;
            outcome.record.sanitizer = Some(s.summary.clone());
            if let Some(k) = &kernel {
                self.settled.remember(&before, k, &outcome.record.commit);
            }
        }
        let j = self.judge_kernel(&outcome, target.as_ref(), kernel.as_deref());
        self.judged(index, &ctx, outcome, j, kernel)
    }

    /// The judge, with what a sanitizer said of the probe's kernel.
    fn judge_kernel(
        &self,
        outcome: &ProbeOutcome,
        target: Option<&Signature>,
        kernel: Option<&str>,
    ) -> Judgement {
        let evidence = kernel.map_or(Kernel::Unknown, Kernel::Named);
        judge(
            &outcome.record.signature,
            &outcome.output,
            self.terms(target),
            evidence,
        )
    }

    /// Writes the judgement into the probe's record, reports and keeps it. A kernel the sanitizer named
    /// becomes the signature's, when the target has one to compare it with.
    fn judged(
        &mut self,
        index: usize,
        ctx: &ProbeContext,
        outcome: ProbeOutcome,
        j: Judgement,
        kernel: Option<String>,
    ) -> Landing {
        let mut record = outcome.record;
        let against_kernel = self
            .terms(self.target.as_ref())
            .target
            .is_some_and(|t| t.kernel.is_some());
        if let Some(k) = kernel.filter(|_| against_kernel) {
            record.signature.kernel = Some(k);
        }
        record.verdict = j.verdict;
        record.matched_target = j.matched_target;
        record.reason = j.reason.clone();
        if j.other_bug {
            self.other_bugs.push(OtherBug {
                commit: record.commit.clone(),
                signature: record.signature.clone(),
                reason: j.reason.unwrap_or_else(|| "a different bug".into()),
            });
        }
        self.finish(ctx.step, &record);
        Landing::Judged(index, Box::new(record))
    }

    /// Settles a good end or merge base by its judged record, reporting what the rule says to.
    fn settle_check(&mut self, check: &EndCheck, rec: &ProbeRecord) -> Result<(), SearchEnd> {
        let event = end_check::settle(self.input, self.target.as_ref(), check, rec)?;
        if let Some(e) = event {
            self.reporter.event(&e);
        }
        Ok(())
    }

    /// Reports and keeps a record.
    pub(super) fn finish(&mut self, step: usize, record: &ProbeRecord) {
        self.reporter.event(&Event::ProbeFinished {
            step,
            record: Box::new(record.clone()),
        });
        self.probes.push(record.clone());
    }

    /// Probes one commit on the first worker while the others stay idle, as the endpoints are probed.
    pub(super) fn probe_alone(
        &mut self,
        pool: &mut Pool,
        oid: Oid,
        role: ProbeRole,
        repeated: bool,
    ) -> Result<ProbeRecord, SearchEnd> {
        if self.cancelled() {
            return Err(SearchEnd::Interrupted);
        }
        let index = self.index_of(oid);
        let (ctx, task) = self.probe_job(index, role, 0, repeated);
        let landing = self.alone(pool, index, ctx, task)?;
        record_of(landing)
    }

    /// Runs `oid` under compute-sanitizer on the first worker (the commit it probed last); `None` when no
    /// sanitizer can be used. The run takes a probe number only when it happens.
    pub(super) fn sanitize_alone(
        &mut self,
        pool: &mut Pool,
        oid: Oid,
        role: ProbeRole,
    ) -> Result<(ProbeContext, Option<Sanitized>), SearchEnd> {
        if self.cancelled() {
            return Err(SearchEnd::Interrupted);
        }
        let index = self.index_of(oid);
        let ctx = self.context(role, 0);
        let sanitized = match self.alone(pool, index, ctx, Task::Sanitize)? {
            Landing::Sanitized(s) => s.map(|s| *s),
            _ => None,
        };
        if sanitized.is_none() {
            // No sanitizer run, no probe: its number goes to the next one.
            self.steps -= 1;
        }
        Ok((ctx, sanitized))
    }

    /// Hands one job to the first worker and waits for what comes of it (a probe that goes on to its
    /// sanitizer run is waited for to the end); what other workers' probes give meanwhile is held.
    fn alone(
        &mut self,
        pool: &mut Pool,
        index: usize,
        ctx: ProbeContext,
        task: Task,
    ) -> Result<Landing, SearchEnd> {
        self.send_first(pool, index, ctx, task)?;
        self.wait_on(pool, None)
    }

    /// Hands one job to the first worker (the gauge watching a probe when it is the one to measure).
    fn send_first(
        &mut self,
        pool: &mut Pool,
        index: usize,
        ctx: ProbeContext,
        task: Task,
    ) -> Result<(), SearchEnd> {
        if matches!(task, Task::Probe(_)) {
            self.watch(pool, 0);
        }
        if !(pool.claim(0) && pool.send(0, index, self.commits[index], ctx, task)) {
            return Err(SearchEnd::HostFailure("no probe worker".into()));
        }
        Ok(())
    }

    /// Probes the end whose fault becomes the target (the bad end; finding a fix, the OLD end, as
    /// `role`) on the first worker and, beside it, opens the first round on the others: the checks of
    /// the other ends, then what `strategy` proposes, one per worker. The round's probes are held until
    /// that end is settled (the target is what they are judged against). On a shared GPU not yet
    /// measured the round runs at its full width, and the gauge's reading of that end is shared among the
    /// probes beside it.
    pub(super) fn probe_opening(
        &mut self,
        pool: &mut Pool,
        (oid, role): (Oid, ProbeRole),
        strategy: &mut dyn Strategy,
        checks: &mut Checks,
    ) -> Result<ProbeRecord, SearchEnd> {
        if self.cancelled() {
            return Err(SearchEnd::Interrupted);
        }
        let index = self.index_of(oid);
        let (mut ctx, task) = self.probe_job(index, role, 0, false);
        if !self.opened && pool.first_shared().is_some() && !pool.measured() {
            pool.set_limit(pool.size());
        }
        self.mark_crowded(pool, 0, &mut ctx);
        self.send_first(pool, index, ctx, task)?;
        if !self.opened {
            self.opened = true;
            self.send_checks(pool, checks);
            self.progress = strategy.progress();
            if let Proposal::Run(picks) = strategy.propose(pool.idle()) {
                self.send_picks(pool, strategy, picks);
            }
        }
        match self.wait_on(pool, Some((strategy, checks)))? {
            // Crowded out (its GPU fell back to one probe at a time): again, once the round is in.
            Landing::Stopped(_) if !self.cancelled() => {
                self.hold_all(pool);
                self.probe_alone(pool, oid, role, false)
            }
            landing => record_of(landing),
        }
    }

    /// Drops the probes awaiting a settled stack or held unjudged, their workers given back, each said
    /// to be abandoned (unless Ctrl-C ended the run): the strategy they were run for is over.
    fn abandon_leftovers(&mut self, pool: &mut Pool) {
        let left: Vec<Landed> = self.awaiting.drain(..).chain(self.held.drain(..)).collect();
        for landed in left {
            pool.release(landed.worker);
            if !self.cancelled() {
                self.reporter.event(&Event::ProbeAbandoned {
                    step: landed.ctx.step,
                    commit: self.commits[landed.index].to_string(),
                    worker: landed.worker + 1,
                });
            }
        }
    }

    /// Sets the last record of `oid` aside: skipped, saying `why` (it counts as no run of its commit).
    pub(super) fn set_aside(&mut self, oid: Oid, why: &str) {
        let commit = oid.to_string();
        if let Some(r) = self.probes.iter_mut().rev().find(|r| r.commit == commit) {
            r.verdict = Verdict::Skip;
            r.reason = Some(why.to_string());
        }
    }

    /// What the first worker's job gives, once it is done. Other workers' probes that land meanwhile are
    /// held, their workers kept for them (a sanitizer run of theirs finds their commit), except, while
    /// that job is the end that opens the round (`opening`: the round's strategy and checks), what needs
    /// no target: a clean run is good whatever the target turns out to be (finding a fix, the newer
    /// state), so the strategy takes it at once and its worker the next pick, while its record waits with
    /// the held ones (a range the end refuses still judges none of the round); and a probe that stopping
    /// made moot is abandoned. Without this the search would wait on the bad end's cold run with the
    /// round's answers in hand. Not where the bad end runs several times: a flaky fault's search takes the
    /// round's runs once they are all in.
    fn wait_on(
        &mut self,
        pool: &mut Pool,
        mut opening: Option<(&mut dyn Strategy, &Checks)>,
    ) -> Result<Landing, SearchEnd> {
        let early = self.input.flaky.endpoint_runs <= 1;
        let mut kept = Vec::new();
        let landing = loop {
            let Some(landed) = pool.land(self.reporter) else {
                if pool.all_idle() {
                    break Err(SearchEnd::HostFailure("the probe worker is gone".into()));
                }
                continue;
            };
            if landed.worker == 0 {
                match self.land(pool, landed) {
                    Landing::Pending => continue,
                    other => break Ok(other),
                }
            }
            let left = match opening.as_mut() {
                Some((strategy, checks)) if early && !self.cancelled() => {
                    self.take_early(pool, &mut **strategy, checks, landed)
                }
                _ => Some(landed),
            };
            if let Some(landed) = left {
                pool.claim(landed.worker);
                kept.push(landed.worker);
                self.held.push_back(landed);
            }
        };
        for w in kept {
            pool.release(w);
        }
        landing
    }

    /// Takes a probe of the opening round that needs no target (see [`Self::wait_on`]) and hands the
    /// idle workers the strategy's next picks; any other landing is given back, to be held.
    fn take_early(
        &mut self,
        pool: &mut Pool,
        strategy: &mut dyn Strategy,
        checks: &Checks,
        landed: Landed,
    ) -> Option<Landed> {
        if checks.checking.contains_key(&landed.worker) {
            return Some(landed);
        }
        match &landed.done {
            Done::Probed(o) if o.interrupted => {
                let key = (
                    landed.ctx.step,
                    self.commits[landed.index].to_string(),
                    landed.worker,
                );
                // Abandoned: a stopped probe ends nothing.
                let landing = self.land(pool, landed);
                let _ = self.search_landed(pool, strategy, checks, landing, key, false);
            }
            Done::Probed(o) if o.record.signature.class == FaultClass::None => {
                let j = judge(
                    &o.record.signature,
                    &o.output,
                    self.terms(None),
                    Kernel::NotAsked,
                );
                strategy.mark(landed.index, j.verdict);
                self.marked_early.insert(landed.ctx.step);
                self.held.push_back(landed);
                self.stop_unwanted(pool, strategy, checks, Some(0));
            }
            _ => return Some(landed),
        }
        // No check is left to send (they go out before any pick). An answer waits for the end being
        // settled: the loop asks the strategy again then.
        let _ = self.send_proposals(pool, strategy);
        None
    }

    /// Waits for every probe in flight, holding what each gives: the bad end runs again alone.
    pub(super) fn hold_all(&mut self, pool: &mut Pool) {
        while !pool.all_idle() {
            if let Some(landed) = pool.land(self.reporter) {
                self.held.push_back(landed);
            }
        }
    }

    /// Stops every probe in flight and drops what the held ones gave: the range was refused, or the
    /// search stopped, before they could be judged.
    pub(super) fn drop_round(&mut self, pool: &mut Pool) {
        pool.stop_all();
        self.hold_all(pool);
        self.abandon_leftovers(pool);
    }

    /// The one loop. Idle workers get the endpoint checks first, then what the strategy proposes; each
    /// answer is judged and marked the moment it lands, and a probe in flight that no longer carries news
    /// is stopped. A check that fails ends the search (every probe stopped); an answer waits until every
    /// check has passed. When a strategy ends, every probe still in flight is stopped and waited for, and
    /// the next strategy (if any) takes over.
    pub(super) fn drive(
        &mut self,
        pool: &mut Pool,
        mut strategy: Box<dyn Strategy>,
        mut checks: Checks,
    ) -> Result<Answer, SearchEnd> {
        let mut ending: Option<Result<Answer, SearchEnd>> = None;
        loop {
            // Ctrl-C ends the search, also while an answer waits for the endpoint checks (it is no answer
            // until they pass); an answer that needs nothing more is kept.
            let unsettled = !checks.done() && matches!(ending, Some(Ok(_)));
            if (ending.is_none() || unsettled) && self.cancelled() {
                ending = Some(Err(SearchEnd::Interrupted));
            }
            if let Some(end) = ending.take() {
                match self.wind(pool, end, &mut checks, &mut strategy) {
                    Wind::Wait(end) => ending = Some(end),
                    Wind::Next => continue,
                    Wind::Return(result) => return result,
                }
            }
            if let Some(check) = checks.recheck.take() {
                if pool.all_idle() {
                    if let Err(e) = self.recheck_alone(pool, &check) {
                        ending = Some(Err(e));
                    }
                    continue;
                }
                checks.recheck = Some(check);
            }
            // What the first round held is judged before anything new is sent.
            let landed = match self.held.pop_front() {
                Some(landed) => landed,
                None => {
                    let waiting = ending.is_some() || checks.recheck.is_some();
                    self.send_checks(pool, &mut checks);
                    if !waiting && pool.idle() > 0 {
                        if let Some(answer) = self.send_proposals(pool, strategy.as_mut()) {
                            ending = Some(Ok(answer));
                            continue;
                        }
                    }
                    let Some(landed) = pool.land(self.reporter) else {
                        continue;
                    };
                    landed
                }
            };
            let (worker, step) = (landed.worker, landed.ctx.step);
            let commit = self.commits[landed.index].to_string();
            let landing = self.land(pool, landed);
            if !matches!(landing, Landing::Pending) {
                if let Some(check) = checks.checking.remove(&worker) {
                    if let Some(e) = self.check_landed(pool, &mut checks, check, landing) {
                        ending = Some(Err(e));
                    }
                    continue;
                }
            }
            let landed = (step, commit, worker);
            let ending_now = ending.is_some();
            if let Some(e) = self.search_landed(
                pool,
                strategy.as_mut(),
                &checks,
                landing,
                landed,
                ending_now,
            ) {
                ending = Some(Err(e));
            }
        }
    }

    /// An ending met: waited for while an answer waits on the checks (the strategy's probes still out
    /// are moot) or probes are still out (all stopped); else the next strategy, or the search's end.
    fn wind(
        &mut self,
        pool: &mut Pool,
        end: Result<Answer, SearchEnd>,
        checks: &mut Checks,
        strategy: &mut Box<dyn Strategy>,
    ) -> Wind {
        if end.is_ok() && !checks.done() {
            self.stop_moot(pool, checks);
            return Wind::Wait(end);
        }
        if !pool.all_idle() {
            pool.stop_all();
            checks.unsent.clear();
            return Wind::Wait(end);
        }
        // What landed but was not judged is moot now: no other strategy takes it.
        self.abandon_leftovers(pool);
        match end.and_then(|answer| self.next(answer, strategy.as_ref())) {
            Err(e) => Wind::Return(Err(e)),
            Ok(Next::Swap(next)) => {
                *strategy = next;
                Wind::Next
            }
            Ok(Next::End(answer)) => Wind::Return(Ok(answer)),
        }
    }

    /// Stops the probes in flight that carry no news now: all but the checks and the probes that go on
    /// to their sanitizer runs.
    fn stop_moot(&self, pool: &mut Pool, checks: &Checks) {
        for (w, _) in pool.busy() {
            if !checks.checking.contains_key(&w) && !self.pending.contains_key(&w) {
                pool.stop(w);
            }
        }
    }

    /// A check that failed beside other probes, run again alone: its verdict settles it.
    fn recheck_alone(&mut self, pool: &mut Pool, check: &EndCheck) -> Result<(), SearchEnd> {
        let rec = self.probe_alone(pool, check.oid, check.role, true)?;
        self.settle_check(check, &rec)
    }

    /// Hands the checks not yet sent to idle workers (none while a check waits to run alone).
    fn send_checks(&mut self, pool: &mut Pool, checks: &mut Checks) {
        while checks.recheck.is_none() && pool.idle() > 0 && !checks.unsent.is_empty() {
            let Some(w) = pool.take_idle() else { break };
            let Some(check) = checks.unsent.pop_front() else {
                break;
            };
            let index = self.index_of(check.oid);
            if self.send(pool, w, index, check.role, false) {
                checks.checking.insert(w, check);
            } else {
                checks.unsent.push_front(check);
            }
        }
    }

    /// Hands the idle workers what the strategy proposes: its answer, when it has one.
    fn send_proposals(&mut self, pool: &mut Pool, strategy: &mut dyn Strategy) -> Option<Answer> {
        self.progress = strategy.progress();
        match strategy.propose(pool.idle()) {
            Proposal::Run(picks) => {
                self.send_picks(pool, strategy, picks);
                None
            }
            Proposal::Wait => None,
            Proposal::Done(answer) => Some(answer),
        }
    }

    /// Hands each pick to an idle worker; one no worker takes is given back to the strategy.
    fn send_picks(&mut self, pool: &mut Pool, strategy: &mut dyn Strategy, picks: Vec<usize>) {
        for i in picks {
            let sent = match pool.take_idle() {
                Some(w) => self.send(pool, w, i, strategy.role(), strategy.repeats()),
                None => false,
            };
            if !sent {
                strategy.abandon(i);
            }
        }
    }

    /// A check's probe landed: settled; or, failed beside other probes the first time, run again alone
    /// once the others stop; or, stopped by a crowd on its GPU, sent again. `Some`: the search ends.
    fn check_landed(
        &mut self,
        pool: &mut Pool,
        checks: &mut Checks,
        check: EndCheck,
        landing: Landing,
    ) -> Option<SearchEnd> {
        match landing {
            Landing::Judged(_, record) => {
                let e = self.settle_check(&check, &record).err()?;
                if pool.size() > 1 && !checks.rechecked {
                    checks.rechecked = true;
                    checks.recheck = Some(check);
                    self.stop_moot(pool, checks);
                    None
                } else {
                    Some(e)
                }
            }
            // By Ctrl-C: the search ends.
            _ if self.cancelled() => Some(SearchEnd::Interrupted),
            _ => {
                checks.unsent.push_front(check);
                None
            }
        }
    }

    /// A search probe landed: marked in the strategy, and the probes it made moot stopped (an answer
    /// that lands while the strategy is ending is recorded but not marked); a stopped one abandoned.
    /// `Some`: the search ends (the host failed under the probe).
    fn search_landed(
        &mut self,
        pool: &mut Pool,
        strategy: &mut dyn Strategy,
        checks: &Checks,
        landing: Landing,
        (step, commit, worker): (usize, String, usize),
        ending: bool,
    ) -> Option<SearchEnd> {
        match landing {
            Landing::Pending | Landing::Sanitized(_) => {}
            Landing::Stopped(i) => {
                strategy.abandon(i);
                if !self.cancelled() {
                    self.reporter.event(&Event::ProbeAbandoned {
                        step,
                        commit,
                        worker: worker + 1,
                    });
                }
            }
            Landing::Judged(_, _) if ending => {}
            Landing::Judged(i, record) => {
                if let Some(msg) = host_failure(&record).filter(|_| strategy.host_failure_ends()) {
                    return Some(SearchEnd::HostFailure(msg));
                }
                if !self.marked_early.remove(&step) {
                    strategy.mark(i, record.verdict);
                }
                self.stop_unwanted(pool, strategy, checks, None);
            }
        }
        None
    }

    /// Stops the probes in flight that carry no news for `strategy`: not a check's, not one that goes on
    /// to its sanitizer run, not `keep`'s (the end being settled, which is no pick of the strategy).
    fn stop_unwanted(
        &self,
        pool: &Pool,
        strategy: &dyn Strategy,
        checks: &Checks,
        keep: Option<usize>,
    ) {
        for (w, i) in pool.busy() {
            if Some(w) != keep
                && !strategy.wants(i)
                && !self.pending.contains_key(&w)
                && !checks.checking.contains_key(&w)
            {
                pool.stop(w);
            }
        }
    }

    /// What follows a strategy's answer: the next strategy, or the search's answer.
    fn next(&mut self, answer: Answer, ended: &dyn Strategy) -> Result<Next, SearchEnd> {
        let input = self.input;
        Ok(match answer {
            Answer::Plain(SearchResult::Found(i)) => match self.parent_of(i) {
                // The bad end ran several times and faulted every time: its parent is run as many
                // times, and a fault there says the fault is flaky after all.
                Some(parent) if input.flaky.endpoint_runs > 1 => {
                    Next::Swap(Box::new(ParentCheck {
                        culprit: i,
                        parent,
                        left: input.flaky.endpoint_runs,
                        in_flight: false,
                        faulted: false,
                    }))
                }
                _ => Next::End(Answer::Plain(SearchResult::Found(i))),
            },
            Answer::ParentClean(i) => Next::End(Answer::Plain(SearchResult::Found(i))),
            Answer::ParentFaults(i) => {
                self.reporter.event(&Event::FlakyAfterAll {
                    culprit: self.commits[i].to_string(),
                });
                let earlier = self.runs_so_far();
                Next::Swap(Box::new(self.flaky(&earlier, ended.progress())))
            }
            Answer::Flaky(result) => {
                self.flaky = Some(self.flaky_answer(&result));
                match self.parent_of(result.culprit).filter(|_| result.reached) {
                    Some(parent) => {
                        let commit = self.commits[parent].to_string();
                        let verify =
                            Verify::new(result.culprit, parent, commit, input.flaky.confidence);
                        self.flaky_result = Some(result);
                        Next::Swap(Box::new(verify))
                    }
                    None => Next::End(Answer::Flaky(result)),
                }
            }
            Answer::Verified(v) => {
                if let Some(f) = self.flaky.as_mut() {
                    f.verification = Some(v);
                }
                match self.flaky_result.take() {
                    Some(result) => Next::End(Answer::Flaky(result)),
                    None => {
                        return Err(SearchEnd::HostFailure(
                            "a verification ended with no flaky answer to verify".into(),
                        ))
                    }
                }
            }
            other @ (Answer::Plain(SearchResult::Ambiguous(_)) | Answer::RanAgain(_)) => {
                Next::End(other)
            }
        })
    }
}

/// The record of a probe run on the first worker: stopped only by Ctrl-C.
fn record_of(landing: Landing) -> Result<ProbeRecord, SearchEnd> {
    match landing {
        Landing::Judged(_, record) => Ok(*record),
        Landing::Stopped(_) => Err(SearchEnd::Interrupted),
        Landing::Pending | Landing::Sanitized(_) => Err(SearchEnd::HostFailure(
            "a probe came back as a sanitizer run".into(),
        )),
    }
}

/// The endpoint checks of one `drive`: not yet sent, in flight (by worker), and one that failed beside
/// other probes, to run again alone before the range is refused (once: `rechecked`). A repro that writes
/// what every worker shares can fail because of the others.
#[derive(Default)]
pub(super) struct Checks {
    unsent: VecDeque<EndCheck>,
    checking: HashMap<usize, EndCheck>,
    recheck: Option<EndCheck>,
    rechecked: bool,
}

impl Checks {
    /// `checks`, none sent yet.
    pub(super) fn of(checks: Vec<EndCheck>) -> Self {
        Checks {
            unsent: checks.into(),
            ..Checks::default()
        }
    }

    /// Every check passed.
    fn done(&self) -> bool {
        self.unsent.is_empty() && self.checking.is_empty() && self.recheck.is_none()
    }
}

/// What the loop does with an ending: waits on (probes to stop, checks to pass), goes on with the next
/// strategy, or returns.
enum Wind {
    Wait(Result<Answer, SearchEnd>),
    Next,
    Return(Result<Answer, SearchEnd>),
}

/// What follows a strategy.
enum Next {
    /// Another strategy takes over.
    Swap(Box<dyn Strategy>),
    /// The search's answer.
    End(Answer),
}

impl Driver<'_, '_> {
    /// The commit a culprit is measured against: its first parent in the range, else the good end below
    /// it.
    fn parent_of(&mut self, i: usize) -> Option<usize> {
        let input = self.input;
        match input.range.get(i).and_then(|c| c.parents.first()) {
            Some(&p) => Some(p),
            None => input.goods.first().map(|g| self.index_of(g.1)),
        }
    }

    /// Every run of the repro in the range so far, for a Bayesian search taking over.
    fn runs_so_far(&self) -> Vec<(usize, bool)> {
        let index: HashMap<String, usize> = self
            .input
            .range
            .iter()
            .enumerate()
            .map(|(k, c)| (c.oid.to_string(), k))
            .collect();
        self.probes
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
            .collect()
    }

    /// The Bayesian search over the range, with `earlier` runs recorded.
    pub(super) fn flaky(&self, earlier: &[(usize, bool)], progress: (usize, usize)) -> Flaky {
        let parents: Vec<Vec<usize>> = self.input.range.iter().map(|c| c.parents.clone()).collect();
        let flaky = self.input.flaky;
        let mut bayes = BayesSearch::new(&parents, None, flaky.confidence, flaky.max_runs as usize);
        for &(i, fault) in earlier {
            bayes.record(i, fault);
        }
        Flaky {
            bayes,
            in_flight: 0,
            progress,
        }
    }

    fn flaky_answer(&self, result: &BayesResult) -> FlakyAnswer {
        let name = |i: usize| self.commits[i].to_string();
        FlakyAnswer {
            p: result.p,
            culprit: name(result.culprit),
            posterior: result.confidence,
            confidence: self.input.flaky.confidence,
            reached: result.reached,
            runners_up: result
                .runners_up
                .iter()
                .map(|&(i, v)| (name(i), v))
                .collect(),
            runs: result.runs,
            verification: None,
        }
    }

    /// How the search ended, from the last strategy's answer.
    pub(super) fn end_of(&self, answer: Answer) -> SearchEnd {
        let oid = |i: usize| self.commits[i];
        match answer {
            Answer::Plain(SearchResult::Found(i)) | Answer::ParentClean(i) => {
                SearchEnd::Found(oid(i))
            }
            Answer::Plain(SearchResult::Ambiguous(ix)) => {
                SearchEnd::Ambiguous(ix.into_iter().map(oid).collect())
            }
            Answer::Flaky(r) if r.reached => SearchEnd::Found(oid(r.culprit)),
            Answer::Flaky(r) => {
                let mut most_likely = vec![oid(r.culprit)];
                most_likely.extend(r.runners_up.iter().map(|&(i, _)| oid(i)));
                SearchEnd::Ambiguous(most_likely)
            }
            Answer::ParentFaults(i) => SearchEnd::Found(oid(i)),
            Answer::Verified(_) | Answer::RanAgain(_) => SearchEnd::Interrupted,
        }
    }
}
