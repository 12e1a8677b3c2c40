//! cudabisect: find the first commit that makes a GPU program fault, name the fault, and hand maintainers
//! a minimal repro. The binary is a thin shell over this library.

pub mod bisect;
pub mod classify;
pub mod config;
pub mod process;
