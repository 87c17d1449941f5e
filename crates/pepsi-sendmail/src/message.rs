//! The message a local program hands over, made into what the queue stores: input read
//! within the limits with LF or CRLF line ends (stored as CRLF), an optional lone dot ending
//! it, the recipients taken from the header with `-t`, Bcc removed, and the trace and the
//! fields a message must have (Received, From, Date, Message-ID) added. Pure: bytes and
//! facts in, a [`Prepared`] message or a [`MessageError`] naming what was wrong out; the
//! caller supplies the clock's reading and the user's identity.

use std::io::BufRead;

use pepsi_contract::message::{has_field, recipient_addresses, remove_fields};
use pepsi_contract::state::{Dsn, DsnRcpt, Ret};

/// The bounds every message is read within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Header block plus body, as stored.
    pub max_size: u64,
    /// Octets of a line with its CRLF.
    pub max_line: usize,
    pub max_recipients: usize,
}

/// Why a message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("the message exceeds the limit of {limit} octets (MAX_MESSAGE_SIZE)")]
    TooBig { limit: u64 },
    #[error("line {line} exceeds the limit of {limit} octets with its line end (MAX_LINE_LENGTH)")]
    LineTooLong { line: usize, limit: usize },
    #[error("line {line} holds a carriage return that does not end the line")]
    BareCr { line: usize },
    #[error("cannot read the message: {0}")]
    Read(String),
    #[error("no recipients: name them as arguments, or use -t to take them from To, Cc and Bcc")]
    NoRecipients,
    #[error("{count} recipients: at most {limit} (MAX_RECIPIENTS)")]
    TooManyRecipients { count: usize, limit: usize },
    #[error("recipient {address:?} is not an address: {why}")]
    BadRecipient { address: String, why: String },
    #[error("sender {address:?} is not an address: {why}")]
    BadSender { address: String, why: String },
}

/// Reads a message from `input` up to its end (or a line holding a single dot when
/// `dot_ends`), with every line end made CRLF.
pub fn read_message(
    input: &mut impl BufRead,
    dot_ends: bool,
    limits: &Limits,
) -> Result<Vec<u8>, MessageError> {
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut number = 0;
    // Room for the line, its CR and its LF, and one more octet to tell a line too long.
    let cap = limits.max_line as u64 + 1;
    loop {
        line.clear();
        let n = std::io::Read::take(&mut *input, cap)
            .read_until(b'\n', &mut line)
            .map_err(|e| MessageError::Read(e.to_string()))?;
        if n == 0 {
            return Ok(out);
        }
        number += 1;
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.len() + 2 > limits.max_line {
            return Err(MessageError::LineTooLong {
                line: number,
                limit: limits.max_line,
            });
        }
        if line.contains(&b'\r') {
            return Err(MessageError::BareCr { line: number });
        }
        if dot_ends && line == b"." {
            return Ok(out);
        }
        if (out.len() + line.len() + 2) as u64 > limits.max_size {
            return Err(MessageError::TooBig {
                limit: limits.max_size,
            });
        }
        out.extend_from_slice(&line);
        out.extend_from_slice(b"\r\n");
    }
}

/// Splits CRLF text into its header block and body. The header block is the leading lines
/// that are fields (`name:` with a name of printable ASCII) or continue one, up to the
/// first empty line (which belongs to neither) or the first line that is neither (which
/// starts the body: text without a header is all body). A leading `From ` line (an mbox
/// separator) is dropped, as sendmail does.
pub fn split_input(raw: &[u8]) -> (&[u8], &[u8]) {
    let mut raw = raw;
    if raw.starts_with(b"From ") {
        raw = match raw.windows(2).position(|w| w == b"\r\n") {
            Some(p) => &raw[p + 2..],
            None => &raw[raw.len()..],
        };
    }
    let mut at = 0;
    let mut in_field = false;
    while at < raw.len() {
        let end = raw[at..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(raw.len(), |p| at + p + 2);
        let line = &raw[at..end];
        if line == b"\r\n" {
            return (&raw[..at], &raw[end..]);
        }
        let continues = in_field && matches!(line[0], b' ' | b'\t');
        if !continues && !is_field_start(line) {
            return (&raw[..at], &raw[at..]);
        }
        in_field = true;
        at = end;
    }
    (raw, &raw[raw.len()..])
}

fn is_field_start(line: &[u8]) -> bool {
    match line.iter().position(|&b| b == b':') {
        Some(colon) if colon > 0 => line[..colon].iter().all(|&b| (33..=126).contains(&b)),
        _ => false,
    }
}

/// Who submits, and the facts the added fields need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitter {
    pub uid: u32,
    /// The login name; None when the system knows no name for the uid.
    pub login: Option<String>,
    /// The GECOS full name, used when `-F` gives none.
    pub gecos_name: Option<String>,
}

/// What the command line (or the SMTP dialogue) says about the envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvelopeRequest {
    /// `-f`; `Some("")` for the null sender.
    pub sender: Option<String>,
    pub recipients: Vec<String>,
    /// Per recipient NOTIFY/ORCPT from `RCPT` parameters (`-bs`), else empty.
    pub rcpt_params: Vec<DsnRcpt>,
    pub from_headers: bool,
    pub full_name: Option<String>,
    pub notify: Option<Vec<String>>,
    pub ret: Option<Ret>,
    pub envid: Option<String>,
}

/// The context the added fields are written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context<'a> {
    /// Unqualified addresses and the default sender get `@domain`.
    pub domain: &'a str,
    /// This host, in Received.
    pub hostname: &'a str,
    /// RFC 5322 date-time of now.
    pub date: &'a str,
    /// Unique among this host's messages (time, pid, a counter): the Message-ID's left part.
    pub unique: &'a str,
}

/// The message as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
    pub dsn: Dsn,
}

/// Builds the stored message from what was read.
pub fn prepare(
    raw: &[u8],
    req: &EnvelopeRequest,
    who: &Submitter,
    ctx: &Context<'_>,
    limits: &Limits,
) -> Result<Prepared, MessageError> {
    let (header_in, body) = split_input(raw);
    let login = who
        .login
        .clone()
        .unwrap_or_else(|| format!("uid{}", who.uid));
    let mail_from = match &req.sender {
        Some(s) if s.is_empty() => String::new(),
        Some(s) => qualify(s, ctx.domain),
        None => qualify(&login, ctx.domain),
    };
    if !mail_from.is_empty() {
        check_address(&mail_from).map_err(|why| MessageError::BadSender {
            address: mail_from.clone(),
            why,
        })?;
    }
    let mut rcpt_to: Vec<String> = Vec::new();
    let mut params: Vec<DsnRcpt> = Vec::new();
    let mut add = |address: &str, p: DsnRcpt| {
        let address = qualify(address.trim(), ctx.domain);
        if !rcpt_to.iter().any(|r| r.eq_ignore_ascii_case(&address)) {
            rcpt_to.push(address);
            params.push(p);
        }
    };
    for (i, r) in req.recipients.iter().enumerate() {
        add(r, req.rcpt_params.get(i).cloned().unwrap_or_default());
    }
    if req.from_headers {
        for address in recipient_addresses(header_in) {
            add(&address, DsnRcpt::default());
        }
    }
    if rcpt_to.is_empty() {
        return Err(MessageError::NoRecipients);
    }
    if rcpt_to.len() > limits.max_recipients {
        return Err(MessageError::TooManyRecipients {
            count: rcpt_to.len(),
            limit: limits.max_recipients,
        });
    }
    for r in &rcpt_to {
        check_address(r).map_err(|why| MessageError::BadRecipient {
            address: r.clone(),
            why,
        })?;
    }
    for p in &mut params {
        if p.notify.is_none() {
            p.notify = req.notify.clone();
        }
    }
    let kept = remove_fields(header_in, "Bcc");
    let mut headers = received(ctx, who.uid, &login);
    headers.extend_from_slice(&kept);
    if !has_field(&kept, "From") {
        let author = if mail_from.is_empty() {
            qualify(&login, ctx.domain)
        } else {
            mail_from.clone()
        };
        let name = req.full_name.clone().or_else(|| who.gecos_name.clone());
        headers.extend_from_slice(from_field(name.as_deref(), &author).as_bytes());
    }
    if !has_field(&kept, "Date") {
        headers.extend_from_slice(format!("Date: {}\r\n", ctx.date).as_bytes());
    }
    if !has_field(&kept, "Message-ID") {
        headers.extend_from_slice(
            format!("Message-ID: <{}@{}>\r\n", ctx.unique, ctx.domain).as_bytes(),
        );
    }
    let size = (headers.len() + 2 + body.len()) as u64;
    if size > limits.max_size {
        return Err(MessageError::TooBig {
            limit: limits.max_size,
        });
    }
    Ok(Prepared {
        mail_from,
        rcpt_to,
        headers,
        body: body.to_vec(),
        dsn: Dsn {
            ret: req.ret,
            envid: req.envid.clone(),
            rcpt: params,
            ..Dsn::default()
        },
    })
}

/// `user` becomes `user@domain`; an address with a domain is kept.
pub fn qualify(address: &str, domain: &str) -> String {
    if address.contains('@') {
        address.to_owned()
    } else {
        format!("{address}@{domain}")
    }
}

/// The ingress's own path syntax (RFC 5321/6531), so a recipient the ingress would refuse
/// is refused here too.
pub fn check_address(address: &str) -> Result<(), String> {
    pepsi_smtp::address::parse_path(&format!("<{address}>"), false).and_then(|(path, _)| match path
        .address
    {
        Some(a) if a.contains('@') => Ok(()),
        _ => Err("an address needs a domain".into()),
    })
}

fn received(ctx: &Context<'_>, uid: u32, login: &str) -> Vec<u8> {
    let login: String = login
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "Received: by {} (pepsi-sendmail, from userid {uid} {login});\r\n\t{}\r\n",
        ctx.hostname, ctx.date
    )
    .into_bytes()
}

/// `From: "Full Name" <address>`, the name quoted (or RFC 2047-encoded when not ASCII).
fn from_field(name: Option<&str>, address: &str) -> String {
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    match name {
        None => format!("From: {address}\r\n"),
        Some(n) if n.is_ascii() => {
            let quoted: String = n
                .chars()
                .filter(|c| !c.is_control())
                .flat_map(|c| {
                    if c == '"' || c == '\\' {
                        vec!['\\', c]
                    } else {
                        vec![c]
                    }
                })
                .collect();
            format!("From: \"{quoted}\" <{address}>\r\n")
        }
        Some(n) => {
            let clean: String = n.chars().filter(|c| !c.is_control()).collect();
            format!(
                "From: =?utf-8?b?{}?= <{address}>\r\n",
                pepsi_smtp::encoding::base64_encode(clean.as_bytes())
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_size: 200,
        max_line: 20,
        max_recipients: 3,
    };

    fn read(input: &str, dot_ends: bool) -> Result<String, MessageError> {
        read_message(&mut input.as_bytes(), dot_ends, &LIMITS)
            .map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn reading_input() {
        let cases: &[(&str, bool, Result<&str, MessageError>)] = &[
            ("a\nb\n", true, Ok("a\r\nb\r\n")),
            ("a\r\nb", true, Ok("a\r\nb\r\n")),
            ("a\n.\nb\n", true, Ok("a\r\n")),
            ("a\n.\nb\n", false, Ok("a\r\n.\r\nb\r\n")),
            ("a\n..\nb\n", true, Ok("a\r\n..\r\nb\r\n")),
            ("", true, Ok("")),
            ("123456789012345678\n", true, Ok("123456789012345678\r\n")),
            (
                "ok\n1234567890123456789\n",
                true,
                Err(MessageError::LineTooLong { line: 2, limit: 20 }),
            ),
            ("a\rb\n", true, Err(MessageError::BareCr { line: 1 })),
        ];
        for (input, dot_ends, want) in cases {
            assert_eq!(
                read(input, *dot_ends),
                want.clone().map(str::to_owned),
                "{input:?}"
            );
        }
        let big = "0123456789\n".repeat(30);
        assert_eq!(read(&big, true), Err(MessageError::TooBig { limit: 200 }));
    }

    #[test]
    fn splitting_input() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "A: 1\r\nB: 2\r\n\r\nbody\r\n",
                "A: 1\r\nB: 2\r\n",
                "body\r\n",
            ),
            ("A: 1\r\n folded\r\n\r\nx", "A: 1\r\n folded\r\n", "x"),
            ("just text\r\nmore\r\n", "", "just text\r\nmore\r\n"),
            ("A: 1\r\nnot a field\r\n", "A: 1\r\n", "not a field\r\n"),
            (" leading space\r\n", "", " leading space\r\n"),
            ("From me Mon Jan 1\r\nA: 1\r\n\r\nb", "A: 1\r\n", "b"),
            ("A: 1\r\n", "A: 1\r\n", ""),
            ("", "", ""),
        ];
        for (raw, h, b) in cases {
            let (gh, gb) = split_input(raw.as_bytes());
            assert_eq!((gh, gb), (h.as_bytes(), b.as_bytes()), "{raw:?}");
        }
    }

    fn who() -> Submitter {
        Submitter {
            uid: 1000,
            login: Some("alice".into()),
            gecos_name: Some("Alice Liddell".into()),
        }
    }

    fn ctx() -> Context<'static> {
        Context {
            domain: "example.test",
            hostname: "mail.example.test",
            date: "Mon, 1 Jan 2029 00:00:00 +0000",
            unique: "20290101000000.42.1",
        }
    }

    const BIG: Limits = Limits {
        max_size: 10_000,
        max_line: 1000,
        max_recipients: 3,
    };

    fn prep(raw: &str, req: EnvelopeRequest) -> Result<Prepared, MessageError> {
        prepare(raw.as_bytes(), &req, &who(), &ctx(), &BIG)
    }

    #[test]
    fn a_plain_message_gets_its_missing_fields() {
        let p = prep(
            "Subject: hi\r\n\r\nbody\r\n",
            EnvelopeRequest {
                recipients: vec!["bob@example.org".into(), "root".into()],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.mail_from, "alice@example.test");
        assert_eq!(p.rcpt_to, ["bob@example.org", "root@example.test"]);
        assert_eq!(
            String::from_utf8(p.headers).unwrap(),
            "Received: by mail.example.test (pepsi-sendmail, from userid 1000 alice);\r\n\
             \tMon, 1 Jan 2029 00:00:00 +0000\r\n\
             Subject: hi\r\n\
             From: \"Alice Liddell\" <alice@example.test>\r\n\
             Date: Mon, 1 Jan 2029 00:00:00 +0000\r\n\
             Message-ID: <20290101000000.42.1@example.test>\r\n"
        );
        assert_eq!(p.body, b"body\r\n");
        assert_eq!(p.dsn.rcpt.len(), 2);
    }

    #[test]
    fn fields_present_are_kept_and_bcc_goes() {
        let raw = "From: Ops <ops@example.org>\r\nDate: x\r\nMessage-ID: <m@x>\r\n\
                   To: a@example.org\r\nCc: B <b@example.org>\r\nBcc: c@example.org\r\n\r\nb\r\n";
        let p = prep(
            raw,
            EnvelopeRequest {
                from_headers: true,
                sender: Some("bounces@example.org".into()),
                full_name: Some("ignored: From is there".into()),
                notify: Some(vec!["NEVER".into()]),
                ret: Some(Ret::Full),
                envid: Some("e1".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.mail_from, "bounces@example.org");
        assert_eq!(
            p.rcpt_to,
            ["a@example.org", "b@example.org", "c@example.org"]
        );
        let headers = String::from_utf8(p.headers).unwrap();
        assert!(!headers.contains("Bcc"), "{headers}");
        assert!(!headers.contains("c@example.org"), "{headers}");
        assert_eq!(headers.matches("From:").count(), 1, "{headers}");
        assert_eq!(headers.matches("Date:").count(), 1, "{headers}");
        assert_eq!(headers.matches("Message-ID:").count(), 1, "{headers}");
        assert_eq!(p.dsn.ret, Some(Ret::Full));
        assert_eq!(p.dsn.envid.as_deref(), Some("e1"));
        assert!(
            p.dsn
                .rcpt
                .iter()
                .all(|r| r.notify == Some(vec!["NEVER".into()]))
        );
    }

    #[test]
    fn envelope_refusals() {
        let r = |req: EnvelopeRequest| prep("Subject: x\r\n\r\nb\r\n", req).unwrap_err();
        assert_eq!(r(EnvelopeRequest::default()), MessageError::NoRecipients);
        assert_eq!(
            r(EnvelopeRequest {
                recipients: vec!["a".into(), "b".into(), "c".into(), "d".into()],
                ..Default::default()
            }),
            MessageError::TooManyRecipients { count: 4, limit: 3 }
        );
        assert!(matches!(
            r(EnvelopeRequest {
                recipients: vec!["a b@example.org".into()],
                ..Default::default()
            }),
            MessageError::BadRecipient { .. }
        ));
        assert!(matches!(
            r(EnvelopeRequest {
                recipients: vec!["a@example.org".into()],
                sender: Some("x@@y".into()),
                ..Default::default()
            }),
            MessageError::BadSender { .. }
        ));
        // The same recipient twice is one recipient.
        let p = prep(
            "b\r\n",
            EnvelopeRequest {
                recipients: vec!["a@example.org".into(), "A@example.org".into()],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.rcpt_to, ["a@example.org"]);
    }

    #[test]
    fn the_null_sender_and_names() {
        let p = prep(
            "no header\r\n",
            EnvelopeRequest {
                sender: Some(String::new()),
                recipients: vec!["a@example.org".into()],
                full_name: Some("Zoë \"Z\"".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.mail_from, "");
        let h = String::from_utf8(p.headers).unwrap();
        assert!(h.contains("From: =?utf-8?b?"), "{h}");
        assert!(h.contains("<alice@example.test>"), "{h}");
        assert_eq!(p.body, b"no header\r\n");
        assert_eq!(
            from_field(Some("A \"B\""), "a@x"),
            "From: \"A \\\"B\\\"\" <a@x>\r\n"
        );
    }
}
