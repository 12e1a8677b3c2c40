//! The shrink stage at one commit, written once for `start`, `nightly` and `shrink`: tries the ways to a
//! minimal repro in order (the factories bisect.toml names, then a capture of the repro command), keeps
//! the first that gives a standalone repro, and says which did and why the ones before did not. With no
//! way at all (a native program and no model to shrink) it says so, once, in words.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use git2::Oid;

use crate::classify::{FaultClass, Signature};
use crate::config::{Config, Harness, ShrinkFramework, ShrinkSection};
use crate::exec::child_env::WorkerSlot;
use crate::exec::executor::Executor;
use crate::protocol::client::ProcessHarness;
use crate::report::event::{Event, Reporter, Stage};
use crate::report::record::{ParentCheck, ShrinkPathTried, ShrinkReport, ShrinkStatus};

use crate::run::probe::prober::WorktreeProber;
use crate::run::probe::warm::WarmAt;
use crate::run::stages::reducer::{
    check_parent, not_started, shrink, ParentBeside, ShrinkSettings,
};

/// Where the shrink runs and what it keeps.
pub struct ShrinkStage<'a> {
    /// The config.
    pub config: &'a Config,
    /// The shrink section in force (written, or [`ShrinkSection::implicit`]).
    pub section: &'a ShrinkSection,
    /// Runs the capture and the harness.
    pub executor: Arc<dyn Executor>,
    /// The checkout the commit is built in.
    pub cwd: &'a Path,
    /// The commit (empty: the checkout as it is).
    pub commit: &'a str,
    /// The run's directory.
    pub run_dir: &'a Path,
    /// Of several ranks, the one that faulted on its own.
    pub fault_rank: Option<u32>,
    /// The fault to keep (the bisection's), when known.
    pub target: Option<Signature>,
    /// The search's worker whose worktree `cwd` is (its device and caches), when the job had workers.
    pub slot: Option<&'a WorkerSlot>,
    /// That worker's warm interpreter, which the capture's runs are forked from (they pay no imports);
    /// `None`: fresh processes.
    pub warm: Option<WarmAt<'a>>,
    /// Harness runs the GPU holds at once beside whatever else the stage shares it with (the search's
    /// measured probes at once, less one while triage runs beside); 1 when unknown.
    pub at_once: u32,
    /// A worker of its own and the parent commit, where the minimal subgraph is run at the parent beside
    /// the final check; `None`: after the shrink, in the shrink's own worktree.
    pub parent_beside: Option<(&'a WorktreeProber<'a>, Oid)>,
}

/// One way to the model the shrink runs on.
#[derive(Clone, Debug)]
pub enum ShrinkWay {
    /// The factories, model file or harness bisect.toml names (with the section they run under).
    Factories(ShrinkSection),
    /// A capture of the repro command's faulting step, saved in `dir` once it ran.
    Capture(ShrinkSection, Option<PathBuf>),
}

impl ShrinkWay {
    fn name(&self) -> &'static str {
        match self {
            ShrinkWay::Factories(s) if s.trains() => "factories (the training step)",
            ShrinkWay::Factories(_) => "factories",
            ShrinkWay::Capture(..) => "capture of the repro command",
        }
    }

    fn section(&self) -> &ShrinkSection {
        match self {
            ShrinkWay::Factories(s) | ShrinkWay::Capture(s, _) => s,
        }
    }

    fn capture_dir(&self) -> Option<&Path> {
        match self {
            ShrinkWay::Capture(_, dir) => dir.as_deref(),
            ShrinkWay::Factories(_) => None,
        }
    }
}

/// The phase of a training step a fault was met in, read from the failing run's own frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPhase {
    /// The forward pass (or no training at all).
    Forward,
    /// The backward pass.
    Backward,
    /// The optimizer's update.
    Optimizer,
}

/// Which phase the fault was met in: the innermost frame of the user's own code that calls the backward
/// pass or the optimizer's update names it; a traceback without either is the forward pass.
pub fn fault_phase(target: &Signature) -> Option<FaultPhase> {
    if target.stack.is_empty() {
        return None;
    }
    let calls = |line: &str, words: &[&str]| words.iter().any(|w| line.contains(w));
    for frame in target.stack.iter().rev() {
        let code = frame.split_once(": ").map_or(frame.as_str(), |(_, c)| c);
        if calls(
            code,
            &[".backward(", "autograd.backward(", "autograd.grad("],
        ) {
            return Some(FaultPhase::Backward);
        }
        if calls(
            code,
            &[
                "opt.step(",
                "optimizer.step(",
                "optim.step(",
                "scaler.step(",
            ],
        ) {
            return Some(FaultPhase::Optimizer);
        }
    }
    Some(FaultPhase::Forward)
}

/// Why the repro cannot be captured, or `None` when it can: a capture needs a Python program whose
/// failure came out of Python (a traceback, a framework's error).
pub fn capture_refusal(target: Option<&Signature>) -> Option<String> {
    let target = target?;
    let python = target.exception.is_some()
        || !target.stack.is_empty()
        || target.framework.as_deref().is_some_and(|f| {
            matches!(
                f,
                "pytorch" | "triton" | "jax" | "xla" | "keras" | "tensorflow"
            )
        });
    if python || matches!(target.class, FaultClass::None) {
        return None;
    }
    Some(format!(
        "the repro is not a Python program that failed in PyTorch, JAX or Keras code (its failure: {}), and \
         bisect.toml names no model to shrink: name one in [shrink] (docs/guide/shrink.md) to get a minimal repro",
        target.short()
    ))
}

/// The ways to try, in order: the factories (with the training step when the fault was met in the
/// backward or the update and `train` is left out), then the capture of the repro command.
pub fn ways(section: &ShrinkSection, target: Option<&Signature>) -> Result<Vec<ShrinkWay>, String> {
    let mut out = Vec::new();
    if section.has_factories() {
        let mut factories = section.clone();
        let training = target
            .and_then(fault_phase)
            .is_some_and(|p| p != FaultPhase::Forward);
        if factories.framework == ShrinkFramework::Torch && factories.train_left_out() && training {
            factories.train = Some(true);
        }
        out.push(ShrinkWay::Factories(factories));
    }
    // A capture feeds the PyTorch harness: after its factories (a `step` beside them), or alone.
    let capturable = matches!(
        section.named_harness(),
        Harness::Torch { .. } | Harness::Capture
    );
    // Asked for in bisect.toml (`capture = true`, or a `step`), a capture is tried whatever the failure
    // looked like; otherwise (no section, or one that only tunes the shrink) only for a Python program.
    let asked = (section.capture || section.step.is_some()) && !section.implicit;
    if capturable && (asked || capture_refusal(target).is_none()) {
        let mut capture = section.clone();
        capture.model = None;
        capture.inputs = None;
        capture.capture = true;
        out.push(ShrinkWay::Capture(capture, None));
    }
    if out.is_empty() {
        return Err(capture_refusal(target).unwrap_or_else(|| {
            "bisect.toml names no model the shipped harnesses can shrink".into()
        }));
    }
    Ok(out)
}

/// The result of the stage: the report, and the way that gave it (for the check at the parent).
pub struct Shrunk {
    /// The report of the way kept.
    pub report: ShrinkReport,
    /// That way.
    pub way: Option<ShrinkWay>,
}

/// Whether a shrink ended with a standalone minimal repro.
fn gave_repro(report: &ShrinkReport) -> bool {
    report.status == ShrinkStatus::Minimal
        && report.minimal_model.is_some()
        && !report.data.as_ref().is_some_and(|d| d.missed_alone())
}

/// Runs the ways in order until one gives a minimal repro; each writes under its own directory.
pub fn run_shrink_stage(
    stage: &ShrinkStage,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Shrunk {
    let ways = match ways(stage.section, stage.target.as_ref()) {
        Ok(ways) => ways,
        Err(why) => {
            return Shrunk {
                report: not_started(
                    &stage.run_dir.join("shrink"),
                    ShrinkStatus::NotApplicable,
                    why,
                ),
                way: None,
            }
        }
    };
    let started = std::time::Instant::now();
    let mut tried: Vec<ShrinkPathTried> = Vec::new();
    let mut best: Option<(ShrinkReport, ShrinkWay)> = None;
    for (i, way) in ways.into_iter().enumerate() {
        if cancel.load(Ordering::SeqCst) {
            break;
        }
        let out_dir = if i == 0 {
            stage.run_dir.join("shrink")
        } else {
            stage.run_dir.join(format!("shrink-{}", i + 1))
        };
        let (report, way) = run_way(stage, way, &out_dir, reporter, cancel);
        let done = gave_repro(&report) || report.status == ShrinkStatus::Interrupted;
        tried.push(ShrinkPathTried {
            path: way.name().into(),
            outcome: if gave_repro(&report) {
                "gave the minimal repro".into()
            } else {
                outcome_words(&report)
            },
        });
        let better = match &best {
            None => true,
            Some((b, _)) => rank(&report) > rank(b),
        };
        if better {
            best = Some((report, way));
        }
        if done {
            break;
        }
    }
    let Some((mut report, way)) = best else {
        return Shrunk {
            report: not_started(
                &stage.run_dir.join("shrink"),
                ShrinkStatus::Interrupted,
                "interrupted".into(),
            ),
            way: None,
        };
    };
    report.path = Some(way.name().into());
    report.paths = tried;
    report.relativize(stage.cwd);
    // What the user waited: every way tried, the capture runs included.
    report.duration_s = started.elapsed().as_secs_f64();
    Shrunk {
        report,
        way: Some(way),
    }
}

/// How far a shrink got: a repro, a minimal subgraph without one, a failure, nothing.
fn rank(report: &ShrinkReport) -> u8 {
    match report.status {
        _ if gave_repro(report) => 3,
        ShrinkStatus::Minimal => 2,
        ShrinkStatus::Interrupted => 4,
        _ => 1,
    }
}

fn outcome_words(report: &ShrinkReport) -> String {
    let missed = report
        .data
        .as_ref()
        .and_then(|d| d.alone.as_ref())
        .filter(|a| a.reproduced == 0);
    match (&report.status, &report.extract_error) {
        (ShrinkStatus::Minimal, Some(e)) => {
            format!("found the minimal subgraph, but wrote no standalone repro: {e}")
        }
        (ShrinkStatus::Minimal, None) if missed.is_some() => format!(
            "wrote repro.py, but run alone in a fresh process it did not fault ({})",
            missed
                .and_then(|a| a.missed.as_deref())
                .unwrap_or("no output")
        ),
        (ShrinkStatus::Interrupted, _) => "interrupted".into(),
        _ => report.summary.clone(),
    }
}

/// One way: the capture when it is one, the harness, the shrink.
fn run_way(
    stage: &ShrinkStage,
    way: ShrinkWay,
    out_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> (ShrinkReport, ShrinkWay) {
    let ShrinkWay::Capture(section, _) = way else {
        return shrink_with(stage, way, out_dir, reporter, cancel);
    };
    reporter.event(&Event::StageBegan {
        stage: Stage::ShrinkCapture,
    });
    match crate::run::stages::capture::capture(
        stage.executor.as_ref(),
        stage.config,
        &section,
        (stage.cwd, stage.commit, stage.slot, stage.warm),
        stage.run_dir,
        stage.fault_rank,
        cancel,
    ) {
        Ok((dir, fault)) => {
            // A jitted JAX call runs through the JAX harness on the module the capture wrote.
            let way = if fault.framework.as_deref() == Some("jax") {
                ShrinkWay::Capture(
                    crate::run::stages::capture::jax_section(
                        &section,
                        &dir,
                        &stage.config.repro.env,
                    ),
                    None,
                )
            } else {
                ShrinkWay::Capture(section, Some(dir))
            };
            let (mut report, way) = shrink_with(stage, way, out_dir, reporter, cancel);
            report.captured = Some(fault);
            crate::run::stages::capture::explain(&mut report);
            (report, way)
        }
        Err(e) => {
            let status = if cancel.load(Ordering::SeqCst) {
                ShrinkStatus::Interrupted
            } else {
                ShrinkStatus::Failed
            };
            (
                not_started(out_dir, status, e.to_string()),
                ShrinkWay::Capture(section, None),
            )
        }
    }
}

fn shrink_with(
    stage: &ShrinkStage,
    way: ShrinkWay,
    out_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> (ShrinkReport, ShrinkWay) {
    let section = way.section();
    let harness = match harness_for(stage, &way, stage.cwd, stage.commit) {
        Ok(h) => h,
        Err(e) => {
            let report = not_started(out_dir, ShrinkStatus::Failed, format!("shrink: {e}"));
            return (report, way);
        }
    };
    let at_parent = |snapshot: &ShrinkReport| match stage.parent_beside {
        None => ParentCheck::NotRun("no worker for the parent".into()),
        Some(at) => parent_check_at(stage, &way, at, snapshot, cancel),
    };
    let settings = ShrinkSettings {
        policy: &stage.config.match_policy,
        out_dir: out_dir.to_path_buf(),
        target: stage.target.clone(),
        attempts: section.attempts,
        confirm: section.confirm,
        confirm_jobs: confirm_at_once(section, stage.at_once),
        parent_beside: stage
            .parent_beside
            .filter(|_| section.check_parent)
            .map(|_| ParentBeside(&at_parent)),
    };
    let report = shrink(&harness, &settings, reporter, cancel);
    (report, way)
}

/// The final check's places at once: as written, else as many as the GPU holds (measured in the search);
/// never more than the confirmations and the writer of repro.py beside them, never none.
fn confirm_at_once(section: &ShrinkSection, at_once: u32) -> u32 {
    section
        .confirm_jobs
        .unwrap_or(at_once)
        .clamp(1, section.confirm.max(1) + 1)
}

/// The harness of `way` on the commit built in `cwd`, run through the stage's executor.
fn harness_for(
    stage: &ShrinkStage,
    way: &ShrinkWay,
    cwd: &Path,
    commit: &str,
) -> Result<ProcessHarness, crate::protocol::client::ProtocolError> {
    ProcessHarness::from_config(
        stage.config,
        way.section(),
        cwd,
        commit,
        stage.run_dir,
        stage.fault_rank,
        way.capture_dir(),
    )
    .map(|h| h.on(stage.executor.clone()))
}

/// The shrink stage, then (when it found a minimal subgraph, the section asks for it, no Ctrl-C came and
/// the stage's own worker did not run it beside the final check) that subgraph at the parent: `at_parent`
/// is the worker that builds the parent in its worktree and the parent, or why there is none to check.
/// The one shrink of `start` and of `cudabisect shrink --at`.
pub fn shrink_then_check_parent(
    stage: &ShrinkStage,
    at_parent: Result<(&WorktreeProber, Oid), String>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> ShrinkReport {
    let Shrunk { mut report, way } = run_shrink_stage(stage, reporter, cancel);
    let Some(way) = way.filter(|_| {
        report.status == ShrinkStatus::Minimal
            && stage.section.check_parent
            && report.parent_check.is_none()
            && !cancel.load(Ordering::SeqCst)
    }) else {
        return report;
    };
    report.parent_check = Some(match at_parent {
        Err(why) => ParentCheck::NotRun(why),
        Ok(at) => parent_check_at(stage, &way, at, &report, cancel),
    });
    report
}

/// The parent built in `prober`'s worktree, then the minimal subgraph of `report` run there.
fn parent_check_at(
    stage: &ShrinkStage,
    way: &ShrinkWay,
    (prober, parent): (&WorktreeProber, Oid),
    report: &ShrinkReport,
    cancel: &AtomicBool,
) -> ParentCheck {
    match prober.prepare(parent, "parent") {
        Err(e) => ParentCheck::NotRun(e.to_string()),
        Ok(()) => parent_check(
            stage,
            way,
            prober.worktree.path(),
            &parent.to_string(),
            report,
            cancel,
        ),
    }
}

/// The minimal subgraph once more at `parent_cwd` (the parent commit, built there), through the way
/// that found it.
pub fn parent_check(
    stage: &ShrinkStage,
    way: &ShrinkWay,
    parent_cwd: &Path,
    parent: &str,
    report: &ShrinkReport,
    cancel: &AtomicBool,
) -> ParentCheck {
    match harness_for(stage, way, parent_cwd, parent) {
        Ok(h) => match check_parent(&h, report, &stage.config.match_policy, cancel) {
            // The captured values are the first bad commit's, not the parent's.
            ParentCheck::Reproduced if matches!(way, ShrinkWay::Capture(..)) => {
                ParentCheck::ReproducedOnCapturedValues
            }
            other => other,
        },
        Err(e) => ParentCheck::NotRun(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python_fault(stack: &[&str]) -> Signature {
        let mut s = Signature::new(FaultClass::IllegalAddress, "x");
        s.exception = Some("RuntimeError".into());
        s.framework = Some("pytorch".into());
        s.stack = stack.iter().map(|f| f.to_string()).collect();
        s
    }

    #[test]
    fn the_final_check_runs_as_many_at_once_as_the_search_did_unless_written() {
        let mut section = ShrinkSection::implicit();
        section.confirm = 5;
        assert_eq!(
            confirm_at_once(&section, 8),
            6,
            "never more than the runs and the writer"
        );
        assert_eq!(confirm_at_once(&section, 3), 3);
        assert_eq!(confirm_at_once(&section, 0), 1, "never none");
        section.confirm_jobs = Some(1);
        assert_eq!(confirm_at_once(&section, 8), 1, "as written");
    }

    #[test]
    fn the_phase_is_read_from_the_innermost_frame_that_calls_backward_or_the_update() {
        let back = python_fault(&[
            "train.py:9 in <module>: main()",
            "train.py:30 in main: loss.backward()",
        ]);
        assert_eq!(fault_phase(&back), Some(FaultPhase::Backward));
        let update = python_fault(&["train.py:31 in main: opt.step()"]);
        assert_eq!(fault_phase(&update), Some(FaultPhase::Optimizer));
        let forward = python_fault(&["train.py:28 in main: out = model(x)"]);
        assert_eq!(fault_phase(&forward), Some(FaultPhase::Forward));
        // A step function of the user's is not the optimizer's update.
        let inside = python_fault(&[
            "train.py:40 in main: loss = train_step(model, batch)",
            "train.py:28 in train_step: out = model(batch)",
        ]);
        assert_eq!(fault_phase(&inside), Some(FaultPhase::Forward));
        assert_eq!(fault_phase(&python_fault(&[])), None);
    }

    #[test]
    fn no_section_captures_a_python_repro_and_refuses_a_native_one_in_words() {
        let implicit = ShrinkSection::implicit();
        let ways = ways(&implicit, Some(&python_fault(&[]))).expect("a capture");
        assert!(matches!(ways.as_slice(), [ShrinkWay::Capture(..)]));
        let mut native = Signature::new(FaultClass::IllegalAddress, "x");
        native.framework = Some("cuda-runtime".into());
        let why = super::ways(&implicit, Some(&native)).expect_err("no way");
        assert!(why.contains("not a Python program"), "{why}");
        // No target (the shrink command in a checkout): the capture finds out by itself.
        assert!(super::ways(&implicit, None).is_ok());
    }

    #[test]
    fn factories_train_for_a_backward_fault_unless_train_is_false_and_fall_back_to_the_capture() {
        let mut section = ShrinkSection::implicit();
        section.capture = false;
        section.model = Some("pkg.model:build".into());
        section.inputs = Some("pkg.model:inputs".into());
        let back = python_fault(&["train.py:30 in main: loss.backward()"]);
        let found = ways(&section, Some(&back)).expect("ways");
        match found.as_slice() {
            [ShrinkWay::Factories(f), ShrinkWay::Capture(c, None)] => {
                assert_eq!(f.train, Some(true));
                assert!(c.model.is_none() && c.capture);
            }
            other => panic!("{other:?}"),
        }
        section.train = Some(false);
        let found = ways(&section, Some(&back)).expect("ways");
        assert!(matches!(&found[0], ShrinkWay::Factories(f) if f.train == Some(false)));
        // A native model file has no capture to fall back to.
        let mut native = ShrinkSection::implicit();
        native.capture = false;
        native.model = Some("model.toml".into());
        let found = ways(&native, Some(&back)).expect("ways");
        assert!(matches!(found.as_slice(), [ShrinkWay::Factories(_)]));
    }
}
