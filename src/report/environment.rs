//! The environment a maintainer asks for, as the bundle records it: GPU, driver and CUDA versions,
//! compute-sanitizer, the tool's version, the OS, and PyTorch's own `collect_env` report. Collected by
//! `host::environment`.

use serde::{Deserialize, Serialize};

/// What was found; every field is optional because a machine may lack any of it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Environment {
    /// cudabisect's version.
    pub cudabisect: String,
    /// `uname -n` of the machine asked.
    pub host: Option<String>,
    /// Asked on a scheduler's node through the run's executor (as the probes ran), not on the machine
    /// cudabisect ran on.
    pub elsewhere: bool,
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

impl Environment {
    /// The environment as Markdown lines for REPORT.md.
    pub fn markdown(&self) -> String {
        let mut out = format!("- {}\n", self.cudabisect);
        if let Some(host) = &self.host {
            let how = if self.elsewhere {
                " (a node the scheduler gave, as it gave the probes)"
            } else {
                ""
            };
            out.push_str(&format!("- Machine: {host}{how}\n"));
        }
        let mut line = |k: &str, v: &Option<String>| {
            out.push_str(&format!("- {k}: {}\n", v.as_deref().unwrap_or("not found")));
        };
        line("OS", &self.os);
        // cudabisect asks the driver API in its own process: of no use for a node's driver.
        if !self.elsewhere {
            line("CUDA (driver API)", &self.driver_api);
        }
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
