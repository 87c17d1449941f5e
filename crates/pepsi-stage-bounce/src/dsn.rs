//! Building the notification: an RFC 3464 `multipart/report` with a human explanation, the
//! machine-readable `message/delivery-status` and the returned original (whole or headers).
//! RFC 6533 types (`message/global-delivery-status`, `message/global`,
//! `message/global-headers`) are used where the content is UTF-8. The message around the
//! parts is written by mail-builder; the parts' own text (the explanation, the status
//! fields) is built here. Pure: no I/O, every line CRLF-terminated.

use chrono::{DateTime, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::content_type::ContentType;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::{BodyPart, MimePart};

use crate::original::is_8bit;
use crate::request::{Kind, Recipient};

/// What of the original goes into the third part.
#[derive(Debug, Clone, Copy)]
pub enum Returned<'a> {
    /// The whole message (RET=FULL, a failure, within MAX_RETURN_SIZE).
    Full { headers: &'a [u8], body: &'a [u8] },
    /// The header block only; `too_large` is the size limit the message exceeded, when that
    /// is why the body is missing.
    Headers {
        headers: &'a [u8],
        too_large: Option<u64>,
    },
}

/// Everything a notification is made of.
#[derive(Debug, Clone)]
pub struct Dsn<'a> {
    pub kind: Kind,
    /// Reporting-MTA, and the domain of MAILER-DAEMON and of the Message-ID.
    pub hostname: &'a str,
    /// The original sender: the notification's `To`.
    pub to: &'a str,
    pub envid: Option<&'a str>,
    /// When the original arrived (Arrival-Date).
    pub arrival: DateTime<Utc>,
    /// Date, Last-Attempt-Date.
    pub now: DateTime<Utc>,
    /// The Message-ID without its angle brackets.
    pub message_id: &'a str,
    /// The start of the MIME boundary; made unique against the content by the builder.
    pub boundary_seed: &'a str,
    pub recipients: &'a [Recipient],
    /// Will-Retry-Until for a delay when a recipient's state gives none.
    pub retry_until: Option<DateTime<Utc>>,
    pub returned: Returned<'a>,
}

/// The notification's Subject.
pub fn subject(kind: Kind) -> &'static str {
    match kind {
        Kind::Permanent => "Undelivered Mail Returned to Sender",
        Kind::Delay => "Delayed Mail (still being retried)",
        Kind::Success => "Successful Mail Delivery Report",
    }
}

/// The raw notification: header block, empty line, body.
pub fn build(d: &Dsn<'_>) -> Vec<u8> {
    let human = human_text(d);
    let status = delivery_status(d);
    let status_global = is_8bit(status.as_bytes());
    let (returned_type, returned_desc, returned): (&str, &str, Vec<u8>) = match d.returned {
        Returned::Full { headers, body } => (
            if is_8bit(headers) {
                "message/global"
            } else {
                "message/rfc822"
            },
            "Undelivered Message",
            pepsi_contract::message::join(headers, body),
        ),
        Returned::Headers { headers, .. } => (
            if is_8bit(headers) {
                "message/global-headers"
            } else {
                "text/rfc822-headers"
            },
            if d.kind == Kind::Permanent {
                "Undelivered Message Headers"
            } else {
                "Message Headers"
            },
            headers.to_vec(),
        ),
    };
    let boundary = unique_boundary(
        d.boundary_seed,
        &[human.as_bytes(), status.as_bytes(), &returned],
    );
    let cte = |b: &[u8]| if is_8bit(b) { "8bit" } else { "7bit" };
    let any_8bit = is_8bit(human.as_bytes()) || status_global || is_8bit(&returned);

    let report_type = if status_global {
        "global-delivery-status"
    } else {
        "delivery-status"
    };
    let status_type = if status_global {
        "message/global-delivery-status"
    } else {
        "message/delivery-status"
    };
    // Each part keeps its bytes as they are (its Content-Transfer-Encoding is declared, so
    // mail-builder encodes nothing): the 8-bit message/* parts of RFC 6533 cannot be
    // re-encoded, and the explanation is CRLF text already.
    let part = |content_type: ContentType<'static>, description: &'static str, body: Vec<u8>| {
        let encoding = cte(&body);
        MimePart::new(content_type, BodyPart::Binary(body.into()))
            .header("Content-Description", Raw::new(description))
            .transfer_encoding(encoding)
    };
    let report = MimePart::new(
        ContentType::new("multipart/report")
            .attribute("report-type", report_type)
            .attribute("boundary", boundary),
        vec![
            part(
                ContentType::new("text/plain").attribute("charset", "utf-8"),
                "Notification",
                human.into_bytes(),
            ),
            part(
                ContentType::new(status_type),
                "Delivery report",
                status.into_bytes(),
            ),
            part(ContentType::new(returned_type), returned_desc, returned),
        ],
    )
    .transfer_encoding(if any_8bit { "8bit" } else { "7bit" });
    MessageBuilder::new()
        .from((
            "Mail Delivery System".to_owned(),
            format!("MAILER-DAEMON@{}", clean(d.hostname)),
        ))
        .to(clean(d.to))
        .subject(subject(d.kind))
        .date(Date::new(d.now.timestamp()))
        .message_id(clean(d.message_id))
        .header("Auto-Submitted", Raw::new("auto-replied"))
        .body(report)
        .write_to_vec()
        .expect("writing to memory")
}

/// The first of seed, seed.1, seed.2, … that occurs in none of the parts.
fn unique_boundary(seed: &str, parts: &[&[u8]]) -> String {
    let occurs = |b: &str| {
        parts
            .iter()
            .any(|p| p.windows(b.len()).any(|w| w == b.as_bytes()))
    };
    let mut boundary = seed.to_owned();
    let mut n = 0;
    while occurs(&boundary) {
        n += 1;
        boundary = format!("{seed}.{n}");
    }
    boundary
}

/// Text fit for one header field: control characters (CR, LF, TAB, …) become spaces and
/// runs of spaces collapse, so no value from the state can start a field of its own.
pub fn clean(s: &str) -> String {
    pepsi_conf::text::one_line(s)
}

/// Appends `Name: value` CRLF, folded at spaces so lines stay within 78 columns where the
/// words allow (a single longer word is kept whole; RFC 5322 allows up to 998).
fn field(out: &mut String, name: &str, value: &str) {
    let value = clean(value);
    let mut line = format!("{name}:");
    for word in value.split(' ') {
        if line.len() + 1 + word.len() > 78 && line.len() > name.len() + 1 {
            out.push_str(&line);
            out.push_str("\r\n");
            line = String::from("   ");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push_str("\r\n");
}

/// `addr-type; address` for a Final-Recipient: `utf-8` when the address is not ASCII
/// (RFC 6533 §3), `rfc822` otherwise.
fn typed_address(address: &str) -> String {
    let kind = if address.is_ascii() {
        "rfc822"
    } else {
        "utf-8"
    };
    format!("{kind}; {}", clean(address))
}

/// An ORCPT as stored (`addr-type;address`, decoded) in the field form `addr-type; address`.
fn original_recipient(orcpt: &str) -> String {
    match orcpt.split_once(';') {
        Some((kind, addr)) if !kind.trim().is_empty() && !kind.contains('@') => {
            format!("{}; {}", clean(kind), clean(addr))
        }
        _ => typed_address(orcpt),
    }
}

/// The RFC 3464 Diagnostic-Code: the remote reply when there was one, else our own words.
fn diagnostic_code(r: &Recipient) -> Option<String> {
    match (r.smtp_code, &r.reply_text, &r.diagnostic) {
        (Some(code), text, diag) => {
            let text = clean(text.as_deref().or(diag.as_deref()).unwrap_or(""));
            let code_s = code.to_string();
            let text = text
                .strip_prefix(&code_s)
                .map(|t| t.trim_start_matches(['-', ' ']))
                .unwrap_or(&text)
                .to_owned();
            Some(if text.is_empty() {
                format!("smtp; {code}")
            } else {
                format!("smtp; {code} {text}")
            })
        }
        (None, _, Some(diag)) => Some(format!("X-Pepsi; {}", clean(diag))),
        (None, Some(text), None) => Some(format!("X-Pepsi; {}", clean(text))),
        (None, None, None) => None,
    }
}

/// The `message/delivery-status` body: per-message fields, then one group per recipient.
fn delivery_status(d: &Dsn<'_>) -> String {
    let mut s = String::new();
    field(&mut s, "Reporting-MTA", &format!("dns; {}", d.hostname));
    if let Some(envid) = d.envid {
        field(&mut s, "Original-Envelope-Id", envid);
    }
    field(&mut s, "Arrival-Date", &d.arrival.to_rfc2822());
    for r in d.recipients {
        s.push_str("\r\n");
        if let Some(orcpt) = &r.orcpt {
            field(&mut s, "Original-Recipient", &original_recipient(orcpt));
        }
        field(&mut s, "Final-Recipient", &typed_address(&r.address));
        field(&mut s, "Action", r.action);
        field(&mut s, "Status", &r.status);
        if let Some(mta) = &r.remote_mta {
            field(&mut s, "Remote-MTA", &format!("dns; {mta}"));
        }
        if let Some(code) = diagnostic_code(r) {
            field(&mut s, "Diagnostic-Code", &code);
        }
        field(&mut s, "Last-Attempt-Date", &d.now.to_rfc2822());
        if let Some(until) = r.will_retry_until.or(d.retry_until)
            && d.kind == Kind::Delay
        {
            field(&mut s, "Will-Retry-Until", &until.to_rfc2822());
        }
    }
    s
}

/// What happened to one recipient, in words.
fn describe(kind: Kind, r: &Recipient) -> String {
    let phase = r
        .phase
        .as_deref()
        .map(|p| match p.to_ascii_uppercase().as_str() {
            "RCPT" => " (in reply to the RCPT TO command)".to_owned(),
            "MAIL" => " (in reply to the MAIL FROM command)".to_owned(),
            "DATA" => " (in reply to the end of the DATA command)".to_owned(),
            _ => format!(" (during {})", clean(p)),
        });
    let reply = r.smtp_code.map(|code| {
        let text = clean(r.reply_text.as_deref().unwrap_or(""));
        if text.starts_with(&code.to_string()) {
            text
        } else {
            format!("{code} {text}").trim_end().to_owned()
        }
    });
    let said = match (&r.remote_mta, reply) {
        (Some(mta), Some(reply)) => Some(format!(
            "host {} said: {reply}{}",
            clean(mta),
            phase.clone().unwrap_or_default()
        )),
        (None, Some(reply)) => Some(format!(
            "the server said: {reply}{}",
            phase.clone().unwrap_or_default()
        )),
        _ => None,
    };
    let own = r.diagnostic.as_deref().map(clean);
    match kind {
        Kind::Success => {
            let how = match (r.action, &r.remote_mta) {
                ("relayed", Some(mta)) => format!(
                    "relayed to {}, which does not send delivery notifications itself",
                    clean(mta)
                ),
                ("relayed", None) => {
                    "relayed to a system that does not send delivery notifications itself".into()
                }
                ("expanded", _) => "delivered to a list or alias, and forwarded from there".into(),
                (_, Some(mta)) => format!("delivered to {}", clean(mta)),
                _ => "delivered".into(),
            };
            match own {
                Some(d) => format!("{how}: {d}"),
                None => how,
            }
        }
        _ => match (said, own) {
            (Some(said), Some(own)) if !said.contains(&own) => format!("{own}; {said}"),
            (Some(said), _) => said,
            (None, Some(own)) => own,
            (None, None) if kind == Kind::Delay => "not delivered yet".into(),
            (None, None) => "delivery failed".into(),
        },
    }
}

/// Wraps one paragraph at 76 columns; continuation lines get `indent`.
fn wrap(text: &str, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > 76 {
            out.push_str(&line);
            out.push_str("\r\n");
            line = indent.to_owned();
        }
        if !line.is_empty() && line != indent {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push_str("\r\n");
    out
}

/// Part 1: what happened, for a person.
fn human_text(d: &Dsn<'_>) -> String {
    let mut s = wrap(
        &format!("This is the mail delivery system at {}.", d.hostname),
        "",
    );
    s.push_str("\r\n");
    let intro = match d.kind {
        Kind::Permanent => {
            "Your message could not be delivered to the recipients below. This is a permanent error: it will not be retried."
                .to_owned()
        }
        Kind::Delay => {
            let until = d
                .recipients
                .iter()
                .filter_map(|r| r.will_retry_until)
                .max()
                .or(d.retry_until);
            match until {
                Some(t) => format!(
                    "Your message has not been delivered yet to the recipients below. Delivery will be retried until {}; you do not need to send it again.",
                    t.to_rfc2822()
                ),
                None => "Your message has not been delivered yet to the recipients below. Delivery is being retried; you do not need to send it again.".to_owned(),
            }
        }
        Kind::Success => "Your message was delivered to the recipients below.".to_owned(),
    };
    s.push_str(&wrap(&intro, ""));
    s.push_str("\r\n");
    for r in d.recipients {
        s.push_str(&wrap(
            &format!("<{}>: {}", clean(&r.address), describe(d.kind, r)),
            "    ",
        ));
    }
    s.push_str("\r\n");
    let attached = match d.returned {
        Returned::Full { .. } => {
            "The delivery report and your complete message are attached.".to_owned()
        }
        Returned::Headers {
            too_large: Some(limit),
            ..
        } => format!(
            "The delivery report and the header of your message are attached; the message itself was larger than {limit} bytes and is not returned."
        ),
        Returned::Headers { .. } => {
            "The delivery report and the header of your message are attached.".to_owned()
        }
    };
    s.push_str(&wrap(&attached, ""));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn rcpt(address: &str) -> Recipient {
        Recipient {
            address: address.into(),
            orcpt: None,
            notify: None,
            status: "5.0.0".into(),
            action: "failed",
            remote_mta: None,
            smtp_code: None,
            reply_text: None,
            diagnostic: None,
            phase: None,
            will_retry_until: None,
        }
    }

    fn dsn<'a>(kind: Kind, recipients: &'a [Recipient], returned: Returned<'a>) -> Dsn<'a> {
        Dsn {
            kind,
            hostname: "mx.example.test",
            to: "alice@example.test",
            envid: Some("ENV\r\nX-Injected: 1"),
            arrival: Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 5).unwrap(),
            now: Utc.with_ymd_and_hms(2030, 1, 2, 4, 0, 0).unwrap(),
            message_id: "1.2.dsn@mx.example.test",
            boundary_seed: "BOUNDARY",
            recipients,
            retry_until: Some(Utc.with_ymd_and_hms(2030, 1, 7, 3, 4, 5).unwrap()),
            returned,
        }
    }

    fn text(raw: &[u8]) -> String {
        String::from_utf8(raw.to_vec()).unwrap()
    }

    #[test]
    fn every_line_ends_with_crlf_and_the_split_is_at_the_first_empty_line() {
        let r = [rcpt("bob@example.org")];
        let raw = build(&dsn(
            Kind::Permanent,
            &r,
            Returned::Full {
                headers: b"Subject: x\r\n",
                body: b"line\r\n",
            },
        ));
        let s = text(&raw);
        let (headers, body) = pepsi_contract::message::split(&raw);
        assert!(
            text(headers)
                .starts_with("From: \"Mail Delivery System\" <MAILER-DAEMON@mx.example.test>\r\n")
        );
        assert!(text(body).starts_with("\r\n--BOUNDARY\r\nContent-Type: text/plain"));
        assert!(s.ends_with("\r\n--BOUNDARY--\r\n"));
        assert!(
            !s.replace("\r\n", "").contains(['\r', '\n']),
            "a bare CR or LF: {s}"
        );
        assert!(
            !s.contains("\r\nX-Injected"),
            "the envid cannot start a field: {s}"
        );
    }

    fn check(
        kind: Kind,
        recipients: &[Recipient],
        returned: Returned<'_>,
        want: &[&str],
        not: &[&str],
    ) {
        let s = text(&build(&dsn(kind, recipients, returned)));
        for w in want {
            assert!(s.contains(w), "{kind:?}: missing {w:?} in\n{s}");
        }
        for n in not {
            assert!(!s.contains(n), "{kind:?}: unexpected {n:?} in\n{s}");
        }
    }

    #[test]
    fn content_table() {
        let headers = Returned::Headers {
            headers: b"Subject: x\r\n",
            too_large: None,
        };
        let mut remote = rcpt("bob@example.org");
        remote.orcpt = Some("rfc822;Bob@Example.org".into());
        remote.remote_mta = Some("mx.example.org".into());
        remote.smtp_code = Some(550);
        remote.reply_text = Some("5.1.1 <bob@example.org>: no such\r\n user".into());
        remote.status = "5.1.1".into();
        remote.phase = Some("RCPT".into());
        check(
            Kind::Permanent,
            std::slice::from_ref(&remote),
            headers,
            &[
                "Subject: Undelivered Mail Returned to Sender\r\n",
                "To: <alice@example.test>\r\n",
                "Auto-Submitted: auto-replied\r\n",
                "MIME-Version: 1.0\r\n",
                "Content-Type: multipart/report; report-type=\"delivery-status\";\r\n boundary=\"BOUNDARY\"\r\n",
                "Content-Type: message/delivery-status\r\n",
                "Reporting-MTA: dns; mx.example.test\r\n",
                "Original-Envelope-Id: ENV X-Injected: 1\r\n",
                "Arrival-Date: Wed, 2 Jan 2030 03:04:05 +0000\r\n",
                "Original-Recipient: rfc822; Bob@Example.org\r\n",
                "Final-Recipient: rfc822; bob@example.org\r\n",
                "Action: failed\r\n",
                "Status: 5.1.1\r\n",
                "Remote-MTA: dns; mx.example.org\r\n",
                "Diagnostic-Code: smtp; 550 5.1.1 <bob@example.org>: no such user\r\n",
                "Last-Attempt-Date: Wed, 2 Jan 2030 04:00:00 +0000\r\n",
                "<bob@example.org>: host mx.example.org said: 550 5.1.1 <bob@example.org>: no\r\n    such user",
                "(in reply to the RCPT TO command)",
                "Content-Type: text/rfc822-headers\r\n",
                "Content-Description: Undelivered Message Headers\r\n",
                "\r\nSubject: x\r\n\r\n--BOUNDARY--\r\n",
                "Content-Transfer-Encoding: 7bit\r\n",
            ],
            &["Will-Retry-Until", "8bit", "message/rfc822"],
        );

        let mut delayed = rcpt("carol@example.org");
        delayed.status = "4.4.1".into();
        delayed.action = "delayed";
        delayed.diagnostic = Some("connection timed out".into());
        check(
            Kind::Delay,
            &[delayed],
            headers,
            &[
                "Subject: Delayed Mail (still being retried)\r\n",
                "Action: delayed\r\n",
                "Status: 4.4.1\r\n",
                "Will-Retry-Until: Mon, 7 Jan 2030 03:04:05 +0000\r\n",
                "Diagnostic-Code: X-Pepsi; connection timed out\r\n",
                "<carol@example.org>: connection timed out\r\n",
                "retried until Mon, 7 Jan 2030",
                "Content-Description: Message Headers\r\n",
            ],
            &["Remote-MTA", "Original-Recipient"],
        );

        let mut ok = rcpt("dave@example.org");
        ok.status = "2.0.0".into();
        ok.action = "relayed";
        ok.remote_mta = Some("mx.example.org".into());
        check(
            Kind::Success,
            &[ok],
            Returned::Full {
                headers: b"Subject: x\r\n",
                body: b"hello\r\n",
            },
            &[
                "Subject: Successful Mail Delivery Report\r\n",
                "Action: relayed\r\n",
                "Status: 2.0.0\r\n",
                "relayed to mx.example.org",
                "Content-Type: message/rfc822\r\n",
                "\r\nSubject: x\r\n\r\nhello\r\n\r\n--BOUNDARY--\r\n",
                "your complete message are attached",
            ],
            &["Will-Retry-Until", "Diagnostic-Code"],
        );

        check(
            Kind::Permanent,
            &[rcpt("bob@example.org")],
            Returned::Headers {
                headers: b"Subject: x\r\n",
                too_large: Some(1000),
            },
            &[
                "larger than 1000 bytes",
                "<bob@example.org>: delivery failed\r\n",
            ],
            &["Diagnostic-Code"],
        );
    }

    #[test]
    fn utf8_content_uses_the_rfc_6533_types_and_declares_8bit() {
        // 8-bit body, ASCII header: message/rfc822, declared 8bit.
        check(
            Kind::Permanent,
            &[rcpt("bob@example.org")],
            Returned::Full {
                headers: b"Subject: x\r\n",
                body: "grüße\r\n".as_bytes(),
            },
            &[
                "Content-Type: message/rfc822\r\nContent-Description: Undelivered Message\r\nContent-Transfer-Encoding: 8bit\r\n",
                "boundary=\"BOUNDARY\"\r\nContent-Transfer-Encoding: 8bit\r\n",
                "Content-Type: message/delivery-status\r\n",
            ],
            &["message/global"],
        );
        // UTF-8 header and a UTF-8 recipient: the global types.
        let mut r = rcpt("jörg@example.org");
        r.diagnostic = Some("Postfach voll".into());
        check(
            Kind::Permanent,
            &[r],
            Returned::Headers {
                headers: "Subject: grüße\r\n".as_bytes(),
                too_large: None,
            },
            &[
                "report-type=\"global-delivery-status\";",
                "Content-Type: message/global-delivery-status\r\nContent-Description: Delivery report\r\nContent-Transfer-Encoding: 8bit\r\n",
                "Final-Recipient: utf-8; jörg@example.org\r\n",
                "Content-Type: message/global-headers\r\n",
                "Content-Type: text/plain; charset=\"utf-8\"\r\nContent-Description: Notification\r\nContent-Transfer-Encoding: 8bit\r\n",
            ],
            &["text/rfc822-headers", "report-type=\"delivery-status\""],
        );
    }

    #[test]
    fn a_mime_parser_reads_the_three_parts_back() {
        use mail_parser::{MessageParser, MimeHeaders, PartType};
        let r = [rcpt("bob@example.org")];
        let raw = build(&dsn(
            Kind::Permanent,
            &r,
            Returned::Full {
                headers: b"Subject: the original\r\n",
                body: "grüße\r\n".as_bytes(),
            },
        ));
        let parsed = MessageParser::default().parse(&raw).unwrap();
        let outer = parsed.content_type().unwrap();
        assert_eq!(
            (outer.ctype(), outer.subtype()),
            ("multipart", Some("report"))
        );
        assert_eq!(outer.attribute("report-type"), Some("delivery-status"));
        assert_eq!(
            parsed.from().unwrap().first().unwrap().address(),
            Some("MAILER-DAEMON@mx.example.test")
        );
        assert_eq!(parsed.message_id(), Some("1.2.dsn@mx.example.test"));
        let PartType::Multipart(children) = &parsed.parts[0].body else {
            panic!("not a multipart: {:?}", parsed.parts[0].body);
        };
        let types: Vec<String> = children
            .iter()
            .map(|&i| {
                let ct = parsed.parts[i as usize].content_type().unwrap();
                format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or(""))
            })
            .collect();
        assert_eq!(
            types,
            ["text/plain", "message/delivery-status", "message/rfc822"]
        );
        assert!(
            parsed
                .body_text(0)
                .unwrap()
                .contains("could not be delivered")
        );
        let returned = parsed.attachment(1).unwrap().message().unwrap();
        assert_eq!(returned.subject(), Some("the original"));
        assert_eq!(returned.body_text(0).as_deref(), Some("grüße\r\n"));
    }

    #[test]
    fn the_boundary_never_occurs_in_the_content() {
        let r = [rcpt("bob@example.org")];
        let s = text(&build(&dsn(
            Kind::Permanent,
            &r,
            Returned::Full {
                headers: b"Subject: x\r\n",
                body: b"--BOUNDARY\r\n--BOUNDARY.1\r\n",
            },
        )));
        assert!(s.contains("boundary=\"BOUNDARY.2\""), "{s}");
    }

    #[test]
    fn long_fields_fold_at_spaces() {
        let mut out = String::new();
        field(
            &mut out,
            "Diagnostic-Code",
            &format!("smtp; 550 {}", "word ".repeat(30)),
        );
        for line in out.split("\r\n").filter(|l| !l.is_empty()) {
            assert!(line.len() <= 78, "{line:?}");
        }
        assert!(out.contains("\r\n    word"), "{out}");
        assert_eq!(clean(" a\r\n\tb  c "), "a b c");
    }
}
