//! The command reference, docs/reference/commands.md, generated from the clap definition: every
//! subcommand's usage and options as `--help` gives them, so the docs cannot drift from the program. A
//! test compares the file with what is generated; `CUDABISECT_UPDATE_DOCS=1 cargo test` rewrites it.

use clap::CommandFactory;

use super::args::Cli;

/// The whole page.
pub fn markdown() -> String {
    let mut cli = Cli::command();
    cli.build();
    let mut out = String::from(
        "# Command reference\n\n<!-- Generated from the command-line definition (src/cli/reference.rs); do not edit. -->\n\nEvery subcommand with its options, as `cudabisect <command> --help` prints them. The exit codes are\nin [exit-codes.md](exit-codes.md); `cudabisect man` prints the same as a man page.\n",
    );
    walk(&cli, &mut out);
    out
}

fn walk(cmd: &clap::Command, out: &mut String) {
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        section(sub, out);
        walk(sub, out);
    }
}

fn section(cmd: &clap::Command, out: &mut String) {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
    out.push_str(&format!("\n## `{name}`\n\n"));
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        out.push_str(&format!("{}\n\n", about.to_string().trim()));
    }
    if cmd.has_subcommands() {
        return;
    }
    let usage = cmd.clone().render_usage().to_string();
    out.push_str(&format!(
        "```\n{}\n```\n\n",
        usage.trim().trim_start_matches("Usage: ")
    ));
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .collect();
    if args.is_empty() {
        return;
    }
    out.push_str("| argument | meaning |\n|---|---|\n");
    for arg in args {
        let mut text = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default()
            .replace('\n', " ")
            .trim()
            .to_string();
        if !text.is_empty() && !text.ends_with(['.', ':']) {
            text.push('.');
        }
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if !values.is_empty() && arg.get_action().takes_values() {
            text.push_str(&format!(" Values: {}.", values.join(", ")));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        // A flag's `false` says nothing.
        if !defaults.is_empty() && arg.get_action().takes_values() {
            text.push_str(&format!(" Default: `{}`.", defaults.join(",")));
        }
        out.push_str(&format!(
            "| `{}` | {} |\n",
            spelling(arg).replace('|', "\\|"),
            text.trim().replace('|', "\\|")
        ));
    }
}

/// How the argument is written: `-j, --jobs <N|auto>`, `<RANGE>`, `-- <PATHSPEC>...`.
fn spelling(arg: &clap::Arg) -> String {
    let value = || {
        arg.get_value_names()
            .and_then(|v| v.first())
            .map(|v| v.to_string())
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
    };
    if arg.is_positional() {
        let many = if arg.get_num_args().is_some_and(|n| n.max_values() > 1) {
            "..."
        } else {
            ""
        };
        let dashes = if arg.is_last_set() { "-- " } else { "" };
        return format!("{dashes}<{}>{many}", value());
    }
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    let takes = arg.get_action().takes_values();
    format!(
        "{}{}",
        names.join(", "),
        if takes {
            format!(" <{}>", value())
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    /// docs/reference/commands.md is what the command-line definition generates (set
    /// CUDABISECT_UPDATE_DOCS=1 to rewrite it after changing an option).
    #[test]
    fn the_command_reference_is_generated_from_the_cli() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/commands.md");
        let generated = super::markdown();
        if std::env::var_os("CUDABISECT_UPDATE_DOCS").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "docs/reference/commands.md is out of date: CUDABISECT_UPDATE_DOCS=1 cargo test --bin cudabisect reference"
        );
        for command in ["start", "init", "nightly", "bundle pack", "harness run"] {
            assert!(
                generated.contains(&format!("## `cudabisect {command}`")),
                "{command}"
            );
        }
        assert!(
            generated.contains("| `-j, --jobs <N\\|auto>` |"),
            "{generated}"
        );
    }
}
