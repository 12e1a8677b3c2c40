//! The workers of a search: one thread per prober inside a thread scope, each running the probes and
//! sanitizer runs the driver hands it. One worker or many, the search takes this one path; a worker's
//! events reach the driver's reporter in the order they arrive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use git2::Oid;

use crate::classify::{FaultClass, Signature};
use crate::report::event::{Event, Reporter};
use crate::run::probe::prober::{Probe, ProbeContext, ProbeOutcome, Sanitized};

/// One worker as the search sees it: a prober of its own (its own worktree, warm build directory and
/// devices) and the flag that stops its probe (set on Ctrl-C, or when its answer no longer matters).
pub struct Worker<'a> {
    /// The prober.
    pub probe: &'a mut dyn Probe,
    /// Stops the probe in flight.
    pub stop: &'a AtomicBool,
}

/// What a worker is asked to do at a commit.
pub(super) enum Task {
    /// Run the repro, against this target (`None`: the bad endpoint, whose signature becomes it).
    Probe(Option<Box<Signature>>),
    /// Rerun the commit it probed last under compute-sanitizer.
    Sanitize,
}

/// What a worker did.
pub(super) enum Done {
    /// A probe's observation.
    Probed(Box<ProbeOutcome>),
    /// A sanitizer run (`None`: no sanitizer can be used).
    Sanitized(Option<Box<Sanitized>>),
}

/// A job handed to a worker.
struct Job {
    index: usize,
    oid: Oid,
    ctx: ProbeContext,
    task: Task,
}

/// What workers tell the driver.
enum Message {
    Event(Box<Event>),
    Done(Box<Landed>),
}

/// A job that came back from a worker.
pub(super) struct Landed {
    pub(super) worker: usize,
    pub(super) index: usize,
    pub(super) ctx: ProbeContext,
    pub(super) done: Done,
}

/// Forwards a worker's events to the driver.
struct ChannelReporter {
    tx: mpsc::Sender<Message>,
}

impl Reporter for ChannelReporter {
    fn event(&mut self, event: &Event) {
        let _ = self.tx.send(Message::Event(Box::new(event.clone())));
    }
}

/// How often the driver looks at Ctrl-C while every worker is busy.
const POLL: Duration = Duration::from_millis(50);

/// Worker threads, each running the jobs the driver hands it on its own prober.
pub(super) struct Pool<'s> {
    jobs: Vec<mpsc::Sender<Job>>,
    rx: mpsc::Receiver<Message>,
    stops: Vec<&'s AtomicBool>,
    /// The workers' threads: a stop also wakes its worker, should it be parked waiting for one.
    threads: Vec<std::thread::Thread>,
    /// Ctrl-C or SIGTERM: never cleared by the pool, even where a worker's stop flag is this flag.
    cancel: &'s AtomicBool,
    /// Idle workers, the first on top.
    idle: Vec<usize>,
    /// Which commit each busy worker is at.
    busy: HashMap<usize, usize>,
    /// The GPU each worker shares with others, if it does.
    shared: Vec<Option<String>>,
    /// Probes at once on a shared GPU: one until the search has measured what a probe uses.
    limit: usize,
    /// Whether the limit was set from a measurement (or fell back to one for good).
    measured: bool,
    /// What the shared GPU holds at once for the runs after the search (it may hold more than the
    /// workers); `None` until measured.
    room: Option<usize>,
}

/// One job on its worker's prober.
fn run_task(prober: &mut dyn Probe, job: &Job, reporter: &mut dyn Reporter) -> Done {
    match &job.task {
        Task::Probe(target) => Done::Probed(Box::new(prober.probe(
            job.oid,
            &job.ctx,
            target.as_deref(),
            reporter,
        ))),
        Task::Sanitize => {
            Done::Sanitized(prober.sanitize(job.oid, &job.ctx, reporter).map(Box::new))
        }
    }
}

/// What a job whose prober panicked comes back as: a probe that says the host is broken (the search
/// ends, saying why), no sanitizer run, a worker ready.
fn broken(job: &Job, panic: &(dyn std::any::Any + Send)) -> Done {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    match job.task {
        Task::Probe(_) => {
            let signature = Signature::new(
                FaultClass::Infra,
                format!("the probe worker failed (a defect of cudabisect): {why}"),
            );
            Done::Probed(Box::new(ProbeOutcome::without_run(
                job.oid, &job.ctx, signature,
            )))
        }
        Task::Sanitize => Done::Sanitized(None),
    }
}

/// Runs `f` with a pool of threads, one per worker; the threads end when `f` returns.
pub(super) fn with_pool<R>(
    workers: &mut [Worker],
    cancel: &AtomicBool,
    f: impl FnOnce(&mut Pool) -> R,
) -> R {
    let stops: Vec<&AtomicBool> = workers.iter().map(|w| w.stop).collect();
    let shared: Vec<Option<String>> = workers.iter().map(|w| w.probe.shared_gpu()).collect();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Message>();
        let mut jobs: Vec<mpsc::Sender<Job>> = Vec::new();
        let mut threads = Vec::new();
        for (w, worker) in workers.iter_mut().enumerate() {
            let (job_tx, job_rx) = mpsc::channel::<Job>();
            jobs.push(job_tx);
            let tx = tx.clone();
            let prober = &mut *worker.probe;
            let handle = scope.spawn(move || {
                let mut reporter = ChannelReporter { tx: tx.clone() };
                for job in job_rx {
                    // A prober that panics (a defect) ends its job as a broken host, never a silent
                    // worker the driver would wait on for ever.
                    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_task(&mut *prober, &job, &mut reporter)
                    }))
                    .unwrap_or_else(|panic| broken(&job, panic.as_ref()));
                    let landed = Landed {
                        worker: w,
                        index: job.index,
                        ctx: job.ctx,
                        done,
                    };
                    if tx.send(Message::Done(Box::new(landed))).is_err() {
                        break;
                    }
                }
            });
            threads.push(handle.thread().clone());
        }
        drop(tx);
        let mut pool = Pool {
            jobs,
            rx,
            idle: (0..stops.len()).rev().collect(),
            stops,
            threads,
            cancel,
            busy: HashMap::new(),
            shared,
            limit: 1,
            measured: false,
            room: None,
        };
        let out = f(&mut pool);
        // Closing the job channels ends the threads; the scope waits for them.
        pool.jobs.clear();
        out
    })
}

impl Pool<'_> {
    /// Workers there are.
    pub(super) fn size(&self) -> usize {
        self.jobs.len()
    }

    /// Idle workers that may start a probe now: on a shared GPU, only while fewer than the limit run
    /// there.
    pub(super) fn idle(&self) -> usize {
        let mut room: HashMap<&str, usize> = HashMap::new();
        let mut n = 0;
        for &w in &self.idle {
            match self.shared[w].as_deref() {
                None => n += 1,
                Some(gpu) => {
                    let left = room
                        .entry(gpu)
                        .or_insert_with(|| self.limit.saturating_sub(self.busy_on(gpu)));
                    if *left > 0 {
                        *left -= 1;
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Probes running on `gpu` (workers sharing it).
    pub(super) fn busy_on(&self, gpu: &str) -> usize {
        self.busy
            .keys()
            .filter(|&&w| self.shared[w].as_deref() == Some(gpu))
            .count()
    }

    /// Whether worker `w` may start a probe now.
    fn has_room(&self, w: usize) -> bool {
        self.shared[w]
            .as_deref()
            .is_none_or(|gpu| self.busy_on(gpu) < self.limit)
    }

    /// The first GPU that workers share, and how many share it.
    pub(super) fn first_shared(&self) -> Option<(String, usize)> {
        let gpu = self.shared.iter().flatten().next()?;
        let n = self
            .shared
            .iter()
            .filter(|s| s.as_ref() == Some(gpu))
            .count();
        Some((gpu.clone(), n))
    }

    /// The GPU worker `w` shares, if it does.
    pub(super) fn shared_gpu(&self, w: usize) -> Option<&str> {
        self.shared[w].as_deref()
    }

    /// Probes at once on each shared GPU from now on.
    pub(super) fn set_limit(&mut self, k: usize) {
        self.limit = k.max(1);
    }

    /// What the shared GPU holds at once after the search, measured against every place planned.
    pub(super) fn set_room(&mut self, k: usize) {
        self.room = Some(k.max(1));
    }

    /// Runs the shared GPU holds at once after the search: the room measured, never more than one once
    /// a probe was crowded out (the limit fell to one for good), the limit where nothing was measured.
    pub(super) fn room(&self) -> usize {
        match self.room {
            Some(_) if self.limit == 1 => 1,
            Some(room) => room.max(self.limit),
            None => self.limit.min(self.size()),
        }
    }

    /// Whether the limit is settled.
    pub(super) fn measured(&self) -> bool {
        self.measured
    }

    /// Settles the limit: nothing measures it again.
    pub(super) fn set_measured(&mut self) {
        self.measured = true;
    }

    /// Whether a probe runs on `gpu`.
    pub(super) fn busy_on_gpu(&self, gpu: &str) -> bool {
        self.busy_on(gpu) > 0
    }

    /// Probes at once on each shared GPU.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Whether a probe on worker `w` may have others beside it on its GPU.
    pub(super) fn crowded(&self, w: usize) -> bool {
        self.shared[w].is_some() && self.limit > 1
    }

    /// Whether no job is out.
    pub(super) fn all_idle(&self) -> bool {
        self.busy.is_empty()
    }

    /// The commits busy workers are at, by worker.
    pub(super) fn busy(&self) -> Vec<(usize, usize)> {
        self.busy.iter().map(|(&w, &i)| (w, i)).collect()
    }

    /// The next idle worker that may start a probe now, the first first; taken off the idle list.
    pub(super) fn take_idle(&mut self) -> Option<usize> {
        let at = self.idle.iter().rposition(|&w| self.has_room(w))?;
        Some(self.idle.remove(at))
    }

    /// Takes worker `w` off the idle list, if it is there.
    pub(super) fn claim(&mut self, w: usize) -> bool {
        match self.idle.iter().position(|&x| x == w) {
            Some(at) => {
                self.idle.remove(at);
                true
            }
            None => false,
        }
    }

    /// Puts worker `w`, claimed for work that did not come, back on the idle list.
    pub(super) fn release(&mut self, w: usize) {
        if !self.idle.contains(&w) && !self.busy.contains_key(&w) {
            self.idle.push(w);
        }
    }

    /// Hands a job to worker `w` (taken off the idle list by the caller), its stop flag cleared; false
    /// when the worker is gone (it goes back on the idle list).
    pub(super) fn send(
        &mut self,
        w: usize,
        index: usize,
        oid: Oid,
        ctx: ProbeContext,
        task: Task,
    ) -> bool {
        if !std::ptr::eq(self.stops[w], self.cancel) {
            self.stops[w].store(false, Ordering::SeqCst);
        }
        let job = Job {
            index,
            oid,
            ctx,
            task,
        };
        if self.jobs[w].send(job).is_ok() {
            self.busy.insert(w, index);
            true
        } else {
            self.idle.push(w);
            false
        }
    }

    /// Stops worker `w`'s job.
    pub(super) fn stop(&self, w: usize) {
        self.stops[w].store(true, Ordering::SeqCst);
        self.threads[w].unpark();
    }

    /// Stops every job in flight.
    pub(super) fn stop_all(&self) {
        for &w in self.busy.keys() {
            self.stop(w);
        }
    }

    /// The next job to come back, passing workers' events on to `reporter` meanwhile; `None` after a short
    /// wait with nothing back (so the caller can look at Ctrl-C), or when every worker is gone. The worker
    /// goes back on the idle list.
    pub(super) fn land(&mut self, reporter: &mut dyn Reporter) -> Option<Landed> {
        loop {
            match self.rx.recv_timeout(POLL) {
                Ok(Message::Event(e)) => reporter.event(&e),
                Ok(Message::Done(landed)) => {
                    self.busy.remove(&landed.worker);
                    self.idle.push(landed.worker);
                    return Some(*landed);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Every worker is gone: nothing out will come back.
                    self.busy.clear();
                    return None;
                }
            }
        }
    }
}
