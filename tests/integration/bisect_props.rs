//! Property tests of the pure search: random DAGs, monotone oracles, skips.

use cudabisect::bisect::{Bisector, NextStep, SearchResult, Verdict};
use proptest::prelude::*;

/// A random DAG in topological order whose last commit descends from every other (a bad tip over
/// a merge-heavy history): each commit takes one or two earlier parents.
fn dag(n: usize) -> impl Strategy<Value = Vec<Vec<usize>>> {
    proptest::collection::vec(
        (
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            any::<bool>(),
        ),
        n,
    )
    .prop_map(move |picks| {
        let mut parents = vec![vec![]];
        for (i, (a, b, merge)) in picks.into_iter().enumerate().skip(1) {
            let mut ps = vec![a.index(i)];
            if merge && i > 1 {
                let second = b.index(i);
                if second != ps[0] {
                    ps.push(second);
                }
            }
            parents.push(ps);
        }
        // Join every head into the tip so all commits are ancestors of bad.
        let mut has_child = vec![false; n];
        for ps in &parents {
            for &p in ps {
                has_child[p] = true;
            }
        }
        let heads: Vec<usize> = (0..n).filter(|&i| !has_child[i]).collect();
        let mut tip = heads.clone();
        if let Some(&last) = heads.last() {
            tip.retain(|&h| h != last);
            tip.insert(0, last);
        }
        parents.push(tip);
        parents
    })
}

fn ancestors(parents: &[Vec<usize>], of: usize) -> Vec<bool> {
    let mut seen = vec![false; parents.len()];
    let mut stack = vec![of];
    while let Some(c) = stack.pop() {
        if !std::mem::replace(&mut seen[c], true) {
            stack.extend(parents[c].iter().copied());
        }
    }
    seen
}

fn drive(parents: &[Vec<usize>], oracle: impl Fn(usize) -> Verdict) -> (SearchResult, usize) {
    let mut search = Bisector::new(parents);
    let mut probes = 0;
    loop {
        match search.next_step() {
            NextStep::Evaluate(c) => {
                probes += 1;
                search.mark(c, oracle(c));
            }
            NextStep::Done(r) => return (r, probes),
            NextStep::Wait | NextStep::EvaluateMany(_) => panic!("sequential search waited"),
        }
    }
}

proptest! {
    #[test]
    fn finds_the_culprit_in_any_dag(parents in (2usize..60).prop_flat_map(dag), pick in any::<prop::sample::Index>()) {
        let n = parents.len();
        let culprit = pick.index(n);
        // Bad iff the culprit is among the commit's ancestors (itself included): a monotone oracle.
        let bad: Vec<bool> = (0..n).map(|c| ancestors(&parents, c)[culprit]).collect();
        prop_assume!(bad[n - 1]);
        let (result, _) = drive(&parents, |c| if bad[c] { Verdict::Bad } else { Verdict::Good });
        prop_assert_eq!(result, SearchResult::Found(culprit));
    }

    #[test]
    fn linear_search_needs_at_most_log2_plus_one(n in 1usize..2000, pick in any::<prop::sample::Index>()) {
        let parents: Vec<Vec<usize>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let culprit = pick.index(n);
        let (result, probes) = drive(&parents, |c| if c >= culprit { Verdict::Bad } else { Verdict::Good });
        prop_assert_eq!(result, SearchResult::Found(culprit));
        let bound = (n as f64).log2().ceil() as usize + 1;
        prop_assert!(probes <= bound, "{} probes for {} commits", probes, n);
    }

    #[test]
    fn skips_never_give_a_wrong_answer(
        n in 2usize..300,
        pick in any::<prop::sample::Index>(),
        skipped in proptest::collection::btree_set(0usize..300, 0..40),
    ) {
        let parents: Vec<Vec<usize>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let culprit = pick.index(n);
        let (result, _) = drive(&parents, |c| {
            if skipped.contains(&c) { Verdict::Skip } else if c >= culprit { Verdict::Bad } else { Verdict::Good }
        });
        match result {
            SearchResult::Found(c) => prop_assert_eq!(c, culprit),
            SearchResult::Ambiguous(cands) => {
                prop_assert!(cands.contains(&culprit));
                // Every candidate but the last known bad was skipped.
                prop_assert!(cands[..cands.len() - 1].iter().all(|c| skipped.contains(c)));
            }
        }
    }
}

/// The search as first written, with one full ancestor set per commit (quadratic memory): the reference the
/// linear-memory search must agree with, probe for probe.
struct Reference {
    ancestors: Vec<Vec<bool>>,
    candidates: Vec<bool>,
    skipped: Vec<bool>,
    bad: usize,
    streak: u32,
}

impl Reference {
    fn new(parents: &[Vec<usize>]) -> Self {
        let n = parents.len();
        let ancestors: Vec<Vec<bool>> = (0..n).map(|c| ancestors(parents, c)).collect();
        Self {
            candidates: ancestors[n - 1].clone(),
            ancestors,
            skipped: vec![false; n],
            bad: n - 1,
            streak: 0,
        }
    }

    fn count(&self, c: usize) -> usize {
        (0..self.candidates.len())
            .filter(|&i| self.candidates[i] && self.ancestors[c][i])
            .count()
    }

    fn mark(&mut self, c: usize, v: Verdict) {
        if !self.candidates[c] {
            return;
        }
        self.streak = if v == Verdict::Skip {
            self.streak + 1
        } else {
            self.streak.saturating_sub(1)
        };
        match v {
            Verdict::Bad => {
                for i in 0..self.candidates.len() {
                    self.candidates[i] &= self.ancestors[c][i];
                }
                self.bad = c;
            }
            Verdict::Good => {
                for i in 0..self.candidates.len() {
                    self.candidates[i] &= !self.ancestors[c][i];
                }
            }
            Verdict::Skip => self.skipped[c] = true,
        }
    }

    fn next(&mut self) -> Option<usize> {
        let n = self.candidates.len();
        let total = self.candidates.iter().filter(|&&x| x).count();
        let everyone: Vec<usize> = (0..n)
            .filter(|&c| self.candidates[c] && c != self.bad)
            .collect();
        let open: Vec<usize> = everyone
            .iter()
            .copied()
            .filter(|&c| !self.skipped[c])
            .collect();
        if open.is_empty() {
            return None;
        }
        let score = |s: &Self, c: usize| {
            let x = s.count(c);
            x.min(total - x)
        };
        let best = *everyone
            .iter()
            .max_by_key(|&&c| (score(self, c), std::cmp::Reverse(c)))
            .unwrap();
        if !self.skipped[best] {
            return Some(best);
        }
        // Away from the skipped best commit: strides doubling with each skip in a row, alternate sides.
        let stride = 1i64 << self.streak.min(40);
        let x = self.count(best) as i64;
        let target = if self.streak.is_multiple_of(2) {
            x - stride
        } else {
            x + stride
        };
        open.iter()
            .copied()
            .min_by_key(|&c| ((self.count(c) as i64 - target).abs(), c))
    }
}

proptest! {
    #[test]
    fn probes_are_the_same_as_the_quadratic_reference(
        parents in (2usize..80).prop_flat_map(dag),
        pick in any::<prop::sample::Index>(),
        skipped in proptest::collection::btree_set(0usize..80, 0..12),
    ) {
        let n = parents.len();
        let culprit = pick.index(n);
        let bad: Vec<bool> = (0..n).map(|c| ancestors(&parents, c)[culprit]).collect();
        prop_assume!(bad[n - 1]);
        let oracle = |c: usize| {
            if skipped.contains(&c) && c != n - 1 {
                Verdict::Skip
            } else if bad[c] {
                Verdict::Bad
            } else {
                Verdict::Good
            }
        };
        let mut fast = Bisector::new(&parents);
        let mut slow = Reference::new(&parents);
        loop {
            let expected = slow.next();
            match fast.next_step() {
                NextStep::Evaluate(c) => {
                    prop_assert_eq!(Some(c), expected);
                    fast.mark(c, oracle(c));
                    slow.mark(c, oracle(c));
                }
                NextStep::Done(_) => {
                    prop_assert_eq!(None, expected);
                    break;
                }
                NextStep::Wait | NextStep::EvaluateMany(_) => prop_assert!(false, "sequential search waited"),
            }
        }
    }
}

/// Parallel workers: drives `propose` with `k` workers; `order` decides which probe in flight lands next
/// (any order: the answers come back as they come). Returns the result and the number of rounds when
/// `lockstep` (every probe of a round lands before the next round is proposed).
fn drive_parallel(
    parents: &[Vec<usize>],
    k: usize,
    bad: &[bool],
    order: &[prop::sample::Index],
    lockstep: bool,
) -> (SearchResult, usize, usize) {
    let mut search = Bisector::new(parents);
    let mut flying: Vec<usize> = Vec::new();
    let (mut rounds, mut probes, mut turn) = (0, 0, 0);
    loop {
        if flying.len() < k && (!lockstep || flying.is_empty()) {
            match search.propose(k - flying.len()) {
                NextStep::Evaluate(c) => {
                    assert!(!flying.contains(&c), "proposed {c} twice");
                    flying.push(c);
                    rounds += 1;
                }
                NextStep::EvaluateMany(cs) => {
                    assert!(
                        cs.len() <= k - flying.len(),
                        "more probes than idle workers"
                    );
                    for c in cs {
                        assert!(!flying.contains(&c), "proposed {c} twice");
                        flying.push(c);
                    }
                    rounds += 1;
                }
                NextStep::Done(r) => return (r, rounds, probes),
                NextStep::Wait => assert!(!flying.is_empty(), "waits with nothing in flight"),
            }
        }
        let land = if lockstep {
            std::mem::take(&mut flying)
        } else {
            let i = order[turn % order.len()].index(flying.len());
            turn += 1;
            vec![flying.remove(i)]
        };
        for c in land {
            probes += 1;
            search.mark(c, if bad[c] { Verdict::Bad } else { Verdict::Good });
        }
    }
}

proptest! {
    #[test]
    fn parallel_workers_find_the_culprit_whatever_order_answers_land_in(
        parents in (2usize..50).prop_flat_map(dag),
        pick in any::<prop::sample::Index>(),
        k in 1usize..=8,
        order in proptest::collection::vec(any::<prop::sample::Index>(), 1..20),
    ) {
        let culprit = pick.index(parents.len());
        let tip = parents.len() - 1;
        let bad: Vec<bool> = (0..parents.len()).map(|c| ancestors(&parents, c)[culprit]).collect();
        prop_assert!(bad[tip]);
        let (result, _, _) = drive_parallel(&parents, k, &bad, &order, false);
        prop_assert_eq!(result, SearchResult::Found(culprit));
    }

    #[test]
    fn parallel_rounds_on_a_line_stay_within_log_base_k_plus_one(
        n in 2usize..3000,
        pick in any::<prop::sample::Index>(),
        k in 1usize..=8,
    ) {
        let parents: Vec<Vec<usize>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let culprit = pick.index(n);
        let bad: Vec<bool> = (0..n).map(|c| c >= culprit).collect();
        let (result, rounds, _) = drive_parallel(&parents, k, &bad, &[], true);
        prop_assert_eq!(result, SearchResult::Found(culprit));
        let bound = ((n as f64).ln() / ((k + 1) as f64).ln()).ceil() as usize + 1;
        prop_assert!(rounds <= bound, "{} rounds for n={} k={} (bound {})", rounds, n, k, bound);
    }
}

// ---- the Bayesian search for flaky faults ----------------------------------------------------------

use cudabisect::bisect::{BayesSearch, BayesStep};

/// The posterior by brute force: every culprit's likelihood under `p`, normalised.
fn brute_posterior(parents: &[Vec<usize>], runs: &[(usize, bool)], p: f64) -> Vec<f64> {
    let n = parents.len();
    let tip = ancestors(parents, n - 1);
    let mut w: Vec<f64> = (0..n)
        .map(|x| {
            if !tip[x] {
                return 0.0;
            }
            runs.iter().fold(1.0, |acc, &(c, fault)| {
                let holds = ancestors(parents, c)[x];
                acc * match (holds, fault) {
                    (true, true) => p,
                    (true, false) => 1.0 - p,
                    (false, true) => 0.0,
                    (false, false) => 1.0,
                }
            })
        })
        .collect();
    let total: f64 = w.iter().sum();
    w.iter_mut().for_each(|v| *v /= total);
    w
}

use cudabisect::sample::shapes::SeededRng as Rng;

proptest! {
    #[test]
    fn the_posterior_matches_brute_force(
        parents in (2usize..9).prop_flat_map(dag),
        pick in any::<prop::sample::Index>(),
        runs in proptest::collection::vec((any::<prop::sample::Index>(), any::<bool>()), 0..12),
        p in 0.05f64..0.95,
    ) {
        let n = parents.len();
        let culprit = pick.index(n);
        let mut s = BayesSearch::new(&parents, Some(p), 0.99, 1000);
        // Runs consistent with the culprit: a commit without the bug never faults.
        let runs: Vec<(usize, bool)> = runs
            .iter()
            .map(|(c, f)| {
                let c = c.index(n);
                (c, *f && ancestors(&parents, c)[culprit])
            })
            .collect();
        for &(c, f) in &runs {
            s.record(c, f);
        }
        let (_, post) = s.estimate();
        let want = brute_posterior(&parents, &runs, p);
        for x in 0..n {
            prop_assert!((post[x] - want[x]).abs() < 1e-9, "x={} {:?} vs {:?}", x, post, want);
        }
    }

    #[test]
    fn the_search_never_stops_below_the_confidence_asked(
        n in 2usize..200,
        pick in any::<prop::sample::Index>(),
        p in 0.2f64..1.0,
        seed in 1u64..u64::MAX,
        confidence in 0.8f64..0.999,
    ) {
        let parents: Vec<Vec<usize>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let culprit = pick.index(n);
        let mut rng = Rng(seed);
        let mut s = BayesSearch::new(&parents, None, confidence, 400);
        for _ in 0..8 {
            let f = rng.unit() < p;
            s.record(n - 1, f);
        }
        loop {
            match s.next_step() {
                BayesStep::Run(c) => {
                    let f = c >= culprit && rng.unit() < p;
                    s.record(c, f);
                }
                BayesStep::Done(r) => {
                    if r.reached {
                        prop_assert!(r.confidence >= confidence, "{:?}", r);
                    } else {
                        prop_assert!(r.runs >= 400, "gave up early: {:?}", r);
                    }
                    break;
                }
            }
        }
    }

    #[test]
    fn with_a_fault_that_always_shows_it_is_plain_bisection(
        n in 1usize..1500,
        pick in any::<prop::sample::Index>(),
    ) {
        let parents: Vec<Vec<usize>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let culprit = pick.index(n);
        let oracle = |c: usize| if c >= culprit { Verdict::Bad } else { Verdict::Good };
        let mut plain = Bisector::new(&parents);
        let mut plain_asked = Vec::new();
        let found = loop {
            match plain.next_step() {
                NextStep::Evaluate(c) => {
                    plain_asked.push(c);
                    plain.mark(c, oracle(c));
                }
                NextStep::Done(r) => break r,
                _ => unreachable!(),
            }
        };
        let mut bayes = BayesSearch::new(&parents, Some(1.0), 0.999, 10_000);
        let mut bayes_asked = Vec::new();
        let result = loop {
            match bayes.next_step() {
                BayesStep::Run(c) => {
                    bayes_asked.push(c);
                    bayes.record(c, oracle(c) == Verdict::Bad);
                }
                BayesStep::Done(r) => break r,
            }
        };
        prop_assert_eq!(found, SearchResult::Found(culprit));
        prop_assert_eq!(result.culprit, culprit);
        prop_assert!(result.reached);
        prop_assert_eq!(bayes_asked, plain_asked);
    }
}
