//! One probe: check the commit out in the probe worktree, build it, run the repro (retrying infrastructure
//! failures, rerunning clean runs under `[repro] attempts`) and classify the outcome. A prober only
//! observes: the search's judge turns what it saw into a verdict. The search driver sees probes only
//! through [`Probe`].

use crate::report::record::short_sha;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use git2::Oid;

use crate::classify::{Exit, FaultClass, Signature};
use crate::config::{CommandLine, Config};
use crate::exec::child_env::{command_spec, ChildCommand, ChildContext, ChildPhase, WorkerSlot};
use crate::exec::executor::{Executor, Session};
use crate::exec::process::{self, RunOutput};
use crate::git::{CheckoutError, ProbeWorktree};
use crate::report::event::{Event, Phase, Reporter};
use crate::report::record::{ProbeRecord, ProbeRole};
use crate::run::probe::sanitizer::Backtraces;
use crate::run::probe::warm::{Runner, Serves};

use crate::host::gpu_idle::{wait_idle, Devices, NvidiaSmi};

/// Where a probe stands in the search, for progress events and its record.
#[derive(Clone, Copy, Debug)]
pub struct ProbeContext {
    /// Probe number, from 1.
    pub step: usize,
    /// Why it runs.
    pub role: ProbeRole,
    /// Candidates left.
    pub remaining: usize,
    /// Probes left, estimated.
    pub estimated_steps: usize,
    /// The parallel worker running it (from 1); `None` when probes run one at a time.
    pub worker: Option<usize>,
    /// For a search that runs commits several times (a flaky fault): which run of this commit this is,
    /// from 0. Such a probe is one run of the repro (`[repro] attempts` does not apply), and the journal
    /// keeps each run apart. `None`: an ordinary probe.
    pub repeat: Option<u32>,
    /// Other probes may run on its GPU while it runs (several at once on one GPU). Such a probe that runs
    /// out of memory, is killed or hangs says nothing of its commit: see [`ProbeContext::crowded_out`].
    pub crowded: bool,
}

impl ProbeContext {
    /// Whether `class`, in a probe of this context, may be the crowd's doing rather than the commit's: an
    /// allocation failure, a kill (the OOM killer's) or a timeout while others shared the GPU. Such a run
    /// is neither judged nor journaled; the commit runs again with the GPU to itself.
    pub fn crowded_out(&self, class: crate::classify::FaultClass) -> bool {
        use crate::classify::FaultClass;
        self.crowded
            && matches!(
                class,
                FaultClass::OutOfMemory | FaultClass::Signal | FaultClass::Hang
            )
    }
}

impl Sanitized {
    /// The record of this sanitizer run of `commit`, at an endpoint whose fault is `fault` (its finding's
    /// signature when it has one), with the verdict that endpoint has in the search.
    pub fn endpoint_record(
        self,
        commit: Oid,
        fault: &Signature,
        verdict: crate::bisect::Verdict,
    ) -> ProbeRecord {
        ProbeRecord {
            commit: commit.to_string(),
            role: ProbeRole::EndpointSanitizer,
            verdict,
            signature: self.finding.unwrap_or_else(|| fault.clone()),
            matched_target: true,
            reason: None,
            exit_code: None,
            signal: None,
            duration_s: self.duration_s,
            build_log: None,
            log: None,
            sanitizer: Some(self.summary),
            attempts: 1,
            reused: false,
            job: None,
            runner: None,
            build_runner: None,
        }
    }
}

/// What one probe observed. Its record's `verdict`, `matched_target` and `reason` are not the prober's to
/// decide: they are left as a skip until the judge (`run::search::judge`) fills them in.
#[derive(Clone, Debug)]
pub struct ProbeOutcome {
    /// The record.
    pub record: ProbeRecord,
    /// True when Ctrl-C or SIGTERM stopped it.
    pub interrupted: bool,
    /// The repro's output (what a regex same-bug policy reads).
    pub output: String,
}

/// What compute-sanitizer said about a commit's fault.
#[derive(Clone, Debug)]
pub struct Sanitized {
    /// The first finding's signature (its kernel is what tells two bugs of one class apart).
    pub finding: Option<Signature>,
    /// One line for the record.
    pub summary: String,
    /// Wall time of the sanitizer run.
    pub duration_s: f64,
    /// Stopped before it could say anything (Ctrl-C, or its probe's answer no longer mattered).
    pub interrupted: bool,
}

/// What the search driver needs: probe a commit against the target (`None` while probing the bad
/// endpoint, whose signature becomes the target), and, when a sanitizer is at hand, rerun the commit just
/// probed under it to learn which kernel faulted.
pub trait Probe: Send {
    /// Probes `oid` and returns its record.
    fn probe(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome;

    /// Reruns `oid` (the commit probed last, still built) under compute-sanitizer's memcheck; `None` when
    /// no sanitizer can be used.
    fn sanitize(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized>;

    /// The GPU this prober shares with other workers (`CUDA_VISIBLE_DEVICES` ids); `None` when it has its
    /// devices to itself or is not pinned.
    fn shared_gpu(&self) -> Option<String> {
        None
    }
}

/// Why a commit could not be prepared for a stage after the search.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The checkout failed.
    #[error("checkout of {oid} failed: {source}")]
    Checkout {
        /// The commit.
        oid: Oid,
        /// Why.
        #[source]
        source: CheckoutError,
    },
    /// The build could not start.
    #[error("the build of {commit} could not start: {source}")]
    BuildStart {
        /// The commit.
        commit: String,
        /// Why.
        #[source]
        source: process::ProcessError,
    },
    /// The build failed.
    #[error("the build of {commit} failed ({log})")]
    Build {
        /// The commit.
        commit: String,
        /// Its log, or why there is none.
        log: String,
    },
}

/// Probes in the probe worktree, with real processes.
pub struct WorktreeProber<'a> {
    /// The probe worktree.
    pub worktree: &'a ProbeWorktree,
    /// Settings.
    pub config: &'a Config,
    /// Where logs go.
    pub log_dir: PathBuf,
    /// Set on Ctrl-C, or when the search abandons this worker's probe.
    pub cancel: &'a AtomicBool,
    /// The parallel worker this prober is, with its devices; `None` when probes run one at a time.
    pub slot: Option<WorkerSlot>,
    /// Processes of the previous run found after it ended: the next run waits until they left the GPU.
    pub lingering: Vec<i32>,
    /// The warm interpreters Python repros run in (`[repro] warm`); `None`: every run is a fresh process.
    pub warm: Option<&'a crate::run::probe::warm::WarmPool>,
    /// Where its commands run, handed in by the job's workspace.
    pub executor: std::sync::Arc<dyn Executor>,
    /// The commit its last repro ran at and what that run showed: a sanitizer run that follows it at
    /// the same commit records the call stacks that fault calls for ([`Backtraces::for_fault`]).
    pub last_seen: Option<(Oid, Signature)>,
}

impl Probe for WorktreeProber<'_> {
    fn probe(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        _target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let started = Instant::now();
        let commit = oid.to_string();
        let mut record = Finished {
            ctx,
            commit: &commit,
            started,
            build_runner: None,
        };
        let phase = |reporter: &mut dyn Reporter, phase| {
            reporter.event(&Event::PhaseStarted {
                step: ctx.step,
                commit: commit.clone(),
                role: ctx.role,
                phase,
                remaining: ctx.remaining,
                estimated_steps: ctx.estimated_steps,
                worker: ctx.worker,
            })
        };
        phase(reporter, Phase::Checkout);
        if let Err(e) = self.worktree.checkout(oid, self.clean()) {
            let class = match e {
                CheckoutError::MissingObject(_) => FaultClass::MissingObject,
                CheckoutError::Git(_) => FaultClass::Infra,
            };
            let sig = Signature::new(class, format!("checkout failed: {e}"));
            return record.done(sig, None, None, None, 0);
        }
        // Where this probe's commands run: for Slurm, one allocation for its build and repro, released
        // when the probe ends.
        let executor = self.executor.clone();
        let mut session = executor.session();
        let build_log = if self.config.build.is_some() {
            phase(reporter, Phase::Build);
            match self.built(session.as_mut(), ctx, &commit, &mut record) {
                Ok(log) => log,
                Err(out) => return *out,
            }
        } else {
            None
        };
        phase(reporter, Phase::Repro);
        self.run_repro(
            (session.as_mut(), executor.is_local()),
            ctx,
            &commit,
            build_log,
            &mut record,
        )
    }

    fn sanitize(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        let config = self.config;
        if !config.triage.enabled
            || crate::exec::tools::find_sanitizer(config.triage.sanitizer.as_deref()).is_none()
        {
            return None;
        }
        reporter.event(&Event::SanitizerRerun {
            step: ctx.step,
            commit: oid.to_string(),
        });
        let started = Instant::now();
        let out_dir = self.log_dir.join(format!("{:03}-sanitizer", ctx.step));
        let _ = std::fs::create_dir_all(&out_dir);
        let command = config
            .triage
            .command
            .clone()
            .unwrap_or_else(|| config.repro.command.clone());
        let seen = self.last_seen.as_ref().filter(|(at, _)| *at == oid);
        let backtraces = Backtraces::for_fault(seen.map(|(_, s)| s));
        let result = crate::run::probe::sanitizer::run_tools(
            self.executor.session().as_mut(),
            config,
            (self.worktree.path(), &oid.to_string()),
            &command,
            &out_dir,
            self.cancel,
            (
                &[crate::report::record::SanitizerTool::Memcheck],
                backtraces,
            ),
        );
        let mut finding = result.signature;
        if let Some(f) = finding.as_mut() {
            f.relativize(self.worktree.path());
        }
        Some(Sanitized {
            finding,
            summary: result.summary,
            duration_s: started.elapsed().as_secs_f64(),
            interrupted: self.cancel.load(Ordering::SeqCst),
        })
    }

    fn shared_gpu(&self) -> Option<String> {
        self.slot
            .as_ref()
            .filter(|s| s.shares_gpu)
            .and_then(|s| s.devices.clone())
    }
}

impl ProbeOutcome {
    /// A probe of `commit` that ran nothing, `signature` saying why: its record as any prober leaves it
    /// for the judge.
    pub fn without_run(commit: Oid, ctx: &ProbeContext, signature: Signature) -> Self {
        let commit = commit.to_string();
        let mut finished = Finished {
            ctx,
            commit: &commit,
            started: Instant::now(),
            build_runner: None,
        };
        finished.done(signature, None, None, None, 0)
    }
}

/// Everything a record needs besides the run itself.
struct Finished<'r> {
    ctx: &'r ProbeContext,
    commit: &'r str,
    started: Instant,
    /// How the build ran, when it is a Python command (warm, or why cold).
    build_runner: Option<String>,
}

/// A finished build: its run, its log, and how it ran (warm, or why cold; `None` when the warm
/// interpreters do not serve builds).
struct Built {
    run: RunOutput,
    log: Option<String>,
    runner: Option<Runner>,
}

/// What a run tells when its warm interpreter went away before it ended: the machine failed under it,
/// whatever the client's exit says (retried as one, never judged as the commit's).
fn lost_run(runner: Option<&Runner>) -> Option<Signature> {
    match runner {
        Some(Runner::Lost(why)) => Some(Signature::new(
            FaultClass::Infra,
            format!("the warm interpreter the run was forked from went away: {why}"),
        )),
        _ => None,
    }
}

impl Finished<'_> {
    fn done(
        &mut self,
        signature: Signature,
        run: Option<&RunOutput>,
        build_log: Option<String>,
        log: Option<String>,
        attempts: u32,
    ) -> ProbeOutcome {
        let (exit_code, signal) = match run.map(|r| r.exit) {
            Some(Exit::Code(c)) => (Some(c), None),
            Some(Exit::Signal(s)) => (None, Some(s)),
            _ => (None, None),
        };
        ProbeOutcome {
            record: ProbeRecord {
                commit: self.commit.to_string(),
                role: self.ctx.role,
                verdict: crate::bisect::Verdict::Skip,
                signature,
                matched_target: false,
                reason: None,
                exit_code,
                signal,
                duration_s: self.started.elapsed().as_secs_f64(),
                build_log,
                log,
                sanitizer: None,
                attempts,
                reused: false,
                job: run.and_then(|r| r.job.clone()),
                runner: None,
                build_runner: self.build_runner.clone(),
            },
            interrupted: run.is_some_and(|r| r.interrupted),
            output: run.map(|r| r.output.clone()).unwrap_or_default(),
        }
    }
}

impl<'a> WorktreeProber<'a> {
    /// The commit's build in `session`, retried when the machine failed under it (no allocation, a node
    /// lost: never blamed on the commit as a build break): its log, or the probe's outcome when it failed.
    fn built(
        &self,
        session: &mut dyn Session,
        ctx: &ProbeContext,
        commit: &str,
        record: &mut Finished,
    ) -> Result<Option<String>, Box<ProbeOutcome>> {
        // The machine failing under a build (no allocation, a node lost) is retried like a repro's
        // infrastructure failure, and never blamed on the commit as a build break.
        let mut infra_retried = 0;
        loop {
            match self.build(session, commit, ctx.step, "build") {
                None => {}
                Some(Err(e)) => {
                    let class = start_failure_class(&e);
                    let sig = Signature::new(class, e.to_string());
                    if class == FaultClass::Infra && infra_retried < self.config.repro.infra_retries
                    {
                        infra_retried += 1;
                        continue;
                    }
                    return Err(Box::new(record.done(sig, None, None, None, 0)));
                }
                Some(Ok(Built { run, log, runner })) if run.exit != Exit::Code(0) => {
                    let seen = lost_run(runner.as_ref()).unwrap_or_else(|| run.signature());
                    record.build_runner = runner.map(|r| r.describe());
                    if seen.class == FaultClass::Infra && !run.interrupted {
                        if infra_retried < self.config.repro.infra_retries {
                            infra_retried += 1;
                            continue;
                        }
                        return Err(Box::new(record.done(seen, Some(&run), log.clone(), log, 0)));
                    }
                    let sig = build_failure(&run);
                    return Err(Box::new(record.done(sig, Some(&run), log.clone(), log, 0)));
                }
                Some(Ok(Built { log, runner, .. })) => {
                    record.build_runner = runner.map(|r| r.describe());
                    return Ok(log);
                }
            }
            break;
        }
        Ok(None)
    }

    /// One run of `spec` in `session`: a Python repro or build in a child of the worker's warm
    /// interpreter for it (the same process group, timeout and streams: only the imports are already
    /// done). The run, and how it ran (warm, or why cold).
    fn run_warm_or_cold(
        &self,
        session: &mut dyn Session,
        spec: &mut process::CommandSpec,
        serves: Serves,
    ) -> (Result<RunOutput, process::ProcessError>, Option<Runner>) {
        let at = (self.worker(), serves);
        let pool = self.warm_pool(serves);
        let warm = pool.and_then(|pool| pool.prepare(at, spec, self.cancel).map(|run| (pool, run)));
        let result = session.run(spec, self.cancel);
        let runner = match warm {
            Some((pool, run)) => Some(pool.finish(run)),
            None => pool
                .and_then(|p| p.off(at))
                .map(|why| Runner::Cold(format!("warm probes are off for this run: {why}"))),
        };
        (result, runner)
    }

    /// The repro at the built commit, run again for the machine's failures (`[repro] infra-retries`) and
    /// for clean runs of a flaky fault (`[repro] attempts`): the probe's outcome.
    fn run_repro(
        &mut self,
        (session, local): (&mut dyn Session, bool),
        ctx: &ProbeContext,
        commit: &str,
        build_log: Option<String>,
        record: &mut Finished,
    ) -> ProbeOutcome {
        let repro = &self.config.repro;
        let mut attempt = 1;
        let (mut infra_retried, mut clean_runs) = (0, 0);
        loop {
            let name = if attempt == 1 {
                "repro".to_string()
            } else {
                format!("repro-{attempt}")
            };
            let mut spec = self.repro_spec(commit, attempt);
            let rank_dir = self.rank_log_dir(local, ctx.step, commit, &name);
            spec.env.push((
                "CUDABISECT_RANK_LOG_DIR".into(),
                rank_dir.display().to_string(),
            ));
            if local {
                if let Err(busy) = self.wait_for_free_gpus() {
                    let sig = Signature::new(FaultClass::Infra, busy.to_string());
                    return record.done(sig, None, build_log, None, attempt);
                }
            }
            let (result, runner) = self.run_warm_or_cold(session, &mut spec, Serves::Repro);
            let run = match result {
                Ok(mut run) => {
                    crate::classify::append_rank_logs(&rank_dir, &mut run.output);
                    run
                }
                Err(e) => {
                    let class = start_failure_class(&e);
                    let sig = Signature::new(class, format!("the repro could not start: {e}"));
                    if class == FaultClass::Infra && infra_retried < repro.infra_retries {
                        infra_retried += 1;
                        attempt += 1;
                        continue;
                    }
                    return record.done(sig, None, build_log, None, attempt);
                }
            };
            self.lingering = run.lingering.clone();
            let log = self.write_log(ctx.step, commit, &name, &run);
            let mut sig = lost_run(runner.as_ref()).unwrap_or_else(|| run.signature());
            sig.relativize(self.worktree.path());
            self.last_seen = Oid::from_str(commit).ok().map(|oid| (oid, sig.clone()));
            if sig.class == FaultClass::Infra
                && infra_retried < repro.infra_retries
                && !run.interrupted
            {
                infra_retried += 1;
                attempt += 1;
                continue;
            }
            // A clean run of a flaky fault proves little: run again, up to `attempts` clean runs.
            if sig.class == FaultClass::None
                && ctx.repeat.is_none()
                && clean_runs + 1 < repro.attempts
                && !run.interrupted
            {
                clean_runs += 1;
                attempt += 1;
                continue;
            }
            let mut out = record.done(sig, Some(&run), build_log, log, attempt);
            out.record.runner = runner.map(|r| r.describe());
            return out;
        }
    }

    /// The repro's command at `commit` in this worktree, as run number `attempt`.
    fn repro_spec(&self, commit: &str, attempt: u32) -> process::CommandSpec {
        let repro = &self.config.repro;
        command_spec(
            self.config,
            ChildCommand {
                command: &repro.command,
                timeout: repro.timeout,
                env: &repro.env,
            },
            &ChildContext {
                worktree: self.worktree.path(),
                commit,
                phase: ChildPhase::Repro,
                attempt,
                slot: self.slot.as_ref(),
                side_by_side: false,
            },
        )
    }

    /// This prober's worker number (1 when probes run one at a time).
    fn worker(&self) -> usize {
        self.slot.as_ref().map_or(1, |s| s.worker)
    }

    /// Its warm interpreter for the repro, for a stage's run of the repro in its worktree (the shrink's
    /// capture); `None` when its repro runs cold.
    pub fn repro_warm(&self) -> Option<crate::run::probe::warm::WarmAt<'a>> {
        self.warm_pool(Serves::Repro)
            .map(|pool| (pool, (self.worker(), Serves::Repro)))
    }

    /// The warm interpreters its repro (`[repro] warm`) or its build (`[build] warm`) runs in, on this
    /// machine only.
    fn warm_pool(&self, serves: Serves) -> Option<&'a crate::run::probe::warm::WarmPool> {
        let wanted = match serves {
            Serves::Repro => self.config.repro.warm,
            Serves::Build => self.config.build.as_ref().is_some_and(|b| b.warm),
        };
        self.warm.filter(|_| wanted && self.executor.is_local())
    }

    fn clean(&self) -> bool {
        self.config.build.as_ref().is_some_and(|b| b.clean)
    }

    /// Checks out and builds `oid` for a stage after the search (triage, shrink, the parent check), so
    /// those stages never run a binary left over from another probe.
    pub fn prepare(&self, oid: Oid, name: &str) -> Result<(), PrepareError> {
        self.worktree
            .checkout(oid, self.clean())
            .map_err(|source| PrepareError::Checkout { oid, source })?;
        let commit = oid.to_string();
        match self.build(
            self.executor.session().as_mut(),
            &commit,
            0,
            &format!("{name}-build"),
        ) {
            None => Ok(()),
            Some(Err(source)) => Err(PrepareError::BuildStart {
                commit: short_sha(&commit).to_string(),
                source,
            }),
            Some(Ok(Built { run, log, .. })) if run.exit != Exit::Code(0) => {
                Err(PrepareError::Build {
                    commit: short_sha(&commit).to_string(),
                    log: log.unwrap_or_else(|| "no log".into()),
                })
            }
            Some(Ok(_)) => Ok(()),
        }
    }

    /// Where a launcher that writes each rank's output to files (torchrun `--log-dir`) writes them for one
    /// run: beside the logs, or in the shared workdir when the command runs on a node that sees only that
    /// (under the run's own id, so runs never read each other's files).
    fn rank_log_dir(&self, local: bool, step: usize, commit: &str, name: &str) -> PathBuf {
        let root = match &self.config.executor.workdir {
            Some(shared) if !local => shared.join("ranks").join(
                self.log_dir
                    .parent()
                    .and_then(|run| run.file_name())
                    .unwrap_or_default(),
            ),
            _ => self.log_dir.clone(),
        };
        root.join(format!("{step:03}-{}-{name}.ranks", short_sha(commit)))
    }

    /// Waits until the previous run's processes have left this prober's GPUs (a killed rank lingers while
    /// the driver tears its context down), so no run starts on a GPU another still holds.
    fn wait_for_free_gpus(&mut self) -> Result<(), crate::host::gpu_idle::StillBusy> {
        let devices = Devices {
            ids: self.slot.as_ref().and_then(|s| s.devices.as_deref()),
            // On a GPU shared with other workers, their live runs are not this prober's to wait for.
            exclusive: self
                .slot
                .as_ref()
                .is_none_or(|s| s.devices.is_some() && !s.shares_gpu),
        };
        let lingering = std::mem::take(&mut self.lingering);
        wait_idle(
            &NvidiaSmi,
            devices,
            &lingering,
            self.config.repro.idle_timeout,
            self.cancel,
        )
        .inspect_err(|busy| self.lingering = busy.pids.clone())
    }

    /// Runs the configured build in the worktree and logs it; `None` when there is no build step.
    fn build(
        &self,
        session: &mut dyn crate::exec::executor::Session,
        commit: &str,
        step_no: usize,
        log_name: &str,
    ) -> Option<Result<Built, process::ProcessError>> {
        // `$1` the environment, `$2` the pip shim. When the user's `python3` is itself a virtual
        // environment's (a venv, `uv venv`), `--system-site-packages` would layer over the base interpreter
        // and hide the user's packages: a `.pth` adds the user's environment after the worktree's own.
        const VENV_SCRIPT: &str = r#"python3 -m venv --system-site-packages --without-pip "$1" && for p in pip pip3; do printf '%s' "$2" > "$1/bin/$p" && chmod +x "$1/bin/$p"; done && outer=$(python3 -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")') && if [ -n "$outer" ]; then own=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && printf '%s\n' "$outer" > "$own/_cudabisect_outer_environment.pth"; fi"#;
        let build = self.config.build.as_ref()?;
        if build.uses_venv() {
            let venv = crate::exec::child_env::venv_dir(self.worktree.path());
            if !venv.join("bin/python").exists() {
                // Once per worktree: a virtual environment that sees the user's packages (torch, jax)
                // and takes what the build installs, so the user's own environment never does.
                // Without its own pip (ensurepip is often not installed, and takes seconds): `pip` in
                // the environment is a shim for `python -m pip`, the user's pip installing here.
                let shim = "#!/bin/sh\nexec \"$(dirname \"$0\")/python\" -m pip \"$@\"\n";
                let create = process::CommandSpec {
                    command: CommandLine::Argv(vec![
                        "sh".into(),
                        "-c".into(),
                        VENV_SCRIPT.into(),
                        "venv".into(),
                        venv.display().to_string(),
                        shim.into(),
                    ]),
                    cwd: self.worktree.path().to_path_buf(),
                    env: build
                        .env
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    timeout: build.timeout,
                    grace: self.config.repro.grace_period,
                    stack_dump: None,
                };
                match session.run(&create, self.cancel) {
                    Ok(run) if run.exit == Exit::Code(0) => {}
                    other => {
                        return Some(other.map(|run| {
                            let log = self.write_log(step_no, commit, log_name, &run);
                            Built {
                                run,
                                log,
                                runner: None,
                            }
                        }))
                    }
                }
            }
        }
        let mut spec = command_spec(
            self.config,
            ChildCommand {
                command: &build.command,
                timeout: build.timeout,
                env: &build.env,
            },
            &ChildContext {
                worktree: self.worktree.path(),
                commit,
                phase: ChildPhase::Build,
                attempt: 1,
                slot: self.slot.as_ref(),
                side_by_side: false,
            },
        );
        let (result, runner) = self.run_warm_or_cold(session, &mut spec, Serves::Build);
        Some(result.map(|run| {
            let log = self.write_log(step_no, commit, log_name, &run);
            Built { run, log, runner }
        }))
    }

    fn write_log(&self, step: usize, commit: &str, name: &str, run: &RunOutput) -> Option<String> {
        let path = self
            .log_dir
            .join(format!("{step:03}-{}-{name}.log", short_sha(commit)));
        let trailer = match run.exit {
            Exit::Code(c) => format!("exit={c}"),
            Exit::Signal(s) => format!("signal={s}"),
            Exit::Timeout => "timeout".to_string(),
            Exit::Unknown => "unknown".to_string(),
        };
        // A scheduler's end is a fact of the run, kept as a type; the log says it in words, in the form
        // `cudabisect classify` reads back from a log.
        let host_end = run
            .ended_by
            .as_ref()
            .map(|end| format!("\n[cudabisect] {}", end.summary()))
            .unwrap_or_default();
        let text = format!(
            "{}{host_end}\n{} {trailer} after {:.2}s\n",
            run.output.trim_end(),
            crate::classify::LOG_TRAILER_PREFIX,
            run.duration.as_secs_f64()
        );
        std::fs::write(&path, text).ok()?;
        // A distributed run's ranks interleave in one stream: each rank's own lines go beside it too.
        let streams = crate::classify::RankStreams::split(&run.output);
        for (rank, lines) in streams.rank_texts() {
            let rank_path = self.log_dir.join(format!(
                "{step:03}-{}-{name}.rank{rank}.log",
                short_sha(commit)
            ));
            let _ = std::fs::write(rank_path, lines);
        }
        Some(path.display().to_string())
    }
}

/// The last non-empty line of some output, trimmed.
pub fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// The class of a command that never started: a scheduler that cannot take the job now (its controller
/// unreachable) is the machine's problem, retried; a command that cannot start is the commit's.
fn start_failure_class(e: &process::ProcessError) -> FaultClass {
    match e {
        process::ProcessError::Scheduler { .. } => FaultClass::Infra,
        _ => FaultClass::ExecFailure,
    }
}

fn build_failure(run: &RunOutput) -> Signature {
    let what = match run.exit {
        Exit::Timeout => "build timed out".to_string(),
        Exit::Signal(s) => format!("build killed by signal {s}"),
        Exit::Code(c) => format!("build exited {c}"),
        Exit::Unknown => "build failed".to_string(),
    };
    let last = last_line(&run.output);
    Signature::new(
        FaultClass::BuildFailure,
        if last.is_empty() {
            what
        } else {
            format!("{what}: {last}")
        },
    )
}
