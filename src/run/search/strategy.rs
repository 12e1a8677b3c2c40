//! The strategies the one search loop runs: plain bisection, the Bayesian search for a flaky fault, the
//! re-runs of a culprit's parent that tell whether a plain answer was misled by a flaky fault, and the
//! verification of a flaky answer. Each proposes commits (by index) and takes their verdicts; none of them
//! runs anything. The loop in `driver.rs` swaps one for the next.

use crate::bisect::{
    rates_differ, BayesResult, BayesSearch, Bisector, NextStep, SearchResult, Verdict,
};
use crate::report::record::{ProbeRole, Verification};

/// What a strategy asks the loop to do next.
pub(super) enum Proposal {
    /// Probe these commits, one per idle worker.
    Run(Vec<usize>),
    /// Nothing to propose until a probe in flight is marked.
    Wait,
    /// This strategy is over.
    Done(Answer),
}

/// How a strategy ended.
pub(super) enum Answer {
    /// Plain bisection's answer.
    Plain(SearchResult),
    /// The Bayesian search's answer.
    Flaky(BayesResult),
    /// Commit `.0`'s parent ran clean every time: the plain answer stands.
    ParentClean(usize),
    /// Commit `.0`'s parent showed the fault: the fault is flaky after all.
    ParentFaults(usize),
    /// A flaky culprit's and its parent's rates.
    Verified(Verification),
    /// The runs of an answer made again: the first (by its place among them) that did not give its
    /// verdict, if one did not.
    RanAgain(Option<usize>),
}

/// One way of choosing what to probe next.
pub(super) trait Strategy {
    /// Up to `idle` commits to probe now, a wait, or the end.
    fn propose(&mut self, idle: usize) -> Proposal;
    /// A probe of commit `i` came back with `verdict`.
    fn mark(&mut self, i: usize, verdict: Verdict);
    /// A probe of commit `i` was stopped without a verdict.
    fn abandon(&mut self, i: usize);
    /// Whether a probe of `i` still in flight carries news (else the loop stops it).
    fn wants(&self, _i: usize) -> bool {
        true
    }
    /// Why its probes run.
    fn role(&self) -> ProbeRole {
        ProbeRole::Search
    }
    /// Whether it runs commits several times, each run counted apart (the journal keeps each apart).
    fn repeats(&self) -> bool {
        false
    }
    /// Whether a probe that says the host is broken ends the search (re-runs of an answer already found
    /// only lose that run: the answer is never lost to them).
    fn host_failure_ends(&self) -> bool {
        true
    }
    /// Candidates left and probes left, estimated, for progress.
    fn progress(&self) -> (usize, usize);
}

impl Strategy for Bisector {
    fn propose(&mut self, idle: usize) -> Proposal {
        match Bisector::propose(self, idle) {
            NextStep::Evaluate(i) => Proposal::Run(vec![i]),
            NextStep::EvaluateMany(v) => Proposal::Run(v),
            NextStep::Wait => Proposal::Wait,
            NextStep::Done(result) => Proposal::Done(Answer::Plain(result)),
        }
    }
    fn mark(&mut self, i: usize, verdict: Verdict) {
        Bisector::mark(self, i, verdict);
    }
    fn abandon(&mut self, i: usize) {
        Bisector::abandon(self, i);
    }
    fn wants(&self, i: usize) -> bool {
        self.is_candidate(i)
    }
    fn progress(&self) -> (usize, usize) {
        (self.remaining(), self.estimated_steps())
    }
}

/// The Bayesian search for a flaky fault, in rounds: each round runs the commits with the most expected
/// information at once, one per idle worker, and the posterior takes all their outcomes before the next.
/// One worker: one run at a time, where the expected information is largest.
pub(super) struct Flaky {
    pub(super) bayes: BayesSearch,
    pub(super) in_flight: usize,
    /// Progress as the plain search last saw it.
    pub(super) progress: (usize, usize),
}

impl Strategy for Flaky {
    fn propose(&mut self, idle: usize) -> Proposal {
        if self.in_flight > 0 {
            return Proposal::Wait;
        }
        match self.bayes.propose(idle) {
            Ok(runs) => {
                self.in_flight = runs.len();
                Proposal::Run(runs)
            }
            Err(result) => Proposal::Done(Answer::Flaky(result)),
        }
    }
    fn mark(&mut self, i: usize, verdict: Verdict) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match verdict {
            Verdict::Bad => self.bayes.record(i, true),
            Verdict::Good => self.bayes.record(i, false),
            Verdict::Skip => self.bayes.skip(i),
        }
    }
    fn abandon(&mut self, _i: usize) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
    fn repeats(&self) -> bool {
        true
    }
    fn progress(&self) -> (usize, usize) {
        self.progress
    }
}

/// After a plain search found commit `culprit` while the bad end was run several times: its parent is run
/// as many times, one run at a time, and a fault there ends it at once.
pub(super) struct ParentCheck {
    pub(super) culprit: usize,
    pub(super) parent: usize,
    pub(super) left: u32,
    pub(super) in_flight: bool,
    pub(super) faulted: bool,
}

impl Strategy for ParentCheck {
    fn propose(&mut self, _idle: usize) -> Proposal {
        if self.faulted {
            return Proposal::Done(Answer::ParentFaults(self.culprit));
        }
        if self.in_flight {
            return Proposal::Wait;
        }
        if self.left == 0 {
            return Proposal::Done(Answer::ParentClean(self.culprit));
        }
        self.left -= 1;
        self.in_flight = true;
        Proposal::Run(vec![self.parent])
    }
    fn mark(&mut self, _i: usize, verdict: Verdict) {
        self.in_flight = false;
        self.faulted |= verdict == Verdict::Bad;
    }
    fn abandon(&mut self, _i: usize) {
        self.in_flight = false;
    }
    fn role(&self) -> ProbeRole {
        ProbeRole::Verify
    }
    fn repeats(&self) -> bool {
        true
    }
    fn host_failure_ends(&self) -> bool {
        false
    }
    fn progress(&self) -> (usize, usize) {
        (1, 0)
    }
}

/// Runs per side before a flaky culprit's verification gives up on separating the rates.
const VERIFY_RUNS: u32 = 30;

/// A flaky culprit and its parent, run in rounds of one run each (both at once on two workers) until
/// P(culprit's rate > parent's) reaches the confidence or the culprit has had `VERIFY_RUNS` runs.
pub(super) struct Verify {
    pub(super) culprit: usize,
    pub(super) parent: usize,
    pub(super) parent_commit: String,
    pub(super) confidence: f64,
    pub(super) rates: [(u32, u32); 2],
    pub(super) queue: Vec<usize>,
    pub(super) in_flight: usize,
    pub(super) rounds: u32,
}

impl Verify {
    pub(super) fn new(
        culprit: usize,
        parent: usize,
        parent_commit: String,
        confidence: f64,
    ) -> Self {
        Self {
            culprit,
            parent,
            parent_commit,
            confidence,
            rates: [(0, 0); 2],
            queue: Vec::new(),
            in_flight: 0,
            rounds: 0,
        }
    }

    fn answer(&self, separation: f64) -> Proposal {
        Proposal::Done(Answer::Verified(Verification {
            parent: self.parent_commit.clone(),
            culprit_rate: self.rates[0],
            parent_rate: self.rates[1],
            separation,
        }))
    }
}

impl Strategy for Verify {
    fn propose(&mut self, idle: usize) -> Proposal {
        if self.queue.is_empty() && self.in_flight == 0 {
            let separation = if self.rounds == 0 {
                0.5
            } else {
                rates_differ(self.rates[0], self.rates[1])
            };
            // Skipped runs count for neither side: the rounds are bounded as well, so a culprit that
            // never runs cannot keep the verification going.
            if separation >= self.confidence
                || self.rates[0].1 >= VERIFY_RUNS
                || self.rounds >= 2 * VERIFY_RUNS
            {
                return self.answer(separation);
            }
            self.rounds += 1;
            self.queue = vec![self.parent, self.culprit];
        }
        let mut picks = Vec::new();
        while picks.len() < idle {
            match self.queue.pop() {
                Some(i) => picks.push(i),
                None => break,
            }
        }
        if picks.is_empty() {
            return Proposal::Wait;
        }
        self.in_flight += picks.len();
        Proposal::Run(picks)
    }
    fn mark(&mut self, i: usize, verdict: Verdict) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let rate = &mut self.rates[usize::from(i != self.culprit)];
        if verdict != Verdict::Skip {
            rate.1 += 1;
            rate.0 += u32::from(verdict == Verdict::Bad);
        }
    }
    fn abandon(&mut self, _i: usize) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
    fn role(&self) -> ProbeRole {
        ProbeRole::Verify
    }
    fn repeats(&self) -> bool {
        true
    }
    fn host_failure_ends(&self) -> bool {
        false
    }
    fn progress(&self) -> (usize, usize) {
        (1, 0)
    }
}

/// The cross-check of a parallel answer: each commit of `runs` run once more, expected to give its verdict
/// (in the search's terms), in groups as wide as the idle workers, in order (the first commit on the first
/// worker), no group sent before the last is in. It ends after the first group in which a commit did not
/// give its verdict. A run stopped without one (crowded out on its GPU) is sent again.
pub(super) struct RunAgain {
    /// Each run's commit and the verdict it must give.
    runs: Vec<(usize, Verdict)>,
    /// Runs not sent yet, by place, the next first.
    unsent: std::collections::VecDeque<usize>,
    /// Runs in flight, by place.
    in_flight: Vec<usize>,
    /// The first run, by place, that did not give its verdict.
    disagreed: Option<usize>,
}

impl RunAgain {
    pub(super) fn new(runs: Vec<(usize, Verdict)>) -> Self {
        Self {
            unsent: (0..runs.len()).collect(),
            runs,
            in_flight: Vec::new(),
            disagreed: None,
        }
    }

    /// The place of commit `i`'s run in flight, taken off the flight.
    fn landed(&mut self, i: usize) -> Option<usize> {
        let at = self.in_flight.iter().position(|&p| self.runs[p].0 == i)?;
        Some(self.in_flight.remove(at))
    }
}

impl Strategy for RunAgain {
    fn propose(&mut self, idle: usize) -> Proposal {
        if !self.in_flight.is_empty() {
            return Proposal::Wait;
        }
        if self.disagreed.is_some() || self.unsent.is_empty() {
            return Proposal::Done(Answer::RanAgain(self.disagreed));
        }
        let group: Vec<usize> = (0..idle).map_while(|_| self.unsent.pop_front()).collect();
        if group.is_empty() {
            return Proposal::Wait;
        }
        self.in_flight = group;
        Proposal::Run(self.in_flight.iter().map(|&p| self.runs[p].0).collect())
    }
    fn mark(&mut self, i: usize, verdict: Verdict) {
        if let Some(p) = self.landed(i) {
            if verdict != self.runs[p].1 {
                self.disagreed = Some(self.disagreed.map_or(p, |d| d.min(p)));
            }
        }
    }
    fn abandon(&mut self, i: usize) {
        if let Some(p) = self.landed(i) {
            self.unsent.push_front(p);
        }
    }
    fn role(&self) -> ProbeRole {
        ProbeRole::Verify
    }
    fn host_failure_ends(&self) -> bool {
        false
    }
    fn progress(&self) -> (usize, usize) {
        (1, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_alternates_culprit_and_parent_and_stops_when_the_rates_separate() {
        let mut v = Verify::new(5, 4, "p".into(), 0.95);
        let mut order = Vec::new();
        let answer = loop {
            match v.propose(1) {
                Proposal::Run(picks) => {
                    for i in picks {
                        order.push(i);
                        v.mark(i, if i == 5 { Verdict::Bad } else { Verdict::Good });
                    }
                }
                Proposal::Wait => panic!("one worker never waits"),
                Proposal::Done(Answer::Verified(v)) => break v,
                Proposal::Done(_) => panic!("verification answers with rates"),
            }
        };
        assert_eq!(&order[..4], &[5, 4, 5, 4]);
        assert!(answer.separation >= 0.95, "{answer:?}");
        assert_eq!(answer.culprit_rate.0, answer.culprit_rate.1);
        assert_eq!(answer.parent_rate.0, 0);
    }

    #[test]
    fn a_verification_whose_runs_all_skip_still_ends() {
        let mut v = Verify::new(1, 0, "p".into(), 0.95);
        let mut runs = 0;
        loop {
            match v.propose(2) {
                Proposal::Run(picks) => {
                    assert_eq!(picks.len(), 2, "two workers run both sides at once");
                    for i in picks {
                        runs += 1;
                        v.mark(i, Verdict::Skip);
                    }
                }
                Proposal::Wait => panic!("nothing in flight"),
                Proposal::Done(_) => break,
            }
        }
        assert_eq!(runs, 4 * VERIFY_RUNS as usize);
    }

    /// Drives `r` with `idle` workers, each commit giving what `gives` says (`None`: stopped); the groups
    /// it sent and its answer.
    fn groups_of(
        mut r: RunAgain,
        idle: usize,
        mut gives: impl FnMut(usize) -> Option<Verdict>,
    ) -> (Vec<Vec<usize>>, Option<usize>) {
        let mut groups = Vec::new();
        loop {
            match r.propose(idle) {
                Proposal::Run(group) => {
                    for &i in &group {
                        match gives(i) {
                            Some(v) => r.mark(i, v),
                            None => r.abandon(i),
                        }
                    }
                    groups.push(group);
                }
                Proposal::Wait => panic!("nothing is in flight between groups"),
                Proposal::Done(Answer::RanAgain(d)) => return (groups, d),
                Proposal::Done(_) => panic!("runs again answer with what disagreed"),
            }
        }
    }

    #[test]
    fn runs_again_go_in_groups_as_wide_as_the_workers_and_end_after_a_group_that_disagrees() {
        let runs = || {
            RunAgain::new(vec![
                (9, Verdict::Bad),
                (8, Verdict::Good),
                (4, Verdict::Good),
            ])
        };
        let right = |i: usize| Some(if i == 9 { Verdict::Bad } else { Verdict::Good });
        assert_eq!(
            groups_of(runs(), 2, right),
            (vec![vec![9, 8], vec![4]], None)
        );
        assert_eq!(
            groups_of(runs(), 1, right),
            (vec![vec![9], vec![8], vec![4]], None)
        );
        // The parent faults: the group it was in is the last, and it is named.
        let parent_faults = |_: usize| Some(Verdict::Bad);
        assert_eq!(
            groups_of(runs(), 2, parent_faults),
            (vec![vec![9, 8]], Some(1))
        );
        // Both of a group disagree: the first of them is named.
        let all_clean = |_: usize| Some(Verdict::Good);
        assert_eq!(
            groups_of(runs(), 3, all_clean),
            (vec![vec![9, 8, 4]], Some(0))
        );
        // A skip is no verdict it must give.
        let skips = |i: usize| {
            Some(if i == 4 {
                Verdict::Skip
            } else {
                right(i).unwrap()
            })
        };
        assert_eq!(groups_of(runs(), 3, skips).1, Some(2));
    }

    #[test]
    fn a_run_again_stopped_without_a_verdict_is_sent_again_in_the_next_group() {
        let mut stopped = false;
        let once = |i: usize| {
            if i == 8 && !stopped {
                stopped = true;
                return None;
            }
            Some(if i == 9 { Verdict::Bad } else { Verdict::Good })
        };
        let r = RunAgain::new(vec![(9, Verdict::Bad), (8, Verdict::Good)]);
        assert_eq!(groups_of(r, 2, once), (vec![vec![9, 8], vec![8]], None));
    }

    #[test]
    fn a_parent_check_ends_at_the_first_fault() {
        let mut c = ParentCheck {
            culprit: 3,
            parent: 2,
            left: 3,
            in_flight: false,
            faulted: false,
        };
        assert!(matches!(c.propose(4), Proposal::Run(v) if v == [2]));
        assert!(matches!(c.propose(4), Proposal::Wait));
        c.mark(2, Verdict::Good);
        assert!(matches!(c.propose(4), Proposal::Run(_)));
        c.mark(2, Verdict::Bad);
        assert!(matches!(
            c.propose(4),
            Proposal::Done(Answer::ParentFaults(3))
        ));
    }
}
