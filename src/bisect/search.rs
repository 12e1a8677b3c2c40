//! The bisection state machine over a commit DAG: `next_step()` proposes a probe, `mark()` records its verdict.
//!
//! Commits are plain indices `0..n` in topological order (parents before children); the last one is the
//! known-bad endpoint. The machine follows git's "best bisection": it proposes the candidate whose ancestor
//! count X within the remaining candidates maximises min(X, N − X), so every answer removes about half of
//! them, on linear and merge-heavy histories alike. When the best candidate was skipped it steps away from the
//! skipped cluster as git does (`skip_away`), with a seeded generator so that runs are reproducible.
//! Several probes may be in flight at once, and a commit may be marked more than once.

use super::BitSet;

/// What a probe says about one commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The commit does not show the target fault.
    Good,
    /// The commit shows the target fault.
    Bad,
    /// The commit could not be judged (build break, hang, another failure).
    Skip,
}

/// How the search ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchResult {
    /// Exactly one commit is the first bad one.
    Found(usize),
    /// Skips left several commits, any of which may be the first bad one (topological order).
    Ambiguous(Vec<usize>),
}

/// What the caller should do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// Probe this commit.
    Evaluate(usize),
    /// Nothing new to propose until a probe in flight is marked.
    Wait,
    /// The search is over.
    Done(SearchResult),
}

/// The search state. It never runs anything: the caller probes and reports back through [`Bisector::mark`].
#[derive(Clone, Debug)]
pub struct Bisector {
    ancestors: Vec<BitSet>,
    candidates: BitSet,
    skipped: BitSet,
    in_flight: BitSet,
    bad: usize,
    rng: u64,
}

impl Bisector {
    /// Builds the search over `parents[i]` (indices smaller than `i`, within the range) with the last commit
    /// known bad. Parents outside `0..i` are ignored: they lie outside the range.
    ///
    /// # Panics
    /// When `parents` is empty: a range always holds at least its bad endpoint.
    pub fn new(parents: &[Vec<usize>]) -> Self {
        assert!(
            !parents.is_empty(),
            "a search range holds at least the bad commit"
        );
        let n = parents.len();
        let mut ancestors: Vec<BitSet> = Vec::with_capacity(n);
        for (i, ps) in parents.iter().enumerate() {
            let mut set = BitSet::new(n);
            set.insert(i);
            for &p in ps.iter().filter(|&&p| p < i) {
                set.union_with(&ancestors[p]);
            }
            ancestors.push(set);
        }
        // Only ancestors of the bad endpoint can be the first bad commit.
        let candidates = ancestors[n - 1].clone();
        Self {
            ancestors,
            candidates,
            skipped: BitSet::new(n),
            in_flight: BitSet::new(n),
            bad: n - 1,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Number of commits that may still be the first bad one, the current bad commit included.
    pub fn remaining(&self) -> usize {
        self.candidates.count()
    }

    /// Rough number of probes left, as `git bisect` estimates it.
    pub fn estimated_steps(&self) -> usize {
        let open = self
            .remaining()
            .saturating_sub(self.skipped.count_common(&self.candidates));
        usize::BITS as usize - open.max(1).leading_zeros() as usize - 1
    }

    /// The commits that may still be the first bad one, in topological order.
    pub fn candidates(&self) -> Vec<usize> {
        self.candidates.iter().collect()
    }

    /// Records a verdict for `commit` and forgets that it was in flight. Verdicts on commits that are no
    /// longer candidates (a parallel probe overtaken by another) carry no news and are ignored.
    pub fn mark(&mut self, commit: usize, verdict: Verdict) {
        self.in_flight.remove(commit);
        if !self.candidates.contains(commit) {
            return;
        }
        match verdict {
            Verdict::Bad => {
                self.candidates.intersect_with(&self.ancestors[commit]);
                self.bad = commit;
            }
            Verdict::Good => self.candidates.subtract(&self.ancestors[commit]),
            Verdict::Skip => self.skipped.insert(commit),
        }
    }

    /// Proposes the next probe and marks it in flight, or says that the search is over.
    pub fn next_step(&mut self) -> NextStep {
        let mut open = self.candidates.clone();
        open.subtract(&self.skipped);
        open.remove(self.bad);
        if open.count() == 0 {
            return NextStep::Done(self.result());
        }
        open.subtract(&self.in_flight);
        if open.count() == 0 {
            return NextStep::Wait;
        }
        let pick = self.pick(&open);
        self.in_flight.insert(pick);
        NextStep::Evaluate(pick)
    }

    fn result(&self) -> SearchResult {
        if self.candidates.count() == 1 {
            SearchResult::Found(self.bad)
        } else {
            SearchResult::Ambiguous(self.candidates())
        }
    }

    /// How well probing `commit` halves the candidates: min(X, N − X).
    fn score(&self, commit: usize, total: usize) -> usize {
        let below = self.ancestors[commit].count_common(&self.candidates);
        below.min(total - below)
    }

    fn pick(&mut self, open: &BitSet) -> usize {
        let total = self.candidates.count();
        let mut everyone = self.candidates.clone();
        everyone.remove(self.bad);
        everyone.subtract(&self.in_flight);
        // Best over all candidates, skipped ones included: when that is testable take it, as git does.
        let best = everyone
            .iter()
            .max_by_key(|&c| (self.score(c, total), std::cmp::Reverse(c)))
            .unwrap_or(self.bad);
        if open.contains(best) {
            return best;
        }
        // The best commit was skipped: its neighbours probably break the same way, so pick among the others
        // with a bias towards good halving but away from the top of the list (git's count·r·√r).
        let mut ranked: Vec<usize> = open.iter().collect();
        ranked.sort_by_key(|&c| (std::cmp::Reverse(self.score(c, total)), c));
        let r = self.next_random();
        let index = ((ranked.len() as f64) * r * r.sqrt()) as usize;
        ranked[index.min(ranked.len() - 1)]
    }

    /// xorshift64*: deterministic, so a rerun of the same search asks for the same commits.
    fn next_random(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(n: usize) -> Vec<Vec<usize>> {
        (0..n)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect()
    }

    /// Drives the search with an oracle, returning the result and the commits probed in order.
    fn drive(
        parents: &[Vec<usize>],
        oracle: impl Fn(usize) -> Verdict,
    ) -> (SearchResult, Vec<usize>) {
        let mut search = Bisector::new(parents);
        let mut asked = Vec::new();
        loop {
            match search.next_step() {
                NextStep::Evaluate(c) => {
                    asked.push(c);
                    search.mark(c, oracle(c));
                }
                NextStep::Done(result) => return (result, asked),
                NextStep::Wait => unreachable!("one probe at a time never waits"),
            }
        }
    }

    #[test]
    fn linear_search_asks_the_midpoints() {
        // Range of 8: commits 0..=7, 7 is bad; the culprit is 5.
        let (result, asked) = drive(&linear(8), |c| {
            if c >= 5 {
                Verdict::Bad
            } else {
                Verdict::Good
            }
        });
        assert_eq!(result, SearchResult::Found(5));
        assert_eq!(asked, vec![3, 5, 4]);
    }

    #[test]
    fn single_commit_range_needs_no_probe() {
        let (result, asked) = drive(&linear(1), |_| unreachable!());
        assert_eq!(result, SearchResult::Found(0));
        assert!(asked.is_empty());
    }

    #[test]
    fn skipped_neighbours_leave_an_ambiguous_set() {
        // Culprit 4; commits 3 and 4 cannot be tested.
        let (result, _) = drive(&linear(8), |c| match c {
            3 | 4 => Verdict::Skip,
            c if c >= 4 => Verdict::Bad,
            _ => Verdict::Good,
        });
        assert_eq!(result, SearchResult::Ambiguous(vec![3, 4, 5]));
    }

    #[test]
    fn a_skip_steps_away_from_the_best_commit() {
        let mut search = Bisector::new(&linear(100));
        let NextStep::Evaluate(first) = search.next_step() else {
            panic!()
        };
        search.mark(first, Verdict::Skip);
        let NextStep::Evaluate(second) = search.next_step() else {
            panic!()
        };
        assert_ne!(first, second);
    }

    #[test]
    fn merge_history_finds_the_culprit_on_a_side_branch() {
        // 0 - 1 - 2 ------- 5(merge) - 6
        //      \- 3 - 4 -/
        let parents = vec![
            vec![],
            vec![0],
            vec![1],
            vec![1],
            vec![3],
            vec![2, 4],
            vec![5],
        ];
        let bad_set = [3, 4, 5, 6];
        let (result, _) = drive(&parents, |c| {
            if bad_set.contains(&c) {
                Verdict::Bad
            } else {
                Verdict::Good
            }
        });
        assert_eq!(result, SearchResult::Found(3));
    }

    #[test]
    fn parallel_probes_are_distinct_and_wait_when_exhausted() {
        let mut search = Bisector::new(&linear(3));
        let a = search.next_step();
        let b = search.next_step();
        assert!(matches!(a, NextStep::Evaluate(_)) && matches!(b, NextStep::Evaluate(_)));
        assert_ne!(a, b);
        assert_eq!(search.next_step(), NextStep::Wait);
    }

    #[test]
    fn repeated_and_stale_marks_are_harmless() {
        let mut search = Bisector::new(&linear(10));
        search.mark(6, Verdict::Bad);
        search.mark(8, Verdict::Good); // no longer a candidate: ignored
        search.mark(6, Verdict::Bad);
        assert_eq!(search.remaining(), 7);
    }
}
