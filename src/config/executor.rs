//! `[executor]`: where probes' builds and repros run (this machine, or Slurm allocations), read into a
//! closed type: the settings of the kind written, and a key of another kind refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;
use super::values::opt_duration;

/// `[executor]`, checked: where probes run, with that kind's settings only.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(try_from = "RawExecutor")]
pub struct ExecutorSection {
    /// Where builds and repros run, and how.
    pub kind: ExecutorKind,
    /// A directory the compute nodes see (a shared filesystem): probe worktrees and the allocations'
    /// output files go there instead of the repository's `.git/cudabisect/`. Any kind may set it.
    pub workdir: Option<PathBuf>,
}

impl ExecutorSection {
    /// `workdir` made absolute once, against the repository root (`~` expanded, a relative path taken
    /// from the root, as every path in the config is), and refused when it cannot hold worktrees outside
    /// the user's working tree. Writes nothing that stays.
    pub fn resolve_workdir(&mut self, root: &Path) -> Result<(), ConfigError> {
        if let Some(dir) = self.workdir.take() {
            self.workdir = Some(resolve_workdir(&dir, root)?);
        }
        Ok(())
    }
}

/// `[executor] kind`, with the settings of that kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ExecutorKind {
    /// Processes on this machine (the default).
    #[default]
    Local,
    /// A Slurm allocation per probe, its build and repro run in it as job steps.
    Slurm(SlurmSettings),
}

/// `[executor]` with `kind = "slurm"`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmSettings {
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
    pub time: Option<Duration>,
    /// Extra `sbatch` arguments, as given.
    pub sbatch_args: Vec<String>,
    /// How long an allocation may wait in the queue for a reason that means it cannot start (its nodes
    /// down or drained, a partition down) before the probe is an infrastructure failure. Default 1 hour.
    pub stuck_timeout: Duration,
}

/// `[executor]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawExecutor {
    #[serde(default)]
    kind: KindName,
    partition: Option<String>,
    account: Option<String>,
    gres: Option<String>,
    #[serde(default, deserialize_with = "opt_duration")]
    time: Option<Duration>,
    sbatch_args: Option<Vec<String>>,
    workdir: Option<PathBuf>,
    #[serde(default, deserialize_with = "opt_duration")]
    stuck_timeout: Option<Duration>,
}

/// `kind = "local" | "slurm"`.
#[derive(Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum KindName {
    #[default]
    Local,
    Slurm,
}

fn default_stuck_timeout() -> Duration {
    Duration::from_secs(60 * 60)
}

impl TryFrom<RawExecutor> for ExecutorSection {
    type Error = String;

    fn try_from(raw: RawExecutor) -> Result<Self, String> {
        let kind = match raw.kind {
            KindName::Local => {
                // A Slurm key under the local executor would be ignored: a config that says one thing
                // and does another.
                let slurm_keys = [
                    ("partition", raw.partition.is_some()),
                    ("account", raw.account.is_some()),
                    ("gres", raw.gres.is_some()),
                    ("time", raw.time.is_some()),
                    ("sbatch-args", raw.sbatch_args.is_some()),
                    ("stuck-timeout", raw.stuck_timeout.is_some()),
                ];
                if let Some((key, _)) = slurm_keys.iter().find(|(_, set)| *set) {
                    return Err(format!(
                        "[executor] {key} is for kind = \"slurm\", and probes run on this machine: set kind = \"slurm\", or remove {key}"
                    ));
                }
                ExecutorKind::Local
            }
            KindName::Slurm => ExecutorKind::Slurm(SlurmSettings {
                partition: raw.partition,
                account: raw.account,
                gres: raw.gres,
                time: raw.time,
                sbatch_args: raw.sbatch_args.unwrap_or_default(),
                stuck_timeout: raw.stuck_timeout.unwrap_or_else(default_stuck_timeout),
            }),
        };
        Ok(Self {
            kind,
            workdir: raw.workdir,
        })
    }
}

fn resolve_workdir(dir: &Path, root: &Path) -> Result<PathBuf, ConfigError> {
    let refuse = |why: String| {
        ConfigError::Executor(format!("[executor] workdir = \"{}\" {why}", dir.display()))
    };
    if dir.as_os_str().is_empty() {
        return Err(refuse(
            "is empty: name a directory outside the repository, or leave workdir out".into(),
        ));
    }
    let home = || std::env::var_os("HOME").map(PathBuf::from);
    let expanded = match dir.strip_prefix("~") {
        Ok(rest) => home()
            .ok_or_else(|| refuse("starts with ~, and HOME is not set".into()))?
            .join(rest),
        Err(_) => dir.to_path_buf(),
    };
    let absolute = if expanded.is_absolute() {
        expanded
    } else {
        root.join(expanded)
    };
    // Compared through the nearest directory that exists, so a link or `..` cannot hide the checkout.
    let mut existing = absolute.as_path();
    while !existing.exists() {
        existing = existing.parent().unwrap_or(Path::new("/"));
    }
    let real = existing
        .canonicalize()
        .map_err(|e| refuse(format!("cannot be read: {e}")))?;
    let real_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let rest = absolute.strip_prefix(existing).unwrap_or(Path::new(""));
    if real.join(rest).starts_with(&real_root) {
        return Err(refuse(format!(
            "is inside the repository's working tree ({}): probe worktrees there would show up in the checkout; give a directory outside it",
            real_root.display()
        )));
    }
    if !real.is_dir() {
        return Err(refuse(format!(
            "is not a directory ({} is a file)",
            real.display()
        )));
    }
    // Tried, not guessed from permission bits (root may "write" /proc, which takes no directory): a
    // directory made and removed at once in the nearest one that exists.
    if let Err(e) = tempfile::Builder::new()
        .prefix(".cudabisect-check-")
        .tempdir_in(&real)
    {
        return Err(refuse(format!(
            "cannot be written ({}: {e})",
            real.display()
        )));
    }
    Ok(real.join(rest))
}

#[cfg(test)]
mod tests {
    /// What `[executor]` accepts and refuses.
    const ACCEPTED: &[&str] = &[
        "[executor]\nkind = \"local\"",
        "[executor]\nworkdir = \"/fast/scratch\"",
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
        ("[executor]\nkind = \"slurm\"\ngres = 2", "invalid type"),
        (
            "[executor]\npartition = \"gpu\"",
            "[executor] partition is for kind = \"slurm\"",
        ),
        (
            "[executor]\nkind = \"local\"\nsbatch-args = []",
            "[executor] sbatch-args is for kind = \"slurm\"",
        ),
        ("[executor]\nnodes = 2", "unknown field `nodes`"),
    ];

    #[test]
    fn the_executor_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
