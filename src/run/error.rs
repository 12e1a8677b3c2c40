//! The one error type of the orchestration layer: what stops a run before it produces a report.

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::git::GitError;
use crate::protocol::client::ProtocolError;

use super::lock::LockError;
use super::probe::prober::PrepareError;

/// Problems that stop a run (`start`, `shrink`, `triage`) before it has a result to report.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// Repository or revision problems.
    #[error(transparent)]
    Git(#[from] GitError),
    /// Config problems.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another run holds the state directory.
    #[error(transparent)]
    Locked(#[from] LockError),
    /// A tool the run needs is not installed (compute-sanitizer).
    #[error("{0}")]
    Unavailable(String),
    /// The commit could not be checked out or built for the stage.
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    /// The harness could not be set up.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// Ctrl-C or SIGTERM stopped it before it had anything to report.
    #[error("interrupted before anything was found")]
    Interrupted,
    /// Filesystem trouble in the state directory.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl RunError {
    /// True for errors caused by the user's input.
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Usage(_) | Self::Config(_) => true,
            Self::Git(e) => e.is_usage(),
            // A harness that cannot start, describes nothing usable or does not extract is the
            // config's or the harness's to fix; failing to install the shipped one is the disk's.
            Self::Protocol(e) => !matches!(e, ProtocolError::Install { .. }),
            _ => false,
        }
    }

    /// A closure mapping an I/O error at `path` to this error.
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
