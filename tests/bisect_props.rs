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
            NextStep::Wait => panic!("sequential search waited"),
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
