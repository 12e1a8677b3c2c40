//! Sample repositories: a builder for git histories with chosen files per commit (the tests' fixtures),
//! and the demo's messy sample engine built with it.

pub mod demo;
pub(crate) mod repo_builder;
pub mod shapes;
