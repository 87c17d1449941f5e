//! A mailing list's digests (docs/lists.md, "Digests"): the posts of a list collected for
//! the members who take them in one message rather than one by one.
//!
//! - `message`: the digest messages, pure: the MIME digest (multipart/mixed: the contents,
//!   then a multipart/digest of the list copies as message/rfc822 parts) and the plain
//!   digest (RFC 1153 text), tested as tables and read back with mail-parser;
//! - `issue`: a digest's volume and number, as Mailman counts them (pure);
//! - `store`: the SQL of the open digest: a post added to it in the caller's transaction
//!   (the list stage's fan-out), and a digest sent (`pepsi.list_fanout` with the member's
//!   delivery mode) and marked sent in one transaction, so it goes out at most once; the
//!   digests due by `digest_period` for `pepsi-list maintain`.
//!
//! Invariant: shared by the list stage and the operator's tool, so it links neither a stage
//! crate nor a tool crate, and it queues rows only through `pepsi.list_fanout`.

pub mod issue;
pub mod message;
pub mod store;

pub use message::Post;
pub use store::{Route, Sent};
