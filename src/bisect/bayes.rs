//! Flaky faults: a Bayesian search over the first bad commit, for a fault that shows on only some runs of
//! a bad commit. Pure: `next_step()` proposes a commit, `record()` takes one run's outcome there.
//!
//! The model: the culprit `x` is one commit of the range (an ancestor of the bad end, or the bad end
//! itself); a commit `c` holds the bug when `x` is `c` or one of its ancestors. A run at a commit that holds
//! the bug shows the fault with probability `p`; a run at a commit that does not never shows it (another
//! failure is a skip, not a clean run). So a fault at `c` says for certain that the culprit is at or before
//! `c`, and a clean run there only makes that less likely, by a factor `1 − p`. The posterior over `x` is the
//! product of those likelihoods (uniform prior), `p` is estimated from the runs themselves (the bad end's
//! repeats at the start weigh most: it certainly holds the bug), and each next run goes where the expected
//! information per run is largest. The search ends when the most likely culprit reaches the confidence asked,
//! or when the run budget is spent. With `p = 1` every answer is certain and this is plain bisection: the
//! same commits in the same order as [`super::Bisector`] on a line.

use std::collections::HashMap;

use super::bitset::BitSet;
use super::dag::Dag;

/// What to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum BayesStep {
    /// Run the repro once at this commit and `record` the outcome.
    Run(usize),
    /// The search is over.
    Done(BayesResult),
}

/// How a Bayesian search ended.
#[derive(Clone, Debug, PartialEq)]
pub struct BayesResult {
    /// The most likely first bad commit.
    pub culprit: usize,
    /// Its posterior probability.
    pub confidence: f64,
    /// Whether that reached the confidence asked (else the run budget ran out, or every informative
    /// commit was skipped).
    pub reached: bool,
    /// The runners-up, most likely first, with their posteriors (up to five).
    pub runners_up: Vec<(usize, f64)>,
    /// The estimated probability that a run at a bad commit shows the fault.
    pub p: f64,
    /// Runs recorded.
    pub runs: usize,
}

/// The search state. Commits are indices `0..n` in topological order; the last is the bad end.
#[derive(Clone, Debug)]
pub struct BayesSearch {
    dag: Dag,
    /// Commits that may be the culprit: the bad end's ancestors and itself.
    range: BitSet,
    /// Faults and clean runs recorded per commit.
    seen: HashMap<usize, (u32, u32)>,
    /// Each probed commit's ancestors within the range (itself included).
    ancestors: HashMap<usize, BitSet>,
    skipped: BitSet,
    /// A known `p` (1 for a fault that always shows), or `None` to estimate it.
    fixed_p: Option<f64>,
    confidence: f64,
    budget: usize,
    runs: usize,
}

/// Points of the grid `p` is integrated over when it is not known.
const P_GRID: usize = 40;

/// Binary entropy in bits.
fn h2(q: f64) -> f64 {
    if q <= 0.0 || q >= 1.0 {
        0.0
    } else {
        -(q * q.log2() + (1.0 - q) * (1.0 - q).log2())
    }
}

/// Expected information (bits) from one run at a commit that holds the bug with probability `q`.
pub fn information(q: f64, p: f64) -> f64 {
    (h2(q * p) - q * h2(p)).max(0.0)
}

impl BayesSearch {
    /// A search over `parents` (as [`super::Bisector::new`]) that stops at `confidence` or after `budget`
    /// runs; `p`: a known fault rate, or `None` to estimate it from the runs.
    ///
    /// # Panics
    /// When `parents` is empty: a range always holds at least its bad end.
    pub fn new(parents: &[Vec<usize>], p: Option<f64>, confidence: f64, budget: usize) -> Self {
        let dag = Dag::new(parents);
        let n = dag.len();
        let mut s = Self {
            dag,
            range: BitSet::full(n),
            seen: HashMap::new(),
            ancestors: HashMap::new(),
            skipped: BitSet::new(n),
            fixed_p: p.map(|p| p.clamp(0.0, 1.0)),
            confidence,
            budget,
            runs: 0,
        };
        s.range = s.walk(n - 1, None);
        s
    }

    fn parents_of(&self, c: usize) -> &[u32] {
        self.dag.parents_of(c)
    }

    /// `from` and its ancestors, within `within` when given.
    fn walk(&self, from: usize, within: Option<&BitSet>) -> BitSet {
        let n = self.dag.len();
        let mut seen = BitSet::new(n);
        let mut stack = vec![from];
        while let Some(c) = stack.pop() {
            if seen.contains(c) || within.is_some_and(|w| !w.contains(c)) {
                continue;
            }
            seen.insert(c);
            stack.extend(self.parents_of(c).iter().map(|&q| q as usize));
        }
        seen
    }

    /// Records one run at `commit`: whether it showed the target fault.
    pub fn record(&mut self, commit: usize, fault: bool) {
        if !self.ancestors.contains_key(&commit) {
            let anc = self.walk(commit, Some(&self.range));
            self.ancestors.insert(commit, anc);
        }
        let e = self.seen.entry(commit).or_insert((0, 0));
        if fault {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
        self.runs += 1;
    }

    /// A commit that cannot be judged (build break, another bug): never proposed again.
    pub fn skip(&mut self, commit: usize) {
        self.skipped.insert(commit);
    }

    /// Runs recorded so far.
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// The log-likelihood of the runs for each culprit under a given `p` (`-inf` outside the range and
    /// where a fault rules the culprit out).
    fn log_likelihood(&self, p: f64) -> Vec<f64> {
        let n = self.dag.len();
        let mut log = vec![f64::NEG_INFINITY; n];
        for x in self.range.iter() {
            log[x] = 0.0;
        }
        let (lp, lq) = (p.ln(), (1.0 - p).ln());
        for (&c, &(faults, cleans)) in &self.seen {
            let anc = &self.ancestors[&c];
            let holds = f64::from(faults) * lp
                + if cleans > 0 {
                    f64::from(cleans) * lq
                } else {
                    0.0
                };
            for x in self.range.iter() {
                if log[x] == f64::NEG_INFINITY {
                    continue;
                }
                if anc.contains(x) {
                    log[x] += holds;
                } else if faults > 0 {
                    log[x] = f64::NEG_INFINITY;
                }
            }
        }
        log
    }

    /// The posterior as a mixture over `p`: for each grid value (one value when `p` is known), its
    /// weight and the posterior over the culprit under it. Empty when the runs contradict every value
    /// (only possible with `p = 1`).
    fn mixture(&self) -> Vec<(f64, f64, Vec<f64>)> {
        let grid: Vec<f64> = match self.fixed_p {
            Some(p) => vec![p],
            None => (0..P_GRID)
                .map(|i| (i as f64 + 0.5) / P_GRID as f64)
                .collect(),
        };
        let logs: Vec<Vec<f64>> = grid.iter().map(|&p| self.log_likelihood(p)).collect();
        let top = logs
            .iter()
            .flatten()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        if top == f64::NEG_INFINITY {
            return Vec::new();
        }
        let mut parts = Vec::new();
        let mut total = 0.0;
        for (p, log) in grid.iter().zip(&logs) {
            let w: Vec<f64> = log
                .iter()
                .map(|&l| {
                    if l > f64::NEG_INFINITY {
                        (l - top).exp()
                    } else {
                        0.0
                    }
                })
                .collect();
            let mass: f64 = w.iter().sum();
            if mass > 0.0 {
                total += mass;
                parts.push((*p, mass, w.into_iter().map(|v| v / mass).collect()));
            }
        }
        parts.iter_mut().for_each(|(_, m, _)| *m /= total);
        parts
    }

    /// The posterior over the culprit and the posterior mean of `p`. With `p` known, the posterior
    /// under it; otherwise `p` is integrated out over a grid with a uniform prior (a plug-in estimate
    /// would make the posterior overconfident: the confidence reported must be the chance of being right).
    pub fn estimate(&self) -> (f64, Vec<f64>) {
        let n = self.dag.len();
        let parts = self.mixture();
        let mut post = vec![0.0; n];
        let mut p_mean = self.fixed_p.unwrap_or(0.5);
        if !parts.is_empty() {
            p_mean = parts.iter().map(|(p, w, _)| p * w).sum();
            for (_, w, part) in &parts {
                for (x, v) in part.iter().enumerate() {
                    post[x] += w * v;
                }
            }
        }
        (p_mean, post)
    }

    /// Expected information (bits) per run at each commit about the culprit and the fault rate
    /// together: learning how often the fault shows is what lets clean runs count, so a run at a commit
    /// that surely holds the bug is worth something while `p` is uncertain.
    fn gains(&self, parts: &[(f64, f64, Vec<f64>)]) -> Vec<f64> {
        let n = self.dag.len();
        let mut fault = vec![0.0; n];
        let mut noise = vec![0.0; n];
        for (p, w, part) in parts {
            if *w < 1e-9 {
                continue;
            }
            let q = self.holds_all(part);
            let hp = h2(*p);
            for c in self.range.iter() {
                fault[c] += w * p * q[c];
                noise[c] += w * q[c] * hp;
            }
        }
        (0..n).map(|c| (h2(fault[c]) - noise[c]).max(0.0)).collect()
    }

    /// For every commit, the probability that it holds the bug: the posterior mass of it and its
    /// ancestors. Along a line a running sum; a merge is walked.
    fn holds_all(&self, post: &[f64]) -> Vec<f64> {
        let n = post.len();
        let mut q = vec![0.0; n];
        for c in 0..n {
            if !self.range.contains(c) {
                continue;
            }
            let ps: Vec<usize> = self
                .parents_of(c)
                .iter()
                .map(|&x| x as usize)
                .filter(|&x| self.range.contains(x))
                .collect();
            q[c] = match ps.as_slice() {
                [] => post[c],
                // One parent: its ancestors and itself, exactly (only merges are walked).
                [one] => post[c] + q[*one],
                _ => self
                    .walk(c, Some(&self.range))
                    .iter()
                    .map(|x| post[x])
                    .sum(),
            };
        }
        q
    }

    /// Proposes the next run, or ends the search.
    pub fn next_step(&mut self) -> BayesStep {
        match self.propose(1) {
            Ok(runs) => BayesStep::Run(runs[0]),
            Err(result) => BayesStep::Done(result),
        }
    }

    /// Proposes up to `k` runs at once (one per idle worker): the commits with the most expected
    /// information per run, best first; or ends the search. (Chosen together from one posterior, so a
    /// batch is worth a little less than the same runs one after another, and costs a k-th of the time.)
    pub fn propose(&mut self, k: usize) -> Result<Vec<usize>, BayesResult> {
        let (p, post) = self.estimate();
        let best = self.ranked(&post);
        let (culprit, top) = best.first().copied().unwrap_or((self.dag.len() - 1, 0.0));
        let done = |reached: bool| BayesResult {
            culprit,
            confidence: top,
            reached,
            runners_up: best.iter().skip(1).take(5).copied().collect(),
            p,
            runs: self.runs,
        };
        if top >= self.confidence {
            return Err(done(true));
        }
        if self.runs >= self.budget {
            return Err(done(false));
        }
        let gains = self.gains(&self.mixture());
        let mut picks: Vec<(usize, f64)> = self
            .range
            .iter()
            .filter(|&c| !self.skipped.contains(c) && gains[c] > 1e-12)
            .map(|c| (c, gains[c]))
            .collect();
        // Most information first; ties go to the earlier commit, as the plain bisection's do.
        picks.sort_by(|a, b| {
            if (a.1 - b.1).abs() <= a.1.max(b.1) * 1e-9 {
                a.0.cmp(&b.0)
            } else {
                b.1.total_cmp(&a.1)
            }
        });
        let room = k.max(1).min(self.budget - self.runs);
        let runs: Vec<usize> = picks.into_iter().take(room).map(|(c, _)| c).collect();
        if runs.is_empty() {
            return Err(done(false));
        }
        Ok(runs)
    }

    /// Commits by posterior, most likely first (ties: the earlier commit).
    fn ranked(&self, post: &[f64]) -> Vec<(usize, f64)> {
        let mut v: Vec<(usize, f64)> = self
            .range
            .iter()
            .filter(|&x| post[x] > 0.0)
            .map(|x| (x, post[x]))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// Whether a culprit's and its parent's reproduction rates are told apart: the probability, under uniform
/// priors, that the culprit's rate is higher than the parent's, given `(faults, runs)` at each.
pub fn rates_differ(culprit: (u32, u32), parent: (u32, u32)) -> f64 {
    // P(a > b) for a ~ Beta(1 + fa, 1 + runs_a − fa), b ~ Beta(1 + fb, 1 + runs_b − fb), by a midpoint
    // sum over a fine grid of b's density times a's upper tail.
    const STEPS: usize = 4000;
    let (fa, na) = (f64::from(culprit.0), f64::from(culprit.1));
    let (fb, nb) = (f64::from(parent.0), f64::from(parent.1));
    let log_density = |x: f64, f: f64, n: f64| f * x.ln() + (n - f) * (1.0 - x).ln();
    let grid: Vec<f64> = (0..STEPS)
        .map(|i| (i as f64 + 0.5) / STEPS as f64)
        .collect();
    let normalise = |f: f64, n: f64| -> Vec<f64> {
        let logs: Vec<f64> = grid.iter().map(|&x| log_density(x, f, n)).collect();
        let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = logs.iter().map(|&l| (l - top).exp()).collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|v| v / total).collect()
    };
    let a = normalise(fa, na);
    let b = normalise(fb, nb);
    // Upper tail of a: P(a > grid[i]).
    let mut tail = vec![0.0; STEPS];
    let mut acc = 0.0;
    for i in (0..STEPS).rev() {
        tail[i] = acc + a[i] / 2.0;
        acc += a[i];
    }
    b.iter().zip(&tail).map(|(pb, ta)| pb * ta).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(n: usize) -> Vec<Vec<usize>> {
        crate::sample::shapes::history("linear", n)
    }

    #[test]
    fn information_is_largest_near_the_middle_and_zero_at_the_ends() {
        assert_eq!(information(0.0, 0.5), 0.0);
        assert!(information(1.0, 0.5).abs() < 1e-12);
        assert!((information(0.5, 1.0) - 1.0).abs() < 1e-12);
        // With a flaky fault a clean run says little, so the best commit holds the bug with less than
        // half the mass: the Z-channel's capacity-achieving input, 1/(p(1 + 2^(H(p)/p))) = 0.385 at p = 0.3.
        let best = (1..1000)
            .map(|i| i as f64 / 1000.0)
            .max_by(|a, b| information(*a, 0.3).total_cmp(&information(*b, 0.3)))
            .unwrap();
        assert!((best - 0.385).abs() < 0.002, "{best}");
    }

    #[test]
    fn a_fault_rules_out_every_later_culprit_and_a_clean_run_only_weighs_down() {
        let mut s = BayesSearch::new(&linear(10), Some(0.5), 0.99, 100);
        s.record(4, true);
        let (_, post) = s.estimate();
        assert!(post[5..].iter().all(|&v| v == 0.0));
        s.record(2, false);
        let (_, post) = s.estimate();
        // Culprits 0..=2 would have shown the fault at 2 with probability one half: half as likely.
        assert!((post[1] / post[3] - 0.5).abs() < 1e-9, "{post:?}");
    }

    #[test]
    fn the_fault_rate_is_estimated_from_the_bad_ends_repeats() {
        let mut s = BayesSearch::new(&linear(50), None, 0.99, 1000);
        for i in 0..20 {
            s.record(49, i % 10 < 3);
        }
        let (p, _) = s.estimate();
        assert!((p - 7.0 / 22.0).abs() < 0.02, "{p}");
    }

    #[test]
    fn rates_that_differ_are_told_apart_and_equal_ones_are_not() {
        assert!(rates_differ((6, 10), (0, 10)) > 0.99);
        assert!((rates_differ((3, 10), (3, 10)) - 0.5).abs() < 0.01);
        assert!(rates_differ((1, 2), (0, 2)) < 0.99);
    }
}
