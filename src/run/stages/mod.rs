//! The stages at a commit once it is known, for every job: the shrink (its capture of the faulting step,
//! the reducer that drives the harness, the places on a shared GPU), and the pipeline that runs triage and
//! the shrink at the first bad commit and hands over the bundle.

pub mod capture;
pub mod pipeline;
pub mod places;
pub mod reducer;
pub mod shrink;
