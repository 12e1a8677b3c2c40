//! cudabisect: find the first commit that makes a GPU program fault, name the fault, and hand maintainers
//! a minimal repro. This library holds everything but the command line, which lives in the binary.
//!
//! Layers, from the bottom: pure cores (`bisect`, `shrink`, `classify`, `marker`, `backend`,
//! `protocol::types`), edges to the
//! outside world (`git`, `process`, `harness`, `tools`, `protocol::client`), orchestration (`run`), and
//! records with their renderings (`report`).
#![warn(missing_docs)]

pub mod atomic_file;
pub mod backend;
pub mod bisect;
pub mod classify;
pub mod config;
pub mod exec;
pub mod git;
pub mod harness;
pub mod host;
pub mod marker;
pub mod protocol;
pub mod report;
pub mod run;
pub mod sample;
pub mod shrink;
