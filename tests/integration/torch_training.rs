//! Training-step shrinks end to end with a real torch on the CPU: a training script with no factories is
//! shrunk by capturing its faulting step (a backward fault that only step 3 meets), a model named by
//! factories is shrunk through its whole training step (backward and optimizer faults), and each ends in
//! a `repro.py` that fails the same way alone, from a fresh directory. These tests need torch
//! (`python3 -c "import torch"`); CI installs it. Without it they fail, saying so: they never pass unrun.

use std::path::PathBuf;

use crate::common::histories::linear_history;
use crate::common::repo_builder::{put, Files, RepoBuilder};
use crate::common::{alone, captured, data, first_bad, kept, shrink, shrink_of, start_report};
use cudabisect::report::record::{ShrinkReport, ShrinkStatus};

fn require_torch() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
}

fn fixture(rel: &str) -> String {
    crate::common::fixture_text("torch/training", rel)
}

/// A repository with the training fixture and `config` as its bisect.toml.
fn repo(config: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&dir).unwrap();
    let mut f = Files::new();
    for p in [
        "toy/__init__.py",
        "toy/model.py",
        "train.py",
        "train_amp.py",
        "train_loss_module.py",
    ] {
        put(&mut f, p, fixture(p), false);
    }
    put(&mut f, "bisect.toml", config.to_string(), false);
    let c = b.commit(&[], &f, "training fixture").unwrap();
    b.set_branch("main", c).unwrap();
    b.checkout_main().unwrap();
    (tmp, dir)
}

/// Runs the minimal repro away from the project.
fn run_alone(report: &ShrinkReport, env: &[(&str, &str)]) -> (Option<i32>, String) {
    crate::common::run_repro_alone(crate::common::repro_py(report), None, env)
}

const BASE: &str = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"120s\"\n\n[triage]\nenabled = false\n\n";

#[test]
fn a_training_script_without_factories_is_shrunk_by_capturing_its_faulting_step() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{BASE}[shrink]\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n"
    ));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(r.status, ShrinkStatus::Minimal, "{out}");
    // The fault is in the embedding's own backward, met at step 3 of the script.
    assert_eq!(captured(&r).step, 3, "{r:?}");
    assert_eq!(captured(&r).phase, "backward", "{r:?}");
    assert!(
        captured(&r)
            .forward_trace
            .as_deref()
            .is_some_and(|t| t.contains("toy/model.py")),
        "{r:?}"
    );
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
    let (exit, text) = run_alone(&r, &[]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
    assert!(text.contains("node=emb__Gather__backward"), "{text}");
}

#[test]
fn a_model_from_factories_shrinks_through_its_training_step_to_the_faulting_backward_or_update() {
    require_torch();
    let config = format!(
        "{BASE}[shrink]\nmodel = \"toy.model:build\"\ninputs = \"toy.model:example_inputs\"\noptimizer = \"toy.model:make_optimizer\"\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n"
    );
    let (_tmp, dir) = repo(&config);
    // The example batch reaches row 7: the embedding's backward faults.
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
    assert!(
        r.graph
            .as_deref()
            .is_some_and(|g| g.contains("training step")),
        "{r:?}"
    );
    let (exit, text) = run_alone(&r, &[]);
    assert_eq!(exit, Some(1), "{text}");

    // The update faults: the shrink keeps the optimizer step alone, and repro.py carries the optimizer.
    let (code, r, out) = shrink(&dir, &[("TOY_FAULT", "optimizer")]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&r), ["optimizer_step"], "{out}");
    let (exit, text) = run_alone(&r, &[("TOY_FAULT", "optimizer")]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("node=optimizer_step"), "{text}");
    // Without the planted fault the same repro runs clean: it is the update that fails, nothing else.
    let (exit, text) = run_alone(&r, &[("TOY_FAULT", "none")]);
    assert_eq!(exit, Some(0), "{text}");
}

#[test]
fn a_capture_of_a_script_that_never_fails_says_so() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{BASE}[shrink]\ncapture = true\ndevice = \"cpu\"\ntimeout = \"120s\"\n"
    ));
    let (code, r, out) = shrink(&dir, &[("TOY_FAULT", "none")]);
    assert_ne!(code, 0, "{out}");
    assert_eq!(r.status, ShrinkStatus::Failed, "{out}");
    assert!(
        Some(r.summary.as_str()).is_some_and(|s| s.contains("recorded no failure")),
        "{r:?}"
    );
}

/// The training fixture at one commit of a history: `limit` is where the embedding's backward starts to
/// fault (in `toy/limits.py`, which the backward imports inside its body, as library code often does).
fn files_with_limit(limit: u32, config: &str) -> Files {
    files_with_limit_in("", limit, config)
}

/// [`files_with_limit`] with the package in the folder `src` names (`"src/"`: a src layout).
fn files_with_limit_in(src: &str, limit: u32, config: &str) -> Files {
    let mut f = Files::new();
    let model = fixture("toy/model.py").replace(
        "        if int(idx.max()) >= 3 and",
        "        from toy import limits\n\n        if int(idx.max()) >= limits.LIMIT and",
    );
    assert!(model.contains("limits.LIMIT"));
    put(&mut f, &format!("{src}toy/__init__.py"), "", false);
    put(&mut f, &format!("{src}toy/model.py"), model, false);
    put(
        &mut f,
        &format!("{src}toy/limits.py"),
        format!("LIMIT = {limit}\n"),
        false,
    );
    put(&mut f, "train.py", fixture("train.py"), false);
    put(&mut f, "bisect.toml", config.to_string(), false);
    f
}

#[test]
fn start_on_a_training_script_ends_with_a_bundle_whose_repro_reproduces_with_the_culprits_code() {
    require_torch();
    let config = format!("{BASE}[shrink]\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let commits = linear_history(
        &dir,
        [99, 99, 99, 3, 3, 3].map(|limit| files_with_limit(limit, &config)),
    )
    .unwrap();
    let (code, r, text) = start_report(&dir, &[&format!("{}..main", commits[0])], tmp.path());
    assert_eq!(code, 0, "{text}");
    let r = r.unwrap_or_else(|| panic!("no report: {text}"));
    assert_eq!(first_bad(&r), Some(commits[3].to_string()), "{text}");
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(kept(s), ["emb__Gather__backward"], "{text}");
    assert_eq!(captured(s).phase, "backward");
    // The copied backward imports the project: repro.py says so, and reproduce.sh checks the culprit
    // out and puts it on PYTHONPATH; run from elsewhere, it reproduces.
    let bundle = PathBuf::from(r.bundle.as_deref().unwrap());
    let repro = std::fs::read_to_string(bundle.join("minimal/repro.py")).unwrap();
    assert!(repro.contains("# cudabisect-needs-project: toy"), "{repro}");
    let md = std::fs::read_to_string(bundle.join("REPORT.md")).unwrap();
    assert!(
        md.contains("Captured from the training script: step 3, in the backward phase"),
        "{md}"
    );
    // The forward line that made the failing backward node: the embedding's call of its Function.
    assert!(
        md.contains("The failing backward node was created by the forward call at `")
            && md.contains("toy/model.py:"),
        "{md}"
    );
    let (code, out) = crate::common::reproduce_from_elsewhere(&bundle, &dir, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("an illegal memory access"), "{out}");
    assert!(out.contains("node=emb__Gather__backward"), "{out}");
}

#[test]
fn a_src_layout_found_through_the_repros_pythonpath_is_shrunk_and_reproduces_from_the_bundle() {
    require_torch();
    // What a user writes for a src layout: the repro's own PYTHONPATH, and no [shrink] section.
    let config = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"120s\"\nenv = { PYTHONPATH = \"src\" }\n\n[triage]\nenabled = false\n";
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let commits = linear_history(
        &dir,
        [99, 99, 3, 3].map(|limit| files_with_limit_in("src/", limit, config)),
    )
    .unwrap();
    let (code, r, text) = start_report(&dir, &[&format!("{}..main", commits[0])], tmp.path());
    assert_eq!(code, 0, "{text}");
    let r = r.unwrap_or_else(|| panic!("no report: {text}"));
    assert_eq!(first_bad(&r), Some(commits[2].to_string()), "{text}");
    let s = shrink_of(&r, &text);
    // The harness imports the project as the repro did, and repro.py alone found it the same way.
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(kept(s), ["emb__Gather__backward"], "{text}");
    let bundle = PathBuf::from(r.bundle.as_deref().unwrap());
    let script = std::fs::read_to_string(bundle.join("reproduce.sh")).unwrap();
    assert!(script.contains("$work/src:$work/src/src"), "{script}");
    let (code, out) = crate::common::reproduce_from_elsewhere(&bundle, &dir, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("node=emb__Gather__backward"), "{out}");
}

#[test]
fn large_recorded_values_are_generated_when_the_fault_still_shows_with_them() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{BASE}[shrink]\nmodel = \"toy.model:build_small\"\ninputs = \"toy.model:big_inputs\"\ntrain = true\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n"
    ));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
    let d = data(&r);
    assert!(d.generated, "{r:?}");
    assert!(d.exact_bytes > 8 << 20, "{d:?}");
    assert!(d.bytes < 1 << 20, "{d:?}");
    // It was run alone in fresh processes before it replaced the exact one: every run showed the fault.
    assert_eq!(alone(&r).runs, alone(&r).reproduced, "{d:?}");
    assert!(alone(&r).runs >= 1, "{d:?}");
    // The repro generates the indices (the one past row 2 in its place) and the gradient, and still faults.
    let (exit, text) = run_alone(&r, &[]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
}

#[test]
fn large_recorded_values_stay_exact_when_the_repro_generating_them_does_not_fault_alone() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{BASE}[shrink]\nmodel = \"toy.model:build_small\"\ninputs = \"toy.model:big_inputs\"\ntrain = true\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\nenv = {{ TOY_FAULT_NEEDS = \"exact\" }}\n"
    ));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
    let d = data(&r);
    // Generated indices reach past the table many times and fail another way: the exact repro stays,
    // says why, and was itself run alone and faulted.
    assert!(!d.generated, "{d:?}");
    assert!(d.bytes > 8 << 20, "{d:?}");
    let note = d.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("did not fault when run alone (0 of 1 runs did"),
        "{d:?}"
    );
    assert_eq!(alone(&r).reproduced, 1, "{d:?}");
    let (exit, text) = run_alone(&r, &[("TOY_FAULT_NEEDS", "exact")]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
}

#[test]
fn a_custom_op_backward_is_carried_with_its_register_autograd_into_a_standalone_repro() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{BASE}[shrink]\nmodel = \"toy.model:build_op\"\ninputs = \"toy.model:example_inputs\"\ntrain = true\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n"
    ));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    let kept = kept(&r);
    assert!(
        kept.len() == 1 && kept[0].ends_with("__backward"),
        "{kept:?} {out}"
    );
    // repro.py registers both ops again, and the backward formula; it runs away from the project.
    let (exit, text) = run_alone(&r, &[]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
    let repro = std::fs::read_to_string(r.minimal_model.as_deref().unwrap()).unwrap();
    assert!(
        repro.contains(".register_autograd(_gather_bwd, setup_context=_gather_setup)"),
        "{repro}"
    );
    assert!(repro.contains("toy::gather_backward"), "{repro}");
}

#[test]
fn a_loss_that_is_a_module_of_the_users_own_class_is_revived_into_a_standalone_repro() {
    require_torch();
    let (_tmp, dir) = repo(&BASE.replace("\"train.py\"", "\"train_loss_module.py\""));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(r.status, ShrinkStatus::Minimal, "{out}");
    assert_eq!(captured(&r).phase, "loss", "{r:?}");
    assert_eq!(kept(&r), ["loss"], "{out}");
    // repro.py rebuilds the loss from its class's source (its buffer and the library loss inside from
    // the recorded state), so it runs away from the project, where `toy` cannot be imported.
    let repro = std::fs::read_to_string(r.minimal_model.as_deref().unwrap()).unwrap();
    assert!(repro.contains("class ScoredLoss(nn.Module):"), "{repro}");
    assert!(
        !repro.contains("import toy") && !repro.contains("from toy"),
        "{repro}"
    );
    let (exit, text) = run_alone(&r, &[]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
}

#[test]
fn a_step_under_autocast_is_captured_and_replayed_under_the_same_autocast() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{}[shrink]\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n",
        BASE.replace("train.py", "train_amp.py")
    ));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
    // The capture noted the step's autocast, which the harness runs it under: no note of a difference.
    let capture = PathBuf::from(r.out_dir.as_str())
        .parent()
        .unwrap()
        .join("capture/capture.json");
    /// What the capture saved of the step's autocast.
    #[derive(Debug, serde::Deserialize)]
    struct Autocast {
        device_type: String,
        dtype: String,
    }
    #[derive(Debug, serde::Deserialize)]
    struct Saved {
        autocast: Autocast,
    }
    let saved: Saved = serde_json::from_str(&std::fs::read_to_string(&capture).unwrap()).unwrap();
    assert_eq!(saved.autocast.device_type, "cpu", "{saved:?}");
    assert_eq!(saved.autocast.dtype, "bfloat16", "{saved:?}");
    assert!(
        !captured(&r).notes.iter().any(|t| t.contains("autocast")),
        "{r:?}"
    );
}

#[test]
fn a_forward_that_faults_only_under_autocast_faults_in_the_repro_alone() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{}[shrink]\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n",
        BASE.replace("train.py", "train_amp.py")
    ));
    let (code, r, out) = shrink(&dir, &[("TOY_FAULT", "autocast")]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(captured(&r).phase, "forward", "{r:?}");
    assert_eq!(alone(&r).reproduced, 1, "{r:?}");
    let repro = std::fs::read_to_string(r.minimal_model.as_deref().unwrap()).unwrap();
    assert!(repro.contains("'dtype': 'bfloat16'"), "{repro}");
    let (exit, text) = run_alone(&r, &[("TOY_FAULT", "autocast")]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
}

#[test]
fn a_users_own_step_function_is_captured_like_a_script() {
    require_torch();
    let (_tmp, dir) = repo(&format!(
        "{BASE}[shrink]\nstep = \"toy.model:train_step\"\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n"
    ));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(captured(&r).step, 3, "{r:?}");
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
}
