//! Orchestration: the plan of a `start` run, the search driver and the probes it runs, the stages after
//! the search (triage, shrink, the parent check), and the job that ties them together under a lock.

pub mod cancel;
pub mod capture;
pub mod ci;
pub mod cross_check;
pub mod error;
pub mod find_fix;
pub mod init;
pub mod job;
pub mod journal;
pub mod lock;
pub mod nightly;
pub mod nightly_state;
pub mod outputs;
pub mod places;
pub mod plan;
pub mod probe;
pub mod search;
pub mod shrink;
pub mod shrink_job;
pub mod shrink_stage;
pub mod stages;
pub mod triage;
pub mod triage_job;
pub mod warm_probes;
pub mod workers;
pub mod workspace;
