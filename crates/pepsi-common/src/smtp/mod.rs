//! The SMTP / LMTP client of the delivery stages: connect (TCP or unix socket), greeting,
//! EHLO (with HELO fallback) or LHLO, STARTTLS under a [`TlsPolicy`], AUTH PLAIN/LOGIN, and
//! transactions (DATA, or BDAT under CHUNKING) whose per-recipient outcomes become
//! [`crate::delivery::RcptResult`]s.
//!
//! The protocol pieces are pure and tested as tables: [`reply`] (reply parsing, RFC 3463
//! codes), [`caps`] (EHLO/LHLO keywords), [`data`] (dot-stuffing, xtext), [`envelope`]
//! (the MAIL/RCPT lines and their parameters), [`auth`] (mechanism choice and its lines) and
//! [`tls`] (policies, options, the rustls configurations). [`client`] is the only part that
//! does I/O; [`relay`] is what the relaying stages share on top of it (the configured peer,
//! the kept connection, one attempt turned into per-recipient results).
//!
//! This module never touches the queue: it speaks to a mail server and reports what the
//! server said; what to do with the message is `delivery::conclude`'s business.

pub mod auth;
pub mod caps;
pub mod client;
pub mod data;
pub mod envelope;
pub mod relay;
pub mod reply;
pub mod tls;

pub use caps::Capabilities;
pub use client::{ClientError, Connection, Phase, Protocol, RcptOutcome, Target, Timeouts};
pub use envelope::{Envelope, Recipient};
pub use relay::{Peer, Relay};
pub use reply::Reply;
pub use tls::{Credentials, OpenOptions, TlsInfo, TlsOptions, TlsPolicy};
