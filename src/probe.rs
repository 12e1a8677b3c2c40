//! One probe: check the commit out in the probe worktree, build it, run the repro (retrying infrastructure
//! failures), classify the outcome and turn it into a verdict against the target signature.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use git2::Oid;

use crate::classify::{classify, Exit, FaultClass, Signature};
use crate::config::{CommandLine, Config};
use crate::events::{Event, Phase, Reporter};
use crate::git::ProbeWorktree;
use crate::process::{self, CommandSpec, RunOutput};
use crate::report::{ProbeRecord, ProbeRole, ProbeVerdict};

/// Runs probes for one `start` run.
pub struct Prober<'a> {
    /// The probe worktree.
    pub worktree: &'a ProbeWorktree,
    /// Settings.
    pub config: &'a Config,
    /// Where logs go.
    pub log_dir: PathBuf,
    /// Set on Ctrl-C.
    pub cancel: &'a AtomicBool,
}

/// Where a probe stands in the search, for progress events.
pub struct ProbeContext {
    /// Probe number, from 1.
    pub step: usize,
    /// Why it runs.
    pub role: ProbeRole,
    /// Candidates left.
    pub remaining: usize,
    /// Probes left, estimated.
    pub estimated_steps: usize,
}

/// What one probe produced, besides its record: the repro's output, for same-bug matching.
pub struct ProbeOutcome {
    /// The record.
    pub record: ProbeRecord,
    /// The last run's output.
    pub output: String,
    /// True when the run was interrupted.
    pub interrupted: bool,
}

impl Prober<'_> {
    /// Probes `oid`; `target` is the bad endpoint's signature (None while probing the bad endpoint itself).
    pub fn probe(
        &self,
        oid: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let started = Instant::now();
        let commit = oid.to_string();
        let phase = |reporter: &mut dyn Reporter, phase| {
            reporter.event(&Event::PhaseStarted {
                step: ctx.step,
                commit: commit.clone(),
                role: ctx.role,
                phase,
                remaining: ctx.remaining,
                estimated_steps: ctx.estimated_steps,
            })
        };
        phase(reporter, Phase::Checkout);
        let clean = self.config.build.as_ref().is_some_and(|b| b.clean);
        if let Err(e) = self.worktree.checkout(oid, clean) {
            let sig = Signature::new(FaultClass::Infra, format!("checkout failed: {e}"));
            return self.finish(ctx, &commit, started, sig, None, None, None, 0, target);
        }
        let mut build_log = None;
        if self.config.build.is_some() {
            phase(reporter, Phase::Build);
            let (run, log) = match self.build(&commit, ctx.step, "build") {
                Some(Ok(built)) => built,
                Some(Err(e)) => {
                    let sig = Signature::new(FaultClass::BuildFailure, e);
                    return self.finish(ctx, &commit, started, sig, None, None, None, 0, target);
                }
                None => unreachable!("a build is configured"),
            };
            if run.exit != Exit::Code(0) {
                let sig = build_failure(&run);
                let mut out = self.finish(
                    ctx,
                    &commit,
                    started,
                    sig,
                    Some(&run),
                    log.clone(),
                    log,
                    0,
                    target,
                );
                out.interrupted = run.interrupted;
                return out;
            }
            build_log = log;
        }
        phase(reporter, Phase::Repro);
        let repro = &self.config.repro;
        let mut attempt = 1;
        let (mut infra_retried, mut clean_runs) = (0, 0);
        loop {
            let step = Step {
                command: &repro.command,
                timeout: repro.timeout,
                env: &repro.env,
            };
            let spec = command_spec(
                self.config,
                self.worktree.path(),
                step,
                &commit,
                StepPhase::Repro,
                attempt,
            );
            let run = match process::run(&spec, self.cancel) {
                Ok(run) => run,
                Err(e) => {
                    let sig =
                        Signature::new(FaultClass::Other, format!("repro could not start: {e}"));
                    return self.finish(
                        ctx, &commit, started, sig, None, build_log, None, attempt, target,
                    );
                }
            };
            let name = if attempt == 1 {
                "repro".to_string()
            } else {
                format!("repro-{attempt}")
            };
            let log = self.write_log(ctx.step, &commit, &name, &run);
            let sig = classify(run.exit, &run.output);
            if sig.class == FaultClass::Infra
                && infra_retried < repro.infra_retries
                && !run.interrupted
            {
                infra_retried += 1;
                attempt += 1;
                continue;
            }
            // A clean run of a flaky fault proves little: run again, up to `attempts` clean runs.
            if sig.class == FaultClass::None && clean_runs + 1 < repro.attempts && !run.interrupted
            {
                clean_runs += 1;
                attempt += 1;
                continue;
            }
            let mut out = self.finish(
                ctx,
                &commit,
                started,
                sig,
                Some(&run),
                build_log,
                log,
                attempt,
                target,
            );
            out.interrupted = run.interrupted;
            return out;
        }
    }

    #[expect(clippy::too_many_arguments, reason = "one place builds every record")]
    fn finish(
        &self,
        ctx: &ProbeContext,
        commit: &str,
        started: Instant,
        signature: Signature,
        run: Option<&RunOutput>,
        build_log: Option<String>,
        log: Option<String>,
        attempts: u32,
        target: Option<&Signature>,
    ) -> ProbeOutcome {
        let output = run.map(|r| r.output.clone()).unwrap_or_default();
        let matched_target =
            target.is_some_and(|t| self.config.match_policy.matches(t, &signature, &output));
        let (verdict, reason) = verdict(&signature, target, matched_target);
        let (exit_code, signal) = match run.map(|r| r.exit) {
            Some(Exit::Code(c)) => (Some(c), None),
            Some(Exit::Signal(s)) => (None, Some(s)),
            _ => (None, None),
        };
        ProbeOutcome {
            record: ProbeRecord {
                commit: commit.to_string(),
                role: ctx.role,
                verdict,
                outcome: signature.class.as_str().to_string(),
                signature,
                matched_target,
                reason,
                exit_code,
                signal,
                duration_s: started.elapsed().as_secs_f64(),
                build_log,
                log,
                attempts,
            },
            output,
            interrupted: false,
        }
    }

    /// Checks out and builds `oid` for a stage after the search (triage, shrink, the parent check), so
    /// those stages never run a binary left over from another probe. `Err` says what went wrong.
    pub fn prepare(&self, oid: Oid, name: &str) -> Result<(), String> {
        let clean = self.config.build.as_ref().is_some_and(|b| b.clean);
        self.worktree
            .checkout(oid, clean)
            .map_err(|e| format!("checkout of {oid} failed: {e}"))?;
        let commit = oid.to_string();
        let Some(built) = self.build(&commit, 0, &format!("{name}-build")) else {
            return Ok(());
        };
        let (run, log) = built?;
        if run.exit != Exit::Code(0) {
            return Err(format!(
                "build of {} failed ({})",
                &commit[..12],
                log.unwrap_or_else(|| "no log".into())
            ));
        }
        Ok(())
    }

    /// Runs the configured build in the worktree and logs it; `None` when there is no build step, `Err`
    /// when it could not start.
    fn build(
        &self,
        commit: &str,
        step_no: usize,
        log_name: &str,
    ) -> Option<Result<(RunOutput, Option<String>), String>> {
        let build = self.config.build.as_ref()?;
        let step = Step {
            command: &build.command,
            timeout: build.timeout,
            env: &build.env,
        };
        let spec = command_spec(
            self.config,
            self.worktree.path(),
            step,
            commit,
            StepPhase::Build,
            1,
        );
        Some(match process::run(&spec, self.cancel) {
            Ok(run) => {
                let log = self.write_log(step_no, commit, log_name, &run);
                Ok((run, log))
            }
            Err(e) => Err(format!("build could not start: {e}")),
        })
    }

    fn write_log(&self, step: usize, commit: &str, name: &str, run: &RunOutput) -> Option<String> {
        let path = self.log_dir.join(format!(
            "{step:03}-{}-{name}.log",
            &commit[..commit.len().min(12)]
        ));
        let trailer = match run.exit {
            Exit::Code(c) => format!("exit={c}"),
            Exit::Signal(s) => format!("signal={s}"),
            Exit::Timeout => "timeout".to_string(),
            Exit::Unknown => "unknown".to_string(),
        };
        let text = format!(
            "{}\n[cudabisect] {trailer} after {:.2}s\n",
            run.output.trim_end(),
            run.duration.as_secs_f64()
        );
        std::fs::write(&path, text).ok()?;
        Some(path.display().to_string())
    }
}

/// Builds the command spec every phase uses: the user's env, then cudabisect's contract variables.
/// One command of a phase, as the config gives it.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    /// What to run.
    pub command: &'a CommandLine,
    /// Time allowed.
    pub timeout: std::time::Duration,
    /// Extra environment variables.
    pub env: &'a std::collections::BTreeMap<String, String>,
}

/// Which phase a command belongs to; GPU phases get synchronous launches.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    /// Building the commit.
    Build,
    /// Running the repro.
    Repro,
    /// Running the repro under compute-sanitizer.
    Triage,
}

impl StepPhase {
    fn as_str(self) -> &'static str {
        match self {
            Self::Build => "build",
            Self::Repro => "repro",
            Self::Triage => "triage",
        }
    }
}

/// Builds the command spec every phase uses: the user's env, then cudabisect's contract variables.
pub fn command_spec(
    config: &Config,
    worktree: &Path,
    step: Step,
    commit: &str,
    phase: StepPhase,
    attempt: u32,
) -> CommandSpec {
    let Step {
        command,
        timeout,
        env,
    } = step;
    let gpu = phase != StepPhase::Build;
    let phase = phase.as_str();
    let mut vars: Vec<(String, String)> = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if gpu {
        let blocking = if config.repro.launch_blocking {
            "1"
        } else {
            "0"
        };
        vars.push(("CUDA_LAUNCH_BLOCKING".into(), blocking.into()));
    }
    vars.push(("CUDABISECT_COMMIT".into(), commit.to_string()));
    vars.push(("CUDABISECT_WORKTREE".into(), worktree.display().to_string()));
    vars.push(("CUDABISECT_PHASE".into(), phase.to_string()));
    vars.push(("CUDABISECT_ATTEMPT".into(), attempt.to_string()));
    CommandSpec {
        command: command.clone(),
        cwd: worktree.to_path_buf(),
        env: vars,
        timeout,
        grace: config.repro.grace_period,
    }
}

fn build_failure(run: &RunOutput) -> Signature {
    let what = match run.exit {
        Exit::Timeout => "build timed out".to_string(),
        Exit::Signal(s) => format!("build killed by signal {s}"),
        Exit::Code(c) => format!("build exited {c}"),
        Exit::Unknown => "build failed".to_string(),
    };
    let last = run
        .output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    Signature::new(
        FaultClass::BuildFailure,
        if last.is_empty() {
            what
        } else {
            format!("{what}: {last}")
        },
    )
}

/// Maps a signature to a verdict. Only the target bug is bad and only a clean run is good; anything else
/// (build break, hang, another bug, infrastructure) is a skip with its reason.
fn verdict(
    sig: &Signature,
    target: Option<&Signature>,
    matched: bool,
) -> (ProbeVerdict, Option<String>) {
    match (sig.class, target) {
        (FaultClass::None, _) => (ProbeVerdict::Good, None),
        (FaultClass::BuildFailure | FaultClass::Infra, None) => (
            ProbeVerdict::Skip,
            Some(format!("{}: {}", sig.class, sig.summary)),
        ),
        (_, None) => (ProbeVerdict::Bad, None),
        _ if matched => (ProbeVerdict::Bad, None),
        (FaultClass::BuildFailure, _) => (
            ProbeVerdict::Skip,
            Some(format!("build failure: {}", sig.summary)),
        ),
        (FaultClass::Hang, _) => (
            ProbeVerdict::Skip,
            Some("hang: ran past its timeout".into()),
        ),
        (FaultClass::Infra, _) => (
            ProbeVerdict::Skip,
            Some(format!("infrastructure: {}", sig.summary)),
        ),
        (_, Some(t)) => (
            ProbeVerdict::Skip,
            Some(format!(
                "different failure: {} (target is {})",
                sig.short(),
                t.short()
            )),
        ),
    }
}
