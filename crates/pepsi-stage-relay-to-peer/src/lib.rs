//! The relaying delivery stages: two programs, one implementation. Each hands every message
//! that reaches it to the one peer its section names, in one transaction for all the
//! message's recipients, over the worker's kept connection, and turns the replies into the
//! message's fate through `delivery::conclude` (`pepsi_outbound::relay::RelayStage`).
//!
//! - `lmtp`: `pepsi-stage-relay-to-lmtp`, an LMTP server (Dovecot's or Cyrus's `lmtp`).
//! - `smarthost`: `pepsi-stage-relay-to-smarthost`, an SMTP server with STARTTLS and AUTH.
//!
//! What tells them apart is only how the section names the peer (a `PeerKind`) and the help
//! text; program names, options and behaviour are each program's own.

pub mod lmtp;
pub mod smarthost;
