//! Same-bug matching: decides whether a probe's failure is the target bug, so a different bug never steers
//! the search or the shrink.

use regex::Regex;

use super::signature::{FaultClass, Signature};

/// How strictly a probe's signature must agree with the target.
#[derive(Clone, Debug)]
pub enum MatchPolicy {
    /// Same class, and the identities both sides know agree: the kernel decides when both name one;
    /// otherwise a different launch site (the innermost function of the user's code) or a different
    /// exception type means a different bug (the default, `class+kernel`). An `other` failure never matches
    /// on class alone.
    ClassAndKernel,
    /// Same class only.
    Class,
    /// The probe's output matches this regex (class is ignored).
    Regex(Regex),
}

/// A match policy that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MatchPolicyError {
    /// The name is not one of the known policies.
    #[error("unknown match policy `{0}` (expected `class+kernel`, `class` or `regex:<pattern>`)")]
    Unknown(String),
    /// The regex does not compile.
    #[error("invalid match regex: {0}")]
    BadRegex(#[from] regex::Error),
}

impl MatchPolicy {
    /// Parses `class+kernel`, `class` or `regex:<pattern>`.
    pub fn parse(text: &str) -> Result<Self, MatchPolicyError> {
        match text {
            "class+kernel" => Ok(Self::ClassAndKernel),
            "class" => Ok(Self::Class),
            _ => match text.strip_prefix("regex:") {
                Some(pattern) => Ok(Self::Regex(Regex::new(pattern)?)),
                None => Err(MatchPolicyError::Unknown(text.to_string())),
            },
        }
    }

    /// The policy's name as written in config.
    pub fn describe(&self) -> String {
        match self {
            Self::ClassAndKernel => "class+kernel".into(),
            Self::Class => "class".into(),
            Self::Regex(r) => format!("regex:{}", r.as_str()),
        }
    }

    /// Tells whether `probe` (with its raw `output`) is the same bug as `target`. A clean run never is.
    pub fn matches(&self, target: &Signature, probe: &Signature, output: &str) -> bool {
        self.compare(target, probe, output) != Sameness::Different
    }

    /// Compares `probe` with `target`: the same bug, a different one, or the same as far as the probe's
    /// signature tells while the target knows its kernel and the probe does not (a sanitizer run of the
    /// probe can settle that).
    pub fn compare(&self, target: &Signature, probe: &Signature, output: &str) -> Sameness {
        let same = |yes: bool| {
            if yes {
                Sameness::Same
            } else {
                Sameness::Different
            }
        };
        if probe.class == FaultClass::None {
            return Sameness::Different;
        }
        match self {
            Self::Regex(re) => same(re.is_match(output)),
            Self::Class => same(probe.class == target.class),
            Self::ClassAndKernel => {
                if probe.class != target.class
                    // Two crashes are one bug only when the same signal killed them.
                    || (probe.class == FaultClass::Signal && probe.detail != target.detail)
                {
                    return Sameness::Different;
                }
                // The most specific identity both sides know decides.
                if let (Some(a), Some(b)) = (&target.kernel, &probe.kernel) {
                    return same(a == b);
                }
                // Below the kernel, any identity both sides know and that differs tells two bugs apart.
                let differs = |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(x), Some(y)) if x != y);
                if differs(&target.launch, &probe.launch)
                    || differs(&target.exception, &probe.exception)
                {
                    return Sameness::Different;
                }
                if target.kernel.is_some() {
                    return Sameness::Unconfirmed;
                }
                let shared = |a: &Option<String>, b: &Option<String>| a.is_some() && b.is_some();
                if probe.class == FaultClass::Other && !shared(&target.exception, &probe.exception)
                {
                    // Nothing but "it failed" in common: an unrelated failure must not steer the search.
                    return same(normalized(&target.summary) == normalized(&probe.summary));
                }
                Sameness::Same
            }
        }
    }
}

/// What a comparison of two signatures concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sameness {
    /// The same bug.
    Same,
    /// Another bug (or not a failure).
    Different,
    /// The same class and nothing that differs, but the target names a kernel the probe does not: the
    /// same bug unless a sanitizer run of the probe says otherwise.
    Unconfirmed,
}

/// A summary with its numbers blanked: addresses, sizes and times differ between runs of one bug.
fn normalized(summary: &str) -> String {
    summary
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(class: FaultClass, kernel: Option<&str>) -> Signature {
        let mut s = Signature::new(class, "x");
        s.kernel = kernel.map(String::from);
        s
    }

    #[test]
    fn default_policy_needs_the_same_kernel_when_both_know_it() {
        let p = MatchPolicy::ClassAndKernel;
        let target = sig(FaultClass::IllegalAddress, Some("gather"));
        assert!(p.matches(
            &target,
            &sig(FaultClass::IllegalAddress, Some("gather")),
            ""
        ));
        assert!(p.matches(&target, &sig(FaultClass::IllegalAddress, None), ""));
        assert!(!p.matches(
            &target,
            &sig(FaultClass::IllegalAddress, Some("matmul")),
            ""
        ));
        assert!(!p.matches(&target, &sig(FaultClass::OutOfMemory, Some("gather")), ""));
        assert!(MatchPolicy::Class.matches(
            &target,
            &sig(FaultClass::IllegalAddress, Some("matmul")),
            ""
        ));
    }

    #[test]
    fn launch_site_and_exception_type_tell_two_bugs_of_one_class_apart() {
        let p = MatchPolicy::ClassAndKernel;
        let with = |launch: Option<&str>, exception: Option<&str>| {
            let mut s = sig(FaultClass::InvalidAddressSpace, None);
            s.launch = launch.map(String::from);
            s.exception = exception.map(String::from);
            s
        };
        let target = with(
            Some("pkg/embed.py:hash_embed"),
            Some("torch.AcceleratorError"),
        );
        assert_eq!(
            p.compare(&target, &with(Some("pkg/embed.py:hash_embed"), None), ""),
            Sameness::Same
        );
        assert_eq!(
            p.compare(
                &target,
                &with(Some("pkg/ops.py:bias_gelu"), Some("torch.AcceleratorError")),
                ""
            ),
            Sameness::Different
        );
        // Kernel beats launch site: same kernel from another call site is the same bug.
        let mut t = with(Some("a.py:f"), None);
        t.kernel = Some("k".into());
        let mut q = with(Some("b.py:g"), None);
        q.kernel = Some("k".into());
        assert_eq!(p.compare(&t, &q, ""), Sameness::Same);
        // The target knows its kernel, the probe does not: unconfirmed until a sanitizer says.
        assert_eq!(
            p.compare(&t, &with(Some("a.py:f"), None), ""),
            Sameness::Unconfirmed
        );
        assert_eq!(
            p.compare(&t, &with(Some("c.py:h"), None), ""),
            Sameness::Different
        );
    }

    #[test]
    fn other_never_matches_other_on_class_alone() {
        let p = MatchPolicy::ClassAndKernel;
        let mut assertion = sig(FaultClass::Other, None);
        assertion.exception = Some("AssertionError".into());
        let mut import = sig(FaultClass::Other, None);
        import.exception = Some("ModuleNotFoundError".into());
        assert_eq!(p.compare(&assertion, &import, ""), Sameness::Different);
        assert_eq!(
            p.compare(&assertion, &assertion.clone(), ""),
            Sameness::Same
        );
        let a = Signature::new(FaultClass::Other, "exited 1: step 12 failed");
        let b = Signature::new(FaultClass::Other, "exited 1: step 30 failed");
        let c = Signature::new(FaultClass::Other, "exited 1: cannot open dataset");
        assert!(p.matches(&a, &b, ""));
        assert!(!p.matches(&a, &c, ""));
    }

    #[test]
    fn regex_policy_reads_the_output_and_never_matches_a_clean_run() {
        let p = MatchPolicy::parse("regex:gather.*illegal").unwrap();
        let target = sig(FaultClass::IllegalAddress, None);
        assert!(p.matches(&target, &sig(FaultClass::Other, None), "in gather: illegal"));
        assert!(!p.matches(&target, &sig(FaultClass::None, None), "in gather: illegal"));
        assert!(MatchPolicy::parse("kernel").is_err());
        assert!(MatchPolicy::parse("regex:(").is_err());
    }
}
