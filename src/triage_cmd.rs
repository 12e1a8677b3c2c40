//! `cudabisect triage`: compute-sanitizer triage on its own, in the checkout or at a revision.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::cli::{command_from_args, load_config};
use crate::config::{CommandLine, Config};
use crate::exit_codes;
use crate::probe::Prober;
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
    let given = command_from_args(command);
    let (repo, config) = match (load_config(dir, config.clone()), &given) {
        (Ok(v), _) => (Some(v.0), v.1),
        // With `-- command` and no config at all, triage needs neither a repository nor a bisect.toml.
        (Err(_), Some(cmd)) if config.is_none() && at.is_none() => {
            let text = format!("[repro]\ncommand = {}\n", toml_command(cmd));
            match Config::parse(Path::new("<command line>"), &text) {
                Ok(c) => (crate::git::Repo::open(dir).ok(), c),
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit_codes::USAGE;
                }
            }
        }
        (Err(e), _) => {
            eprintln!("error: {e}");
            return exit_codes::USAGE;
        }
    };
    let command = given.unwrap_or_else(|| {
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
    let out_dir = match &repo {
        Some(r) => r
            .state_dir()
            .join("triage")
            .join(format!("{}", std::process::id())),
        None => std::env::temp_dir().join(format!("cudabisect-triage-{}", std::process::id())),
    };
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("error: {}: {e}", out_dir.display());
        return exit_codes::INTERNAL;
    }
    let cwd = repo
        .as_ref()
        .map(|r| r.workdir())
        .unwrap_or_else(|| dir.to_path_buf());
    let result = match (at, &repo) {
        (None, _) => triage::run(&config, &cwd, &command, "", &out_dir, cancel),
        (Some(_), None) => {
            eprintln!("error: --at needs a git repository");
            return exit_codes::USAGE;
        }
        (Some(rev), Some(repo)) => {
            let oid = match repo.resolve(rev) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit_codes::USAGE;
                }
            };
            let worktree = match repo.probe_worktree() {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit_codes::INTERNAL;
                }
            };
            let prober = Prober {
                worktree: &worktree,
                config: &config,
                log_dir: out_dir.clone(),
                cancel,
            };
            if let Err(e) = prober.prepare(oid, "triage") {
                eprintln!("error: {e}");
                let _ = repo.prune_worktree();
                return exit_codes::INTERNAL;
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
    if let (Some(repo), "found", true) = (&repo, result.status.as_str(), config.bundle.enabled) {
        let oid = at
            .and_then(|rev| repo.resolve(rev).ok())
            .or_else(|| repo.resolve("HEAD").ok());
        let input = crate::bundle::BundleInput {
            root: repo.workdir().join(&config.bundle.dir),
            commit: oid.and_then(|o| repo.info(o).ok()),
            good_parents: vec![],
            found_by: Some("cudabisect triage".into()),
            target: result.signature.clone(),
            triage: serde_json::to_value(&result).ok(),
            shrink: None,
            report_json: serde_json::to_value(&result).unwrap_or_default(),
            config_text: &config.text,
            log_dirs: vec![],
            extra_files: result.files.iter().map(PathBuf::from).collect(),
            backend: None,
        };
        match crate::bundle::write(&input, &crate::environment::collect()) {
            Ok(dir) => eprintln!("bundle: {}", dir.display()),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
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

/// Writes a command back as TOML, for the built-in config of a bare `triage -- cmd`.
fn toml_command(cmd: &CommandLine) -> String {
    match cmd {
        CommandLine::Argv(v) => {
            toml::Value::Array(v.iter().cloned().map(toml::Value::String).collect()).to_string()
        }
        CommandLine::Shell(s) => toml::Value::String(s.clone()).to_string(),
    }
}
