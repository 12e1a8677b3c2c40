//! The PyTorch harness shipped inside the binary (a Python package split by concern: protocol, graph,
//! running, training, recording, repro generation, the warm server, the command line), installed into the
//! run's own directory when a shrink needs it (never a shared path another user could swap between the
//! write and the run) and run as `python <dir>/torch_harness ...`.

use std::path::{Path, PathBuf};

/// The project modules a generated repro.py says it imports (its `# cudabisect-needs-project:` line),
/// if any: it then runs only with the project on `PYTHONPATH`.
pub fn needs_project(repro: &Path) -> Option<String> {
    let text = std::fs::read_to_string(repro).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("# cudabisect-needs-project:"))
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(String::from)
}

/// The folder the harness is installed as (`python <run dir>/torch_harness ...` runs its `__main__.py`).
pub const TORCH_HARNESS_DIR: &str = "torch_harness";

/// The harness's package: a path with this in it is one of the harness's own frames.
pub const TORCH_PACKAGE: &str = "cudabisect_torch";

/// The harness's files, by path inside [`TORCH_HARNESS_DIR`].
pub const TORCH_HARNESS: &[(&str, &str)] = &[
    (
        "__main__.py",
        include_str!("../../harness/torch_harness/__main__.py"),
    ),
    (
        "cudabisect_torch/__init__.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/__init__.py"),
    ),
    (
        "cudabisect_torch/protocol.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/protocol.py"),
    ),
    (
        "cudabisect_torch/store.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/store.py"),
    ),
    (
        "cudabisect_torch/graph.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/graph.py"),
    ),
    (
        "cudabisect_torch/node.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/node.py"),
    ),
    (
        "cudabisect_torch/run.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/run.py"),
    ),
    (
        "cudabisect_torch/training.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/training.py"),
    ),
    (
        "cudabisect_torch/record.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/record.py"),
    ),
    (
        "cudabisect_torch/repro.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/repro.py"),
    ),
    (
        "cudabisect_torch/warm.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/warm.py"),
    ),
    (
        "cudabisect_torch/fork_server.py",
        include_str!("../../harness/warm/fork_server.py"),
    ),
    (
        "cudabisect_torch/cli.py",
        include_str!("../../harness/torch_harness/cudabisect_torch/cli.py"),
    ),
];

/// The capture hook: a `sitecustomize.py` that does nothing unless `CUDABISECT_CAPTURE` is set.
pub const CAPTURE_HOOK: &str = include_str!("../../harness/capture/sitecustomize.py");

/// The warm probe runner: a server that preloads a repro's imports and forks a child per run, and the
/// client that stands where the repro's command would have run.
pub const WARM_PROBE: &str = include_str!("../../harness/warm/warm_probe.py");

/// The one fork server (its wire, its forking, its client's side): the warm probe runner imports it from
/// beside itself, and the PyTorch harness ships it in its package.
pub const FORK_SERVER: &str = include_str!("../../harness/warm/fork_server.py");

/// Writes the warm probe runner, and the fork server beside it, into `dir` and returns the runner's path.
pub fn install_warm_probe(dir: &Path) -> std::io::Result<PathBuf> {
    super::shipped::write_atomically(dir, "fork_server.py", FORK_SERVER)?;
    super::shipped::write_atomically(dir, "warm_probe.py", WARM_PROBE)
}

/// The folder, inside a run directory, that goes first on `PYTHONPATH` for a capture.
pub const CAPTURE_HOOK_DIR: &str = "capture-hook";

/// Writes the harness into `dir/torch_harness/` (each file atomically) and returns that folder, the
/// path to give Python.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    super::shipped::install_package(&dir.join(TORCH_HARNESS_DIR), TORCH_HARNESS)
}

/// Writes the capture hook into `dir/capture-hook/` and returns that folder (for `PYTHONPATH`).
pub fn install_capture_hook(dir: &Path) -> std::io::Result<PathBuf> {
    let hook = dir.join(CAPTURE_HOOK_DIR);
    super::shipped::write_atomically(&hook, "sitecustomize.py", CAPTURE_HOOK)?;
    Ok(hook)
}

#[cfg(test)]
mod tests {
    use super::super::shipped::{assert_every_file_shipped, assert_installs, source_of};
    use super::*;

    #[test]
    fn the_harness_is_installed_in_the_given_directory() {
        assert_installs(install, TORCH_HARNESS_DIR, TORCH_HARNESS);
    }

    #[test]
    fn every_file_of_the_package_is_shipped() {
        assert_every_file_shipped(TORCH_HARNESS_DIR, TORCH_PACKAGE, TORCH_HARNESS);
    }

    #[test]
    fn the_harness_speaks_this_protocol_version() {
        assert!(
            source_of(TORCH_HARNESS, "cudabisect_torch/protocol.py").contains(&format!(
                "PROTOCOL_VERSION = {}",
                crate::protocol::types::PROTOCOL_VERSION
            ))
        );
    }
}
