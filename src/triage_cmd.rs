//! `cudabisect triage`: compute-sanitizer triage on its own, in the checkout or at a revision.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::cli::{command_from_args, load_config};
use crate::exit_codes;
use crate::probe::command_spec;
use crate::process;
use crate::triage;

/// Runs triage and prints what it found; returns the exit code.
pub fn run(
    dir: &Path,
    config: Option<PathBuf>,
    at: Option<&str>,
    command: Vec<String>,
    json: bool,
    cancel: &AtomicBool,
) -> i32 {
    let (repo, config) = match load_config(dir, config) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return exit_codes::USAGE;
        }
    };
    let command = command_from_args(command).unwrap_or_else(|| {
        config
            .triage
            .command
            .clone()
            .unwrap_or_else(|| config.repro.command.clone())
    });
    if triage::find_sanitizer(config.triage.sanitizer.as_deref()).is_none() {
        eprintln!("error: {}", triage::INSTALL_HINT);
        return exit_codes::USAGE;
    }
    let out_dir = repo
        .state_dir()
        .join("triage")
        .join(format!("{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("error: {}: {e}", out_dir.display());
        return exit_codes::INTERNAL;
    }
    let result = match at {
        None => triage::run(&config, &repo.workdir(), &command, "", &out_dir, cancel),
        Some(rev) => {
            let oid = match repo.resolve(rev) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit_codes::USAGE;
                }
            };
            let worktree = match repo
                .probe_worktree()
                .and_then(|w| w.checkout(oid, false).map(|_| w))
            {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit_codes::INTERNAL;
                }
            };
            if let Some(build) = &config.build {
                let spec = command_spec(
                    &config,
                    worktree.path(),
                    &build.command,
                    build.timeout,
                    &build.env,
                    &oid.to_string(),
                    "build",
                    1,
                    false,
                );
                match process::run(&spec, cancel) {
                    Ok(r) if r.exit == crate::classify::Exit::Code(0) => {}
                    _ => {
                        eprintln!("error: build failed at {rev}");
                        let _ = repo.prune_worktree();
                        return exit_codes::INTERNAL;
                    }
                }
            }
            let result = triage::run(
                &config,
                worktree.path(),
                &command,
                &oid.to_string(),
                &out_dir,
                cancel,
            );
            drop(worktree);
            let _ = repo.prune_worktree();
            result
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
    } else {
        println!("{}", result.summary);
        for f in &result.findings {
            println!("  {}", f.line);
        }
        if let Some(sig) = &result.signature {
            println!("signature: {}", sig.short());
        }
        for file in &result.files {
            println!("  log: {file}");
        }
    }
    match result.status.as_str() {
        "found" => exit_codes::CLASSIFIED_FAILURE,
        "clean" => exit_codes::FOUND,
        _ => exit_codes::INTERNAL,
    }
}
