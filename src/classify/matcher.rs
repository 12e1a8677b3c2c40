//! Same-bug matching: decides whether a probe's failure is the target bug, so a different bug never steers
//! the search or the shrink.

use regex::Regex;

use super::signature::{FaultClass, Signature};

/// How strictly a probe's signature must agree with the target.
#[derive(Clone, Debug)]
pub enum MatchPolicy {
    /// Same class, and same kernel when both sides know it (the default).
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
        if probe.class == FaultClass::None {
            return false;
        }
        match self {
            Self::Regex(re) => re.is_match(output),
            Self::Class => probe.class == target.class,
            Self::ClassAndKernel => {
                probe.class == target.class
                    // Two crashes are one bug only when the same signal killed them.
                    && (probe.class != FaultClass::Signal || probe.detail == target.detail)
                    && match (&target.kernel, &probe.kernel) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            }
        }
    }
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
    fn regex_policy_reads_the_output_and_never_matches_a_clean_run() {
        let p = MatchPolicy::parse("regex:gather.*illegal").unwrap();
        let target = sig(FaultClass::IllegalAddress, None);
        assert!(p.matches(&target, &sig(FaultClass::Other, None), "in gather: illegal"));
        assert!(!p.matches(&target, &sig(FaultClass::None, None), "in gather: illegal"));
        assert!(MatchPolicy::parse("kernel").is_err());
        assert!(MatchPolicy::parse("regex:(").is_err());
    }
}
