//! The co-process protocol between `pepsi-stage-relay-to-maildir` and the writer, both ends.
//!
//! A delivery is eight lines, in this order, each ending with LF, then the message:
//!
//! ```text
//! mailbox /var/mail/alice/Maildir
//! return-path bob@example.org          (empty for the null sender)
//! delivered-to alice@example.test
//! key 81723 1733318400123456           (queue row, its received_at in µs; empty: none)
//! quota 10485760                       (bytes; 0 = no limit)
//! quota-messages 1000                  (messages; 0 = no limit)
//! dir-sync now                         (or `later`: see below)
//! size 1234
//! <exactly `size` bytes of message>
//! ```
//!
//! With a `key`, the copy's file name is derived from the key and the recipient
//! ([`crate::maildir::keyed_prefix`]): a delivery asked again after a crash (of the writer,
//! the stage, the dispatcher or the database) finds the copy it already stored and answers
//! `ok` with its name without storing a second one; a copy left complete in `tmp/` is
//! finished (synced, renamed), a partial one written again. See `docs/delivery.md`.
//!
//! The answer is one line: `ok <file name in new/>`, `perm <x.y.z> <text>` or
//! `temp <x.y.z> <text>` (RFC 3463 status, class 5 or 4). With a quota (either limit), the
//! writer keeps the Maildir++ `maildirsize` file (`quota`) and answers `ok <name> <bytes>
//! <messages>` with the mailbox's usage after the delivery, or `full <bytes> <messages>
//! <text>` when the message does not fit (a 5.2.2 for the stage to decide on).
//!
//! `usage <mailbox>`, `quota <bytes>`, `quota-messages <n>`, `rebuild yes|no` (four lines)
//! asks for a mailbox's usage under those limits, from `maildirsize` (rebuilt from the
//! directory when needed, or always with `rebuild yes`): `usage <bytes> <messages>`. With `dir-sync now` the copy is
//! durable when `ok` comes (file synced, renamed into `new/`, `new/` synced). With
//! `dir-sync later` the file is synced and renamed but `new/` is not: the rename is durable
//! only after the next `sync` request, one line `sync`, answered `ok synced <n>` once every
//! `new/` written since the last one (n of them) is synced, or `temp 4.3.0 <text>` naming
//! the directory that failed. A round of deliveries thus costs one directory sync per
//! mailbox instead of one per message; the caller sends `sync` before it records any of
//! them as delivered.
//!
//! A request the writer cannot parse leaves the stream out of step, so it answers
//! `temp 4.3.0 protocol error: ...` and exits; the stage starts a new one. This module does
//! no I/O beyond the reader and writer it is given.

use std::io::{BufRead, Read};
use std::path::PathBuf;

pub use crate::quota::{Limits, Usage};

/// The longest header line accepted (a path or an address).
pub const MAX_LINE: usize = 4096;
/// The largest message accepted: a guard against a garbled length, not a policy.
pub const MAX_MESSAGE: u64 = 1 << 32;

/// One delivery the stage asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Absolute path of the Maildir (the directory holding tmp/, new/, cur/).
    pub mailbox: PathBuf,
    /// The envelope sender, without angle brackets; empty for the null sender.
    pub return_path: String,
    /// The envelope recipient this copy is for.
    pub delivered_to: String,
    /// What makes the delivery the same one when it is asked again; `None`: a fresh name
    /// every time.
    pub key: Option<DeliveryKey>,
    /// Mailbox quota in bytes; `None` for none.
    pub quota: Option<u64>,
    /// Mailbox quota in messages; `None` for none.
    pub quota_messages: Option<u64>,
    /// When `new/` is synced after the rename.
    pub dir_sync: DirSync,
    /// The message as stored (headers, CRLF, body).
    pub message: Vec<u8>,
}

/// The identity of one delivery across its retries: the queue row and the row's
/// incarnation (its `received_at`, in microseconds since the epoch), so that a row id used
/// again (a database restored from a backup, a failover that lost the sequence's advance)
/// never matches a copy stored for another message. With the recipient, it names the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryKey {
    pub row: i64,
    pub incarnation: i64,
}

impl DeliveryKey {
    /// `<row> <incarnation>`, the `key` line's value.
    fn encode(&self) -> String {
        format!("{} {}", self.row, self.incarnation)
    }

    fn parse(v: &str) -> Result<Option<DeliveryKey>, ProtocolError> {
        if v.is_empty() {
            return Ok(None);
        }
        let bad = || {
            ProtocolError::Malformed(format!(
                "key {v:?} is not `<row> <received_at in microseconds>`"
            ))
        };
        let (row, incarnation) = v.split_once(' ').ok_or_else(bad)?;
        Ok(Some(DeliveryKey {
            row: row.parse().map_err(|_| bad())?,
            incarnation: incarnation.parse().map_err(|_| bad())?,
        }))
    }
}

/// When the writer syncs `new/` after renaming a delivery into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirSync {
    /// Before answering: the copy is durable when `ok` comes.
    Now,
    /// At the next `sync` request.
    Later,
}

impl DirSync {
    fn as_str(self) -> &'static str {
        match self {
            DirSync::Now => "now",
            DirSync::Later => "later",
        }
    }
}

/// One request as the writer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Store one copy.
    Deliver(Request),
    /// Sync every `new/` written with `dir-sync later` since the last sync.
    Sync,
    /// Report a mailbox's usage.
    Usage(UsageRequest),
}

/// `usage`: what a mailbox holds under `limits`, from `maildirsize` or, with `rebuild`,
/// counted from the directory again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRequest {
    pub mailbox: PathBuf,
    pub limits: Limits,
    pub rebuild: bool,
}

impl UsageRequest {
    /// The request's four lines.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mailbox = self
            .mailbox
            .to_str()
            .ok_or_else(|| format!("mailbox path {:?} is not UTF-8", self.mailbox))?;
        check_value("mailbox", mailbox)?;
        Ok(format!(
            "usage {mailbox}\nquota {}\nquota-messages {}\nrebuild {}\n",
            self.limits.bytes.unwrap_or(0),
            self.limits.messages.unwrap_or(0),
            if self.rebuild { "yes" } else { "no" }
        )
        .into_bytes())
    }
}

/// The `sync` request, LF included.
pub const SYNC_LINE: &[u8] = b"sync\n";

pub use pepsi_conf::coprocess::ProtocolError;

impl Request {
    /// The eight header lines (everything before the message bytes).
    pub fn encode_head(&self) -> Result<Vec<u8>, String> {
        let mailbox = self
            .mailbox
            .to_str()
            .ok_or_else(|| format!("mailbox path {:?} is not UTF-8", self.mailbox))?;
        for (what, v) in [
            ("mailbox", mailbox),
            ("return-path", self.return_path.as_str()),
            ("delivered-to", self.delivered_to.as_str()),
        ] {
            check_value(what, v)?;
        }
        Ok(format!(
            "mailbox {mailbox}\nreturn-path {}\ndelivered-to {}\nkey {}\nquota {}\nquota-messages {}\ndir-sync {}\nsize {}\n",
            self.return_path,
            self.delivered_to,
            self.key.map(|k| k.encode()).unwrap_or_default(),
            self.quota.unwrap_or(0),
            self.quota_messages.unwrap_or(0),
            self.dir_sync.as_str(),
            self.message.len()
        )
        .into_bytes())
    }

    /// The request's limits.
    pub fn limits(&self) -> Limits {
        Limits {
            bytes: self.quota,
            messages: self.quota_messages,
        }
    }

    /// The length of [`Request::prepended_headers`] for this sender and recipient: what the
    /// stored copy adds to the message, which counts against a quota.
    pub fn prepended_len(return_path: &str, delivered_to: &str) -> usize {
        "Return-Path: <>\r\nDelivered-To: \r\n".len() + return_path.len() + delivered_to.len()
    }

    /// The header lines the writer puts in front of the stored copy.
    pub fn prepended_headers(&self) -> Vec<u8> {
        format!(
            "Return-Path: <{}>\r\nDelivered-To: {}\r\n",
            self.return_path, self.delivered_to
        )
        .into_bytes()
    }
}

/// A value may not hold control characters: it becomes one line here and one header line in
/// the stored message.
fn check_value(what: &str, v: &str) -> Result<(), String> {
    if v.len() > MAX_LINE {
        return Err(format!("{what} is longer than {MAX_LINE} bytes"));
    }
    match v.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!("{what} {v:?} contains the control character {c:?}")),
        None => Ok(()),
    }
}

/// Reads one request; `Ok(None)` at a clean end of input (before the first line).
pub fn read_command<R: BufRead>(input: &mut R) -> Result<Option<Command>, ProtocolError> {
    let Some(first) = line(input, "mailbox, usage or sync", true)? else {
        return Ok(None);
    };
    if first == "sync" {
        return Ok(Some(Command::Sync));
    }
    if first.starts_with("usage ") {
        let mailbox = value_of(&first, "usage")?;
        let limits = read_limits(input)?;
        let rebuild = match field(input, "rebuild", false)?.as_deref() {
            Some("yes") => true,
            Some("no") => false,
            other => {
                return Err(ProtocolError::Malformed(format!(
                    "rebuild {:?} is not `yes` or `no`",
                    other.unwrap_or_default()
                )));
            }
        };
        return Ok(Some(Command::Usage(UsageRequest {
            mailbox: PathBuf::from(mailbox),
            limits,
            rebuild,
        })));
    }
    let mailbox = value_of(&first, "mailbox")?;
    let return_path = field(input, "return-path", false)?.unwrap_or_default();
    let delivered_to = field(input, "delivered-to", false)?.unwrap_or_default();
    let key = DeliveryKey::parse(&field(input, "key", false)?.unwrap_or_default())?;
    let limits = read_limits(input)?;
    let dir_sync = match field(input, "dir-sync", false)?.as_deref() {
        Some("now") => DirSync::Now,
        Some("later") => DirSync::Later,
        other => {
            return Err(ProtocolError::Malformed(format!(
                "dir-sync {:?} is not `now` or `later`",
                other.unwrap_or_default()
            )));
        }
    };
    let size = number(&field(input, "size", false)?.unwrap_or_default(), "size")?;
    if size > MAX_MESSAGE {
        return Err(ProtocolError::Malformed(format!(
            "size {size} is larger than {MAX_MESSAGE}"
        )));
    }
    if delivered_to.is_empty() {
        return Err(ProtocolError::Malformed("delivered-to is empty".into()));
    }
    let mut message = Vec::with_capacity(size as usize);
    let got = input.take(size).read_to_end(&mut message)?;
    if (got as u64) < size {
        return Err(ProtocolError::Malformed(format!(
            "the message ended after {got} of {size} bytes"
        )));
    }
    Ok(Some(Command::Deliver(Request {
        mailbox: PathBuf::from(mailbox),
        return_path,
        delivered_to,
        key,
        quota: limits.bytes,
        quota_messages: limits.messages,
        dir_sync,
        message,
    })))
}

/// The `quota` and `quota-messages` lines (0: no limit).
fn read_limits<R: BufRead>(input: &mut R) -> Result<Limits, ProtocolError> {
    let quota = number(&field(input, "quota", false)?.unwrap_or_default(), "quota")?;
    let messages = number(
        &field(input, "quota-messages", false)?.unwrap_or_default(),
        "quota-messages",
    )?;
    Ok(Limits {
        bytes: (quota > 0).then_some(quota),
        messages: (messages > 0).then_some(messages),
    })
}

fn number(v: &str, what: &str) -> Result<u64, ProtocolError> {
    v.parse()
        .map_err(|_| ProtocolError::Malformed(format!("{what} {v:?} is not a whole number")))
}

/// Reads `<name> <value>\n`. At a clean end of input returns `None` when `eof_ok`.
fn field<R: BufRead>(
    input: &mut R,
    name: &str,
    eof_ok: bool,
) -> Result<Option<String>, ProtocolError> {
    match line(input, name, eof_ok)? {
        Some(line) => value_of(&line, name).map(Some),
        None => Ok(None),
    }
}

/// Reads one LF-terminated UTF-8 line (without its LF), `what` naming it in errors. At a
/// clean end of input returns `None` when `eof_ok`.
fn line<R: BufRead>(
    input: &mut R,
    what: &str,
    eof_ok: bool,
) -> Result<Option<String>, ProtocolError> {
    let mut line = Vec::new();
    let n = input
        .take(MAX_LINE as u64 + 64)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return if eof_ok {
            Ok(None)
        } else {
            Err(ProtocolError::Malformed(format!(
                "input ended before the {what} line"
            )))
        };
    }
    if line.pop() != Some(b'\n') {
        return Err(ProtocolError::Malformed(format!(
            "the {what} line is too long or unterminated"
        )));
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| ProtocolError::Malformed(format!("the {what} line is not UTF-8")))
}

/// The value of `<name> <value>` (empty for a bare `<name>`), checked like every value.
fn value_of(line: &str, name: &str) -> Result<String, ProtocolError> {
    let value = match line.split_once(' ') {
        Some((key, value)) if key == name => value,
        None if line == name => "",
        _ => {
            return Err(ProtocolError::Malformed(format!(
                "expected a {name} line, got {line:?}"
            )));
        }
    };
    check_value(name, value).map_err(ProtocolError::Malformed)?;
    Ok(value.to_owned())
}

/// The writer's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Delivered: the file name in new/ (or, for `sync`, `synced <n>`).
    Ok(String),
    /// Delivered under a quota: the file name and the mailbox's usage after it.
    Stored { name: String, usage: Usage },
    /// Not delivered: the message does not fit the mailbox's quota (5.2.2).
    Full { usage: Usage, text: String },
    /// The answer to `usage`.
    Usage(Usage),
    /// Will not succeed on retry: status `5.x.y` and a text.
    Perm { status: String, text: String },
    /// May succeed later: status `4.x.y` and a text.
    Temp { status: String, text: String },
}

impl Reply {
    pub fn perm(status: &str, text: impl Into<String>) -> Self {
        Reply::Perm {
            status: status.to_owned(),
            text: text.into(),
        }
    }

    pub fn temp(status: &str, text: impl Into<String>) -> Self {
        Reply::Temp {
            status: status.to_owned(),
            text: text.into(),
        }
    }

    /// The reply line, LF included; control characters in the text become spaces so one
    /// reply is always one line.
    pub fn to_line(&self) -> String {
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect()
        };
        match self {
            Reply::Ok(name) => format!("ok {}\n", clean(name)),
            Reply::Stored { name, usage } => {
                format!("ok {} {} {}\n", clean(name), usage.bytes, usage.messages)
            }
            Reply::Full { usage, text } => {
                format!("full {} {} {}\n", usage.bytes, usage.messages, clean(text))
            }
            Reply::Usage(usage) => format!("usage {} {}\n", usage.bytes, usage.messages),
            Reply::Perm { status, text } => format!("perm {status} {}\n", clean(text)),
            Reply::Temp { status, text } => format!("temp {status} {}\n", clean(text)),
        }
    }

    /// Parses a reply line (with or without its LF). The status class must match the word:
    /// `perm` carries 5.x.y, `temp` 4.x.y.
    pub fn parse(line: &str) -> Result<Reply, String> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let usage = |b: &str, c: &str| -> Option<Usage> {
            Some(Usage {
                bytes: b.parse().ok()?,
                messages: c.parse().ok()?,
            })
        };
        match word {
            "ok" if !rest.is_empty() => {
                let fields: Vec<&str> = rest.split(' ').collect();
                match fields[..] {
                    [name, b, c] if !name.starts_with("synced") => match usage(b, c) {
                        Some(usage) => Ok(Reply::Stored {
                            name: name.to_owned(),
                            usage,
                        }),
                        None => Err(format!("reply {line:?}: the usage is not two numbers")),
                    },
                    _ => Ok(Reply::Ok(rest.to_owned())),
                }
            }
            "full" | "usage" => {
                let mut fields = rest.splitn(3, ' ');
                let (b, c) = (fields.next().unwrap_or(""), fields.next().unwrap_or(""));
                let Some(usage) = usage(b, c) else {
                    return Err(format!("reply {line:?}: {word} needs two numbers"));
                };
                Ok(if word == "usage" {
                    Reply::Usage(usage)
                } else {
                    Reply::Full {
                        usage,
                        text: fields.next().unwrap_or("mailbox full").to_owned(),
                    }
                })
            }
            "perm" | "temp" => {
                let (status, text) = rest.split_once(' ').unwrap_or((rest, ""));
                let class = if word == "perm" { "5" } else { "4" };
                if pepsi_smtp::encoding::enhanced_status_class(status).is_none()
                    || !status.starts_with(class)
                {
                    return Err(format!(
                        "reply {line:?}: {word} needs an enhanced status {class}.x.y"
                    ));
                }
                let text = if text.is_empty() {
                    "no text".to_owned()
                } else {
                    text.to_owned()
                };
                Ok(if word == "perm" {
                    Reply::perm(status, text)
                } else {
                    Reply::temp(status, text)
                })
            }
            _ => Err(format!(
                "reply {line:?} is not `ok <name>`, `full`, `usage`, `perm <x.y.z> <text>` or `temp <x.y.z> <text>`"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_reply(line: &str, want: Result<Reply, &str>) {
        match (Reply::parse(line), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{line:?}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{line:?}: {got}"),
            (got, want) => panic!("{line:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn reply_lines() {
        let cases: Vec<(&str, Result<Reply, &str>)> = vec![
            (
                "ok 1.M2P3Q4.host,S=9\n",
                Ok(Reply::Ok("1.M2P3Q4.host,S=9".into())),
            ),
            (
                "perm 5.1.1 no such mailbox",
                Ok(Reply::perm("5.1.1", "no such mailbox")),
            ),
            (
                "temp 4.3.0 rename failed: Not a directory",
                Ok(Reply::temp("4.3.0", "rename failed: Not a directory")),
            ),
            ("temp 4.2.2", Ok(Reply::temp("4.2.2", "no text"))),
            ("perm 4.1.1 wrong class", Err("needs an enhanced status 5")),
            ("temp 5.3.0 wrong class", Err("needs an enhanced status 4")),
            ("perm 5.1 short", Err("enhanced status")),
            ("perm 5.1.1234 long", Err("enhanced status")),
            ("ok", Err("is not `ok <name>`")),
            (
                "ok 1.M2P3Q4.host,S=9 120 3",
                Ok(Reply::Stored {
                    name: "1.M2P3Q4.host,S=9".into(),
                    usage: Usage {
                        bytes: 120,
                        messages: 3,
                    },
                }),
            ),
            ("ok synced 2", Ok(Reply::Ok("synced 2".into()))),
            ("ok name 12 x", Err("the usage is not two numbers")),
            (
                "full 990 4 mailbox full: 990 + 20 > 1000",
                Ok(Reply::Full {
                    usage: Usage {
                        bytes: 990,
                        messages: 4,
                    },
                    text: "mailbox full: 990 + 20 > 1000".into(),
                }),
            ),
            ("full x 4 y", Err("full needs two numbers")),
            (
                "usage 5 1",
                Ok(Reply::Usage(Usage {
                    bytes: 5,
                    messages: 1,
                })),
            ),
            ("", Err("is not")),
            ("maybe 4.0.0 x", Err("is not")),
        ];
        for (line, want) in cases {
            check_reply(line, want);
        }
    }

    #[test]
    fn replies_round_trip_and_stay_one_line() {
        let usage = Usage {
            bytes: 7,
            messages: 1,
        };
        for r in [
            Reply::Ok("x".into()),
            Reply::Stored {
                name: "n".into(),
                usage,
            },
            Reply::Full {
                usage,
                text: "over\nquota".into(),
            },
            Reply::Usage(usage),
            Reply::perm("5.2.2", "mailbox full"),
            Reply::temp("4.3.0", "two\nlines"),
        ] {
            let line = r.to_line();
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            let back = Reply::parse(&line).unwrap();
            if !matches!(&r, Reply::Temp { text, .. } | Reply::Full { text, .. } if text.contains('\n'))
            {
                assert_eq!(back, r);
            }
        }
    }

    fn request() -> Request {
        Request {
            mailbox: "/srv/mail/alice/Maildir".into(),
            return_path: String::new(),
            delivered_to: "alice@example.test".into(),
            key: Some(DeliveryKey {
                row: 81723,
                incarnation: 1733318400123456,
            }),
            quota: Some(1000),
            quota_messages: None,
            dir_sync: DirSync::Now,
            message: b"Subject: x\r\n\r\nbody\r\n".to_vec(),
        }
    }

    fn delivery(c: Option<Command>) -> Option<Request> {
        match c {
            Some(Command::Deliver(r)) => Some(r),
            Some(Command::Sync | Command::Usage(_)) => {
                panic!("another request where a delivery was expected")
            }
            None => None,
        }
    }

    #[test]
    fn requests_round_trip_back_to_back() {
        let mut wire = Vec::new();
        for r in [
            request(),
            Request {
                quota: None,
                quota_messages: Some(50),
                dir_sync: DirSync::Later,
                key: None,
                ..request()
            },
        ] {
            wire.extend(r.encode_head().unwrap());
            wire.extend(&r.message);
        }
        let usage = UsageRequest {
            mailbox: "/srv/mail/bob/Maildir".into(),
            limits: Limits {
                bytes: Some(10),
                messages: None,
            },
            rebuild: true,
        };
        wire.extend(usage.encode().unwrap());
        wire.extend(SYNC_LINE);
        let mut input = std::io::Cursor::new(wire);
        assert_eq!(delivery(read_command(&mut input).unwrap()), Some(request()));
        let second = delivery(read_command(&mut input).unwrap()).unwrap();
        assert_eq!(
            (
                second.quota,
                second.quota_messages,
                second.dir_sync,
                second.key
            ),
            (None, Some(50), DirSync::Later, None)
        );
        assert_eq!(
            read_command(&mut input).unwrap(),
            Some(Command::Usage(usage))
        );
        assert_eq!(read_command(&mut input).unwrap(), Some(Command::Sync));
        assert!(read_command(&mut input).unwrap().is_none());
        assert_eq!(
            request().prepended_headers(),
            b"Return-Path: <>\r\nDelivered-To: alice@example.test\r\n"
        );
        let r = Request {
            return_path: "bob@example.org".into(),
            ..request()
        };
        assert_eq!(
            Request::prepended_len(&r.return_path, &r.delivered_to),
            r.prepended_headers().len()
        );
    }

    #[test]
    fn malformed_requests_name_what_is_wrong() {
        let cases: &[(&[u8], &str)] = &[
            (b"mailbox /m\n", "input ended before the return-path line"),
            (b"path /m\n", "expected a mailbox line"),
            (b"sync now\n", "expected a mailbox line"),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey\nquota 0\ndir-sync now\nsize 1\nz",
                "expected a quota-messages line",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nquota 0\n",
                "expected a key line",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey 12\nquota 0\n",
                "key \"12\" is not `<row> <received_at in microseconds>`",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey 12 x\nquota 0\n",
                "key \"12 x\" is not",
            ),
            (
                b"usage /m\nquota 1\nquota-messages 0\nrebuild maybe\n",
                "rebuild \"maybe\" is not `yes` or `no`",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey\nquota x\nquota-messages 0\ndir-sync now\nsize 1\nz",
                "quota \"x\" is not a whole number",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey\nquota 0\nquota-messages 0\nsize 1\nz",
                "expected a dir-sync line",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey\nquota 0\nquota-messages 0\ndir-sync soon\nsize 1\nz",
                "dir-sync \"soon\" is not `now` or `later`",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to b\nkey\nquota 0\nquota-messages 0\ndir-sync now\nsize 10\nshort",
                "ended after 5 of 10 bytes",
            ),
            (
                b"mailbox /m\nreturn-path a\r\ndelivered-to b\nkey\nquota 0\nquota-messages 0\ndir-sync now\nsize 0\n",
                "control character",
            ),
            (
                b"mailbox /m\nreturn-path a\ndelivered-to \nkey\nquota 0\nquota-messages 0\ndir-sync now\nsize 0\n",
                "delivered-to is empty",
            ),
        ];
        for (wire, want) in cases {
            let err = read_command(&mut std::io::Cursor::new(wire.to_vec()))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(want),
                "{:?}: {err}",
                String::from_utf8_lossy(wire)
            );
        }
        let bad = Request {
            delivered_to: "a@b\nmailbox /etc".into(),
            ..request()
        };
        assert!(bad.encode_head().unwrap_err().contains("control character"));
    }
}
