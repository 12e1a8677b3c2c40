//! The JAX and Keras harness shipped inside the binary (a Python package: protocol, graph, Keras models,
//! recording, running, repro generation, the command line), installed into the run's own directory when a
//! shrink needs it, like the PyTorch one, and run as `python <dir>/jax_harness ...`.

use std::path::{Path, PathBuf};

/// The folder the harness is installed as.
pub const JAX_HARNESS_DIR: &str = "jax_harness";

/// The harness's package: a path with this in it is one of the harness's own frames.
pub const JAX_PACKAGE: &str = "cudabisect_jax";

/// The harness's files, by path inside [`JAX_HARNESS_DIR`].
pub const JAX_HARNESS: &[(&str, &str)] = &[
    (
        "__main__.py",
        include_str!("../../harness/jax_harness/__main__.py"),
    ),
    (
        "cudabisect_jax/__init__.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/__init__.py"),
    ),
    (
        "cudabisect_jax/protocol.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/protocol.py"),
    ),
    (
        "cudabisect_jax/graph.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/graph.py"),
    ),
    (
        "cudabisect_jax/keras.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/keras.py"),
    ),
    (
        "cudabisect_jax/record.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/record.py"),
    ),
    (
        "cudabisect_jax/run.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/run.py"),
    ),
    (
        "cudabisect_jax/repro.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/repro.py"),
    ),
    (
        "cudabisect_jax/cli.py",
        include_str!("../../harness/jax_harness/cudabisect_jax/cli.py"),
    ),
];

/// Writes the harness into `dir/jax_harness/` (each file atomically) and returns that folder, the path
/// to give Python.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    super::shipped::install_package(&dir.join(JAX_HARNESS_DIR), JAX_HARNESS)
}

/// Whether `path` (a frame's file, a launch site) is inside one of the shipped harnesses: a frame of
/// the harness is never the user's launch site.
pub fn is_shipped_harness(path: &str) -> bool {
    path.contains(JAX_PACKAGE) || path.contains(super::torch::TORCH_PACKAGE)
}

#[cfg(test)]
mod tests {
    use super::super::shipped::{assert_every_file_shipped, assert_installs, source_of};
    use super::*;

    #[test]
    fn the_harness_is_installed_and_says_which_protocol_it_speaks() {
        assert_installs(install, JAX_HARNESS_DIR, JAX_HARNESS);
        let protocol = source_of(JAX_HARNESS, "cudabisect_jax/protocol.py");
        assert!(protocol.contains(&format!(
            "PROTOCOL_VERSION = {}",
            crate::protocol::types::PROTOCOL_VERSION
        )));
        assert!(protocol.contains(&format!(
            "LAUNCH = \"{}{{kernel}}\"",
            crate::marker::LAUNCH_PREFIX
        )));
        assert!(is_shipped_harness(
            "/run/jax_harness/cudabisect_jax/run.py:call"
        ));
        assert!(is_shipped_harness(
            "/run/torch_harness/cudabisect_torch/run.py:call"
        ));
        assert!(!is_shipped_harness("pkg/model.py:forward"));
    }

    #[test]
    fn every_file_of_the_package_is_shipped() {
        assert_every_file_shipped(JAX_HARNESS_DIR, JAX_PACKAGE, JAX_HARNESS);
    }
}
