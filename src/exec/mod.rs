//! The edge where user code runs: processes and their groups, the environment every child gets, the
//! executors (this machine, or steps of a Slurm allocation) and the outside programs cudabisect looks for.
//! Nothing here knows about searches or records; the run layer hands an executor to whoever runs code.

pub mod child_env;
pub mod executor;
pub mod process;
pub mod slurm;
pub mod tools;
