//! Reduction to the smallest faulting subgraph, as pure state machines (no processes, no GPU): the
//! located-fault reducer cudabisect uses and the plain delta debugging it is measured against.

mod reduce;

pub use reduce::{PlainDdmin, Reducer, Reduction, Stage, Step};
