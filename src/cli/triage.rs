//! `cudabisect triage`: compute-sanitizer triage on its own, in the checkout or at a revision.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use cudabisect::config::{CommandLine, Config};
use cudabisect::git::Repo;
use cudabisect::report::bundle::{self, BundleInput};
use cudabisect::report::environment;
use cudabisect::report::record::TriageStatus;
use cudabisect::run::lock::lock_state_dir;
use cudabisect::run::probe::WorktreeProber;
use cudabisect::run::triage;

use super::common::{bundle_root, load_config};
use super::error::{CommandError, CommandResult, ErrorKind};
use super::exit_codes;

/// Runs triage and prints what it found: exit 5 found, 0 clean, 6 no compute-sanitizer, 70 error.
pub fn run(
    dir: &Path,
    config: Option<&Path>,
    at: Option<&str>,
    command: Vec<String>,
    json: bool,
    cancel: &AtomicBool,
) -> CommandResult {
    let given = (!command.is_empty()).then_some(CommandLine::Argv(command));
    let (repo, config) = match (load_config(dir, config), &given) {
        (Ok((r, c)), _) => (Some(r), c),
        // With `-- command` and no config at all, triage needs neither a repository nor a bisect.toml.
        (Err(_), Some(cmd)) if config.is_none() && at.is_none() => {
            let text = format!("[repro]\ncommand = {}\n", toml_command(cmd));
            let c = Config::parse(Path::new("<command line>"), &text)?;
            (Repo::open(dir).ok(), c)
        }
        (Err(e), _) => return Err(e),
    };
    let command = given.unwrap_or_else(|| {
        config
            .triage
            .command
            .clone()
            .unwrap_or_else(|| config.repro.command.clone())
    });
    let configured = config.triage.sanitizer.as_deref();
    if triage::find_sanitizer(configured).is_none() {
        return Err(CommandError::new(
            ErrorKind::Unavailable,
            triage::missing_message(configured),
        ));
    }
    let scratch;
    let out_dir = match &repo {
        Some(r) => r
            .state_dir()
            .join("triage")
            .join(cudabisect::run::job::run_id()),
        None => {
            scratch = tempfile::Builder::new()
                .prefix("cudabisect-triage-")
                .tempdir()
                .map_err(|e| CommandError::new(ErrorKind::Internal, e))?;
            scratch.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&out_dir).map_err(|e| {
        CommandError::new(ErrorKind::Internal, format!("{}: {e}", out_dir.display()))
    })?;
    let result = match (at, &repo) {
        (None, _) => {
            let cwd = repo
                .as_ref()
                .map(|r| r.workdir())
                .unwrap_or_else(|| dir.to_path_buf());
            triage::run(&config, &cwd, &command, "", &out_dir, cancel)
        }
        (Some(_), None) => return Err(CommandError::usage("--at needs a git repository")),
        (Some(rev), Some(repo)) => {
            let oid = repo.resolve(rev)?;
            let state_dir = repo.state_dir();
            let _lock = lock_state_dir(&state_dir, &format!("triage --at {rev}"))?;
            let worktree = repo.probe_worktree(&state_dir.join("worktree"))?;
            let prober = WorktreeProber {
                worktree: &worktree,
                config: &config,
                log_dir: out_dir.clone(),
                cancel,
            };
            let prepared = prober.prepare(oid, "triage");
            let result = prepared.map(|()| {
                triage::run(
                    &config,
                    worktree.path(),
                    &command,
                    &oid.to_string(),
                    &out_dir,
                    cancel,
                )
            });
            if let Err(e) = repo.remove_worktree(worktree.path()) {
                eprintln!("warning: the probe worktree was not removed: {e}");
            }
            result.map_err(|e| CommandError::new(ErrorKind::Internal, e))?
        }
    };
    if let (Some(repo), TriageStatus::Found, true) = (&repo, result.status, config.bundle.enabled) {
        let oid = at
            .and_then(|rev| repo.resolve(rev).ok())
            .or_else(|| repo.resolve("HEAD").ok());
        let input = BundleInput {
            root: bundle_root(repo, &config),
            commit: oid.and_then(|o| repo.info(o).ok()),
            good_parents: vec![],
            found_by: Some("cudabisect triage".into()),
            target: result.signature.clone(),
            triage: Some(&result),
            shrink: None,
            report_json: serde_json::to_value(&result).unwrap_or_default(),
            config_text: &config.text,
            log_dirs: vec![],
            extra_files: result.files.iter().map(PathBuf::from).collect(),
            backend: None,
            include_binary: false,
        };
        let env = environment::collect(cancel, &mut |what| {
            eprintln!("bundle: asking {what} about the environment")
        });
        match bundle::write(&input, &env) {
            Ok(dir) => eprintln!("bundle: {}", dir.display()),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    let mut out = String::new();
    if json {
        out = serde_json::to_string_pretty(&result).unwrap_or_default() + "\n";
    } else {
        out.push_str(&format!("{}\n", result.summary));
        for f in &result.findings {
            out.push_str(&format!("  {}\n", f.line));
        }
        if let Some(sig) = &result.signature {
            out.push_str(&format!("signature: {}\n", sig.short()));
        }
        for file in &result.files {
            out.push_str(&format!("  log: {file}\n"));
        }
    }
    super::common::print_stdout(&out);
    Ok(match result.status {
        TriageStatus::Found => exit_codes::FAULT_FOUND,
        TriageStatus::Clean => exit_codes::OK,
        TriageStatus::Unavailable => exit_codes::UNAVAILABLE,
        TriageStatus::Interrupted => exit_codes::INTERRUPTED,
        TriageStatus::Error => exit_codes::INTERNAL,
    })
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
