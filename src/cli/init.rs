//! `cudabisect init`: writes a starter config from a repro command, and says what it found.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use cudabisect::report::event::{Event, Reporter};
use cudabisect::report::json::JsonReporter;
use cudabisect::run::jobs::init::{init, InitOptions};

use super::common::print_stdout;
use super::error::CommandResult;
use super::exit_codes;

/// Writes the config (never over one) and prints its path and what it chose.
pub fn run(
    dir: PathBuf,
    repro: Vec<String>,
    build: Option<String>,
    pyproject: bool,
    json: bool,
    cancel: &AtomicBool,
) -> CommandResult {
    let opts = InitOptions {
        dir,
        repro,
        build,
        pyproject,
    };
    let done = init(&opts, cancel)?;
    let f = &done.facts;
    if json {
        JsonReporter::new().event(&Event::ConfigWritten {
            path: done.path.display().to_string(),
            repro: f.repro.clone(),
            build: f.build.clone(),
            frameworks: f.frameworks.iter().map(|s| s.to_string()).collect(),
            gpus: f.gpus.len(),
            notes: f.notes.clone(),
        });
        return Ok(exit_codes::OK);
    }
    let mut out = format!("Wrote {}\n    repro: {}\n", done.path.display(), f.repro);
    match &f.build {
        Some(build) => out.push_str(&format!("    build: {build} ({})\n", f.build_why)),
        None => out.push_str("    build: none (the repro imports the worktree's own code)\n"),
    }
    if !f.frameworks.is_empty() {
        out.push_str(&format!("    frameworks: {}\n", f.frameworks.join(", ")));
    }
    out.push_str(&format!("    GPUs here: {}\n", f.gpus.len()));
    for note in &f.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out.push_str("Next: cudabisect start GOOD..BAD\n");
    print_stdout(&out);
    Ok(exit_codes::OK)
}
