//! `bisect.toml`: how to build a probe and how to run the GPU repro, parsed strictly (unknown keys and wrong
//! types are errors with file, line and column) into checked settings.

mod build;
mod error;
mod executor;
mod repro;
mod search;
mod shrink;
mod stages;
mod values;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::classify::MatchPolicy;

use error::line_column;

pub use build::{installs_into_python, BuildSection};
pub use error::ConfigError;
pub use executor::{ExecutorKind, ExecutorSection, SlurmSettings};
pub use repro::{ReproSection, MAX_ATTEMPTS};
pub use search::{
    runs_for_confidence, DeviceId, FlakySettings, Jobs, SearchSection, WorkerSettings,
};
pub use shrink::{Harness, ShrinkFramework, ShrinkSection};
pub use stages::{BundleSection, NightlySection, TriageSection};
pub use values::CommandLine;

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    build: Option<BuildSection>,
    repro: ReproSection,
    #[serde(default)]
    search: SearchSection,
    #[serde(default)]
    triage: TriageSection,
    shrink: Option<ShrinkSection>,
    #[serde(default)]
    bundle: BundleSection,
    #[serde(default)]
    nightly: NightlySection,
    #[serde(default)]
    executor: ExecutorSection,
}

/// Checked settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// The file's text, copied into the run's records.
    pub text: String,
    /// Build settings, when there is a build step.
    pub build: Option<BuildSection>,
    /// Repro settings.
    pub repro: ReproSection,
    /// Same-bug policy.
    pub match_policy: MatchPolicy,
    /// Parallel probes: `[search] jobs`, `devices`, `gpus-per-probe`.
    pub workers: WorkerSettings,
    /// Flaky faults: `[search] endpoint-runs`, `confidence`, `max-runs`.
    pub flaky: FlakySettings,
    /// Triage settings.
    pub triage: TriageSection,
    /// The `[shrink]` section as written, when there is one (see [`Config::shrink_section`]).
    pub shrink: Option<ShrinkSection>,
    /// Bundle settings.
    pub bundle: BundleSection,
    /// Nightly-job settings.
    pub nightly: NightlySection,
    /// Where builds and repros run.
    pub executor: ExecutorSection,
}

impl Config {
    /// The repro's `env` with a stage's own (`[triage] env`, `[shrink] env`) over it: a stage runs the
    /// repro's code, which needs what the repro was given (its `PYTHONPATH`, its data paths, its flags).
    pub fn repro_env_under(
        &self,
        stage: &std::collections::BTreeMap<String, String>,
    ) -> std::collections::BTreeMap<String, String> {
        let mut env = self.repro.env.clone();
        env.extend(stage.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    /// The shrink to run at the first bad commit: the `[shrink]` section unless it says
    /// `enabled = false`, and with no section a capture of the repro command.
    pub fn shrink_section(&self) -> Option<ShrinkSection> {
        match &self.shrink {
            Some(section) => section.enabled.then(|| section.clone()),
            None => Some(ShrinkSection::implicit()),
        }
    }

    /// Where a job's config is: an explicit path as given (relative to the current directory, as every
    /// other path on the command line); else `bisect.toml` at the repository root; else the root's
    /// `pyproject.toml` when it has a `[tool.cudabisect]` table. bisect.toml wins when both exist.
    pub fn find(root: &Path, given: Option<&Path>) -> Result<PathBuf, ConfigError> {
        if let Some(path) = given {
            return Ok(path.to_path_buf());
        }
        let own = root.join("bisect.toml");
        if own.exists() {
            return Ok(own);
        }
        let pyproject = root.join("pyproject.toml");
        if std::fs::read_to_string(&pyproject).is_ok_and(|t| has_tool_section(&t)) {
            return Ok(pyproject);
        }
        Err(ConfigError::Missing {
            root: root.to_path_buf(),
        })
    }

    /// The config of a job on the repository at `root`: found ([`Config::find`]), read and checked, and
    /// resolved against the root (`[executor] workdir` made absolute once, here). Writes nothing.
    pub fn load_at(root: &Path, given: Option<&Path>) -> Result<Self, ConfigError> {
        let path = Self::find(root, given)?;
        let mut config = Self::load(&path)?;
        config.executor.resolve_workdir(root)?;
        Ok(config)
    }

    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Checks config text; `path` names it in errors. A file named `pyproject.toml` is read for its
    /// `[tool.cudabisect]` table, with the same keys, checks and errors (lines and columns of the whole
    /// file); its records then hold that table alone, written as a bisect.toml.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let parse_error = |e: toml::de::Error| {
            let (line, column) = e
                .span()
                .map(|s| line_column(text, s.start))
                .unwrap_or((1, 1));
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().trim().to_string(),
            }
        };
        if is_pyproject(path) {
            let doc: Pyproject = toml::from_str(text).map_err(parse_error)?;
            let no_section = || ConfigError::NoToolSection {
                path: path.to_path_buf(),
            };
            let raw = doc.tool.and_then(|t| t.cudabisect).ok_or_else(no_section)?;
            // The table alone, as the bisect.toml it stands for: what the records, the bundle and the
            // journal's fingerprint see, so editing the rest of pyproject.toml changes none of them.
            let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
            let own = table
                .get("tool")
                .and_then(|t| t.get("cudabisect"))
                .and_then(toml::Value::as_table)
                .ok_or_else(no_section)?;
            let standalone = toml::to_string(own).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                line: 1,
                column: 1,
                message: format!("[tool.cudabisect] cannot be written as bisect.toml: {e}"),
            })?;
            return Self::checked(path, raw, text, standalone);
        }
        let raw: RawConfig = toml::from_str(text).map_err(parse_error)?;
        Self::checked(path, raw, text, text.to_string())
    }

    /// Checks what was read, section by section; `text` is the file (for positions), `record` what the
    /// run keeps of it.
    fn checked(
        path: &Path,
        raw: RawConfig,
        text: &str,
        record: String,
    ) -> Result<Self, ConfigError> {
        repro::check(path, text, &raw.repro)?;
        let (match_policy, flaky, workers) = search::settings(path, raw.search, raw.repro.gpus)?;
        if let Some(shrink) = &raw.shrink {
            shrink::check(shrink).map_err(|message| ConfigError::Shrink {
                path: path.to_path_buf(),
                message,
            })?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            text: record,
            build: raw.build,
            repro: raw.repro,
            match_policy,
            flaky,
            workers,
            triage: raw.triage,
            shrink: raw.shrink,
            bundle: raw.bundle,
            nightly: raw.nightly,
            executor: raw.executor,
        })
    }
}

/// Whether a config path is a Python project's `pyproject.toml` (read for `[tool.cudabisect]`).
pub fn is_pyproject(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "pyproject.toml")
}

/// Whether a `pyproject.toml`'s text has a `[tool.cudabisect]` table (true when it does not parse but
/// mentions one, so its parse error is what the user sees).
pub fn has_tool_section(text: &str) -> bool {
    match text.parse::<toml::Table>() {
        Ok(table) => table
            .get("tool")
            .and_then(|t| t.get("cudabisect"))
            .is_some(),
        Err(_) => text.contains("tool.cudabisect"),
    }
}

/// A `pyproject.toml`: only `[tool.cudabisect]` is read; every other table belongs to other tools.
#[derive(Deserialize)]
struct Pyproject {
    tool: Option<PyprojectTools>,
}

/// `[tool]` of a `pyproject.toml`.
#[derive(Deserialize)]
struct PyprojectTools {
    cudabisect: Option<RawConfig>,
}

/// Checks a section's table of accepted and refused inputs. Each text is a whole file, with a minimal
/// `[repro]` put first unless it has its own: each accepted one parses, each refused one fails with a
/// message that holds the given words.
#[cfg(test)]
fn assert_table(accepted: &[&str], refused: &[(&str, &str)]) {
    let whole = |text: &str| {
        if text.contains("[repro]") {
            text.to_string()
        } else {
            format!("[repro]\ncommand = \"python3 train.py\"\n{text}")
        }
    };
    for text in accepted {
        if let Err(e) = Config::parse(Path::new("bisect.toml"), &whole(text)) {
            panic!("refused, but should be accepted:\n{text}\n-> {e}");
        }
    }
    for (text, words) in refused {
        match Config::parse(Path::new("bisect.toml"), &whole(text)) {
            Ok(_) => panic!("accepted, but should be refused:\n{text}"),
            Err(e) => assert!(
                e.to_string().contains(words),
                "refused, but not with {words:?}:\n{text}\n-> {e}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("bisect.toml"), text)
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse("[repro]\ncommand = \"python step.py\"\n").unwrap();
        assert!(c.build.is_none());
        assert_eq!(c.repro.command, CommandLine::Shell("python step.py".into()));
        assert_eq!(c.repro.timeout, Duration::from_secs(600));
        assert!(c.repro.launch_blocking);
        assert_eq!(c.match_policy.describe(), "class+kernel");
    }

    #[test]
    fn an_empty_command_says_which_part_is_empty() {
        let err = |command: &str| {
            parse(&format!("[repro]\ncommand = {command}\n"))
                .unwrap_err()
                .to_string()
        };
        assert!(err("[]").ends_with("the command array is empty"));
        assert!(err("[\"\", \"x\"]").ends_with("the command's program (its first word) is empty"));
        assert!(err("\"  \"").ends_with("the command is empty"));
    }

    #[test]
    fn zero_attempts_are_reported_at_the_key() {
        let text = "[build]\ncommand = \"make\"\n\n[repro]\ncommand = \"./r.sh\"\nattempts = 0\n";
        let e = Config::parse(Path::new("b.toml"), text)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b.toml:6:1: [repro] attempts must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn a_build_that_installs_into_the_running_python_gets_a_venv_by_default() {
        let shell = |s: &str| CommandLine::Shell(s.into());
        for yes in [
            "pip install -e . --no-deps -q",
            "python -m pip install .",
            "cd sub && pip3 install -e .",
            "uv pip install -e .",
            "python setup.py develop",
            "/opt/conda/bin/pip install .",
        ] {
            assert!(installs_into_python(&shell(yes)), "{yes}");
        }
        for no in [
            "make -j8",
            "pip install --target build/site .",
            "pip install --prefix=/tmp/p .",
            "python setup.py build_ext --inplace",
            "echo pip installation notes",
        ] {
            assert!(!installs_into_python(&shell(no)), "{no}");
        }
        assert!(installs_into_python(&CommandLine::Argv(vec![
            "pip".into(),
            "install".into(),
            "-e".into(),
            ".".into()
        ])));
        let config = parse(
            "[build]\ncommand = \"pip install -e .\"\nvenv = false\n[repro]\ncommand = \"x\"\n",
        )
        .unwrap();
        assert!(
            !config.build.unwrap().uses_venv(),
            "an explicit venv = false stands"
        );
        let config =
            parse("[build]\ncommand = \"make\"\nvenv = true\n[repro]\ncommand = \"x\"\n").unwrap();
        assert!(config.build.unwrap().uses_venv());
    }

    #[test]
    fn the_jax_and_keras_frameworks_need_their_factories_and_take_no_pytorch_keys() {
        let base = "[repro]\ncommand = \"python3 train.py\"\n[shrink]\n";
        let ok = parse(&format!(
            "{base}framework = \"jax\"\nfunction = \"m:step\"\ninputs = \"m:inputs\"\n"
        ))
        .unwrap();
        let shrink = ok.shrink.unwrap();
        assert_eq!(shrink.framework, ShrinkFramework::Jax);
        assert!(!shrink.captures(), "factories, not a capture");
        parse(&format!(
            "{base}framework = \"keras\"\nmodel = \"m:build\"\ninputs = \"m:x\"\ntrain = true\n"
        ))
        .unwrap();
        for (extra, says) in [
            (
                "framework = \"jax\"\ninputs = \"m:inputs\"\n",
                "needs function",
            ),
            (
                "framework = \"keras\"\nmodel = \"m:build\"\n",
                "needs model",
            ),
            (
                "framework = \"jax\"\nfunction = \"m:f\"\ninputs = \"m:i\"\nmodel = \"m:b\"\n",
                "not model",
            ),
            (
                "framework = \"jax\"\nfunction = \"m:f\"\ninputs = \"m:i\"\ntrain = true\n",
                "train and loss are for models",
            ),
            (
                "framework = \"keras\"\nmodel = \"m:b\"\ninputs = \"m:i\"\noptimizer = \"m:o\"\n",
                "takes no optimizer",
            ),
            // An explicit train = false beside a loss is a contradiction, not a training step (SK04).
            (
                "framework = \"keras\"\nmodel = \"m:b\"\ninputs = \"m:i\"\ntrain = false\nloss = \"m:loss\"\n",
                "train = false shrinks the forward pass alone",
            ),
            (
                "model = \"m:b\"\ninputs = \"m:i\"\ntrain = false\noptimizer = \"m:o\"\n",
                "train = false shrinks the forward pass alone",
            ),
            (
                "framework = \"keras\"\nmodel = \"m:b\"\ninputs = \"m:i\"\ncapture = true\n",
                "leave harness, capture and step out",
            ),
            ("function = \"m:f\"\n", "function is for framework"),
            ("framework = \"tensorflow\"\n", "unknown variant"),
        ] {
            let e = parse(&format!("{base}{extra}")).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
    }

    #[test]
    fn full_config_is_read() {
        let c = parse(
            "[build]\ncommand = [\"make\", \"-j8\"]\ntimeout = \"20m\"\nenv = { CC = \"gcc\" }\nclean = true\n\
             [repro]\ncommand = [\"./run\"]\ntimeout = \"90s\"\nlaunch-blocking = false\n\
             [search]\nmatch = \"class\"\n[triage]\nenabled = false\n",
        )
        .unwrap();
        let b = c.build.unwrap();
        assert_eq!(
            b.command,
            CommandLine::Argv(vec!["make".into(), "-j8".into()])
        );
        assert_eq!(
            (b.timeout, b.clean, b.env["CC"].as_str()),
            (Duration::from_secs(1200), true, "gcc")
        );
        assert_eq!(c.repro.timeout, Duration::from_secs(90));
        assert!(!c.repro.launch_blocking && !c.triage.enabled);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_line_and_column() {
        let e = parse("[repro]\ncommand = \"x\"\ncomand = \"y\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bisect.toml:3:1: unknown field `comand`"),
            "{e}"
        );
        let e = parse("[repro]\ncommand = 5\n").unwrap_err().to_string();
        assert!(e.starts_with("bisect.toml:2:11:"), "{e}");
        let e = parse("[repro]\ncommand = \"x\"\ntimeout = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bisect.toml:3:11") && e.contains("invalid duration"),
            "{e}"
        );
        let e = parse("[build]\ncommand = []\n[repro]\ncommand = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
        assert!(parse("[build]\ncommand = \"make\"\n")
            .unwrap_err()
            .to_string()
            .contains("repro"));
        assert!(parse("[repro]\ncommand = \"x\"\n[search]\nmatch = \"nope\"\n").is_err());
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../bisect.toml.example");
        parse(text).expect("bisect.toml.example is valid");
    }

    fn pyproject(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("proj/pyproject.toml"), text)
    }

    const PYPROJECT: &str = "[project]\nname = \"mylib\"\nversion = \"0.1\"\n\n[tool.ruff]\nline-length = 100\n\n[tool.cudabisect.repro]\ncommand = \"python3 train.py\"\ntimeout = \"5m\"\n\n[tool.cudabisect.search]\nmatch = \"class\"\n";

    #[test]
    fn pyproject_tool_table_reads_like_bisect_toml() {
        let from_py = pyproject(PYPROJECT).unwrap();
        let own = parse("[repro]\ncommand = \"python3 train.py\"\ntimeout = \"5m\"\n[search]\nmatch = \"class\"\n").unwrap();
        assert_eq!(format!("{:?}", from_py.repro), format!("{:?}", own.repro));
        assert_eq!(
            format!("{:?}", from_py.match_policy),
            format!("{:?}", own.match_policy)
        );
        // What the run keeps is the table alone, as a bisect.toml that parses to the same config.
        assert!(
            !from_py.text.contains("ruff") && !from_py.text.contains("[project]"),
            "{}",
            from_py.text
        );
        let again = parse(&from_py.text).unwrap();
        assert_eq!(format!("{:?}", again.repro), format!("{:?}", own.repro));
    }

    #[test]
    fn pyproject_errors_point_into_the_whole_file() {
        let typo = PYPROJECT.replace("timeout = \"5m\"", "comand = \"x\"");
        let e = pyproject(&typo).unwrap_err().to_string();
        assert!(
            e.starts_with("proj/pyproject.toml:10:1: unknown field `comand`"),
            "{e}"
        );
        let none = pyproject("[project]\nname = \"x\"\n[tool.ruff]\nx = 1\n").unwrap_err();
        assert!(matches!(none, ConfigError::NoToolSection { .. }), "{none}");
        let zero = format!("{PYPROJECT}\n[tool.cudabisect.repro.x]\n");
        assert!(pyproject(&zero).is_err());
        let attempts = PYPROJECT.replace("timeout = \"5m\"", "attempts = 0");
        let e = pyproject(&attempts).unwrap_err().to_string();
        assert!(
            e.starts_with("proj/pyproject.toml:10:1: [repro] attempts"),
            "{e}"
        );
    }

    #[test]
    fn config_is_found_in_bisect_toml_then_pyproject() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(matches!(
            Config::find(root, None),
            Err(ConfigError::Missing { .. })
        ));
        std::fs::write(root.join("pyproject.toml"), "[project]\nname = \"x\"\n").unwrap();
        let e = Config::find(root, None).unwrap_err().to_string();
        assert!(e.contains("cudabisect init"), "{e}");
        std::fs::write(root.join("pyproject.toml"), PYPROJECT).unwrap();
        assert_eq!(
            Config::find(root, None).unwrap(),
            root.join("pyproject.toml")
        );
        std::fs::write(root.join("bisect.toml"), "[repro]\ncommand = \"x\"\n").unwrap();
        assert_eq!(Config::find(root, None).unwrap(), root.join("bisect.toml"));
        let given = Path::new("elsewhere.toml");
        assert_eq!(Config::find(root, Some(given)).unwrap(), given);
    }
}
