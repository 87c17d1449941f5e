//! pepsi-setup-model: the setup of a new installation as data, with no I/O.
//!
//! [`interview`] is what the setup asks (host name, mail domains, certificate, DKIM keys,
//! relay, local delivery, first mailboxes, optional features), each answer validated, and
//! what the answers become: a list of [`task::Task`]s, the eleven kinds a `pepsi.setup_task`
//! row may hold. pepsi-httpd's setup pages validate with it before they write a row, and
//! `pepsi-setup apply` validates every row again with it before it acts, so a row with a
//! parameter outside its kind is refused however it got into the table.
//!
//! Never does I/O: whether a certificate file exists, or a DNS record is published, is the
//! applier's and the check page's to find out.

pub mod interview;
pub mod name;
pub mod task;

pub use interview::{AnswerError, Answers};
pub use task::{Task, TaskError};
