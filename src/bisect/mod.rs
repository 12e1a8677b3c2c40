//! Pure commit search: the candidate DAG and the bisection state machine (no git, no processes).

mod bayes;
mod bitset;
mod dag;
mod search;

pub use bayes::{information, rates_differ, BayesResult, BayesSearch, BayesStep};
pub use bitset::BitSet;
pub use dag::Dag;
pub use search::{Bisector, NextStep, SearchResult, Verdict};
