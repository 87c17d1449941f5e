//! Shared infrastructure of Pepsi: configuration (`config`), the common command line
//! (`cli`), database access (`db`), the stage contract (`stage`), the shared end of the
//! delivery stages (`delivery`), what the relaying ones share on top of the SMTP/LMTP client
//! of `pepsi_smtp` (`relay`), the connections they keep between messages (`keep`) and
//! the MIME downgrade (`mime`), the address type and its one
//! normalisation (`address`, the bottom module: it uses no other), the local-recipient
//! resolver (`local`), the DKIM/ARC signing keys (`keys`), the
//! per-address override layer (`settings`), the operator's queue
//! administration (`queue`), the audit log (`audit`), administrative writes of accounts and
//! settings (`admin`), password hashes (`password`), the mail log (`mail_log`), server TLS
//! (`server_tls`), the types of the stock `state` keys (`state`) and the system's
//! counters and queue shape as the operator surfaces show them (`status`), and the
//! operator tools' tables and durations (`text`), the effective-identity switch of the
//! setuid helpers (`privilege`), and what a stage and its co-process helper share
//! (`coprocess`).
//!
//! Invariant: `pepsi-common` never depends on a stage crate, and only `db`, `stage` and
//! `queue` issue SQL against the queue; `local` and `settings` only read, through stored
//! functions.

/// xtext, base64 and the enhanced status code's shape: defined once in `pepsi_smtp`.
pub use pepsi_smtp::encoding;

pub mod address;
pub mod admin;
pub mod alias_file;
pub mod audit;
pub mod cli;
pub mod config;
pub mod coprocess;
pub mod db;
pub mod delivery;
pub mod dns;
pub mod epoch;
pub mod keep;
pub mod keys;
pub mod local;
pub mod mail_log;
pub mod maildir;
pub mod message;
pub mod mime;
pub mod password;
pub mod privilege;
pub mod queue;
pub mod quota;
pub mod relay;
pub mod round;
pub mod server_tls;
pub mod settings;
pub mod stage;
pub mod state;
pub mod status;
pub mod text;
pub mod whitelist;
