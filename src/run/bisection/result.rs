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
        report.notes.extend(crate::run::find_fix::fix_caveats(
            plan,
            oid,
            opts.first_parent,
        ));
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
