//! The GPUs this machine shows a run: what parallel workers are pinned to when the config names none.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::config::CommandLine;
use crate::exec::process::{self, CommandSpec};

/// The GPUs this process may use: `CUDA_VISIBLE_DEVICES` when it is set (an empty value hides them all),
/// else the indices `nvidia-smi` lists, else none.
pub fn visible_devices(cancel: &AtomicBool) -> Vec<String> {
    if let Ok(list) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return list
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty() && !d.starts_with('-'))
            .map(String::from)
            .collect();
    }
    let spec = CommandSpec {
        command: CommandLine::Argv(vec![
            "nvidia-smi".into(),
            "--query-gpu=index".into(),
            "--format=csv,noheader".into(),
        ]),
        cwd: std::env::temp_dir(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
        grace: Duration::from_secs(2),
        stack_dump: None,
    };
    match process::run(&spec, cancel) {
        Ok(run) if run.exit == crate::classify::Exit::Code(0) => run
            .output
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_digit()))
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    }
}
