//! The stages at the first bad commit, after the search: build it, triage under compute-sanitizer, shrink
//! the model, and run the minimal subgraph at the parent. Each stage's failure is recorded, never fatal.
//! With a second worker at hand (its own worktree, and room on the GPU), triage and the shrink run at
//! the same time, each in its own worktree; neither reads the other's result, so the report is the same
//! either way. After a parallel search they start at its answer while the cross-check of that
//! answer runs ([`cross_check_beside_stages`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::classify::FaultClass;
use crate::classify::Signature;
use crate::config::Config;
use crate::config::ShrinkSection;
use crate::report::event::{Event, Reporter, SendingReporter};
use crate::report::record::{Report, ShrinkReport, ShrinkStatus, TriageResult, TriageStatus};

use crate::report::environment::Environment;
use crate::run::cancel::with_cancel_passed_on;
use crate::run::probe::prober::WorktreeProber;
use crate::run::probe::sanitizer::Backtraces;
use crate::run::search::{SearchEnd, SearchOutcome};
use crate::run::stages::shrink::{shrink_then_check_parent, ShrinkStage};

/// Which stages to run.
#[derive(Clone, Copy, Debug)]
pub struct StageChoice {
    /// Run compute-sanitizer triage.
    pub triage: bool,
    /// Shrink the model.
    pub shrink: bool,
}

/// Where the stages run.
pub struct StageContext<'a> {
    /// The config.
    pub config: &'a Config,
    /// Builds commits in the probe worktree.
    pub prober: &'a WorktreeProber<'a>,
    /// A second worker, in its own worktree, where the shrink runs while triage runs in the first; `None`:
    /// one stage after the other.
    pub beside: Option<&'a WorktreeProber<'a>>,
    /// A third worker, in its own worktree, where the minimal subgraph runs at the parent beside the
    /// shrink's final check; `None`: after the shrink, in the shrink's worktree.
    pub spare: Option<&'a WorktreeProber<'a>>,
    /// The run's directory (logs, recordings, the harness).
    pub run_dir: &'a Path,
    /// Set on Ctrl-C.
    pub cancel: &'a AtomicBool,
    /// Probes the search ran at once on one GPU (measured; 1 when they ran one at a time).
    pub at_once: u32,
    /// The call stacks triage's sanitizer runs record, for the fault the search saw.
    pub backtraces: Backtraces,
}

/// Runs the chosen stages at `oid`, filling `report`. Returns true when Ctrl-C stopped one of them.
pub fn run_stages(
    ctx: &StageContext,
    choice: StageChoice,
    oid: Oid,
    report: &mut Report,
    reporter: &mut dyn Reporter,
) -> bool {
    let StageContext {
        config,
        prober,
        beside,
        cancel,
        ..
    } = *ctx;
    let triage = config.triage.enabled && choice.triage;
    let section = config.shrink_section().filter(|_| choice.shrink);
    if !triage && section.is_none() {
        return false;
    }
    if let Err(e) = prober.prepare(oid, "first-bad") {
        reporter.event(&Event::Warning {
            message: format!("cannot prepare the first bad commit for triage and shrink: {e}"),
        });
        return cancel.load(Ordering::SeqCst);
    }
    let beside = beside
        .filter(|_| triage && section.is_some())
        .filter(|b| b.prepare(oid, "first-bad").is_ok());
    let stopped = match (section, beside) {
        (Some(section), Some(beside)) => {
            side_by_side(ctx, (prober, beside), &section, oid, report, reporter)
        }
        (section, _) => one_after_the_other(ctx, triage, section.as_ref(), oid, report, reporter),
    };
    stopped || cancel.load(Ordering::SeqCst)
}

/// The environment, asked while the stages ran (it does not depend on them), and whether PyTorch's
/// report was asked with it.
pub(crate) type Asked = (Environment, bool);

/// Whether PyTorch's report is asked beside the stages: the fault speaks of torch, or of Triton (which runs
/// under it); else it is added after the stages when only the shrink speaks of torch.
fn torch_before_the_stages(target: Option<&crate::classify::Signature>) -> bool {
    speaks_torch(target) || target.is_some_and(|t| t.framework.as_deref() == Some("triton"))
}

pub(crate) fn speaks_torch(v: Option<&impl serde::Serialize>) -> bool {
    v.and_then(|v| serde_json::to_string(v).ok())
        .is_some_and(|t| t.contains("torch"))
}

/// The chosen stages at `oid` ([`run_stages`]), with the bundle's environment asked beside them when
/// `bundle` (it does not depend on them; PyTorch's report too when the fault already speaks of torch, or
/// of Triton, which runs under it): whether Ctrl-C stopped one, and the environment.
pub fn stages_beside_environment(
    ctx: &StageContext,
    (choice, oid, bundle): (StageChoice, Oid, bool),
    report: &mut Report,
    reporter: &mut dyn Reporter,
) -> (bool, Option<Asked>) {
    let cancel = ctx.cancel;
    let torch = torch_before_the_stages(report.target.as_ref());
    // Asked where the probes ran: through their executor (a scheduler's node), not necessarily here.
    let at = ctx.prober.executor.clone();
    std::thread::scope(|s| {
        let asked = bundle.then(|| {
            s.spawn(move || {
                let env = crate::host::environment::gather(at.as_ref(), cancel, torch, &mut |_| {});
                (env, torch)
            })
        });
        if asked.is_some() {
            reporter.event(&Event::EnvironmentProbe {
                tool: "nvidia-smi, the CUDA driver, nvcc, compute-sanitizer and python (beside the stages)"
                    .into(),
            });
        }
        let stopped = run_stages(ctx, choice, oid, report, reporter);
        (stopped, asked.and_then(|h| h.join().ok()))
    })
}

/// Triage in `prober`'s worktree and the shrink in `beside`'s, at once, their events rendered here as
/// they come: whether either was interrupted.
fn side_by_side(
    ctx: &StageContext,
    (prober, beside): (&WorktreeProber, &WorktreeProber),
    section: &ShrinkSection,
    oid: Oid,
    report: &mut Report,
    reporter: &mut dyn Reporter,
) -> bool {
    let (triaged, shrunk) = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<Event>();
        let to_triage = tx.clone();
        let triaged =
            s.spawn(move || triage_stage(ctx, prober, oid, &mut SendingReporter(to_triage)));
        let target = report.target.clone();
        let parent = first_parent(report);
        // Triage's sanitizer run holds one of the GPU's places.
        let shrink_ctx = StageContext {
            at_once: ctx.at_once.saturating_sub(1).max(1),
            ..*ctx
        };
        let shrunk = s.spawn(move || {
            shrink_stage(
                &shrink_ctx,
                beside,
                section,
                oid,
                target,
                parent,
                &mut SendingReporter(tx),
            )
        });
        for event in rx {
            reporter.event(&event);
        }
        (triaged.join(), shrunk.join())
    });
    let mut stopped = false;
    if let Ok(t) = triaged {
        stopped |= t.status == TriageStatus::Interrupted;
        report.triage = Some(t);
    }
    if let Ok(r) = shrunk {
        stopped |= r.status == ShrinkStatus::Interrupted;
        report.shrink = Some(r);
    }
    stopped
}

/// Triage (when asked), then the shrink (when a section is in force), in the prober's worktree: whether
/// one was interrupted or Ctrl-C came.
fn one_after_the_other(
    ctx: &StageContext,
    triage: bool,
    section: Option<&ShrinkSection>,
    oid: Oid,
    report: &mut Report,
    reporter: &mut dyn Reporter,
) -> bool {
    let (prober, cancel) = (ctx.prober, ctx.cancel);
    if triage && !cancel.load(Ordering::SeqCst) {
        let result = triage_stage(ctx, prober, oid, reporter);
        let stopped = result.status == TriageStatus::Interrupted;
        report.triage = Some(result);
        if stopped {
            return true;
        }
    }
    let Some(section) = section else {
        return cancel.load(Ordering::SeqCst);
    };
    if cancel.load(Ordering::SeqCst) {
        return true;
    }
    let (target, parent) = (report.target.clone(), first_parent(report));
    let result = shrink_stage(ctx, prober, section, oid, target, parent, reporter);
    let stopped = result.status == ShrinkStatus::Interrupted;
    report.shrink = Some(result);
    stopped
}

/// Passes events on to the thread that renders them.
/// The first bad commit's first parent, when the report names one.
fn first_parent(report: &Report) -> Option<Oid> {
    report
        .good_parents
        .first()
        .and_then(|p| Oid::from_str(&p.commit).ok())
}

/// compute-sanitizer at `oid`, built in `prober`'s worktree.
fn triage_stage(
    ctx: &StageContext,
    prober: &WorktreeProber,
    oid: Oid,
    reporter: &mut dyn Reporter,
) -> TriageResult {
    reporter.event(&Event::StageBegan {
        stage: crate::report::event::Stage::Triage,
    });
    crate::run::probe::sanitizer::at_commit(
        prober.executor.session().as_mut(),
        (ctx.config, ctx.backtraces),
        prober.worktree,
        oid,
        ctx.run_dir,
        ctx.cancel,
        reporter,
    )
}

/// The shrink at `oid`, built in `prober`'s worktree, and its minimal subgraph run at `parent`.
fn shrink_stage(
    ctx: &StageContext,
    prober: &WorktreeProber,
    section: &ShrinkSection,
    oid: Oid,
    target: Option<Signature>,
    parent: Option<Oid>,
    reporter: &mut dyn Reporter,
) -> ShrinkReport {
    let (config, run_dir, cancel) = (ctx.config, ctx.run_dir, ctx.cancel);
    let commit = oid.to_string();
    // A fault one rank met on its own (not a collective's) shrinks on that rank's work alone.
    let fault_rank = target
        .as_ref()
        .filter(|t| !matches!(t.class, FaultClass::Nccl | FaultClass::Hang))
        .and_then(|t| t.rank);
    let stage = ShrinkStage {
        config,
        section,
        executor: prober.executor.clone(),
        cwd: prober.worktree.path(),
        commit: &commit,
        run_dir,
        fault_rank,
        target,
        slot: prober.slot.as_ref(),
        warm: prober.repro_warm(),
        at_once: ctx.at_once,
        parent_beside: ctx.spare.zip(parent),
    };
    let at_parent = parent
        .map(|p| (prober, p))
        .ok_or_else(|| "the first bad commit has no parent in the range".to_string());
    shrink_then_check_parent(&stage, at_parent, reporter, cancel)
}

/// The stages to start at a parallel search's answer while the cross-check of that answer runs.
pub struct Early<'a> {
    /// The config.
    pub config: &'a Config,
    /// Which stages.
    pub choice: StageChoice,
    /// The run's directory.
    pub run_dir: &'a Path,
    /// The workers the cross-check leaves free: triage's, the shrink's, the parent check's.
    pub workers: &'a [WorktreeProber<'a>],
    /// Runs the GPU holds at once beside the cross-check's.
    pub at_once: u32,
    /// Whether the bundle's environment is asked beside them.
    pub bundle: bool,
}

/// What the stages started early gave, at the commit they ran at.
pub struct Staged {
    /// The commit.
    pub commit: Oid,
    /// Triage's result.
    pub triage: Option<TriageResult>,
    /// The shrink's report.
    pub shrink: Option<ShrinkReport>,
    /// Whether Ctrl-C stopped one of them.
    pub interrupted: bool,
    /// The environment, asked beside them.
    pub asked: Option<Asked>,
}

/// Runs `cross_check` (handed the reporter and what to call when it disagrees) while the stages run at the
/// answer it checks (`report`: the search's report of that answer, which the stages read their target
/// and parent from). Their events are held until the cross-check agrees, then passed on in order; a
/// cross-check that disagrees or ends otherwise stops them and drops their events and results, so what the
/// run reports is what it would have been had they started after it. `stopped` is Ctrl-C.
pub fn cross_check_beside_stages(
    early: Early,
    (culprit, mut report): (Oid, Report),
    cross_check: impl FnOnce(&mut dyn Reporter, &dyn Fn()) -> SearchOutcome,
    reporter: &mut dyn Reporter,
    stopped: &AtomicBool,
) -> (SearchOutcome, Option<Staged>) {
    let stop = AtomicBool::new(false);
    let [triage_at, shrink_at, parent_at, ..] = early.workers else {
        return (cross_check(reporter, &|| {}), None);
    };
    with_cancel_passed_on(stopped, std::slice::from_ref(&stop), || {
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel::<Event>();
            let stop = &stop;
            let staged = s.spawn(move || {
                let ctx = StageContext {
                    config: early.config,
                    prober: triage_at,
                    beside: Some(shrink_at),
                    spare: Some(parent_at),
                    run_dir: early.run_dir,
                    cancel: stop,
                    at_once: early.at_once,
                    backtraces: Backtraces::for_fault(report.target.as_ref()),
                };
                let mut events = SendingReporter(tx);
                let (interrupted, asked) = stages_beside_environment(
                    &ctx,
                    (early.choice, culprit, early.bundle),
                    &mut report,
                    &mut events,
                );
                Staged {
                    commit: culprit,
                    triage: report.triage.take(),
                    shrink: report.shrink.take(),
                    interrupted,
                    asked,
                }
            });
            let checked = cross_check(reporter, &|| stop.store(true, Ordering::SeqCst));
            let agreed = matches!(checked.end, SearchEnd::Found(c) if c == culprit)
                && !stop.load(Ordering::SeqCst);
            if !agreed {
                stop.store(true, Ordering::SeqCst);
            }
            for event in rx {
                if agreed {
                    reporter.event(&event);
                }
            }
            let staged = staged.join().ok().filter(|_| agreed);
            (checked, staged)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::FaultClass;

    #[test]
    fn pytorchs_report_is_asked_beside_the_stages_for_a_torch_or_triton_fault_only() {
        let mut sig = Signature::new(
            FaultClass::IllegalAddress,
            "Triton Error [CUDA]: an illegal memory access",
        );
        assert!(
            !torch_before_the_stages(Some(&sig)),
            "nothing names torch or Triton"
        );
        sig.framework = Some("triton".into());
        assert!(torch_before_the_stages(Some(&sig)));
        sig.framework = Some("jax".into());
        assert!(!torch_before_the_stages(Some(&sig)));
        sig.exception = Some("torch.AcceleratorError".into());
        assert!(torch_before_the_stages(Some(&sig)));
        assert!(!torch_before_the_stages(None));
    }
}
