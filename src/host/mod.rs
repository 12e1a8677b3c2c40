//! What cudabisect asks the host about itself: the environment a bundle records (driver, toolkit, GPUs,
//! Python packages), whether a GPU is idle before a run starts on it, and how much device memory a run uses.

pub mod devices;
pub mod environment;
pub mod gpu_idle;
pub mod gpu_memory;
