//! The run as JUnit XML, for CI systems that show test results: one test case per configured repro; a
//! first bad commit is a failure whose message is the one-line summary and whose body is REPORT.md, a run
//! that could not judge the range is an error, and a clean outcome is a pass.

use std::time::Duration;

use quick_junit::{NonSuccessKind, Report as JunitReport, TestCase, TestCaseStatus, TestSuite};

use crate::report::record::{Report, RunResult};

/// The XML for `report`. `repro` names the test case (the configured repro command), `body` is the
/// failure's text (REPORT.md when a bundle was written).
pub fn junit_xml(report: &Report, repro: &str, body: Option<&str>) -> Result<String, String> {
    let status = match report.result {
        RunResult::Found | RunResult::Ambiguous => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(report.message.clone())
                .set_type(format!("{:?}", report.result).to_lowercase())
                .set_description(body.unwrap_or(&report.message).to_string());
            s
        }
        RunResult::EndpointsInvalid
        | RunResult::EndpointInfra
        | RunResult::HostFailure
        | RunResult::Inconclusive => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Error);
            s.set_message(report.message.clone())
                .set_type(format!("{:?}", report.result).to_lowercase());
            s
        }
    };
    let seconds: f64 = report.probes.iter().map(|p| p.duration_s).sum();
    let time = Duration::from_secs_f64(seconds.max(0.0));
    let mut case = TestCase::new(repro.to_string(), status);
    case.set_classname("cudabisect").set_time(time);
    let mut suite = TestSuite::new(format!(
        "cudabisect {}..{}",
        report.good.join(","),
        report.bad
    ));
    suite.set_time(time).add_test_case(case);
    let mut out = JunitReport::new("cudabisect");
    out.set_time(time).add_test_suite(suite);
    out.to_string().map_err(|e| e.to_string())
}
