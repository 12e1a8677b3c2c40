//! The JAX and Keras harness shipped inside the binary (a Python package: protocol, graph, Keras models,
//! recording, running, repro generation, the command line), installed into the run's own directory when a
//! shrink needs it, like the PyTorch one, and run as `python <dir>/jax_harness ...`.

use super::shipped::ShippedHarness;
use crate::config::ShrinkFramework;

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

/// `framework = "jax"`: the harness on a function.
pub const JAX: ShippedHarness = ShippedHarness {
    framework: ShrinkFramework::Jax,
    dir: JAX_HARNESS_DIR,
    package: JAX_PACKAGE,
    files: JAX_HARNESS,
    factory_flag: "--function",
};

/// `framework = "keras"`: the same package on a Keras 3 model.
pub const KERAS: ShippedHarness = ShippedHarness {
    framework: ShrinkFramework::Keras,
    factory_flag: "--model",
    ..JAX
};

#[cfg(test)]
mod tests {
    use super::super::shipped::{assert_every_file_shipped, assert_installs, source_of};
    use super::*;

    #[test]
    fn the_harness_is_installed_and_says_which_protocol_it_speaks() {
        assert_installs(|dir| JAX.install(dir), JAX_HARNESS_DIR, JAX_HARNESS);
        let protocol = source_of(JAX_HARNESS, "cudabisect_jax/protocol.py");
        assert!(protocol.contains(&format!(
            "PROTOCOL_VERSION = {}",
            crate::protocol::types::PROTOCOL_VERSION
        )));
        assert!(protocol.contains(&format!(
            "LAUNCH = \"{}{{kernel}}\"",
            crate::marker::LAUNCH_PREFIX
        )));
        use super::super::is_shipped_harness;
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
