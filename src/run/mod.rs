//! Orchestration: the jobs (`jobs/`), the bisection `start` and `nightly` share (`bisection`), the search
//! and the probes it runs (`search/`, `probe/`), the stages at a commit once it is known (`stages/`), and
//! what every job shares: its workspace, lock, journal, plan, outputs and errors.

pub mod bisection;
pub mod cancel;
pub mod ci;
pub mod cross_check;
pub mod error;
pub mod jobs;
pub mod journal;
pub mod lock;
pub mod nightly_state;
pub mod outputs;
pub mod plan;
pub mod probe;
pub mod search;
pub mod stages;
pub mod workspace;
