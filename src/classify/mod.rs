//! Fault signatures: turn (exit status, timeout, captured output) into a class plus the details that tell
//! two bugs of one class apart, and decide whether two signatures are the same bug.

pub mod kernel_name;
mod matcher;
mod patterns;
mod ranks;
pub mod sanitizer;
mod signature;
pub mod trailer;

pub use matcher::{MatchPolicy, MatchPolicyError, Sameness};
pub use patterns::{is_fault_line, signal_name};
pub use ranks::{append_rank_logs, classify, strip_rank, RankStreams};
pub use signature::{Exit, FaultClass, Signature};
pub use trailer::LOG_TRAILER_PREFIX;
