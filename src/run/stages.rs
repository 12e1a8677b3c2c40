//! The stages at the first bad commit, after the search: build it, triage under compute-sanitizer, shrink
//! the model, and run the minimal subgraph at the parent. Each stage's failure is recorded, never fatal.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::classify::FaultClass;
use crate::config::Config;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ParentCheck, Report, ShrinkStatus, TriageStatus};

use super::probe::WorktreeProber;
use super::shrink_stage::{parent_check, run_shrink_stage, ShrinkStage, Shrunk};

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
    /// The run's directory (logs, recordings, the harness).
    pub run_dir: &'a Path,
    /// Set on Ctrl-C.
    pub cancel: &'a AtomicBool,
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
        run_dir,
        cancel,
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
    if triage && !cancel.load(Ordering::SeqCst) {
        reporter.event(&Event::StageBegan {
            stage: crate::report::event::Stage::Triage,
        });
        let result = super::triage::at_commit(
            prober.executor.session().as_mut(),
            config,
            prober.worktree,
            oid,
            run_dir,
            cancel,
            reporter,
        );
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
    let commit = oid.to_string();
    // A fault one rank met on its own (not a collective's) shrinks on that rank's work alone.
    let fault_rank = report
        .target
        .as_ref()
        .filter(|t| !matches!(t.class, FaultClass::Nccl | FaultClass::Hang))
        .and_then(|t| t.rank);
    let stage = ShrinkStage {
        config,
        section: &section,
        executor: prober.executor.clone(),
        cwd: prober.worktree.path(),
        commit: &commit,
        run_dir,
        fault_rank,
        target: report.target.clone(),
    };
    let Shrunk {
        report: mut result,
        way,
    } = run_shrink_stage(&stage, reporter, cancel);
    if let (ShrinkStatus::Minimal, true, false, Some(way)) = (
        result.status,
        section.check_parent,
        cancel.load(Ordering::SeqCst),
        &way,
    ) {
        let parent = report
            .good_parents
            .first()
            .and_then(|p| Oid::from_str(&p.commit).ok());
        result.parent_check = Some(match parent {
            None => ParentCheck::NotRun("the first bad commit has no parent in the range".into()),
            Some(p) => match prober.prepare(p, "parent") {
                Err(e) => ParentCheck::NotRun(e.to_string()),
                Ok(()) => parent_check(
                    &stage,
                    way,
                    prober.worktree.path(),
                    &p.to_string(),
                    &result,
                    cancel,
                ),
            },
        });
    }
    let stopped = result.status == ShrinkStatus::Interrupted;
    report.shrink = Some(result);
    stopped || cancel.load(Ordering::SeqCst)
}
