//! The search state machine alone on large histories: time to build it, time for a whole search, probes,
//! and the process's peak RSS (VmHWM). One history per process run, so the peak belongs to it.
//!
//! Usage: cargo bench --bench search_scale -- [linear|merge-heavy] [COMMITS]
//! (without arguments: every shape at 1k, 10k and 100k commits, each in its own child process).

use std::time::Instant;

use cudabisect::bisect::{Bisector, NextStep, SearchResult, Verdict};

use cudabisect::sample::shapes::history;

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn one(shape: &str, n: usize) {
    let parents = history(shape, n);
    let n = parents.len();
    let culprit = n * 617 / 1000;
    // Bad iff the culprit is an ancestor: computed once, outside the timed part.
    let bad = {
        let mut bad = vec![false; n];
        let mut desc = vec![false; n];
        desc[culprit] = true;
        for i in culprit..n {
            if i == culprit || parents[i].iter().any(|&p| desc[p]) {
                desc[i] = true;
                bad[i] = true;
            }
        }
        bad
    };
    let before = peak_rss_mib();
    let t = Instant::now();
    let mut search = Bisector::new(&parents);
    let built = t.elapsed();
    let mut probes = 0;
    let result = loop {
        match search.next_step() {
            NextStep::Evaluate(c) => {
                probes += 1;
                search.mark(c, if bad[c] { Verdict::Bad } else { Verdict::Good });
            }
            NextStep::Done(r) => break r,
            NextStep::Wait | NextStep::EvaluateMany(_) => unreachable!("sequential"),
        }
    };
    let total = t.elapsed();
    assert_eq!(result, SearchResult::Found(culprit));
    println!(
        "{shape:<12} {n:>7} commits  build {:>8.3} s  search {:>8.3} s  {probes:>3} probes  peak RSS {:>7.1} MiB (history alone {:>6.1} MiB)",
        built.as_secs_f64(),
        total.as_secs_f64(),
        peak_rss_mib(),
        before
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if let (Some(shape), Some(n)) = (args.first(), args.get(1).and_then(|n| n.parse().ok())) {
        one(shape, n);
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    for shape in ["linear", "merge-heavy"] {
        for n in [1_000, 10_000, 100_000] {
            let status = std::process::Command::new(&exe)
                .args([shape, &n.to_string()])
                .status()
                .expect("runs");
            assert!(status.success());
        }
    }
}
