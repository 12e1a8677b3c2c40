//! `cudabisect init` on sample Python packages the way users lay them out (a plain script, a `-m` module,
//! a pytest test id, a src-layout package with `pyproject.toml`), with the real binary and a real git: the
//! config it writes loads, never overwrites one, and `start` with it alone names the culprit of a real
//! torch package, with the user's Python environment left as it was.

use std::path::Path;
use std::process::Command;

use crate::common::histories::linear_history;
use crate::common::repo_builder::{put, Files};
use crate::common::{bin, start_report};

fn realistic(rel: &str) -> String {
    crate::common::fixture_text("torch/realistic", rel)
}

/// Runs `cudabisect init ARGS…` in `dir`: exit code and everything printed.
fn init(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .arg("init")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The deep package's four commits (the limit drops at the third), laid out under `prefix`, plus `extra`.
fn deep_history(dir: &Path, prefix: &str, extra: &[(&str, &str)]) -> Vec<git2::Oid> {
    let commits = [99, 99, 3, 3].map(|limit| {
        let mut f = Files::new();
        for p in ["deep/__init__.py", "deep/ops.py", "deep/model.py"] {
            put(&mut f, &format!("{prefix}{p}"), realistic(p), false);
        }
        put(
            &mut f,
            &format!("{prefix}deep/limits.py"),
            format!("LIMIT = {limit}\n"),
            false,
        );
        put(&mut f, "train_deep.py", realistic("train_deep.py"), false);
        for (p, t) in extra {
            put(&mut f, p, t.to_string(), false);
        }
        f
    });
    linear_history(dir, commits).unwrap()
}

/// `start` over the deep history with only the config init wrote names its third commit (the limit's drop).
fn names_the_third_commit(dir: &Path, commits: &[git2::Oid], scratch: &Path) {
    let (code, r, text) = start_report(
        dir,
        &[
            &format!("{}..main", commits[0]),
            "--no-triage",
            "--no-shrink",
        ],
        scratch,
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        r.as_ref().and_then(crate::common::first_bad),
        Some(commits[2].to_string()),
        "{text}"
    );
}

#[test]
fn init_then_start_names_the_culprit_of_a_torch_package_with_no_config_written_by_hand() {
    crate::common::require_python("import torch", "a real torch: pip install torch");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let commits = deep_history(&dir, "", &[]);
    let (code, text) = init(&dir, &["--", "python3 train_deep.py"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("frameworks: PyTorch"), "{text}");
    // A flat package imports from the worktree's root: nothing to build.
    assert!(text.contains("build: none"), "{text}");
    let written = std::fs::read_to_string(dir.join("bisect.toml")).unwrap();
    assert!(
        written.contains("command = \"python3 train_deep.py\""),
        "{written}"
    );
    assert!(!written.contains("\n[build]"), "{written}");
    names_the_third_commit(&dir, &commits, tmp.path());
}

#[test]
fn a_src_layout_package_is_installed_per_worktree_never_into_the_users_python() {
    crate::common::require_python("import torch, setuptools", "a real torch and setuptools");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let pyproject = "[build-system]\nrequires = [\"setuptools>=64\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"deep-initcheck\"\nversion = \"0.1\"\n\n[tool.setuptools.packages.find]\nwhere = [\"src\"]\n";
    let commits = deep_history(&dir, "src/", &[("pyproject.toml", pyproject)]);
    let (code, text) = init(&dir, &["--pyproject", "--", "python3", "train_deep.py"]);
    assert_eq!(code, 0, "{text}");
    let written = std::fs::read_to_string(dir.join("pyproject.toml")).unwrap();
    assert!(
        written.starts_with(pyproject),
        "the user's text is kept as it was:\n{written}"
    );
    assert!(
        written.contains("[tool.cudabisect.build]\n")
            && written.contains("python3 -m pip install -e . --no-deps --no-build-isolation -q"),
        "{written}"
    );
    assert!(!dir.join("bisect.toml").exists());
    names_the_third_commit(&dir, &commits, tmp.path());
    // The package went into the worktrees' environments only.
    let user = Command::new("python3")
        .args(["-m", "pip", "show", "deep-initcheck"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(!user.status.success(), "installed into the user's Python");
}

#[test]
fn init_reads_scripts_modules_and_test_ids_and_never_overwrites() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let mut f = Files::new();
    put(&mut f, "train.py", "import jax\n".to_string(), false);
    put(&mut f, "pkg/__init__.py", String::new(), false);
    put(
        &mut f,
        "pkg/train.py",
        "from keras import layers\n".to_string(),
        false,
    );
    put(
        &mut f,
        "tests/test_step.py",
        "import torch\ndef test_step():\n    pass\n".to_string(),
        false,
    );
    linear_history(&dir, [f]).unwrap();
    let read = |dir: &Path| std::fs::read_to_string(dir.join("bisect.toml")).unwrap();
    let cases: [(&[&str], &str, &str); 3] = [
        (
            &["--", "python3 train.py --steps 3"],
            "python3 train.py --steps 3",
            "JAX",
        ),
        (
            &["--", "python3", "-m", "pkg.train"],
            "python3 -m pkg.train",
            "Keras",
        ),
        (
            &["--", "python3 -m pytest -x tests/test_step.py::test_step"],
            "python3 -m pytest -x tests/test_step.py::test_step",
            "PyTorch",
        ),
    ];
    for (args, command, framework) in cases {
        let (code, text) = init(&dir, args);
        assert_eq!(code, 0, "{text}");
        // The repro's own file's framework leads.
        assert!(
            text.contains(&format!("frameworks: {framework}")),
            "{args:?}: {text}"
        );
        let written = read(&dir);
        assert!(
            written.contains(&format!("command = \"{command}\"")),
            "{written}"
        );
        // Never over a config: exit 2, the file as it was.
        let (code, text) = init(&dir, &["--", "python3 other.py"]);
        assert_eq!(code, 2, "{text}");
        assert!(text.contains("never overwrites"), "{text}");
        assert_eq!(read(&dir), written);
        std::fs::remove_file(dir.join("bisect.toml")).unwrap();
    }
    // A repro that cannot start, or a script that is not there: exit 2, nothing written.
    for args in [
        &["--", "no-such-program-xyz train.py"][..],
        &["--", "python3 missing.py"][..],
        &["--pyproject", "--", "python3 train.py"][..],
    ] {
        let (code, text) = init(&dir, args);
        assert_eq!(code, 2, "{args:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!dir.join("bisect.toml").exists() && !dir.join("pyproject.toml").exists());
    }
    // `pytest` runs as `python3 -m pytest`: the worktree's root, not the test's directory, first on sys.path.
    let (code, text) = init(&dir, &["--", "pytest -x tests/test_step.py::test_step"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        read(&dir).contains("command = \"python3 -m pytest -x tests/test_step.py::test_step\""),
        "{}",
        read(&dir)
    );
    std::fs::remove_file(dir.join("bisect.toml")).unwrap();
    // In a Python project, a script outside the root imports the project from wherever it is installed:
    // the project is installed per worktree. At the root it is not.
    std::fs::write(
        dir.join("pyproject.toml"),
        "[project]\nname = \"pkg\"\nversion = \"0\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    std::fs::write(dir.join("examples/run.py"), "import pkg\n").unwrap();
    for (script, build) in [("examples/run.py", true), ("train.py", false)] {
        let (code, text) = init(&dir, &["--", &format!("python3 {script}")]);
        assert_eq!(code, 0, "{text}");
        assert_eq!(
            read(&dir).contains("\n[build]\n"),
            build,
            "{script}: {}",
            read(&dir)
        );
        std::fs::remove_file(dir.join("bisect.toml")).unwrap();
    }
    std::fs::remove_file(dir.join("pyproject.toml")).unwrap();
    // A script that is not committed is written, with a note: probes would not find it.
    std::fs::write(dir.join("local.py"), "import torch\n").unwrap();
    let (code, text) = init(&dir, &["--", "python3 local.py"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("local.py is not committed"), "{text}");
}

/// A pytest repro whose test the good end does not have yet (a regression test added with the bug): the
/// good end ran no test, which says nothing about it; the run says so (exit 8), never "does not pass".
#[test]
fn a_pytest_repro_whose_test_a_commit_lacks_is_not_judged_at_that_commit() {
    crate::common::require_python("import pytest", "pytest");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let test = "def test_step():\n    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n";
    let commits = [None, Some(test), Some(test)].map(|t| {
        let mut f = Files::new();
        put(&mut f, "README.md", "x\n".to_string(), false);
        if let Some(t) = t {
            put(&mut f, "tests/test_step.py", t.to_string(), false);
        }
        f
    });
    let commits = linear_history(&dir, commits).unwrap();
    let (code, text) = init(&dir, &["--", "pytest -x -q tests/test_step.py::test_step"]);
    assert_eq!(code, 0, "{text}");
    let (code, _, text) = start_report(
        &dir,
        &[
            &format!("{}..main", commits[0]),
            "--no-triage",
            "--no-shrink",
        ],
        tmp.path(),
    );
    assert_eq!(code, 8, "{text}");
    assert!(text.contains("ran no test"), "{text}");
    assert!(!text.contains("does not pass"), "{text}");
}
