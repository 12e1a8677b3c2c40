//! `cudabisect shrink` on its own: the shrink stage in the checkout as it is, or at a revision built in the
//! probe worktree under the state lock (then also checked at the revision's parent), with its bundle.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::config::Config;
use crate::git::Repo;
use crate::protocol::client::ProcessHarness;
use crate::report::bundle::BundleInput;
use crate::report::event::{Event, Reporter};
use crate::report::record::{ParentCheck, ShrinkReport, ShrinkStatus};

use super::error::RunError;
use super::job::{bundle_root, write_bundle_reporting};
use super::plan::config_path;
use super::workspace::{Opening, Workspace};

use super::shrink::{check_parent, shrink, ShrinkSettings};

/// Opens the repository containing `dir` and its config.
pub fn load(dir: &Path, config: Option<&Path>) -> Result<(Repo, Config), RunError> {
    let repo = Repo::open(dir)?;
    let config = Config::load(&config_path(&repo, config))?;
    Ok((repo, config))
}

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
    let section = config.shrink.clone().ok_or_else(|| {
        RunError::Usage(format!(
            "{}: no [shrink] section: name a model (native harness) or a harness command",
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
    let result = (|| -> Result<ShrinkReport, RunError> {
        let (cwd, commit) = match (&prober, oid) {
            (Some(p), Some(oid)) => {
                p.prepare(oid, "shrink")?;
                (p.worktree.path().to_path_buf(), oid.to_string())
            }
            _ => (repo.workdir(), String::new()),
        };
        let captured = if section.captures() {
            match super::capture::capture(
                ws.executor.as_ref(),
                &config,
                &section,
                (&cwd, &commit),
                &run_dir,
                None,
                cancel,
            ) {
                Ok(found) => Some(found),
                Err(e) => {
                    return Ok(super::shrink::not_started(
                        &run_dir.join("shrink"),
                        ShrinkStatus::Failed,
                        e.to_string(),
                    ))
                }
            }
        } else {
            None
        };
        let capture_dir = captured.as_ref().map(|(d, _)| d.clone());
        let harness = ProcessHarness::from_config(
            &config,
            &section,
            &cwd,
            &commit,
            &run_dir,
            None,
            capture_dir.as_deref(),
        )
        .map(|h| h.on(ws.executor.clone()))?;
        let settings = ShrinkSettings {
            policy: &config.match_policy,
            out_dir: run_dir.join("shrink"),
            target: None,
            attempts: section.attempts,
            confirm: section.confirm,
            confirm_jobs: section.confirm_jobs,
        };
        let mut report = shrink(&harness, &settings, reporter, cancel);
        report.captured = captured.map(|(_, fault)| fault);
        super::capture::explain(&mut report);
        if report.status == ShrinkStatus::Minimal && section.check_parent {
            let parent = oid
                .and_then(|o| repo.parents(o).ok())
                .and_then(|p| p.first().copied());
            report.parent_check = Some(match (&prober, parent) {
                (Some(p), Some(parent)) => match p.prepare(parent, "parent") {
                    Err(e) => ParentCheck::NotRun(e.to_string()),
                    Ok(()) => match ProcessHarness::from_config(
                        &config,
                        &section,
                        p.worktree.path(),
                        &parent.to_string(),
                        &run_dir,
                        None,
                        capture_dir.as_deref(),
                    )
                    .map(|h| h.on(ws.executor.clone()))
                    {
                        Ok(h) => check_parent(&h, &report, &config.match_policy, cancel),
                        Err(e) => ParentCheck::NotRun(e.to_string()),
                    },
                },
                (None, _) => ParentCheck::NotRun("no --at revision".into()),
                (Some(_), None) => ParentCheck::NotRun("the revision has no parent".into()),
            });
        }
        Ok(report)
    })();
    drop(prober);
    ws.close(reporter);
    let report = result?;
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    let _ = std::fs::write(run_dir.join("shrink").join("report.json"), &json);
    reporter.event(&Event::ShrinkDone {
        report: Box::new(report.clone()),
    });
    if report.status == ShrinkStatus::Minimal && config.bundle.enabled {
        let head = oid.or_else(|| repo.resolve("HEAD").ok());
        let input = BundleInput {
            root: bundle_root(&repo, &config, None),
            commit: head.and_then(|o| repo.info(o).ok()),
            good_parents: vec![],
            found_by: Some(if at.is_some() {
                "cudabisect shrink --at".into()
            } else {
                "cudabisect shrink in the checkout".into()
            }),
            target: report.signature.clone(),
            triage: None,
            shrink: Some(&report),
            report_json: serde_json::to_value(&report).unwrap_or_default(),
            config_text: &config.text,
            log_dirs: vec![
                ("probes", log_dir.clone()),
                ("shrink", run_dir.join("shrink").join("logs")),
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
        write_bundle_reporting(&input, reporter, cancel);
    }
    Ok(report)
}
