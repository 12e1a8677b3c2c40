//! `cudabisect shrink`: the shrink stage on its own, in the checkout as it is or at a revision built in
//! the probe worktree (then also checked at the revision's parent).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::cli::load_config;
use crate::events::Reporter;
use crate::exit_codes;
use crate::probe::Prober;
use crate::shrink_run::{self, ShrinkContext, ShrinkStatus};

/// Runs the shrink and returns the exit code: 0 minimal subgraph found, 3 the model does not fault under
/// the harness, 1 the harness failed, 2 bad input, 130 interrupted.
pub fn run(
    dir: &Path,
    config: Option<PathBuf>,
    at: Option<&str>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> i32 {
    let (repo, config) = match load_config(dir, config) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return exit_codes::USAGE;
        }
    };
    let Some(section) = config.shrink.clone() else {
        eprintln!(
            "error: {}: no [shrink] section: name a model (native harness) or a harness command",
            config.path.display()
        );
        return exit_codes::USAGE;
    };
    let oid = match at.map(|rev| repo.resolve(rev)).transpose() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return exit_codes::USAGE;
        }
    };
    let run_dir = repo.state_dir().join("runs").join(format!(
        "shrink-{}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        std::process::id()
    ));
    let log_dir = run_dir.join("logs");
    if let Err(e) = std::fs::create_dir_all(&log_dir) {
        eprintln!("error: {}: {e}", log_dir.display());
        return exit_codes::INTERNAL;
    }
    let _ = std::fs::write(run_dir.join("bisect.toml"), &config.text);
    let worktree = match oid.map(|_| repo.probe_worktree()).transpose() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return exit_codes::INTERNAL;
        }
    };
    let prober = worktree.as_ref().map(|w| Prober {
        worktree: w,
        config: &config,
        log_dir: log_dir.clone(),
        cancel,
    });
    let (cwd, commit) = match (&prober, oid) {
        (Some(p), Some(oid)) => {
            if let Err(e) = p.prepare(oid, "shrink") {
                eprintln!("error: {e}");
                let _ = repo.prune_worktree();
                return exit_codes::INTERNAL;
            }
            (p.worktree.path().to_path_buf(), oid.to_string())
        }
        _ => (repo.workdir(), String::new()),
    };
    let ctx = ShrinkContext {
        config: &config,
        shrink: &section,
        cwd: &cwd,
        out_dir: run_dir.join("shrink"),
        commit,
        target: None,
    };
    let mut report = shrink_run::shrink(&ctx, reporter, cancel);
    if report.status == ShrinkStatus::Minimal && section.check_parent {
        let parent = oid
            .and_then(|o| repo.parents(o).ok())
            .and_then(|p| p.first().copied());
        report.parent_check = Some(match (&prober, parent) {
            (Some(p), Some(parent)) => match p.prepare(parent, "parent") {
                Err(e) => format!("not run: {e}"),
                Ok(()) => {
                    let h = shrink_run::Harness::from_config(
                        &config,
                        &section,
                        p.worktree.path(),
                        &parent.to_string(),
                    );
                    shrink_run::check_elsewhere(&h, &report, &config.match_policy, cancel)
                }
            },
            (None, _) => "not run: no --at revision".into(),
            (Some(_), None) => "not run: the revision has no parent".into(),
        });
    }
    if worktree.is_some() {
        let _ = repo.prune_worktree();
    }
    if report.status == ShrinkStatus::Minimal && config.bundle.enabled {
        let head = oid.or_else(|| repo.resolve("HEAD").ok());
        let input = crate::bundle::BundleInput {
            root: repo.workdir().join(&config.bundle.dir),
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
            log_dirs: vec![log_dir.clone(), run_dir.join("shrink").join("logs")],
            extra_files: vec![],
            backend: Some(match section.backend.as_str() {
                "auto" if crate::harness::cuda::probe().is_ok() => "cuda".into(),
                "auto" => "cpu".into(),
                b => b.into(),
            }),
        };
        match crate::bundle::write(&input, &crate::environment::collect()) {
            Ok(dir) => eprintln!("bundle: {}", dir.display()),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    let json = serde_json::to_string_pretty(&report).expect("serialises");
    let _ = std::fs::write(run_dir.join("shrink").join("report.json"), &json);
    reporter.event(&crate::events::Event::ShrinkDone {
        report: Box::new(report.clone()),
    });
    match report.status {
        ShrinkStatus::Minimal => exit_codes::FOUND,
        ShrinkStatus::NotReproduced => exit_codes::ENDPOINTS_INVALID,
        ShrinkStatus::Failed => exit_codes::INTERNAL,
        ShrinkStatus::Interrupted => exit_codes::INTERRUPTED,
    }
}
