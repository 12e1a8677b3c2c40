//! The exit status of a saved log: `--exit-code`/`--signal`/`--timed-out` when given, else the trailer
//! cudabisect writes at the end of its own probe logs, else a bare `exit=N` line capture scripts append.

use super::signature::Exit;

/// What cudabisect's probe logs end with: `[cudabisect] exit=N after 1.23s` (or `signal=N`, `timeout`).
pub const LOG_TRAILER_PREFIX: &str = "[cudabisect]";

/// Reads an exit status given as a shell would report it: 128+N and negative codes are signals.
pub fn exit_from_code(code: i32) -> Exit {
    match code {
        c if c < 0 => Exit::Signal(-c),
        c if (129..=128 + 64).contains(&c) => Exit::Signal(c - 128),
        c => Exit::Code(c),
    }
}

/// Splits a final status line off `text`: cudabisect's trailer or `exit=N`. Returns the status (Unknown
/// when there is none) and the text before it.
pub fn split_exit_trailer(text: &str) -> (Exit, &str) {
    let trimmed = text.trim_end();
    let (body, last) = match trimmed.rsplit_once('\n') {
        Some((body, last)) => (body, last),
        None => ("", trimmed),
    };
    let last = last.trim();
    let status = last
        .strip_prefix(LOG_TRAILER_PREFIX)
        .map(str::trim)
        .map(|s| s.split(" after ").next().unwrap_or(s))
        .unwrap_or(last);
    let exit = if let Some(code) = status.strip_prefix("exit=") {
        code.trim().parse().ok().map(Exit::Code)
    } else if let Some(sig) = status.strip_prefix("signal=") {
        sig.trim().parse().ok().map(Exit::Signal)
    } else if status == "timeout" && last.starts_with(LOG_TRAILER_PREFIX) {
        Some(Exit::Timeout)
    } else {
        None
    };
    match exit {
        Some(e) => (e, body),
        None => (Exit::Unknown, text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_and_codes_are_read() {
        assert_eq!(
            split_exit_trailer("boom\n[cudabisect] exit=0 after 1.00s\n"),
            (Exit::Code(0), "boom")
        );
        assert_eq!(
            split_exit_trailer("boom\n[cudabisect] signal=9 after 1.00s\n").0,
            Exit::Signal(9)
        );
        assert_eq!(
            split_exit_trailer("x\n[cudabisect] timeout after 60.00s").0,
            Exit::Timeout
        );
        assert_eq!(split_exit_trailer("a\nexit=3\n"), (Exit::Code(3), "a"));
        assert_eq!(split_exit_trailer("a\nb\n").0, Exit::Unknown);
        assert_eq!(split_exit_trailer("").0, Exit::Unknown);
        assert_eq!(exit_from_code(137), Exit::Signal(9));
        assert_eq!(exit_from_code(-11), Exit::Signal(11));
        assert_eq!(exit_from_code(1), Exit::Code(1));
    }
}
