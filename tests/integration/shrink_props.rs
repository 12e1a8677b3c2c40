//! Property tests of the reduction state machines against scripted oracles: the result still fails, is
//! 1-minimal, equals the needed set when failure is monotone, and a one-node fault costs at most
//! ⌈log2 n⌉+3 harness runs (the locating run included).

use std::collections::BTreeSet;

use cudabisect::shrink::{PlainDdmin, Reducer, Reduction, Step};
use proptest::prelude::*;

fn reduce(n: usize, fault: usize, fails: &dyn Fn(&[usize]) -> bool) -> (Vec<usize>, usize) {
    let mut r = Reducer::new(n, fault);
    let mut seen = BTreeSet::new();
    loop {
        match r.next_step() {
            Step::Run(c) => {
                assert!(c.contains(&fault), "the blamed node is always kept: {c:?}");
                assert!(seen.insert(c.clone()), "candidate {c:?} asked twice");
                let f = fails(&c);
                r.mark(&c, f);
            }
            Step::Done(result) => return (result, r.runs()),
        }
    }
}

fn ceil_log2(n: usize) -> usize {
    (usize::BITS - (n.max(1) - 1).leading_zeros()) as usize
}

/// A needed set whose last member is the fault, as a located synchronous run guarantees.
fn needed() -> impl Strategy<Value = (usize, Vec<usize>)> {
    (2usize..400).prop_flat_map(|n| {
        (Just(n), 0..n).prop_flat_map(|(n, fault)| {
            (Just(n), prop::collection::btree_set(0..fault.max(1), 0..4)).prop_map(
                move |(n, extra)| {
                    let mut v: Vec<usize> = extra.into_iter().filter(|&x| x < fault).collect();
                    v.push(fault);
                    (n, v)
                },
            )
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn monotone_faults_shrink_to_exactly_the_needed_nodes((n, need) in needed()) {
        let fault = *need.last().unwrap();
        let fails = |c: &[usize]| need.iter().all(|x| c.contains(x));
        let (result, runs) = reduce(n, fault, &fails);
        prop_assert_eq!(&result, &need);
        prop_assert!(fails(&result));
        if need.len() == 1 {
            // +1: the recorded run that located the fault.
            let total = runs + 1;
            prop_assert!(total <= ceil_log2(n) + 3, "{} runs for n = {}", total, n);
        }
        // Two nodes: the alone test, the window search and the pair.
        if need.len() == 2 {
            prop_assert!(runs <= ceil_log2(fault + 1) + 3, "{} runs, fault at {}", runs, fault);
        }
    }

    #[test]
    fn any_oracle_gives_a_failing_one_minimal_result((n, a) in needed(), b in prop::collection::btree_set(0usize..400, 0..4)) {
        // Two alternative causes: not monotone in general, and a fixed node may turn out unnecessary.
        let fault = *a.last().unwrap();
        let mut b: Vec<usize> = b.into_iter().filter(|&x| x < fault).collect();
        b.push(fault);
        let fails = |c: &[usize]| a.iter().all(|x| c.contains(x)) || b.iter().all(|x| c.contains(x));
        let (result, _) = reduce(n, fault, &fails);
        prop_assert!(fails(&result), "{:?} does not fail", result);
        for x in &result {
            if *x == fault {
                continue;
            }
            let smaller: Vec<usize> = result.iter().copied().filter(|y| y != x).collect();
            prop_assert!(!fails(&smaller), "{:?} still fails without {}", result, x);
        }
    }

    #[test]
    fn plain_ddmin_is_one_minimal_too((n, need) in needed()) {
        let n = n.min(120);
        let need: Vec<usize> = need.into_iter().filter(|&x| x < n).collect();
        prop_assume!(!need.is_empty());
        let fails = |c: &[usize]| need.iter().all(|x| c.contains(x));
        let mut d = PlainDdmin::new(n);
        let result = loop {
            match d.next_step() {
                Step::Run(c) => { let f = fails(&c); d.mark(&c, f); }
                Step::Done(r) => break r,
            }
        };
        prop_assert_eq!(result, need);
    }
}
