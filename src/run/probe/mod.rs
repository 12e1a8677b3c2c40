//! A probe of one commit and what it runs in: the prober of a worktree, a run under compute-sanitizer (the
//! search's and triage's), the workers (how many probes run at once and on which GPUs), the warm
//! interpreters Python repros run in, their first guess at what to preload and what earlier runs taught them.

pub mod preload_guess;
pub mod prober;
pub mod sanitizer;
pub mod warm;
pub mod warm_memory;
pub mod workers;
