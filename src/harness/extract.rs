//! Writes a subgraph as a standalone model: the kept nodes, the declared tensors they read, and their
//! recorded boundary inputs as `.npy` files next to it, so it runs with nothing but the binary.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::model::{Init, Model};
use super::{load_boundary, plan, HarnessError, Origin};

/// What `extract` wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Extracted {
    pub model: PathBuf,
    pub inputs: Vec<PathBuf>,
    pub nodes: Vec<String>,
}

fn toml_str(s: &str) -> String {
    // TOML basic strings escape like JSON strings.
    serde_json::to_string(s).expect("strings serialise")
}

fn toml_list(items: &[String]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|s| toml_str(s))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v:e}")
    }
}

/// Writes `out/model.toml` and `out/inputs/*.npy` for the kept nodes.
pub fn extract(
    model: &Model,
    keep: &[String],
    inputs: Option<&Path>,
    out: &Path,
) -> Result<Extracted, HarnessError> {
    let plan = plan(model, Some(keep))?;
    let boundary = load_boundary(model, &plan, inputs)?;
    let io = |e: std::io::Error| HarnessError::Io(format!("{}: {e}", out.display()));
    let input_dir = out.join("inputs");
    std::fs::create_dir_all(&input_dir).map_err(io)?;
    let ids: Vec<String> = plan
        .nodes
        .iter()
        .map(|&i| model.nodes[i].id.clone())
        .collect();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Minimal subgraph of {} ({} of {} nodes), written by cudabisect.\n# Tensors under inputs/ were recorded from the full model's run.",
        model.name,
        ids.len(),
        model.nodes.len()
    );
    let _ = writeln!(
        text,
        "[model]\nname = {}",
        toml_str(&format!("{}-minimal", model.name))
    );
    let produced: Vec<String> = plan
        .nodes
        .iter()
        .flat_map(|&i| model.nodes[i].outputs.clone())
        .collect();
    let outputs: Vec<String> = produced
        .iter()
        .filter(|o| model.outputs.contains(o))
        .cloned()
        .collect();
    if !outputs.is_empty() {
        let _ = writeln!(text, "outputs = {}", toml_list(&outputs));
    }
    if !model.kernels.is_empty() {
        let kdir = out.join("kernels");
        std::fs::create_dir_all(&kdir).map_err(io)?;
        let mut names = Vec::new();
        for k in &model.kernels {
            let name = k
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            std::fs::copy(k, kdir.join(&name)).map_err(io)?;
            names.push(format!("kernels/{name}"));
        }
        let _ = writeln!(text, "kernels = {}", toml_list(&names));
    }
    let mut written = Vec::new();
    for (name, tensor) in &boundary {
        let info = &model.info[name];
        let _ = write!(
            text,
            "\n[[tensor]]\nname = {}\nshape = {:?}\ndtype = \"{}\"\n",
            toml_str(name),
            info.shape,
            info.dtype
        );
        let decl = model.decl(name);
        match (&plan.loads[name], decl.map(|d| &d.init)) {
            (Origin::Declared, Some(Init::Random { seed, low, high })) => {
                let _ = writeln!(
                    text,
                    "init = \"random\"\nseed = {seed}\nlow = {}\nhigh = {}",
                    num(*low),
                    num(*high)
                );
            }
            (Origin::Declared, Some(Init::Constant { value })) => {
                let _ = writeln!(text, "init = \"constant\"\nvalue = {}", num(*value));
            }
            (Origin::Declared, Some(Init::Range { start, step })) => {
                let _ = writeln!(
                    text,
                    "init = \"range\"\nstart = {}\nstep = {}",
                    num(*start),
                    num(*step)
                );
            }
            (Origin::Declared, Some(Init::Values { values })) if values.len() <= 64 => {
                let v: Vec<String> = values.iter().map(|x| num(*x)).collect();
                let _ = writeln!(text, "init = \"values\"\nvalues = [{}]", v.join(", "));
            }
            (origin, _) => {
                // Recorded tensors, and declared ones too large to inline or read from a file: saved.
                let file = input_dir.join(format!("{name}.npy"));
                tensor.write_npy(&file).map_err(io)?;
                written.push(file);
                let from = match origin {
                    Origin::Recorded(node) => format!("  # recorded output of node {node}"),
                    Origin::Declared => String::new(),
                };
                let _ = writeln!(
                    text,
                    "init = \"file\"\nfile = {}{from}",
                    toml_str(&format!("inputs/{name}.npy"))
                );
            }
        }
    }
    for &i in &plan.nodes {
        let n = &model.nodes[i];
        let _ = write!(
            text,
            "\n[[node]]\nid = {}\nop = \"{}\"\ninputs = {}\n",
            toml_str(&n.id),
            n.op.as_str(),
            toml_list(&n.inputs)
        );
        if !n.outputs.is_empty() {
            let _ = writeln!(text, "outputs = {}", toml_list(&n.outputs));
        }
        let dtype = model.info[&n.inputs[0]].dtype;
        if n.kernel != n.op.default_kernel(dtype) {
            let _ = writeln!(text, "kernel = {}", toml_str(&n.kernel));
        }
        if n.op == super::ops::Op::LayerNorm {
            let _ = writeln!(text, "eps = {:e}", n.eps);
        }
        if n.inplace {
            let _ = writeln!(text, "inplace = true");
        }
    }
    let path = out.join("model.toml");
    std::fs::write(&path, text).map_err(io)?;
    // The written model must load: a check that costs nothing and catches any mistake here.
    Model::load(&path)
        .map_err(|e| HarnessError::Io(format!("the extracted model does not load: {e}")))?;
    Ok(Extracted {
        model: path,
        inputs: written,
        nodes: ids,
    })
}
