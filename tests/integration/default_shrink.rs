//! The minimal repro by default: `start` with a bisect.toml of `[repro]` only (no `[shrink]`) on training
//! packages the way users write them, with a real torch, a real `transformers` and a real JAX on the CPU.
//! Each ends with a `repro.py` that compiles and fails the same way alone, in a fresh directory (with the
//! culprit's code on `PYTHONPATH` where the copied code imports the project): a backward fault three
//! modules deep in a model FX cannot trace, at step 4, reading the script's own globals; the user's own
//! loss on a `transformers` model's output; factories with no `train`; a JAX script with no factories.
//! A repro that is not a Python program is not shrunk, and the report says why in words. These tests need
//! torch, transformers and jax (CI installs them); without them they fail, saying so.

use std::path::{Path, PathBuf};

use crate::common::histories::linear_history;
use crate::common::repo_builder::{put, Files};
use crate::common::{
    captured, first_bad, kept, repro_py, run_repro_alone, shrink_of, start_report,
};
use cudabisect::report::record::{ParentCheck, Report, ShrinkReport, ShrinkStatus};

fn realistic(rel: &str) -> String {
    crate::common::fixture_text("torch/realistic", rel)
}

/// A history of four commits of the package's `files` and bisect.toml (`config`), where the file at `path`
/// holds `good` in the first two and `bad` from the third on.
fn history(
    dir: &Path,
    files: &[(&str, String)],
    (path, good, bad): (&str, &str, &str),
    config: &str,
) -> Vec<git2::Oid> {
    linear_history(
        dir,
        [good, good, bad, bad].map(|text| {
            let mut f = Files::new();
            for (p, t) in files {
                put(&mut f, p, t.clone(), false);
            }
            put(&mut f, path, format!("{text}\n"), false);
            put(&mut f, "bisect.toml", config.to_string(), false);
            f
        }),
    )
    .unwrap()
}

fn start(dir: &Path, first: git2::Oid, scratch: &Path) -> (i32, Report, String) {
    let (code, report, text) =
        start_report(dir, &[&format!("{first}..main"), "--no-triage"], scratch);
    (
        code,
        report.unwrap_or_else(|| panic!("no report: {text}")),
        text,
    )
}

/// `start` on a package of the realistic fixtures (`files`), its limit file going from `good` to `bad` at
/// the third of four commits, with bisect.toml `config`: it names that commit. The report, and the
/// repository's directory.
fn started_on_realistic(
    tmp: &Path,
    files: &[&str],
    limits: (&str, &str, &str),
    config: &str,
) -> (Report, PathBuf, String) {
    let dir = tmp.join("repo");
    let files: Vec<(&str, String)> = files.iter().map(|p| (*p, realistic(p))).collect();
    let commits = history(&dir, &files, limits, config);
    let (code, r, text) = start(&dir, commits[0], tmp);
    assert_eq!(code, 0, "{text}");
    assert_eq!(first_bad(&r), Some(commits[2].to_string()), "{text}");
    (r, dir, text)
}

/// The minimal repro, run alone from a fresh directory with the project at the culprit on PYTHONPATH.
fn reproduces_alone(report: &ShrinkReport, project: &Path, node: &str) {
    let repro = repro_py(report).to_path_buf();
    let text = std::fs::read_to_string(&repro).unwrap();
    let compiled = std::process::Command::new("python3")
        .args(["-m", "py_compile"])
        .arg(&repro)
        .output()
        .unwrap();
    assert!(compiled.status.success(), "{text}");
    let (exit, out) = run_repro_alone(&repro, Some(project), &[]);
    assert_eq!(exit, Some(1), "{out}\n{text}");
    assert!(out.contains("an illegal memory access"), "{out}");
    assert!(out.contains(&format!("node={node}")), "{out}");
}

const REPRO_DEEP: &str =
    "[repro]\ncommand = [\"python3\", \"train_deep.py\"]\ntimeout = \"180s\"\n";

#[test]
fn a_backward_fault_three_modules_deep_at_step_four_is_shrunk_with_no_shrink_section() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let (r, dir, text) = started_on_realistic(
        tmp.path(),
        &[
            "deep/__init__.py",
            "deep/ops.py",
            "deep/model.py",
            "train_deep.py",
        ],
        ("deep/limits.py", "LIMIT = 99", "LIMIT = 3"),
        REPRO_DEEP,
    );
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(
        s.path.as_deref(),
        Some("capture of the repro command"),
        "{s:?}"
    );
    assert_eq!(captured(s).step, 4, "{s:?}");
    assert_eq!(captured(s).phase, "backward", "{s:?}");
    // Down to the faulting Function inside the second block's mixer: not the model's backward, nor
    // the mixer's.
    assert_eq!(
        kept(s),
        ["body__encoder__mixer_1__RowGather__backward"],
        "{text}"
    );
    assert!(
        s.graph
            .as_deref()
            .is_some_and(|g| g.contains("descended along the fault")),
        "{s:?}"
    );
    // At the parent (the limit back at 99) the same subgraph runs clean: the script's state is
    // replayed, the project's constants are the commit's own.
    assert_eq!(s.parent_check, Some(ParentCheck::Passed), "{s:?}");
    reproduces_alone(s, &dir, "body__encoder__mixer_1__RowGather__backward");
}

#[test]
fn the_users_own_loss_on_a_transformers_model_output_is_a_node_of_its_own() {
    crate::common::require_python(
        "import torch, transformers",
        "a real torch and transformers: pip install torch transformers",
    );
    let tmp = tempfile::tempdir().unwrap();
    let config = "[repro]\ncommand = [\"python3\", \"train_hf.py\"]\ntimeout = \"300s\"\nenv = { HF_HUB_OFFLINE = \"1\", TRANSFORMERS_OFFLINE = \"1\" }\n";
    let (r, dir, text) = started_on_realistic(
        tmp.path(),
        &["hfloss/__init__.py", "hfloss/loss.py", "train_hf.py"],
        ("hfloss/limits.py", "LIMIT = 99", "LIMIT = 60"),
        config,
    );
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(captured(s).step, 3, "{s:?}");
    // The GPT-2 (keyword inputs, a ModelOutput) runs whole; the fused loss on its logits is the node.
    assert_eq!(kept(s), ["loss"], "{text}");
    assert!(s.kept[0].op.contains("fused_cross_entropy"), "{s:?}");
    reproduces_alone(s, &dir, "loss");
}

#[test]
fn a_call_on_a_detached_output_that_faults_beside_the_loss_is_a_node_of_its_own() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let config = "[repro]\ncommand = [\"python3\", \"train_feat.py\"]\ntimeout = \"180s\"\n";
    let (r, dir, text) = started_on_realistic(
        tmp.path(),
        &[
            "hashfeat/__init__.py",
            "hashfeat/features.py",
            "train_feat.py",
        ],
        ("hashfeat/limits.py", "LIMIT = 99", "LIMIT = 60"),
        config,
    );
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(captured(s).step, 3, "{s:?}");
    assert_eq!(captured(s).phase, "loss", "{s:?}");
    // No gradient flows through the call, and it never returned: it is the loss phase's node, not the
    // loss that came after it.
    assert_eq!(kept(s), ["loss"], "{text}");
    assert!(s.kept[0].op.contains("hashed_features"), "{s:?}");
    reproduces_alone(s, &dir, "loss");
}

#[test]
fn factories_without_train_shrink_a_backward_fault_through_the_training_step() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let training = |p: &str| crate::common::fixture_text("torch/training", p);
    let model = training("toy/model.py").replace(
        "        if int(idx.max()) >= 3 and",
        "        from toy import limits\n\n        if int(idx.max()) >= limits.LIMIT and",
    );
    let files = vec![
        ("toy/__init__.py", String::new()),
        ("toy/model.py", model),
        ("train.py", training("train.py")),
    ];
    // Factories, no `train`, no device: the fault is in the backward only, on a machine with no GPU.
    let config = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"180s\"\n\n[shrink]\nmodel = \"toy.model:build\"\ninputs = \"toy.model:example_inputs\"\nconfirm = 2\n";
    let commits = history(
        &dir,
        &files,
        ("toy/limits.py", "LIMIT = 99", "LIMIT = 3"),
        config,
    );
    let (code, r, text) = start(&dir, commits[0], tmp.path());
    assert_eq!(code, 0, "{text}");
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(
        s.path.as_deref(),
        Some("factories (the training step)"),
        "{s:?}"
    );
    assert_eq!(kept(s), ["emb__Gather__backward"], "{text}");
    reproduces_alone(s, &dir, "emb__Gather__backward");

    // `shrink` has no bisection to tell the phase: the factories' forward shows nothing, and the capture
    // of the repro command gives the repro; the report says both.
    let (code, r, out) = crate::common::shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        r.path.as_deref(),
        Some("capture of the repro command"),
        "{r:?}"
    );
    assert_eq!(r.paths[0].path, "factories", "{r:?}");
    assert!(r.paths[0].outcome.contains("none"), "{r:?}");
    assert_eq!(kept(&r), ["emb__Gather__backward"], "{out}");
}

#[test]
fn a_jax_training_script_without_factories_is_captured_and_shrunk() {
    crate::common::require_python("import jax", "a real JAX: pip install 'jax[cpu]'");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let jax = |p: &str| crate::common::fixture_text("jax", p);
    let files: Vec<(&str, String)> = ["toy/__init__.py", "toy/fn.py", "toy/ops.py", "train.py"]
        .iter()
        .map(|p| (*p, jax(p)))
        .collect();
    let config = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"180s\"\nenv = { JAX_PLATFORMS = \"cpu\" }\n";
    let commits = history(
        &dir,
        &files,
        ("toy/rows.py", "ROWS = 99", "ROWS = 6"),
        config,
    );
    let (code, r, text) = start(&dir, commits[0], tmp.path());
    assert_eq!(code, 0, "{text}");
    assert_eq!(first_bad(&r), Some(commits[2].to_string()), "{text}");
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(captured(s).framework.as_deref(), Some("jax"), "{s:?}");
    assert_eq!(
        captured(s).function.as_deref(),
        Some("toy.fn:train_step"),
        "{s:?}"
    );
    let kept = kept(s);
    assert_eq!(kept.len(), 1, "{text}");
    assert!(kept[0].contains("callback"), "{kept:?}");
    // The captured arguments are the culprit's (its table has 6 rows): the check at the parent cannot
    // tell, and says so rather than "reproduced".
    assert_eq!(
        s.parent_check,
        Some(ParentCheck::ReproducedOnCapturedValues),
        "{s:?}"
    );
    assert!(
        s.minimal_model
            .as_deref()
            .is_some_and(|m| m.ends_with("repro.py")),
        "{s:?}"
    );
}

#[test]
fn a_capture_that_a_preloaded_library_hides_from_the_hook_runs_again_in_fresh_processes() {
    crate::common::require_python("import jax", "a real JAX: pip install 'jax[cpu]'");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    // An installed library (outside the project, on PYTHONPATH) that binds `jax.jit` when imported: the
    // worker's warm interpreter imported it before a capture's hook could arm, so the jitted step is
    // hidden from the warm capture; fresh processes arm the hook at `import jax`, before the library.
    let site = tmp.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("jitlib.py"), "from jax import jit\n").unwrap();
    let jax = |p: &str| crate::common::fixture_text("jax", p);
    let mut files: Vec<(&str, String)> = ["toy/__init__.py", "toy/ops.py", "train.py"]
        .iter()
        .map(|p| (*p, jax(p)))
        .collect();
    let step = jax("toy/fn.py").replace("@jax.jit", "@jitlib.jit");
    files.push(("toy/fn.py", format!("import jitlib\n{step}")));
    let config = format!(
        "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"180s\"\nenv = {{ JAX_PLATFORMS = \"cpu\", PYTHONPATH = {:?} }}\n",
        site.display().to_string()
    );
    let commits = history(
        &dir,
        &files,
        ("toy/rows.py", "ROWS = 99", "ROWS = 6"),
        &config,
    );
    let (code, r, text) = start(&dir, commits[0], tmp.path());
    assert_eq!(code, 0, "{text}");
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    let runs = captured(s).runs.clone().unwrap_or_default();
    assert!(runs.starts_with("cold after warm: "), "{s:?}");
    assert_eq!(
        captured(s).function.as_deref(),
        Some("toy.fn:train_step"),
        "{s:?}"
    );
}

#[test]
fn a_repro_that_is_not_a_python_program_is_not_shrunk_and_the_report_says_why() {
    // With no [shrink] section, and with one that only tunes the shrink (C20): neither asks for a
    // capture of a shell script.
    for extra in ["", "\n[shrink]\nconfirm = 2\n"] {
        not_a_python_program(extra);
    }
}

fn not_a_python_program(extra: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let script = "#!/bin/sh\nif [ \"$(cat limit.txt)\" -lt 10 ]; then echo 'CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)' >&2; exit 1; fi\n";
    let config = format!("[repro]\ncommand = [\"sh\", \"run.sh\"]\ntimeout = \"60s\"\n{extra}");
    let commits = history(
        &dir,
        &[("run.sh", script.to_string())],
        ("limit.txt", "99", "3"),
        &config,
    );
    let (code, r, text) = start(&dir, commits[0], tmp.path());
    assert_eq!(code, 0, "{text}");
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::NotApplicable, "{text}");
    assert!(s.summary.contains("not a Python program"), "{s:?}");
    assert_eq!(
        text.matches("not a Python program").count(),
        1,
        "said once: {text}"
    );
}

#[test]
fn a_custom_op_registered_in_the_script_is_descended_to_and_carried_into_a_standalone_repro() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let config = "[repro]\ncommand = [\"python3\", \"train_op.py\"]\ntimeout = \"120s\"\n";
    history(
        &dir,
        &[("train_op.py", realistic("train_op.py"))],
        ("unused.txt", "0", "0"),
        config,
    );
    let (code, r, out) = crate::common::shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    // The op's own backward, found inside the traceable submodule of the model kept whole.
    assert_eq!(kept(&r), ["model__inner__scale_default__backward"], "{out}");
    let text = std::fs::read_to_string(r.minimal_model.as_deref().unwrap()).unwrap();
    assert!(
        text.contains("# cudabisect-needs-project: \n"),
        "needs nothing of the project: {text}"
    );
    let (exit, out) = run_repro_alone(repro_py(&r), None, &[]);
    assert_eq!(exit, Some(1), "{out}\n{text}");
    assert!(out.contains("an illegal memory access"), "{out}");
}

/// The review's CP01 script: a Function the script itself defines faults in its backward at step 3,
/// reading a module-level flag (and a class attribute) the script sets.
const SCRIPT_FUNCTION: &str = r#"import torch, torch.nn as nn
torch.manual_seed(0)
BUG = open("bug.txt").read().strip() == "1"
class Scale(torch.autograd.Function):
    step = 0
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        if BUG and Scale.step == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return g * 2
class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.Linear(8, 8); self.b = nn.Linear(8, 4)
    def forward(self, x):
        return self.b(Scale.apply(torch.relu(self.a(x))))
model = Net(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 6):
    Scale.step = step
    x = torch.randn(16, 8); y = torch.randn(16, 4)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print("step", step, float(loss), flush=True)
"#;

#[test]
fn the_capture_runs_as_the_workers_probes_ran_warm_with_its_caches_and_device() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let seen = tmp.path().join("seen.txt");
    // The script notes, in its capture runs, which worker's environment it got, and whether torch was
    // imported before the script ran (in a child of the worker's warm interpreter, which preloaded it).
    let script = format!(
        "import os, sys\nif os.environ.get('CUDABISECT_CAPTURE'):\n    open({seen:?}, 'a').write(os.environ.get('CUDABISECT_WORKER', 'none') + ' ' + os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'none') + ' ' + str('torch' in sys.modules) + '\\n')\n{SCRIPT_FUNCTION}",
        seen = seen.display().to_string()
    );
    let config = "[repro]\ncommand = \"python3 train.py\"\ntimeout = \"120s\"\n";
    let commits = history(&dir, &[("train.py", script)], ("bug.txt", "0", "1"), config);
    let (code, r, text) = start_report(
        &dir,
        &[
            &format!("{}..main", commits[0]),
            "--no-triage",
            "--jobs",
            "2",
        ],
        tmp.path(),
    );
    assert_eq!(code, 0, "{text}");
    let r = r.unwrap_or_else(|| panic!("no report: {text}"));
    assert_eq!(shrink_of(&r, &text).status, ShrinkStatus::Minimal, "{text}");
    let seen = std::fs::read_to_string(&seen).unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines.len(), 2, "the find and the replay run: {seen}");
    for line in lines {
        let [worker, cache, preloaded] = line.split(' ').collect::<Vec<_>>()[..] else {
            panic!("{seen}")
        };
        assert_ne!(worker, "none", "{seen}");
        assert!(
            cache.contains(&format!("workers/{worker}/")),
            "the worker's own Inductor cache: {seen}"
        );
        assert_eq!(
            preloaded, "True",
            "forked from the worker's warm interpreter, which had imported torch: {seen}"
        );
    }
}

#[test]
fn a_fault_in_a_class_the_script_defines_reproduces_in_the_replay_where_the_script_met_it() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let config = "[repro]\ncommand = \"python3 train.py\"\ntimeout = \"120s\"\n";
    let commits = history(
        &dir,
        &[("train.py", SCRIPT_FUNCTION.to_string())],
        ("bug.txt", "0", "1"),
        config,
    );
    let (code, r, text) = start(&dir, commits[0], tmp.path());
    assert_eq!(code, 0, "{text}");
    let s = shrink_of(&r, &text);
    // The replay meets the fault at train.py's own line, as the user's run did: the same fault, kept.
    assert_eq!(s.status, ShrinkStatus::Minimal, "{s:?}\n{text}");
    assert_eq!(captured(s).step, 3, "{s:?}");
    // Down to the Function the forward applies itself, not the whole model's backward.
    reproduces_alone(s, &dir, "model__Scale__backward");
}
