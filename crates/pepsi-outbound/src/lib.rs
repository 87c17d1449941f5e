//! What leaves: the shared end of the delivery stages (`delivery`), what the relaying ones
//! share on top of the SMTP/LMTP client of `pepsi_smtp` (`relay`), the connections they keep
//! between messages (`keep`), the MIME downgrade (`mime`), the one DNS resolver and
//! `DNS_SERVERS` parser (`dns`), Maildir paths (`maildir`) and the DKIM/ARC signing keys
//! (`keys`).
//!
//! Invariant: builds on the stage contract and is used by stages, the ingress and the tools
//! that need a part of it (where a Maildir is, the resolver, the signing keys); no tool's
//! administration lives here.

pub mod delivery;
pub mod dns;
pub mod keep;
pub mod keys;
pub mod maildir;
pub mod mime;
pub mod relay;
