//! Drives a shrink through the harness protocol: describes the graph, locates the faulting node with one
//! recorded synchronous run, feeds the reduction state machine candidate by candidate (judged by the
//! same-signature oracle), confirms the result, and extracts the minimal model.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::classify::{classify, FaultClass, MatchPolicy, Signature};
use crate::config::{CommandLine, Config, ShrinkSection};
use crate::events::{Event, Reporter};
use crate::process::{self, CommandSpec, RunOutput};
use crate::shrink::{Reducer, Reduction, Step};

/// A node as the harness describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct GraphNode {
    pub id: String,
    pub op: String,
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default)]
    pub inputs: Vec<GraphTensor>,
    #[serde(default)]
    pub outputs: Vec<GraphTensor>,
}

/// A tensor as the harness describes it.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct GraphTensor {
    pub name: String,
    #[serde(default)]
    pub shape: Vec<u64>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub producer: Option<String>,
}

#[derive(Deserialize)]
struct Description {
    nodes: Vec<GraphNode>,
}

/// How a shrink ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShrinkStatus {
    /// A minimal subgraph was found.
    Minimal,
    /// The full model did not fail the expected way under the harness.
    NotReproduced,
    /// The harness could not describe or run the model.
    Failed,
    Interrupted,
}

/// A candidate that failed, but differently: rejected, and kept on record.
#[derive(Clone, Debug, Serialize)]
pub struct Rejected {
    pub nodes: usize,
    pub class: FaultClass,
    pub summary: String,
}

/// The final check.
#[derive(Clone, Debug, Serialize)]
pub struct Confirmation {
    pub runs: u32,
    pub reproduced: u32,
}

/// Everything a shrink found, for the report and the bundle.
#[derive(Clone, Debug, Serialize)]
pub struct ShrinkReport {
    pub status: ShrinkStatus,
    pub summary: String,
    pub signature: Option<Signature>,
    pub located_node: Option<String>,
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// The minimal subgraph, in execution order.
    pub kept: Vec<GraphNode>,
    /// Ids of the nodes cut.
    pub removed: Vec<String>,
    /// Harness runs to reach the minimal subgraph: the locating run and every candidate run.
    pub runs_to_minimal: usize,
    /// All harness runs, the final check included (describe and extract not counted).
    pub harness_runs: usize,
    /// Distinct candidates tried by the reducer.
    pub candidates: usize,
    pub rejected: Vec<Rejected>,
    pub confirmation: Option<Confirmation>,
    /// The minimal subgraph at the first bad commit's parent: "passed", "reproduced", or why not run.
    pub parent_check: Option<String>,
    pub duration_s: f64,
    /// Where the recording, the minimal model and the logs are.
    pub out_dir: String,
    /// The standalone minimal model, when the harness can extract one.
    pub minimal_model: Option<String>,
    /// One line that reproduces the minimal subgraph.
    pub reproduce: Option<String>,
}

/// The PyTorch harness shipped with cudabisect.
pub const TORCH_HARNESS: &str = include_str!("../harness/torch_harness.py");

/// Writes the PyTorch harness where it can be run (once per content) and returns its path. The user needs
/// nothing beyond their own torch.
pub fn torch_harness_path() -> String {
    let dir = std::env::temp_dir().join(format!(
        "cudabisect-{}-{}",
        env!("CARGO_PKG_VERSION"),
        unsafe { libc::getuid() }
    ));
    let path = dir.join(format!(
        "torch_harness_{:08x}.py",
        fnv(TORCH_HARNESS.as_bytes())
    ));
    if std::fs::read_to_string(&path).ok().as_deref() != Some(TORCH_HARNESS) {
        let _ = std::fs::create_dir_all(&dir);
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        if std::fs::write(&tmp, TORCH_HARNESS).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    path.display().to_string()
}

fn fnv(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// A harness speaking the protocol, run in one directory.
pub struct Harness {
    prefix: CommandLine,
    /// The native harness: its backend, for the reproduce line.
    native: Option<String>,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    timeout: std::time::Duration,
    grace: std::time::Duration,
}

fn quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+".contains(c))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

impl Harness {
    /// The configured harness, run in `cwd` (the probe worktree, or the user's checkout).
    pub fn from_config(
        config: &Config,
        shrink: &ShrinkSection,
        cwd: &Path,
        commit: &str,
    ) -> Harness {
        let (prefix, native) = match (&shrink.harness, &shrink.model, &shrink.inputs) {
            (Some(h), _, _) => (h.clone(), None),
            (None, Some(model), Some(inputs)) => (
                CommandLine::Argv(vec![
                    shrink.python.clone(),
                    torch_harness_path(),
                    "--model".into(),
                    model.clone(),
                    "--inputs".into(),
                    inputs.clone(),
                    "--device".into(),
                    shrink.device.clone(),
                ]),
                None,
            ),
            (None, model, _) => {
                let exe = std::env::current_exe()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "cudabisect".into());
                let model = model.clone().unwrap_or_default();
                (
                    CommandLine::Argv(vec![
                        exe,
                        "harness".into(),
                        "--model".into(),
                        model,
                        "--backend".into(),
                        shrink.backend.clone(),
                    ]),
                    Some(shrink.backend.clone()),
                )
            }
        };
        let mut env: Vec<(String, String)> = shrink
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        env.push((
            "CUDA_LAUNCH_BLOCKING".into(),
            if config.repro.launch_blocking {
                "1"
            } else {
                "0"
            }
            .into(),
        ));
        env.push(("CUDABISECT_COMMIT".into(), commit.into()));
        env.push(("CUDABISECT_PHASE".into(), "shrink".into()));
        Harness {
            prefix,
            native,
            cwd: cwd.to_path_buf(),
            env,
            timeout: shrink.timeout,
            grace: config.repro.grace_period,
        }
    }

    /// Moves the harness to another directory (the parent commit's worktree, for example).
    pub fn in_dir(mut self, cwd: &Path) -> Harness {
        self.cwd = cwd.to_path_buf();
        self
    }

    fn command(&self, args: &[String]) -> CommandLine {
        match &self.prefix {
            CommandLine::Argv(v) => CommandLine::Argv(v.iter().chain(args).cloned().collect()),
            CommandLine::Shell(s) => {
                let tail: Vec<String> = args.iter().map(|a| quote(a)).collect();
                CommandLine::Shell(format!("{s} {}", tail.join(" ")))
            }
        }
    }

    fn exec(&self, args: &[String], cancel: &AtomicBool) -> Result<RunOutput, String> {
        let spec = CommandSpec {
            command: self.command(args),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            timeout: self.timeout,
            grace: self.grace,
        };
        process::run(&spec, cancel).map_err(|e| format!("{}: {e}", spec.command.display()))
    }

    /// `describe`: the graph, in execution order.
    pub fn describe(&self, cancel: &AtomicBool) -> Result<Vec<GraphNode>, String> {
        let run = self.exec(&["describe".into()], cancel)?;
        let text = &run.output;
        let start = text
            .find('{')
            .ok_or_else(|| format!("describe printed no JSON: {}", last_line(text)))?;
        let end = text.rfind('}').map_or(text.len(), |i| i + 1);
        let d: Description = serde_json::from_str(&text[start..end])
            .map_err(|e| format!("describe printed bad JSON: {e}"))?;
        if d.nodes.is_empty() {
            return Err("describe lists no nodes".into());
        }
        Ok(d.nodes)
    }

    /// `run`: the whole model, or the kept nodes on recorded inputs.
    pub fn run(
        &self,
        keep: Option<&[String]>,
        inputs: Option<&Path>,
        record: Option<&Path>,
        cancel: &AtomicBool,
    ) -> Result<RunOutput, String> {
        let mut args = vec!["run".to_string()];
        if let Some(k) = keep {
            args.extend(["--keep".into(), k.join(",")]);
        }
        if let Some(i) = inputs {
            args.extend(["--inputs".into(), i.display().to_string()]);
        }
        if let Some(r) = record {
            args.extend(["--record".into(), r.display().to_string()]);
        }
        self.exec(&args, cancel)
    }

    /// `extract`: the kept nodes as a standalone model in `out`.
    pub fn extract(
        &self,
        keep: &[String],
        inputs: &Path,
        out: &Path,
        cancel: &AtomicBool,
    ) -> Result<(), String> {
        let args = vec![
            "extract".into(),
            "--keep".into(),
            keep.join(","),
            "--inputs".into(),
            inputs.display().to_string(),
            "--out".into(),
            out.display().to_string(),
        ];
        let run = self.exec(&args, cancel)?;
        match run.exit {
            crate::classify::Exit::Code(0) => Ok(()),
            _ => Err(format!("extract failed: {}", last_line(&run.output))),
        }
    }

    /// The line a maintainer runs, from the directory holding the minimal model.
    pub fn reproduce_line(
        &self,
        minimal_model: Option<&Path>,
        keep: &[String],
        inputs: &Path,
    ) -> String {
        if let Some(py) = minimal_model.filter(|m| m.extension().is_some_and(|e| e == "py")) {
            return format!(
                "CUDA_LAUNCH_BLOCKING=1 python {}",
                quote(&py.display().to_string())
            );
        }
        match (&self.native, minimal_model) {
            (Some(backend), Some(m)) => {
                let backend = if backend == "auto" { "cuda" } else { backend };
                format!(
                    "CUDA_LAUNCH_BLOCKING=1 cudabisect harness run {} --backend {backend}",
                    quote(&m.display().to_string())
                )
            }
            _ => {
                let cmd = self.command(&[
                    "run".into(),
                    "--keep".into(),
                    keep.join(","),
                    "--inputs".into(),
                    inputs.display().to_string(),
                ]);
                format!("CUDA_LAUNCH_BLOCKING=1 {}", cmd.display())
            }
        }
    }
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Fills in shapes and types the description lacked (a harness that only learns them by running, like
/// the PyTorch one) from the recording's `shapes.json`, when there is one.
fn with_recorded_shapes(mut nodes: Vec<GraphNode>, record: &Path) -> Vec<GraphNode> {
    #[derive(Deserialize)]
    struct Recorded {
        shape: Vec<u64>,
        dtype: Option<String>,
    }
    let Ok(text) = std::fs::read_to_string(record.join("shapes.json")) else {
        return nodes;
    };
    let Ok(shapes) = serde_json::from_str::<std::collections::HashMap<String, Recorded>>(&text)
    else {
        return nodes;
    };
    for t in nodes
        .iter_mut()
        .flat_map(|n| n.inputs.iter_mut().chain(n.outputs.iter_mut()))
    {
        if let Some(r) = shapes.get(&t.name).filter(|_| t.shape.is_empty()) {
            t.shape = r.shape.clone();
            t.dtype = t.dtype.take().or_else(|| r.dtype.clone());
        }
    }
    nodes
}

/// Node ids of a candidate.
fn ids(nodes: &[GraphNode], picks: &[usize]) -> Vec<String> {
    picks.iter().map(|&i| nodes[i].id.clone()).collect()
}

/// The node whose `begin` marker has no `end`: where the run died. (The classifier's site may name a source
/// line instead, for a device-side assert, so the markers are read directly.)
fn open_node(output: &str) -> Option<String> {
    let mut open = None;
    for line in output.lines() {
        let Some(rest) = line.trim_end().strip_prefix("@@cudabisect node=") else {
            continue;
        };
        let node = rest.split_whitespace().next().unwrap_or("");
        if rest.ends_with(" begin") {
            open = Some(node.to_string());
        } else if rest.ends_with(" end") {
            open = None;
        }
    }
    open
}

/// Runs a candidate up to `attempts` times; true as soon as one run fails the target's way.
struct Oracle<'a> {
    harness: &'a Harness,
    policy: &'a MatchPolicy,
    target: Signature,
    attempts: u32,
    runs: usize,
    rejected: Vec<Rejected>,
    log_dir: PathBuf,
}

impl Oracle<'_> {
    fn judge(
        &mut self,
        keep: &[String],
        inputs: &Path,
        cancel: &AtomicBool,
    ) -> Result<bool, String> {
        for _ in 0..self.attempts {
            let run = self.harness.run(Some(keep), Some(inputs), None, cancel)?;
            self.runs += 1;
            let _ = std::fs::write(
                self.log_dir.join(format!("run-{:04}.log", self.runs)),
                &run.output,
            );
            let sig = classify(run.exit, &run.output);
            if self.policy.matches(&self.target, &sig, &run.output) {
                return Ok(true);
            }
            if sig.class != FaultClass::None {
                // A different failure is not a success: record it and go on.
                self.rejected.push(Rejected {
                    nodes: keep.len(),
                    class: sig.class,
                    summary: sig.summary.clone(),
                });
            }
            if cancel.load(Ordering::SeqCst) {
                break;
            }
        }
        Ok(false)
    }
}

/// What a shrink needs to know.
pub struct ShrinkContext<'a> {
    pub config: &'a Config,
    pub shrink: &'a ShrinkSection,
    /// Where the harness runs: the commit's worktree, built.
    pub cwd: &'a Path,
    /// Where the recording, logs and minimal model go.
    pub out_dir: PathBuf,
    pub commit: String,
    /// The fault to keep (from the bisection); `None`: whatever the harness's full run shows.
    pub target: Option<Signature>,
}

/// Shrinks the model at one commit. Never fails outright: problems are in the report's status.
pub fn shrink(
    ctx: &ShrinkContext,
    reporter: &mut dyn Reporter,
    cancel: &AtomicBool,
) -> ShrinkReport {
    let started = Instant::now();
    let harness = Harness::from_config(ctx.config, ctx.shrink, ctx.cwd, &ctx.commit);
    let mut report = ShrinkReport {
        status: ShrinkStatus::Failed,
        summary: String::new(),
        signature: None,
        located_node: None,
        nodes_before: 0,
        nodes_after: 0,
        kept: vec![],
        removed: vec![],
        runs_to_minimal: 0,
        harness_runs: 0,
        candidates: 0,
        rejected: vec![],
        confirmation: None,
        parent_check: None,
        duration_s: 0.0,
        out_dir: ctx.out_dir.display().to_string(),
        minimal_model: None,
        reproduce: None,
    };
    let finish = |mut r: ShrinkReport,
                  status: ShrinkStatus,
                  summary: String,
                  reporter: &mut dyn Reporter| {
        r.status = status;
        r.summary = summary;
        r.duration_s = started.elapsed().as_secs_f64();
        reporter.event(&Event::ShrinkFinished {
            summary: r.summary.clone(),
        });
        r
    };
    let record = ctx.out_dir.join("record");
    let log_dir = ctx.out_dir.join("logs");
    if let Err(e) = std::fs::create_dir_all(&log_dir) {
        return finish(
            report,
            ShrinkStatus::Failed,
            format!("cannot create {}: {e}", log_dir.display()),
            reporter,
        );
    }
    let nodes = match harness.describe(cancel) {
        Ok(n) => n,
        Err(e) => {
            return finish(
                report,
                ShrinkStatus::Failed,
                format!("harness describe: {e}"),
                reporter,
            )
        }
    };
    report.nodes_before = nodes.len();
    reporter.event(&Event::ShrinkStarted { nodes: nodes.len() });

    // One recorded, synchronous run: where does it fault, and with what?
    let mut locate = None;
    for _ in 0..ctx.shrink.attempts {
        let run = match harness.run(None, None, Some(&record), cancel) {
            Ok(r) => r,
            Err(e) => {
                return finish(
                    report,
                    ShrinkStatus::Failed,
                    format!("harness run: {e}"),
                    reporter,
                )
            }
        };
        report.harness_runs += 1;
        let _ = std::fs::write(log_dir.join("locate.log"), &run.output);
        let sig = classify(run.exit, &run.output);
        let same = match &ctx.target {
            Some(t) => ctx.config.match_policy.matches(t, &sig, &run.output),
            None => {
                sig.class.is_device_fault()
                    || sig.class != FaultClass::None && sig.class != FaultClass::Infra
            }
        };
        if same {
            locate = Some((sig, open_node(&run.output)));
            break;
        }
        if cancel.load(Ordering::SeqCst) {
            return finish(
                report,
                ShrinkStatus::Interrupted,
                "interrupted".into(),
                reporter,
            );
        }
        locate = None;
        report.signature = Some(sig);
    }
    let Some((target, blamed)) = locate else {
        let seen = report
            .signature
            .as_ref()
            .map_or("nothing".to_string(), |s| s.short());
        let want = ctx
            .target
            .as_ref()
            .map_or("a fault".to_string(), |t| t.short());
        return finish(
            report,
            ShrinkStatus::NotReproduced,
            format!("the harness's full run showed {seen}, not {want}"),
            reporter,
        );
    };
    report.signature = Some(target.clone());
    let Some(fault) = blamed.and_then(|id| nodes.iter().position(|n| n.id == id)) else {
        return finish(
            report,
            ShrinkStatus::Failed,
            format!(
                "the harness run failed ({}) but no node marker names where",
                target.short()
            ),
            reporter,
        );
    };
    let nodes = with_recorded_shapes(nodes, &record);
    report.located_node = Some(nodes[fault].id.clone());
    reporter.event(&Event::ShrinkLocated {
        node: nodes[fault].id.clone(),
        signature: target.short(),
    });

    let mut oracle = Oracle {
        harness: &harness,
        policy: &ctx.config.match_policy,
        target: target.clone(),
        attempts: ctx.shrink.attempts,
        runs: 0,
        rejected: vec![],
        log_dir: log_dir.clone(),
    };
    let mut reducer = Reducer::new(nodes.len(), fault);
    let result = loop {
        if cancel.load(Ordering::SeqCst) {
            report.harness_runs += oracle.runs;
            return finish(
                report,
                ShrinkStatus::Interrupted,
                "interrupted".into(),
                reporter,
            );
        }
        match reducer.next_step() {
            Step::Done(result) => break result,
            Step::Run(candidate) => {
                let stage = reducer.stage();
                let keep = ids(&nodes, &candidate);
                let fails = match oracle.judge(&keep, &record, cancel) {
                    Ok(f) => f,
                    Err(e) => {
                        report.harness_runs += oracle.runs;
                        return finish(
                            report,
                            ShrinkStatus::Failed,
                            format!("harness run: {e}"),
                            reporter,
                        );
                    }
                };
                reducer.mark(&candidate, fails);
                reporter.event(&Event::ShrinkCandidate {
                    run: reducer.runs(),
                    stage,
                    nodes: candidate.len(),
                    reproduced: fails,
                });
            }
        }
    };
    report.candidates = reducer.runs();
    report.runs_to_minimal = report.harness_runs + oracle.runs;
    let keep = ids(&nodes, &result);

    // The final check: the same signature on every one of N runs.
    let mut reproduced = 0;
    for _ in 0..ctx.shrink.confirm {
        let mut once = Oracle {
            attempts: 1,
            ..oracle_clone(&oracle)
        };
        if once.judge(&keep, &record, cancel).unwrap_or(false) {
            reproduced += 1;
        }
        oracle.runs += once.runs;
        oracle.rejected.extend(once.rejected);
    }
    report.confirmation = Some(Confirmation {
        runs: ctx.shrink.confirm,
        reproduced,
    });
    report.harness_runs += oracle.runs;
    report.rejected = oracle.rejected;
    report.kept = result.iter().map(|&i| nodes[i].clone()).collect();
    report.removed = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| !result.contains(i))
        .map(|(_, n)| n.id.clone())
        .collect();
    report.nodes_after = result.len();

    let minimal = ctx.out_dir.join("minimal");
    let extracted = harness.extract(&keep, &record, &minimal, cancel);
    // The native harness writes model.toml, the PyTorch harness repro.py.
    if extracted.is_ok() {
        report.minimal_model = ["model.toml", "repro.py"]
            .iter()
            .map(|f| minimal.join(f))
            .find(|p| p.is_file())
            .map(|p| p.display().to_string());
    }
    report.reproduce = Some(harness.reproduce_line(
        report.minimal_model.as_deref().map(Path::new),
        &keep,
        &record,
    ));
    let summary = format!(
        "{} of {} nodes ({}) still fail with {}; minimal after {} harness run{}; confirmed {reproduced}/{}",
        result.len(),
        nodes.len(),
        keep.join(", "),
        target.short(),
        report.runs_to_minimal,
        if report.runs_to_minimal == 1 { "" } else { "s" },
        ctx.shrink.confirm
    );
    finish(report, ShrinkStatus::Minimal, summary, reporter)
}

fn oracle_clone<'a>(o: &Oracle<'a>) -> Oracle<'a> {
    Oracle {
        harness: o.harness,
        policy: o.policy,
        target: o.target.clone(),
        attempts: o.attempts,
        runs: 0,
        rejected: vec![],
        log_dir: o.log_dir.clone(),
    }
}

/// Runs the minimal subgraph once more in another directory (the parent commit's worktree) and says
/// whether it passed there.
pub fn check_elsewhere(
    harness: &Harness,
    report: &ShrinkReport,
    policy: &MatchPolicy,
    cancel: &AtomicBool,
) -> String {
    let (Some(target), Some(record)) = (
        &report.signature,
        Some(Path::new(&report.out_dir).join("record")),
    ) else {
        return "not run: no signature".into();
    };
    let keep: Vec<String> = report.kept.iter().map(|n| n.id.clone()).collect();
    match harness.run(Some(&keep), Some(&record), None, cancel) {
        Err(e) => format!("not run: {e}"),
        Ok(run) => {
            let sig = classify(run.exit, &run.output);
            if policy.matches(target, &sig, &run.output) {
                "reproduced".into()
            } else if sig.class == FaultClass::None {
                "passed".into()
            } else {
                format!("failed differently: {}", sig.short())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: Vec<u64>) -> GraphTensor {
        GraphTensor {
            name: name.into(),
            shape,
            dtype: None,
            producer: None,
        }
    }

    #[test]
    fn recorded_shapes_fill_only_what_the_description_lacked() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = vec![GraphNode {
            id: "wpe".into(),
            op: "Embedding".into(),
            kernel: None,
            inputs: vec![tensor("pos", vec![]), tensor("known", vec![7])],
            outputs: vec![tensor("wpe", vec![])],
        }];
        assert_eq!(
            with_recorded_shapes(nodes.clone(), dir.path())[0].inputs[0].shape,
            Vec::<u64>::new()
        );
        std::fs::write(
            dir.path().join("shapes.json"),
            r#"{"pos": {"shape": [32], "dtype": "int64"}, "known": {"shape": [9], "dtype": "float32"}, "wpe": {"shape": [32, 128], "dtype": "float32"}}"#,
        )
        .unwrap();
        let filled = with_recorded_shapes(nodes, dir.path());
        assert_eq!(filled[0].inputs[0].shape, vec![32]);
        assert_eq!(filled[0].inputs[0].dtype.as_deref(), Some("int64"));
        assert_eq!(
            filled[0].inputs[1].shape,
            vec![7],
            "a described shape stays"
        );
        assert_eq!(filled[0].outputs[0].shape, vec![32, 128]);
    }

    #[test]
    fn the_open_marker_names_the_node_that_died() {
        let out = "@@cudabisect node=a op=x kernel=k begin\n@@cudabisect node=a op=x kernel=k end\n@@cudabisect node=b op=y kernel=k2 begin\nRuntimeError: CUDA error\n";
        assert_eq!(open_node(out).as_deref(), Some("b"));
        assert_eq!(
            open_node(
                "@@cudabisect node=a op=x kernel=k begin\n@@cudabisect node=a op=x kernel=k end\n"
            ),
            None
        );
    }
}
