//! The documented exit codes: part of the command-line API, so scripts can rely on them. Each meaning has
//! its own code; docs/reference/exit-codes.md is the same table (a test holds them together).

/// A first bad commit was found, or a subcommand succeeded.
pub const OK: u8 = 0;
/// `harness run`: a node faulted (the status a CUDA program that checks its errors exits with).
pub const NODE_FAULT: u8 = 1;
/// Bad usage, config, model or harness: nothing was run or written.
pub const USAGE: u8 = 2;
/// `start`: GOOD does not pass or BAD does not reproduce; `shrink`: the model does not fault.
pub const ENDPOINTS_INVALID: u8 = 3;
/// `start`: skips left several candidates.
pub const INCONCLUSIVE: u8 = 4;
/// `classify`: the log shows a failure; `triage`: a sanitizer tool found the fault.
pub const FAULT_FOUND: u8 = 5;
/// No CUDA driver, device or NVRTC could be used (`harness --backend cuda`), or compute-sanitizer is
/// missing (`triage`).
pub const UNAVAILABLE: u8 = 6;
/// Another cudabisect run holds this repository's state directory.
pub const LOCKED: u8 = 7;
/// `start`: an endpoint could not be judged because the machine or the clone failed, not the commit.
pub const INFRA: u8 = 8;
/// `nightly`: the first night's head is clean and became the last good commit.
pub const BASELINE: u8 = 10;
/// `nightly`: the head is clean again; the open regression is closed.
pub const FIXED: u8 = 11;
/// `nightly`: the head faults with a new bug, and it was bisected.
pub const REGRESSION: u8 = 12;
/// `nightly`: the head still faults with the open regression's bug (not bisected again).
pub const STILL_FAILING: u8 = 13;
/// cudabisect itself failed (a bug, or the disk or git failed under it).
pub const INTERNAL: u8 = 70;
/// Interrupted by Ctrl-C, SIGTERM, SIGHUP, or a batch system's SIGUSR1/SIGUSR2/SIGALRM (after writing
/// what was found).
pub const INTERRUPTED: u8 = 130;

/// The table as `--help` shows it.
pub const HELP: &str = "Exit codes:
  0    found / success
  1    harness run: a node faulted
  2    bad usage, config, model or harness (nothing was run or written)
  3    start: GOOD does not pass or BAD does not reproduce; shrink: the model does not fault
  4    inconclusive: skips or a flaky search left several candidates, a found commit did not hold alone;
       nightly: the head could not be judged; triage: the sanitizer's report could not be read
  5    classify: the log shows a failure; triage: the fault was found
  6    no CUDA backend (harness, shrink) or no compute-sanitizer (triage)
  7    another cudabisect run holds this repository's state directory (and only that)
  8    start: an endpoint could not be judged, or the host broke mid-search
  10   nightly: baseline (first clean head recorded; 0 with --exit-codes ci, the default under CI)
  11   nightly: fixed (the open regression's bug is gone; 0 with --exit-codes ci)
  12   nightly: regression (a new bug, bisected)
  13   nightly: still failing (the open regression's bug, not bisected again)
  70   cudabisect itself failed (a bug, or the disk or git failed under it)
  130  interrupted (Ctrl-C, SIGTERM, SIGHUP, SIGUSR1/2, SIGALRM)";

#[cfg(test)]
mod doc_tests {
    use super::*;

    /// The exit codes the reference page documents are exactly the ones defined here.
    #[test]
    fn the_reference_page_lists_every_exit_code_and_no_other() {
        let page = include_str!("../../docs/reference/exit-codes.md");
        let mut documented: Vec<u8> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| "))
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect();
        documented.sort_unstable();
        let mut defined = vec![
            OK,
            NODE_FAULT,
            USAGE,
            ENDPOINTS_INVALID,
            INCONCLUSIVE,
            FAULT_FOUND,
            UNAVAILABLE,
            LOCKED,
            INFRA,
            BASELINE,
            FIXED,
            REGRESSION,
            STILL_FAILING,
            INTERNAL,
            INTERRUPTED,
        ];
        defined.sort_unstable();
        assert_eq!(documented, defined);
        for code in defined {
            assert!(
                HELP.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{code} "))),
                "--help lacks {code}"
            );
        }
    }
}
