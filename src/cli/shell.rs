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

/// Prints the man page (roff): the top-level page, then a section per subcommand with its synopsis and
/// every option, so one page documents the whole command line.
pub fn man() -> CommandResult {
    let internal = |e: std::io::Error| CommandError::new(ErrorKind::Internal, e);
    let top = Cli::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(top.clone())
        .render(&mut out)
        .map_err(internal)?;
    let mut page = String::from_utf8_lossy(&out).into_owned();
    for sub in top.get_subcommands() {
        let name = sub.get_name().to_string();
        // The subcommands live in this page, not in pages of their own.
        page = page.replace(
            &format!("cudabisect\\-{}(1)", name.replace('-', "\\-")),
            &format!("cudabisect {name}"),
        );
        let sub = sub.clone().bin_name(format!("cudabisect {name}"));
        let man = clap_mangen::Man::new(sub.clone());
        let mut part = Vec::new();
        man.render_synopsis_section(&mut part).map_err(internal)?;
        man.render_description_section(&mut part)
            .map_err(internal)?;
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut part).map_err(internal)?;
        }
        let part = String::from_utf8_lossy(&part)
            .replace(".SH SYNOPSIS", "")
            .replace(".SH DESCRIPTION", "")
            .replace(".SH OPTIONS", ".SS Options");
        page.push_str(&format!(".SH \"COMMAND: {}\"\n{part}", name.to_uppercase()));
    }
    print_stdout(&page);
    Ok(exit_codes::OK)
}
