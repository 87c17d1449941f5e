//! The co-process protocol between `pepsi-stage-dot-forward` and the reader, both ends.
//!
//! A request is one line naming a system account:
//!
//! ```text
//! forward alice
//! ```
//!
//! and its answer is one line, followed by the file's bytes for `file`:
//!
//! ```text
//! file 27                          (then exactly 27 bytes: the .forward as stored)
//! none no .forward                 (no account, an account below MIN_UID, no file)
//! unsafe group-writable .forward   (present but not to be trusted: ignored, with the reason)
//! temp 4.3.0 <text>                (try later: an I/O error, a failed switch)
//! ```
//!
//! A request the reader cannot parse leaves the stream out of step, so it answers
//! `temp 4.3.0 protocol error: ...` and exits; the stage starts a new one. This module does
//! no I/O beyond the reader and writer it is given.

use std::io::{BufRead, Read};

/// The longest request line accepted, LF included.
pub const MAX_LINE: usize = 256;
/// The largest `.forward` the reader passes on: a file of forwarding addresses is a few
/// lines; anything larger is refused as unsafe rather than read.
pub const MAX_FILE: u64 = 64 * 1024;

/// The longest text an answer carries: what the stage accepts with room to spare, whatever
/// the length of a home directory's path.
pub const MAX_TEXT: usize = 512;
/// The longest answer line, LF included: the word, a status and the text.
pub const MAX_ANSWER_LINE: usize = MAX_TEXT + 64;

/// The longest account name (the system's LOGIN_NAME_MAX is larger; useradd's limit is 32).
pub const MAX_ACCOUNT: usize = 32;

/// Whether `name` is a name this protocol carries: 1 to 32 of `a-z 0-9 . _ -`, not starting
/// with `-` or `.`. Anything else (upper case, `/`, spaces) is never a lookup.
pub fn valid_account(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ACCOUNT
        && !name.starts_with(['-', '.'])
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// The request line for `account`, LF included.
pub fn encode_request(account: &str) -> Result<Vec<u8>, String> {
    if !valid_account(account) {
        return Err(format!(
            "account name {account:?} is not 1-{MAX_ACCOUNT} of a-z, 0-9, '.', '_', '-'"
        ));
    }
    Ok(format!("forward {account}\n").into_bytes())
}

pub use pepsi_conf::coprocess::ProtocolError;
use pepsi_conf::coprocess::read_line;

/// Reads one request: the account name, or `None` at a clean end of input.
pub fn read_request<R: BufRead>(input: &mut R) -> Result<Option<String>, ProtocolError> {
    let Some(line) = read_line(input, MAX_LINE)? else {
        return Ok(None);
    };
    let account = line.strip_prefix("forward ").ok_or_else(|| {
        ProtocolError::Malformed(format!("expected `forward <account>`, got {line:?}"))
    })?;
    if !valid_account(account) {
        return Err(ProtocolError::Malformed(format!(
            "account name {account:?} is not 1-{MAX_ACCOUNT} of a-z, 0-9, '.', '_', '-'"
        )));
    }
    Ok(Some(account.to_owned()))
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The file's content, as stored.
    File(Vec<u8>),
    /// Nothing to forward; the text says why (for the log).
    None(String),
    /// A file exists but is not trusted (owner, mode, type, size): it is ignored.
    Unsafe(String),
    /// Try later: `status` is an RFC 3463 code of class 4.
    Temp { status: String, text: String },
}

impl Reply {
    pub fn temp(status: &str, text: impl Into<String>) -> Reply {
        Reply::Temp {
            status: status.to_owned(),
            text: text.into(),
        }
    }

    /// The answer as written on the wire. Texts are kept to one line of at most `MAX_TEXT`
    /// bytes.
    pub fn encode(&self) -> Vec<u8> {
        let one_line = |t: &str| {
            let mut t = t.replace(['\r', '\n'], " ");
            if t.len() > MAX_TEXT {
                let mut end = MAX_TEXT;
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t.truncate(end);
            }
            t
        };
        match self {
            Reply::File(bytes) => {
                let mut out = format!("file {}\n", bytes.len()).into_bytes();
                out.extend_from_slice(bytes);
                out
            }
            Reply::None(why) => format!("none {}\n", one_line(why)).into_bytes(),
            Reply::Unsafe(why) => format!("unsafe {}\n", one_line(why)).into_bytes(),
            Reply::Temp { status, text } => {
                format!("temp {status} {}\n", one_line(text)).into_bytes()
            }
        }
    }

    /// Reads one answer (the stage's end). An error means the stream is out of step.
    pub fn read<R: BufRead>(input: &mut R) -> Result<Reply, String> {
        let line = match read_line(input, MAX_ANSWER_LINE) {
            Ok(Some(line)) => line,
            Ok(None) => return Err("it exited".into()),
            Err(e) => return Err(e.to_string()),
        };
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match word {
            "file" => {
                let len: u64 = rest
                    .parse()
                    .ok()
                    .filter(|&n| n <= MAX_FILE)
                    .ok_or_else(|| format!("bad file length {rest:?}"))?;
                let mut bytes = Vec::with_capacity(len as usize);
                input
                    .take(len)
                    .read_to_end(&mut bytes)
                    .map_err(|e| e.to_string())?;
                if bytes.len() as u64 != len {
                    return Err(format!(
                        "the file ended after {} of {len} bytes",
                        bytes.len()
                    ));
                }
                Ok(Reply::File(bytes))
            }
            "none" => Ok(Reply::None(rest.to_owned())),
            "unsafe" => Ok(Reply::Unsafe(rest.to_owned())),
            "temp" => {
                let (status, text) = rest.split_once(' ').unwrap_or((rest, ""));
                if !status.starts_with("4.") {
                    return Err(format!("bad status {status:?} in a temp answer"));
                }
                Ok(Reply::temp(status, text))
            }
            _ => Err(format!("unexpected answer {line:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each answer reads back as written, and a request as the account it names.
    #[test]
    fn answers_and_requests_round_trip() {
        for reply in [
            Reply::File(b"bob@example.org\n\\alice\n".to_vec()),
            Reply::File(Vec::new()),
            Reply::None("no .forward".into()),
            Reply::Unsafe("group-writable".into()),
            Reply::temp("4.3.0", "cannot switch to uid 1001"),
        ] {
            let wire = reply.encode();
            let mut input = &wire[..];
            assert_eq!(Reply::read(&mut input).unwrap(), reply);
            assert!(input.is_empty(), "{reply:?} left bytes behind");
        }
        let wire = encode_request("alice.b-c_1").unwrap();
        assert_eq!(
            read_request(&mut &wire[..]).unwrap().as_deref(),
            Some("alice.b-c_1")
        );
        assert_eq!(read_request(&mut &b""[..]).unwrap(), None);
    }

    /// Texts cannot break the framing, nor outgrow what the stage reads.
    #[test]
    fn a_text_with_line_breaks_stays_one_line() {
        let long = Reply::None(format!("no {}/.forward", "/ü".repeat(2000))).encode();
        assert!(long.len() <= MAX_TEXT + 6, "{}", long.len());
        assert!(matches!(Reply::read(&mut &long[..]), Ok(Reply::None(_))));
        let wire = Reply::Unsafe("a\nfile 3\nabc".into()).encode();
        let mut input = &wire[..];
        assert_eq!(
            Reply::read(&mut input).unwrap(),
            Reply::Unsafe("a file 3 abc".into())
        );
        assert!(input.is_empty());
    }

    #[test]
    fn account_names_table() {
        let long = "a".repeat(33);
        let longest = "a".repeat(32);
        for (name, ok) in [
            ("alice", true),
            ("a", true),
            ("bob.smith", true),
            ("x_1-2", true),
            ("", false),
            ("Alice", false),
            ("-rf", false),
            (".hidden", false),
            ("../etc", false),
            ("a/b", false),
            ("a b", false),
            ("ümlaut", false),
            (long.as_str(), false),
            (longest.as_str(), true),
        ] {
            assert_eq!(valid_account(name), ok, "{name:?}");
            assert_eq!(encode_request(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn malformed_requests_and_answers_are_errors() {
        for bad in [
            &b"forward Alice\n"[..],
            b"forward ../x\n",
            b"read alice\n",
            b"forward alice",
            b"forward \n",
        ] {
            assert!(read_request(&mut &bad[..]).is_err(), "{bad:?}");
        }
        // A request line is bounded whatever it holds.
        let long = format!("forward {}\n", "a".repeat(MAX_LINE));
        let e = read_request(&mut long.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
        for bad in [
            &b"file 5\nabc"[..],
            b"file x\n",
            b"file 99999999\n",
            b"temp 5.1.1 no\n",
            b"ok\n",
            b"",
        ] {
            assert!(Reply::read(&mut &bad[..]).is_err(), "{bad:?}");
        }
    }
}
