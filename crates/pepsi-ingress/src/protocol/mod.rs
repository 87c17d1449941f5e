//! The SMTP protocol without a socket: command lines, paths, ESMTP parameters, the message
//! data scanner and replies. Everything here is a pure function or a pure state machine,
//! tested as tables; the session (`crate::session`) does the I/O and keeps the state.

pub mod address;
pub mod command;
pub mod data;
pub mod params;
pub mod reply;

pub use command::{Command, ParseError};
pub use reply::Reply;
