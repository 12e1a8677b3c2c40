//! Writes a subgraph as a standalone model: the kept nodes, the declared tensors they read, and their
//! recorded boundary inputs as `.npy` files next to it, so it runs with nothing but the binary.

use std::path::{Path, PathBuf};

use super::model::{Init, Model, RawHeader, RawModel, RawNode, RawTensor};
use super::{load_boundary, plan, HarnessError, Origin};

/// What `extract` wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Extracted {
    /// The model file.
    pub model: PathBuf,
    /// The recorded inputs written beside it.
    pub inputs: Vec<PathBuf>,
    /// The kept node ids, in execution order.
    pub nodes: Vec<String>,
}

/// Writes `out/model.toml` and `out/inputs/*.npy` for the kept nodes. The model file is the model
/// format's own structs serialised, so it always reads back; it is loaded again to make sure.
pub fn extract(
    model: &Model,
    keep: &[String],
    inputs: Option<&Path>,
    out: &Path,
) -> Result<Extracted, HarnessError> {
    let plan = plan(model, Some(keep))?;
    let boundary = load_boundary(model, &plan, inputs)?;
    let io = |e: std::io::Error| HarnessError::Io(format!("{}: {e}", out.display()));
    if out.exists() && !out.is_dir() {
        return Err(HarnessError::Usage(format!(
            "--out {} exists and is not a directory",
            out.display()
        )));
    }
    let input_dir = out.join("inputs");
    std::fs::create_dir_all(&input_dir)
        .map_err(|e| HarnessError::Usage(format!("--out {}: {e}", out.display())))?;
    let ids: Vec<String> = plan
        .nodes
        .iter()
        .map(|&i| model.nodes[i].id.clone())
        .collect();
    let mut notes = vec![
        format!(
            "Minimal subgraph of {} ({} of {} nodes), written by cudabisect.",
            model.name,
            ids.len(),
            model.nodes.len()
        ),
        "Tensors under inputs/ were recorded from the full model's run.".to_string(),
    ];
    let produced: Vec<String> = plan
        .nodes
        .iter()
        .flat_map(|&i| model.nodes[i].outputs.clone())
        .collect();
    let mut raw = RawModel {
        model: RawHeader {
            name: Some(format!("{}-minimal", model.name)),
            description: None,
            kernels: Vec::new(),
            outputs: produced
                .iter()
                .filter(|o| model.outputs.contains(o))
                .cloned()
                .collect(),
        },
        tensor: Vec::new(),
        node: Vec::new(),
    };
    if !model.kernels.is_empty() {
        let kdir = out.join("kernels");
        std::fs::create_dir_all(&kdir).map_err(io)?;
        for k in &model.kernels {
            let name = k
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            std::fs::copy(k, kdir.join(&name)).map_err(io)?;
            raw.model.kernels.push(format!("kernels/{name}"));
        }
    }
    let mut written = Vec::new();
    for (name, tensor) in &boundary {
        let info = &model.info[name];
        let mut t = RawTensor {
            name: name.clone(),
            shape: info.shape.iter().map(|&d| d as i64).collect(),
            dtype: info.dtype.to_string(),
            ..RawTensor::default()
        };
        match (&plan.loads[name], model.decl(name).map(|d| &d.init)) {
            (Origin::Declared, Some(Init::Random { seed, low, high })) => {
                t.init = "random".into();
                (t.seed, t.low, t.high) = (Some(*seed), Some(*low), Some(*high));
            }
            (Origin::Declared, Some(Init::Constant { value })) => {
                t.init = "constant".into();
                t.value = Some(*value);
            }
            (Origin::Declared, Some(Init::Range { start, step })) => {
                t.init = "range".into();
                (t.start, t.step) = (Some(*start), Some(*step));
            }
            (Origin::Declared, Some(Init::Values { values })) if values.len() <= 64 => {
                t.init = "values".into();
                t.values = Some(values.clone());
            }
            (origin, _) => {
                // Recorded tensors, and declared ones too large to inline or read from a file: saved.
                let file = input_dir.join(format!("{name}.npy"));
                tensor.write_npy(&file).map_err(io)?;
                written.push(file);
                if let Origin::Recorded(node) = origin {
                    notes.push(format!("inputs/{name}.npy: recorded output of node {node}"));
                }
                t.init = "file".into();
                t.file = Some(format!("inputs/{name}.npy"));
            }
        }
        raw.tensor.push(t);
    }
    for &i in &plan.nodes {
        let n = &model.nodes[i];
        let dtype = model.info[&n.inputs[0]].dtype;
        raw.node.push(RawNode {
            id: n.id.clone(),
            op: n.op.as_str().to_string(),
            inputs: n.inputs.clone(),
            outputs: n.outputs.clone(),
            kernel: (n.kernel != n.op.default_kernel(dtype)).then(|| n.kernel.clone()),
            eps: (n.op == super::ops::Op::LayerNorm).then_some(f64::from(n.eps)),
            inplace: n.inplace,
        });
    }
    let body = toml::to_string(&raw)
        .map_err(|e| HarnessError::Io(format!("cannot write the extracted model: {e}")))?;
    let header: String = notes.iter().map(|n| format!("# {n}\n")).collect();
    let path = out.join("model.toml");
    std::fs::write(&path, header + &body).map_err(io)?;
    // The written model must load: a check that costs nothing and catches any mistake here.
    Model::load(&path)
        .map_err(|e| HarnessError::Io(format!("the extracted model does not load: {e}")))?;
    Ok(Extracted {
        model: path,
        inputs: written,
        nodes: ids,
    })
}
