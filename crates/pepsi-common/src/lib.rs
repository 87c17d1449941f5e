//! Shared infrastructure of Pepsi: configuration (`config`), the common command line
//! (`cli`), database access (`db`), the stage contract (`stage`), the shared end of the
//! delivery stages (`delivery`) and their SMTP/LMTP client (`smtp`).
//!
//! Invariant: `pepsi-common` never depends on a stage crate, and only `db` and `stage`
//! issue SQL against the queue.

pub mod cli;
pub mod config;
pub mod db;
pub mod delivery;
pub mod message;
pub mod smtp;
pub mod stage;
