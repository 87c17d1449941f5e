//! The message text of a transaction, in both directions: [`encode`] makes a message into
//! what a client sends after DATA or BDAT, [`decode`] checks what a server receives there.
//! Both hold to the same rule: the only end of data is CRLF "." CRLF, and no bare LF or CR
//! passes either way.

pub mod decode;
pub mod encode;

pub use decode::{DataDecoder, DataProblem, Feed};
pub use encode::{crlf_line_ends, dot_stuff, has_utf8_headers, is_8bit};
