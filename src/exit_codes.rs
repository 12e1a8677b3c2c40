//! The documented exit codes: part of the command-line API, so scripts can rely on them.

/// A first bad commit was found (or a subcommand succeeded).
pub const FOUND: i32 = 0;
/// cudabisect itself failed.
pub const INTERNAL: i32 = 1;
/// Bad usage or config: nothing was run or written.
pub const USAGE: i32 = 2;
/// GOOD does not pass or BAD does not reproduce.
pub const ENDPOINTS_INVALID: i32 = 3;
/// Skips left several candidates, or the run could not finish.
pub const INCONCLUSIVE: i32 = 4;
/// `classify`: the log shows a failure (any class but `none`).
pub const CLASSIFIED_FAILURE: i32 = 5;
/// `harness run`: a node faulted (the same code a CUDA program that checks its errors uses).
pub const NODE_FAULT: i32 = 1;
/// `harness run --backend cuda`: no CUDA driver, device or NVRTC could be used.
pub const BACKEND_UNAVAILABLE: i32 = 6;
/// Interrupted by Ctrl-C or SIGTERM.
pub const INTERRUPTED: i32 = 130;
