//! Why a config could not be used: the errors of every section, each naming the file (and, for a parse
//! error, the line and column).

use std::path::PathBuf;

use crate::classify::MatchPolicyError;

/// A `[search]` message, prefixed with its section unless it names one itself (`[repro] gpus …`).
fn in_section(message: &str) -> String {
    if message.starts_with('[') {
        message.to_string()
    } else {
        format!("[search] {message}")
    }
}

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No config was found where one is looked for.
    #[error("no config: {} has no bisect.toml and its pyproject.toml no [tool.cudabisect] section; `cudabisect init -- <repro command>` writes one", root.display())]
    Missing {
        /// The repository root.
        root: PathBuf,
    },
    /// A `pyproject.toml` given as the config has no `[tool.cudabisect]` table.
    #[error("{path} has no [tool.cudabisect] section: add one (the keys of bisect.toml, under [tool.cudabisect], [tool.cudabisect.repro], …) or give a bisect.toml")]
    NoToolSection {
        /// The file.
        path: PathBuf,
    },
    /// The file is missing or unreadable.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The path tried.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys or wrong types.
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The `[shrink]` section is inconsistent.
    #[error("{path}: [shrink] {message}")]
    Shrink {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A search or repro setting is invalid (the message names its section when it is not `[search]`).
    #[error("{path}: {}", in_section(message))]
    Search {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `[executor]` cannot be used on this repository (its `workdir`); the message names the key.
    #[error("{0}")]
    Executor(String),
    /// The match policy is invalid.
    #[error("{path}: [search] match: {source}")]
    Match {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: MatchPolicyError,
    },
}

/// The 1-based line and column of a byte offset into a file's text.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
