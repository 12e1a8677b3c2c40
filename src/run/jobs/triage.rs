//! `cudabisect triage` on its own: the compute-sanitizer escalation in the checkout, at a revision built in
//! the probe worktree under the state lock, or on a bare `-- command` outside any repository.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::config::{CommandLine, Config};
use crate::exec::executor::{Executor, Local, Session};
use crate::git::Repo;
use crate::report::bundle::BundleInput;
use crate::report::event::Reporter;
use crate::report::record::{TriageResult, TriageStatus};

use crate::run::error::RunError;
use crate::run::outputs::{bundle_root, write_bundle_reporting};
use crate::run::workspace::run_id;
use crate::run::workspace::{Opening, Workspace};

use crate::run::plan::load;
use crate::run::probe::sanitizer;

/// Writes a command back as TOML, for the built-in config of a bare `triage -- cmd`.
fn toml_command(cmd: &CommandLine) -> String {
    match cmd {
        CommandLine::Argv(v) => {
            toml::Value::Array(v.iter().cloned().map(toml::Value::String).collect()).to_string()
        }
        CommandLine::Shell(s) => toml::Value::String(s.clone()).to_string(),
    }
}

/// Runs triage and returns its result; `Err` for problems before any sanitizer ran.
pub fn triage_job(
    dir: &Path,
    config: Option<&Path>,
    at: Option<&str>,
    command: Option<CommandLine>,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> Result<TriageResult, RunError> {
    let (repo, config) = repo_and_config(dir, config, at, command.as_ref())?;
    let own_repro = command.is_none() && config.triage.command.is_none();
    let command = command.unwrap_or_else(|| {
        config
            .triage
            .command
            .clone()
            .unwrap_or_else(|| config.repro.command.clone())
    });
    let configured = config.triage.sanitizer.as_deref();
    if sanitizer::find_sanitizer(configured).is_none() {
        return Err(RunError::Unavailable(sanitizer::missing_message(
            configured,
        )));
    }
    let out_dir = out_dir(repo.as_ref())?;
    let runs = Runs {
        config: &config,
        command: &command,
        out_dir: &out_dir,
        cancel,
    };
    // The executor the triage ran through: the bundle asks for the environment where it ran.
    let (result, ran_at) = match (at, &repo) {
        (None, Some(repo)) => runs.in_checkout(repo, reporter)?,
        (None, None) => {
            // A bare `-- command` outside any repository: no workspace, and a config of that command
            // alone (no `[executor]`), so it runs here.
            let here: Arc<dyn Executor> = Arc::new(Local);
            (runs.run(here.session().as_mut(), dir, ""), here)
        }
        (Some(_), None) => return Err(RunError::Usage("--at needs a git repository".into())),
        (Some(rev), Some(repo)) => runs.at_revision(repo, rev, reporter)?,
    };
    if let (Some(repo), TriageStatus::Found, true) = (&repo, result.status, config.bundle.enabled) {
        let how = (at, own_repro, ran_at.as_ref());
        bundle_the_triage(repo, &config, how, &result, reporter, cancel);
    }
    Ok(result)
}

/// A triage's result, and the executor it ran through.
type Ran = (TriageResult, Arc<dyn Executor>);

/// What every triage run of the job shares: the config, the command, where the logs go, Ctrl-C.
struct Runs<'a> {
    config: &'a Config,
    command: &'a CommandLine,
    out_dir: &'a Path,
    cancel: &'a AtomicBool,
}

impl Runs<'_> {
    /// The escalation in `cwd`, through `session`.
    fn run(&self, session: &mut dyn Session, cwd: &Path, commit: &str) -> TriageResult {
        sanitizer::run(
            session,
            self.config,
            cwd,
            self.command,
            commit,
            self.out_dir,
            self.cancel,
        )
    }

    /// In the checkout as it is, through the executor of a workspace (which makes no worktree here): the
    /// result, and that executor.
    fn in_checkout(&self, repo: &Repo, reporter: &mut dyn Reporter) -> Result<Ran, RunError> {
        let ws = self.workspace(repo, None)?;
        let result = self.run(ws.executor.session().as_mut(), &repo.workdir(), "");
        let at = ws.executor.clone();
        ws.close(reporter);
        Ok((result, at))
    }

    /// At `rev`, built in a probe worktree under the state lock.
    fn at_revision(
        &self,
        repo: &Repo,
        rev: &str,
        reporter: &mut dyn Reporter,
    ) -> Result<Ran, RunError> {
        let oid = repo.resolve(rev)?;
        let lock_name = format!("triage --at {rev}");
        let ws = self.workspace(repo, Some(&lock_name))?;
        let worktree = ws.worktree("worktree")?;
        let prober = ws.prober(&worktree, self.config, self.cancel);
        let result = prober.prepare(oid, "triage").map(|()| {
            self.run(
                ws.executor.session().as_mut(),
                worktree.path(),
                &oid.to_string(),
            )
        });
        let at = ws.executor.clone();
        ws.close(reporter);
        Ok((result?, at))
    }

    fn workspace<'r>(&self, repo: &'r Repo, lock: Option<&str>) -> Result<Workspace<'r>, RunError> {
        Workspace::open(
            repo,
            self.config,
            Opening {
                lock,
                prefix: "triage-",
                log_dir: Some(self.out_dir.to_path_buf()),
            },
        )
    }
}

/// The repository (when there is one) and the config: bisect.toml's, or (with `-- command` and no config
/// at all) one of only that command, which needs neither a repository nor a bisect.toml.
fn repo_and_config(
    dir: &Path,
    config: Option<&Path>,
    at: Option<&str>,
    command: Option<&CommandLine>,
) -> Result<(Option<Repo>, Config), RunError> {
    match (load(dir, config), command) {
        (Ok((r, c)), _) => Ok((Some(r), c)),
        (Err(_), Some(cmd)) if config.is_none() && at.is_none() => {
            let text = format!("[repro]\ncommand = {}\n", toml_command(cmd));
            let c = Config::parse(Path::new("<command line>"), &text)?;
            Ok((Repo::open(dir).ok(), c))
        }
        (Err(e), _) => Err(e),
    }
}

/// Where a triage's logs go: the repository's state directory (made by the workspace, once its executor
/// has said it can run anything), else (outside a repository) a directory of their own under the
/// temporary directory, kept after the run (the result names them).
fn out_dir(repo: Option<&Repo>) -> Result<PathBuf, RunError> {
    match repo {
        Some(r) => Ok(r.state_dir().join("triage").join(run_id())),
        None => Ok(tempfile::Builder::new()
            .prefix("cudabisect-triage-")
            .tempdir()
            .map_err(RunError::io(Path::new("<temp dir>")))?
            .keep()),
    }
}

/// The bundle of a triage on its own, at `--at`'s commit (else HEAD); `own_repro`: the project's own
/// repro was triaged, so the bundle carries it; its environment asked where the triage ran (`ran_at`).
fn bundle_the_triage(
    repo: &Repo,
    config: &Config,
    (at, own_repro, ran_at): (Option<&str>, bool, &dyn Executor),
    result: &TriageResult,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) {
    let oid = at
        .and_then(|rev| repo.resolve(rev).ok())
        .or_else(|| repo.resolve("HEAD").ok());
    let input = BundleInput {
        root: bundle_root(repo, config, None),
        commit: oid.and_then(|o| repo.info(o).ok()),
        good_parents: vec![],
        found_by: Some("cudabisect triage".into()),
        target: result.signature.clone(),
        triage: Some(result),
        shrink: None,
        report_json: serde_json::to_value(result).unwrap_or_default(),
        config_text: &config.text,
        log_dirs: vec![],
        extra_files: result.files.iter().map(PathBuf::from).collect(),
        backend: None,
        include_binary: false,
        // The project's own repro, unless another command was triaged.
        full_repro: own_repro.then_some(crate::report::bundle::FullRepro {
            build: config.build.as_ref(),
            repro: &config.repro,
        }),
    };
    write_bundle_reporting(&input, ran_at, reporter, cancel);
}
