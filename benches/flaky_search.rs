//! Flaky faults, simulated: a linear history of N commits whose culprit faults with probability p on each
//! run of a bad commit (never on a good one). For each p and seed: accuracy and runs of `git bisect run`
//! (one run per probe; and a script that repeats the repro up to r times, stopping at the first fault,
//! which is what cudabisect's `[repro] attempts = r` does), against the Bayesian search at confidence 0.99
//! (3 runs of the bad end first, counted). Beside them, the information bound: log2 N over
//! the capacity of the Z-channel a run is.
//!
//! Usage: cargo bench --bench flaky_search -- [COMMITS] [SEEDS]   (defaults 1000, 200)

use cudabisect::bisect::{BayesSearch, BayesStep, Bisector, NextStep, SearchResult, Verdict};

use cudabisect::sample::shapes::SeededRng as Rng;

/// Plain bisection where a probe runs the repro up to `r` times and is bad at the first fault.
fn bisect(
    parents: &[Vec<usize>],
    culprit: usize,
    p: f64,
    r: usize,
    rng: &mut Rng,
) -> (bool, usize) {
    let mut s = Bisector::new(parents);
    let mut runs = 0;
    loop {
        match s.next_step() {
            NextStep::Evaluate(c) => {
                let mut bad = false;
                for _ in 0..r {
                    runs += 1;
                    if c >= culprit && rng.unit() < p {
                        bad = true;
                        break;
                    }
                }
                s.mark(c, if bad { Verdict::Bad } else { Verdict::Good });
            }
            NextStep::Done(SearchResult::Found(x)) => return (x == culprit, runs),
            NextStep::Done(_) | NextStep::Wait | NextStep::EvaluateMany(_) => return (false, runs),
        }
    }
}

/// The Bayesian search with `k` workers in rounds: (right, runs, rounds).
fn bayes_rounds(
    parents: &[Vec<usize>],
    culprit: usize,
    p: f64,
    k: usize,
    rng: &mut Rng,
) -> (bool, usize, usize) {
    let n = parents.len();
    let mut s = BayesSearch::new(parents, None, 0.99, 2000);
    for _ in 0..3 {
        let f = rng.unit() < p;
        s.record(n - 1, f);
    }
    let mut rounds = 0;
    loop {
        match s.propose(k) {
            Ok(runs) => {
                rounds += 1;
                for c in runs {
                    let f = c >= culprit && rng.unit() < p;
                    s.record(c, f);
                }
            }
            Err(r) => return (r.culprit == culprit, r.runs, rounds),
        }
    }
}

fn bayes(parents: &[Vec<usize>], culprit: usize, p: f64, rng: &mut Rng) -> (bool, usize, f64) {
    let n = parents.len();
    let mut s = BayesSearch::new(
        parents,
        std::env::var("KNOWN_P").ok().map(|_| p),
        0.99,
        2000,
    );
    let warmup: usize = std::env::var("WARMUP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for _ in 0..warmup {
        let f = rng.unit() < p;
        s.record(n - 1, f);
    }
    loop {
        match s.next_step() {
            BayesStep::Run(c) => {
                let f = c >= culprit && rng.unit() < p;
                s.record(c, f);
            }
            BayesStep::Done(r) => return (r.culprit == culprit, r.runs, r.p),
        }
    }
}

/// Capacity (bits per run) of the Z-channel: a bad commit's run shows the fault with probability p.
fn capacity(p: f64) -> f64 {
    let s = 1.0 - p;
    if s <= 0.0 {
        return 1.0;
    }
    (1.0 + (1.0 - s) * s.powf(s / (1.0 - s))).log2()
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(1000);
    let seeds = args.get(1).copied().unwrap_or(200);
    let parents: Vec<Vec<usize>> = (0..n)
        .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
        .collect();
    println!("| p | strategy | right | mean runs | × bound |");
    println!("|---|---|---|---|---|");
    for p in [0.3, 0.5, 0.7] {
        let bound = (n as f64).log2() / capacity(p);
        // The r that makes a whole search about 99% right: (1 − p)^r per probe over ~log2 N probes.
        let r99 = ((0.01 / (n as f64).log2()).ln() / (1.0 - p).ln()).ceil() as usize;
        let mut rows: Vec<(String, f64, f64)> = Vec::new();
        for (name, r) in [
            ("git bisect run".to_string(), 1),
            ("git bisect run, repro repeated 3×".to_string(), 3),
            (format!("fixed attempts = {r99}"), r99),
        ] {
            let (mut right, mut runs) = (0, 0);
            for seed in 0..seeds {
                let mut rng =
                    Rng(0x9e37_79b9_7f4a_7c15 ^ (seed as u64 + 1).wrapping_mul(0x2545_f491));
                let culprit = 1 + (rng.unit() * (n - 1) as f64) as usize;
                let (ok, used) = bisect(&parents, culprit.min(n - 1), p, r, &mut rng);
                right += usize::from(ok);
                runs += used;
            }
            rows.push((
                name,
                right as f64 / seeds as f64,
                runs as f64 / seeds as f64,
            ));
        }
        let (mut right, mut runs, mut p_hat) = (0, 0, 0.0);
        for seed in 0..seeds {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (seed as u64 + 1).wrapping_mul(0x2545_f491));
            let culprit = 1 + (rng.unit() * (n - 1) as f64) as usize;
            let (ok, used, est) = bayes(&parents, culprit.min(n - 1), p, &mut rng);
            right += usize::from(ok);
            runs += used;
            p_hat += est;
        }
        rows.push((
            format!(
                "Bayesian, confidence 0.99 (mean p̂ {:.2})",
                p_hat / seeds as f64
            ),
            right as f64 / seeds as f64,
            runs as f64 / seeds as f64,
        ));
        for k in [4, 8] {
            let (mut right, mut runs, mut rounds) = (0, 0, 0);
            for seed in 0..seeds {
                let mut rng =
                    Rng(0x9e37_79b9_7f4a_7c15 ^ (seed as u64 + 1).wrapping_mul(0x2545_f491));
                let culprit = 1 + (rng.unit() * (n - 1) as f64) as usize;
                let (ok, used, r) = bayes_rounds(&parents, culprit.min(n - 1), p, k, &mut rng);
                right += usize::from(ok);
                runs += used;
                rounds += r;
            }
            rows.push((
                format!(
                    "Bayesian, {k} workers in rounds ({:.1} rounds)",
                    rounds as f64 / seeds as f64
                ),
                right as f64 / seeds as f64,
                runs as f64 / seeds as f64,
            ));
        }
        for (name, right, runs) in rows {
            println!(
                "| {p} | {name} | {:.1}% | {runs:.1} | {:.2} |",
                right * 100.0,
                runs / bound
            );
        }
        println!("| {p} | information bound (log2 N / Z-channel capacity) | | {bound:.1} | 1.00 |");
    }
}
