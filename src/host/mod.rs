//! What cudabisect asks the host about itself: the environment a bundle records (driver, toolkit, GPUs,
//! Python packages) and whether a GPU is idle before a run starts on it.

pub mod devices;
pub mod environment;
pub mod gpu_idle;
