//! The harness protocol: the records a harness writes, the client that runs a harness command, and the
//! harnesses shipped inside the binary (PyTorch's, and one row of [`SHIPPED`] for each other framework).

pub mod client;
pub mod jax;
pub mod memcheck;
pub mod shipped;
pub mod torch;
pub mod types;
pub mod warm;

use crate::config::ShrinkFramework;
use shipped::ShippedHarness;

/// The shipped harnesses for `[shrink] framework`s other than PyTorch's: one row each.
pub const SHIPPED: &[&ShippedHarness] = &[&jax::JAX, &jax::KERAS];

/// The shipped harness of `framework`, when it is one of [`SHIPPED`].
pub fn shipped_for(framework: ShrinkFramework) -> Option<&'static ShippedHarness> {
    SHIPPED.iter().copied().find(|h| h.framework == framework)
}

/// Whether `path` (a frame's file, a launch site) is inside one of the shipped harnesses, PyTorch's
/// included: a frame of a harness is never the user's launch site.
pub fn is_shipped_harness(path: &str) -> bool {
    path.contains(torch::TORCH_PACKAGE) || SHIPPED.iter().any(|h| path.contains(h.package))
}
