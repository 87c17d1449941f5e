//! Shared infrastructure of Pepsi: configuration (`config`), the common command line
//! (`cli`), database access (`db`), the local-recipient resolver (`local`), the per-address
//! override layer (`settings`) and the stage contract (`stage`).
//!
//! Invariant: `pepsi-common` never depends on a stage crate, and only `db` and `stage`
//! issue SQL against the queue; `local` and `settings` only read, through stored functions.

pub mod cli;
pub mod config;
pub mod db;
pub mod local;
pub mod message;
pub mod settings;
pub mod stage;
