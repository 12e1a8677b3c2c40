//! A finished run's probes as a log: for people (one line per probe), or in the form `git bisect replay`
//! accepts, so a search cudabisect made can be continued or checked by hand with git.

use crate::report::record::short_sha;
use std::fmt::Write;

use crate::bisect::Verdict;
use crate::report::record::{ProbeRole, Report};

/// `git bisect start BAD GOOD…` and one `git bisect good|bad|skip` per probed commit, in the order
/// probed, with comments saying what each probe showed. Sanitizer reruns are left out (they judge a commit
/// already in the log).
pub fn git_bisect_log(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# cudabisect {}: {}",
        report.tool_version, report.message
    );
    let _ = writeln!(
        out,
        "git bisect start '{}' {}",
        report.bad,
        quote_all(&report.good)
    );
    if let Some(f) = &report.flaky {
        // A flaky fault's runs contradict each other (a bad commit can run clean), so git cannot replay
        // them: each run is a comment, and only the verified answer is marked.
        let _ = writeln!(
            out,
            "# a flaky fault (about {:.0}% of runs of a bad commit): {} runs, answer with probability {:.3}",
            f.p * 100.0,
            f.runs,
            f.posterior
        );
        for p in &report.probes {
            let _ = writeln!(
                out,
                "# run at {}: {:?} ({})",
                p.commit,
                p.verdict,
                p.signature.short().replace('\n', " ")
            );
        }
        if let (Some(v), true) = (&f.verification, f.reached) {
            let _ = writeln!(out, "git bisect good {}", v.parent);
            let _ = writeln!(out, "git bisect bad {}", f.culprit);
        }
        return out;
    }
    for p in &report.probes {
        if p.role == ProbeRole::EndpointSanitizer {
            continue;
        }
        let word = match p.verdict {
            Verdict::Good => "good",
            Verdict::Bad => "bad",
            Verdict::Skip => "skip",
        };
        let why = p
            .reason
            .as_deref()
            .map(|r| format!("; {r}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "# {word}: {}{why}",
            p.signature.short().replace('\n', " ")
        );
        let _ = writeln!(out, "git bisect {word} {}", p.commit);
    }
    if let Some(first) = &report.first_bad {
        let _ = writeln!(
            out,
            "# first bad commit: [{}] {}",
            first.commit, first.subject
        );
    }
    out
}

fn quote_all(revs: &[String]) -> String {
    revs.iter()
        .map(|r| format!("'{r}'"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One line per probe: step, role, commit, verdict, signature, time, and whether it was reused.
pub fn human_log(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", report.message);
    for (i, p) in report.probes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>3}. {:<20} {} {:<5} {} ({:.1}s){}{}",
            i + 1,
            format!("{:?}", p.role).to_lowercase(),
            short_sha(&p.commit),
            format!("{:?}", p.verdict).to_lowercase(),
            p.signature.short(),
            p.duration_s,
            p.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
            if p.reused { " [reused]" } else { "" }
        );
    }
    out
}
