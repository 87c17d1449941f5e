//! The trace headers the ingress prepends (`Received`, RFC 5321 §4.4 with RFC 3848 and
//! RFC 6531 protocol names) and the removal of forged `Authentication-Results` that claim
//! our own authserv-id (RFC 8601 §5) and of fields only our own stages may write
//! (`STRIP_FIELDS`: `X-Pepsi-Decrypted`). Pure: the caller supplies the clock's reading.

/// What the `Received` field records about the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace<'a> {
    pub helo: &'a str,
    /// The client's verified reverse name (iprev pass), if any.
    pub ptr: Option<&'a str>,
    pub client_ip: std::net::IpAddr,
    pub hostname: &'a str,
    pub esmtp: bool,
    pub utf8: bool,
    pub tls: Option<(&'a str, &'a str)>,
    pub authenticated: bool,
    /// Named only when the message has exactly one recipient (RFC 5321 §7.6).
    pub single_rcpt: Option<&'a str>,
    /// RFC 5322 date-time.
    pub date: &'a str,
}

/// The RFC 3848 / RFC 6531 `with` keyword.
pub fn protocol(esmtp: bool, utf8: bool, tls: bool, authenticated: bool) -> String {
    if !esmtp {
        return "SMTP".into();
    }
    let mut proto = String::from(if utf8 { "UTF8SMTP" } else { "ESMTP" });
    if tls {
        proto.push('S');
    }
    if authenticated {
        proto.push('A');
    }
    proto
}

/// Keeps a client-supplied token from breaking the field's syntax or folding.
fn clean(token: &str) -> String {
    token
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._:[]@".contains(c) || !c.is_ascii() {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The whole `Received:` field, CRLF-terminated, folded with TABs.
pub fn received(t: &Trace<'_>) -> String {
    let mut out = format!(
        "Received: from {} ({} [{}])\r\n\tby {} (pepsi-ingress) with {}",
        clean(t.helo),
        t.ptr.map(clean).unwrap_or_else(|| "unknown".into()),
        t.client_ip,
        t.hostname,
        protocol(t.esmtp, t.utf8, t.tls.is_some(), t.authenticated),
    );
    if let Some((version, cipher)) = t.tls {
        out.push_str(&format!(
            "\r\n\t(using {} with cipher {})",
            clean(version),
            clean(cipher)
        ));
    }
    if let Some(rcpt) = t.single_rcpt {
        out.push_str(&format!("\r\n\tfor <{}>", clean(rcpt)));
    }
    out.push_str(&format!(";\r\n\t{}\r\n", t.date));
    out
}

/// Whether `message` begins with a space or tab: a continuation line before any field. The
/// ingress puts its own fields (`Received`, `Authentication-Results`) in front of the
/// client's, so such a line would continue the last field this server wrote and let the
/// client extend its verdicts (`\t; dkim=pass header.d=…`). No well-formed message begins
/// so (RFC 5322 §2.2.3: a continuation belongs to a field); the ingress refuses it.
pub fn begins_with_continuation(message: &[u8]) -> bool {
    matches!(message.first(), Some(b' ' | b'\t'))
}

/// The header block with every `Authentication-Results` field whose authserv-id is
/// `authserv_id` removed, and every field named as one of `ours` (any letter case, the
/// obsolete white space before the colon too); other fields are kept byte for byte.
pub fn strip_forged_results(headers: &[u8], authserv_id: &str, ours: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len());
    for field in fields(headers) {
        let named_ours = pepsi_contract::message::field_name(field)
            .is_some_and(|n| ours.iter().any(|o| n.eq_ignore_ascii_case(o.as_bytes())));
        if !named_ours && !is_our_results(field, authserv_id) {
            out.extend_from_slice(field);
        }
    }
    out
}

/// Splits a header block into whole fields, continuation lines included.
fn fields(headers: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < headers.len() {
        let end = headers[i..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(headers.len(), |p| i + p + 2);
        let continues = matches!(headers.get(end), Some(b' ' | b'\t'));
        if !continues {
            out.push(&headers[start..end]);
            start = end;
        }
        i = end;
    }
    out
}

fn is_our_results(field: &[u8], authserv_id: &str) -> bool {
    const NAME: &[u8] = b"authentication-results";
    let Some(colon) = field.iter().position(|&b| b == b':') else {
        return false;
    };
    // The obsolete syntax allows white space between the name and the colon (RFC 5322
    // §4.5.3), and receivers still read such a field.
    let name = field[..colon].trim_ascii_end();
    if !name.eq_ignore_ascii_case(NAME) {
        return false;
    }
    let value = String::from_utf8_lossy(&field[colon + 1..]);
    // The authserv-id is the first token, ended by ';', whitespace or a comment.
    let id = value
        .trim_start()
        .split(|c: char| c == ';' || c == '(' || c.is_whitespace())
        .next()
        .unwrap_or("");
    id.eq_ignore_ascii_case(authserv_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_table() {
        let cases = [
            ((false, false, false, false), "SMTP"),
            ((true, false, false, false), "ESMTP"),
            ((true, false, true, false), "ESMTPS"),
            ((true, false, false, true), "ESMTPA"),
            ((true, false, true, true), "ESMTPSA"),
            ((true, true, true, true), "UTF8SMTPSA"),
            ((true, true, false, false), "UTF8SMTP"),
        ];
        for ((esmtp, utf8, tls, auth), name) in cases {
            assert_eq!(protocol(esmtp, utf8, tls, auth), name);
        }
    }

    #[test]
    fn received_field() {
        let t = Trace {
            helo: "client.example(x)",
            ptr: Some("mail.client.example"),
            client_ip: "192.0.2.7".parse().unwrap(),
            hostname: "mx.example.test",
            esmtp: true,
            utf8: false,
            tls: Some(("TLSv1.3", "TLS13_AES_256_GCM_SHA384")),
            authenticated: false,
            single_rcpt: Some("a@example.test"),
            date: "Mon, 1 Jan 2024 00:00:00 +0000",
        };
        assert_eq!(
            received(&t),
            "Received: from client.example_x_ (mail.client.example [192.0.2.7])\r\n\
             \tby mx.example.test (pepsi-ingress) with ESMTPS\r\n\
             \t(using TLSv1.3 with cipher TLS13_AES_256_GCM_SHA384)\r\n\
             \tfor <a@example.test>;\r\n\
             \tMon, 1 Jan 2024 00:00:00 +0000\r\n"
        );
    }

    #[test]
    fn continuation_first() {
        assert!(begins_with_continuation(
            b"\t; dkim=pass\r\nFrom: a@b\r\n\r\nx\r\n"
        ));
        assert!(begins_with_continuation(b" x\r\n"));
        assert!(!begins_with_continuation(
            b"From: a@b\r\n \tfolded\r\n\r\nx\r\n"
        ));
        assert!(!begins_with_continuation(b"\r\n body\r\n"));
        assert!(!begins_with_continuation(b""));
    }

    #[test]
    fn strip_table() {
        let cases: &[(&str, &str)] = &[
            ("A: 1\r\n", "A: 1\r\n"),
            (
                "Authentication-Results: mx.example.test; spf=pass\r\nA: 1\r\n",
                "A: 1\r\n",
            ),
            (
                "authentication-results:  MX.example.test;\r\n\tdkim=pass\r\nA: 1\r\n",
                "A: 1\r\n",
            ),
            (
                "Authentication-Results: mx.example.test (forged); none\r\n",
                "",
            ),
            (
                "Authentication-Results: other.example; spf=pass\r\nA: 1\r\n",
                "Authentication-Results: other.example; spf=pass\r\nA: 1\r\n",
            ),
            (
                "Authentication-Results: mx.example.testx; none\r\n",
                "Authentication-Results: mx.example.testx; none\r\n",
            ),
            ("A: 1\r\n folded\r\nB: 2", "A: 1\r\n folded\r\nB: 2"),
            // The obsolete form, white space before the colon.
            (
                "Authentication-Results : mx.example.test; dkim=pass\r\nA: 1\r\n",
                "A: 1\r\n",
            ),
            (
                "Authentication-Results\t: mx.example.test; dkim=pass\r\n",
                "",
            ),
            (
                "Authentication-Results-X: mx.example.test; dkim=pass\r\n",
                "Authentication-Results-X: mx.example.test; dkim=pass\r\n",
            ),
            // Fields only our stages write, in any case and the obsolete form.
            (
                "X-Pepsi-Decrypted: openpgp; signature=good\r\nA: 1\r\n",
                "A: 1\r\n",
            ),
            (
                "A: 1\r\nx-pepsi-decrypted :\r\n\topenpgp; signature=good\r\nB: 2\r\n",
                "A: 1\r\nB: 2\r\n",
            ),
            (
                "X-Pepsi-Decrypted-Not: x\r\n",
                "X-Pepsi-Decrypted-Not: x\r\n",
            ),
        ];
        let ours = ["X-Pepsi-Decrypted".to_owned()];
        for (input, expected) in cases {
            assert_eq!(
                String::from_utf8(strip_forged_results(
                    input.as_bytes(),
                    "mx.example.test",
                    &ours
                ))
                .unwrap(),
                *expected,
                "{input:?}"
            );
        }
    }
}
