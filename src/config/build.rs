//! `[build]`: how a probe commit is built, and whether its worktree gets a virtual environment.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::values::{timeout, CommandLine};

fn default_build_timeout() -> Duration {
    Duration::from_secs(20 * 60)
}

/// `[build]`: how to build a probe commit. Optional: without it nothing is built.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BuildSection {
    /// The build command, run in the probe worktree.
    pub command: CommandLine,
    /// Time allowed for one build.
    #[serde(default = "default_build_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Remove untracked and ignored files before each build (cold but clean builds).
    #[serde(default)]
    pub clean: bool,
    /// Build and run each worktree in a Python virtual environment of its own, layered over the user's
    /// (`--system-site-packages`), so `pip install -e .` never writes into the user's environment.
    /// Default: on when the build command installs a Python package into the running interpreter.
    #[serde(default)]
    pub venv: Option<bool>,
    /// Run a Python build command (`python3 setup.py build_ext --inplace`, `python3 -m pkg.build`) in a
    /// child of a warm interpreter of its own, as Python repros are (`[repro] warm`): what it imports
    /// from outside the worktree (torch, its extension builder) is imported once per worker, not once
    /// per commit. Other commands run as they are.
    #[serde(default = "yes")]
    pub warm: bool,
}

fn yes() -> bool {
    true
}

impl BuildSection {
    /// Whether worktrees get a virtual environment of their own.
    pub fn uses_venv(&self) -> bool {
        self.venv
            .unwrap_or_else(|| installs_into_python(&self.command))
    }
}

/// Whether a build command installs a Python package into the interpreter it finds (`pip install`,
/// `python -m pip install`, `uv pip install`, `setup.py develop|install`), not into a directory it names.
pub fn installs_into_python(command: &CommandLine) -> bool {
    static INSTALL: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(^|[\s/;&|])(pip3?(\.\d+)?\s+install|-m\s+pip\s+install|uv\s+pip\s+install|setup\.py\s+(develop|install))\b")
            .expect("pattern")
    });
    static ELSEWHERE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\s(--target|-t|--prefix|--root)(\s|=)").expect("pattern")
    });
    let text = match command {
        CommandLine::Shell(s) => s.clone(),
        CommandLine::Argv(v) => v.join(" "),
    };
    INSTALL.is_match(&text) && !ELSEWHERE.is_match(&text)
}

#[cfg(test)]
mod tests {
    /// What `[build]` accepts and refuses.
    const ACCEPTED: &[&str] = &[
        "[build]\ncommand = \"make -j8\"",
        "[build]\ncommand = \"pip install -e .\"\nvenv = false\nclean = true\ntimeout = \"30m\"",
        "[build]\ncommand = [\"cmake\", \"--build\", \"build\"]\nenv = { CC = \"gcc\" }",
        "[build]\ncommand = \"python3 setup.py build_ext --inplace\"\nwarm = false",
    ];
    const REFUSED: &[(&str, &str)] = &[
        ("[build]\ntimeout = \"1m\"", "missing field `command`"),
        ("[build]\ncommand = \"make\"\nenv = 3", "invalid type"),
        ("[build]\ncommand = \"make\"\nwarm = 1", "invalid type"),
        (
            "[build]\ncommand = \"make\"\njobs = 4",
            "unknown field `jobs`",
        ),
    ];

    #[test]
    fn the_build_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
