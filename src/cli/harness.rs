//! `cudabisect harness …`: the native harness's command line (run, build, describe, extract), speaking the
//! harness protocol the shrinker uses.

use std::path::{Path, PathBuf};

use cudabisect::harness::{self, BackendChoice, Model, Outcome, RunOptions};

use super::common::print_stdout;
use super::error::{CommandError, CommandResult};
use super::exit_codes;

fn load(model: Option<PathBuf>) -> Result<Model, CommandError> {
    let path = model.ok_or_else(|| {
        CommandError::usage("no model file: give it after the subcommand or as --model")
    })?;
    Model::load(&path).map_err(|e| CommandError::usage(e.to_string()))
}

fn ids(list: &str) -> Vec<String> {
    list.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn cache(no_cache: bool) -> Option<PathBuf> {
    if no_cache {
        None
    } else {
        harness::kernels::cache_dir()
    }
}

/// `harness run`: 0 clean, 1 a node faulted, 2 bad model or options, 6 no backend.
pub fn run(
    model: Option<PathBuf>,
    backend: BackendChoice,
    keep: Option<String>,
    record: Option<PathBuf>,
    recording: Option<PathBuf>,
    no_cache: bool,
) -> CommandResult {
    let model = load(model)?;
    if let Some(k) = keep.as_deref().filter(|k| ids(k).is_empty()) {
        return Err(CommandError::usage(format!("--keep {k:?} names no node")));
    }
    let opts = RunOptions {
        backend,
        keep: keep.as_deref().map(ids),
        record,
        inputs: recording,
        cache: cache(no_cache),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match harness::run(&model, &opts, &mut out) {
        Ok(report) => Ok(match report.outcome {
            Outcome::Clean => exit_codes::OK,
            Outcome::Fault { .. } => exit_codes::NODE_FAULT,
        }),
        Err(e) => {
            // Also on stdout, where the protocol lines go, so a log of the run shows why it did not run.
            drop(out);
            print_stdout(&format!("error: {e}\n"));
            Err(CommandError::from(e))
        }
    }
}

/// `harness build`: check the model and compile its kernels into the cache (0 ok, 2 bad model or a kernel
/// that does not compile, 6 no backend).
pub fn build(model: Option<PathBuf>, backend: BackendChoice, no_cache: bool) -> CommandResult {
    let model = load(model)?;
    let opts = RunOptions {
        backend,
        keep: None,
        record: None,
        inputs: None,
        cache: cache(no_cache),
    };
    let stdout = std::io::stdout();
    harness::build(&model, &opts, &mut stdout.lock())?;
    Ok(exit_codes::OK)
}

/// `harness describe`: the graph as JSON, to `--out` (the protocol's channel, any size) or stdout.
pub fn describe(model: Option<PathBuf>, out: Option<PathBuf>) -> CommandResult {
    let m = load(model)?;
    let json = serde_json::to_string_pretty(&harness::describe(&m))
        .map_err(|e| CommandError::new(super::error::ErrorKind::Internal, e))?;
    match out {
        Some(path) => {
            cudabisect::atomic_file::write_atomic(&path, json.as_bytes()).map_err(|e| {
                CommandError::new(
                    super::error::ErrorKind::Internal,
                    format!("--out {}: {e}", path.display()),
                )
            })?
        }
        None => print_stdout(&(json + "\n")),
    }
    Ok(exit_codes::OK)
}

/// `harness extract`: the kept nodes as a standalone model; prints what it wrote as JSON.
pub fn extract(
    model: Option<PathBuf>,
    keep: &str,
    recording: Option<PathBuf>,
    out: &Path,
) -> CommandResult {
    let model = load(model)?;
    let x = harness::extract::extract(&model, &ids(keep), recording.as_deref(), out)?;
    print_stdout(&format!(
        "{}\n",
        serde_json::to_string(&x).unwrap_or_default()
    ));
    Ok(exit_codes::OK)
}
