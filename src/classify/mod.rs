//! Fault signatures: turn (exit status, timeout, captured output) into a class plus the details that tell
//! two bugs of one class apart, and decide whether two signatures are the same bug.

pub mod kernel_name;
mod matcher;
mod patterns;
pub mod sanitizer;
mod signature;
pub mod trailer;

pub use matcher::{MatchPolicy, MatchPolicyError, Sameness};
pub use patterns::{classify, is_fault_line};
pub use signature::{Exit, FaultClass, Signature};
pub use trailer::LOG_TRAILER_PREFIX;
