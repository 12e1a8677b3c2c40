//! Multi-rank output: splits what a distributed launcher (torchrun, mpirun) printed into each rank's stream
//! and the launcher's own, classifies each, and names the root cause: the first fault in time, a kernel fault
//! on one rank before the NCCL errors, watchdog timeouts and launcher banners the other ranks print because
//! of it.
//!
//! A line belongs to a rank when it carries the prefix PyTorch puts on a rank's errors (`[rank1]: `), the
//! one torchrun's `--tee` puts on a local rank's output (`[default1]: `, `[trainer1]: `), or Open MPI's
//! `--tag-output` (`[1,1]<stderr>: `). Everything else (the launcher, device-side `printf` from asserts,
//! NCCL's own warnings) is the shared stream. Output with no rank prefix and no launcher summary is
//! classified as one stream, exactly as before.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

use super::patterns::{classify_stream, is_fault_line};
use super::signature::{Exit, FaultClass, Signature};

/// `[rank1]: `, `[default0]: `, `[trainer3]: ` (torchrun's `--role`, `worker` for other launchers), after an
/// optional `host: ` that multi-node launchers (pdsh, DeepSpeed's runner) put first.
static RANK_PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[A-Za-z0-9][\w.-]{0,62}: )?\[(?P<role>rank|default|trainer|worker)(?P<n>\d{1,5})\]: ?")
        .expect("pattern")
});
/// Open MPI's `--tag-output`: `[job,rank]<stdout>: `.
static MPI_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\d+,(?P<n>\d{1,5})\]<std(out|err)>: ?").expect("pattern"));
/// torchrun's own log lines and frames: its output is multi-rank even where no rank printed a prefix.
static LAUNCHER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"torch/distributed/run\.py|torch[./]distributed[./]elastic").expect("pattern")
});
static ROOT_CAUSE_RANK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*rank\s*:\s*(\d+)").expect("pattern"));
static ROOT_CAUSE_EXIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*exitcode\s*:\s*(-?\d+)").expect("pattern"));
/// A frame of a `py-spy dump`: `    all_reduce (torch/distributed/distributed_c10d.py:3068)`.
static DUMP_FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s+(?P<func>\S.*?) \((?P<path>[^()]+):(?P<line>\d+)\)$").expect("pattern")
});

/// The output of one run split by rank.
#[derive(Debug, Default)]
pub struct RankStreams<'a> {
    /// Each rank's lines (prefix removed), with their line numbers in the whole output.
    pub ranks: BTreeMap<u32, Vec<(usize, &'a str)>>,
    /// The lines no rank prefix claims: the launcher's, device `printf`, NCCL's warnings.
    pub shared: Vec<(usize, &'a str)>,
    /// The rank torchrun names under "Root Cause (first observed failure)".
    pub root_cause: Option<u32>,
    /// That rank's exit code as torchrun reports it (negative: killed by that signal).
    pub root_cause_exit: Option<i32>,
    /// A launcher's own lines were seen.
    pub launcher: bool,
}

impl<'a> RankStreams<'a> {
    /// Splits `output` by rank prefix.
    pub fn split(output: &'a str) -> Self {
        let mut out = RankStreams::default();
        let mut in_root_cause = false;
        for (i, line) in output.lines().enumerate() {
            match strip_rank(line) {
                Some((rank, rest)) => out.ranks.entry(rank).or_default().push((i, rest)),
                None => {
                    out.launcher = out.launcher || LAUNCHER.is_match(line);
                    if line.contains("Root Cause (first observed failure)") {
                        in_root_cause = true;
                    } else if in_root_cause {
                        if let Some(c) = ROOT_CAUSE_RANK.captures(line) {
                            out.root_cause = c[1].parse().ok();
                        } else if let Some(c) = ROOT_CAUSE_EXIT.captures(line) {
                            out.root_cause_exit = c[1].parse().ok();
                            in_root_cause = false;
                        }
                    }
                    out.shared.push((i, line));
                }
            }
        }
        out
    }

    /// True when the output came from several ranks (or a launcher that says which rank failed).
    pub fn is_multi_rank(&self) -> bool {
        !self.ranks.is_empty() || self.root_cause.is_some() || self.launcher
    }

    /// Each rank's text, prefix removed, for per-rank logs.
    pub fn rank_texts(&self) -> BTreeMap<u32, String> {
        self.ranks
            .iter()
            .map(|(rank, lines)| (*rank, join(lines)))
            .collect()
    }
}

/// The rank a line's prefix names, and the line without its prefixes (`[default1]:[rank1]: x` is rank 1).
pub fn strip_rank(line: &str) -> Option<(u32, &str)> {
    let mut rank = None;
    let mut rest = line;
    loop {
        if let Some(c) = RANK_PREFIX.captures(rest) {
            let n = c["n"].parse().ok()?;
            // The global rank wins over a launcher's local index when both are printed.
            if rank.is_none() || &c["role"] == "rank" {
                rank = Some(n);
            }
            rest = &rest[c.get(0)?.end()..];
        } else if let Some(c) = MPI_PREFIX.captures(rest) {
            rank = Some(c["n"].parse().ok()?);
            rest = &rest[c.get(0)?.end()..];
        } else {
            break;
        }
    }
    rank.map(|r| (r, rest))
}

/// Appends the per-rank files a launcher wrote under `dir` (torchrun `--log-dir DIR --redirects 3`:
/// `DIR/<run>/attempt_<n>/<local rank>/stdout.log`, `stderr.log`) to `output`, each line prefixed with its
/// rank, so they are classified and logged with the run. Each file is cut to its last 256 KiB.
pub fn append_rank_logs(dir: &std::path::Path, output: &mut String) {
    const KEEP: usize = 256 * 1024;
    let mut files = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() && depth < 4 {
                stack.push((path, depth + 1));
            } else if path.extension().is_some_and(|x| x == "log") {
                let rank = path
                    .parent()
                    .and_then(|p| p.file_name())
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.parse::<u32>().ok());
                if let Some(rank) = rank {
                    files.push((rank, path));
                }
            }
        }
    }
    files.sort();
    for (rank, path) in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(KEEP)..]).into_owned();
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        for line in text.lines() {
            output.push_str(&format!("[rank{rank}]: {line}\n"));
        }
    }
}

fn join(lines: &[(usize, &str)]) -> String {
    let mut text = String::new();
    for (_, l) in lines {
        text.push_str(l);
        text.push('\n');
    }
    text
}

/// How strongly a finding speaks for itself as a root cause: lower wins, then earlier.
fn tier(s: &Signature) -> u8 {
    use FaultClass::*;
    if s.summary.starts_with("compute-sanitizer:") {
        return 0;
    }
    match s.class {
        IllegalAddress | MisalignedAddress | InvalidAddressSpace | LaunchFailure | DeviceAssert
        | IllegalInstruction | HardwareStackError | Race | UninitializedRead => 1,
        OutOfMemory | DeviceMismatch | Nan | BuildFailure | Infra | ExecFailure | MissingObject => {
            2
        }
        Other | Signal => 3,
        // Collective errors and timeouts are what the other ranks print after one failed.
        Nccl => 4,
        Hang => 5,
        None => 6,
    }
}

/// One stream's finding and where its first telling line is in the whole output.
struct Candidate {
    rank: Option<u32>,
    signature: Signature,
    at: usize,
}

fn candidate(rank: Option<u32>, exit: Exit, lines: &[(usize, &str)]) -> Candidate {
    let signature = classify_stream(exit, &join(lines));
    let at = lines
        .iter()
        .find(|(_, l)| is_fault_line(l))
        .or_else(|| {
            // A Python exception with no CUDA wording: where its traceback ends.
            lines.iter().find(|(_, l)| {
                signature
                    .exception
                    .as_deref()
                    .is_some_and(|e| l.starts_with(e))
            })
        })
        .map_or(usize::MAX, |(i, _)| *i);
    Candidate {
        rank,
        signature,
        at,
    }
}

/// Classifies a run's output, rank by rank when it came from several ranks.
pub fn classify(exit: Exit, output: &str) -> Signature {
    // Colour codes inside a line (rich, loguru, `pytest --color=yes`, FORCE_COLOR) are not text.
    let plain = super::patterns::strip_ansi(output);
    let output: &str = &plain;
    let streams = RankStreams::split(output);
    if !streams.is_multi_rank() {
        return classify_stream(exit, output);
    }
    // Each rank is judged by what it printed; how the whole job ended is the launcher's.
    let per_rank_exit = match exit {
        Exit::Code(0) => Exit::Code(0),
        _ => Exit::Unknown,
    };
    let mut candidates: Vec<Candidate> = streams
        .ranks
        .iter()
        .map(|(rank, lines)| candidate(Some(*rank), per_rank_exit, lines))
        .collect();
    candidates.push(candidate(None, exit, &streams.shared));
    let best = candidates
        .iter()
        .enumerate()
        .min_by_key(|(_, c)| (tier(&c.signature), c.at))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let chosen = candidates.swap_remove(best);
    let mut signature = chosen.signature;
    let rank = chosen.rank.or_else(|| {
        // A shared line (a device assert's printf) is claimed by the rank that reported the same class,
        // else by the rank the launcher names.
        candidates
            .iter()
            .filter(|c| c.rank.is_some() && c.signature.class == signature.class)
            .min_by_key(|c| c.at)
            .and_then(|c| c.rank)
            .or(streams.root_cause)
    });
    if let Some(same_rank) = candidates
        .iter()
        .find(|c| c.rank.is_some() && c.rank == rank && c.signature.class == signature.class)
    {
        // The rank's own traceback knows the launch site and the exception the shared line does not.
        let from = &same_rank.signature;
        signature.launch = signature.launch.take().or_else(|| from.launch.clone());
        signature.exception = signature
            .exception
            .take()
            .or_else(|| from.exception.clone());
        signature.kernel = signature.kernel.take().or_else(|| from.kernel.clone());
    }
    if signature.class == FaultClass::Other {
        if let Some(exception) = rank
            .and_then(|r| candidates.iter().find(|c| c.rank == Some(r)))
            .filter(|c| c.signature.class == FaultClass::Other)
            .and_then(|c| c.signature.exception.clone())
        {
            signature.exception = Some(exception);
        }
    }
    if signature.class == FaultClass::Other && chosen.rank.is_none() {
        said_by_the_launcher(&mut signature, &streams);
    }
    if signature.class == FaultClass::Hang {
        // What the launcher raised when it was ended is not where the job hung.
        signature.exception = None;
        signature.launch = None;
        signature.detail = Some(still_running(&streams));
    }
    signature.rank = rank;
    if let Some(r) = rank {
        if signature.class != FaultClass::None && signature.class != FaultClass::Hang {
            signature.summary = format!("rank {r}: {}", signature.summary);
        }
    }
    signature
}

/// Nothing but the launcher's own report: say what it says of the rank that failed first (killed by a
/// signal, or its exit code), never its banner.
fn said_by_the_launcher(signature: &mut Signature, streams: &RankStreams) {
    let (Some(code), Some(r)) = (streams.root_cause_exit, streams.root_cause) else {
        return;
    };
    if code < 0 {
        let name = super::patterns::signal_name(-code);
        signature.class = FaultClass::Signal;
        signature.detail = Some(name.clone());
        signature.summary = format!("killed by {name} (the launcher's root cause)");
    } else if signature.exception.is_none()
        || signature.summary.contains("====")
        || signature.summary.contains("ChildFailedError")
    {
        signature.summary = format!("exited {code} (the launcher's root cause: rank {r})");
    }
}

/// Names the ranks that printed no fault before the run was killed, and where each was when a stack dump
/// (`py-spy dump`, taken before the kill) says so.
fn still_running(streams: &RankStreams) -> String {
    let mut parts = Vec::new();
    for (rank, lines) in &streams.ranks {
        let text = join(lines);
        // A rank whose only news is a stack dump was still running (the dump says where).
        if !matches!(
            classify_stream(Exit::Unknown, &text).class,
            FaultClass::None | FaultClass::Hang
        ) {
            continue;
        }
        let frames: Vec<(String, String)> = lines
            .iter()
            .filter_map(|(_, l)| DUMP_FRAME.captures(l))
            .map(|c| {
                (
                    c["func"].to_string(),
                    format!("{}:{}", &c["path"], &c["line"]),
                )
            })
            .collect();
        let part = match frames.first() {
            Some((func, at)) => {
                let user = frames
                    .iter()
                    .find(|(_, p)| !p.contains("site-packages/") && !p.contains("/lib/python"))
                    .filter(|f| *f != &frames[0]);
                match user {
                    Some((ufunc, uat)) => {
                        format!("rank {rank} in {func} ({at}) from {ufunc} ({uat})")
                    }
                    None => format!("rank {rank} in {func} ({at})"),
                }
            }
            None => format!("rank {rank}"),
        };
        parts.push(part);
    }
    if parts.is_empty() {
        "no rank said where it was (run the launcher with --tee 3, or install py-spy for stack dumps)".into()
    } else {
        format!("still running when killed: {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_name_the_rank_and_come_off() {
        assert_eq!(strip_rank("[rank1]: boom"), Some((1, "boom")));
        assert_eq!(strip_rank("[default1]:[rank3]: boom"), Some((3, "boom")));
        assert_eq!(strip_rank("[trainer2]:x"), Some((2, "x")));
        assert_eq!(strip_rank("[1,4]<stderr>: y"), Some((4, "y")));
        assert_eq!(
            strip_rank("worker-1: [rank5]: RuntimeError: x"),
            Some((5, "RuntimeError: x"))
        );
        for none in [
            "[0]:",
            "[W1130 02:17:30.058000 2207 torch/distributed/run.py:851]",
            "[step10] loss 3.2",
            "rank1: x",
        ] {
            assert_eq!(strip_rank(none), None, "{none}");
        }
    }

    #[test]
    fn a_kernel_fault_on_one_rank_beats_the_collective_errors_printed_before_it() {
        let out = "\
[rank0]:[E ProcessGroupNCCL.cpp:1] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2)
[rank1]: Traceback (most recent call last):
[rank1]:   File \"/home/u/train.py\", line 40, in step
[rank1]:     gather(x)
[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered
";
        let s = classify(Exit::Code(1), out);
        assert_eq!(s.class, FaultClass::IllegalAddress);
        assert_eq!(s.rank, Some(1));
        assert_eq!(s.site.as_deref(), Some("/home/u/train.py:40"));
        assert!(s.summary.starts_with("rank 1: "), "{}", s.summary);
    }

    #[test]
    fn the_earliest_fault_across_ranks_wins() {
        let out = "\
[rank1]: RuntimeError: CUDA error: misaligned address
[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered
";
        let s = classify(Exit::Code(1), out);
        assert_eq!((s.class, s.rank), (FaultClass::MisalignedAddress, Some(1)));
    }

    #[test]
    fn a_shared_assert_line_is_claimed_by_the_rank_that_reported_it() {
        let out = "\
/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: block: [0,0,0], thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
[rank1]: Traceback (most recent call last):
[rank1]:   File \"/home/u/train.py\", line 44, in <module>
[rank1]:     emb(idx)
[rank1]: torch.AcceleratorError: CUDA error: device-side assert triggered
";
        let s = classify(Exit::Code(1), out);
        assert_eq!(s.class, FaultClass::DeviceAssert);
        assert_eq!(s.rank, Some(1));
        assert_eq!(s.kernel.as_deref(), Some("indexSelectSmallIndex"));
        assert_eq!(s.launch.as_deref(), Some("/home/u/train.py:<module>"));
    }

    #[test]
    fn a_launchers_rank_files_join_the_output_under_their_ranks() {
        let tmp = tempfile::tempdir().unwrap();
        let rank1 = tmp.path().join("none_x1/attempt_0/1");
        std::fs::create_dir_all(&rank1).unwrap();
        std::fs::create_dir_all(tmp.path().join("none_x1/attempt_0/0")).unwrap();
        std::fs::write(
            rank1.join("stderr.log"),
            "Traceback (most recent call last):\n  File \"/home/u/train.py\", line 7, in step\n    k(x)\nRuntimeError: CUDA error: misaligned address\n",
        )
        .unwrap();
        let mut out = String::from("torchrun banner");
        append_rank_logs(tmp.path(), &mut out);
        let s = classify(Exit::Code(1), &out);
        assert_eq!((s.class, s.rank), (FaultClass::MisalignedAddress, Some(1)));
        assert_eq!(s.site.as_deref(), Some("/home/u/train.py:7"));
        let mut none = String::from("x\n");
        append_rank_logs(&tmp.path().join("missing"), &mut none);
        assert_eq!(none, "x\n");
    }

    #[test]
    fn a_rank_killed_by_a_signal_with_nothing_printed_is_named_from_the_launchers_root_cause() {
        let out = "\
W1130 02:14:23.397000 1668 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1713 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_02:14:23
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 1712)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 1712
============================================================
";
        let s = classify(Exit::Code(1), out);
        assert_eq!((s.class, s.rank), (FaultClass::Signal, Some(1)));
        assert_eq!(s.detail.as_deref(), Some("SIGSEGV"));
        assert!(!s.summary.contains("===="), "{}", s.summary);
        let exited = out.replace("exitcode  : -11", "exitcode  : 3");
        let s = classify(Exit::Code(1), &exited);
        assert_eq!((s.class, s.rank), (FaultClass::Other, Some(1)));
        assert!(s.summary.contains("exited 3"), "{}", s.summary);
    }

    #[test]
    fn output_without_ranks_is_classified_as_before() {
        let out = "RuntimeError: CUDA error: an illegal memory access was encountered\n";
        assert_eq!(
            classify(Exit::Code(1), out),
            classify_stream(Exit::Code(1), out)
        );
    }

    #[test]
    fn a_triton_fault_names_the_kernel_launched_last_and_another_fault_names_none() {
        let through_triton = "@@cudabisect launch kernel=bias\n@@cudabisect launch kernel=embed\nTraceback (most recent call last):\n  File \"/w/train.py\", line 3, in <module>\n    run(embed)\n  File \"/venv/lib/python3.12/site-packages/triton/runtime/jit.py\", line 10, in run\nRuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n";
        assert_eq!(
            classify(Exit::Code(1), through_triton).kernel.as_deref(),
            Some("embed")
        );
        // A torch op faulting after a Triton launch did not die in that kernel.
        let elsewhere = "@@cudabisect launch kernel=embed\nTraceback (most recent call last):\n  File \"/w/train.py\", line 5, in <module>\n    y = x[idx]\nRuntimeError: CUDA error: an illegal memory access was encountered\n";
        assert_eq!(classify(Exit::Code(1), elsewhere).kernel, None);
    }

    #[test]
    fn a_hang_names_the_ranks_still_running_and_where_a_dump_says_they_were() {
        let out = "\
[rank0]: Thread 77 (active): \"MainThread\"
[rank0]:     all_reduce (torch/distributed/distributed_c10d.py:3068)
[rank0]:     wrapper (/home/u/.venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py:83)
[rank0]:     <module> (train.py:52)
[rank1]: step 3 done
";
        let s = classify(Exit::Timeout, out);
        assert_eq!(s.class, FaultClass::Hang);
        let detail = s.detail.unwrap();
        assert!(
            detail.contains("rank 0 in all_reduce (torch/distributed/distributed_c10d.py:3068)"),
            "{detail}"
        );
        assert!(detail.contains("rank 1"), "{detail}");
    }
}
