//! The `cudabisect` binary: parse arguments, run, exit with the documented code.

fn main() {
    std::process::exit(cudabisect::cli::main());
}
