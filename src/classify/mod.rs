//! Fault signatures: turn (exit status, timeout, captured output) into a class plus the details that tell
//! two bugs of one class apart, and decide whether two signatures are the same bug.

mod matcher;
mod patterns;
pub mod sanitizer;
mod signature;

pub use matcher::{MatchPolicy, MatchPolicyError};
pub use patterns::classify;
pub use signature::{Exit, FaultClass, Signature};
