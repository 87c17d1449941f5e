//! What the operator tools and pepsi-httpd share: the queue's administration (`queue`),
//! administrative writes of accounts and settings (`admin`), password hashes (`password`) and
//! the system's counters and queue shape as the operator surfaces show them (`status`). Every
//! write records its `event_log` row through `pepsi_contract::audit`.
//!
//! Invariant: no stage depends on this crate (`tests/integration/structure.rs`).

pub mod admin;
pub mod password;
pub mod queue;
pub mod status;
