//! Shared infrastructure of Pepsi: configuration (`config`), the common command line
//! (`cli`), database access (`db`) and the stage contract (`stage`).
//!
//! Invariant: `pepsi-common` never depends on a stage crate, and only `db` and `stage`
//! issue SQL against the queue.

pub mod cli;
pub mod config;
pub mod db;
pub mod delivery;
pub mod message;
pub mod stage;
