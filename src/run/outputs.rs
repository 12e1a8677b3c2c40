//! What a job leaves behind besides its report: the hand-off bundle (where it goes, the environment
//! asked for it, and what is said of it), shared by `start`, `shrink` and `triage` so no job borrows
//! another's helpers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::Config;
use crate::exec::executor::Executor;
use crate::git::Repo;
use crate::host::environment;
use crate::report::bundle::{self, BundleInput};
use crate::report::event::{Event, Reporter};
use crate::report::record::{ProbeRole, Report};

use super::plan::Plan;
use super::stages::pipeline::{speaks_torch, Asked};

/// The bundle root: `--bundle-dir`, else `[bundle] dir` (relative to the repository root), else
/// `bundles/` in the state directory under the git directory, never the working tree.
pub fn bundle_root(repo: &Repo, config: &Config, given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| config.bundle.dir.as_ref().map(|d| repo.workdir().join(d)))
        .unwrap_or_else(|| repo.state_dir().join("bundles"))
}

/// Writes the bundle and says where (a note) or why not (a warning): a bundle is never worth failing for.
pub fn write_bundle_reporting(
    input: &BundleInput,
    at: &dyn Executor,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) {
    match write_bundle_with_env(input, at, reporter, cancel) {
        Ok(dir) => reporter.event(&Event::BundleWritten {
            bytes: crate::report::bundle::dir_bytes(&dir),
            path: dir.display().to_string(),
        }),
        Err(e) => reporter.event(&Event::Warning {
            message: e.to_string(),
        }),
    }
}

/// Collects the environment where the run's commands run (`at`; announcing each probe as a stage,
/// stopping on Ctrl-C) and writes the bundle.
pub fn write_bundle_with_env(
    input: &BundleInput,
    at: &dyn Executor,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<PathBuf, bundle::BundleError> {
    write_bundle_asked(input, (None, at), reporter, cancel)
}

/// Writes the bundle with the environment `asked` beside the stages (PyTorch's report added now if the
/// run turned out to use torch), or asked now; either asked where the run's commands run (`at`).
pub(super) fn write_bundle_asked(
    input: &BundleInput,
    (asked, at): (Option<Asked>, &dyn Executor),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<PathBuf, bundle::BundleError> {
    let torch = used_torch(input);
    let env = match asked {
        Some((mut env, with_torch)) => {
            if torch && !with_torch && !cancel.load(Ordering::SeqCst) {
                reporter.event(&Event::EnvironmentProbe {
                    tool: "torch.utils.collect_env".into(),
                });
                environment::add_torch_report(&mut env, at, cancel);
            }
            env
        }
        None => environment::gather(at, cancel, torch, &mut |what| {
            reporter.event(&Event::EnvironmentProbe {
                tool: what.to_string(),
            })
        }),
    };
    bundle::write(input, &env)
}

/// Whether the run used PyTorch: the fault (its message, frames or launch site) or the shrink speaks of
/// it. Only then is `torch.utils.collect_env` asked (it imports torch: seconds, and hundreds of MiB).
fn used_torch(input: &BundleInput) -> bool {
    speaks_torch(input.target.as_ref()) || speaks_torch(input.shrink)
}

/// The hand-off bundle for a found first bad commit.
pub(super) fn write_bundle(
    plan: &Plan,
    report: &Report,
    (run_dir, root): (&Path, PathBuf),
    asked: (Option<Asked>, &dyn Executor),
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<PathBuf, bundle::BundleError> {
    let search_probes = report
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::Search)
        .count();
    let triage_files: Vec<PathBuf> = report
        .triage
        .as_ref()
        .map(|t| t.files.iter().map(PathBuf::from).collect())
        .unwrap_or_default();
    let backend = plan.config.shrink.as_ref().map(|s| {
        crate::harness::resolve_backend(s.backend)
            .as_str()
            .to_string()
    });
    let input = BundleInput {
        root,
        commit: report.first_bad.clone(),
        good_parents: report.good_parents.clone(),
        found_by: Some(format!(
            "bisecting {} commits: {} probes ({search_probes} in the search), CUDA_LAUNCH_BLOCKING={}",
            report.range_size,
            report.probes.len(),
            if report.launch_blocking { 1 } else { 0 }
        )),
        target: report.target.clone(),
        triage: report.triage.as_ref(),
        shrink: report.shrink.as_ref(),
        report_json: serde_json::to_value(report).unwrap_or_default(),
        config_text: &plan.config.text,
        log_dirs: vec![
            ("probes", run_dir.join("logs")),
            (
                "shrink",
                report
                    .shrink
                    .as_ref()
                    .map_or_else(|| run_dir.join("shrink"), |s| PathBuf::from(&s.out_dir))
                    .join("logs"),
            ),
        ],
        extra_files: triage_files,
        backend,
        include_binary: plan.config.bundle.include_binary,
        full_repro: Some(crate::report::bundle::FullRepro { build: plan.config.build.as_ref(), repro: &plan.config.repro }),
    };
    write_bundle_asked(&input, asked, reporter, cancel)
}
