//! pepsi-archive: the mailing lists' web archive (docs/archive.md). The list stage archives
//! each post it accepts through [`store::archive_post`]; the archive's pages and admin API
//! (pepsi-httpd) and the operator tool read through [`read`], search and purge through
//! [`store`], and write mbox files through [`export`].
//!
//! Pure decisions apart from the database: [`mbox`] (reading and writing mbox files),
//! [`url`] (a post's stable id from its
//! Message-ID), [`thread`] (where a post sits in its thread, public-inbox style: by
//! References and In-Reply-To, never by subject) and [`query`] (the search syntax). This
//! crate depends on pepsi-contract and never on a stage crate.
//!
//! It is also the operator's tool `pepsi-archive` ([`tool`]: import and export mbox files,
//! purge, reindex, search, show), whose binary calls [`run`].

pub mod export;
pub mod mbox;
pub mod query;
pub mod read;
pub mod store;
pub mod thread;
pub mod tool;
pub mod url;

pub use tool::{command, constants, run};
