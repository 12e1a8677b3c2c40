//! Output helpers the subcommands share.

/// Writes to stdout; a closed pipe (`cudabisect … | head -1`) ends the output quietly, never a panic.
pub fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
