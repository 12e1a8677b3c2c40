//! The command line, owned by the binary: the clap definition, one module per subcommand, the error type
//! and the documented exit codes. The library never imports any of it.

mod args;
mod bundle;
mod classify;
mod common;
mod demo;
mod dispatch;
mod error;
mod exit_codes;
mod harness;
mod init;
mod log;
mod nightly;
mod reference;
mod shell;
mod shrink;
mod start;
mod triage;

pub use dispatch::main;
