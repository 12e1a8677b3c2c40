//! The bisection state machine over a commit DAG: `next_step()` proposes a probe, `mark()` records its verdict.
//!
//! Commits are plain indices `0..n` in topological order (parents before children); the last one is the
//! known-bad endpoint. The machine follows git's "best bisection": it proposes the candidate whose ancestor
//! count X within the remaining candidates maximises min(X, N − X), so every answer removes about half of
//! them, on linear and merge-heavy histories alike. When the best candidate was skipped it steps away from the
//! skipped cluster with strides that double with every skip in a row, alternating sides, so a run of
//! untestable commits costs about the logarithm of its length.
//! Several probes may be in flight at once, and a commit may be marked more than once.

use super::bitset::BitSet;
use super::dag::Dag;

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

/// Cells up to this many candidates get exact ancestor counts when probes are proposed several at once.
const EXACT_CELL: usize = 20_000;

/// What the caller should do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// Probe this commit.
    Evaluate(usize),
    /// Probe these commits at once, one per idle worker ([`Bisector::propose`]).
    EvaluateMany(Vec<usize>),
    /// Nothing new to propose until a probe in flight is marked.
    Wait,
    /// The search is over.
    Done(SearchResult),
}

/// The search state. It never runs anything: the caller probes and reports back through [`Bisector::mark`].
///
/// Memory is linear in the number of commits: the DAG as flat parent lists, three bit sets and a few
/// counters per commit. Ancestor counts are computed when a step is asked for, as git does: a commit with
/// one parent among the candidates counts one more than that parent; a merge is counted by a walk, and only
/// when its bounds say it could beat the best commit found so far.
#[derive(Clone, Debug)]
pub struct Bisector {
    dag: Dag,
    candidates: BitSet,
    skipped: BitSet,
    in_flight: BitSet,
    bad: usize,
    /// Skips marked since the last good or bad verdict: how far to step away from a skipped cluster.
    streak: u32,
}

/// What is known of a commit's ancestor count within the candidates during one step.
#[derive(Clone, Copy, Debug, Default)]
struct Count {
    low: u32,
    high: u32,
}

/// Scratch space for walks: a visit stamp per commit, so a walk needs no clearing.
struct Walker {
    stamp: Vec<u32>,
    epoch: u32,
    stack: Vec<u32>,
}

impl Walker {
    fn new(n: usize) -> Self {
        Self {
            stamp: vec![0; n],
            epoch: 0,
            stack: Vec::new(),
        }
    }

    /// Visits `from` and its ancestors within `within` (every ancestor of a candidate that is a candidate
    /// is reached through candidates), calling `visit` once for each.
    fn walk(&mut self, b: &Bisector, from: usize, within: &BitSet, mut visit: impl FnMut(usize)) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
        self.stack.clear();
        self.stack.push(from as u32);
        while let Some(c) = self.stack.pop() {
            let c = c as usize;
            if self.stamp[c] == self.epoch || !within.contains(c) {
                continue;
            }
            self.stamp[c] = self.epoch;
            visit(c);
            self.stack.extend(b.parents_of(c).iter().copied());
        }
    }
}

impl Bisector {
    /// Builds the search over `parents[i]` (indices smaller than `i`, within the range) with the last commit
    /// known bad. Parents outside `0..i` are ignored: they lie outside the range.
    ///
    /// # Panics
    /// When `parents` is empty: a range always holds at least its bad endpoint.
    pub fn new(parents: &[Vec<usize>]) -> Self {
        let dag = Dag::new(parents);
        let n = dag.len();
        let mut b = Self {
            dag,
            candidates: BitSet::new(n),
            skipped: BitSet::new(n),
            in_flight: BitSet::new(n),
            bad: n - 1,
            streak: 0,
        };
        // Only ancestors of the bad endpoint can be the first bad commit.
        let everything = BitSet::full(n);
        let mut reach = BitSet::new(n);
        Walker::new(n).walk(&b, n - 1, &everything, |c| reach.insert(c));
        b.candidates = reach;
        b
    }

    fn parents_of(&self, c: usize) -> &[u32] {
        self.dag.parents_of(c)
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
        let n = self.dag.len();
        // A verdict halves the stride rather than resetting it: the run of skips is still there, and the
        // next best commit often falls in it again.
        self.streak = match verdict {
            Verdict::Skip => self.streak.saturating_add(1),
            Verdict::Good | Verdict::Bad => self.streak.saturating_sub(1),
        };
        match verdict {
            Verdict::Bad => {
                let mut keep = BitSet::new(n);
                Walker::new(n).walk(self, commit, &self.candidates, |c| keep.insert(c));
                self.candidates = keep;
                self.bad = commit;
            }
            Verdict::Good => {
                let mut gone = BitSet::new(n);
                Walker::new(n).walk(self, commit, &self.candidates, |c| gone.insert(c));
                self.candidates.subtract(&gone);
            }
            Verdict::Skip => self.skipped.insert(commit),
        }
    }

    /// Proposes the next probe and marks it in flight, or says that the search is over.
    pub fn next_step(&mut self) -> NextStep {
        let open = match self.open() {
            Ok(open) => open,
            Err(step) => return step,
        };
        let pick = self.pick(&open);
        self.in_flight.insert(pick);
        NextStep::Evaluate(pick)
    }

    /// Proposes up to `idle` probes at once (one per idle worker) and marks them in flight: the commits
    /// that, together with the probes already in flight, split the candidates into parts as even as the
    /// DAG allows. The candidates fall into cells by which in-flight probes they are ancestors of (their
    /// answers will tell those cells apart); idle workers go to the cells with the most candidates per
    /// worker, and a cell given `a` workers is cut at the commits whose ancestor counts within it are
    /// nearest to `i·|cell|/(a+1)`. On a line, k idle workers with nothing in flight probe the k
    /// quantiles, so every round keeps about 1/(k+1) of the candidates. With one idle worker and nothing
    /// in flight this is exactly [`Bisector::next_step`].
    pub fn propose(&mut self, idle: usize) -> NextStep {
        if idle <= 1 && self.in_flight.count() == 0 {
            return self.next_step();
        }
        let open = match self.open() {
            Ok(open) => open,
            Err(step) => return step,
        };
        if idle == 0 {
            return NextStep::Wait;
        }
        let n = self.dag.len();
        // Cells: which in-flight probes each candidate is an ancestor of (bit i for the i-th probe).
        let flying: Vec<usize> = self.in_flight.iter().collect();
        let mut mask = vec![0u128; n];
        let mut walker = Walker::new(n);
        for (bit, &f) in flying.iter().enumerate().take(128) {
            walker.walk(self, f, &self.candidates, |c| mask[c] |= 1u128 << bit);
        }
        let mut cells: Vec<(u128, BitSet, usize)> = Vec::new();
        for c in self.candidates.iter() {
            match cells.iter_mut().find(|(m, _, _)| *m == mask[c]) {
                Some((_, members, size)) => {
                    members.insert(c);
                    *size += 1;
                }
                None => {
                    let mut members = BitSet::new(n);
                    members.insert(c);
                    cells.push((mask[c], members, 1));
                }
            }
        }
        // Workers to cells, greedily: the cell with the most candidates per allotted worker next, among
        // cells that still have an open commit to give.
        let mut allotted = vec![0usize; cells.len()];
        let mut room: Vec<usize> = cells
            .iter()
            .map(|(_, members, _)| members.count_common(&open))
            .collect();
        for _ in 0..idle {
            let Some(best) = (0..cells.len())
                .filter(|&i| room[i] > allotted[i] && cells[i].2 > 1)
                .max_by(|&a, &b| {
                    let (sa, sb) = (
                        cells[a].2 * (allotted[b] + 1),
                        cells[b].2 * (allotted[a] + 1),
                    );
                    sa.cmp(&sb).then(b.cmp(&a))
                })
            else {
                break;
            };
            allotted[best] += 1;
        }
        let mut picks = Vec::new();
        for (i, (_, members, size)) in cells.iter().enumerate() {
            let a = allotted[i];
            if a == 0 {
                continue;
            }
            let mut eligible = members.clone();
            eligible.intersect_with(&open);
            // Ancestor counts within the cell: the cell is the candidate set of its own sub-search. Exact
            // (a walk per merge) while the cell is small enough for that to be cheap; in a larger cell
            // only the bounds that propagate along parents (exact on a line; a merge's count is taken as
            // the middle of its bounds), so a proposal never costs a walk per merge of a huge history.
            let saved = std::mem::replace(&mut self.candidates, members.clone());
            let counts = if *size <= EXACT_CELL {
                self.counts(&eligible, false)
            } else {
                self.counts(&BitSet::new(n), true)
            };
            self.candidates = saved;
            let estimate = |c: usize| (f64::from(counts[c].low) + f64::from(counts[c].high)) / 2.0;
            for q in 1..=a {
                let target = (q * size) as f64 / (a + 1) as f64;
                let pick = eligible
                    .iter()
                    .filter(|c| !picks.contains(c))
                    .min_by(|&x, &y| {
                        let dx = (estimate(x) - target).abs();
                        let dy = (estimate(y) - target).abs();
                        dx.total_cmp(&dy).then(x.cmp(&y))
                    });
                if let Some(c) = pick {
                    picks.push(c);
                }
            }
            room[i] = 0;
        }
        if picks.is_empty() {
            return NextStep::Wait;
        }
        picks.sort_unstable();
        for &c in &picks {
            self.in_flight.insert(c);
        }
        NextStep::EvaluateMany(picks)
    }

    /// The candidates that can be proposed: not skipped, not the current bad one, not in flight; or why
    /// there are none (the search is over, or it waits for a probe in flight).
    fn open(&self) -> Result<BitSet, NextStep> {
        let mut open = self.candidates.clone();
        open.subtract(&self.skipped);
        open.remove(self.bad);
        if open.count() == 0 {
            return Err(NextStep::Done(self.result()));
        }
        open.subtract(&self.in_flight);
        if open.count() == 0 {
            return Err(NextStep::Wait);
        }
        Ok(open)
    }

    /// The commits probed now but not yet marked.
    pub fn in_flight(&self) -> Vec<usize> {
        self.in_flight.iter().collect()
    }

    /// Whether `commit` may still be the first bad one: a probe of it still carries news.
    pub fn is_candidate(&self, commit: usize) -> bool {
        self.candidates.contains(commit)
    }

    /// Forgets that `commit` is in flight without a verdict (its probe was abandoned).
    pub fn abandon(&mut self, commit: usize) {
        self.in_flight.remove(commit);
    }

    fn result(&self) -> SearchResult {
        if self.candidates.count() == 1 {
            SearchResult::Found(self.bad)
        } else {
            SearchResult::Ambiguous(self.candidates())
        }
    }

    /// Ancestor counts X within the candidates for every candidate, in topological order. With `prune`,
    /// a merge whose bounds cannot beat the best min(X, N − X) seen so far among `eligible` keeps its
    /// bounds instead of being walked, and the pass stops at a perfect halving; without, every count is
    /// exact. Returns the counts (exact where `low == high`).
    fn counts(&self, eligible: &BitSet, prune: bool) -> Vec<Count> {
        let n = self.dag.len();
        let total = self.candidates.count() as u32;
        let mut counts = vec![Count::default(); n];
        let mut walker = Walker::new(n);
        let mut best = 0u32;
        let best_possible = |c: Count| {
            // The largest min(x, N − x) for x in [low, high].
            let half = total / 2;
            if c.low <= half && half <= c.high {
                half
            } else if c.high < half {
                c.high
            } else {
                total - c.low
            }
        };
        for c in self.candidates.iter() {
            let mut in_range = self
                .parents_of(c)
                .iter()
                .map(|&p| p as usize)
                .filter(|&p| self.candidates.contains(p));
            let first = in_range.next();
            let second = in_range.next();
            let propagated = match (first, second) {
                (None, _) => Count { low: 1, high: 1 },
                (Some(p), None) => Count {
                    low: counts[p].low + 1,
                    high: counts[p].high + 1,
                },
                (Some(_), Some(_)) => {
                    let ps = self
                        .parents_of(c)
                        .iter()
                        .map(|&p| p as usize)
                        .filter(|&p| self.candidates.contains(p));
                    let (low, sum) = ps.fold((0, 0), |(low, sum), p| {
                        (low.max(counts[p].low), sum + counts[p].high)
                    });
                    Count {
                        low: low + 1,
                        high: (sum + 1).min(total),
                    }
                }
            };
            let needed = if prune {
                eligible.contains(c) && best_possible(propagated) > best
            } else {
                true
            };
            let count = if propagated.low != propagated.high && needed {
                let mut x = 0u32;
                walker.walk(self, c, &self.candidates, |_| x += 1);
                Count { low: x, high: x }
            } else {
                propagated
            };
            counts[c] = count;
            if eligible.contains(c) && count.low == count.high {
                best = best.max(count.low.min(total - count.low));
                if prune && best == total / 2 {
                    // Nothing later can do better than a perfect halving, and ties go to the earlier commit.
                    break;
                }
            }
        }
        counts
    }

    fn pick(&mut self, open: &BitSet) -> usize {
        let total = self.candidates.count() as u32;
        let mut everyone = self.candidates.clone();
        everyone.remove(self.bad);
        everyone.subtract(&self.in_flight);
        let score = |c: Count| c.low.min(total - c.low);
        // Best over all candidates, skipped ones included: when that is testable take it, as git does.
        let counts = self.counts(&everyone, true);
        let best = everyone
            .iter()
            .filter(|&c| counts[c].low == counts[c].high)
            .max_by_key(|&c| (score(counts[c]), std::cmp::Reverse(c)))
            .unwrap_or(self.bad);
        if open.contains(best) {
            return best;
        }
        // The best commit was skipped: its neighbours probably break the same way (untestable commits come
        // in runs). Step away from it with strides that double with every skip in a row, on alternate
        // sides (ancestor count X − 1, + 2, − 4, + 8, …), so a run of L untestable commits costs about
        // log2 L probes to get out of, not one probe per commit.
        let best_x = i64::from(counts[best].low);
        let stride = 1i64 << self.streak.min(40);
        let target = if self.streak.is_multiple_of(2) {
            best_x - stride
        } else {
            best_x + stride
        };
        let counts = self.counts(open, false);
        open.iter()
            .min_by_key(|&c| ((i64::from(counts[c].low) - target).abs(), c))
            .unwrap_or(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(n: usize) -> Vec<Vec<usize>> {
        crate::sample::shapes::history("linear", n)
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
                NextStep::Wait | NextStep::EvaluateMany(_) => {
                    unreachable!("one probe at a time never waits")
                }
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
    fn a_run_of_untestable_commits_costs_about_its_logarithm() {
        // 100 commits, 36 in a row that cannot be built (30..=65); every culprit outside the run.
        let skipped = 30..=65;
        let (mut worst, mut total, mut count) = (0, 0, 0);
        for culprit in (0..100).filter(|c| !skipped.contains(c)) {
            let (result, asked) = drive(&linear(100), |c| {
                if skipped.contains(&c) {
                    Verdict::Skip
                } else if c >= culprit {
                    Verdict::Bad
                } else {
                    Verdict::Good
                }
            });
            // Right after the run, the culprit cannot be told from the untestable commits before it.
            if culprit == 66 {
                assert!(matches!(result, SearchResult::Ambiguous(_)), "{result:?}");
            } else {
                assert_eq!(result, SearchResult::Found(culprit));
            }
            if culprit != 66 {
                worst = worst.max(asked.len());
                total += asked.len();
                count += 1;
            }
        }
        let mean = total as f64 / count as f64;
        // ⌈log2 100⌉ = 7 probes without skips, plus getting out of the run, ⌈log2 36⌉ = 6, on average;
        // a culprit right at the run's edge needs that edge found exactly. (git's random step-away took
        // up to 45 probes here, one per untestable commit in the worst case.)
        assert!(mean <= 7.0 + 6.0 + 1.0, "mean {mean:.2} probes");
        assert!(worst <= 20, "{worst} probes");
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
