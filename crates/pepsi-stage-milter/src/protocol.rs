//! The Sendmail milter protocol, version 6, as one definition of both directions: what the
//! MTA (this stage) sends and what a filter answers. Pure: bytes in, values out.
//!
//! Every packet is a 4-byte big-endian length (of what follows), one command byte and the
//! command's data. Strings are NUL-terminated; numbers are 32-bit big-endian.
//!
//! ```text
//! MTA → filter                          filter → MTA
//! O  negotiate  version actions flags   O  negotiate  version actions flags [stage macros]*
//! D  macros     step (name value)*      c continue  a accept  r reject  t tempfail
//! C  connect    host family port addr   d discard  y reply "550 5.7.1 text"  s skip
//! H  helo       name                    h add header    name value
//! M  mail       <from> args*            i insert header index name value
//! R  rcpt       <to> args*              m change header index name value ("" deletes)
//! T  data                               b replace body  chunk (repeated, concatenated)
//! L  header     name value              e change from   <from> [args]
//! N  end of headers                     + add rcpt  <to>    2 add rcpt with args  <to> args
//! B  body       chunk (≤ 65535 bytes)   - delete rcpt  <to>
//! E  end of message                     q quarantine  reason
//! A  abort      Q quit                  p progress (the filter is still working)
//! ```
//!
//! Limits: a packet the filter sends is at most [`MAX_PACKET`] bytes; anything longer, a
//! command byte this side does not know, or a malformed body is a [`ProtocolError`] naming
//! what was wrong.

use std::fmt;

/// The protocol version this side speaks.
pub const VERSION: u32 = 6;
/// The largest body chunk one `B` packet carries.
pub const CHUNK: usize = 65535;
/// The largest packet accepted from a filter (a replaced body arrives in chunks of at most
/// 64 KiB; a filter that negotiated a 1 MiB data size may send 1 MiB ones).
pub const MAX_PACKET: usize = 1024 * 1024 + 1024;

/// Actions a filter may ask for in negotiation (`SMFIF_*`).
pub mod action {
    pub const ADD_HEADERS: u32 = 0x01;
    pub const CHANGE_BODY: u32 = 0x02;
    pub const ADD_RCPT: u32 = 0x04;
    pub const DELETE_RCPT: u32 = 0x08;
    pub const CHANGE_HEADERS: u32 = 0x10;
    pub const QUARANTINE: u32 = 0x20;
    pub const CHANGE_FROM: u32 = 0x40;
    pub const ADD_RCPT_ARGS: u32 = 0x80;
    pub const SET_MACROS: u32 = 0x100;
    /// Every action this side carries out.
    pub const ALL: u32 = 0x1ff;
}

/// Protocol steps a filter may leave out or not answer (`SMFIP_*`).
pub mod flag {
    pub const NO_CONNECT: u32 = 0x1;
    pub const NO_HELO: u32 = 0x2;
    pub const NO_MAIL: u32 = 0x4;
    pub const NO_RCPT: u32 = 0x8;
    pub const NO_BODY: u32 = 0x10;
    pub const NO_HEADERS: u32 = 0x20;
    pub const NO_EOH: u32 = 0x40;
    pub const NO_REPLY_HEADER: u32 = 0x80;
    pub const NO_UNKNOWN: u32 = 0x100;
    pub const NO_DATA: u32 = 0x200;
    /// The filter may answer a body chunk with `s`: no more body.
    pub const SKIP: u32 = 0x400;
    /// Rejected recipients are sent too (this side never rejects one itself).
    pub const RCPT_REJECTED: u32 = 0x800;
    pub const NO_REPLY_CONNECT: u32 = 0x1000;
    pub const NO_REPLY_HELO: u32 = 0x2000;
    pub const NO_REPLY_MAIL: u32 = 0x4000;
    pub const NO_REPLY_RCPT: u32 = 0x8000;
    pub const NO_REPLY_DATA: u32 = 0x10000;
    pub const NO_REPLY_UNKNOWN: u32 = 0x20000;
    pub const NO_REPLY_EOH: u32 = 0x40000;
    pub const NO_REPLY_BODY: u32 = 0x80000;
    /// Header values are sent and taken with their leading space.
    pub const HEADER_LEADING_SPACE: u32 = 0x100000;
    /// Body chunks of up to 256 KiB / 1 MiB (this side sends 64 KiB ones either way).
    pub const DATA_256K: u32 = 0x10000000;
    pub const DATA_1M: u32 = 0x20000000;
    /// Every flag this side honours.
    pub const ALL: u32 = 0x1fffff | DATA_256K | DATA_1M;
}

/// The protocol steps, as negotiation's macro lists and `D` packets name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    Connect,
    Helo,
    Mail,
    Rcpt,
    Data,
    EndOfMessage,
    EndOfHeaders,
}

impl Step {
    /// The index of the step in a negotiation's macro list (`SMFIM_*`).
    pub fn from_index(i: u32) -> Option<Step> {
        Some(match i {
            0 => Step::Connect,
            1 => Step::Helo,
            2 => Step::Mail,
            3 => Step::Rcpt,
            4 => Step::Data,
            5 => Step::EndOfMessage,
            6 => Step::EndOfHeaders,
            _ => return None,
        })
    }

    pub fn index(self) -> u32 {
        match self {
            Step::Connect => 0,
            Step::Helo => 1,
            Step::Mail => 2,
            Step::Rcpt => 3,
            Step::Data => 4,
            Step::EndOfMessage => 5,
            Step::EndOfHeaders => 6,
        }
    }

    /// The command byte of the step (what a `D` packet names).
    pub fn command(self) -> u8 {
        match self {
            Step::Connect => b'C',
            Step::Helo => b'H',
            Step::Mail => b'M',
            Step::Rcpt => b'R',
            Step::Data => b'T',
            Step::EndOfMessage => b'E',
            Step::EndOfHeaders => b'N',
        }
    }
}

/// Where the client of the original SMTP session was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Family {
    /// Not known (a message without an SMTP origin): no port or address follow.
    Unknown,
    Inet4 {
        port: u16,
        addr: String,
    },
    Inet6 {
        port: u16,
        addr: String,
    },
    Local {
        path: String,
    },
}

/// What this side sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Negotiate {
        version: u32,
        actions: u32,
        flags: u32,
    },
    Macros {
        step: Step,
        pairs: Vec<(String, String)>,
    },
    Connect {
        host: String,
        family: Family,
    },
    Helo(String),
    Mail(Vec<String>),
    Rcpt(Vec<String>),
    Data,
    Header {
        name: String,
        value: Vec<u8>,
    },
    EndOfHeaders,
    Body(Vec<u8>),
    EndOfMessage,
    Abort,
    Quit,
}

/// What a filter answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Negotiate {
        version: u32,
        actions: u32,
        flags: u32,
        /// Per step, the macro names the filter wants (negotiated `SET_MACROS`).
        macros: Vec<(Step, Vec<String>)>,
    },
    Continue,
    Accept,
    Reject,
    Tempfail,
    Discard,
    /// A full reply: `550 5.7.1 text` (its first digit says reject or tempfail).
    ReplyCode(String),
    Skip,
    Progress,
    AddHeader {
        name: String,
        value: Vec<u8>,
    },
    InsertHeader {
        index: u32,
        name: String,
        value: Vec<u8>,
    },
    ChangeHeader {
        index: u32,
        name: String,
        value: Vec<u8>,
    },
    ReplaceBody(Vec<u8>),
    ChangeFrom {
        from: String,
        args: Option<String>,
    },
    AddRcpt {
        rcpt: String,
        args: Option<String>,
    },
    DeleteRcpt(String),
    Quarantine(String),
    /// The filter closes the connection (`4`, `f`): a failure of the filter.
    Shutdown,
}

/// A packet this side could not take, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "milter protocol: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn err<T>(what: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(what.into()))
}

/// A packet: length, command byte, data.
pub fn frame(cmd: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 5);
    out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
    out.push(cmd);
    out.extend_from_slice(data);
    out
}

fn push_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend(s.iter().copied().filter(|&b| b != 0));
    out.push(0);
}

impl Command {
    /// The command as a packet.
    pub fn encode(&self) -> Vec<u8> {
        let mut d = Vec::new();
        let cmd = match self {
            Command::Negotiate {
                version,
                actions,
                flags,
            } => {
                for n in [version, actions, flags] {
                    d.extend_from_slice(&n.to_be_bytes());
                }
                b'O'
            }
            Command::Macros { step, pairs } => {
                d.push(step.command());
                for (k, v) in pairs {
                    push_str(&mut d, k.as_bytes());
                    push_str(&mut d, v.as_bytes());
                }
                b'D'
            }
            Command::Connect { host, family } => {
                push_str(&mut d, host.as_bytes());
                match family {
                    Family::Unknown => d.push(b'U'),
                    Family::Inet4 { port, addr } | Family::Inet6 { port, addr } => {
                        d.push(if matches!(family, Family::Inet4 { .. }) {
                            b'4'
                        } else {
                            b'6'
                        });
                        d.extend_from_slice(&port.to_be_bytes());
                        push_str(&mut d, addr.as_bytes());
                    }
                    Family::Local { path } => {
                        d.push(b'L');
                        d.extend_from_slice(&0u16.to_be_bytes());
                        push_str(&mut d, path.as_bytes());
                    }
                }
                b'C'
            }
            Command::Helo(name) => {
                push_str(&mut d, name.as_bytes());
                b'H'
            }
            Command::Mail(args) | Command::Rcpt(args) => {
                for a in args {
                    push_str(&mut d, a.as_bytes());
                }
                if matches!(self, Command::Mail(_)) {
                    b'M'
                } else {
                    b'R'
                }
            }
            Command::Data => b'T',
            Command::Header { name, value } => {
                push_str(&mut d, name.as_bytes());
                push_str(&mut d, value);
                b'L'
            }
            Command::EndOfHeaders => b'N',
            Command::Body(chunk) => {
                d.extend_from_slice(chunk);
                b'B'
            }
            Command::EndOfMessage => b'E',
            Command::Abort => b'A',
            Command::Quit => b'Q',
        };
        frame(cmd, &d)
    }

    /// Parses a packet's command byte and data (the filter's side of the protocol).
    pub fn decode(cmd: u8, data: &[u8]) -> Result<Command, ProtocolError> {
        let mut r = Reader::new(data);
        let c = match cmd {
            b'O' => Command::Negotiate {
                version: r.u32()?,
                actions: r.u32()?,
                flags: r.u32()?,
            },
            b'D' => {
                let step = match r.byte()? {
                    b'C' => Step::Connect,
                    b'H' => Step::Helo,
                    b'M' => Step::Mail,
                    b'R' => Step::Rcpt,
                    b'T' => Step::Data,
                    b'E' => Step::EndOfMessage,
                    b'N' => Step::EndOfHeaders,
                    other => return err(format!("macros for unknown step {:?}", other as char)),
                };
                let mut pairs = Vec::new();
                while !r.done() {
                    pairs.push((r.string()?, r.string()?));
                }
                Command::Macros { step, pairs }
            }
            b'C' => {
                let host = r.string()?;
                let family = match r.byte()? {
                    b'U' => Family::Unknown,
                    f @ (b'4' | b'6' | b'L') => {
                        let port = r.u16()?;
                        let addr = r.string()?;
                        match f {
                            b'4' => Family::Inet4 { port, addr },
                            b'6' => Family::Inet6 { port, addr },
                            _ => Family::Local { path: addr },
                        }
                    }
                    other => return err(format!("unknown address family {:?}", other as char)),
                };
                Command::Connect { host, family }
            }
            b'H' => Command::Helo(r.string()?),
            b'M' | b'R' => {
                let mut args = Vec::new();
                while !r.done() {
                    args.push(r.string()?);
                }
                if cmd == b'M' {
                    Command::Mail(args)
                } else {
                    Command::Rcpt(args)
                }
            }
            b'T' => Command::Data,
            b'L' => Command::Header {
                name: r.string()?,
                value: r.bytes()?.to_vec(),
            },
            b'N' => Command::EndOfHeaders,
            b'B' => Command::Body(r.rest().to_vec()),
            b'E' => Command::EndOfMessage,
            b'A' => Command::Abort,
            b'Q' => Command::Quit,
            other => return err(format!("unknown command {:?}", other as char)),
        };
        Ok(c)
    }
}

impl Reply {
    /// The reply as a packet (the filter's side of the protocol).
    pub fn encode(&self) -> Vec<u8> {
        let mut d = Vec::new();
        let cmd = match self {
            Reply::Negotiate {
                version,
                actions,
                flags,
                macros,
            } => {
                for n in [version, actions, flags] {
                    d.extend_from_slice(&n.to_be_bytes());
                }
                for (step, names) in macros {
                    d.extend_from_slice(&step.index().to_be_bytes());
                    push_str(&mut d, names.join(" ").as_bytes());
                }
                b'O'
            }
            Reply::Continue => b'c',
            Reply::Accept => b'a',
            Reply::Reject => b'r',
            Reply::Tempfail => b't',
            Reply::Discard => b'd',
            Reply::ReplyCode(text) => {
                push_str(&mut d, text.as_bytes());
                b'y'
            }
            Reply::Skip => b's',
            Reply::Progress => b'p',
            Reply::AddHeader { name, value } => {
                push_str(&mut d, name.as_bytes());
                push_str(&mut d, value);
                b'h'
            }
            Reply::InsertHeader { index, name, value }
            | Reply::ChangeHeader { index, name, value } => {
                d.extend_from_slice(&index.to_be_bytes());
                push_str(&mut d, name.as_bytes());
                push_str(&mut d, value);
                if matches!(self, Reply::InsertHeader { .. }) {
                    b'i'
                } else {
                    b'm'
                }
            }
            Reply::ReplaceBody(chunk) => {
                d.extend_from_slice(chunk);
                b'b'
            }
            Reply::ChangeFrom { from, args } => {
                push_str(&mut d, from.as_bytes());
                if let Some(a) = args {
                    push_str(&mut d, a.as_bytes());
                }
                b'e'
            }
            Reply::AddRcpt { rcpt, args } => {
                push_str(&mut d, rcpt.as_bytes());
                match args {
                    Some(a) => {
                        push_str(&mut d, a.as_bytes());
                        b'2'
                    }
                    None => b'+',
                }
            }
            Reply::DeleteRcpt(rcpt) => {
                push_str(&mut d, rcpt.as_bytes());
                b'-'
            }
            Reply::Quarantine(reason) => {
                push_str(&mut d, reason.as_bytes());
                b'q'
            }
            Reply::Shutdown => b'4',
        };
        frame(cmd, &d)
    }

    /// Parses a packet a filter sent: its command byte and data.
    pub fn decode(cmd: u8, data: &[u8]) -> Result<Reply, ProtocolError> {
        let mut r = Reader::new(data);
        let reply = match cmd {
            b'O' => {
                let version = r.u32()?;
                let actions = r.u32()?;
                let flags = r.u32()?;
                let mut macros = Vec::new();
                while !r.done() {
                    let i = r.u32()?;
                    let step = Step::from_index(i)
                        .ok_or_else(|| ProtocolError(format!("macro list for unknown step {i}")))?;
                    let names = r.string()?;
                    macros.push((step, names.split_whitespace().map(str::to_owned).collect()));
                }
                Reply::Negotiate {
                    version,
                    actions,
                    flags,
                    macros,
                }
            }
            b'c' => Reply::Continue,
            b'a' => Reply::Accept,
            b'r' => Reply::Reject,
            b't' => Reply::Tempfail,
            b'd' => Reply::Discard,
            b'y' => {
                let text = r.string()?;
                match text.as_bytes().first() {
                    Some(b'4' | b'5') => Reply::ReplyCode(text),
                    _ => return err(format!("reply code {text:?} is not a 4xx or 5xx reply")),
                }
            }
            b's' => Reply::Skip,
            b'p' => Reply::Progress,
            b'h' => Reply::AddHeader {
                name: r.header_name()?,
                value: r.bytes()?.to_vec(),
            },
            b'i' | b'm' => {
                let index = r.u32()?;
                let name = r.header_name()?;
                let value = r.bytes()?.to_vec();
                if cmd == b'i' {
                    Reply::InsertHeader { index, name, value }
                } else {
                    Reply::ChangeHeader { index, name, value }
                }
            }
            b'b' => Reply::ReplaceBody(r.rest().to_vec()),
            b'e' => Reply::ChangeFrom {
                from: r.string()?,
                args: r.optional_string()?,
            },
            b'+' => Reply::AddRcpt {
                rcpt: r.string()?,
                args: None,
            },
            b'2' => Reply::AddRcpt {
                rcpt: r.string()?,
                args: r.optional_string()?,
            },
            b'-' => Reply::DeleteRcpt(r.string()?),
            b'q' => Reply::Quarantine(r.string()?),
            b'4' | b'f' => Reply::Shutdown,
            other => {
                return err(format!(
                    "unknown reply {:?} (0x{other:02x})",
                    (other as char).escape_default().to_string()
                ));
            }
        };
        Ok(reply)
    }
}

/// One packet at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    pub command: u8,
    pub data: &'a [u8],
    /// How many bytes of the buffer it took.
    pub used: usize,
}

/// Splits a packet off the front of `buf`: `Ok(None)` until a whole one is there.
pub fn take_packet(buf: &[u8]) -> Result<Option<Packet<'_>>, ProtocolError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len == 0 {
        return err("a packet of length 0 (no command byte)");
    }
    if len > MAX_PACKET {
        return err(format!("a packet of {len} bytes (at most {MAX_PACKET})"));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    Ok(Some(Packet {
        command: buf[4],
        data: &buf[5..4 + len],
        used: 4 + len,
    }))
}

/// Reads the fields of one packet's data.
struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    fn done(&self) -> bool {
        self.data.is_empty()
    }

    fn byte(&mut self) -> Result<u8, ProtocolError> {
        let (&b, rest) = self
            .data
            .split_first()
            .ok_or_else(|| ProtocolError("a packet ends early".into()))?;
        self.data = rest;
        Ok(b)
    }

    fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_be_bytes([self.byte()?, self.byte()?]))
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        if self.data.len() < 4 {
            return err("a packet ends inside a number");
        }
        let (n, rest) = self.data.split_at(4);
        self.data = rest;
        Ok(u32::from_be_bytes([n[0], n[1], n[2], n[3]]))
    }

    /// A NUL-terminated field, as bytes.
    fn bytes(&mut self) -> Result<&'a [u8], ProtocolError> {
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| ProtocolError("a string without its NUL".into()))?;
        let (s, rest) = self.data.split_at(end);
        self.data = &rest[1..];
        Ok(s)
    }

    fn string(&mut self) -> Result<String, ProtocolError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| ProtocolError("a string that is not UTF-8".into()))
    }

    fn optional_string(&mut self) -> Result<Option<String>, ProtocolError> {
        if self.done() {
            return Ok(None);
        }
        let s = self.string()?;
        Ok((!s.is_empty()).then_some(s))
    }

    /// A header field name: printable ASCII without `:` (RFC 5322 §2.2), at most 998 bytes.
    fn header_name(&mut self) -> Result<String, ProtocolError> {
        let name = self.string()?;
        if name.is_empty()
            || name.len() > 998
            || !name.bytes().all(|b| (33..=126).contains(&b) && b != b':')
        {
            return err(format!("{name:?} is not a header field name"));
        }
        Ok(name)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unframe(packet: &[u8]) -> (u8, Vec<u8>) {
        let p = take_packet(packet).unwrap().unwrap();
        assert_eq!(p.used, packet.len());
        (p.command, p.data.to_vec())
    }

    #[test]
    fn every_command_reads_back_as_itself() {
        let commands = [
            Command::Negotiate {
                version: 6,
                actions: action::ALL,
                flags: flag::ALL,
            },
            Command::Macros {
                step: Step::Mail,
                pairs: vec![
                    ("i".into(), "42".into()),
                    ("{auth_authen}".into(), "a".into()),
                ],
            },
            Command::Connect {
                host: "mx.example.org".into(),
                family: Family::Inet4 {
                    port: 25,
                    addr: "192.0.2.1".into(),
                },
            },
            Command::Connect {
                host: "[2001:db8::1]".into(),
                family: Family::Inet6 {
                    port: 0,
                    addr: "2001:db8::1".into(),
                },
            },
            Command::Connect {
                host: "localhost".into(),
                family: Family::Unknown,
            },
            Command::Helo("client.example.org".into()),
            Command::Mail(vec!["<a@example.org>".into(), "BODY=8BITMIME".into()]),
            Command::Rcpt(vec!["<b@example.test>".into()]),
            Command::Data,
            Command::Header {
                name: "Subject".into(),
                value: b"hello\r\n\tthere".to_vec(),
            },
            Command::EndOfHeaders,
            Command::Body(b"text\r\n".to_vec()),
            Command::EndOfMessage,
            Command::Abort,
            Command::Quit,
        ];
        for c in commands {
            let (cmd, data) = unframe(&c.encode());
            assert_eq!(Command::decode(cmd, &data).unwrap(), c);
        }
    }

    #[test]
    fn every_reply_reads_back_as_itself() {
        let replies = [
            Reply::Negotiate {
                version: 6,
                actions: action::ADD_HEADERS | action::QUARANTINE,
                flags: flag::NO_CONNECT | flag::NO_REPLY_HEADER,
                macros: vec![(Step::EndOfMessage, vec!["i".into(), "{auth_type}".into()])],
            },
            Reply::Continue,
            Reply::Accept,
            Reply::Reject,
            Reply::Tempfail,
            Reply::Discard,
            Reply::ReplyCode("554 5.7.1 Spam message rejected".into()),
            Reply::Skip,
            Reply::Progress,
            Reply::AddHeader {
                name: "X-Spam".into(),
                value: b"Yes".to_vec(),
            },
            Reply::InsertHeader {
                index: 0,
                name: "DKIM-Signature".into(),
                value: b"v=1; a=rsa-sha256".to_vec(),
            },
            Reply::ChangeHeader {
                index: 2,
                name: "Subject".into(),
                value: Vec::new(),
            },
            Reply::ReplaceBody(b"new body\r\n".to_vec()),
            Reply::ChangeFrom {
                from: "<bounces@example.org>".into(),
                args: Some("SIZE=10".into()),
            },
            Reply::ChangeFrom {
                from: "<>".into(),
                args: None,
            },
            Reply::AddRcpt {
                rcpt: "<c@example.test>".into(),
                args: None,
            },
            Reply::AddRcpt {
                rcpt: "<d@example.test>".into(),
                args: Some("NOTIFY=NEVER".into()),
            },
            Reply::DeleteRcpt("<b@example.test>".into()),
            Reply::Quarantine("held by the filter".into()),
            Reply::Shutdown,
        ];
        for r in replies {
            let (cmd, data) = unframe(&r.encode());
            assert_eq!(Reply::decode(cmd, &data).unwrap(), r);
        }
    }

    #[test]
    fn bad_packets_are_named() {
        let cases: &[(u8, &[u8], &str)] = &[
            (b'Z', b"", "unknown reply"),
            (b'y', b"250 ok\0", "not a 4xx or 5xx"),
            (b'y', b"550 no nul", "without its NUL"),
            (b'h', b"Bad Name\0v\0", "not a header field name"),
            (b'h', b"X:\0v\0", "not a header field name"),
            (b'm', b"\0\0", "ends inside a number"),
            (
                b'O',
                b"\0\0\0\x06\0\0\0\x01\0\0\0\0\0\0\0\x09x\0",
                "unknown step 9",
            ),
        ];
        for (cmd, data, want) in cases {
            let e = Reply::decode(*cmd, data).unwrap_err();
            assert!(e.0.contains(want), "{}: {e}", *cmd as char);
        }
        assert!(
            take_packet(&[0, 0, 0, 0])
                .unwrap_err()
                .0
                .contains("length 0")
        );
        assert!(
            take_packet(&[0x7f, 0, 0, 0, b'c'])
                .unwrap_err()
                .0
                .contains("at most")
        );
        assert_eq!(take_packet(&[0, 0, 0, 2, b'c']).unwrap(), None);
    }

    #[test]
    fn a_nul_inside_a_value_cannot_end_the_field_early() {
        let packet = Command::Header {
            name: "Subject".into(),
            value: b"a\0b".to_vec(),
        }
        .encode();
        let (cmd, data) = unframe(&packet);
        assert_eq!(
            Command::decode(cmd, &data).unwrap(),
            Command::Header {
                name: "Subject".into(),
                value: b"ab".to_vec()
            }
        );
    }
}
