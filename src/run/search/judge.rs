//! The one judge: how one probe's observation, seen against the target under the same-bug policy, feeds the
//! search. Only the target bug is bad and only a clean run is good; everything else is a skip with its
//! reason. Pure: the prober only observes, and nothing but [`judge`] decides or rewrites a verdict.

use crate::bisect::Verdict;
use crate::classify::{FaultClass, MatchPolicy, Sameness, Signature};
use crate::report::record::{short_sha, ProbeRecord};

/// Classes that say nothing about the commit: the machine or the clone failed, not the code.
pub fn is_host_problem(class: FaultClass) -> bool {
    matches!(
        class,
        FaultClass::Infra | FaultClass::ExecFailure | FaultClass::MissingObject
    )
}

/// A bad endpoint reproduces when it fails in a way that can be a target: not clean, not a build break,
/// not the machine's fault.
pub fn reproduces(sig: &Signature) -> bool {
    !matches!(sig.class, FaultClass::None | FaultClass::BuildFailure) && !is_host_problem(sig.class)
}

/// What is known of the kernel a probe's fault was in, beyond its own output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel<'a> {
    /// No sanitizer was asked yet: a lookalike the output cannot tell apart is judged the target for now,
    /// and the judgement says a sanitizer run would settle it.
    NotAsked,
    /// No sanitizer could say (none at hand, or it named nothing): the probe's own output is all there is.
    Unknown,
    /// The sanitizer (this probe's run, or a remembered one of the same fault stack) named this kernel.
    Named(&'a str),
}

/// The terms a probe is judged in.
#[derive(Clone, Copy, Debug)]
pub struct Terms<'a> {
    /// The bug a probe is measured by: `None` while the bad endpoint itself is probed.
    pub target: Option<&'a Signature>,
    /// The same-bug policy.
    pub policy: &'a MatchPolicy,
    /// Finding a fix: the target is the fault at the older end, so showing it is the older state (good)
    /// and a clean run the newer (bad).
    pub swapped: bool,
}

/// The judge's answer for one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    /// What the probe says about its commit, in the search's terms.
    pub verdict: Verdict,
    /// Whether the probe showed the target bug.
    pub matched_target: bool,
    /// Why a probe is a skip.
    pub reason: Option<String>,
    /// The probe shows another bug, told apart from the target by its kernel, launch site or exception:
    /// worth recording as a bug of its own.
    pub other_bug: bool,
    /// The probe fails like the target and only a sanitizer run can say whether it is the target's
    /// kernel (asked only with [`Kernel::NotAsked`]).
    pub ask_sanitizer: bool,
}

/// Judges what a probe showed (`seen`, with its raw `output` for a regex policy) against `terms`, with
/// what is known of its kernel beyond its output.
pub fn judge(seen: &Signature, output: &str, terms: Terms, kernel: Kernel) -> Judgement {
    let mut ask_sanitizer = false;
    let mut by_kernel: Option<String> = None;
    let matched = match terms.target {
        None => false,
        Some(t) => match terms.policy.compare(t, seen, output) {
            Sameness::Same => true,
            Sameness::Different => false,
            Sameness::Unconfirmed => match (kernel, t.kernel.as_deref()) {
                (Kernel::NotAsked, _) => {
                    ask_sanitizer = true;
                    true
                }
                (Kernel::Named(k), Some(want)) if k != want => {
                    by_kernel = Some(format!(
                        "a different bug: this commit's fault is in {k}, the bad endpoint's in {want}"
                    ));
                    false
                }
                _ => true,
            },
        },
    };
    let (verdict, reason) = match by_kernel {
        Some(reason) => (Verdict::Skip, Some(reason)),
        None => verdict(seen, terms.target, matched),
    };
    // A device fault told apart from the target (by the sanitizer, or by its own output: another kernel
    // named at launch, another launch site or exception) is another bug.
    let other_bug =
        terms.target.is_some() && verdict == Verdict::Skip && seen.class.is_device_fault();
    Judgement {
        verdict: if terms.swapped {
            swapped(verdict)
        } else {
            verdict
        },
        matched_target: matched,
        reason,
        other_bug,
        ask_sanitizer,
    }
}

/// The verdict in find-fix terms: showing the fault is the older state, clean the newer.
pub fn swapped(verdict: Verdict) -> Verdict {
    match verdict {
        Verdict::Bad => Verdict::Good,
        Verdict::Good => Verdict::Bad,
        Verdict::Skip => Verdict::Skip,
    }
}

/// The verdict table: a signature against the target (`None` while the bad endpoint itself is probed),
/// with whether it is the target bug under the configured policy.
fn verdict(
    sig: &Signature,
    target: Option<&Signature>,
    matched: bool,
) -> (Verdict, Option<String>) {
    match (sig.class, target) {
        (FaultClass::None, _) => (Verdict::Good, None),
        (c, _) if is_host_problem(c) => (Verdict::Skip, Some(format!("{c}: {}", sig.summary))),
        (FaultClass::BuildFailure, None) => (
            Verdict::Skip,
            Some(format!("build failure: {}", sig.summary)),
        ),
        (_, None) => (Verdict::Bad, None),
        _ if matched => (Verdict::Bad, None),
        (FaultClass::BuildFailure, _) => (
            Verdict::Skip,
            Some(format!("build failure: {}", sig.summary)),
        ),
        (FaultClass::Hang, _) => (Verdict::Skip, Some("hang: ran past its timeout".into())),
        (_, Some(t)) => (
            Verdict::Skip,
            Some(format!(
                "different failure: {} (target is {})",
                sig.short(),
                t.short()
            )),
        ),
    }
}

/// A probe whose class says the host is broken (infrastructure failures outlasted their retries, the repro
/// cannot start): every probe after it would fail the same way. A missing object is the clone's, not the
/// host's: that commit alone is skipped.
pub(super) fn host_failure(rec: &ProbeRecord) -> Option<String> {
    matches!(
        rec.signature.class,
        FaultClass::Infra | FaultClass::ExecFailure
    )
    .then(|| {
        format!(
            "stopped: the host failed at {}: {}",
            short_sha(&rec.commit),
            rec.signature.summary
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_a_verdict_against_every_kind_of_target() {
        let target = Signature::new(FaultClass::IllegalAddress, "target");
        for class in FaultClass::ALL {
            let sig = Signature::new(class, "seen");
            // Probing the bad endpoint (no target yet).
            let (v, reason) = verdict(&sig, None, false);
            let expected = match class {
                FaultClass::None => Verdict::Good,
                FaultClass::BuildFailure
                | FaultClass::Infra
                | FaultClass::ExecFailure
                | FaultClass::MissingObject => Verdict::Skip,
                _ => Verdict::Bad,
            };
            assert_eq!(v, expected, "{class} at the bad endpoint");
            assert_eq!(reason.is_some(), v == Verdict::Skip, "{class}");
            // Against a target, matched or not.
            for matched in [false, true] {
                let (v, _) = verdict(&sig, Some(&target), matched);
                let expected = match class {
                    FaultClass::None => Verdict::Good,
                    c if is_host_problem(c) => Verdict::Skip,
                    _ if matched => Verdict::Bad,
                    _ => Verdict::Skip,
                };
                assert_eq!(v, expected, "{class}, matched={matched}");
            }
        }
    }

    #[test]
    fn a_host_problem_never_counts_as_the_target_even_when_a_loose_policy_matches() {
        let target = Signature::new(FaultClass::Other, "boom");
        let sig = Signature::new(FaultClass::ExecFailure, "cannot run");
        assert_eq!(verdict(&sig, Some(&target), true).0, Verdict::Skip);
    }
}

#[cfg(test)]
mod judge_tests {
    use super::*;

    fn fault(kernel: Option<&str>) -> Signature {
        let mut s = Signature::new(FaultClass::IllegalAddress, "illegal memory access");
        s.kernel = kernel.map(str::to_string);
        s
    }

    fn terms<'a>(target: Option<&'a Signature>, policy: &'a MatchPolicy) -> Terms<'a> {
        Terms {
            target,
            policy,
            swapped: false,
        }
    }

    #[test]
    fn a_lookalike_is_the_target_until_the_sanitizer_names_another_kernel() {
        let policy = MatchPolicy::ClassAndKernel;
        let target = fault(Some("gather"));
        let seen = fault(None);
        let first = judge(&seen, "", terms(Some(&target), &policy), Kernel::NotAsked);
        assert_eq!((first.verdict, first.ask_sanitizer), (Verdict::Bad, true));
        let same = judge(
            &seen,
            "",
            terms(Some(&target), &policy),
            Kernel::Named("gather"),
        );
        assert_eq!(
            (same.verdict, same.ask_sanitizer, same.other_bug),
            (Verdict::Bad, false, false)
        );
        let other = judge(
            &seen,
            "",
            terms(Some(&target), &policy),
            Kernel::Named("scatter"),
        );
        assert_eq!(other.verdict, Verdict::Skip);
        assert!(other.other_bug && !other.matched_target);
        assert!(other.reason.unwrap().contains("scatter"));
        let unknown = judge(&seen, "", terms(Some(&target), &policy), Kernel::Unknown);
        assert_eq!(
            (unknown.verdict, unknown.ask_sanitizer),
            (Verdict::Bad, false)
        );
    }

    #[test]
    fn a_fault_named_by_its_own_output_never_asks_the_sanitizer() {
        let policy = MatchPolicy::ClassAndKernel;
        let target = fault(Some("gather"));
        let j = judge(
            &fault(Some("scatter")),
            "",
            terms(Some(&target), &policy),
            Kernel::NotAsked,
        );
        assert_eq!(
            (j.verdict, j.ask_sanitizer, j.other_bug),
            (Verdict::Skip, false, true)
        );
        let bad_end = judge(&fault(None), "", terms(None, &policy), Kernel::NotAsked);
        assert_eq!(
            (bad_end.verdict, bad_end.ask_sanitizer),
            (Verdict::Bad, false)
        );
    }

    #[test]
    fn finding_a_fix_swaps_the_verdict_and_nothing_else() {
        let policy = MatchPolicy::ClassAndKernel;
        let target = fault(Some("gather"));
        let t = Terms {
            target: Some(&target),
            policy: &policy,
            swapped: true,
        };
        let still = judge(&fault(Some("gather")), "", t, Kernel::NotAsked);
        assert_eq!((still.verdict, still.matched_target), (Verdict::Good, true));
        let gone = judge(
            &Signature::new(FaultClass::None, "clean"),
            "",
            t,
            Kernel::NotAsked,
        );
        assert_eq!(gone.verdict, Verdict::Bad);
        let other = judge(&fault(Some("scatter")), "", t, Kernel::NotAsked);
        assert_eq!((other.verdict, other.other_bug), (Verdict::Skip, true));
    }

    #[test]
    fn a_regex_policy_reads_the_output() {
        let policy = MatchPolicy::parse("regex:index \\d+ out of bounds").unwrap();
        let target = Signature::new(FaultClass::Other, "assert");
        let seen = Signature::new(FaultClass::Other, "assert");
        let t = terms(Some(&target), &policy);
        assert_eq!(
            judge(&seen, "index 7 out of bounds", t, Kernel::NotAsked).verdict,
            Verdict::Bad
        );
        assert_eq!(
            judge(&seen, "something else", t, Kernel::NotAsked).verdict,
            Verdict::Skip
        );
    }

    #[test]
    fn swapping_twice_is_the_identity_and_a_skip_stays_a_skip() {
        for v in [Verdict::Good, Verdict::Bad, Verdict::Skip] {
            assert_eq!(swapped(swapped(v)), v);
        }
        assert_eq!(swapped(Verdict::Skip), Verdict::Skip);
        assert_eq!(swapped(Verdict::Bad), Verdict::Good);
    }
}
