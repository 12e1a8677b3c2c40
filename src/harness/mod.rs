//! The native harness: runs a model file node by node on the CUDA backend or the CPU reference, prints a
//! marker around every node so a fault names its node, records node outputs as `.npy`, and runs any
//! subgraph with its boundary inputs taken from a recording. It speaks the harness protocol the shrinker
//! uses (`describe` and `run --keep --inputs`).

pub mod cpu;
pub mod cuda;
mod engine;
pub mod extract;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod tensor;

pub use engine::{
    build, compare, describe, load_boundary, plan, resolve_backend, run, BackendChoice,
    HarnessError, Origin, Outcome, Plan, RunOptions, RunReport, Timings,
};
pub use model::{Model, ModelError};
