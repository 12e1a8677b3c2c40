//! Results as JUnit XML, for CI systems that show test results: one test case per configured repro. A
//! fault (a first bad commit, a regression, a head still failing) is a failure whose message is the
//! one-line summary and whose body is REPORT.md; an outcome that could not be judged is an error; a clean
//! outcome passes.

use std::time::Duration;

use quick_junit::{NonSuccessKind, Report as JunitReport, TestCase, TestCaseStatus, TestSuite};

use crate::report::record::{Report, RunResult};

/// How the one test case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Passed.
    Pass,
    /// A fault: the one-line summary, the body (REPORT.md), and its kind (`found`, `regression`, …).
    Failure {
        /// One line.
        message: String,
        /// The long text.
        body: String,
        /// What kind of failure.
        kind: String,
    },
    /// Could not be judged.
    Error {
        /// One line.
        message: String,
        /// Why, in a word.
        kind: String,
    },
}

/// One suite with one test case named after the repro command.
pub fn junit_case(
    suite: &str,
    repro: &str,
    outcome: &Outcome,
    time: Duration,
) -> Result<String, String> {
    let status = match outcome {
        Outcome::Pass => TestCaseStatus::success(),
        Outcome::Failure {
            message,
            body,
            kind,
        } => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(message.clone())
                .set_type(kind.clone())
                .set_description(body.clone());
            s
        }
        Outcome::Error { message, kind } => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Error);
            s.set_message(message.clone()).set_type(kind.clone());
            s
        }
    };
    let mut case = TestCase::new(repro.to_string(), status);
    case.set_classname("cudabisect").set_time(time);
    let mut s = TestSuite::new(suite.to_string());
    s.set_time(time).add_test_case(case);
    let mut out = JunitReport::new("cudabisect");
    out.set_time(time).add_test_suite(s);
    out.to_string().map_err(|e| e.to_string())
}

/// Wall time of a run's probes.
pub fn probe_time(report: &Report) -> Duration {
    let seconds: f64 = report.probes.iter().map(|p| p.duration_s).sum();
    Duration::from_secs_f64(seconds.max(0.0))
}

/// A `start` run as JUnit XML. `repro` names the test case, `body` is the failure's text (REPORT.md when
/// a bundle was written).
pub fn junit_xml(report: &Report, repro: &str, body: Option<&str>) -> Result<String, String> {
    let kind = format!("{:?}", report.result).to_lowercase();
    let outcome = match report.result {
        RunResult::Found | RunResult::Ambiguous => Outcome::Failure {
            message: report.message.clone(),
            body: body.unwrap_or(&report.message).to_string(),
            kind,
        },
        RunResult::EndpointsInvalid
        | RunResult::EndpointInfra
        | RunResult::HostFailure
        | RunResult::Inconclusive => Outcome::Error {
            message: report.message.clone(),
            kind,
        },
    };
    let suite = format!("cudabisect {}..{}", report.good.join(","), report.bad);
    junit_case(&suite, repro, &outcome, probe_time(report))
}
