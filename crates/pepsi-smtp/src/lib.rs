//! The SMTP protocol of Pepsi, one definition for both directions (RFC 5321, 1870, 2920,
//! 3030, 3207, 3461, 3463, 4954, 6152, 6531; LMTP, RFC 2033).
//!
//! - [`command`]: a server parses a command line into a [`Command`]; a client writes one
//!   with [`Command::to_line`], which refuses CR, LF and NUL in anything it puts on a line.
//! - [`address`] (paths), [`params`] (ESMTP parameters, validated on the way in),
//!   [`encoding`] (xtext, base64, the shape of an enhanced status code).
//! - [`reply`]: one [`Reply`] that a server renders and a client parses.
//! - [`data`]: the message text after DATA or BDAT, encoded by a client, decoded by a
//!   server, with one rule for the end of data; [`message`]: the header/body split.
//! - The client: [`caps`] (EHLO keywords), [`auth`], [`tls`], [`envelope`] (the MAIL and
//!   RCPT commands of one transaction) and [`client`], which drives a connection.
//! - [`sts`]: MTA-STS (RFC 8461) records, policies and MX patterns, pure; [`dane`]: TLSA
//!   records (RFC 7672) and the verifier of a DANE session.
//! - Both ends: [`server_tls`], a server's certificate and key read into a rustls
//!   configuration for the ingress and pepsi-httpd.
//!
//! Everything but `client` and `server_tls` (which reads the two files) is pure and tested as
//! tables. This crate depends on no other
//! Pepsi crate: it speaks to a peer and reports what the peer said; what becomes of a
//! message is the stage contract's business (`pepsi_outbound::delivery`).

pub mod address;
pub mod auth;
pub mod caps;
pub mod client;
pub mod command;
pub mod dane;
pub mod data;
pub mod encoding;
pub mod envelope;
pub mod message;
pub mod params;
pub mod reply;
pub mod server_tls;
mod signatures;
pub mod sts;
pub mod tls;

pub use caps::Capabilities;
pub use client::{ClientError, Connection, Phase, Protocol, RcptOutcome, Target, Timeouts};
pub use command::{Command, Param, ParseError};
pub use envelope::{Envelope, Recipient};
pub use reply::Reply;
pub use tls::{CertCheck, CertProblem, Credentials, OpenOptions, TlsInfo, TlsOptions, TlsPolicy};
