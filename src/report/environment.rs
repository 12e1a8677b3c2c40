//! The environment a maintainer asks for: GPU, driver and CUDA versions, compute-sanitizer, the tool's
//! version, the OS, and PyTorch's own `collect_env` report when torch is importable.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Serialize;

use crate::classify::Exit;
use crate::config::CommandLine;
use crate::process::{self, CommandSpec};
use crate::tools::find_program;

/// What was found; every field is optional because a machine may lack any of it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Environment {
    /// cudabisect's version.
    pub cudabisect: String,
    /// `uname -srm`.
    pub os: Option<String>,
    /// `nvidia-smi --query-gpu` lines: name, driver version, memory.
    pub gpus: Vec<String>,
    /// The CUDA version the driver supports, from nvidia-smi's header.
    pub cuda_driver: Option<String>,
    /// Device, architecture and driver API version as the CUDA driver reports them.
    pub driver_api: Option<String>,
    /// `nvcc --version`, last line.
    pub nvcc: Option<String>,
    /// `compute-sanitizer --version`, last line.
    pub compute_sanitizer: Option<String>,
    /// `python3 --version`.
    pub python: Option<String>,
    /// `python -m torch.utils.collect_env`, when torch imports.
    pub torch_collect_env: Option<String>,
}

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

/// Collects the environment. Each probe is bounded in time and announced through `progress` (some take
/// a minute); what is missing is left out, and once `cancel` is set the rest is skipped.
pub fn collect(cancel: &AtomicBool, progress: &mut dyn FnMut(&str)) -> Environment {
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
    if let Some(cs) = crate::tools::find_sanitizer(None) {
        let cs = cs.display().to_string();
        env.compute_sanitizer =
            capture(&[&cs, "--version"], short).and_then(|v| v.lines().last().map(str::to_string));
    }
    if cancelled() {
        return env;
    }
    progress("python and torch.utils.collect_env");
    if let Some(py) = find_program("python3", &[]).or_else(|| find_program("python", &[])) {
        let py = py.display().to_string();
        env.python = capture(&[&py, "--version"], short);
        // Without torch this exits at once with an error, and is left out: no separate check (an
        // `import torch` of its own cost several seconds).
        env.torch_collect_env = capture(
            &[&py, "-m", "torch.utils.collect_env"],
            Duration::from_secs(120),
        );
    }
    env
}

impl Environment {
    /// The environment as Markdown lines for REPORT.md.
    pub fn markdown(&self) -> String {
        let mut out = format!("- {}\n", self.cudabisect);
        let mut line = |k: &str, v: &Option<String>| {
            out.push_str(&format!("- {k}: {}\n", v.as_deref().unwrap_or("not found")));
        };
        line("OS", &self.os);
        line("CUDA (driver API)", &self.driver_api);
        line("CUDA version supported by the driver", &self.cuda_driver);
        line("nvcc", &self.nvcc);
        line("compute-sanitizer", &self.compute_sanitizer);
        line("Python", &self.python);
        for g in &self.gpus {
            out.push_str(&format!("- GPU: {g}\n"));
        }
        if self.gpus.is_empty() {
            out.push_str("- GPU: none found (nvidia-smi absent or failed)\n");
        }
        if let Some(t) = &self.torch_collect_env {
            out.push_str(&format!("\n<details><summary>python -m torch.utils.collect_env</summary>\n\n```\n{t}\n```\n</details>\n"));
        }
        out
    }
}
