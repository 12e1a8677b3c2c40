//! `cudabisect start GOOD..BAD`: validate the input, check the endpoints, drive the search state machine
//! with probes, triage the first bad commit, and produce the report. All output goes through events.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::bisect::{Bisector, NextStep, SearchResult, Verdict};
use crate::classify::Signature;
use crate::config::{CommandLine, Config, ConfigError};
use crate::events::{Event, Reporter};
use crate::git::{GitError, Repo};
use crate::probe::{ProbeContext, Prober};
use crate::report::{
    CommitRef, ProbeRecord, ProbeRole, ProbeVerdict, Report, RunResult, FORMAT_VERSION,
};
use crate::triage;

/// What `start` was asked to do.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// A directory inside the repository.
    pub dir: PathBuf,
    /// `GOOD..BAD`.
    pub range: String,
    /// More known-good revisions.
    pub goods: Vec<String>,
    /// Config file; default `bisect.toml` at the repository root.
    pub config: Option<PathBuf>,
    /// Where to write the JSON report.
    pub report: Option<PathBuf>,
    /// Leave the probe worktree registered at the end.
    pub keep_worktree: bool,
    /// Clean the worktree before each build, whatever the config says.
    pub clean: bool,
    /// Skip the compute-sanitizer triage.
    pub no_triage: bool,
    /// Skip shrinking the model at the first bad commit.
    pub no_shrink: bool,
    /// Write the bundle under this directory instead of `[bundle] dir`.
    pub bundle_dir: Option<PathBuf>,
}

/// Problems that stop `start` before or outside the search.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// Repository or revision problems.
    #[error(transparent)]
    Git(#[from] GitError),
    /// Config problems.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Filesystem trouble in the state directory.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl StartError {
    /// True for errors caused by the user's input (exit code 2); the rest are internal (1).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Usage(_) | Self::Config(_) => true,
            Self::Git(e) => !matches!(e, GitError::Git(_) | GitError::Io { .. }),
            Self::Io { .. } => false,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Everything validated before anything is written.
struct Plan {
    repo: Repo,
    config: Config,
    goods: Vec<(String, Oid)>,
    bad: (String, Oid),
    range: Vec<crate::git::RangeCommit>,
}

fn plan(opts: &StartOptions) -> Result<Plan, StartError> {
    let (good, bad) = opts
        .range
        .split_once("..")
        .filter(|(g, b)| !g.is_empty() && !b.is_empty() && !b.starts_with('.'))
        .ok_or_else(|| StartError::Usage(format!("expected GOOD..BAD, got `{}`", opts.range)))?;
    let repo = Repo::open(&opts.dir)?;
    let mut goods = Vec::new();
    for rev in std::iter::once(good).chain(opts.goods.iter().map(String::as_str)) {
        goods.push((rev.to_string(), repo.resolve(rev)?));
    }
    let bad = (bad.to_string(), repo.resolve(bad)?);
    let range = repo.range(&goods, (&bad.0, bad.1))?;
    let config_path = opts
        .config
        .clone()
        .unwrap_or_else(|| repo.workdir().join("bisect.toml"));
    let config = Config::load(&config_path)?;
    for command in config
        .build
        .iter()
        .map(|b| &b.command)
        .chain([&config.repro.command])
    {
        check_command(&repo, bad.1, command)?;
    }
    Ok(Plan {
        repo,
        config,
        goods,
        bad,
        range,
    })
}

/// Refuses commands that cannot run: a missing program on PATH, or a relative path that the bad commit
/// does not have as an executable file. Shell lines are left to the shell.
fn check_command(repo: &Repo, bad: Oid, command: &CommandLine) -> Result<(), StartError> {
    let CommandLine::Argv(argv) = command else {
        return Ok(());
    };
    let program = &argv[0];
    let problem = if program.starts_with('/') {
        let meta = std::fs::metadata(program);
        match meta {
            Ok(m) if std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0 => None,
            Ok(_) => Some("is not executable"),
            Err(_) => Some("does not exist"),
        }
    } else if program.contains('/') {
        match repo.executable_at(bad, program) {
            Some(true) => None,
            Some(false) => Some("is not executable at the bad commit"),
            None => Some("does not exist at the bad commit"),
        }
    } else if find_on_path(program) {
        None
    } else {
        Some("is not on PATH")
    };
    match problem {
        Some(p) => Err(StartError::Usage(format!("command `{program}` {p}"))),
        None => Ok(()),
    }
}

fn find_on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Runs a whole bisection. Returns the report; errors are input problems found before anything ran.
pub fn start(
    opts: &StartOptions,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Report, StartError> {
    let mut plan = plan(opts)?;
    if opts.clean {
        if let Some(b) = plan.config.build.as_mut() {
            b.clean = true;
        }
    }
    let run_dir = plan.repo.state_dir().join("runs").join(run_id());
    let log_dir = run_dir.join("logs");
    std::fs::create_dir_all(&log_dir).map_err(io_err(&log_dir))?;
    std::fs::write(run_dir.join("bisect.toml"), &plan.config.text).map_err(io_err(&run_dir))?;
    let worktree = plan.repo.probe_worktree()?;
    let prober = Prober {
        worktree: &worktree,
        config: &plan.config,
        log_dir,
        cancel,
    };
    reporter.event(&Event::RunStarted {
        candidates: plan.range.len(),
        run_dir: run_dir.display().to_string(),
        launch_blocking: plan.config.repro.launch_blocking,
    });
    let mut search = Search {
        plan: &plan,
        prober: &prober,
        probes: Vec::new(),
        reporter,
    };
    let (mut report, first_bad) = search.run(&run_dir, cancel);
    if let Some(oid) = first_bad {
        after_search(
            &plan,
            &prober,
            opts,
            oid,
            &run_dir,
            &mut report,
            search.reporter,
            cancel,
        );
    }
    if !opts.keep_worktree {
        plan.repo.prune_worktree()?;
    }
    if report.result == RunResult::Found && plan.config.bundle.enabled {
        let root = opts
            .bundle_dir
            .clone()
            .unwrap_or_else(|| plan.repo.workdir().join(&plan.config.bundle.dir));
        match write_bundle(&plan, &report, &run_dir, root) {
            Ok(dir) => report.bundle = Some(dir.display().to_string()),
            Err(e) => search.reporter.event(&Event::Warning {
                message: e.to_string(),
            }),
        }
    }
    let json = serde_json::to_string_pretty(&report).expect("report serialises");
    std::fs::write(run_dir.join("report.json"), &json).map_err(io_err(&run_dir))?;
    if let Some(path) = &opts.report {
        std::fs::write(path, &json).map_err(io_err(path))?;
    }
    search.reporter.event(&Event::Finished {
        report: Box::new(report.clone()),
    });
    Ok(report)
}

/// The stages at the first bad commit: build it, triage under compute-sanitizer, shrink the model, and
/// check the minimal subgraph at the parent.
#[allow(clippy::too_many_arguments)]
fn after_search(
    plan: &Plan,
    prober: &Prober,
    opts: &StartOptions,
    oid: Oid,
    run_dir: &Path,
    report: &mut Report,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) {
    let triage = plan.config.triage.enabled && !opts.no_triage;
    let shrink = plan
        .config
        .shrink
        .as_ref()
        .filter(|s| s.enabled && !opts.no_shrink);
    if !triage && shrink.is_none() {
        return;
    }
    if let Err(e) = prober.prepare(oid, "first-bad") {
        reporter.event(&Event::Warning {
            message: format!("cannot prepare the first bad commit for triage and shrink: {e}"),
        });
        return;
    }
    if triage && !cancel.load(Ordering::SeqCst) {
        report.triage = Some(triage::at_commit(
            &plan.config,
            prober.worktree,
            oid,
            run_dir,
            cancel,
            reporter,
        ));
    }
    let Some(section) = shrink else { return };
    if cancel.load(Ordering::SeqCst) {
        return;
    }
    let ctx = crate::shrink_run::ShrinkContext {
        config: &plan.config,
        shrink: section,
        cwd: prober.worktree.path(),
        out_dir: run_dir.join("shrink"),
        commit: oid.to_string(),
        target: report.target.clone(),
    };
    let mut result = crate::shrink_run::shrink(&ctx, reporter, cancel);
    let parent = report
        .good_parents
        .first()
        .and_then(|p| Oid::from_str(&p.commit).ok());
    if result.status == crate::shrink_run::ShrinkStatus::Minimal
        && section.check_parent
        && !cancel.load(Ordering::SeqCst)
    {
        result.parent_check = Some(match parent {
            None => "not run: the first bad commit has no parent in the range".into(),
            Some(p) => match prober.prepare(p, "parent") {
                Err(e) => format!("not run: {e}"),
                Ok(()) => {
                    let harness = crate::shrink_run::Harness::from_config(
                        &plan.config,
                        section,
                        prober.worktree.path(),
                        &p.to_string(),
                    );
                    crate::shrink_run::check_elsewhere(
                        &harness,
                        &result,
                        &plan.config.match_policy,
                        cancel,
                    )
                }
            },
        });
    }
    report.shrink = Some(result);
}

/// The hand-off bundle for a found first bad commit.
fn write_bundle(
    plan: &Plan,
    report: &Report,
    run_dir: &Path,
    root: PathBuf,
) -> Result<PathBuf, crate::bundle::BundleError> {
    let search_probes = report
        .probes
        .iter()
        .filter(|p| p.role == crate::report::ProbeRole::Search)
        .count();
    let triage_files: Vec<PathBuf> = report
        .triage
        .as_ref()
        .and_then(|t| t.get("files"))
        .and_then(|f| f.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default();
    let backend = plan
        .config
        .shrink
        .as_ref()
        .map(|s| match s.backend.as_str() {
            "auto" if crate::harness::cuda::probe().is_ok() => "cuda".to_string(),
            "auto" => "cpu".to_string(),
            b => b.to_string(),
        });
    let input = crate::bundle::BundleInput {
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
        triage: report.triage.clone(),
        shrink: report.shrink.as_ref(),
        report_json: serde_json::to_value(report).unwrap_or_default(),
        config_text: &plan.config.text,
        log_dirs: vec![run_dir.join("logs"), run_dir.join("shrink").join("logs")],
        extra_files: triage_files,
        backend,
    };
    crate::bundle::write(&input, &crate::environment::collect())
}

fn run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}-{}", now.as_secs(), std::process::id())
}

struct Search<'a, 'r> {
    plan: &'a Plan,
    prober: &'a Prober<'a>,
    probes: Vec<ProbeRecord>,
    reporter: &'r mut dyn Reporter,
}

impl Search<'_, '_> {
    fn probe(
        &mut self,
        oid: Oid,
        role: ProbeRole,
        search: &Bisector,
        target: Option<&Signature>,
    ) -> (ProbeRecord, bool) {
        let ctx = ProbeContext {
            step: self.probes.len() + 1,
            role,
            remaining: search.remaining(),
            estimated_steps: search.estimated_steps(),
        };
        let out = self.prober.probe(oid, &ctx, target, self.reporter);
        self.reporter.event(&Event::ProbeFinished {
            step: ctx.step,
            record: Box::new(out.record.clone()),
        });
        self.probes.push(out.record.clone());
        (out.record, out.interrupted)
    }

    fn run(&mut self, run_dir: &Path, cancel: &AtomicBool) -> (Report, Option<Oid>) {
        let parents: Vec<Vec<usize>> = self.plan.range.iter().map(|c| c.parents.clone()).collect();
        let mut bisector = Bisector::new(&parents);
        let mut report = self.empty_report(run_dir);
        // The bad endpoint first: what it shows is the target.
        let (bad, interrupted) =
            self.probe(self.plan.bad.1, ProbeRole::BadEndpoint, &bisector, None);
        if interrupted {
            return (self.inconclusive(report), None);
        }
        if bad.verdict != ProbeVerdict::Bad || !reproduces(&bad.signature) {
            report.result = RunResult::EndpointsInvalid;
            report.message = format!(
                "bad commit {} does not reproduce: {}",
                self.plan.bad.0, bad.signature.summary
            );
            report.probes = std::mem::take(&mut self.probes);
            return (report, None);
        }
        let target = bad.signature.clone();
        report.target = Some(target.clone());
        for (name, oid) in self.plan.goods.clone() {
            let (good, interrupted) =
                self.probe(oid, ProbeRole::GoodEndpoint, &bisector, Some(&target));
            if interrupted {
                return (self.inconclusive(report), None);
            }
            if good.verdict != ProbeVerdict::Good {
                report.result = RunResult::EndpointsInvalid;
                report.message = format!(
                    "good commit {name} does not pass: {}",
                    good.signature.short()
                );
                report.probes = std::mem::take(&mut self.probes);
                return (report, None);
            }
        }
        loop {
            if cancel.load(Ordering::SeqCst) {
                return (self.inconclusive(report), None);
            }
            match bisector.next_step() {
                NextStep::Evaluate(i) => {
                    let oid = self.plan.range[i].oid;
                    let (record, interrupted) =
                        self.probe(oid, ProbeRole::Search, &bisector, Some(&target));
                    if interrupted {
                        return (self.inconclusive(report), None);
                    }
                    let verdict = match record.verdict {
                        ProbeVerdict::Good => Verdict::Good,
                        ProbeVerdict::Bad => Verdict::Bad,
                        ProbeVerdict::Skip => Verdict::Skip,
                    };
                    bisector.mark(i, verdict);
                }
                NextStep::Wait => unreachable!("probes run one at a time"),
                NextStep::Done(result) => return self.finish(report, result),
            }
        }
    }

    fn finish(&mut self, mut report: Report, result: SearchResult) -> (Report, Option<Oid>) {
        report.probes = std::mem::take(&mut self.probes);
        let refs = |indices: &[usize]| -> Vec<CommitRef> {
            indices
                .iter()
                .map(|&i| self.commit_ref(self.plan.range[i].oid))
                .collect()
        };
        match result {
            SearchResult::Found(i) => {
                let oid = self.plan.range[i].oid;
                report.result = RunResult::Found;
                report.candidates = refs(&[i]);
                match self.plan.repo.info(oid) {
                    Ok(info) => {
                        report.good_parents = info
                            .parents
                            .iter()
                            .filter_map(|p| Oid::from_str(p).ok())
                            .map(|p| self.commit_ref(p))
                            .collect();
                        report.message =
                            format!("first bad commit: {} {}", &info.commit[..12], info.subject);
                        report.first_bad = Some(info);
                    }
                    Err(e) => {
                        report.message =
                            format!("first bad commit: {oid} (cannot describe it: {e})")
                    }
                }
                (report, Some(oid))
            }
            SearchResult::Ambiguous(indices) => {
                report.result = RunResult::Ambiguous;
                report.candidates = refs(&indices);
                report.message = format!(
                    "skipped commits leave {} candidates; the first bad commit is one of them",
                    indices.len()
                );
                (report, None)
            }
        }
    }

    fn commit_ref(&self, oid: Oid) -> CommitRef {
        let subject = self
            .plan
            .repo
            .info(oid)
            .map(|i| i.subject)
            .unwrap_or_default();
        CommitRef {
            commit: oid.to_string(),
            subject,
        }
    }

    fn inconclusive(&mut self, mut report: Report) -> Report {
        report.result = RunResult::Inconclusive;
        report.message = "interrupted before the search finished".into();
        report.probes = std::mem::take(&mut self.probes);
        report
    }

    fn empty_report(&self, run_dir: &Path) -> Report {
        Report {
            format_version: FORMAT_VERSION,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            result: RunResult::Inconclusive,
            message: String::new(),
            good: self.plan.goods.iter().map(|(_, o)| o.to_string()).collect(),
            bad: self.plan.bad.1.to_string(),
            target: None,
            match_policy: self.plan.config.match_policy.describe(),
            launch_blocking: self.plan.config.repro.launch_blocking,
            first_bad: None,
            good_parents: Vec::new(),
            candidates: Vec::new(),
            probes: Vec::new(),
            range_size: self.plan.range.len(),
            run_dir: run_dir.display().to_string(),
            triage: None,
            shrink: None,
            bundle: None,
        }
    }
}

/// A bad endpoint reproduces when it fails in a way that can be a target: not clean, not a build break,
/// not the machine's fault.
fn reproduces(sig: &Signature) -> bool {
    use crate::classify::FaultClass::*;
    !matches!(sig.class, None | BuildFailure | Infra)
}
