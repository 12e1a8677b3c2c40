//! Asks the host for the environment a maintainer wants to see (GPU, driver and CUDA versions,
//! compute-sanitizer, the OS, PyTorch's own `collect_env` report when the run used torch), running the tools
//! that know.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::classify::Exit;
use crate::config::CommandLine;
use crate::exec::process::{self, CommandSpec};
use crate::exec::tools::find_program;
pub use crate::report::environment::Environment;

fn capture(argv: &[&str], timeout: Duration, cancel: &AtomicBool) -> Option<String> {
    let spec = CommandSpec {
        command: CommandLine::Argv(argv.iter().map(|s| s.to_string()).collect()),
        cwd: std::env::temp_dir(),
        env: vec![],
        timeout,
        grace: Duration::from_secs(1),
        stack_dump: None,
    };
    let run = process::run(&spec, cancel).ok()?;
    (run.exit == Exit::Code(0)).then(|| run.output.trim().to_string())
}

/// One line naming the machine's GPUs and driver (and the devices the run may see), cheap enough to ask
/// at every start: a journaled verdict is reused only on a machine with the same line.
pub fn fingerprint(cancel: &AtomicBool) -> String {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "all".into());
    let gpus = find_program("nvidia-smi", &["/usr/bin/nvidia-smi"])
        .and_then(|smi| {
            capture(
                &[
                    &smi.display().to_string(),
                    "--query-gpu=name,driver_version",
                    "--format=csv,noheader",
                ],
                Duration::from_secs(20),
                cancel,
            )
        })
        .map(|q| q.lines().map(str::trim).collect::<Vec<_>>().join("; "))
        .unwrap_or_else(|| "no GPU seen".into());
    format!("{gpus} | visible: {visible}")
}

/// Collects the environment; PyTorch's `collect_env` only when the run used `torch`. Each probe is bounded
/// in time and announced through `progress` (some take a minute); what is missing is left out, and once
/// `cancel` is set the rest is skipped.
pub fn collect(cancel: &AtomicBool, torch: bool, progress: &mut dyn FnMut(&str)) -> Environment {
    let short = Duration::from_secs(20);
    let capture = |argv: &[&str], timeout| capture(argv, timeout, cancel);
    let mut env = Environment {
        cudabisect: format!("cudabisect {}", env!("CARGO_PKG_VERSION")),
        os: capture(&["uname", "-srm"], short),
        ..Environment::default()
    };
    let cancelled = || cancel.load(std::sync::atomic::Ordering::SeqCst);
    progress("nvidia-smi");
    if let Some(smi) = find_program("nvidia-smi", &["/usr/bin/nvidia-smi"]).filter(|_| !cancelled())
    {
        let smi = smi.display().to_string();
        if let Some(q) = capture(
            &[
                &smi,
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
            short,
        ) {
            env.gpus = q.lines().map(|l| l.trim().to_string()).collect();
        }
        env.cuda_driver = capture(&[&smi], short).and_then(|out| {
            let at = out.find("CUDA Version:")?;
            Some(out[at + 13..].split_whitespace().next()?.to_string())
        });
    }
    if cancelled() {
        return env;
    }
    progress("the CUDA driver");
    env.driver_api = crate::harness::cuda::driver_summary();
    progress("nvcc and compute-sanitizer");
    if let Some(nvcc) = find_program("nvcc", &["/usr/local/cuda/bin/nvcc"]) {
        let nvcc = nvcc.display().to_string();
        env.nvcc = capture(&[&nvcc, "--version"], short)
            .and_then(|v| v.lines().last().map(str::to_string));
    }
    if let Some(cs) = crate::exec::tools::find_sanitizer(None) {
        let cs = cs.display().to_string();
        env.compute_sanitizer =
            capture(&[&cs, "--version"], short).and_then(|v| v.lines().last().map(str::to_string));
    }
    if cancelled() {
        return env;
    }
    let Some(py) = python() else {
        return env;
    };
    let py = py.display().to_string();
    progress("python");
    env.python = capture(&[&py, "--version"], short);
    if torch && !cancelled() {
        progress("torch.utils.collect_env");
        env.torch_collect_env = torch_report(&py, cancel);
    }
    env
}

/// `python -m torch.utils.collect_env`, when torch imports (seconds: it imports torch).
pub fn torch_report(py: &str, cancel: &AtomicBool) -> Option<String> {
    capture(
        // runpy warns that torch.utils imported collect_env already: noise at the top of the report.
        &[
            py,
            "-W",
            "ignore::RuntimeWarning",
            "-m",
            "torch.utils.collect_env",
        ],
        Duration::from_secs(120),
        cancel,
    )
}

/// PyTorch's report for an environment collected without it, when the run turned out to use torch.
pub fn add_torch_report(env: &mut Environment, cancel: &AtomicBool) {
    if let Some(py) = python() {
        env.torch_collect_env = torch_report(&py.display().to_string(), cancel);
    }
}

/// The Python the environment record asks: `python3`, else `python`.
fn python() -> Option<std::path::PathBuf> {
    find_program("python3", &[]).or_else(|| find_program("python", &[]))
}
