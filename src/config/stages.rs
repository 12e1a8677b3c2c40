//! `[triage]`, `[bundle]` and `[nightly]`: what runs after the search and what the nightly job calls.
//! Read by their types alone: no check beyond them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::values::{timeout, yes, CommandLine};

fn default_triage_timeout() -> Duration {
    Duration::from_secs(60 * 60)
}

/// `[bundle]`: where the hand-off bundle goes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BundleSection {
    /// Write a bundle at the end of start, shrink and triage.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The bundle root, relative to the repository root (or absolute); bundles go in `<dir>/<short sha>/`.
    /// Default: `bundles/` in the state directory under the git directory, never the working tree.
    pub dir: Option<String>,
    /// Copy the cudabisect binary into the bundle (for native-harness repros on machines without it).
    #[serde(default)]
    pub include_binary: bool,
}

impl Default for BundleSection {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: None,
            include_binary: false,
        }
    }
}

/// `[nightly]`: hooks of the nightly job.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NightlySection {
    /// Run after a night that ends in `regression` or `fixed` (chat or issue-tracker hooks the team owns),
    /// with the status and the report's paths in its environment.
    pub notify: Option<CommandLine>,
    /// Time allowed for the notify command.
    #[serde(default = "default_notify_timeout", deserialize_with = "timeout")]
    pub notify_timeout: Duration,
}

fn default_notify_timeout() -> Duration {
    Duration::from_secs(120)
}

impl Default for NightlySection {
    fn default() -> Self {
        Self {
            notify: None,
            notify_timeout: default_notify_timeout(),
        }
    }
}

/// `[triage]`: the compute-sanitizer rerun on the first bad commit.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TriageSection {
    /// Run triage at the end of `start`.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The command to sanitize; defaults to the repro command.
    pub command: Option<CommandLine>,
    /// Time allowed for one sanitizer run (they are 10–100× slower than plain runs).
    #[serde(default = "default_triage_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The compute-sanitizer executable.
    pub sanitizer: Option<String>,
}

impl Default for TriageSection {
    fn default() -> Self {
        Self {
            enabled: true,
            command: None,
            timeout: default_triage_timeout(),
            env: BTreeMap::new(),
            sanitizer: None,
        }
    }
}

#[cfg(test)]
mod tests {
    /// What `[triage]`, `[bundle]` and `[nightly]` accept and refuse.
    const ACCEPTED: &[&str] = &[
        "[triage]\nenabled = false",
        "[triage]\ncommand = \"python3 small.py\"\nsanitizer = \"/opt/cuda/bin/compute-sanitizer\"\ntimeout = \"2h\"",
        "[bundle]\ndir = \"handoff\"\ninclude-binary = true",
        "[bundle]\nenabled = false",
        "[nightly]\nnotify = \"./notify.sh\"\nnotify-timeout = \"30s\"",
    ];
    const REFUSED: &[(&str, &str)] = &[
        ("[triage]\ntimeout = \"0s\"", "a zero timeout"),
        ("[triage]\ntool = \"racecheck\"", "unknown field `tool`"),
        ("[bundle]\nenable = true", "unknown field `enable`"),
        ("[nightly]\nnotify = \"\"", "the command is empty"),
    ];

    #[test]
    fn the_stages_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
