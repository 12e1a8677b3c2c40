//! Drives a shrink through the harness protocol: describes the graph, locates the faulting node with one
//! recorded synchronous run, feeds the reduction state machine candidate by candidate (judged by the
//! same-signature oracle), confirms the result, and extracts the minimal model. The harness is seen only
//! through [`HarnessClient`], so the driver is tested in-process with scripted fakes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::classify::{classify, FaultClass, MatchPolicy, Signature};
use crate::exec::process::RunOutput;
use crate::marker::{harness_error, jit_only_dump, launched_in_open_node, open_markers};
use crate::protocol::client::{ended, HarnessClient, ProtocolError, RunRequest};
use crate::protocol::types::{with_recorded_shapes, GraphNode};
use crate::report::bundle::dir_bytes;
use crate::report::event::{Event, Reporter};
use crate::report::record::{
    AloneRuns, Confirmation, ParentCheck, Rejected, ReproData, ShrinkReport, ShrinkStatus,
};
use crate::run::stages::places::Places;
use crate::shrink::{Reducer, Reduction, Step};

/// What a shrink needs to know besides the harness.
#[derive(Clone, Debug)]
pub struct ShrinkSettings<'a> {
    /// The same-bug policy.
    pub policy: &'a MatchPolicy,
    /// Where the recording, logs and minimal model go.
    pub out_dir: PathBuf,
    /// The fault to keep (from the bisection); `None`: whatever the harness's full run shows.
    pub target: Option<Signature>,
    /// Runs of a candidate before it counts as not reproducing.
    pub attempts: u32,
    /// Runs of the minimal subgraph in the final check.
    pub confirm: u32,
    /// Places on the GPU for the final check: with two or more, one writes repro.py while the others
    /// run the confirmations (and the repro with generated values, when its inputs are large).
    pub confirm_jobs: u32,
    /// The check of the minimal subgraph at the parent, run beside the final check where a worker of its
    /// own and a third place are at hand (else the caller runs it after the shrink).
    pub parent_beside: Option<ParentBeside<'a>>,
}

/// Runs the minimal subgraph at the first bad commit's parent, in a worker of its own: handed the report
/// as the final check begins (its kept nodes, signature and memcheck are final by then).
#[derive(Clone, Copy)]
pub struct ParentBeside<'a>(pub &'a (dyn Fn(&ShrinkReport) -> ParentCheck + Sync));

impl std::fmt::Debug for ParentBeside<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ParentBeside")
    }
}

/// Why a shrink stopped early.
enum Stop {
    Failed(String),
    NotReproduced(String),
    Interrupted,
}

impl From<ProtocolError> for Stop {
    fn from(e: ProtocolError) -> Self {
        Stop::Failed(e.to_string())
    }
}

/// Runs a candidate up to `attempts` times; true as soon as one run fails the target's way.
struct Oracle<'a> {
    harness: &'a dyn HarnessClient,
    policy: &'a MatchPolicy,
    target: Signature,
    runs: usize,
    rejected: Vec<Rejected>,
    log_dir: PathBuf,
    /// The GPU places the runs share with the runs of any other oracle of this shrink.
    places: &'a Places,
    /// How the logs of runs of `repro.py` alone are named.
    alone_log: &'static str,
}

impl<'a> Oracle<'a> {
    /// An oracle for runs beside this one's: same target and places, its own counts and log names.
    fn beside(&self, alone_log: &'static str) -> Oracle<'a> {
        Oracle {
            harness: self.harness,
            policy: self.policy,
            target: self.target.clone(),
            runs: 0,
            rejected: vec![],
            log_dir: self.log_dir.clone(),
            places: self.places,
            alone_log,
        }
    }

    fn judge(
        &mut self,
        keep: &[String],
        recording: &Path,
        attempts: u32,
        cancel: &AtomicBool,
    ) -> Result<bool, ProtocolError> {
        for _ in 0..attempts {
            let places = self.places;
            let _place = places.one();
            if self.run_once(keep, recording, cancel)? {
                return Ok(true);
            }
            if cancel.load(Ordering::SeqCst) {
                break;
            }
        }
        Ok(false)
    }

    /// One run of the candidate, logged and judged; the caller holds its place on the GPU.
    fn run_once(
        &mut self,
        keep: &[String],
        recording: &Path,
        cancel: &AtomicBool,
    ) -> Result<bool, ProtocolError> {
        let request = RunRequest {
            keep: Some(keep),
            recording: Some(recording),
            record: None,
        };
        let run = self.harness.run(&request, cancel)?;
        Ok(self.account(keep, &run))
    }

    /// Logs one run and judges it: true when it showed the target's fault.
    fn account(&mut self, keep: &[String], run: &RunOutput) -> bool {
        self.runs += 1;
        // Logs are for people reading the run afterwards; failing to write one changes no verdict.
        let _ = std::fs::write(
            self.log_dir.join(format!("run-{:04}.log", self.runs)),
            &run.output,
        );
        let sig = judged(self.harness, run);
        if self.policy.matches(&self.target, &sig, &run.output) {
            return true;
        }
        if sig.class != FaultClass::None {
            // A different failure is not a success: record it and go on.
            self.rejected.push(Rejected {
                nodes: keep.len(),
                class: sig.class,
                summary: sig.summary.clone(),
            });
        }
        false
    }

    /// Runs the written `repro.py` alone up to `runs` times: until one shows the target's fault when
    /// `until_shown`, else until one does not, up to `jobs` at once in that case (each is a fresh process
    /// of its own; one that misses beside others is run again by itself, so running them together never
    /// lowers the count). `None`: the harness writes no repro.py to run.
    fn alone(
        &mut self,
        repro: &Path,
        runs: u32,
        until_shown: bool,
        jobs: u32,
        cancel: &AtomicBool,
    ) -> Option<AloneRuns> {
        let mut done = AloneRuns {
            runs: 0,
            reproduced: 0,
            missed: None,
        };
        let jobs = if until_shown { 1 } else { jobs.max(1) };
        let mut left = runs.max(1);
        while left > 0 && !cancel.load(Ordering::SeqCst) {
            let batch = left.min(jobs);
            left -= batch;
            let (harness, places) = (self.harness, self.places);
            let results: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..batch)
                    .map(|_| {
                        s.spawn(|| {
                            let _place = places.one();
                            harness.run_alone(repro, cancel)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(Ok(None)))
                    .collect()
            });
            // Every run of the batch is logged and counted; the batch decides as one run would.
            let mut decided = false;
            for result in results {
                let mut seen = self.alone_run(result)?;
                if !seen.0 && batch > 1 && !decided && !cancel.load(Ordering::SeqCst) {
                    let _alone = places.all();
                    seen = self.alone_run(harness.run_alone(repro, cancel))?;
                }
                let (shown, missed) = seen;
                if !shown {
                    done.missed = missed;
                }
                done.runs += 1;
                done.reproduced += u32::from(shown);
                decided |= shown == until_shown;
            }
            if decided {
                break;
            }
        }
        Some(done)
    }

    /// One run of `repro.py` alone, logged: whether it showed the target's fault, and how it ended when
    /// it did not. `None`: the harness writes no repro.py to run.
    fn alone_run(
        &mut self,
        result: Result<Option<RunOutput>, ProtocolError>,
    ) -> Option<(bool, Option<String>)> {
        match result {
            Ok(None) => None,
            Ok(Some(run)) => {
                self.runs += 1;
                let _ = std::fs::write(
                    self.log_dir
                        .join(format!("{}-{:04}.log", self.alone_log, self.runs)),
                    &run.output,
                );
                // The copied code launches from repro.py's own lines: the launch site is not the
                // harness's, so only the class and the kernel (when both name one) decide.
                let mut sig = judged(self.harness, &run);
                sig.launch = None;
                let shown = self.policy.matches(&self.target, &sig, &run.output);
                Some((shown, (!shown).then(|| ended(&run))))
            }
            Err(e) => Some((false, Some(e.to_string()))),
        }
    }

    /// The final check: `runs` single-attempt runs, up to `jobs` at once (they are independent). A run that
    /// did not reproduce beside others is run again alone, so sharing the GPU never changes the verdict.
    /// Returns how many showed the target's fault.
    fn confirm(
        &mut self,
        keep: &[String],
        recording: &Path,
        runs: u32,
        jobs: u32,
        cancel: &AtomicBool,
    ) -> u32 {
        let (harness, places) = (self.harness, self.places);
        let request = RunRequest {
            keep: Some(keep),
            recording: Some(recording),
            record: None,
        };
        let mut reproduced = 0;
        let mut left = runs;
        while left > 0 && !cancel.load(Ordering::SeqCst) {
            let batch = left.min(jobs.max(1));
            left -= batch;
            let outputs: Vec<Option<RunOutput>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..batch)
                    .map(|_| {
                        s.spawn(|| {
                            let _place = places.one();
                            harness.run(&request, cancel).ok()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().ok().flatten())
                    .collect()
            });
            for run in outputs.into_iter().flatten() {
                let hit = self.account(keep, &run);
                // A miss beside other runs (an out-of-memory, or a fault that another process's GPU
                // exception disturbed) says nothing about the repro alone: run it again alone, so running
                // together never lowers the count.
                let alone = !hit && batch > 1 && {
                    let _alone = places.all();
                    self.run_once(keep, recording, cancel).unwrap_or(false)
                };
                if hit || alone {
                    reproduced += 1;
                }
            }
        }
        reproduced
    }
}

/// The signature of one harness run, its paths relative to the harness's directory like the
/// bisection's, so the located fault, the candidates and the target all read the same place the same way.
fn judged(harness: &dyn HarnessClient, run: &RunOutput) -> Signature {
    let mut sig = harness
        .judge(run)
        .unwrap_or_else(|| classify(run.exit, &run.output));
    if let Some(root) = harness.cwd() {
        sig.relativize(root);
    }
    sig
}

/// A recorded tensor over this many bytes may be generated from its shape, dtype and range.
const GENERATE_OVER: u64 = 1 << 20;
/// The data of a minimal repro is reduced only above this size: below it, exact values cost little.
const REDUCE_ABOVE: u64 = 8 << 20;

/// The bytes of the recorded inputs of the kept nodes, from their recorded shapes and dtypes: whether the
/// repro with generated values is worth writing before the exact one shows its size.
fn inputs_bytes(nodes: &[GraphNode], kept: &[usize]) -> u64 {
    kept.iter()
        .filter_map(|&i| nodes.get(i))
        .flat_map(|n| &n.inputs)
        .filter_map(|t| t.bytes())
        .sum()
}

/// What the repro with generated values did: whether it was written, and its runs alone.
struct GeneratedTry {
    written: bool,
    alone: Option<AloneRuns>,
}

/// Writes the repro with generated values into `generated` and runs it alone in fresh processes, up to
/// `jobs` at once, until one run does not show the fault.
fn try_generated(
    harness: &dyn HarnessClient,
    oracle: &mut Oracle,
    keep: &[String],
    record: &Path,
    generated: &Path,
    (runs, jobs): (u32, u32),
    cancel: &AtomicBool,
) -> GeneratedTry {
    let _ = std::fs::remove_dir_all(generated);
    let written = harness
        .extract_generated(keep, record, generated, GENERATE_OVER, cancel)
        .is_ok_and(|written| written);
    let alone = written
        .then(|| oracle.alone(&generated.join("repro.py"), runs, false, jobs, cancel))
        .flatten();
    GeneratedTry { written, alone }
}

/// Checks the written `repro.py` by itself, and shrinks what it ships. When its recorded values are large,
/// a repro.py that generates them from their shape, dtype and range (one allocation each, in the recorded
/// order) is written beside it and run alone in fresh processes (`tried`: already, beside the final
/// check); it replaces the exact one only when every one of `runs` runs shows the target's fault (a fault
/// that reads far outside a buffer depends on what is mapped there, which only a fresh process shows as a
/// maintainer will see it). Otherwise the exact repro is run alone until it shows the fault, up to `runs`
/// times, and the report says how it went.
fn check_alone_and_reduce(
    harness: &dyn HarnessClient,
    oracle: &mut Oracle,
    (keep, record, minimal): (&[String], &Path, &Path),
    (runs, jobs): (u32, u32),
    (tried, exact_alone): (Option<GeneratedTry>, Option<AloneRuns>),
    cancel: &AtomicBool,
) -> ReproData {
    let exact = dir_bytes(minimal);
    let mut data = ReproData {
        bytes: exact,
        exact_bytes: exact,
        generated: false,
        note: None,
        alone: None,
    };
    let generated = minimal.with_file_name("minimal-generated");
    if exact > REDUCE_ABOVE && harness.generates_values() {
        let tried = tried.unwrap_or_else(|| {
            try_generated(
                harness,
                oracle,
                keep,
                record,
                &generated,
                (runs, jobs),
                cancel,
            )
        });
        match tried.alone {
            Some(a) if a.reproduced == runs.max(1) => {
                if std::fs::remove_dir_all(minimal).is_ok()
                    && std::fs::rename(&generated, minimal).is_ok()
                {
                    data.bytes = dir_bytes(minimal);
                    data.generated = true;
                    data.alone = Some(a);
                    return data;
                }
                data.note =
                    Some("the repro with generated values could not be put in place".into());
            }
            Some(a) => {
                data.note = Some(format!(
                    "the fault needs the recorded values: repro.py with generated ones of the same shapes, dtypes and ranges, each allocated in the recorded order, did not fault when run alone ({} of {} runs did{})",
                    a.reproduced,
                    a.runs,
                    a.missed.as_deref().map_or(String::new(), |m| format!("; the last ended: {m}"))
                ));
            }
            None if tried.written => {
                data.note = Some("the repro with generated values could not be run alone".into());
            }
            None => data.note = Some("the repro with generated values could not be written".into()),
        }
    }
    // Tried beside the final check for inputs that turned out small: the exact repro is kept.
    let _ = std::fs::remove_dir_all(&generated);
    // Run alone already, beside the final check, or now.
    data.alone = exact_alone.or_else(|| {
        (!cancel.load(Ordering::SeqCst))
            .then(|| oracle.alone(&minimal.join("repro.py"), runs, true, 1, cancel))
            .flatten()
    });
    data
}

fn ids(nodes: &[GraphNode], picks: &[usize]) -> Vec<String> {
    picks.iter().map(|&i| nodes[i].id.clone()).collect()
}

fn empty_report(out_dir: &Path) -> ShrinkReport {
    ShrinkReport {
        status: ShrinkStatus::Failed,
        summary: String::new(),
        signature: None,
        located_node: None,
        nodes_before: 0,
        nodes_after: 0,
        kept: vec![],
        removed: vec![],
        runs_to_minimal: 0,
        harness_runs: 0,
        candidates: 0,
        rejected: vec![],
        confirmation: None,
        parent_check: None,
        duration_s: 0.0,
        out_dir: out_dir.display().to_string(),
        minimal_model: None,
        reproduce: None,
        extract_error: None,
        graph: None,
        captured: None,
        data: None,
        path: None,
        paths: vec![],
        memcheck: None,
    }
}

/// The report of a shrink that could not start (no step captured, no harness): its status and why.
pub fn not_started(out_dir: &Path, status: ShrinkStatus, summary: String) -> ShrinkReport {
    ShrinkReport {
        status,
        summary,
        ..empty_report(out_dir)
    }
}

/// Shrinks the model at one commit. Never fails outright: problems are in the report's status.
pub fn shrink(
    harness: &dyn HarnessClient,
    settings: &ShrinkSettings,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> ShrinkReport {
    let started = Instant::now();
    let mut report = empty_report(&settings.out_dir);
    let (status, summary) = match drive(harness, settings, &mut report, reporter, cancel) {
        Ok(summary) => (ShrinkStatus::Minimal, summary),
        Err(Stop::Failed(s)) => (ShrinkStatus::Failed, s),
        Err(Stop::NotReproduced(s)) => (ShrinkStatus::NotReproduced, s),
        Err(Stop::Interrupted) => (ShrinkStatus::Interrupted, "interrupted".into()),
    };
    report.status = status;
    report.summary = summary;
    if status != ShrinkStatus::Minimal {
        // A check at the parent means something only of a minimal subgraph.
        report.parent_check = None;
    }
    report.duration_s = started.elapsed().as_secs_f64();
    reporter.event(&Event::ShrinkFinished {
        summary: report.summary.clone(),
        status: report.status,
        kept: report.kept.iter().map(|n| n.id.clone()).collect(),
    });
    report
}

/// The nodes a run died in, outermost first (a harness that descends into a module nests its markers).
fn open_nodes(output: &str) -> Vec<String> {
    open_markers(output)
        .into_iter()
        .map(|m| m.node.to_string())
        .collect()
}

/// The recorded run of the whole model: the target signature and the nodes it died in, outermost first.
fn locate(
    harness: &dyn HarnessClient,
    job: &Shrinking,
    report: &mut ShrinkReport,
    cancel: &AtomicBool,
) -> Result<(Signature, Vec<String>), Stop> {
    let (settings, record, log_dir) = (job.settings, job.record.as_path(), job.log_dir.as_path());
    for _ in 0..settings.attempts {
        let request = RunRequest {
            keep: None,
            recording: None,
            record: Some(record),
        };
        let run = harness.run(&request, cancel)?;
        report.harness_runs += 1;
        let _ = std::fs::write(log_dir.join("locate.log"), &run.output);
        if let Some(line) = harness_error(&run.output) {
            // The harness failed by itself: never the model's failure, never "a different bug".
            return Err(Stop::Failed(format!(
                "the harness failed by itself, not the model: {}",
                line.trim_start_matches(crate::marker::HARNESS_ERROR_PREFIX)
                    .trim_start_matches(':')
                    .trim()
            )));
        }
        let sig = judged(harness, &run);
        let same = match &settings.target {
            // A kernel memcheck names is the kernel that ran, never a node's label: no relaxing.
            Some(t) if harness.judge(&run).is_some() => {
                settings.policy.matches(t, &sig, &run.output)
            }
            Some(t) => same_bug_across_stages(settings.policy, t, &sig, &run.output),
            None => {
                !matches!(sig.class, FaultClass::None)
                    && !crate::run::search::judge::is_host_problem(sig.class)
            }
        };
        if same {
            if let Some(dump) = jit_only_dump(&run.output) {
                return Err(jit_only(&sig, Path::new(dump), log_dir));
            }
            return Ok((sig, open_nodes(&run.output)));
        }
        if cancel.load(Ordering::SeqCst) {
            return Err(Stop::Interrupted);
        }
        report.signature = Some(sig);
    }
    let seen = report
        .signature
        .as_ref()
        .map_or("nothing".to_string(), |s| s.short());
    let want = settings
        .target
        .as_ref()
        .map_or("a fault".to_string(), |t| t.short());
    Err(Stop::NotReproduced(format!(
        "the harness's full run showed {seen}, not {want}"
    )))
}

/// The end of a shrink whose fault shows only in the program compiled as a whole (inside an XLA fusion):
/// nothing node by node can be kept, so the hand-off is the compiler's dump of the faulting executable,
/// copied into the shrink's logs (and so into the bundle).
fn jit_only(sig: &Signature, dump: &Path, log_dir: &Path) -> Stop {
    let to = log_dir.join("xla-dump");
    let kept = crate::report::bundle::copy_dir(dump, &to).is_ok();
    Stop::NotReproduced(format!(
        "the fault ({}) does not show equation by equation, only in the jitted executable (inside an XLA fusion){}",
        sig.short(),
        if kept {
            format!("; the XLA dump of the faulting executable is in {}", to.display())
        } else {
            format!("; the XLA dump could not be copied from {}", dump.display())
        }
    ))
}

/// The harness under memcheck, when the full run's miss may be only where the fault lands: the target is
/// a memory access, the full run ran clean, and a sanitizer is at hand. An overrun just past a buffer
/// faults in the repro's process, whose memory after the buffer is unmapped, and runs clean in the
/// harness's, which maps other buffers there; memcheck sees it in both.
fn memcheck_may_show<'h>(
    harness: &'h dyn HarnessClient,
    settings: &ShrinkSettings,
    report: &ShrinkReport,
) -> Option<Box<dyn HarnessClient + 'h>> {
    let target = settings.target.as_ref()?;
    let clean = report
        .signature
        .as_ref()
        .is_none_or(|s| s.class == FaultClass::None);
    (clean && crate::protocol::memcheck::is_memory_access(target.class))
        .then(|| harness.memchecked(target.class))
        .flatten()
}

/// Whether the harness's full run shows the bisection's target. The harness sees the fault from another
/// level: a node (an op, a module, an `autograd.Function`) where the repro named the kernel it launched.
/// When the node that died named no kernel it launched, its kernel field is only the node's label, and
/// its launch site may be the harness's own frame: those naming differences are set aside. A kernel the
/// node did launch, another class, another exception still tell a different bug.
pub fn same_bug_across_stages(
    policy: &MatchPolicy,
    target: &Signature,
    harness: &Signature,
    output: &str,
) -> bool {
    if policy.matches(target, harness, output) {
        return true;
    }
    if !matches!(policy, MatchPolicy::ClassAndKernel) || harness.class != target.class {
        return false;
    }
    let mut relaxed = harness.clone();
    if launched_in_open_node(output).is_none() {
        relaxed.kernel = None;
    }
    if relaxed
        .launch
        .as_deref()
        .is_some_and(crate::protocol::is_shipped_harness)
    {
        relaxed.launch = None;
    }
    policy.matches(target, &relaxed, output)
}

/// A finer graph the fault was pinned in: its nodes, the harness's account of its levels, and where the
/// call the run died in is.
type Descent = (Vec<GraphNode>, Option<String>, usize);

/// The graph as the recorded run saw it, descended to `inner` (the call the run died in), if the harness
/// can describe it and running that finer graph on the recording dies in `inner` the same way: only then
/// do the finer nodes stand in for the coarse ones (the reduction takes the located run's prefix as
/// failing). Returns the nodes, the description's account of the levels, and where `inner` is.
fn descend(
    harness: &dyn HarnessClient,
    job: &Shrinking,
    inner: &str,
    target: &Signature,
    report: &mut ShrinkReport,
    cancel: &AtomicBool,
) -> Result<Option<Descent>, Stop> {
    let (settings, record, log_dir) = (job.settings, job.record.as_path(), job.log_dir.as_path());
    let Ok(Some(finer)) = harness.describe_recorded(record, cancel) else {
        return Ok(None);
    };
    let Some(at) = finer.nodes.iter().position(|n| n.id == inner) else {
        return Ok(None);
    };
    let request = RunRequest {
        keep: None,
        recording: Some(record),
        record: None,
    };
    let run = harness.run(&request, cancel)?;
    report.harness_runs += 1;
    let _ = std::fs::write(log_dir.join("descend.log"), &run.output);
    if cancel.load(Ordering::SeqCst) {
        return Err(Stop::Interrupted);
    }
    let sig = judged(harness, &run);
    let same = settings.policy.matches(target, &sig, &run.output)
        && open_nodes(&run.output).last().map(String::as_str) == Some(inner);
    if !same {
        let graph = report.graph.take().unwrap_or_default();
        report.graph = Some(format!(
            "{graph}; the descent to {inner} did not reproduce on the recorded inputs ({}), so the fault stays at the module kept whole",
            sig.short()
        ));
        return Ok(None);
    }
    Ok(Some((finer.nodes, finer.graph, at)))
}

/// One shrink's settings and where it writes: the recording of the full run, and every run's log.
struct Shrinking<'a, 's> {
    settings: &'a ShrinkSettings<'s>,
    record: PathBuf,
    log_dir: PathBuf,
}

impl Shrinking<'_, '_> {
    /// Where the standalone repro is written.
    fn minimal(&self) -> PathBuf {
        self.settings.out_dir.join("minimal")
    }

    /// Runs of repro.py alone: enough to tell a repro that shows the fault from one that does not.
    fn alone_runs(&self) -> u32 {
        self.settings.confirm.min(3)
    }
}

fn drive(
    harness: &dyn HarnessClient,
    settings: &ShrinkSettings,
    report: &mut ShrinkReport,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<String, Stop> {
    let job = Shrinking {
        settings,
        record: settings.out_dir.join("record"),
        log_dir: settings.out_dir.join("logs"),
    };
    std::fs::create_dir_all(&job.log_dir)
        .map_err(|e| Stop::Failed(format!("cannot create {}: {e}", job.log_dir.display())))?;
    let description = harness
        .describe(cancel)
        .map_err(|e| Stop::Failed(format!("harness describe: {e}")))?;
    let nodes = description.nodes;
    report.graph = description.graph;
    report.nodes_before = nodes.len();
    reporter.event(&Event::ShrinkStarted { nodes: nodes.len() });
    match locate(harness, &job, report, cancel) {
        Ok(found) => shrink_located(harness, &job, nodes, found, report, reporter, cancel),
        Err(Stop::NotReproduced(why)) => {
            let Some(memchecked) = memcheck_may_show(harness, settings, report) else {
                return Err(Stop::NotReproduced(why));
            };
            reporter.event(&Event::ShrinkUnderMemcheck { why: why.clone() });
            let found = locate(&*memchecked, &job, report, cancel).map_err(|e| match e {
                Stop::NotReproduced(also) => Stop::NotReproduced(format!(
                    "{why}; under compute-sanitizer's memcheck too: {}",
                    also.trim_start_matches("the harness's full run showed ")
                )),
                other => other,
            })?;
            report.memcheck = Some(why);
            shrink_located(&*memchecked, &job, nodes, found, report, reporter, cancel)
        }
        Err(e) => Err(e),
    }
}

/// The shrink once the full run showed the target (`found`: its signature and the nodes it died in):
/// the faulting node pinned, the reduction, then the final check and the hand-off.
fn shrink_located(
    harness: &dyn HarnessClient,
    job: &Shrinking,
    nodes: Vec<GraphNode>,
    (target, open): (Signature, Vec<String>),
    report: &mut ShrinkReport,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<String, Stop> {
    report.signature = Some(target.clone());
    let (nodes, fault) = pin(harness, job, nodes, (&target, &open), report, cancel)?;
    report.located_node = Some(nodes[fault].id.clone());
    reporter.event(&Event::ShrinkLocated {
        node: nodes[fault].id.clone(),
        signature: target.short(),
    });
    // With two or more places, one is the writer's (it loads the model and the recorded values and
    // launches nothing); the runs share the others.
    let settings = job.settings;
    let places = Places::new(settings.confirm_jobs.saturating_sub(1).max(1) as usize);
    let mut oracle = Oracle {
        harness,
        policy: settings.policy,
        target: target.clone(),
        runs: 0,
        rejected: vec![],
        log_dir: job.log_dir.clone(),
        places: &places,
        alone_log: "alone",
    };
    let result = reduce(&mut oracle, job, (&nodes, fault), report, reporter, cancel)?;
    let keep = ids(&nodes, &result);
    let reproduced = check_and_hand_off(&mut oracle, job, (&nodes, &result), report, cancel)?;
    Ok(format!(
        "{} of {} nodes ({}) still fail with {}; minimal after {} harness run{}; confirmed {reproduced}/{}",
        result.len(),
        nodes.len(),
        keep.join(", "),
        target.short(),
        report.runs_to_minimal,
        if report.runs_to_minimal == 1 { "" } else { "s" },
        settings.confirm
    ))
}

/// The graph the reduction runs on and the faulting node in it: the described node the run died in,
/// else (it died inside a node the description kept whole) the call it died in, descended to.
fn pin(
    harness: &dyn HarnessClient,
    job: &Shrinking,
    nodes: Vec<GraphNode>,
    (target, open): (&Signature, &[String]),
    report: &mut ShrinkReport,
    cancel: &AtomicBool,
) -> Result<(Vec<GraphNode>, usize), Stop> {
    let innermost = open.last().cloned();
    let described = |nodes: &[GraphNode], id: &str| nodes.iter().position(|n| n.id == id);
    let mut nodes = nodes;
    let mut fault = innermost.as_deref().and_then(|id| described(&nodes, id));
    if let (None, Some(inner)) = (fault, &innermost) {
        // The run died inside a node the description kept whole: descend to the call it died in.
        if let Some((finer, graph, at)) = descend(harness, job, inner, target, report, cancel)? {
            nodes = finer;
            // The reduction runs on the graph the descent found: "k of n" counts that graph, in the
            // summary and in the report alike.
            report.nodes_before = nodes.len();
            report.graph = graph;
            fault = Some(at);
        } else {
            // The way down did not reproduce: the fault stays at the innermost described node.
            fault = open.iter().rev().find_map(|id| described(&nodes, id));
        }
    }
    let Some(fault) = fault else {
        return Err(Stop::Failed(format!(
            "the harness run failed ({}) but no node marker names where",
            target.short()
        )));
    };
    Ok((with_recorded_shapes(nodes, &job.record), fault))
}

/// The reduction, candidate by candidate, each judged by the oracle: the kept nodes' indices.
fn reduce(
    oracle: &mut Oracle,
    job: &Shrinking,
    (nodes, fault): (&[GraphNode], usize),
    report: &mut ShrinkReport,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Vec<usize>, Stop> {
    let mut reducer = Reducer::new(nodes.len(), fault);
    let result = loop {
        if cancel.load(Ordering::SeqCst) {
            report.harness_runs += oracle.runs;
            return Err(Stop::Interrupted);
        }
        match reducer.next_step() {
            Step::Done(result) => break result,
            Step::Run(candidate) => {
                let stage = reducer.stage();
                let keep = ids(nodes, &candidate);
                let fails = oracle
                    .judge(&keep, &job.record, job.settings.attempts, cancel)
                    .inspect_err(|_| report.harness_runs += oracle.runs)?;
                reducer.mark(&candidate, fails);
                reporter.event(&Event::ShrinkCandidate {
                    run: reducer.runs(),
                    stage,
                    nodes: candidate.len(),
                    reproduced: fails,
                });
            }
        }
    };
    report.candidates = reducer.runs();
    report.runs_to_minimal = report.harness_runs + oracle.runs;
    Ok(result)
}

/// What the final check gave beside its count: repro.py written beside it (and its runs alone), and the
/// repro with generated values tried, where they were.
struct Checked {
    reproduced: u32,
    extracted: Option<Result<(), ProtocolError>>,
    exact_alone: Option<AloneRuns>,
    tried: Option<GeneratedTry>,
}

/// The final check of the kept nodes: the same signature on every one of `confirm` runs, each a single
/// attempt, counted into the report.
fn final_check(
    oracle: &mut Oracle,
    job: &Shrinking,
    (nodes, result, keep): (&[GraphNode], &[usize], &[String]),
    report: &mut ShrinkReport,
    cancel: &AtomicBool,
) -> Result<Checked, Stop> {
    let (harness, settings, record) = (oracle.harness, job.settings, job.record.as_path());
    let places = oracle.places;
    // Where the GPU holds several runs at once, repro.py is written beside the check (the written file
    // does not depend on it), and where the kept inputs are large the repro with generated values is
    // written and run alone beside it too: the places bound every run of the three. Where the inputs
    // looked small but what repro.py ships is large (a loss call's arguments, the parameters), the
    // repro with generated values is tried as soon as that is known, still beside the check.
    let minimal = job.minimal();
    let generated = minimal.with_file_name("minimal-generated");
    let alone_runs = job.alone_runs();
    let mut side = oracle.beside("alone-generated");
    let mut exact_side = oracle.beside("alone");
    let (reproduced, extracted, tried) = if settings.confirm_jobs > 1 {
        let large = harness.generates_values() && inputs_bytes(nodes, result) > REDUCE_ABOVE;
        let at_once = places.total() as u32;
        // The generating repro is tried at most once: from the start when the inputs are large, else by
        // the writer's thread once it knows what repro.py ships.
        let (mut early_side, mut late_side) = if large {
            (Some(&mut side), None)
        } else {
            (None, Some(&mut side))
        };
        std::thread::scope(|s| {
            let written = s.spawn(|| {
                let extracted = harness.extract(keep, record, &minimal, cancel);
                let repro = minimal.join("repro.py");
                let ships_large = harness.generates_values() && dir_bytes(&minimal) > REDUCE_ABOVE;
                // A repro.py whose data stays as recorded (the common case) is run alone as soon as
                // it is written, beside the check, in the check's places.
                let written = extracted.is_ok() && repro.is_file();
                let alone = (written && !ships_large)
                    .then(|| exact_side.alone(&repro, alone_runs, true, 1, cancel))
                    .flatten();
                let late = late_side
                    .as_mut()
                    .filter(|_| written && ships_large)
                    .map(|side| {
                        try_generated(
                            harness,
                            side,
                            keep,
                            record,
                            &generated,
                            (alone_runs, at_once),
                            cancel,
                        )
                    });
                (extracted, alone, late)
            });
            let tried = early_side.as_mut().map(|side| {
                let generated = &generated;
                s.spawn(move || {
                    try_generated(
                        harness,
                        side,
                        keep,
                        record,
                        generated,
                        (alone_runs, at_once),
                        cancel,
                    )
                })
            });
            let reproduced = oracle.confirm(keep, record, settings.confirm, at_once, cancel);
            let (extracted, late) = match written.join() {
                Ok((extracted, alone, late)) => (Some((extracted, alone)), late),
                Err(_) => (None, None),
            };
            (
                reproduced,
                extracted,
                tried.and_then(|t| t.join().ok()).or(late),
            )
        })
    } else {
        let reproduced = oracle.confirm(keep, record, settings.confirm, 1, cancel);
        (reproduced, None, None)
    };
    if cancel.load(Ordering::SeqCst) {
        report.harness_runs += oracle.runs;
        return Err(Stop::Interrupted);
    }
    report.confirmation = Some(Confirmation {
        runs: settings.confirm,
        reproduced,
    });
    report.harness_runs += std::mem::take(&mut oracle.runs)
        + std::mem::take(&mut side.runs)
        + std::mem::take(&mut exact_side.runs);
    report.rejected.append(&mut oracle.rejected);
    report.rejected.append(&mut side.rejected);
    report.rejected.append(&mut exact_side.rejected);
    let (extracted, exact_alone) = extracted.map_or((None, None), |(e, alone)| (Some(e), alone));
    Ok(Checked {
        reproduced,
        extracted,
        exact_alone,
        tried,
    })
}

/// The final check, and beside it the check at the parent where the settings hand one over and the GPU
/// has a third place: it needs only what is final now (the kept nodes, the signature, memcheck), and in a
/// worker of its own it costs no time. Its result goes into the report.
fn final_check_and_parent(
    oracle: &mut Oracle,
    job: &Shrinking,
    (nodes, result, keep): (&[GraphNode], &[usize], &[String]),
    report: &mut ShrinkReport,
    cancel: &AtomicBool,
) -> Result<Checked, Stop> {
    let at_parent = job
        .settings
        .parent_beside
        .filter(|_| job.settings.confirm_jobs > 2)
        .map(|check| {
            let snapshot = ShrinkReport {
                kept: result.iter().map(|&i| nodes[i].clone()).collect(),
                ..report.clone()
            };
            (check, snapshot)
        });
    let (checked, parent_check) = std::thread::scope(|s| {
        let beside = at_parent
            .as_ref()
            .map(|(check, snapshot)| s.spawn(move || (check.0)(snapshot)));
        let checked = final_check(oracle, job, (nodes, result, keep), report, cancel);
        (checked, beside.and_then(|h| h.join().ok()))
    });
    report.parent_check = parent_check;
    checked
}

/// The final check of the kept nodes (`result`), the standalone repro written and run alone, and the
/// report filled in: how many of the check's runs showed the target.
fn check_and_hand_off(
    oracle: &mut Oracle,
    job: &Shrinking,
    (nodes, result): (&[GraphNode], &[usize]),
    report: &mut ShrinkReport,
    cancel: &AtomicBool,
) -> Result<u32, Stop> {
    let (harness, record) = (oracle.harness, job.record.as_path());
    let keep = ids(nodes, result);
    let Checked {
        reproduced,
        extracted,
        exact_alone,
        tried,
    } = final_check_and_parent(oracle, job, (nodes, result, &keep), report, cancel)?;
    let minimal = job.minimal();
    let generated = minimal.with_file_name("minimal-generated");
    let alone_runs = job.alone_runs();
    report.kept = result.iter().map(|&i| nodes[i].clone()).collect();
    report.removed = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| !result.contains(i))
        .map(|(_, n)| n.id.clone())
        .collect();
    report.nodes_after = result.len();

    // The native harness writes model.toml, the PyTorch harness repro.py.
    let extracted = extracted.unwrap_or_else(|| harness.extract(&keep, record, &minimal, cancel));
    match extracted {
        Ok(()) => {
            report.minimal_model = ["model.toml", "repro.py"]
                .iter()
                .map(|f| minimal.join(f))
                .find(|p| p.is_file())
                .map(|p| p.display().to_string());
        }
        // The shrink result stands; the report says why there is no standalone model.
        Err(e) => report.extract_error = Some(e.to_string()),
    }
    if report.minimal_model.is_none() {
        let _ = std::fs::remove_dir_all(&generated);
    }
    if report.minimal_model.is_some() {
        report.data = Some(check_alone_and_reduce(
            harness,
            oracle,
            (&keep, record, &minimal),
            (alone_runs, oracle.places.total() as u32),
            (tried, exact_alone),
            cancel,
        ));
        report.harness_runs += std::mem::take(&mut oracle.runs);
        report.rejected.append(&mut oracle.rejected);
    }
    report.reproduce = Some(harness.reproduce_line(
        report.minimal_model.as_deref().map(Path::new),
        &keep,
        record,
    ));
    Ok(reproduced)
}

/// Runs the minimal subgraph once more through another harness (at the first bad commit's parent) and
/// says whether it passed there.
pub fn check_parent(
    harness: &dyn HarnessClient,
    report: &ShrinkReport,
    policy: &MatchPolicy,
    cancel: &AtomicBool,
) -> ParentCheck {
    let Some(target) = &report.signature else {
        return ParentCheck::NotRun("no signature".into());
    };
    // A fault the shrink saw only under memcheck is looked for there at the parent too.
    let memchecked;
    let harness = match report.memcheck {
        None => harness,
        Some(_) => match harness.memchecked(target.class) {
            Some(h) => {
                memchecked = h;
                &*memchecked
            }
            None => return ParentCheck::NotRun("no compute-sanitizer to run it under".into()),
        },
    };
    let record = Path::new(&report.out_dir).join("record");
    let keep: Vec<String> = report.kept.iter().map(|n| n.id.clone()).collect();
    let request = RunRequest {
        keep: Some(&keep),
        recording: Some(&record),
        record: None,
    };
    match harness.run(&request, cancel) {
        Err(e) => ParentCheck::NotRun(e.to_string()),
        Ok(run) => {
            let sig = judged(harness, &run);
            if policy.matches(target, &sig, &run.output) {
                ParentCheck::Reproduced
            } else if sig.class == FaultClass::None {
                ParentCheck::Passed
            } else {
                ParentCheck::FailedDifferently(failed_how(&sig))
            }
        }
    }
}

/// What a parent check that failed differently says: the signature, and for a failure that is no fault
/// (a parent without the code: `ModuleNotFoundError`) the line that says what it was.
fn failed_how(sig: &Signature) -> String {
    let what = sig.summary.trim();
    if sig.class == FaultClass::Other && !what.is_empty() {
        format!("{}: {what}", sig.short())
    } else {
        sig.short()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(kernel: Option<&str>, launch: Option<&str>) -> Signature {
        let mut s = Signature::new(FaultClass::InvalidAddressSpace, "x");
        s.kernel = kernel.map(String::from);
        s.launch = launch.map(String::from);
        s.exception = Some("RuntimeError".into());
        s
    }

    #[test]
    fn a_parent_that_fails_without_a_fault_says_what_it_was() {
        let mut s = Signature::new(
            FaultClass::Other,
            "ModuleNotFoundError: No module named 'lib.ops.fused'",
        );
        s.site = Some("train.py:5".into());
        assert_eq!(
            failed_how(&s),
            "other at train.py:5: ModuleNotFoundError: No module named 'lib.ops.fused'"
        );
        let mut fault = sig(Some("_other_kernel"), None);
        fault.summary = "RuntimeError: CUDA error: misaligned address".into();
        assert_eq!(failed_how(&fault), fault.short());
    }

    #[test]
    fn a_node_label_is_not_another_kernel_but_a_launched_kernel_is() {
        let p = MatchPolicy::ClassAndKernel;
        let target = sig(
            Some("_hash_embed_kernel"),
            Some("tinyllm/kernels.py:hash_embed"),
        );
        // The node named only itself (no launch line): its label is set aside, and so is a launch site
        // in the harness's own file.
        let labelled = "@@cudabisect node=hash_embed_default op=hash_embed kernel=hash_embed.default begin\nRuntimeError\n";
        let harness = sig(
            Some("hash_embed.default"),
            Some("/run/torch_harness/cudabisect_torch/run.py:call"),
        );
        assert!(same_bug_across_stages(&p, &target, &harness, labelled));
        // The node launched the target's kernel: the same bug, by name.
        let launched = "@@cudabisect node=n op=o kernel=o begin\n@@cudabisect launch kernel=_hash_embed_kernel\nRuntimeError\n";
        let mut named = harness.clone();
        named.kernel = Some("_hash_embed_kernel".into());
        assert!(same_bug_across_stages(&p, &target, &named, launched));
        // It launched another kernel: another bug, whatever the rest says.
        let other = "@@cudabisect node=n op=o kernel=o begin\n@@cudabisect launch kernel=_bias_gelu\nRuntimeError\n";
        let mut wrong = harness.clone();
        wrong.kernel = Some("_bias_gelu".into());
        assert!(!same_bug_across_stages(&p, &target, &wrong, other));
        // Another class or another user launch site is another bug even behind a label.
        let mut class = harness.clone();
        class.class = FaultClass::IllegalAddress;
        assert!(!same_bug_across_stages(&p, &target, &class, labelled));
        let elsewhere = sig(Some("hash_embed.default"), Some("tinyllm/other.py:f"));
        assert!(!same_bug_across_stages(&p, &target, &elsewhere, labelled));
    }
}
