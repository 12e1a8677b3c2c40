//! `cudabisect shrink` on its own: the shrink stage in the checkout as it is, or at a revision built in the
//! probe worktree under the state lock (then also checked at the revision's parent), with its bundle.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::config::{Config, ShrinkSection};
use crate::git::Repo;
use crate::report::bundle::BundleInput;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ShrinkReport, ShrinkStatus};
use git2::Oid;

use crate::run::error::RunError;
use crate::run::outputs::{bundle_root, write_bundle_reporting};
use crate::run::plan::load;
use crate::run::probe::prober::WorktreeProber;
use crate::run::workspace::{Opening, Workspace};

use crate::run::stages::shrink::{shrink_then_check_parent, ShrinkStage};

/// Runs the shrink and returns its report (also written to the run directory and as a `shrink_done`
/// event); `Err` only for problems before the harness ran.
pub fn shrink_job(
    dir: &Path,
    config: Option<&Path>,
    at: Option<&str>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<ShrinkReport, RunError> {
    let (repo, config) = load(dir, config)?;
    // No [shrink] section: the faulting step is captured from the repro command.
    let section = config.shrink_section().ok_or_else(|| {
        RunError::Usage(format!(
            "{}: [shrink] says enabled = false",
            config.path.display()
        ))
    })?;
    let oid = at.map(|rev| repo.resolve(rev)).transpose()?;
    let lock_name = at.map(|rev| format!("shrink --at {rev}"));
    let ws = Workspace::open(
        &repo,
        &config,
        Opening {
            lock: lock_name.as_deref(),
            prefix: "shrink-",
            log_dir: None,
        },
    )?;
    let run_dir = ws.run_dir.clone();
    let log_dir = ws.log_dir.clone();
    let worktree = match oid {
        Some(_) => Some(ws.worktree("worktree")?),
        None => None,
    };
    let prober = worktree.as_ref().map(|w| ws.prober(w, &config, cancel));
    let result = shrink_in(
        (&repo, &config, &section),
        (&ws, prober.as_ref(), oid),
        &run_dir,
        reporter,
        cancel,
    );
    drop(prober);
    // The bundle asks for the environment where the shrink ran.
    let ran_at = ws.executor.clone();
    ws.close(reporter);
    let report = result?;
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    let out_dir = PathBuf::from(&report.out_dir);
    let _ = std::fs::write(out_dir.join("report.json"), &json);
    reporter.event(&Event::ShrinkDone {
        report: Box::new(report.clone()),
    });
    if report.status == ShrinkStatus::Minimal && config.bundle.enabled {
        bundle_the_shrink(
            (&repo, &config, &section),
            (oid, at.is_some(), ran_at.as_ref()),
            &report,
            &log_dir,
            reporter,
            cancel,
        );
    }
    Ok(report)
}

/// The bundle of a shrink on its own: the shrunk commit (`oid`, else HEAD; `at_rev`: it was given with
/// `--at`), its minimal repro and logs, and the environment where it ran (`ran_at`).
fn bundle_the_shrink(
    (repo, config, section): (&Repo, &Config, &ShrinkSection),
    (oid, at_rev, ran_at): (Option<Oid>, bool, &dyn crate::exec::executor::Executor),
    report: &ShrinkReport,
    log_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) {
    let out_dir = PathBuf::from(&report.out_dir);
    let head = oid.or_else(|| repo.resolve("HEAD").ok());
    let input = BundleInput {
        root: bundle_root(repo, config, None),
        commit: head.and_then(|o| repo.info(o).ok()),
        good_parents: vec![],
        found_by: Some(if at_rev {
            "cudabisect shrink --at".into()
        } else {
            "cudabisect shrink in the checkout".into()
        }),
        target: report.signature.clone(),
        triage: None,
        shrink: Some(report),
        report_json: serde_json::to_value(report).unwrap_or_default(),
        config_text: &config.text,
        log_dirs: vec![
            ("probes", log_dir.to_path_buf()),
            ("shrink", out_dir.join("logs")),
        ],
        extra_files: vec![],
        backend: Some(
            crate::harness::resolve_backend(section.backend)
                .as_str()
                .to_string(),
        ),
        include_binary: config.bundle.include_binary,
        full_repro: Some(crate::report::bundle::FullRepro {
            build: config.build.as_ref(),
            repro: &config.repro,
        }),
    };
    write_bundle_reporting(&input, ran_at, reporter, cancel);
}

/// The shrink in the checkout as it is, or (with `oid`) at that commit in `prober`'s worktree, then at
/// its parent there.
fn shrink_in(
    (repo, config, section): (&Repo, &Config, &ShrinkSection),
    (ws, prober, oid): (&Workspace, Option<&WorktreeProber>, Option<Oid>),
    run_dir: &Path,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<ShrinkReport, RunError> {
    let (cwd, commit) = match (prober, oid) {
        (Some(p), Some(oid)) => {
            p.prepare(oid, "shrink")?;
            (p.worktree.path().to_path_buf(), oid.to_string())
        }
        _ => (repo.workdir(), String::new()),
    };
    let stage = ShrinkStage {
        config,
        section,
        executor: ws.executor.clone(),
        cwd: &cwd,
        commit: &commit,
        run_dir,
        fault_rank: None,
        target: None,
        slot: None,
        warm: prober.and_then(|p| p.repro_warm()),
        at_once: 1,
        parent_beside: None,
    };
    let parent = oid
        .and_then(|o| repo.parents(o).ok())
        .and_then(|p| p.first().copied());
    let at_parent = match (prober, parent) {
        (Some(p), Some(parent)) => Ok((p, parent)),
        (None, _) => Err("no --at revision".to_string()),
        (Some(_), None) => Err("the revision has no parent".to_string()),
    };
    Ok(shrink_then_check_parent(
        &stage, at_parent, reporter, cancel,
    ))
}
