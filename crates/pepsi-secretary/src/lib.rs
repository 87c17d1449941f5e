//! The confirm-to-send secretary's foundation (docs/secretary.md), shared by
//! `pepsi-stage-secretary` (which holds mail and asks senders), pepsi-httpd (the
//! confirmation page and the owner's page) and `pepsi-whitelist` (held mail and payments on
//! the command line, and the owner's digest):
//!
//! - [`token`]: a challenge's token, its digest, the link and the Message-ID that carry it,
//!   and the page's human check. Pure.
//! - [`mail`]: the challenge and the digest, as messages. Pure.
//! - [`taler`]: the GNU Taler merchant backend's two endpoints postage needs, over HTTP.
//! - [`store`]: held mail, challenges and payments as the page and the tool read them, and
//!   the two decisions (`pepsi.secretary_confirm`, `pepsi.secretary_decide`).
//!
//! Invariant: no queue row is written here; a decision goes through the stored functions,
//! which wake only the held rows' own queue rows.

pub mod mail;
pub mod store;
pub mod taler;
pub mod token;
