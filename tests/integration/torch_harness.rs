//! The PyTorch harness without torch: the Rust side of the protocol through a torch-free stand-in
//! interpreter, and the structure of the repro.py the harness writes (its code generation needs no torch).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::repo_builder::{put, Files, RepoBuilder};

use crate::common::bin;

fn harness_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness/torch_harness")
}

/// A stand-in for `python3`: checks that it was handed the shipped harness with the configured factories,
/// then answers the protocol with the native harness on a model file (no torch anywhere), and for
/// `extract` writes a repro.py that fails the way a real one would.
const FAKE_PYTHON: &str = include_str!("fakes/torch_harness_fake_python.sh");

#[test]
fn the_torch_harness_speaks_the_protocol_and_its_repro_lands_in_the_bundle() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&dir).unwrap();
    let mut f = Files::new();
    let model = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/models/shrink_one_node.toml"),
    )
    .unwrap();
    put(&mut f, "model.toml", model, false);
    put(&mut f, "fake_python.sh", FAKE_PYTHON, true);
    put(
        &mut f,
        "bisect.toml",
        format!(
            "[repro]\ncommand = [\"true\"]\n\n[shrink]\nmodel = \"toy.model:build\"\ninputs = \"toy.model:example_inputs\"\npython = \"./fake_python.sh\"\nconfirm = 2\nenv = {{ CUDABISECT_BIN = \"{}\" }}\n",
            bin()
        ),
        false,
    );
    let c = b.commit(&[], &f, "toy").unwrap();
    b.set_branch("main", c).unwrap();
    b.checkout_main().unwrap();
    let out = Command::new(bin())
        .args(["shrink", "-C"])
        .arg(&dir)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("1 of 24 nodes (b2_lookup)"), "{text}");
    // The harness was written from the binary's copy and run from there.
    let calls = std::fs::read_to_string(dir.join("harness_calls.txt")).unwrap();
    let script = calls.lines().next().unwrap();
    for file in [
        "__main__.py",
        "cudabisect_torch/cli.py",
        "cudabisect_torch/warm.py",
    ] {
        assert_eq!(
            std::fs::read_to_string(Path::new(script).join(file)).unwrap(),
            std::fs::read_to_string(harness_py().join(file)).unwrap(),
            "{file}"
        );
    }
    assert!(
        text.contains("Reproduce: CUDA_LAUNCH_BLOCKING=1 python"),
        "{text}"
    );
    // The bundle carries repro.py and a script that runs it with python alone.
    // The harness ran from the run's own directory under the state directory, not a shared /tmp path.
    assert!(
        script.starts_with(dir.join(".git/cudabisect/runs").to_str().unwrap()),
        "{script}"
    );
    let bundle = std::fs::read_dir(dir.join(".git/cudabisect/bundles"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.path().is_dir())
        .unwrap()
        .path();
    assert!(bundle.join("minimal/repro.py").is_file());
    let md = std::fs::read_to_string(bundle.join("REPORT.md")).unwrap();
    assert!(md.contains("python minimal/repro.py"), "{md}");
    let run = Command::new("sh")
        .arg(bundle.join("reproduce.sh"))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stdout).contains("illegal memory access"));
}

#[test]
fn torch_harness_config_needs_a_factory() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("bisect.toml");
    let text = "[repro]\ncommand = [\"true\"]\n[shrink]\nmodel = \"model.toml\"\ninputs = \"toy:inputs\"\n";
    let e = cudabisect::config::Config::parse(&p, text)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[shrink] model: with inputs (the PyTorch harness), model is a factory"),
        "{e}"
    );
}
