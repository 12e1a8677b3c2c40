//! `[repro]`: how the GPU repro runs, and its checks beyond the types.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::error::{line_column, ConfigError};
use super::values::{duration, one, timeout, yes, CommandLine};

fn default_repro_timeout() -> Duration {
    Duration::from_secs(10 * 60)
}
fn default_grace() -> Duration {
    Duration::from_secs(5)
}
fn default_infra_retries() -> u32 {
    1
}

/// `[repro]`: how to run the GPU repro.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReproSection {
    /// The repro command, run in the probe worktree.
    pub command: CommandLine,
    /// Time allowed for one run; past it the run is a hang.
    #[serde(default = "default_repro_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Set `CUDA_LAUNCH_BLOCKING=1` (the default). Turning it off is recorded in the report.
    #[serde(default = "yes")]
    pub launch_blocking: bool,
    /// Time between SIGTERM and SIGKILL when a run is stopped.
    #[serde(default = "default_grace", deserialize_with = "duration")]
    pub grace_period: Duration,
    /// How often to rerun a probe whose failure is an infrastructure problem before skipping it.
    #[serde(default = "default_infra_retries")]
    pub infra_retries: u32,
    /// Runs of a probe before it counts as clean: a fault that shows only some of the time is caught when
    /// any run shows it. 1 (the default) trusts a single clean run.
    #[serde(default = "one")]
    pub attempts: u32,
    /// GPUs one run of a distributed repro needs (torchrun's `--nproc-per-node`): reserved per probe,
    /// composing with parallel workers, and passed on as `CUDABISECT_GPUS`. Same as `[search]
    /// gpus-per-probe`; give one or the other.
    pub gpus: Option<u32>,
    /// How long to wait after a run for its processes to leave the GPU before the next run; past it the
    /// probe is an infrastructure failure.
    #[serde(default = "default_idle_timeout", deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// When a run times out, dump its Python processes' stacks with `py-spy` (when installed) before they
    /// are killed, so a hang says where each rank was.
    #[serde(default = "yes")]
    pub stack_dump: bool,
    /// Python repros (`python script.py`, `python -m mod`, `pytest`) run in children forked from a warm
    /// interpreter that has already imported the heavy modules outside the worktree. Default on.
    #[serde(default = "yes")]
    pub warm: bool,
    /// What the warm interpreter imports; default: what the warm runs imported from outside the
    /// worktree, learned from each.
    #[serde(default)]
    pub preload: Option<Vec<String>>,
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

/// `[repro] attempts` above this is refused: it is a flaky fault, and the flaky search's job.
pub const MAX_ATTEMPTS: u32 = 100;

/// Checks `[repro]` beyond its types; `text` is the file, for the position of a key.
pub(super) fn check(path: &Path, text: &str, repro: &ReproSection) -> Result<(), ConfigError> {
    if repro.attempts == 0 {
        // Point at the key itself, as a parse error would.
        let offset = text
            .match_indices("attempts")
            .map(|(i, _)| i)
            .find(|&i| {
                text[..i]
                    .rfind("repro]")
                    .is_some_and(|r| !text[r..i].contains("\n["))
            })
            .unwrap_or(0);
        let (line, column) = line_column(text, offset);
        return Err(ConfigError::Parse {
            path: path.to_path_buf(),
            line,
            column,
            message: "[repro] attempts must be at least 1".into(),
        });
    }
    let refused = |message: String| {
        Err(ConfigError::Search {
            path: path.to_path_buf(),
            message,
        })
    };
    if repro.attempts > MAX_ATTEMPTS {
        return refused(format!(
            "[repro] attempts = {} is more than {MAX_ATTEMPTS}: a fault that needs more runs than that is a flaky one; set [search] confidence instead",
            repro.attempts
        ));
    }
    if repro.gpus == Some(0) {
        return refused("[repro] gpus must be at least 1".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// What `[repro]` accepts and refuses.
    const ACCEPTED: &[&str] = &[
        "[repro]\ncommand = \"x\"\nattempts = 3",
        "[repro]\ncommand = \"x\"\nattempts = 100",
        "[repro]\ncommand = \"x\"\ngpus = 2",
        "[repro]\ncommand = \"x\"\nwarm = false\npreload = [\"torch\", \"triton\"]",
        "[repro]\ncommand = \"x\"\nlaunch-blocking = false\nstack-dump = false",
        "[repro]\ncommand = \"x\"\nenv = { A = \"1\" }\ninfra-retries = 0\nidle-timeout = \"5s\"",
    ];
    const REFUSED: &[(&str, &str)] = &[
        (
            "[repro]\ncommand = \"x\"\nattempts = 0",
            "bisect.toml:3:1: [repro] attempts must be at least 1",
        ),
        (
            "[repro]\ncommand = \"x\"\nattempts = 101",
            "[repro] attempts = 101 is more than 100",
        ),
        (
            "[repro]\ncommand = \"x\"\ngpus = 0",
            "[repro] gpus must be at least 1",
        ),
        (
            "[repro]\ncommand = \"x\"\nretries = 2",
            "unknown field `retries`",
        ),
        ("[repro]\ntimeout = \"1m\"", "missing field `command`"),
        ("[repro]\ncommand = \"x\"\nwarm = \"yes\"", "invalid type"),
    ];

    #[test]
    fn the_repro_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
