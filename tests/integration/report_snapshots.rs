//! REPORT.md as a maintainer reads it first, for a PyTorch, a JAX and a native-harness bundle: rendered from
//! the reports of real runs (`fixtures/reports/`: a backward fault three modules deep captured from a
//! training script, a JAX training step with no factories, the demo's native model) and snapshotted, with
//! what every report must hold checked apart from the snapshot.

use cudabisect::report::bundle::{render, BundleInput};
use cudabisect::report::environment::Environment;
use cudabisect::report::record::Report;

fn report(name: &str) -> Report {
    let text = crate::common::fixture_text("reports", &format!("{name}.json"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// REPORT.md for a fixture report, with `reproduce` as the bundle writer would give it.
fn report_md(name: &str, reproduce: &str) -> String {
    report_md_of(report(name), reproduce)
}

/// REPORT.md for report `r`.
fn report_md_of(r: Report, reproduce: &str) -> String {
    let env = Environment {
        cudabisect: "cudabisect 0.1.0".into(),
        os: Some("Linux 6.8.0 x86_64".into()),
        gpus: vec!["NVIDIA H200, 580.82.07, 143771 MiB".into()],
        cuda_driver: Some("13.0".into()),
        python: Some("Python 3.11.7".into()),
        ..Environment::default()
    };
    let search = r
        .probes
        .iter()
        .filter(|p| p.role == cudabisect::report::record::ProbeRole::Search)
        .count();
    let input = BundleInput {
        root: "/nonexistent".into(),
        commit: r.first_bad.clone(),
        good_parents: r.good_parents.clone(),
        found_by: Some(format!(
            "bisecting {} commits: {} probes ({search} in the search), CUDA_LAUNCH_BLOCKING=1",
            r.range_size,
            r.probes.len()
        )),
        target: r.target.clone(),
        triage: r.triage.as_ref(),
        shrink: r.shrink.as_ref(),
        report_json: serde_json::Value::Null,
        config_text: "",
        log_dirs: Vec::new(),
        extra_files: Vec::new(),
        backend: Some("cpu".into()),
        include_binary: false,
        full_repro: None,
    };
    render(&input, &env, Some(reproduce), None)
}

/// What every REPORT.md holds, whatever the framework: no path into cudabisect's worktrees or run
/// directories, the culprit checked again in one command.
fn holds_for_every_bundle(md: &str) {
    for leak in [".git/cudabisect", "/home/dev", "worktree"] {
        assert!(!md.contains(leak), "REPORT.md names `{leak}`:\n{md}");
    }
    assert!(md.contains("cudabisect start "), "{md}");
    assert!(md.contains("## Reproduce"), "{md}");
}

#[test]
fn a_pytorch_bundle_reads_with_its_traceback_and_no_module_called_a_kernel() {
    let md = report_md("torch", "./reproduce.sh");
    holds_for_every_bundle(&md);
    assert!(md.contains("Traceback of the faulting run"), "{md}");
    assert!(md.contains("deep/ops.py:"), "{md}");
    // The faulting module is a module, not a kernel: the kernel column is empty, the title names none.
    assert!(!md.contains("in Mixer"), "{md}");
    assert!(!md.contains("| Mixer |"), "{md}");
    insta::assert_snapshot!("report_torch", md);
}

#[test]
fn a_jax_bundle_reads_with_its_captured_step() {
    let md = report_md("jax", "./reproduce.sh");
    holds_for_every_bundle(&md);
    assert!(md.contains("toy/ops.py:"), "{md}");
    insta::assert_snapshot!("report_jax", md);
}

#[test]
fn a_native_bundle_names_its_kernel() {
    let md = report_md(
        "native",
        "CUDA_LAUNCH_BLOCKING=1 cudabisect harness run minimal/model.toml --backend cpu   # or: ./reproduce.sh",
    );
    holds_for_every_bundle(&md);
    // The native harness launches its own kernels: there the kernel is named.
    assert!(
        md.contains("| `embed` | embedding | engine_gather |"),
        "{md}"
    );
    insta::assert_snapshot!("report_native", md);
}

#[test]
fn the_node_the_fault_was_located_in_names_the_kernel_that_faulted_not_its_function() {
    // A captured call beside the loss: its label is the function it called (`forward`), while the fault
    // was in the Triton kernel that function launched.
    let mut r = report("torch");
    let shrink = r.shrink.as_mut().expect("a shrink");
    let node = shrink.kept[0].id.clone();
    shrink.kept[0].op = "loss_forward".into();
    shrink.kept[0].kernel = Some("forward".into());
    shrink.located_node = Some(node.clone());
    shrink.signature.as_mut().expect("a signature").kernel = Some("_hash_embed_kernel".into());
    let md = report_md_of(r, "sh reproduce.sh");
    let row = md
        .lines()
        .find(|l| l.starts_with(&format!("| `{node}` |")))
        .unwrap_or_else(|| panic!("no row for {node}:\n{md}"));
    assert!(row.contains("| _hash_embed_kernel |"), "{row}");
    assert!(!row.contains("| forward |"), "{row}");
}

#[test]
fn values_read_from_cut_nodes_are_called_exact_only_when_they_are() {
    // A kept node that reads a cut node's output: REPORT.md says how repro_data.pt holds it. Where the
    // large values were generated (the Liger-Kernel MoE bundle), it once still said "the exact tensors".
    let mut r = report("torch");
    let shrink = r.shrink.as_mut().expect("a shrink");
    let input = &mut shrink.kept[0].inputs[0];
    input.producer = Some("cut_node".into());
    let exact = report_md_of(r.clone(), "sh reproduce.sh");
    assert!(
        exact.contains("from cut nodes: the exact tensors the full model produced"),
        "{exact}"
    );
    r.shrink
        .as_mut()
        .unwrap()
        .data
        .as_mut()
        .expect("data")
        .generated = true;
    let generated = report_md_of(r, "sh reproduce.sh");
    assert!(
        generated.contains("the large ones generated from their recorded shape, dtype and range"),
        "{generated}"
    );
    assert!(!generated.contains("the exact tensors"), "{generated}");
}
