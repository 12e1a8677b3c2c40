//! `[search]`: the same-bug policy, flaky faults and parallel probes, checked into settings.

use serde::{Deserialize, Deserializer};

use crate::classify::MatchPolicy;

use super::error::ConfigError;
use super::values::one;

/// `[search]`: how probe outcomes steer the search.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SearchSection {
    /// Same-bug policy: `class+kernel` (default), `class`, or `regex:<pattern>`.
    #[serde(rename = "match")]
    pub match_policy: Option<String>,
    /// Probes at once: a number (a cap), or `"auto"` (the default: workers on every visible GPU, or
    /// group of `gpus-per-probe` of them, as many at once on each as its memory holds at the bad end's
    /// peak; one where no GPU is visible).
    #[serde(default)]
    pub jobs: Jobs,
    /// The GPUs to use (`CUDA_VISIBLE_DEVICES` ids); default: those visible.
    pub devices: Option<Vec<DeviceId>>,
    /// GPUs each probe needs (a multi-GPU repro); each worker gets that many of its own.
    #[serde(default = "one", rename = "gpus-per-probe")]
    pub gpus_per_probe: u32,
    /// Runs of the bad end at the start. When any of them is clean, the fault is flaky and the search is
    /// the Bayesian one. Default 1 (a fault taken to show every time).
    #[serde(default, rename = "endpoint-runs")]
    pub endpoint_runs: Option<u32>,
    /// The flaky search stops when its answer is this likely. Writing it says the fault may be flaky:
    /// the search is flaky-aware from the start.
    #[serde(default)]
    pub confidence: Option<f64>,
    /// The flaky search's budget of repro runs.
    #[serde(default = "default_max_runs", rename = "max-runs")]
    pub max_runs: u32,
}

fn default_confidence() -> f64 {
    0.99
}

fn default_max_runs() -> u32 {
    300
}

impl Default for SearchSection {
    fn default() -> Self {
        Self {
            match_policy: None,
            jobs: Jobs::Auto,
            devices: None,
            gpus_per_probe: 1,
            endpoint_runs: None,
            confidence: None,
            max_runs: default_max_runs(),
        }
    }
}

/// Runs of the bad end (all faulting) and of the culprit's parent (all clean) that make a plain answer
/// trustworthy at `confidence`: a fault that shows in at least half the runs would have shown in one of
/// them with that probability.
pub fn runs_for_confidence(confidence: f64) -> u32 {
    (1.0 / (1.0 - confidence)).log2().ceil().max(1.0) as u32
}

/// `[search] jobs`: how many probes run at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Jobs {
    /// One at a time.
    One,
    /// At most this many (fewer on a GPU whose memory holds fewer).
    Count(u32),
    /// Workers on every visible GPU (or group of `gpus-per-probe`), as many at once as memory and half
    /// the cores allow; one when no GPU is visible.
    #[default]
    Auto,
}

impl Jobs {
    /// `auto` or a number of at least 1.
    pub fn parse(text: &str) -> Result<Jobs, String> {
        if text == "auto" {
            return Ok(Jobs::Auto);
        }
        match text.parse::<u32>() {
            Ok(0) | Err(_) => Err(format!(
                "jobs: expected \"auto\" or a number of at least 1, got {text:?}"
            )),
            Ok(1) => Ok(Jobs::One),
            Ok(n) => Ok(Jobs::Count(n)),
        }
    }
}

impl<'de> Deserialize<'de> for Jobs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Any TOML value, so that a wrong one is named in the message (not serde's internal enum).
        let text = match toml::Value::deserialize(d)? {
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::String(t) => t,
            other => {
                return Err(serde::de::Error::custom(format!(
                    "jobs = {other}: give a whole number of probes at once, or \"auto\""
                )))
            }
        };
        Jobs::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A device id as `CUDA_VISIBLE_DEVICES` takes it: an index (`0`) or a UUID (`GPU-…`, `MIG-…`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceId(pub String);

impl<'de> Deserialize<'de> for DeviceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = match toml::Value::deserialize(d)? {
            toml::Value::Integer(n) if n >= 0 => n.to_string(),
            toml::Value::String(t) => t,
            other => {
                return Err(serde::de::Error::custom(format!(
                    "devices: {other} is not a device id (an index such as 0, or a UUID such as \"GPU-…\")"
                )))
            }
        };
        if text.is_empty() || text.contains([',', ' ']) {
            return Err(serde::de::Error::custom(format!(
                "devices: {text:?} is not one device id"
            )));
        }
        Ok(DeviceId(text))
    }
}
/// `[search]`'s flaky-fault settings, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlakySettings {
    /// Runs of the bad end at the start, at least 1.
    pub endpoint_runs: u32,
    /// The confidence the answer must reach, in (0.5, 1).
    pub confidence: f64,
    /// Whether the config wrote a confidence (then every answer states the one it reached).
    pub asked: bool,
    /// The budget of repro runs.
    pub max_runs: u32,
}

impl Default for FlakySettings {
    fn default() -> Self {
        Self {
            endpoint_runs: 1,
            confidence: default_confidence(),
            asked: false,
            max_runs: default_max_runs(),
        }
    }
}

/// `[search]`'s parallel-probe settings, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Probes at once.
    pub jobs: Jobs,
    /// The GPUs to use; `None`: those visible.
    pub devices: Option<Vec<String>>,
    /// GPUs per probe, at least 1.
    pub gpus_per_probe: u32,
}

/// `[search]` checked into its settings: the same-bug policy, the flaky-fault settings and the
/// parallel-probe settings. `repro_gpus` is `[repro] gpus`, `gpus-per-probe` in the repro's words.
pub(super) fn settings(
    path: &std::path::Path,
    search: SearchSection,
    repro_gpus: Option<u32>,
) -> Result<(MatchPolicy, FlakySettings, WorkerSettings), ConfigError> {
    let match_policy = MatchPolicy::parse(search.match_policy.as_deref().unwrap_or("class+kernel"))
        .map_err(|source| ConfigError::Match {
            path: path.to_path_buf(),
            source,
        })?;
    let refused = |message: String| ConfigError::Search {
        path: path.to_path_buf(),
        message,
    };
    let flaky = flaky(&search).map_err(refused)?;
    let workers = workers(search, repro_gpus).map_err(refused)?;
    Ok((match_policy, flaky, workers))
}

fn flaky(search: &SearchSection) -> Result<FlakySettings, String> {
    if search.endpoint_runs == Some(0) || search.max_runs == 0 {
        return Err("endpoint-runs and max-runs must be at least 1".into());
    }
    if let Some(c) = search.confidence {
        if !(c > 0.5 && c < 1.0) {
            return Err(format!(
                "confidence must be between 0.5 and 1 (exclusive), not {}",
                if c.is_finite() && c.abs() < 1e6 && c.abs() > 1e-6 {
                    c.to_string()
                } else {
                    format!("{c:e}")
                }
            ));
        }
    }
    // A confidence written down says the fault may not show every time: the bad end runs enough
    // times for a clean run there not to mislead at that confidence.
    let needed = search.confidence.map(runs_for_confidence);
    let endpoint_runs = match (search.endpoint_runs, needed) {
        (Some(given), Some(needed)) if given < needed => {
            return Err(format!(
                "confidence = {} needs at least {needed} runs of the bad end to tell a flaky fault, and endpoint-runs = {given}: remove endpoint-runs (cudabisect then runs it {needed} times) or raise it",
                search.confidence.unwrap_or_default()
            ));
        }
        (Some(given), _) => given,
        (None, Some(needed)) => needed,
        (None, None) => 1,
    };
    if endpoint_runs > search.max_runs {
        return Err(format!(
            "endpoint-runs = {endpoint_runs} is more than the max-runs budget ({}): raise max-runs or lower endpoint-runs",
            search.max_runs
        ));
    }
    Ok(FlakySettings {
        endpoint_runs,
        confidence: search.confidence.unwrap_or_else(default_confidence),
        asked: search.confidence.is_some(),
        max_runs: search.max_runs,
    })
}

fn workers(mut search: SearchSection, repro_gpus: Option<u32>) -> Result<WorkerSettings, String> {
    if let Some(gpus) = repro_gpus {
        if search.gpus_per_probe != 1 && search.gpus_per_probe != gpus {
            return Err(format!(
                "[repro] gpus = {gpus} and [search] gpus-per-probe = {} disagree: give one of them",
                search.gpus_per_probe
            ));
        }
        search.gpus_per_probe = gpus;
    }
    if search.gpus_per_probe == 0 {
        return Err("gpus-per-probe must be at least 1".into());
    }
    if let Some(devices) = &search.devices {
        // A device may be listed twice (two workers share it), but never twice for one probe.
        let per = search.gpus_per_probe.max(1) as usize;
        for group in devices.chunks(per) {
            let mut seen = std::collections::HashSet::new();
            if let Some(twice) = group
                .iter()
                .map(|d| d.0.clone())
                .find(|d| !seen.insert(d.clone()))
            {
                return Err(format!(
                    "devices gives GPU {twice} twice to one probe: a probe of gpus-per-probe = {per} needs {per} different GPUs"
                ));
            }
        }
    }
    if search.devices.as_ref().is_some_and(Vec::is_empty) {
        return Err(
            "devices: give at least one device, or leave it out to use those visible".into(),
        );
    }
    Ok(WorkerSettings {
        jobs: search.jobs,
        devices: search
            .devices
            .map(|d| d.into_iter().map(|DeviceId(id)| id).collect()),
        gpus_per_probe: search.gpus_per_probe,
    })
}

#[cfg(test)]
mod tests {
    /// What `[search]` accepts and refuses.
    const ACCEPTED: &[&str] = &[
        "[search]\nmatch = \"class\"",
        "[search]\nmatch = \"regex:in _gather\"",
        "[search]\njobs = 4",
        "[search]\njobs = \"auto\"",
        "[search]\ndevices = [0, \"GPU-1b2c\"]",
        "[search]\ndevices = [0, 0]",
        "[search]\ngpus-per-probe = 2\ndevices = [0, 1, 0, 1]",
        "[search]\nconfidence = 0.95",
        "[search]\nconfidence = 0.99\nendpoint-runs = 7",
        "[repro]\ncommand = \"x\"\ngpus = 2\n[search]\ngpus-per-probe = 2",
    ];
    const REFUSED: &[(&str, &str)] = &[
        ("[search]\nmatch = \"kernel-ish\"", "[search] match:"),
        (
            "[search]\njobs = 0",
            "jobs: expected \"auto\" or a number of at least 1",
        ),
        (
            "[search]\njobs = true",
            "jobs = true: give a whole number of probes at once",
        ),
        (
            "[search]\ndevices = []",
            "devices: give at least one device",
        ),
        ("[search]\ndevices = [-1]", "is not a device id"),
        ("[search]\ndevices = [\"0,1\"]", "is not one device id"),
        (
            "[search]\ngpus-per-probe = 2\ndevices = [0, 0]",
            "devices gives GPU 0 twice to one probe",
        ),
        (
            "[search]\ngpus-per-probe = 0",
            "[search] gpus-per-probe must be at least 1",
        ),
        (
            "[search]\nconfidence = 0.5",
            "confidence must be between 0.5 and 1",
        ),
        (
            "[search]\nconfidence = 0.99\nendpoint-runs = 2",
            "needs at least 7 runs of the bad end",
        ),
        (
            "[search]\nendpoint-runs = 0",
            "endpoint-runs and max-runs must be at least 1",
        ),
        (
            "[search]\nendpoint-runs = 5\nmax-runs = 3",
            "is more than the max-runs budget (3)",
        ),
        (
            "[repro]\ncommand = \"x\"\ngpus = 2\n[search]\ngpus-per-probe = 4",
            "[repro] gpus = 2 and [search] gpus-per-probe = 4 disagree",
        ),
    ];

    #[test]
    fn the_search_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
