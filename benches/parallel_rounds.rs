//! Parallel probes, simulated: k workers whose probes all take the same time, so they land together and
//! every round is k probes at once. For each k, over many culprits: rounds (the wall time in probe
//! durations) and probes in all, beside the serial search, on linear and merge-heavy histories.
//!
//! Usage: cargo bench --bench parallel_rounds -- [COMMITS]   (default 1000)

use cudabisect::bisect::{Bisector, NextStep, SearchResult, Verdict};

use cudabisect::sample::shapes::history;

/// Which commits contain the culprit.
fn bad_set(parents: &[Vec<usize>], culprit: usize) -> Vec<bool> {
    let mut bad = vec![false; parents.len()];
    for i in culprit..parents.len() {
        bad[i] = i == culprit || parents[i].iter().any(|&p| bad[p]);
    }
    bad
}

/// (rounds, probes) for k workers in lockstep.
fn run(parents: &[Vec<usize>], culprit: usize, k: usize) -> (usize, usize) {
    let bad = bad_set(parents, culprit);
    let mut search = Bisector::new(parents);
    let (mut rounds, mut probes) = (0, 0);
    loop {
        let picks = match search.propose(k) {
            NextStep::Evaluate(c) => vec![c],
            NextStep::EvaluateMany(v) => v,
            NextStep::Done(r) => {
                assert_eq!(r, SearchResult::Found(culprit));
                return (rounds, probes);
            }
            NextStep::Wait => unreachable!("nothing in flight between rounds"),
        };
        rounds += 1;
        probes += picks.len();
        for c in picks {
            search.mark(c, if bad[c] { Verdict::Bad } else { Verdict::Good });
        }
    }
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    println!("| history | commits | k | rounds mean / max | bound ⌈log_(k+1) N⌉+1 | probes mean | × serial |");
    println!("|---|---|---|---|---|---|---|");
    for shape in ["linear", "merge-heavy"] {
        let parents = history(shape, n);
        let len = parents.len();
        let culprits: Vec<usize> = (0..200).map(|i| 1 + i * (len - 2) / 199).collect();
        let mut serial = 0.0;
        for k in [1, 2, 4, 8] {
            let results: Vec<(usize, usize)> =
                culprits.iter().map(|&c| run(&parents, c, k)).collect();
            let rounds = results.iter().map(|r| r.0).sum::<usize>() as f64 / results.len() as f64;
            let max = results.iter().map(|r| r.0).max().unwrap_or(0);
            let probes = results.iter().map(|r| r.1).sum::<usize>() as f64 / results.len() as f64;
            if k == 1 {
                serial = probes;
            }
            let bound = ((len as f64).ln() / ((k + 1) as f64).ln()).ceil() as usize + 1;
            println!(
                "| {shape} | {len} | {k} | {rounds:.2} / {max} | {bound} | {probes:.2} | {:.2} |",
                probes / serial
            );
        }
    }
}
