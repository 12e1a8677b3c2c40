//! The native harness through the real binary on the CPU reference: graph description, fault attribution,
//! record and replay, subgraphs on recorded inputs, in-place state, and one-line errors for bad models.

use std::path::{Path, PathBuf};
use std::process::Command;

use cudabisect::classify::{classify, Exit, FaultClass};
use cudabisect::harness::tensor::Tensor;
use cudabisect::protocol::types::Description;

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/models")
        .join(name)
}

fn harness(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .arg("harness")
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn describe_lists_nodes_in_execution_order_with_shapes_and_producers() {
    let (code, out, _) = harness(&["describe", s(&model("transformer_block.toml"))]);
    assert_eq!(code, 0);
    let v: Description = serde_json::from_str(&out).unwrap();
    let ids: Vec<&str> = v.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids.len(), 19);
    assert_eq!((ids[0], ids[18]), ("embed", "pool"));
    let scores = &v.nodes[6];
    assert_eq!(scores.op, "matmul");
    assert_eq!(scores.inputs[1].name, "kt");
    assert_eq!(scores.inputs[1].producer.as_deref(), Some("k_t"));
    assert_eq!(scores.outputs[0].shape, Some(vec![32, 32]));
    /// The model's outputs, which the native harness adds to its description.
    #[derive(serde::Deserialize)]
    struct Outputs {
        outputs: Vec<String>,
    }
    let o: Outputs = serde_json::from_str(&out).unwrap();
    assert_eq!(o.outputs, ["pooled"]);
}

#[test]
fn a_clean_run_balances_its_markers_and_prints_the_outputs() {
    let (code, out, _) = harness(&["run", s(&model("mlp.toml")), "--backend", "cpu"]);
    assert_eq!(code, 0, "{out}");
    let begins = out
        .lines()
        .filter(|l| l.starts_with("@@cudabisect") && l.ends_with(" begin"))
        .count();
    let ends = out
        .lines()
        .filter(|l| l.starts_with("@@cudabisect") && l.ends_with(" end"))
        .count();
    assert_eq!((begins, ends), (7, 7));
    assert!(
        out.contains("harness: backend cpu: the CPU reference"),
        "{out}"
    );
    assert!(
        out.contains("harness: output probs [16, 10] sum=1.6"),
        "{out}"
    );
    assert_eq!(classify(Exit::Code(code), &out).class, FaultClass::None);
}

#[test]
fn an_out_of_range_gather_is_charged_to_its_node_buffer_and_index() {
    let (code, out, _) = harness(&["run", s(&model("shrink_one_node.toml")), "--backend", "cpu"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("node b2_lookup (embedding) reads row 268435456 of lookup_table (64 rows); the index is lookup_ids[15]"), "{out}");
    let sig = classify(Exit::Code(code), &out);
    assert_eq!(sig.class, FaultClass::IllegalAddress);
    assert_eq!(sig.kernel.as_deref(), Some("embedding_gather"));
    assert_eq!(sig.site.as_deref(), Some("node b2_lookup"));
    assert!(
        sig.summary.starts_with("cpu-reference:"),
        "labelled as the CPU's finding: {}",
        sig.summary
    );
    // Nothing after the faulting node ran.
    assert!(!out.contains("node=b2_mix"), "{out}");
}

#[test]
fn a_subgraph_on_recorded_inputs_equals_the_same_nodes_in_the_full_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, part) = (tmp.path().join("full"), tmp.path().join("part"));
    let (code, out, _) = harness(&[
        "run",
        s(&model("transformer_block.toml")),
        "--backend",
        "cpu",
        "--record",
        s(&full),
    ]);
    assert_eq!(code, 0, "{out}");
    /// What `--record` wrote of one tensor.
    #[derive(serde::Deserialize)]
    struct Recorded {
        node: String,
    }
    /// `manifest.json`: the recorded tensors by name.
    #[derive(serde::Deserialize)]
    struct Manifest {
        tensors: std::collections::BTreeMap<String, Recorded>,
    }
    let manifest: Manifest =
        serde_json::from_str(&std::fs::read_to_string(full.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest.tensors["s"].node, "scores");
    assert_eq!(manifest.tensors.len(), 19);
    let keep = "attn,context,o_proj,residual1,ln2";
    let (code, out, _) = harness(&[
        "run",
        s(&model("transformer_block.toml")),
        "--backend",
        "cpu",
        "--keep",
        keep,
        "--inputs",
        s(&full),
        "--record",
        s(&part),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().filter(|l| l.ends_with(" begin")).count(), 5);
    for t in ["p", "c", "o", "r1", "h2"] {
        let a = Tensor::read_npy(&part.join(format!("{t}.npy"))).unwrap();
        let b = Tensor::read_npy(&full.join(format!("{t}.npy"))).unwrap();
        assert_eq!(a, b, "{t}");
    }
    assert!(
        !part.join("s.npy").exists(),
        "boundary inputs are read, not re-recorded"
    );
}

#[test]
fn a_subgraph_without_its_recorded_inputs_is_refused_before_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, out, _) = harness(&[
        "run",
        s(&model("transformer_block.toml")),
        "--backend",
        "cpu",
        "--keep",
        "context",
    ]);
    assert_eq!(code, 2);
    assert!(
        out.contains("tensor \"p\" is made by node \"attn\", which is not kept: pass --inputs"),
        "{out}"
    );
    assert!(!out.contains("@@cudabisect"), "nothing ran: {out}");
    let (code, out, _) = harness(&[
        "run",
        s(&model("transformer_block.toml")),
        "--backend",
        "cpu",
        "--keep",
        "context",
        "--inputs",
        s(tmp.path()),
    ]);
    assert_eq!(code, 2);
    assert!(
        out.contains("--inputs: tensor \"p\" (made by node \"attn\")"),
        "{out}"
    );
    let (code, out, _) = harness(&[
        "run",
        s(&model("mlp.toml")),
        "--backend",
        "cpu",
        "--keep",
        "nope",
    ]);
    assert_eq!(code, 2);
    assert!(out.contains("--keep: no node \"nope\""), "{out}");
}

#[test]
fn state_left_by_an_inplace_node_is_needed_to_reproduce() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("rec");
    let m = model("shrink_two_nodes.toml");
    let (code, out, _) = harness(&["run", s(&m), "--backend", "cpu", "--record", s(&rec)]);
    assert_eq!(code, 1, "{out}");
    let alone = harness(&[
        "run",
        s(&m),
        "--backend",
        "cpu",
        "--keep",
        "b3_slot_lookup",
        "--inputs",
        s(&rec),
    ]);
    assert_eq!(
        alone.0, 0,
        "the lookup alone reads the declared slot table: {}",
        alone.1
    );
    let pair = harness(&[
        "run",
        s(&m),
        "--backend",
        "cpu",
        "--keep",
        "b1_cache_update,b3_slot_lookup",
        "--inputs",
        s(&rec),
    ]);
    assert_eq!(pair.0, 1, "{}", pair.1);
    assert!(
        pair.1
            .contains("node b3_slot_lookup (embedding) reads row 268435456 of slot_table"),
        "{}",
        pair.1
    );
}

#[test]
fn bad_model_files_get_one_line_errors_naming_node_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(model("mlp.toml")).unwrap();
    let cases = [
        (
            text.replace("op = \"gelu\"", "op = \"swish\""),
            "node \"act\": op: unknown op \"swish\"",
        ),
        (
            text.replace("shape = [64, 10]", "shape = [63, 10]"),
            "node \"fc2\": inputs: matmul of [16, 64] by [63, 10]",
        ),
        (
            text.replace("inputs = [\"x\", \"w1\"]", "inputs = [\"x\", \"w7\"]"),
            "node \"fc1\": inputs[1]: tensor \"w7\" is not defined",
        ),
        (
            text.replace(
                "inputs = [\"table\", \"ids\"]",
                "inputs = [\"table\", \"probs\"]",
            ),
            "cycle through nodes",
        ),
        (
            text.replace("init = \"zeros\"", "init = \"file\"\nfile = \"b2.npy\""),
            "tensor \"b2\" (tensor #6): file: cannot read",
        ),
    ];
    for (i, (body, want)) in cases.iter().enumerate() {
        let p = tmp.path().join(format!("m{i}.toml"));
        std::fs::write(&p, body).unwrap();
        let (code, out, err) = harness(&["run", s(&p), "--backend", "cpu"]);
        assert_eq!(code, 2, "{want}");
        assert!(out.is_empty(), "nothing ran: {out}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{err} lacks {want}");
    }
    std::fs::write(tmp.path().join("b2.npy"), b"not numpy").unwrap();
    let p = tmp.path().join("m4.toml");
    let (code, _, err) = harness(&["run", s(&p), "--backend", "cpu"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("file: ") && err.contains("not a .npy file"),
        "{err}"
    );
}

#[test]
fn values_files_are_read_as_numpy_arrays() {
    let tmp = tempfile::tempdir().unwrap();
    Tensor::i32(vec![3], vec![2, 0, 1])
        .write_npy(&tmp.path().join("ids.npy"))
        .unwrap();
    let body = "[[tensor]]\nname = \"ids\"\nshape = [3]\ndtype = \"i32\"\ninit = \"file\"\nfile = \"ids.npy\"\n\n[[tensor]]\nname = \"t\"\nshape = [3, 1]\ninit = \"range\"\nstart = 10\n\n[[node]]\nid = \"g\"\nop = \"embedding\"\ninputs = [\"t\", \"ids\"]\noutputs = [\"y\"]\n";
    std::fs::write(tmp.path().join("m.toml"), body).unwrap();
    let rec = tmp.path().join("rec");
    let (code, out, _) = harness(&[
        "run",
        s(&tmp.path().join("m.toml")),
        "--backend",
        "cpu",
        "--record",
        s(&rec),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        Tensor::read_npy(&rec.join("y.npy")).unwrap(),
        Tensor::f32(vec![3, 1], vec![12.0, 10.0, 11.0])
    );
}

#[test]
fn without_a_usable_device_cuda_is_refused_and_auto_says_it_fell_back() {
    // No driver here; on a GPU machine an empty CUDA_VISIBLE_DEVICES hides every device: either way
    // nothing is usable, so the test means the same on every machine.
    let hidden = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
            .arg("harness")
            .args(args)
            .env("CUDA_VISIBLE_DEVICES", "")
            .output()
            .expect("runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = hidden(&["run", s(&model("mlp.toml")), "--backend", "cuda"]);
    assert_eq!(code, 6, "{out}");
    assert!(out.starts_with("error: "), "{out}");
    assert_eq!(classify(Exit::Code(code), &out).class, FaultClass::Infra);
    let (code, out) = hidden(&["run", s(&model("mlp.toml")), "--backend", "auto"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("harness: backend auto -> cpu ("), "{out}");
}

#[test]
fn build_checks_the_model_and_its_kernels_before_any_run() {
    let (code, out, _) = harness(&[
        "build",
        s(&model("transformer_block.toml")),
        "--backend",
        "cpu",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("harness: build ok: 19 nodes, 9 kernels ready for cpu"),
        "{out}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(model("mlp.toml"))
        .unwrap()
        .replace("op = \"gelu\"", "op = \"gelu\"\nkernel = \"my_gelu\"");
    let p = tmp.path().join("m.toml");
    std::fs::write(&p, text).unwrap();
    let (code, _, err) = harness(&["build", s(&p), "--backend", "cpu"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no kernel source defines `extern \"C\" __global__ void my_gelu(...)`"),
        "{err}"
    );
}

#[test]
fn a_model_that_cannot_run_anywhere_is_refused_on_the_cpu_too() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(model("mlp.toml")).unwrap();
    // H07: a kernel no source defines; H14: a model with no nodes; H17: a negative layernorm eps.
    let no_kernel = base.replacen(
        "op = \"matmul\"",
        "op = \"matmul\"\nkernel = \"not_there\"",
        1,
    );
    assert_ne!(no_kernel, base, "the fixture has a matmul node");
    let empty = "[model]\nname = \"empty\"\noutputs = []\n".to_string();
    let cases = [
        ("no_kernel.toml", no_kernel, "no kernel source defines"),
        ("empty.toml", empty, "has no [[node]]"),
        (
            "eps.toml",
            std::fs::read_to_string(model("transformer_block.toml"))
                .unwrap()
                .replacen("eps = 1e-05", "eps = -1.0", 1),
            "eps: -1 must be a positive number",
        ),
    ];
    for (name, text, says) in cases {
        let path = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        let (code, out, err) = harness(&["run", s(&path), "--backend", "cpu"]);
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert!(err.contains(says), "{name}: {err}");
    }
}
