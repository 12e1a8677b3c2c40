//! Captures the faulting training step from the user's own repro command (or `[shrink] step`), with no
//! factories and no change to their script: a first run finds the step, phase and module that faulted, a
//! replay with the same seeds saves that step (model, batch, optimizer, gradients) for the PyTorch harness
//! to run alone (`--capture DIR`).

use crate::exec::executor::Executor;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::{CommandLine, Config, ShrinkSection};
use crate::exec::child_env::{command_spec, ChildCommand, ChildContext, WorkerSlot};
use crate::exec::process;
use crate::protocol::torch::install_capture_hook;
pub use crate::report::record::CapturedFault;
use crate::report::record::{ShrinkReport, ShrinkStatus};
use crate::run::probe::warm::{Runner, WarmAt};

/// Why no step was captured: each says it in a maintainer's words.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A file of the capture could not be written or read.
    #[error("capture: {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The repro command could not be run.
    #[error("capture: the repro command could not run: {0}")]
    Process(#[from] process::ProcessError),
    /// The first run recorded no failure.
    #[error("capture: the repro run under capture recorded no failure ({0})")]
    NoFault(String),
    /// The replay did not save the step.
    #[error("capture: the replay of step {step} did not save it ({why})")]
    NotSaved {
        /// The step.
        step: u64,
        /// What was missing.
        why: String,
    },
}

/// The command a capture runs: the repro command, or a Python one-liner calling `[shrink] step`.
fn capture_command(config: &Config, section: &ShrinkSection) -> CommandLine {
    let Some(step) = &section.step else {
        return config.repro.command.clone();
    };
    let (module, function) = step.split_once(':').unwrap_or((step, "main"));
    let call = match (&section.model, &section.inputs) {
        (Some(model), Some(inputs)) => {
            let load = |spec: &str| {
                let (m, f) = spec.split_once(':').unwrap_or((spec, ""));
                format!("getattr(importlib.import_module({m:?}), {f:?})")
            };
            format!(
                "x = {}(); x = x if isinstance(x, (tuple, list)) else (x,); fn({}(), *x)",
                load(inputs),
                load(model)
            )
        }
        _ => "fn()".into(),
    };
    CommandLine::Argv(vec![
        section.python.clone(),
        "-c".into(),
        format!(
            "import importlib, sys; sys.path.insert(0, '.'); fn = getattr(importlib.import_module({module:?}), {function:?}); {call}"
        ),
    ])
}

/// Whether the replay saved what the harness needs for the captured framework.
fn check_saved(dir: &Path, fault: &CapturedFault) -> Result<(), CaptureError> {
    let needed: &[&str] = if fault.framework.as_deref() == Some("jax") {
        &["capture.json", "jax_call.pkl", JAX_CAPTURE_MODULE_FILE]
    } else {
        &["capture.json", "model.pt"]
    };
    match needed.iter().find(|n| !dir.join(n).is_file()) {
        Some(missing) => Err(CaptureError::NotSaved {
            step: fault.step,
            why: format!("no {missing}; see {}", dir.join("replay.log").display()),
        }),
        None => Ok(()),
    }
}

/// Runs the find and replay runs in `cwd` at `commit` (built there, on the worker `slot`'s device) and
/// returns the capture directory (in `run_dir`). Both runs are forked from `warm` (that worker's warm
/// interpreter, which arms the hook in its child) when it serves them: a training script's imports are
/// paid once per worker, not twice more here. A warm capture that saved nothing is run again in fresh
/// processes, the way the hook was written for, before it is given up.
pub fn capture(
    executor: &dyn Executor,
    config: &Config,
    section: &ShrinkSection,
    (cwd, commit, slot, warm): (&Path, &str, Option<&WorkerSlot>, Option<WarmAt>),
    run_dir: &Path,
    fault_rank: Option<u32>,
    cancel: &AtomicBool,
) -> Result<(PathBuf, CapturedFault), CaptureError> {
    let runs = Runs {
        executor,
        config,
        command: capture_command(config, section),
        at: (cwd, commit, slot),
        fault_rank,
        cancel,
        forked: Cell::new(false),
    };
    let Some(warm) = warm else {
        return find_and_replay(&runs, None, run_dir);
    };
    match find_and_replay(&runs, Some(warm), run_dir) {
        // A library that bound a framework's function before the hook armed (the warm interpreter
        // imported it first) hides calls from it: the fresh runs arm it before any import.
        Err(e @ (CaptureError::NoFault(_) | CaptureError::NotSaved { .. }))
            if runs.forked.get() && !cancel.load(Ordering::SeqCst) =>
        {
            find_and_replay(&runs, None, run_dir).map(|(dir, mut fault)| {
                fault.runs = Some(format!("cold after warm: {e}"));
                (dir, fault)
            })
        }
        other => other,
    }
}

/// What every run of one capture shares: the command, where it runs, and who stops it.
struct Runs<'a> {
    executor: &'a dyn Executor,
    config: &'a Config,
    command: CommandLine,
    at: (&'a Path, &'a str, Option<&'a WorkerSlot>),
    fault_rank: Option<u32>,
    cancel: &'a AtomicBool,
    /// Whether a run was forked from the warm interpreter (one it could not serve ran cold).
    forked: Cell<bool>,
}

impl Runs<'_> {
    /// One run of the command under the hook in `hook` with `extra` variables, forked from `warm` when it
    /// serves it: its output (kept in `dir/log`, headed by how it ran) and how it ran.
    fn run(
        &self,
        (hook, dir): (&Path, &Path),
        warm: Option<WarmAt>,
        extra: &[(&str, String)],
        log: &str,
    ) -> Result<(String, String), CaptureError> {
        let (cwd, commit, slot) = self.at;
        let mut env: BTreeMap<String, String> = self.config.repro.env.clone();
        env.insert("CUDABISECT_CAPTURE_DIR".into(), dir.display().to_string());
        // A warm child loads the hook from here; a fresh interpreter finds it on PYTHONPATH (below).
        env.insert("CUDABISECT_CAPTURE_HOOK".into(), hook.display().to_string());
        if let Some(rank) = self.fault_rank {
            // Of several ranks, the one that faulted captures.
            env.insert("CUDABISECT_FAULT_RANK".into(), rank.to_string());
        }
        for (k, v) in extra {
            env.insert((*k).into(), v.clone());
        }
        // As the worker's own probes ran: its device, and its kernel and graph caches, which its probe
        // of this code has already filled (the training script is run twice more here).
        let ctx = ChildContext {
            slot,
            ..ChildContext::shrink(cwd, commit)
        };
        let spec_of = |env: &BTreeMap<String, String>| {
            command_spec(
                self.config,
                ChildCommand {
                    command: &self.command,
                    timeout: self.config.repro.timeout,
                    env,
                },
                &ctx,
            )
        };
        let mut spec = spec_of(&env);
        // The variables above are per-run ones: the warm interpreter the worker's probes ran in serves it.
        let forked = warm.and_then(|(pool, slot)| {
            pool.prepare(slot, &mut spec, self.cancel)
                .map(|run| (pool, run))
        });
        if forked.is_none() {
            prepend_pythonpath(&mut env, hook);
            // Both runs hash strings alike (a warm interpreter's children share its seed).
            env.insert("PYTHONHASHSEED".into(), "0".into());
            spec = spec_of(&env);
        }
        let out = self.executor.session().run(&spec, self.cancel);
        let runner = forked.map(|(pool, run)| pool.finish(run));
        self.forked
            .set(self.forked.get() || runner == Some(Runner::Warm));
        let how = runner.map_or_else(|| "cold".to_string(), |r| r.describe());
        let out = out?;
        let _ = std::fs::write(
            dir.join(log),
            format!("# cudabisect: this run was {how}\n{}", out.output),
        );
        Ok((out.output, how))
    }
}

/// The find run, then the replay of the step it found, forked from `warm` when it serves them.
fn find_and_replay(
    runs: &Runs,
    warm: Option<WarmAt>,
    run_dir: &Path,
) -> Result<(PathBuf, CapturedFault), CaptureError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CaptureError::Io { path, source }
    };
    let hook = install_capture_hook(run_dir).map_err(io(run_dir))?;
    let dir = run_dir.join("capture");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let places = (hook.as_path(), dir.as_path());
    let find = [("CUDABISECT_CAPTURE", "find".to_string())];
    let (output, _) = runs.run(places, warm, &find, "find.log")?;
    let fault =
        read_fault(&dir).ok_or_else(|| CaptureError::NoFault(why_nothing(&dir, &output)))?;
    // The first run's account is the one the report gives; the replay writes its own over it.
    let found = dir.join("fault-found.json");
    let _ = std::fs::copy(dir.join("fault.json"), &found);
    let replay = [
        ("CUDABISECT_CAPTURE", "replay".to_string()),
        ("CUDABISECT_CAPTURE_STEP", fault.step.to_string()),
        ("CUDABISECT_CAPTURE_CALL", fault.call.to_string()),
    ];
    let (_, how) = runs.run(places, warm, &replay, "replay.log")?;
    let _ = std::fs::copy(&found, dir.join("fault.json"));
    check_saved(&dir, &fault)?;
    let mut fault = fault;
    fault.notes = read_notes(&dir);
    fault.runs = Some(how);
    Ok((dir, fault))
}

/// Why a run under the capture recorded no failure, from the marks its Python processes left: a repro
/// that started no Python program (a shell script around a native one) or none that imported a framework
/// cannot be captured, whatever its output says.
fn why_nothing(dir: &Path, output: &str) -> String {
    let last = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map_or("it printed nothing".into(), |l| {
            format!("its last line: {}", l.trim())
        });
    let started = |what: &str| dir.join(format!("started-{what}")).exists();
    if !started("python") {
        format!(
            "no Python program ran under it (the repro command started none, or ran Python isolated from PYTHONPATH): only a native model (`[shrink] model`) or a harness can shrink such a repro; {last}"
        )
    } else if !started("torch") && !started("jax") {
        format!("its Python program imported neither torch nor JAX; {last}")
    } else {
        last
    }
}

/// The module a JAX capture writes: `function` and `inputs` for the JAX harness.
pub const JAX_CAPTURE_MODULE_FILE: &str = "cudabisect_jax_capture.py";

/// The `[shrink]` section the JAX harness runs a captured jitted call under: its `function` and
/// `inputs` from the module the capture wrote in `dir`, which goes first on `PYTHONPATH` (before the
/// section's own, else the repro's: `repro_env`).
pub fn jax_section(
    section: &ShrinkSection,
    dir: &Path,
    repro_env: &BTreeMap<String, String>,
) -> ShrinkSection {
    let mut jax = section.clone();
    jax.framework = crate::config::ShrinkFramework::Jax;
    jax.capture = false;
    jax.model = None;
    jax.step = None;
    jax.train = None;
    jax.function = Some("cudabisect_jax_capture:function".into());
    jax.inputs = Some("cudabisect_jax_capture:inputs".into());
    if !jax.env.contains_key("PYTHONPATH") {
        if let Some(path) = repro_env.get("PYTHONPATH") {
            jax.env.insert("PYTHONPATH".into(), path.clone());
        }
    }
    prepend_pythonpath(&mut jax.env, dir);
    jax
}

/// Puts `dir` first on the `PYTHONPATH` of `env` (which, when it names none, inherits this process's).
fn prepend_pythonpath(env: &mut BTreeMap<String, String>, dir: &Path) {
    let inherited = env
        .get("PYTHONPATH")
        .cloned()
        .or_else(|| std::env::var("PYTHONPATH").ok())
        .filter(|p| !p.is_empty());
    let path = match inherited {
        Some(p) => format!("{}:{p}", dir.display()),
        None => dir.display().to_string(),
    };
    env.insert("PYTHONPATH".into(), path);
}

/// Puts what the capture noticed about the step (a compiled model run eagerly, autocast) into the
/// summary of a shrink whose harness did not reproduce the fault: the likeliest reason.
pub fn explain(report: &mut ShrinkReport) {
    let Some(notes) = report.captured.as_ref().map(|c| c.notes.clone()) else {
        return;
    };
    if report.status == ShrinkStatus::NotReproduced && !notes.is_empty() {
        report.summary = format!(
            "{} (the captured step: {})",
            report.summary,
            notes.join("; ")
        );
    }
}

fn read_fault(dir: &Path) -> Option<CapturedFault> {
    let text = std::fs::read(dir.join("fault.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

fn read_notes(dir: &Path) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Saved {
        #[serde(default)]
        notes: Vec<String>,
    }
    std::fs::read(dir.join("capture.json"))
        .ok()
        .and_then(|t| serde_json::from_slice::<Saved>(&t).ok())
        .map_or_else(Vec::new, |s| s.notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forward_line_is_the_last_frame_of_the_users_code() {
        let fault = CapturedFault {
            step: 3,
            phase: "backward".into(),
            call: 1,
            module: None,
            kernel: None,
            exception: None,
            notes: vec![],
            framework: None,
            function: None,
            runs: None,
            forward_trace: Some("Error detected in ScatterBackward. Traceback of forward call that caused the error:\n  File \"/w/train.py\", line 11, in <module>\n    out = model(idx)\n  File \"/h/capture-hook/sitecustomize.py\", line 192, in module_call\n  File \"/v/lib/python3.11/site-packages/torch/nn/modules/module.py\", line 1787, in _wrapped_call_impl\n  File \"/w/toy/model.py\", line 31, in forward\n    return Scatter.apply(self.weight, idx)\n".into()),
        };
        assert_eq!(fault.forward_line().as_deref(), Some("/w/toy/model.py:31"));
    }

    #[test]
    fn a_run_that_recorded_nothing_is_explained_by_the_marks_its_processes_left() {
        let dir = tempfile::tempdir().unwrap();
        let out = "RuntimeError: CUDA error: an illegal memory access was encountered\n";
        let why = why_nothing(dir.path(), out);
        assert!(why.starts_with("no Python program ran under it"), "{why}");
        assert!(why.ends_with(
            "its last line: RuntimeError: CUDA error: an illegal memory access was encountered"
        ));
        std::fs::write(dir.path().join("started-python"), "").unwrap();
        let why = why_nothing(dir.path(), out);
        assert!(
            why.starts_with("its Python program imported neither torch nor JAX"),
            "{why}"
        );
        std::fs::write(dir.path().join("started-torch"), "").unwrap();
        assert_eq!(why_nothing(dir.path(), ""), "it printed nothing");
    }
}
