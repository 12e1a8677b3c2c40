//! A probe of one commit and what it runs in: the prober of a worktree, a run under compute-sanitizer (the
//! search's and triage's), the workers (how many probes run at once and on which GPUs) and the warm
//! interpreters Python repros run in.

pub mod prober;
pub mod sanitizer;
pub mod warm;
pub mod workers;
