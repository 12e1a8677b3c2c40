//! `cudabisect demo`: lays out the sample engine's history and bisects it end to end.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use cudabisect::report::event::Reporter;
use cudabisect::run::plan::StartOptions;
use cudabisect::sample::demo::{build_sample, settings};

use super::error::{CommandError, CommandResult, ErrorKind};

/// Runs the demo; exits as `start` does, reporting through `reporter` (JSON Lines or human).
pub fn run(
    dir: Option<PathBuf>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> CommandResult {
    let path = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("cudabisect-demo-{}", std::process::id()))
    });
    if path.exists() && !path.is_dir() {
        return Err(CommandError::usage(format!(
            "{} exists and is not a directory",
            path.display()
        )));
    }
    if path.exists()
        && std::fs::read_dir(&path)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(CommandError::usage(format!(
            "{} exists and is not empty",
            path.display()
        )));
    }
    let settings = settings();
    let sample = build_sample(&path, &settings).map_err(|e| {
        CommandError::new(
            ErrorKind::Internal,
            format!("cannot write the sample repository: {e}"),
        )
    })?;
    eprintln!(
        "demo: sample engine with {} commits at {} (merges, 2 commits that do not build, an unrelated fault in another kernel, one planted regression)",
        sample.commits,
        sample.path.display()
    );
    match settings.backend {
        "cuda" => eprintln!(
            "demo: a CUDA device is present: the engine runs on it; compute-sanitizer triage {}",
            if settings.triage { "is on" } else { "is off (compute-sanitizer not found)" }
        ),
        _ => eprintln!("demo: no usable CUDA device here: the engine runs on the bounds-checked CPU reference; no triage"),
    }
    eprintln!("demo: cudabisect start v1.0..main -C {}", path.display());
    let opts = StartOptions {
        dir: path.clone(),
        range: "v1.0..main".into(),
        ..StartOptions::default()
    };
    let code = super::start::run(&opts, reporter, cancel);
    eprintln!(
        "demo: the planted culprit is {}; the sample repository stays at {}",
        cudabisect::report::record::short_sha(&sample.culprit.to_string()),
        path.display()
    );
    code
}
