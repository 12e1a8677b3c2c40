//! Runs a planned model node by node on one backend: the engine behind `harness run`, `build` and `describe`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::model::{Model, ModelError};
use super::tensor::{Data, Tensor};
use super::{cpu, cuda, kernels};
pub use crate::backend::BackendChoice;
use crate::marker::{Marker, MarkerPhase};
use crate::protocol::types::PROTOCOL_VERSION;

/// The backend `auto` resolves to on this machine (a concrete choice stays as it is).
pub fn resolve_backend(choice: BackendChoice) -> BackendChoice {
    match choice {
        BackendChoice::Auto if cuda::probe().is_ok() => BackendChoice::Cuda,
        BackendChoice::Auto => BackendChoice::Cpu,
        other => other,
    }
}

/// What to run and what to keep.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Which backend runs the nodes.
    pub backend: BackendChoice,
    /// Node ids to run (default: all).
    pub keep: Option<Vec<String>>,
    /// Write each node's output here as `<tensor>.npy`, plus `manifest.json`.
    pub record: Option<PathBuf>,
    /// Boundary tensors (made by nodes that are not kept) come from `<inputs>/<tensor>.npy`.
    pub inputs: Option<PathBuf>,
    /// The compiled-kernel cache (`None`: no cache).
    pub cache: Option<PathBuf>,
}

/// Why a run could not happen at all (as opposed to a run that faulted).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The model file is invalid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Bad options or missing recorded inputs.
    #[error("{0}")]
    Usage(String),
    /// No CUDA driver, device or NVRTC for `--backend cuda`.
    #[error("{0}")]
    Unavailable(String),
    /// A kernel source did not compile (NVRTC's log).
    #[error("{0}")]
    Compile(String),
    /// Reading or writing files, or a driver call outside a node, failed.
    #[error("{0}")]
    Io(String),
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    /// Every node ran and synchronised without a fault.
    Clean,
    /// A node faulted; the run stopped there.
    Fault {
        /// The node.
        node: String,
        /// What the backend reported.
        message: String,
    },
}

/// Where the time went, for the log and the benchmark.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// Driver initialisation and context creation.
    pub context_s: f64,
    /// Kernel compilation or cache loads.
    pub kernels_s: f64,
    /// Running the nodes.
    pub nodes_s: f64,
    /// The whole run.
    pub total_s: f64,
    /// Kernel sources loaded from the cache.
    pub cached_sources: usize,
    /// Kernel sources compiled.
    pub compiled_sources: usize,
}

/// The result of one harness run.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// The backend that ran (`cuda` or `cpu`).
    pub backend: String,
    /// Nodes started, the faulting one included.
    pub nodes_run: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// Where the time went.
    pub timings: Timings,
}

/// Where each tensor a subgraph reads comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "from", content = "node")]
pub enum Origin {
    /// A `[[tensor]]` declaration: built from its initialiser.
    Declared,
    /// Produced by a node that is not kept: read from the recording.
    Recorded(String),
}

/// The nodes a run executes, in order, and the tensors it must provide first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Node indices to run, in execution order.
    pub nodes: Vec<usize>,
    /// Where each tensor the kept nodes read but do not make comes from.
    pub loads: BTreeMap<String, Origin>,
}

/// Works out a subgraph: the kept nodes in execution order, and the tensors they read that no kept node
/// produces. Unknown ids are an error naming them.
pub fn plan(model: &Model, keep: Option<&[String]>) -> Result<Plan, HarnessError> {
    let kept: BTreeSet<usize> = match keep {
        None => (0..model.nodes.len()).collect(),
        Some(ids) => {
            let mut set = BTreeSet::new();
            for id in ids {
                let i = model.node_index(id).ok_or_else(|| {
                    HarnessError::Usage(format!(
                        "--keep: no node {id:?} in {}",
                        model.path.display()
                    ))
                })?;
                set.insert(i);
            }
            set
        }
    };
    let nodes: Vec<usize> = model
        .order
        .iter()
        .copied()
        .filter(|i| kept.contains(i))
        .collect();
    let mut made: BTreeSet<&str> = BTreeSet::new();
    let mut loads = BTreeMap::new();
    for &i in &nodes {
        let node = &model.nodes[i];
        for input in &node.inputs {
            if made.contains(input.as_str()) || loads.contains_key(input) {
                continue;
            }
            let origin = match model.info[input].producer {
                None => Origin::Declared,
                Some(p) => Origin::Recorded(model.nodes[p].id.clone()),
            };
            loads.insert(input.clone(), origin);
        }
        made.extend(node.outputs.iter().map(String::as_str));
    }
    Ok(Plan { nodes, loads })
}

enum Engine {
    Cpu(HashMap<String, Tensor>),
    Cuda(Box<cuda::CudaBackend>),
}

impl Engine {
    fn put(&mut self, name: &str, t: Tensor) -> Result<(), HarnessError> {
        match self {
            Engine::Cpu(m) => {
                m.insert(name.to_string(), t);
                Ok(())
            }
            Engine::Cuda(b) => b.put(name, &t).map_err(|e| HarnessError::Io(e.to_string())),
        }
    }

    fn get(&self, name: &str) -> Result<Tensor, HarnessError> {
        match self {
            Engine::Cpu(m) => m
                .get(name)
                .cloned()
                .ok_or_else(|| HarnessError::Io(format!("tensor {name} was not computed"))),
            Engine::Cuda(b) => b.get(name).map_err(|e| HarnessError::Io(e.to_string())),
        }
    }

    fn run(&mut self, model: &Model, i: usize) -> Result<(), String> {
        let node = &model.nodes[i];
        match self {
            Engine::Cpu(m) => {
                let inputs: Vec<&Tensor> = node.inputs.iter().map(|t| &m[t]).collect();
                let out = cpu::exec(node, &inputs, &node.inputs).map_err(|f| f.message(node))?;
                let name = if node.inplace {
                    &node.inputs[0]
                } else {
                    &node.outputs[0]
                };
                m.insert(name.clone(), out);
                Ok(())
            }
            Engine::Cuda(b) => {
                let out = node
                    .outputs
                    .first()
                    .map(|o| (model.info[o].shape.as_slice(), model.info[o].dtype));
                b.run(node, out)
            }
        }
    }
}

/// Picks and starts the backend, saying which one and why on `out`.
fn start_engine(
    model: &Model,
    plan: &Plan,
    opts: &RunOptions,
    out: &mut dyn Write,
    timings: &mut Timings,
) -> Result<(Engine, String), HarnessError> {
    let use_cuda = match opts.backend {
        BackendChoice::Cpu => false,
        BackendChoice::Cuda => true,
        BackendChoice::Auto => match cuda::probe() {
            Ok(()) => true,
            Err(e) => {
                line(out, &format!("harness: backend auto -> cpu ({e})"));
                false
            }
        },
    };
    if !use_cuda {
        line(out, "harness: backend cpu: the CPU reference; indices are bounds-checked, no GPU kernel runs");
        return Ok((Engine::Cpu(HashMap::new()), "cpu".into()));
    }
    let user = kernels::read_sources(&model.kernels).map_err(HarnessError::Io)?;
    let names: BTreeSet<&str> = plan
        .nodes
        .iter()
        .map(|&i| model.nodes[i].kernel.as_str())
        .collect();
    let names: Vec<&str> = names.into_iter().collect();
    let backend =
        cuda::CudaBackend::new(&names, &user, opts.cache.clone()).map_err(|e| match e {
            cuda::CudaError::Unavailable(m) => HarnessError::Unavailable(m),
            cuda::CudaError::Compile { .. } => HarnessError::Compile(e.to_string()),
            cuda::CudaError::Driver(m) => HarnessError::Io(m),
        })?;
    let info = &backend.info;
    let prefix = if opts.backend == BackendChoice::Auto {
        "auto -> "
    } else {
        ""
    };
    line(
        out,
        &format!(
            "harness: backend {prefix}cuda: {} (sm_{}{}), driver {}.{}, NVRTC {}.{}",
            info.name,
            info.arch.0,
            info.arch.1,
            info.driver_version / 1000,
            info.driver_version % 1000 / 10,
            info.nvrtc_version.0,
            info.nvrtc_version.1
        ),
    );
    for c in &backend.compiles {
        let how = if c.cached { "cache hit" } else { "compiled" };
        line(
            out,
            &format!(
                "harness: kernels {}: {how} ({:.0} ms)",
                c.source,
                c.duration.as_secs_f64() * 1e3
            ),
        );
    }
    timings.context_s = backend.context_time.as_secs_f64();
    timings.kernels_s = backend.compile_time.as_secs_f64();
    timings.cached_sources = backend.compiles.iter().filter(|c| c.cached).count();
    timings.compiled_sources = backend.compiles.len() - timings.cached_sources;
    Ok((Engine::Cuda(Box::new(backend)), "cuda".into()))
}

fn line(out: &mut dyn Write, text: &str) {
    // The protocol is line based and a fault may kill the process: every line goes out at once.
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Loads the boundary tensors of a plan: declared ones from their initialisers, the rest from `inputs`.
pub fn load_boundary(
    model: &Model,
    plan: &Plan,
    inputs: Option<&Path>,
) -> Result<Vec<(String, Tensor)>, HarnessError> {
    let mut loaded = Vec::new();
    for (name, origin) in &plan.loads {
        let t = match origin {
            Origin::Declared => model
                .decl(name)
                .expect("declared tensors have a declaration")
                .materialize()
                .map_err(|m| HarnessError::Usage(format!("tensor {name:?}: {m}")))?,
            Origin::Recorded(node) => {
                let dir = inputs.ok_or_else(|| {
                    HarnessError::Usage(format!(
                        "tensor {name:?} is made by node {node:?}, which is not kept: pass --inputs with a recording that holds {name}.npy"
                    ))
                })?;
                let t = Tensor::read_npy(&dir.join(format!("{name}.npy"))).map_err(|m| {
                    HarnessError::Usage(format!(
                        "--inputs: tensor {name:?} (made by node {node:?}): {m}"
                    ))
                })?;
                let info = &model.info[name];
                if t.shape != info.shape || t.dtype() != info.dtype {
                    return Err(HarnessError::Usage(format!(
                        "--inputs: {name}.npy holds {} {:?}, the model says {} {:?}",
                        t.dtype(),
                        t.shape,
                        info.dtype,
                        info.shape
                    )));
                }
                t
            }
        };
        loaded.push((name.clone(), t));
    }
    Ok(loaded)
}

/// Runs a model (or the kept part of it), writing the protocol lines to `out`.
pub fn run(
    model: &Model,
    opts: &RunOptions,
    out: &mut dyn Write,
) -> Result<RunReport, HarnessError> {
    let started = Instant::now();
    let plan = plan(model, opts.keep.as_deref())?;
    // Everything that can be checked is checked before any node runs.
    check_kernels(model, &plan)?;
    let boundary = load_boundary(model, &plan, opts.inputs.as_deref())?;
    if let Some(dir) = &opts.record {
        // A path the user gave that cannot be a directory is their input to fix, not a failure.
        if dir.exists() && !dir.is_dir() {
            return Err(HarnessError::Usage(format!(
                "--record {} exists and is not a directory",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| HarnessError::Usage(format!("--record {}: {e}", dir.display())))?;
    }
    let mut timings = Timings::default();
    let (mut engine, backend) = start_engine(model, &plan, opts, out, &mut timings)?;
    for (name, t) in boundary {
        engine.put(&name, t)?;
    }
    let nodes_started = Instant::now();
    let mut recorded: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut outcome = Outcome::Clean;
    let mut nodes_run = 0;
    for &i in &plan.nodes {
        let node = &model.nodes[i];
        let marker = |phase| Marker::format(&node.id, node.op.as_str(), &node.kernel, phase);
        line(out, &marker(MarkerPhase::Begin));
        nodes_run += 1;
        if let Err(message) = engine.run(model, i) {
            line(out, &message);
            line(
                out,
                &format!("harness: node {} faulted on {backend}", node.id),
            );
            outcome = Outcome::Fault {
                node: node.id.clone(),
                message,
            };
            break;
        }
        line(out, &marker(MarkerPhase::End));
        if let Some(dir) = &opts.record {
            for o in &node.outputs {
                let t = engine.get(o)?;
                t.write_npy(&dir.join(format!("{o}.npy")))
                    .map_err(|e| HarnessError::Io(format!("--record: {o}.npy: {e}")))?;
                recorded.insert(
                    o.clone(),
                    serde_json::json!({"node": node.id, "shape": t.shape, "dtype": t.dtype()}),
                );
            }
        }
    }
    timings.nodes_s = nodes_started.elapsed().as_secs_f64();
    if let Some(dir) = &opts.record {
        let manifest = serde_json::json!({
            "model": model.name,
            "backend": backend,
            "outcome": outcome,
            "tensors": recorded,
        });
        std::fs::write(dir.join("manifest.json"), format!("{manifest:#}\n"))
            .map_err(|e| HarnessError::Io(format!("--record: manifest.json: {e}")))?;
    }
    if outcome == Outcome::Clean {
        let kept_outputs: Vec<String> = plan
            .nodes
            .iter()
            .flat_map(|&i| &model.nodes[i].outputs)
            .filter(|o| model.outputs.contains(o))
            .cloned()
            .collect();
        for o in &kept_outputs {
            let t = engine.get(o)?;
            line(
                out,
                &format!("harness: output {o} {:?} {}", t.shape, checksum(&t)),
            );
        }
        line(out, &format!("harness: ok: {nodes_run} nodes on {backend}"));
    }
    timings.total_s = started.elapsed().as_secs_f64();
    line(
        out,
        &format!(
            "harness: time {:.3} s (context {:.3} s, kernels {:.3} s, nodes {:.3} s)",
            timings.total_s, timings.context_s, timings.kernels_s, timings.nodes_s
        ),
    );
    Ok(RunReport {
        backend,
        nodes_run,
        outcome,
        timings,
    })
}

/// Every node's kernel has a source (the model's own, or the zoo): checked on every backend, so the CPU
/// reference never runs a model the GPU could not build.
fn check_kernels(model: &Model, plan: &Plan) -> Result<usize, HarnessError> {
    let user = kernels::read_sources(&model.kernels).map_err(HarnessError::Io)?;
    let zoo = kernels::zoo();
    let names: BTreeSet<&str> = plan
        .nodes
        .iter()
        .map(|&i| model.nodes[i].kernel.as_str())
        .collect();
    kernels::resolve(names.iter().copied(), &user, &zoo).map_err(HarnessError::Usage)?;
    Ok(names.len())
}

/// The build step for a model: checks it (including that every node's kernel has a source) and, on the
/// CUDA backend, compiles the kernels it needs into the cache. Used as `[build] command`, a kernel that
/// does not compile makes the commit a build failure, skipped as such, and repro runs start warm.
pub fn build(model: &Model, opts: &RunOptions, out: &mut dyn Write) -> Result<(), HarnessError> {
    let plan = plan(model, None)?;
    let kernels = check_kernels(model, &plan)?;
    let mut timings = Timings::default();
    let (_engine, backend) = start_engine(model, &plan, opts, out, &mut timings)?;
    line(
        out,
        &format!(
            "harness: build ok: {} nodes, {} kernels ready for {backend}",
            plan.nodes.len(),
            kernels
        ),
    );
    Ok(())
}

/// A short fingerprint of a tensor's values, for eyeballing that two runs agree.
fn checksum(t: &Tensor) -> String {
    match &t.data {
        Data::F32(v) => format!(
            "sum={:.6e} absmax={:.6e}",
            v.iter().map(|&x| x as f64).sum::<f64>(),
            v.iter().fold(0f32, |m, x| m.max(x.abs()))
        ),
        Data::I32(v) => format!("sum={}", v.iter().map(|&x| x as i64).sum::<i64>()),
    }
}

/// The largest difference between two tensors, scaled: `|a - b| / (atol + rtol * |b|)`; at most 1 means
/// they agree. Shapes or types that differ give `None`.
pub fn compare(a: &Tensor, b: &Tensor, atol: f32, rtol: f32) -> Option<f32> {
    if a.shape != b.shape || a.dtype() != b.dtype() {
        return None;
    }
    Some(match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => x
            .iter()
            .zip(y)
            .map(|(p, q)| {
                if p == q {
                    0.0
                } else {
                    (p - q).abs() / (atol + rtol * q.abs())
                }
            })
            .fold(
                0f32,
                |m, v| if v.is_nan() { f32::INFINITY } else { m.max(v) },
            ),
        (Data::I32(x), Data::I32(y)) => {
            if x == y {
                0.0
            } else {
                f32::INFINITY
            }
        }
        _ => return None,
    })
}

/// The graph as the harness protocol describes it: nodes in execution order with their ops, kernels and
/// input and output tensors (shape, type, producer).
pub fn describe(model: &Model) -> serde_json::Value {
    let tensor = |name: &String| {
        let info = &model.info[name];
        serde_json::json!({
            "name": name,
            "shape": info.shape,
            "dtype": info.dtype,
            "producer": info.producer.map(|p| model.nodes[p].id.clone()),
        })
    };
    let nodes: Vec<serde_json::Value> = model
        .order
        .iter()
        .map(|&i| {
            let n = &model.nodes[i];
            serde_json::json!({
                "id": n.id,
                "op": n.op.as_str(),
                "kernel": n.kernel,
                "inplace": n.inplace,
                "inputs": n.inputs.iter().map(tensor).collect::<Vec<_>>(),
                "outputs": n.outputs.iter().map(tensor).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "protocol": PROTOCOL_VERSION,
        "harness": "native",
        "model": model.name,
        "nodes": nodes,
        "outputs": model.outputs,
    })
}
