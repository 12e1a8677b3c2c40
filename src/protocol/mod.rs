//! The harness protocol: the records a harness writes, the client that runs
//! a harness command, and the PyTorch and JAX harnesses shipped inside the binary.

pub mod client;
pub mod jax;
pub mod memcheck;
pub mod shipped;
pub mod torch;
pub mod types;
pub mod warm;
