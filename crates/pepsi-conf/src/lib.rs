//! Configuration without a database: what every Pepsi program reads first, the setuid helpers
//! and sendmail included. The INI configuration and its typed getters (`config`, with the
//! stage names `config::StageName` and the rules of the database overlay), the one address
//! type and its normalisation (`address`), the common command line and exit statuses of the
//! tools (`cli`), the operator tools' tables and durations (`text`), the effective-identity
//! switch of the setuid helpers (`privilege`), what a stage and its co-process helper
//! share (`coprocess`), and what the Maildir writer and its callers share (`mailbox`: the
//! writer's start arguments, quota limits and usage).
//!
//! Invariant: this crate opens no database and links no other Pepsi crate; everything above
//! builds on it. The database overlay's rows are read by `pepsi_contract::overlay`.

pub mod address;
pub mod cli;
pub mod config;
pub mod coprocess;
pub mod mailbox;
pub mod privilege;
pub mod text;
