//! The records of the harness protocol: what `describe` writes, checked against the protocol version.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The protocol version this cudabisect speaks: `describe --out FILE` writes a [`Description`] there.
pub const PROTOCOL_VERSION: u32 = 2;

/// A node as the harness describes it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct GraphNode {
    /// Unique id, as `run --keep` takes it.
    pub id: String,
    /// The op (a zoo op, an FX target, a module class).
    pub op: String,
    /// The kernel the node launches, when the harness knows it.
    #[serde(default)]
    pub kernel: Option<String>,
    /// Tensors read, in argument order.
    #[serde(default)]
    pub inputs: Vec<GraphTensor>,
    /// Tensors written.
    #[serde(default)]
    pub outputs: Vec<GraphTensor>,
    /// Where in a training step: forward, loss, backward or optimizer (harnesses that say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// For a backward node: the forward node it differentiates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<String>,
    /// The user's line that made the node (for a backward node, its forward call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// A tensor as the harness describes it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct GraphTensor {
    /// Its name in the recording.
    pub name: String,
    /// Its shape; `None` (JSON `null` or absent) when the harness does not know it before running. An
    /// empty list is a known shape: a scalar.
    #[serde(default)]
    pub shape: Option<Vec<u64>>,
    /// Its element type, when known.
    #[serde(default)]
    pub dtype: Option<String>,
    /// The node that writes it; `None` for model inputs and parameters.
    #[serde(default)]
    pub producer: Option<String>,
}

impl GraphTensor {
    /// The shape as people read it: `[32, 128]`, or `unknown` when it was never produced or recorded.
    pub fn shape_text(&self) -> String {
        match &self.shape {
            Some(dims) => format!("{dims:?}"),
            None => "unknown".to_string(),
        }
    }

    /// Its size in bytes from its shape and dtype (`torch.` or not; an unknown dtype counts 4 bytes an
    /// element); `None` when the shape is unknown.
    pub fn bytes(&self) -> Option<u64> {
        let elements = self
            .shape
            .as_ref()?
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let dtype = self.dtype.as_deref().unwrap_or("");
        let each = match dtype.strip_prefix("torch.").unwrap_or(dtype) {
            "bool" | "int8" | "uint8" | "qint8" | "quint8" => 1,
            d if d.starts_with("float8") => 1,
            "float16" | "half" | "bfloat16" | "int16" | "uint16" => 2,
            "float64" | "double" | "int64" | "long" | "uint64" | "complex64" => 8,
            "complex128" => 16,
            _ => 4,
        };
        elements.checked_mul(each)
    }
}

/// What `describe` writes.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Description {
    /// The protocol version the harness speaks.
    pub protocol: u32,
    /// Which harness wrote it (`native`, `torch`, or the user's own).
    #[serde(default)]
    pub harness: Option<String>,
    /// How the harness obtained the graph, when it says (the PyTorch harness: `fx`, which modules it kept
    /// whole because their forward cannot be traced, and how each level it descended into was obtained:
    /// fx, hooks, or a chain of children).
    #[serde(default)]
    pub graph: Option<String>,
    /// Nodes in execution order.
    pub nodes: Vec<GraphNode>,
}

/// Why a description cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DescriptionError {
    /// Not JSON, or not the shape of a description.
    #[error("bad description JSON: {0}")]
    Json(String),
    /// Another protocol version.
    #[error("the harness speaks protocol {found}, cudabisect speaks {PROTOCOL_VERSION}")]
    Version {
        /// The version the harness wrote.
        found: u32,
    },
    /// No nodes.
    #[error("the description lists no nodes")]
    Empty,
    /// Two nodes with one id.
    #[error("node id `{0}` appears twice in the description")]
    DuplicateId(String),
}

impl Description {
    /// Parses and checks a description: version, at least one node, unique ids.
    pub fn parse(bytes: &[u8]) -> Result<Self, DescriptionError> {
        #[derive(Deserialize)]
        struct Versioned {
            protocol: u32,
        }
        let v: Versioned =
            serde_json::from_slice(bytes).map_err(|e| DescriptionError::Json(e.to_string()))?;
        if v.protocol != PROTOCOL_VERSION {
            return Err(DescriptionError::Version { found: v.protocol });
        }
        let d: Description =
            serde_json::from_slice(bytes).map_err(|e| DescriptionError::Json(e.to_string()))?;
        if d.nodes.is_empty() {
            return Err(DescriptionError::Empty);
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = d.nodes.iter().find(|n| !seen.insert(n.id.as_str())) {
            return Err(DescriptionError::DuplicateId(dup.id.clone()));
        }
        Ok(d)
    }
}

/// Fills in shapes and types the description lacked (a harness that only learns them by running, like
/// the PyTorch one) from the recording's `shapes.json`, when there is one.
pub fn with_recorded_shapes(mut nodes: Vec<GraphNode>, record: &Path) -> Vec<GraphNode> {
    #[derive(Deserialize)]
    struct Recorded {
        shape: Vec<u64>,
        dtype: Option<String>,
    }
    let Ok(text) = std::fs::read_to_string(record.join("shapes.json")) else {
        return nodes;
    };
    let Ok(shapes) = serde_json::from_str::<HashMap<String, Recorded>>(&text) else {
        return nodes;
    };
    for t in nodes
        .iter_mut()
        .flat_map(|n| n.inputs.iter_mut().chain(n.outputs.iter_mut()))
    {
        if let Some(r) = shapes.get(&t.name).filter(|_| t.shape.is_none()) {
            t.shape = Some(r.shape.clone());
            t.dtype = t.dtype.take().or_else(|| r.dtype.clone());
        }
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: Option<Vec<u64>>) -> GraphTensor {
        GraphTensor {
            name: name.into(),
            shape,
            dtype: None,
            producer: None,
        }
    }

    #[test]
    fn a_tensors_bytes_follow_its_shape_and_dtype() {
        let t = |shape: Option<Vec<u64>>, dtype: Option<&str>| GraphTensor {
            dtype: dtype.map(String::from),
            ..tensor("x", shape)
        };
        assert_eq!(
            t(Some(vec![66560, 32768]), Some("int8")).bytes(),
            Some(2_181_038_080)
        );
        assert_eq!(
            t(Some(vec![4, 8]), Some("torch.bfloat16")).bytes(),
            Some(64)
        );
        assert_eq!(t(Some(vec![4, 8]), Some("float64")).bytes(), Some(256));
        assert_eq!(
            t(Some(vec![3]), None).bytes(),
            Some(12),
            "unknown dtype: 4 bytes"
        );
        assert_eq!(
            t(Some(vec![]), Some("float32")).bytes(),
            Some(4),
            "a scalar"
        );
        assert_eq!(t(None, Some("float32")).bytes(), None);
        assert_eq!(
            t(Some(vec![u64::MAX, 2]), None).bytes(),
            None,
            "no overflow"
        );
    }

    #[test]
    fn descriptions_are_checked() {
        let ok = br#"{"protocol": 2, "nodes": [{"id": "a", "op": "relu"}]}"#;
        assert_eq!(Description::parse(ok).map(|d| d.nodes.len()), Ok(1));
        assert_eq!(
            Description::parse(br#"{"protocol": 1, "nodes": []}"#).err(),
            Some(DescriptionError::Version { found: 1 })
        );
        assert_eq!(
            Description::parse(br#"{"protocol": 2, "nodes": []}"#).err(),
            Some(DescriptionError::Empty)
        );
        assert!(matches!(
            Description::parse(b"} warning {"),
            Err(DescriptionError::Json(_))
        ));
        assert!(matches!(
            Description::parse(br#"{"nodes": []}"#),
            Err(DescriptionError::Json(_))
        ));
        let dup = br#"{"protocol": 2, "nodes": [{"id": "a", "op": "x"}, {"id": "a", "op": "y"}]}"#;
        assert_eq!(
            Description::parse(dup).err(),
            Some(DescriptionError::DuplicateId("a".into()))
        );
    }

    #[test]
    fn recorded_shapes_fill_only_what_the_description_lacked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let nodes = vec![GraphNode {
            id: "wpe".into(),
            op: "Embedding".into(),
            kernel: None,
            inputs: vec![tensor("pos", None), tensor("known", Some(vec![7]))],
            outputs: vec![tensor("wpe", None)],
            phase: None,
            forward: None,
            source: None,
        }];
        assert_eq!(
            with_recorded_shapes(nodes.clone(), dir.path())[0].inputs[0].shape_text(),
            "unknown"
        );
        std::fs::write(
            dir.path().join("shapes.json"),
            r#"{"pos": {"shape": [32], "dtype": "int64"}, "known": {"shape": [9], "dtype": "float32"}, "wpe": {"shape": [32, 128], "dtype": "float32"}}"#,
        )
        .expect("write");
        let filled = with_recorded_shapes(nodes, dir.path());
        assert_eq!(filled[0].inputs[0].shape, Some(vec![32]));
        assert_eq!(filled[0].inputs[0].dtype.as_deref(), Some("int64"));
        assert_eq!(
            filled[0].inputs[1].shape,
            Some(vec![7]),
            "a described shape stays"
        );
        assert_eq!(filled[0].outputs[0].shape_text(), "[32, 128]");
    }
}
