//! The step at the first bad commit: triage and the shrink (or what they gave when they started beside the
//! cross-check), then the bundle.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::report::event::{Event, Reporter};
use crate::report::record::Report;

use crate::run::outputs::{bundle_root, write_bundle};
use crate::run::plan::{Plan, StartOptions};
use crate::run::probe::prober::WorktreeProber;
use crate::run::probe::sanitizer::Backtraces;
use crate::run::stages::pipeline::{stages_beside_environment, StageChoice, StageContext, Staged};

/// Which stages the options ask for.
pub(super) fn stage_choice(opts: &StartOptions) -> StageChoice {
    StageChoice {
        triage: !opts.no_triage,
        shrink: !opts.no_shrink,
    }
}

/// Triage and the shrink at the first bad commit (`at`: it, the probes the GPU held at once, and what the
/// stages started beside the cross-check gave there, if they did), then the bundle, with the environment
/// asked beside the stages so the bundle does not wait for it after: in `prober`'s worktree, the shrink
/// in the second worker's when the GPU held two probes at once, and its check at the parent in the
/// third's, beside its final check, when it held three.
pub(super) fn at_the_first_bad(
    (plan, opts): (&Plan, &StartOptions),
    (prober, others): (&WorktreeProber, &[WorktreeProber]),
    (oid, at_once, staged): (Oid, usize, Option<Staged>),
    (run_dir, cancel): (&Path, &AtomicBool),
    report: &mut Report,
    reporter: &mut dyn Reporter,
) {
    let (choice, bundle) = (stage_choice(opts), plan.config.bundle.enabled);
    let ctx = StageContext {
        config: &plan.config,
        prober,
        beside: others.first().filter(|_| at_once >= 2),
        spare: others.get(1).filter(|_| at_once >= 3),
        run_dir,
        cancel,
        at_once: u32::try_from(at_once).unwrap_or(1),
        backtraces: Backtraces::for_fault(report.target.as_ref()),
    };
    let (stopped, asked) = match staged {
        // Started at the answer while the cross-check ran (their events are passed on already).
        Some(staged) => {
            report.triage = staged.triage;
            report.shrink = staged.shrink;
            (staged.interrupted, staged.asked)
        }
        None => stages_beside_environment(&ctx, (choice, oid, bundle), report, reporter),
    };
    report.interrupted |= stopped;
    if !bundle || cancel.load(Ordering::SeqCst) {
        return;
    }
    let root = bundle_root(&plan.repo, &plan.config, opts.bundle_dir.as_deref());
    match write_bundle(
        plan,
        report,
        (run_dir, root),
        (asked, prober.executor.as_ref()),
        reporter,
        cancel,
    ) {
        Ok(dir) => {
            // What a maintainer is handed, and its size (attachable or not).
            reporter.event(&Event::BundleWritten {
                bytes: crate::report::bundle::dir_bytes(&dir),
                path: dir.display().to_string(),
            });
            report.bundle = Some(dir.display().to_string());
        }
        Err(e) => reporter.event(&Event::Warning {
            message: e.to_string(),
        }),
    }
}
