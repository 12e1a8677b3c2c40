//! A finished run's probes as a log: for people (one line per probe), or in the form `git bisect replay`
//! accepts, so a search cudabisect made can be continued or checked by hand with git.

use crate::report::record::short_sha;
use std::fmt::Write;

use crate::bisect::Verdict;
use crate::report::record::{ProbeRole, Report};

/// The run as `git bisect replay` reads it: `git bisect start` with the run's options (`--first-parent`,
/// the terms, the pathspec), then the new end, the merge bases tested, the old ends, and one mark per
/// probed commit in the order probed, with comments saying what each probe showed. Merge bases come
/// before the old ends, as git asks for them. Sanitizer reruns are left out (they judge a commit already
/// in the log).
pub fn git_bisect_log(report: &Report) -> String {
    let mut out = String::new();
    let terms = &report.terms;
    let _ = writeln!(
        out,
        "# cudabisect {}: {}",
        report.tool_version, report.message
    );
    // `git bisect replay` reads the arguments of `start` only when each is single-quoted.
    let mut args = Vec::new();
    if *terms != crate::report::record::Terms::default() {
        args.push(format!("--term-old={}", terms.old));
        args.push(format!("--term-new={}", terms.new));
    }
    if report.first_parent {
        args.push("--first-parent".into());
    }
    if !report.pathspec.is_empty() {
        args.push("--".into());
        args.extend(report.pathspec.iter().cloned());
    }
    let _ = writeln!(out, "git bisect start {}", quote_all(&args));
    let _ = writeln!(out, "git bisect {} {}", terms.new, report.bad);
    let mut marked: Vec<&str> = Vec::new();
    for p in report
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::MergeBase)
    {
        if p.verdict == Verdict::Good && !marked.contains(&p.commit.as_str()) {
            let _ = writeln!(out, "git bisect {} {}", terms.old, p.commit);
            marked.push(&p.commit);
        }
    }
    for g in &report.good {
        let _ = writeln!(out, "git bisect {} {g}", terms.old);
    }
    if let Some(f) = &report.flaky {
        flaky_runs(&mut out, report, f);
        return out;
    }
    for p in &report.probes {
        if matches!(p.role, ProbeRole::EndpointSanitizer | ProbeRole::MergeBase) {
            continue;
        }
        let word = terms.word(p.verdict);
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
            "# first {} commit: [{}] {}",
            terms.new, first.commit, first.subject
        );
    }
    for note in &report.notes {
        let _ = writeln!(out, "# {}", note.replace('\n', " "));
    }
    out
}

/// A flaky fault's runs contradict each other (a bad commit can run clean), so git cannot replay them:
/// each run is a comment, and only the verified answer is marked.
fn flaky_runs(out: &mut String, report: &Report, f: &crate::report::record::FlakyAnswer) {
    let terms = &report.terms;
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
            "# run at {}: {} ({})",
            p.commit,
            terms.word(p.verdict),
            p.signature.short().replace('\n', " ")
        );
    }
    if let (Some(v), true) = (&f.verification, f.reached) {
        let _ = writeln!(out, "git bisect {} {}", terms.old, v.parent);
        let _ = writeln!(out, "git bisect {} {}", terms.new, f.culprit);
    }
}

fn quote_all(revs: &[String]) -> String {
    revs.iter()
        .map(|r| format!("'{}'", r.replace('\'', "'\\''")))
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
            report.terms.word(p.verdict),
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
