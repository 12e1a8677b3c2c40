//! Pure commit search: the candidate DAG and the bisection state machine (no git, no processes).

mod bitset;
mod search;

pub use bitset::BitSet;
pub use search::{Bisector, NextStep, SearchResult, Verdict};
