//! The stage contract: what a stage, the dispatcher and the queue agree on. The queue row's
//! message and its rounds (`message`, `round`, `epoch`), the types of the stock `state` keys
//! (`state`), the database access of the pipeline (`db`), the stage worker and its context
//! (`stage`), the mail log (`mail_log`), the reading of the configuration overlay
//! (`overlay`), the local-recipient resolver (`local`), mailing-list addresses (`list`),
//! the per-address override layer
//! (`settings`), the alias file (`alias_file`), the sender whitelist (`whitelist`), mailbox
//! quotas as the ingress and the Maildir stage check them and the operator sets them
//! (`quota`), RFC 3834's rules for automatic answers (`autoreply`, pure), the audit
//! log every operator write goes through (`audit`), and a message's trace and the spans
//! every process hands to its host's telemetry client (`telemetry`).
//!
//! Invariant: never depends on a stage crate; only `db`, `stage` and `overlay` issue SQL
//! against the queue and its configuration; `local` and `settings` only read, through stored
//! functions, and `list` only reads `mailing_list`; `whitelist` is pure.

pub mod alias_file;
pub mod audit;
pub mod autoreply;
pub mod db;
pub mod epoch;
pub mod list;
pub mod list_directory;
pub mod local;
pub mod mail_log;
pub mod message;
pub mod mime;
pub mod overlay;
pub mod quota;
pub mod round;
pub mod settings;
pub mod stage;
pub mod state;
pub mod telemetry;
pub mod whitelist;
