//! `cudabisect harness …`: the native harness's command line (run, describe, extract), speaking the
//! harness protocol the shrinker uses.

use std::path::{Path, PathBuf};

use crate::exit_codes;
use crate::harness::{self, BackendChoice, HarnessError, Model, Outcome, RunOptions};

fn load(model: Option<PathBuf>) -> Result<Model, i32> {
    let Some(path) = model else {
        eprintln!("error: no model file: give it after the subcommand or as --model");
        return Err(exit_codes::USAGE);
    };
    Model::load(&path).map_err(|e| {
        eprintln!("error: {e}");
        exit_codes::USAGE
    })
}

fn ids(list: &str) -> Vec<String> {
    list.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `harness run`: returns the exit code (0 clean, 1 a node faulted, 2 bad model or options, 6 no backend).
pub fn run(
    model: Option<PathBuf>,
    backend: BackendChoice,
    keep: Option<String>,
    record: Option<PathBuf>,
    inputs: Option<PathBuf>,
    no_cache: bool,
) -> i32 {
    let model = match load(model) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let opts = RunOptions {
        backend,
        keep: keep.as_deref().map(ids),
        record,
        inputs,
        cache: if no_cache {
            None
        } else {
            harness::kernels::cache_dir()
        },
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match harness::run(&model, &opts, &mut out) {
        Ok(report) => match report.outcome {
            Outcome::Clean => exit_codes::FOUND,
            Outcome::Fault { .. } => exit_codes::NODE_FAULT,
        },
        Err(e) => {
            // On stdout, where the protocol lines go, so a log of the run shows why it did not run.
            println!("error: {e}");
            error_code(&e)
        }
    }
}

/// `harness build`: check the model and compile its kernels into the cache (0 ok, 2 bad model or a kernel
/// that does not compile, 6 no backend).
pub fn build(model: Option<PathBuf>, backend: BackendChoice, no_cache: bool) -> i32 {
    let model = match load(model) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let opts = RunOptions {
        backend,
        keep: None,
        record: None,
        inputs: None,
        cache: if no_cache {
            None
        } else {
            harness::kernels::cache_dir()
        },
    };
    let stdout = std::io::stdout();
    match harness::build(&model, &opts, &mut stdout.lock()) {
        Ok(()) => exit_codes::FOUND,
        Err(e) => {
            eprintln!("error: {e}");
            error_code(&e)
        }
    }
}

fn error_code(e: &HarnessError) -> i32 {
    match e {
        HarnessError::Unavailable(_) => exit_codes::BACKEND_UNAVAILABLE,
        HarnessError::Model(_) | HarnessError::Usage(_) | HarnessError::Compile(_) => {
            exit_codes::USAGE
        }
        HarnessError::Io(_) => exit_codes::INTERNAL,
    }
}

/// `harness describe`: the graph as JSON on stdout.
pub fn describe(model: Option<PathBuf>) -> i32 {
    match load(model) {
        Ok(m) => {
            println!("{:#}", harness::describe(&m));
            exit_codes::FOUND
        }
        Err(code) => code,
    }
}

/// `harness extract`: the kept nodes as a standalone model; prints what it wrote as JSON.
pub fn extract(model: Option<PathBuf>, keep: &str, inputs: Option<PathBuf>, out: &Path) -> i32 {
    let model = match load(model) {
        Ok(m) => m,
        Err(code) => return code,
    };
    match harness::extract::extract(&model, &ids(keep), inputs.as_deref(), out) {
        Ok(x) => {
            println!("{}", serde_json::to_string(&x).expect("serialises"));
            exit_codes::FOUND
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                HarnessError::Io(_) => exit_codes::INTERNAL,
                _ => exit_codes::USAGE,
            }
        }
    }
}
