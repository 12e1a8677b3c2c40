//! The JAX and Keras harness end to end with a real JAX and Keras 3 on the CPU: a jitted JAX training
//! step shrunk to the equation that faults, a Keras functional model (with a nested block) shrunk to its
//! faulting layer and, through its compiled training step, to the faulting equation; each ends in a
//! `repro.py` that fails the same way away from the project's checkout. The planted fault is a bounds
//! check in a host callback that raises the CUDA error text, as a faulting kernel would on a GPU. `start`
//! on a JAX training script bisects to the culprit and hands off a bundle whose repro reproduces. These
//! tests need jax and keras (`python3 -c "import jax, keras"`); CI installs them. Without them they fail,
//! saying so: they never pass unrun.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::histories::linear_history;
use crate::common::repo_builder::{put, Files};
use crate::common::{first_bad, kept, shrink, shrink_of, start_report};
use cudabisect::classify::FaultClass;
use cudabisect::report::record::{ShrinkReport, ShrinkStatus};

fn require_jax() {
    crate::common::require_python(
        "import jax, flatbuffers, os; os.environ['KERAS_BACKEND'] = 'jax'; import keras",
        "a real jax, keras and flatbuffers: pip install 'jax[cpu]' keras flatbuffers",
    );
}

fn fixture(rel: &str) -> String {
    crate::common::fixture_text("jax", rel)
}

/// The JAX fixture with a table of `rows` rows (the batch reaches row 7) and `config` as bisect.toml.
fn files(rows: u32, config: &str) -> Files {
    let mut f = Files::new();
    for p in [
        "toy/__init__.py",
        "toy/ops.py",
        "toy/fn.py",
        "toy/keras_model.py",
        "train.py",
    ] {
        put(&mut f, p, fixture(p), false);
    }
    put(&mut f, "toy/rows.py", format!("ROWS = {rows}\n"), false);
    put(&mut f, "bisect.toml", config.to_string(), false);
    f
}

fn repo(config: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    linear_history(&dir, [files(6, config)]).unwrap();
    (tmp, dir)
}

/// Runs the minimal repro away from the project, on the CPU.
fn run_alone(
    report: &ShrinkReport,
    project: Option<&Path>,
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let env: Vec<(&str, &str)> = std::iter::once(("JAX_PLATFORMS", "cpu"))
        .chain(env.iter().copied())
        .collect();
    crate::common::run_repro_alone(crate::common::repro_py(report), project, &env)
}

const BASE: &str = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"120s\"\nenv = { JAX_PLATFORMS = \"cpu\" }\n\n[triage]\nenabled = false\n\n";
const JAX: &str = "[shrink]\nframework = \"jax\"\nfunction = \"toy.fn:train_step\"\ninputs = \"toy.fn:example_inputs\"\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n";

#[test]
fn a_jitted_jax_training_step_is_shrunk_to_its_faulting_equation() {
    require_jax();
    let (_tmp, dir) = repo(&format!("{BASE}{JAX}"));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(r.status, ShrinkStatus::Minimal, "{out}");
    // The jitted step was inlined: the forward, backward and update are its equations.
    assert!(
        r.graph
            .as_deref()
            .is_some_and(|g| g.contains("equations of its jaxpr")),
        "{r:?}"
    );
    assert!(r.nodes_before > 30, "{r:?}");
    assert_eq!(kept(&r), ["e000_pure_callback"], "{out}");
    assert_eq!(
        r.kept[0]
            .source
            .as_deref()
            .map(|s| s.contains("toy/ops.py:")),
        Some(true),
        "{r:?}"
    );
    // The callback is the project's: repro.py says so, and with the project importable it reproduces.
    let repro = std::fs::read_to_string(r.minimal_model.as_deref().unwrap()).unwrap();
    assert!(
        repro.contains("# cudabisect-needs-project: toy.ops"),
        "{repro}"
    );
    let (exit, text) = run_alone(&r, Some(&dir), &[]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
    assert!(text.contains("node=e000_pure_callback"), "{text}");
    let (exit, text) = run_alone(&r, Some(&dir), &[("TOY_FAULT", "none")]);
    assert_eq!(exit, Some(0), "{text}");
}

#[test]
fn a_keras_functional_model_is_shrunk_to_its_faulting_layer_and_its_training_step_to_the_equation()
{
    require_jax();
    let keras = "[shrink]\nframework = \"keras\"\nmodel = \"toy.keras_model:build\"\ninputs = \"toy.keras_model:example_inputs\"\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n";
    let (_tmp, dir) = repo(&format!("{BASE}{keras}"));
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    // Six layers, the nested block's two among them.
    assert_eq!(r.nodes_before, 6, "{r:?}");
    assert!(
        r.removed.iter().any(|n| n.contains("block.inner_scale")),
        "{r:?}"
    );
    assert_eq!(kept(&r), ["l00_lookup"], "{out}");
    let (exit, text) = run_alone(&r, Some(&dir), &[]);
    assert_eq!(exit, Some(1), "{text}");
    assert!(text.contains("an illegal memory access"), "{text}");
    assert!(text.contains("node=l00_lookup"), "{text}");

    // The compiled model's fit step, through its stateless train_step: the lookup's equation again.
    let train = keras.replace("example_inputs\"", "example_batch\"\ntrain = true");
    std::fs::write(dir.join("bisect.toml"), format!("{BASE}{train}")).unwrap();
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        r.graph.as_deref().is_some_and(|g| g.contains("train_step")),
        "{r:?}"
    );
    assert_eq!(kept(&r), ["e000_pure_callback"], "{out}");
}

#[test]
fn a_kept_pallas_kernel_is_written_as_a_standalone_repro_that_needs_only_jax() {
    require_jax();
    // A recorded run without a fault (the shrink says it did not reproduce), then the kernel's
    // equation extracted from it: the repro carries the kernel serialized, with its Python source for
    // reading, and runs without the project.
    let (_tmp, dir) = repo(&format!("{BASE}{JAX}"));
    let (code, r, out) = shrink(&dir, &[("TOY_FAULT", "none")]);
    assert_eq!(r.status, ShrinkStatus::NotReproduced, "{out}");
    assert_ne!(code, 0, "{out}");
    let record = PathBuf::from(&r.out_dir).join("record");
    assert!(record.join("values.json").is_file(), "{r:?}");
    let harness = find_harness(Path::new(&r.out_dir));
    let out_dir = tempfile::tempdir().unwrap();
    let st = Command::new("python3")
        .arg(&harness)
        .args([
            "--function",
            "toy.fn:train_step",
            "--example-inputs",
            "toy.fn:example_inputs",
            "--device",
            "cpu",
            "extract",
            "--keep",
            "e009_pallas_call,e010_dot_general",
            "--recording",
        ])
        .arg(&record)
        .arg("--out")
        .arg(out_dir.path().join("minimal"))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let repro_path = out_dir.path().join("minimal/repro.py");
    let repro = std::fs::read_to_string(&repro_path).unwrap();
    assert!(!repro.contains("cudabisect-needs-project"), "{repro}");
    assert!(
        repro.contains("#     def scale_kernel(x_ref, o_ref):"),
        "{repro}"
    );
    assert!(out_dir
        .path()
        .join("minimal/steps/e009_pallas_call.jaxexport")
        .is_file());
    let (exit, text) =
        crate::common::run_repro_alone(&repro_path, None, &[("JAX_PLATFORMS", "cpu")]);
    assert_eq!(exit, Some(0), "{text}");
    assert!(
        text.contains("@@cudabisect launch kernel=scale_kernel"),
        "{text}"
    );
    assert!(text.contains("repro: finished without a fault"), "{text}");
}

/// The installed JAX harness in a shrink's run directory (found under the state directory).
fn find_harness(out_dir: &Path) -> PathBuf {
    let mut dir = out_dir.to_path_buf();
    loop {
        let candidate = dir.join("jax_harness");
        if candidate.join("__main__.py").is_file() {
            return candidate;
        }
        assert!(dir.pop(), "no jax_harness above {}", out_dir.display());
    }
}

#[test]
fn start_on_a_jax_training_script_bisects_and_hands_off_a_repro_that_reproduces() {
    require_jax();
    let config = format!("{BASE}{JAX}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let commits = linear_history(&dir, [8, 8, 8, 6, 6].map(|rows| files(rows, &config))).unwrap();
    let (code, r, text) = start_report(&dir, &[&format!("{}..main", commits[0])], tmp.path());
    assert_eq!(code, 0, "{text}");
    let r = r.unwrap_or_else(|| panic!("no report: {text}"));
    assert_eq!(first_bad(&r), Some(commits[3].to_string()), "{text}");
    let target = r.target.as_ref().expect("a target");
    assert_eq!(target.class, FaultClass::IllegalAddress, "{text}");
    assert_eq!(target.framework.as_deref(), Some("jax"), "{text}");
    let s = shrink_of(&r, &text);
    assert_eq!(s.status, ShrinkStatus::Minimal, "{text}");
    assert_eq!(kept(s), ["e000_pure_callback"], "{text}");
    let bundle = PathBuf::from(r.bundle.as_deref().unwrap());
    let (code, out) =
        crate::common::reproduce_from_elsewhere(&bundle, &dir, &[("JAX_PLATFORMS", "cpu")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("an illegal memory access"), "{out}");
}

#[test]
fn a_fault_only_the_jitted_step_shows_ends_the_shrink_with_the_xla_dump_in_its_logs() {
    require_jax();
    // The planted fault raises only in a process that dumps XLA: the harness's jitted check, never the
    // equation-by-equation run (a stand-in for a fault inside an XLA fusion).
    let jit_only = "[shrink]\nframework = \"jax\"\nfunction = \"toy.jitonly:step\"\ninputs = \"toy.jitonly:inputs\"\ndevice = \"cpu\"\nconfirm = 2\ntimeout = \"120s\"\n";
    let (_tmp, dir) = repo(&format!("{BASE}{jit_only}"));
    std::fs::write(
        dir.join("toy/jitonly.py"),
        "import os\nimport jax\nimport jax.numpy as jnp\nimport numpy as np\n\n\ndef check(x):\n    if 'xla_dump_to' in os.environ.get('XLA_FLAGS', ''):\n        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n    return np.asarray(x)\n\n\n@jax.jit\ndef step(x):\n    y = jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2)\n    return jnp.sin(y).sum()\n\n\ndef inputs():\n    return (jnp.ones(3),)\n",
    )
    .unwrap();
    let (code, r, out) = shrink(&dir, &[]);
    assert_ne!(code, 0, "{out}");
    assert_eq!(r.status, ShrinkStatus::NotReproduced, "{out}");
    let summary = &r.summary;
    assert!(
        summary.contains("does not show equation by equation, only in the jitted executable"),
        "{summary}"
    );
    let dump = PathBuf::from(&r.out_dir).join("logs/xla-dump");
    assert!(
        std::fs::read_dir(&dump).is_ok_and(|mut d| d.next().is_some()),
        "no XLA dump in {}",
        dump.display()
    );
}
