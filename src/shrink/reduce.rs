//! The reduction state machine: from the node a synchronous run blamed, find a smallest set of nodes that
//! still fails the same way. Pure: it proposes candidates (`next_step`) and is told how they went (`mark`);
//! running them is someone else's job.

use std::collections::{BTreeSet, HashMap};

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Run these nodes (indices into the execution order, ascending) and `mark` the result.
    Run(Vec<usize>),
    /// The reduction is over: these nodes still fail, and removing any one of them does not.
    Done(Vec<usize>),
}

/// Which stage proposed a candidate, for progress and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The blamed node alone, on its recorded inputs.
    Alone,
    /// Binary search for the shortest window ending at the blamed node.
    Window,
    /// Delta debugging of the nodes left inside the window.
    Ddmin,
    /// The reduction is over.
    Done,
}

#[derive(Clone, Debug)]
enum State {
    Alone,
    /// Invariant: the window starting at `lo` fails, the one starting at `hi` does not.
    Window {
        lo: usize,
        hi: usize,
    },
    /// Complement-based delta debugging of `rest`; `fixed` (always holding the fault) is kept.
    Ddmin {
        fixed: Vec<usize>,
        rest: Vec<usize>,
        granularity: usize,
        chunk: usize,
    },
    /// Checks that no fixed node but the fault can go: `result` minus `result_fixed[next]`.
    Verify {
        result: Vec<usize>,
        fixed: Vec<usize>,
        next: usize,
    },
    Done(Vec<usize>),
}

/// Shrinks a failing run of `n` nodes (in execution order) whose fault was located at node `fault`.
///
/// The order of stages is cheapest first: the blamed node alone (most faults need nothing else once its
/// inputs are the recorded ones); else the shortest failing window `[s..=fault]` by binary search (the
/// nodes after the fault never ran, the ones before `s` are not needed); then delta debugging of the
/// window's inside until every remaining node is needed. The blamed node is always kept: a candidate
/// without it would fail somewhere else, if at all. Outcomes are cached by candidate, so no candidate is
/// run twice.
#[derive(Clone, Debug)]
pub struct Reducer {
    fault: usize,
    state: State,
    cache: HashMap<Vec<usize>, bool>,
    runs: usize,
    pending: Option<Vec<usize>>,
}

impl Reducer {
    /// A reduction of `n` nodes in execution order, starting from node `fault`, where the recorded run died.
    pub fn new(n: usize, fault: usize) -> Self {
        assert!(fault < n, "the blamed node is one of the nodes");
        let mut cache = HashMap::new();
        // The located run is the whole prefix up to the fault; it failed.
        cache.insert((0..=fault).collect(), true);
        Self {
            fault,
            state: State::Alone,
            cache,
            runs: 0,
            pending: None,
        }
    }

    /// The stage the next candidate comes from.
    pub fn stage(&self) -> Stage {
        match self.state {
            State::Alone => Stage::Alone,
            State::Window { .. } => Stage::Window,
            State::Ddmin { .. } | State::Verify { .. } => Stage::Ddmin,
            State::Done(_) => Stage::Done,
        }
    }
}

impl Reduction for Reducer {
    /// Candidates actually run so far (cache hits are free).
    fn runs(&self) -> usize {
        self.runs
    }

    /// The next candidate to run, or the result.
    fn next_step(&mut self) -> Step {
        loop {
            if let Some(p) = &self.pending {
                return Step::Run(p.clone());
            }
            let candidate = match &self.state {
                State::Done(result) => return Step::Done(result.clone()),
                State::Alone => vec![self.fault],
                State::Window { lo, hi } => (lo + (hi - lo) / 2..=self.fault).collect(),
                State::Ddmin {
                    fixed,
                    rest,
                    granularity,
                    chunk,
                } => {
                    let removed = chunk_of(rest, *granularity, *chunk);
                    let mut c: Vec<usize> = rest
                        .iter()
                        .copied()
                        .filter(|x| !removed.contains(x))
                        .collect();
                    c.extend(fixed);
                    c.sort_unstable();
                    c
                }
                State::Verify {
                    result,
                    fixed,
                    next,
                } => result
                    .iter()
                    .copied()
                    .filter(|&x| x != fixed[*next])
                    .collect(),
            };
            match self.cache.get(&candidate) {
                Some(&fails) => self.advance(&candidate, fails),
                None => {
                    self.pending = Some(candidate.clone());
                    return Step::Run(candidate);
                }
            }
        }
    }

    /// Records whether `candidate` (the one `next_step` proposed) failed the same way.
    fn mark(&mut self, candidate: &[usize], fails: bool) {
        if self.pending.as_deref() != Some(candidate) {
            // An answer to a question not asked: remember it, change nothing else.
            self.cache.insert(candidate.to_vec(), fails);
            return;
        }
        self.pending = None;
        self.runs += 1;
        self.cache.insert(candidate.to_vec(), fails);
        self.advance(candidate, fails);
    }
}

impl Reducer {
    fn advance(&mut self, candidate: &[usize], fails: bool) {
        self.state = match std::mem::replace(&mut self.state, State::Alone) {
            State::Alone if fails => State::Done(vec![self.fault]),
            State::Alone => State::Window {
                lo: 0,
                hi: self.fault,
            },
            State::Window { lo, hi } => {
                let mid = lo + (hi - lo) / 2;
                let (lo, hi) = if fails { (mid, hi) } else { (lo, mid) };
                if hi - lo <= 1 {
                    // Window [lo..=fault] fails and [lo+1..=fault] does not: node lo is needed. Delta
                    // debugging starts by dropping the whole inside, the common "producer + fault" case.
                    let rest: Vec<usize> = (lo + 1..self.fault).collect();
                    let fixed = vec![lo, self.fault];
                    if rest.is_empty() {
                        self.verify_or_done(fixed.clone(), fixed)
                    } else {
                        State::Ddmin {
                            fixed,
                            rest,
                            granularity: 1,
                            chunk: 0,
                        }
                    }
                } else {
                    State::Window { lo, hi }
                }
            }
            State::Ddmin {
                fixed,
                rest,
                granularity,
                chunk,
            } => {
                if fails {
                    let kept: Vec<usize> = candidate
                        .iter()
                        .copied()
                        .filter(|x| !fixed.contains(x))
                        .collect();
                    if kept.is_empty() {
                        self.verify_or_done(candidate.to_vec(), fixed)
                    } else {
                        State::Ddmin {
                            granularity: granularity
                                .saturating_sub(1)
                                .clamp(2, kept.len().max(2))
                                .min(kept.len()),
                            rest: kept,
                            fixed,
                            chunk: 0,
                        }
                    }
                } else if chunk + 1 < granularity {
                    State::Ddmin {
                        fixed,
                        rest,
                        granularity,
                        chunk: chunk + 1,
                    }
                } else if granularity >= rest.len() {
                    // Every single removal was tried and none failed: the rest is 1-minimal.
                    let mut result: Vec<usize> = rest.iter().chain(&fixed).copied().collect();
                    result.sort_unstable();
                    self.verify_or_done(result, fixed)
                } else {
                    State::Ddmin {
                        granularity: (granularity * 2).min(rest.len()),
                        fixed,
                        rest,
                        chunk: 0,
                    }
                }
            }
            State::Verify {
                result,
                fixed,
                next,
            } => {
                if fails {
                    // A fixed node was not needed after all (a non-monotone failure): reduce what is left.
                    let rest: Vec<usize> = candidate
                        .iter()
                        .copied()
                        .filter(|&x| x != self.fault)
                        .collect();
                    if rest.is_empty() {
                        State::Done(vec![self.fault])
                    } else {
                        State::Ddmin {
                            fixed: vec![self.fault],
                            rest,
                            granularity: 1,
                            chunk: 0,
                        }
                    }
                } else {
                    self.verify_from(result, fixed, next + 1)
                }
            }
            done @ State::Done(_) => done,
        };
    }
}

impl Reducer {
    fn verify_or_done(&self, result: Vec<usize>, fixed: Vec<usize>) -> State {
        self.verify_from(result, fixed, 0)
    }

    /// Verifies the fixed nodes from `next` on (the fault itself is never removed).
    fn verify_from(&self, result: Vec<usize>, fixed: Vec<usize>, next: usize) -> State {
        match (next..fixed.len()).find(|&i| fixed[i] != self.fault) {
            Some(i) => State::Verify {
                result,
                fixed,
                next: i,
            },
            None => State::Done(result),
        }
    }
}

/// The `chunk`-th of `granularity` near-equal consecutive parts of `rest`.
fn chunk_of(rest: &[usize], granularity: usize, chunk: usize) -> BTreeSet<usize> {
    let g = granularity.max(1).min(rest.len().max(1));
    let start = rest.len() * chunk / g;
    let end = rest.len() * (chunk + 1) / g;
    rest[start..end].iter().copied().collect()
}

/// The interface both reducers share, so one driver (or benchmark) can run either.
pub trait Reduction {
    /// The next candidate to run, or the result.
    fn next_step(&mut self) -> Step;
    /// Records whether `candidate` (the one `next_step` proposed) failed the same way.
    fn mark(&mut self, candidate: &[usize], fails: bool);
    /// Candidates actually run so far (cache hits are free).
    fn runs(&self) -> usize;
}

/// Plain delta debugging over all nodes, with no fault location: the baseline the benchmark compares
/// against. Same interface and cache; starts from the whole graph.
#[derive(Clone, Debug)]
pub struct PlainDdmin {
    rest: Vec<usize>,
    granularity: usize,
    chunk: usize,
    cache: HashMap<Vec<usize>, bool>,
    runs: usize,
    done: bool,
}

impl PlainDdmin {
    /// Plain delta debugging over all `n` nodes (the baseline benchmarks compare against).
    pub fn new(n: usize) -> Self {
        let mut cache = HashMap::new();
        cache.insert((0..n).collect(), true);
        Self {
            rest: (0..n).collect(),
            granularity: 2,
            chunk: 0,
            cache,
            runs: 0,
            done: n <= 1,
        }
    }
}

impl Reduction for PlainDdmin {
    fn runs(&self) -> usize {
        self.runs
    }

    fn next_step(&mut self) -> Step {
        loop {
            if self.done {
                return Step::Done(self.rest.clone());
            }
            let removed = chunk_of(&self.rest, self.granularity, self.chunk);
            let candidate: Vec<usize> = self
                .rest
                .iter()
                .copied()
                .filter(|x| !removed.contains(x))
                .collect();
            match self.cache.get(&candidate) {
                Some(&fails) => self.advance(candidate, fails),
                None => return Step::Run(candidate),
            }
        }
    }

    fn mark(&mut self, candidate: &[usize], fails: bool) {
        self.runs += 1;
        self.cache.insert(candidate.to_vec(), fails);
        self.advance(candidate.to_vec(), fails);
    }
}

impl PlainDdmin {
    fn advance(&mut self, candidate: Vec<usize>, fails: bool) {
        if fails && !candidate.is_empty() {
            self.rest = candidate;
            self.granularity = self
                .granularity
                .saturating_sub(1)
                .max(2)
                .min(self.rest.len());
            self.chunk = 0;
            self.done = self.rest.len() <= 1;
        } else if self.chunk + 1 < self.granularity {
            self.chunk += 1;
        } else if self.granularity >= self.rest.len() {
            self.done = true;
        } else {
            self.granularity = (self.granularity * 2).min(self.rest.len());
            self.chunk = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drive(mut r: Reducer, fails: impl Fn(&[usize]) -> bool) -> (Vec<usize>, usize) {
        loop {
            match r.next_step() {
                Step::Run(c) => {
                    let f = fails(&c);
                    r.mark(&c, f);
                }
                Step::Done(result) => return (result, r.runs()),
            }
        }
    }

    #[test]
    fn a_node_that_fails_alone_costs_one_run() {
        let (result, runs) = drive(Reducer::new(100, 42), |c| c.contains(&42));
        assert_eq!((result, runs), (vec![42], 1));
    }

    #[test]
    fn a_producer_and_the_fault_are_found_by_window_then_one_ddmin_step() {
        let (result, runs) = drive(Reducer::new(30, 20), |c| c.contains(&8) && c.contains(&20));
        assert_eq!(result, vec![8, 20]);
        // 1 alone + ⌈log2 20⌉ window steps (at most 5) + 1 ddmin step.
        assert!(runs <= 7, "{runs}");
    }

    #[test]
    fn three_needed_nodes_are_all_kept() {
        let need = [2, 9, 15];
        let (result, _) = drive(Reducer::new(16, 15), |c| need.iter().all(|n| c.contains(n)));
        assert_eq!(result, need.to_vec());
    }

    #[test]
    fn a_fault_in_the_first_node_needs_no_candidate_run() {
        // The locating run died in node 0 before any other node ran: that run was {0} alone, on the
        // recorded inputs, so it is already known to fail and no candidate is run.
        let (result, runs) = drive(Reducer::new(5, 0), |c| c.contains(&0));
        assert_eq!((result, runs), (vec![0], 0));
    }

    #[test]
    fn plain_ddmin_also_finds_it_but_with_more_runs() {
        let mut d = PlainDdmin::new(64);
        let result = loop {
            match d.next_step() {
                Step::Run(c) => {
                    let f = c.contains(&40);
                    d.mark(&c, f);
                }
                Step::Done(r) => break r,
            }
        };
        assert_eq!(result, vec![40]);
        assert!(d.runs() > 6, "{}", d.runs());
    }
}
