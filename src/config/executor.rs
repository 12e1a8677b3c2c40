//! `[executor]`: where probes' builds and repros run (this machine, or Slurm allocations).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values::{duration, opt_duration};

/// `[executor]`: where probes' builds and repros run.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExecutorSection {
    /// `local` (the default: processes on this machine) or `slurm` (a Slurm allocation per probe, its
    /// build and repro run in it as job steps).
    #[serde(default)]
    pub kind: ExecutorKind,
    /// Slurm partition (`--partition`).
    pub partition: Option<String>,
    /// Slurm account (`--account`).
    pub account: Option<String>,
    /// Generic resources per allocation (`--gres`, e.g. `gpu:2`); default `gpu:<gpus-per-probe>`. `""`
    /// asks for none.
    pub gres: Option<String>,
    /// Slurm's own time limit per allocation (`--time`); default: the probe's build and repro runs
    /// (retries included) plus 5 minutes. Queue time never counts toward the repro's timeout, which
    /// cudabisect keeps itself.
    #[serde(default, deserialize_with = "opt_duration")]
    pub time: Option<Duration>,
    /// Extra `sbatch` arguments, as given.
    #[serde(default)]
    pub sbatch_args: Vec<String>,
    /// A directory the compute nodes see (a shared filesystem): probe worktrees and the allocations'
    /// output files go there instead of the repository's `.git/cudabisect/`.
    pub workdir: Option<PathBuf>,
    /// How long an allocation may wait in the queue for a reason that means it cannot start (its nodes
    /// down or drained, a partition down) before the probe is an infrastructure failure. Default 1 hour.
    #[serde(
        default = "default_stuck_timeout",
        deserialize_with = "duration",
        rename = "stuck-timeout"
    )]
    pub stuck_timeout: Duration,
}

fn default_stuck_timeout() -> Duration {
    Duration::from_secs(60 * 60)
}

/// `[executor] kind`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// Processes on this machine.
    #[default]
    Local,
    /// Slurm jobs.
    Slurm,
}

#[cfg(test)]
mod tests {
    /// What `[executor]` accepts and refuses.
    const ACCEPTED: &[&str] = &[
        "[executor]\nkind = \"local\"",
        "[executor]\nkind = \"slurm\"\npartition = \"gpu\"\naccount = \"ml\"\ntime = \"2h\"\nsbatch-args = [\"--qos=high\"]",
        "[executor]\nkind = \"slurm\"\ngres = \"\"\nworkdir = \"/shared/scratch\"\nstuck-timeout = \"10m\"",
    ];
    const REFUSED: &[(&str, &str)] = &[
        (
            "[executor]\nkind = \"kubernetes\"",
            "unknown variant `kubernetes`",
        ),
        (
            "[executor]\nkind = \"slurm\"\ntime = \"soon\"",
            "invalid duration",
        ),
        ("[executor]\ngres = 2", "invalid type"),
        ("[executor]\nnodes = 2", "unknown field `nodes`"),
    ];

    #[test]
    fn the_executor_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
