//! `cudabisect harness …`: the native harness's command line (run a model, describe its graph).

use std::path::{Path, PathBuf};

use crate::exit_codes;
use crate::harness::{self, BackendChoice, HarnessError, Model, Outcome, RunOptions};

/// `harness run`: returns the exit code (0 clean, 1 a node faulted, 2 bad model or options, 6 no backend).
pub fn run(
    model: &Path,
    backend: BackendChoice,
    keep: Option<String>,
    record: Option<PathBuf>,
    inputs: Option<PathBuf>,
    no_cache: bool,
) -> i32 {
    let model = match Model::load(model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return exit_codes::USAGE;
        }
    };
    let keep = keep.map(|k| {
        k.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    });
    let opts = RunOptions {
        backend,
        keep,
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
            // Printed on stdout too, so a log of the run shows why it did not run.
            println!("error: {e}");
            match e {
                HarnessError::Unavailable(_) => exit_codes::BACKEND_UNAVAILABLE,
                HarnessError::Model(_) | HarnessError::Usage(_) | HarnessError::Compile(_) => {
                    exit_codes::USAGE
                }
                HarnessError::Io(_) => exit_codes::INTERNAL,
            }
        }
    }
}

/// `harness describe`: the graph as JSON on stdout.
pub fn describe(model: &Path) -> i32 {
    match Model::load(model) {
        Ok(m) => {
            println!("{:#}", harness::describe(&m));
            exit_codes::FOUND
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit_codes::USAGE
        }
    }
}
