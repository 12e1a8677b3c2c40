//! The result step: the report of a search's outcome (the first bad commit, its parents, the confidence of
//! a flaky search), saved as soon as it is known.

use std::path::Path;

use git2::Oid;

use crate::report::event::{Event, Reporter};
use crate::report::record::short_sha;
use crate::report::record::{CommitRef, Report, RunResult, FORMAT_VERSION};

use crate::atomic_file::write_atomic;
use crate::run::plan::{Plan, StartOptions};
use crate::run::search::{SearchEnd, SearchOutcome};

/// The report of a search's outcome, and the first bad commit it names (the fix, with `--find-fix`, with
/// what to know before backporting it).
pub(super) fn report_of(
    outcome: SearchOutcome,
    plan: &Plan,
    opts: &StartOptions,
    run_dir: &Path,
) -> (Report, Option<Oid>) {
    let mut report = empty_report(plan, opts, run_dir);
    report.target = outcome.target;
    report.probes = outcome.probes;
    report.other_bugs = outcome.other_bugs;
    report.flaky = outcome.flaky;
    let first_bad = fill_result(plan, &outcome.end, &mut report);
    if plan.config.flaky.asked {
        report.confidence = reached_confidence(&report, plan);
        if let Some(c) = report.confidence {
            report.message = format!("{} (confidence {c:.3})", report.message);
        }
    }
    if let Some(oid) = first_bad.filter(|_| opts.find_fix) {
        report
            .notes
            .extend(fix_caveats(plan, oid, opts.first_parent));
    }
    (report, first_bad)
}

/// Writes report.json into the run directory (and `--report` when given); failures are warnings, since
/// the result is also in the `finished` event.
pub(super) fn save_report(
    report: &Report,
    run_dir: &Path,
    extra: Option<&Path>,
    reporter: &mut dyn Reporter,
) {
    let json = match serde_json::to_string_pretty(report) {
        Ok(j) => j + "\n",
        Err(e) => {
            reporter.event(&Event::Warning {
                message: format!("the report could not be serialised: {e}"),
            });
            return;
        }
    };
    // The run directory again if something removed it mid-run: the result is never lost to that.
    let _ = std::fs::create_dir_all(run_dir);
    for path in std::iter::once(run_dir.join("report.json")).chain(extra.map(Path::to_path_buf)) {
        if let Err(e) = write_atomic(&path, json.as_bytes()) {
            reporter.event(&Event::Warning {
                message: format!("cannot write {}: {e}", path.display()),
            });
        }
    }
}

/// `start --find-fix OLD..NEW` is the ordinary search on the same graph with the states swapped (the
/// search's judge swaps the verdicts; the journal keeps what each commit did): what is its own is here.
/// What to know before backporting a fix, as git's bisect says it for merges: a fix that is a merge
/// commit (its parents still fault: the fix is how the branches met), or a fix that reached NEW
/// through a merge (not on NEW's first-parent line).
fn fix_caveats(plan: &Plan, fix: Oid, first_parent: bool) -> Vec<String> {
    let mut notes = Vec::new();
    let parents = plan.repo.parents(fix).unwrap_or_default();
    if parents.len() > 1 && first_parent {
        notes.push(format!(
            "the fix {} is the merge that brought it to this line (--first-parent judges a merge by its first parent): the commit that fixed it is on the merged branch; run without --first-parent to name it",
            short_sha(&fix.to_string())
        ));
    } else if parents.len() > 1 {
        notes.push(format!(
            "the fix {} is a merge, and each of its parents still shows the fault: the fault is gone only where the branches meet, so backport what the merge combines, not one side",
            short_sha(&fix.to_string())
        ));
    }
    let mut on_line = false;
    let mut at = Some(plan.bad.1);
    let mut steps = 0usize;
    while let Some(c) = at {
        if c == fix {
            on_line = true;
            break;
        }
        steps += 1;
        if steps > 1_000_000 {
            break;
        }
        at = plan.repo.parents(c).ok().and_then(|p| p.first().copied());
        if plan.goods.iter().any(|g| Some(g.1) == at) {
            break;
        }
    }
    if !on_line {
        notes.push(format!(
            "the fix {} is on a side branch that reached {} through a merge: that merge is where the fix arrived on this line",
            short_sha(&fix.to_string()),
            plan.bad.0
        ));
    }
    notes
}

fn commit_ref(plan: &Plan, oid: Oid) -> CommitRef {
    CommitRef {
        commit: oid.to_string(),
        subject: plan.repo.subject(oid),
    }
}

/// The confidence an answer reached: the flaky search's posterior, or, for a fault that showed on every
/// run, 1 - 0.5^n where n is the clean runs of the culprit's parent: a parent faulting in at least half
/// its runs would have shown the fault in one of them.
fn reached_confidence(report: &Report, plan: &Plan) -> Option<f64> {
    if let Some(f) = &report.flaky {
        return Some(f.posterior);
    }
    report.first_bad.as_ref()?;
    let parent = report
        .good_parents
        .first()
        .map(|p| p.commit.clone())
        .or_else(|| plan.goods.first().map(|g| g.1.to_string()))?;
    let clean = report
        .probes
        .iter()
        .filter(|p| p.commit == parent && p.verdict == crate::bisect::Verdict::Good)
        .count()
        .min(64) as i32;
    Some(1.0 - 0.5f64.powi(clean))
}

/// Fills the result fields from how the search ended; returns the first bad commit when found.
fn fill_result(plan: &Plan, end: &SearchEnd, report: &mut Report) -> Option<Oid> {
    match end {
        SearchEnd::Found(oid) => {
            report.result = RunResult::Found;
            report.candidates = vec![commit_ref(plan, *oid)];
            match plan.repo.info(*oid) {
                Ok(info) => {
                    report.good_parents = info
                        .parents
                        .iter()
                        .filter_map(|p| Oid::from_str(p).ok())
                        .map(|p| commit_ref(plan, p))
                        .collect();
                    report.message = format!(
                        "first {} commit: {} {}",
                        report.terms.new,
                        short_sha(&info.commit),
                        info.subject
                    );
                    report.first_bad = Some(info);
                }
                Err(e) => {
                    report.message = format!("first bad commit: {oid} (cannot describe it: {e})")
                }
            }
            Some(*oid)
        }
        SearchEnd::Ambiguous(oids) => {
            report.result = RunResult::Ambiguous;
            report.candidates = oids.iter().map(|o| commit_ref(plan, *o)).collect();
            report.message = match &report.flaky {
                Some(f) => format!(
                    "a flaky fault: {} runs spent before any commit reached the confidence asked ({}); the most likely first bad commits",
                    f.runs, f.confidence
                ),
                None => format!(
                    "skipped commits leave {} candidates; the first bad commit is one of them",
                    oids.len()
                ),
            };
            None
        }
        SearchEnd::EndpointsInvalid(problem) => {
            report.result = RunResult::EndpointsInvalid;
            report.message = report.terms.speak(&problem.to_string());
            None
        }
        SearchEnd::EndpointInfra(msg) => {
            report.result = RunResult::EndpointInfra;
            report.message = msg.clone();
            None
        }
        SearchEnd::HostFailure(msg) => {
            report.result = RunResult::HostFailure;
            report.message = msg.clone();
            None
        }
        SearchEnd::Unverified(oid, why) => {
            report.result = RunResult::Inconclusive;
            report.candidates = vec![commit_ref(plan, *oid)];
            report.message = format!(
                "the search named {} as the first {} commit, but {why}: the answer does not hold",
                short_sha(&oid.to_string()),
                report.terms.new
            );
            None
        }
        SearchEnd::Interrupted => {
            report.result = RunResult::Inconclusive;
            report.interrupted = true;
            report.message = "interrupted before the search finished".into();
            None
        }
    }
}

fn empty_report(plan: &Plan, opts: &StartOptions, run_dir: &Path) -> Report {
    Report {
        format_version: FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        result: RunResult::Inconclusive,
        message: String::new(),
        good: plan.all_goods.iter().map(|o| o.to_string()).collect(),
        bad: plan.bad.1.to_string(),
        target: None,
        match_policy: plan.config.match_policy.describe(),
        launch_blocking: plan.config.repro.launch_blocking,
        first_bad: None,
        good_parents: Vec::new(),
        candidates: Vec::new(),
        probes: Vec::new(),
        range_size: plan.range.len(),
        run_dir: run_dir.display().to_string(),
        triage: None,
        shrink: None,
        bundle: None,
        notes: plan.notes.iter().map(ToString::to_string).collect(),
        other_bugs: Vec::new(),
        flaky: None,
        interrupted: false,
        confidence: None,
        terms: opts.terms.clone(),
        first_parent: opts.first_parent,
        pathspec: opts.pathspec.clone(),
        find_fix: opts.find_fix,
    }
}
