//! Model files: a TOML graph of tensors and nodes, parsed strictly and validated (ops, shapes, cycles,
//! missing tensors, unreadable value files) into a checked model with a topological order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ops::{Op, Params};
use super::tensor::{element_count, DType, SplitMix64, Tensor, MAX_ELEMENTS};

/// A model that failed to load; the message names the node or tensor and the field.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct ModelError {
    /// The model file.
    pub path: PathBuf,
    /// What is wrong, naming the node or tensor and the field.
    pub message: String,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    #[serde(default)]
    pub(crate) model: RawHeader,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tensor: Vec<RawTensor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) node: Vec<RawNode>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeader {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) kernels: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) outputs: Vec<String>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTensor {
    pub(crate) name: String,
    pub(crate) shape: Vec<i64>,
    #[serde(default = "default_dtype")]
    pub(crate) dtype: String,
    pub(crate) init: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) low: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) high: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) start: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) step: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) values: Option<Vec<f64>>,
}

fn default_dtype() -> String {
    "f32".into()
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    pub(crate) id: String,
    pub(crate) op: String,
    pub(crate) inputs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) outputs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kernel: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) eps: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) inplace: bool,
}

/// How a declared tensor gets its values.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Init {
    /// Uniform in [low, high) from a seeded generator (integers: low..high).
    Random {
        /// Generator seed.
        seed: u64,
        /// Lowest value.
        low: f64,
        /// Highest value (exclusive).
        high: f64,
    },
    /// Every element the same.
    Constant {
        /// The value.
        value: f64,
    },
    /// `start + i * step`.
    Range {
        /// The first element.
        start: f64,
        /// The difference between neighbours.
        step: f64,
    },
    /// Inline values, row-major.
    Values {
        /// The values.
        values: Vec<f64>,
    },
    /// A `.npy` file, relative to the model file.
    File {
        /// The file, resolved against the model file's directory.
        path: PathBuf,
    },
}

/// A tensor declared in the model file (weights, inputs, buffers).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorDecl {
    /// Its name, as nodes read it.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
    /// How its values are made.
    pub init: Init,
}

/// A validated node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Node {
    /// Unique id, as `--keep` names it.
    pub id: String,
    /// The zoo op.
    #[serde(serialize_with = "op_name")]
    pub op: Op,
    /// Tensors read, in the op's argument order.
    pub inputs: Vec<String>,
    /// Tensors written (none for in-place ops).
    pub outputs: Vec<String>,
    /// The kernel launched (the op's zoo kernel unless the file names one).
    pub kernel: String,
    /// Layernorm's epsilon.
    pub eps: f32,
    /// Writes its first input in place (scatter, index_add).
    pub inplace: bool,
}

fn op_name<S: serde::Serializer>(op: &Op, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(op.as_str())
}

/// The shape, type and origin of every tensor in the graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorInfo {
    /// Its shape, inferred for node outputs.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
    /// The node (by index) that produces it; `None` for declared tensors.
    pub producer: Option<usize>,
}

/// A checked model.
#[derive(Clone, Debug)]
pub struct Model {
    /// The model file.
    pub path: PathBuf,
    /// `[model] name`, or the file's stem.
    pub name: String,
    /// `[model] description`.
    pub description: Option<String>,
    /// The user's own kernel sources, searched before the built-in zoo.
    pub kernels: Vec<PathBuf>,
    /// Declared tensors.
    pub tensors: Vec<TensorDecl>,
    /// Nodes, in file order (see `order` for execution order).
    pub nodes: Vec<Node>,
    /// The model's outputs (default: what no node consumes).
    pub outputs: Vec<String>,
    /// Shape, type and producer of every tensor.
    pub info: BTreeMap<String, TensorInfo>,
    /// Node indices in execution order.
    pub order: Vec<usize>,
}

impl Model {
    /// Reads and checks a model file.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError {
            path: path.to_path_buf(),
            message: format!("cannot read the model file: {e}"),
        })?;
        Model::parse(path, &text)
    }

    /// Checks model text; `path` names it in errors and anchors relative paths.
    pub fn parse(path: &Path, text: &str) -> Result<Model, ModelError> {
        let err = |message: String| ModelError {
            path: path.to_path_buf(),
            message,
        };
        let raw: RawModel = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start].matches('\n').count() + 1;
                    let col = s.start - text[..s.start].rfind('\n').map_or(0, |i| i + 1) + 1;
                    format!("line {line}, column {col}: ")
                })
                .unwrap_or_default();
            err(format!("{at}{}", e.message()))
        })?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = raw.model.name.unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        });

        let mut info: BTreeMap<String, TensorInfo> = BTreeMap::new();
        let mut tensors = Vec::new();
        for (i, t) in raw.tensor.into_iter().enumerate() {
            let what = format!("tensor {:?} (tensor #{})", t.name, i + 1);
            let decl = tensor_decl(t, &dir).map_err(|m| err(format!("{what}: {m}")))?;
            if info.contains_key(&decl.name) {
                return Err(err(format!("{what}: name: declared twice")));
            }
            if let Init::File { path } = &decl.init {
                let loaded =
                    Tensor::read_npy(path).map_err(|m| err(format!("{what}: file: {m}")))?;
                if loaded.shape != decl.shape || loaded.dtype() != decl.dtype {
                    return Err(err(format!(
                        "{what}: file: holds {} {:?}, the declaration says {} {:?}",
                        loaded.dtype(),
                        loaded.shape,
                        decl.dtype,
                        decl.shape
                    )));
                }
            }
            info.insert(
                decl.name.clone(),
                TensorInfo {
                    shape: decl.shape.clone(),
                    dtype: decl.dtype,
                    producer: None,
                },
            );
            tensors.push(decl);
        }

        // Nodes: ops and names first, so outputs are known before inputs are resolved.
        let mut nodes = Vec::new();
        let mut ids = BTreeSet::new();
        for (i, n) in raw.node.iter().enumerate() {
            let what = format!("node {:?}", n.id);
            if !valid_name(&n.id) {
                return Err(err(format!(
                    "node #{}: id: {:?} must be letters, digits, '_', '-' or '.'",
                    i + 1,
                    n.id
                )));
            }
            if !ids.insert(n.id.clone()) {
                return Err(err(format!("{what}: id: used by two nodes")));
            }
            let op = Op::parse(&n.op).ok_or_else(|| {
                let known: Vec<_> = Op::ALL.iter().map(|o| o.as_str()).collect();
                err(format!(
                    "{what}: op: unknown op {:?} (known: {})",
                    n.op,
                    known.join(", ")
                ))
            })?;
            if n.inplace && !n.outputs.is_empty() {
                return Err(err(format!(
                    "{what}: outputs: an in-place node writes its base input and has no outputs"
                )));
            }
            if !n.inplace && n.outputs.len() != 1 {
                return Err(err(format!(
                    "{what}: outputs: {} takes exactly one output",
                    op.as_str()
                )));
            }
            for out in &n.outputs {
                if !valid_name(out) {
                    return Err(err(format!(
                        "{what}: outputs: {out:?} must be letters, digits, '_', '-' or '.'"
                    )));
                }
                if let Some(prev) = info.get(out) {
                    let by = prev
                        .producer
                        .map_or("a [[tensor]] declaration".to_string(), |p| {
                            format!("node {:?}", raw.node[p].id)
                        });
                    return Err(err(format!(
                        "{what}: outputs: tensor {out:?} is already defined by {by}"
                    )));
                }
                // Shape filled in below, once inputs are known.
                info.insert(
                    out.clone(),
                    TensorInfo {
                        shape: vec![],
                        dtype: DType::F32,
                        producer: Some(i),
                    },
                );
            }
            if let Some(eps) = n.eps.filter(|e| !(e.is_finite() && *e > 0.0)) {
                // A layernorm divides by sqrt(var + eps): zero or negative gives NaN, not a model.
                return Err(err(format!(
                    "{what}: eps: {eps} must be a positive number (such as 1e-5)"
                )));
            }
            nodes.push(Node {
                id: n.id.clone(),
                op,
                inputs: n.inputs.clone(),
                outputs: n.outputs.clone(),
                kernel: String::new(),
                eps: n.eps.unwrap_or(1e-5) as f32,
                inplace: n.inplace,
            });
        }
        for (i, n) in nodes.iter().enumerate() {
            for (k, input) in n.inputs.iter().enumerate() {
                if !info.contains_key(input) {
                    return Err(err(format!(
                        "node {:?}: inputs[{k}]: tensor {input:?} is not defined by any [[tensor]] or node output",
                        n.id
                    )));
                }
                if info[input].producer == Some(i) {
                    return Err(err(format!(
                        "node {:?}: inputs[{k}]: reads its own output {input:?}",
                        n.id
                    )));
                }
            }
        }
        if nodes.is_empty() {
            return Err(err(
                "the model has no [[node]]: there is nothing to run (a model file lists its nodes)"
                    .into(),
            ));
        }
        // Ordering reads an in-place node's first input, so that must exist before ordering.
        if let Some(n) = nodes.iter().find(|n| n.inplace && n.inputs.is_empty()) {
            return Err(err(format!(
                "node {:?}: inplace = true needs an input: the tensor it writes in place",
                n.id
            )));
        }
        let order = topological_order(&nodes, &info).map_err(err)?;
        // Shapes, in execution order so every input's shape is known.
        for &i in &order {
            let n = &mut nodes[i];
            let raw_node = &raw.node[i];
            let ins: Vec<(&[usize], DType)> = n
                .inputs
                .iter()
                .map(|t| (info[t].shape.as_slice(), info[t].dtype))
                .collect();
            let params = Params {
                eps: raw_node.eps,
                inplace: n.inplace,
            };
            let out =
                n.op.infer(&ins, &params)
                    .map_err(|m| err(format!("node {:?}: inputs: {m}", n.id)))?;
            let dtype = ins[0].1;
            n.kernel = raw_node
                .kernel
                .clone()
                .unwrap_or_else(|| n.op.default_kernel(dtype).to_string());
            if let Some((shape, dtype)) = out {
                let t = info
                    .get_mut(&n.outputs[0])
                    .expect("outputs registered above");
                t.shape = shape;
                t.dtype = dtype;
            }
        }
        // Every tensor must be allocatable: an element count that overflows or exceeds the limit is an
        // input error here, not a wrapped count or an aborted allocation later.
        for (name, t) in &info {
            if element_count(&t.shape).is_none() {
                return Err(err(format!(
                    "tensor {name:?}: shape {:?} has more than {MAX_ELEMENTS} elements",
                    t.shape
                )));
            }
        }
        for (k, out) in raw.model.outputs.iter().enumerate() {
            if !info.contains_key(out) {
                return Err(err(format!(
                    "[model] outputs[{k}]: tensor {out:?} is not defined"
                )));
            }
        }
        let outputs = if raw.model.outputs.is_empty() {
            // Default: what no node consumes.
            let consumed: BTreeSet<&String> = nodes.iter().flat_map(|n| &n.inputs).collect();
            nodes
                .iter()
                .flat_map(|n| &n.outputs)
                .filter(|o| !consumed.contains(o))
                .cloned()
                .collect()
        } else {
            raw.model.outputs.clone()
        };
        let mut kernels = Vec::new();
        for (k, file) in raw.model.kernels.iter().enumerate() {
            let p = dir.join(file);
            if !p.is_file() {
                return Err(err(format!(
                    "[model] kernels[{k}]: {} is not a readable file",
                    p.display()
                )));
            }
            kernels.push(p);
        }
        Ok(Model {
            path: path.to_path_buf(),
            name,
            description: raw.model.description,
            kernels,
            tensors,
            nodes,
            outputs,
            info,
            order,
        })
    }

    /// The index of the node with this id.
    pub fn node_index(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The declaration of a declared tensor.
    pub fn decl(&self, name: &str) -> Option<&TensorDecl> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn tensor_decl(t: RawTensor, dir: &Path) -> Result<TensorDecl, String> {
    if !valid_name(&t.name) {
        return Err("name: must be letters, digits, '_', '-' or '.'".into());
    }
    let dtype =
        DType::parse(&t.dtype).ok_or_else(|| format!("dtype: {:?} is not f32 or i32", t.dtype))?;
    if t.shape.is_empty() || t.shape.iter().any(|&d| d < 1) {
        return Err(format!(
            "shape: {:?} must be a non-empty list of positive sizes",
            t.shape
        ));
    }
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    let count = element_count(&shape)
        .ok_or_else(|| format!("shape: {:?} has more than {MAX_ELEMENTS} elements", t.shape))?;
    let need = |v: Option<f64>, field: &str| {
        v.ok_or_else(|| format!("{field}: init = {:?} needs it", t.init))
    };
    let init = match t.init.as_str() {
        "random" => {
            let (low, high) = match dtype {
                DType::F32 => (t.low.unwrap_or(-1.0), t.high.unwrap_or(1.0)),
                DType::I32 => (need(t.low, "low")?, need(t.high, "high")?),
            };
            if low >= high {
                return Err(format!("high: {high} must be above low {low}"));
            }
            Init::Random {
                seed: t.seed.unwrap_or(0),
                low,
                high,
            }
        }
        "zeros" => Init::Constant { value: 0.0 },
        "constant" => Init::Constant {
            value: need(t.value, "value")?,
        },
        "range" => Init::Range {
            start: t.start.unwrap_or(0.0),
            step: t.step.unwrap_or(1.0),
        },
        "values" => {
            let values = t.values.ok_or("values: init = \"values\" needs it")?;
            if values.len() != count {
                return Err(format!(
                    "values: {} values for shape {shape:?} ({count} elements)",
                    values.len()
                ));
            }
            Init::Values { values }
        }
        "file" => Init::File {
            path: dir.join(t.file.ok_or("file: init = \"file\" needs it")?),
        },
        other => {
            return Err(format!(
                "init: unknown {other:?} (random, zeros, constant, range, values, file)"
            ))
        }
    };
    Ok(TensorDecl {
        name: t.name,
        shape,
        dtype,
        init,
    })
}

/// Kahn's algorithm, taking the earliest-declared ready node first so independent nodes keep file order.
/// In-place writers order themselves against every reader of the tensor they write, by file position.
fn topological_order(
    nodes: &[Node],
    info: &BTreeMap<String, TensorInfo>,
) -> Result<Vec<usize>, String> {
    let n = nodes.len();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (i, node) in nodes.iter().enumerate() {
        for input in &node.inputs {
            if let Some(p) = info[input].producer {
                edges[p].insert(i);
            }
        }
    }
    let mut touches: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for input in &node.inputs {
            touches.entry(input.as_str()).or_default().push(i);
        }
    }
    for (w, node) in nodes.iter().enumerate() {
        if !node.inplace {
            continue;
        }
        for &other in touches.get(node.inputs[0].as_str()).into_iter().flatten() {
            if other < w {
                edges[other].insert(w);
            } else if other > w {
                edges[w].insert(other);
            }
        }
    }
    let mut indegree = vec![0usize; n];
    for e in &edges {
        for &j in e {
            indegree[j] += 1;
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &j in &edges[i] {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                ready.insert(j);
            }
        }
    }
    if order.len() < n {
        let stuck: Vec<&str> = (0..n)
            .filter(|i| indegree[*i] > 0)
            .map(|i| nodes[i].id.as_str())
            .collect();
        return Err(format!(
            "the graph has a cycle through nodes {}",
            stuck.join(", ")
        ));
    }
    Ok(order)
}

impl TensorDecl {
    /// Builds the tensor's values. Files were checked at load time but are read again here, so an error
    /// is still possible if one changed since.
    pub fn materialize(&self) -> Result<Tensor, String> {
        let count: usize = self.shape.iter().product();
        let shape = self.shape.clone();
        let from_f64 = |v: Vec<f64>| match self.dtype {
            DType::F32 => Tensor::f32(shape.clone(), v.into_iter().map(|x| x as f32).collect()),
            DType::I32 => Tensor::i32(shape.clone(), v.into_iter().map(|x| x as i32).collect()),
        };
        Ok(match &self.init {
            Init::Random { seed, low, high } => {
                let mut g = SplitMix64::new(*seed);
                match self.dtype {
                    DType::F32 => Tensor::f32(
                        shape.clone(),
                        (0..count)
                            .map(|_| (low + (high - low) * g.next_f64()) as f32)
                            .collect(),
                    ),
                    DType::I32 => {
                        let (lo, span) = (*low as i64, (*high as i64 - *low as i64).max(1) as u64);
                        Tensor::i32(
                            shape.clone(),
                            (0..count)
                                .map(|_| (lo + (g.next_u64() % span) as i64) as i32)
                                .collect(),
                        )
                    }
                }
            }
            Init::Constant { value } => from_f64(vec![*value; count]),
            Init::Range { start, step } => {
                from_f64((0..count).map(|i| start + step * i as f64).collect())
            }
            Init::Values { values } => from_f64(values.clone()),
            Init::File { path } => {
                let t = Tensor::read_npy(path)?;
                if t.shape != self.shape || t.dtype() != self.dtype {
                    return Err(format!(
                        "{} changed: it no longer matches the declaration",
                        path.display()
                    ));
                }
                t
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Model, String> {
        Model::parse(Path::new("m.toml"), text).map_err(|e| e.to_string())
    }

    const MLP: &str = r#"
[model]
name = "mlp"
outputs = ["y"]

[[tensor]]
name = "x"
shape = [4, 8]
init = "random"
seed = 1

[[tensor]]
name = "w"
shape = [8, 3]
init = "random"

[[tensor]]
name = "b"
shape = [3]
init = "zeros"

[[node]]
id = "act"
op = "relu"
inputs = ["h1"]
outputs = ["y"]

[[node]]
id = "bias"
op = "bias_add"
inputs = ["h0", "b"]
outputs = ["h1"]

[[node]]
id = "mm"
op = "matmul"
inputs = ["x", "w"]
outputs = ["h0"]
"#;

    #[test]
    fn nodes_run_in_dependency_order_whatever_the_file_order() {
        let m = parse(MLP).unwrap();
        let order: Vec<&str> = m.order.iter().map(|&i| m.nodes[i].id.as_str()).collect();
        assert_eq!(order, ["mm", "bias", "act"]);
        assert_eq!(m.info["y"].shape, vec![4, 3]);
        assert_eq!(m.nodes[2].kernel, "matmul_f32");
    }

    #[test]
    fn hostile_shapes_and_inplace_nodes_without_inputs_are_input_errors_not_panics() {
        let wraps = MLP.replace("shape = [4, 8]", "shape = [4294967296, 4294967296]");
        assert!(parse(&wraps).unwrap_err().contains("has more than"));
        let huge = MLP.replace("shape = [4, 8]", "shape = [1000000, 1000000]");
        assert!(parse(&huge).unwrap_err().contains("has more than"));
        // Each factor is allowed, the product of a matmul is not.
        let product = MLP
            .replace("shape = [4, 8]", "shape = [4000000, 1]")
            .replace("shape = [8, 3]", "shape = [1, 4000000]")
            .replace("shape = [3]", "shape = [4000000]");
        assert!(
            parse(&product).unwrap_err().contains("has more than"),
            "{:?}",
            parse(&product).err()
        );
        let inplace =
            format!("{MLP}\n[[node]]\nid = \"w\"\nop = \"scatter\"\ninplace = true\ninputs = []\n");
        assert!(
            parse(&inplace)
                .unwrap_err()
                .contains("inplace = true needs an input"),
            "{:?}",
            parse(&inplace).err()
        );
    }

    #[test]
    fn errors_name_the_node_and_the_field() {
        let cases = [
            (
                MLP.replace("op = \"relu\"", "op = \"conv\""),
                "node \"act\": op: unknown op \"conv\"",
            ),
            (
                MLP.replace("inputs = [\"x\", \"w\"]", "inputs = [\"x\", \"w9\"]"),
                "node \"mm\": inputs[1]: tensor \"w9\" is not defined",
            ),
            (
                MLP.replace("shape = [8, 3]", "shape = [7, 3]"),
                "node \"mm\": inputs: matmul of [4, 8] by [7, 3]",
            ),
            (
                MLP.replace("inputs = [\"x\", \"w\"]", "inputs = [\"y\", \"w\"]"),
                "cycle through nodes",
            ),
            (
                MLP.replace("init = \"zeros\"", "init = \"file\"\nfile = \"nope.npy\""),
                "tensor \"b\" (tensor #3): file: cannot read",
            ),
            (
                MLP.replace("seed = 1", "sed = 1"),
                "line 10, column 1: unknown field `sed`",
            ),
            (
                MLP.replace(
                    "outputs = [\"y\"]\n\n[[tensor]]",
                    "outputs = [\"z\"]\n\n[[tensor]]",
                ),
                "[model] outputs[0]: tensor \"z\" is not defined",
            ),
            (
                MLP.replace("outputs = [\"h1\"]", "outputs = [\"h0\"]"),
                "node \"mm\": outputs: tensor \"h0\" is already defined by node \"bias\"",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{e}\n  does not contain\n{want}");
        }
    }

    #[test]
    fn an_inplace_writer_runs_between_earlier_and_later_readers() {
        let m = parse(
            r#"
[[tensor]]
name = "ids"
shape = [4]
dtype = "i32"
init = "range"
[[tensor]]
name = "pos"
shape = [1]
dtype = "i32"
init = "values"
values = [2]
[[tensor]]
name = "val"
shape = [1]
dtype = "i32"
init = "values"
values = [99]
[[tensor]]
name = "table"
shape = [8, 2]
init = "random"
[[node]]
id = "before"
op = "embedding"
inputs = ["table", "ids"]
outputs = ["e0"]
[[node]]
id = "write"
op = "scatter"
inputs = ["ids", "pos", "val"]
inplace = true
[[node]]
id = "after"
op = "embedding"
inputs = ["table", "ids"]
outputs = ["e1"]
"#,
        )
        .unwrap();
        assert_eq!(m.order, vec![0, 1, 2]);
        assert_eq!(m.outputs, vec!["e0".to_string(), "e1".to_string()]);
    }

    #[test]
    fn initialisers_are_deterministic_and_typed() {
        let d = TensorDecl {
            name: "t".into(),
            shape: vec![1000],
            dtype: DType::I32,
            init: Init::Random {
                seed: 3,
                low: 5.0,
                high: 9.0,
            },
        };
        let a = d.materialize().unwrap();
        assert_eq!(a, d.materialize().unwrap());
        let crate::harness::tensor::Data::I32(v) = &a.data else {
            panic!()
        };
        assert!(v.iter().all(|&x| (5..9).contains(&x)));
        assert!(
            (5..9).all(|k| v.contains(&k)),
            "every value in range shows up"
        );
    }
}
