//! The one error type of every command: what went wrong, and which documented exit code it maps to.

use std::error::Error;
use std::fmt;

use super::exit_codes;

/// Which exit code an error maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad usage, config or model.
    Usage,
    /// A backend or tool is not available here.
    Unavailable,
    /// Another run holds the state directory.
    Locked,
    /// cudabisect, git or the disk failed.
    Internal,
    /// Ctrl-C or SIGTERM.
    Interrupted,
}

/// An error a command returns: printed as one `error:` line with its causes, mapped to an exit code.
#[derive(Debug)]
pub struct CommandError {
    /// The exit code's meaning.
    pub kind: ErrorKind,
    /// What happened.
    pub error: Box<dyn Error + Send + Sync>,
}

impl CommandError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            kind,
            error: error.into(),
        }
    }

    /// A usage error with a message.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Usage, message.into())
    }

    /// The documented exit code.
    pub fn exit_code(&self) -> u8 {
        match self.kind {
            ErrorKind::Usage => exit_codes::USAGE,
            ErrorKind::Unavailable => exit_codes::UNAVAILABLE,
            ErrorKind::Locked => exit_codes::LOCKED,
            ErrorKind::Internal => exit_codes::INTERNAL,
            ErrorKind::Interrupted => exit_codes::INTERRUPTED,
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        let mut source = self.error.source();
        while let Some(s) = source {
            // thiserror's `transparent` and `{source}` messages repeat their cause: print each once.
            let text = s.to_string();
            if !self.error.to_string().contains(&text) {
                write!(f, ": {text}")?;
            }
            source = s.source();
        }
        Ok(())
    }
}

impl From<cudabisect::run::plan::RunError> for CommandError {
    fn from(e: cudabisect::run::plan::RunError) -> Self {
        use cudabisect::run::plan::RunError;
        let kind = match &e {
            // Only another run holding the lock is 7 (a script may retry on it); a lock that cannot be
            // made (a read-only checkout, a directory in its place) is the user's to fix.
            RunError::Locked(cudabisect::run::lock::LockError::Held { .. }) => ErrorKind::Locked,
            RunError::Locked(_) => ErrorKind::Usage,
            RunError::Unavailable(_) => ErrorKind::Unavailable,
            RunError::Interrupted => ErrorKind::Interrupted,
            e if e.is_usage() => ErrorKind::Usage,
            _ => ErrorKind::Internal,
        };
        Self::new(kind, e)
    }
}

impl From<cudabisect::harness::HarnessError> for CommandError {
    fn from(e: cudabisect::harness::HarnessError) -> Self {
        use cudabisect::harness::HarnessError;
        let kind = match &e {
            HarnessError::Unavailable(_) => ErrorKind::Unavailable,
            HarnessError::Model(_) | HarnessError::Usage(_) | HarnessError::Compile(_) => {
                ErrorKind::Usage
            }
            HarnessError::Io(_) => ErrorKind::Internal,
        };
        Self::new(kind, e)
    }
}

/// What a command returns: its exit code on success (some successes are not 0: `classify` finding a
/// failure), or the error.
pub type CommandResult = Result<u8, CommandError>;
