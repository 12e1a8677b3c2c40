//! cudabisect: find the first commit that makes a GPU program fault, name the fault, and hand maintainers
//! a minimal repro. The binary is a thin shell over this library.

pub mod bisect;
pub mod bundle;
pub mod classify;
pub mod cli;
pub mod config;
pub mod demo;
pub mod environment;
pub mod events;
pub mod exit_codes;
pub mod fixture_repo;
pub mod git;
pub mod harness;
mod harness_cmd;
pub mod probe;
pub mod process;
pub mod report;
pub mod reporter;
pub mod shrink;
mod shrink_cmd;
pub mod shrink_run;
pub mod start;
pub mod triage;
mod triage_cmd;
