//! The JAX and Keras harness shipped inside the binary, installed into the run's own directory when a
//! shrink needs it, like the PyTorch one.

use std::path::{Path, PathBuf};

/// The JAX harness's source.
pub const JAX_HARNESS: &str = include_str!("../../harness/jax_harness.py");

/// The file name the harness is installed under.
pub const JAX_HARNESS_FILE: &str = "jax_harness.py";

/// Writes the harness into `dir` (created when missing) atomically and returns its path.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    super::torch::write_atomically(dir, JAX_HARNESS_FILE, JAX_HARNESS)
}

/// Whether `path` (a frame's file, a launch site) is inside one of the shipped harnesses: a frame of
/// the harness is never the user's launch site.
pub fn is_shipped_harness(path: &str) -> bool {
    path.contains(JAX_HARNESS_FILE) || path.contains(super::torch::TORCH_PACKAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_is_installed_and_says_which_protocol_it_speaks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = install(dir.path()).expect("installs");
        assert_eq!(std::fs::read_to_string(path).expect("reads"), JAX_HARNESS);
        assert!(JAX_HARNESS.contains(&format!(
            "PROTOCOL_VERSION = {}",
            crate::protocol::types::PROTOCOL_VERSION
        )));
        assert!(JAX_HARNESS.contains(&format!(
            "LAUNCH = \"{}{{kernel}}\"",
            crate::marker::LAUNCH_PREFIX
        )));
        assert!(is_shipped_harness("/run/jax_harness.py:call"));
        assert!(is_shipped_harness(
            "/run/torch_harness/cudabisect_torch/run.py:call"
        ));
        assert!(!is_shipped_harness("pkg/model.py:forward"));
    }
}
