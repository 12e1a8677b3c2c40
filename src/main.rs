//! The `cudabisect` binary: parse arguments, run, exit with the documented code.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
