//! The jobs the binary runs, each a short pipeline over a workspace: `start`, `nightly`, `shrink` and
//! `triage` on their own, and `init`. A job uses the search, the probes and the stages; no job imports
//! another (`start` and `nightly` share the bisection, `run::bisection`).

pub mod init;
pub mod nightly;
pub mod shrink;
pub mod start;
pub mod triage;
