//! The verdict table: how one probe's signature, seen against the target, feeds the search. Only the
//! target bug is bad and only a clean run is good; everything else is a skip with its reason.

use crate::bisect::Verdict;
use crate::classify::{FaultClass, Signature};

/// Classes that say nothing about the commit: the machine or the clone failed, not the code.
pub fn is_host_problem(class: FaultClass) -> bool {
    matches!(
        class,
        FaultClass::Infra | FaultClass::ExecFailure | FaultClass::MissingObject
    )
}

/// Maps a signature to a verdict. `target` is `None` while the bad endpoint itself is probed; `matched` says
/// whether the signature is the target bug under the configured policy.
pub fn verdict(
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
