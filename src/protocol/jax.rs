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
    super::torch::install_package(&dir.join(JAX_HARNESS_DIR), JAX_HARNESS)
}

/// Whether `path` (a frame's file, a launch site) is inside one of the shipped harnesses: a frame of
/// the harness is never the user's launch site.
pub fn is_shipped_harness(path: &str) -> bool {
    path.contains(JAX_PACKAGE) || path.contains(super::torch::TORCH_PACKAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(path: &str) -> &'static str {
        JAX_HARNESS
            .iter()
            .find(|(p, _)| *p == path)
            .map_or("", |(_, text)| text)
    }

    #[test]
    fn the_harness_is_installed_and_says_which_protocol_it_speaks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = install(dir.path()).expect("installs");
        for (file, text) in JAX_HARNESS {
            assert_eq!(
                std::fs::read_to_string(path.join(file)).expect("reads"),
                *text
            );
        }
        let protocol = source("cudabisect_jax/protocol.py");
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
        let package = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("harness")
            .join(JAX_HARNESS_DIR)
            .join(JAX_PACKAGE);
        for entry in std::fs::read_dir(package).expect("the package") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            if name.ends_with(".py") {
                let path = format!("{JAX_PACKAGE}/{name}");
                assert!(!source(&path).is_empty(), "{path} is not shipped");
            }
        }
    }
}
