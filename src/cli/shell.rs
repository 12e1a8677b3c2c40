//! `cudabisect completions SHELL` and `cudabisect man`: generated from the clap definition, so scripts,
//! shells and people see the same options.

use clap::CommandFactory;

use super::args::Cli;
use super::common::print_stdout;
use super::error::{CommandError, CommandResult, ErrorKind};
use super::exit_codes;

/// Prints the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell) -> CommandResult {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "cudabisect", &mut out);
    print_stdout(&String::from_utf8_lossy(&out));
    Ok(exit_codes::OK)
}

/// Prints the man page (roff).
pub fn man() -> CommandResult {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .map_err(|e| CommandError::new(ErrorKind::Internal, e))?;
    print_stdout(&String::from_utf8_lossy(&out));
    Ok(exit_codes::OK)
}
