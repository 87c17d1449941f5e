//! What the original message's header block says about whether a notification may be sent
//! at all, and what its state says about how its content may be returned. Pure: no I/O.

use mail_parser::MessageParser;
use pepsi_contract::state::{Crypto, Decryption};

/// Why a message gets no notification although its sender is not null.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loop {
    /// The message is itself a report (`multipart/report` of a delivery- or
    /// disposition-notification type): a DSN about a DSN could ping-pong between two systems.
    Report(String),
    /// `Auto-Submitted: auto-replied`: an automatic answer (a vacation notice) whose sender
    /// is a responder, not a person; telling it about a failure feeds a loop and helps no one.
    AutoReplied,
}

impl std::fmt::Display for Loop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loop::Report(t) => write!(f, "the message is itself a report (report-type={t})"),
            Loop::AutoReplied => {
                f.write_str("the message is an automatic reply (Auto-Submitted: auto-replied)")
            }
        }
    }
}

/// The report types that mark a message as an automatic report.
const REPORT_TYPES: [&str; 4] = [
    "delivery-status",
    "global-delivery-status",
    "disposition-notification",
    "global-disposition-notification",
];

/// Does the header block mark the message as one that must never be answered with a DSN?
///
/// `Auto-Submitted: auto-generated` is deliberately not a reason: RFC 3834 does not govern
/// DSNs, and auto-generated mail with a real return path (a cron report, a mailing list's
/// post, a ticket system) is exactly the mail whose sender relies on bounces to notice a
/// dead address. Our own DSNs have a null sender and are `multipart/report`, so they are
/// caught twice.
pub fn loop_reason(headers: &[u8]) -> Option<Loop> {
    let mut block = headers.to_vec();
    block.extend_from_slice(b"\r\n");
    let message = MessageParser::new().parse_headers(&block)?;
    if let Some(ct) = mail_parser::MimeHeaders::content_type(&message)
        && ct.ctype().eq_ignore_ascii_case("multipart")
        && ct
            .subtype()
            .is_some_and(|s| s.eq_ignore_ascii_case("report"))
    {
        let report_type = ct
            .attributes()
            .unwrap_or_default()
            .iter()
            .find(|a| a.name.eq_ignore_ascii_case("report-type"))
            .map(|a| a.value.to_ascii_lowercase());
        if let Some(t) = report_type.filter(|t| REPORT_TYPES.contains(&t.as_str())) {
            return Some(Loop::Report(t));
        }
    }
    let auto = message.header_raw("Auto-Submitted").map(|v| {
        v.split([';', '(', ' ', '\t', '\r', '\n'])
            .find(|t| !t.is_empty())
            .unwrap_or("")
            .to_ascii_lowercase()
    });
    (auto.as_deref() == Some("auto-replied")).then_some(Loop::AutoReplied)
}

/// What the bounce stage may return of a message, judged from its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// The row holds the message as it came: return it as RET and the size allow.
    AsReceived,
    /// pepsi-stage-decrypt replaced the row's content with the plaintext
    /// (`state.crypto.decrypted.result` = `decrypted`). Whoever set the envelope sender may
    /// have captured the encrypted message and resent it to read it through a bounce, so only
    /// a header block is returned: the one the message arrived with (`original_headers`),
    /// else, for a row decrypted before that was recorded, the row's own.
    Decrypted { original_headers: Option<Vec<u8>> },
}

/// What of the message may be returned, from `state.crypto.decrypted`.
pub fn content(state: &serde_json::Map<String, serde_json::Value>) -> Content {
    match Crypto::from_state(state) {
        Ok(crypto) => match crypto.and_then(|c| c.decrypted) {
            Some(Decryption::Decrypted {
                original_headers, ..
            }) => Content::Decrypted {
                original_headers: original_headers.map(String::into_bytes),
            },
            _ => Content::AsReceived,
        },
        // A record that does not parse may still say the row holds the plaintext: then no
        // more than the row's own header block goes back.
        Err(_) => {
            let result = state
                .get(Crypto::KEY)
                .and_then(|c| c.get("decrypted"))
                .and_then(|d| d.get("result"));
            if result.and_then(serde_json::Value::as_str) == Some("decrypted") {
                Content::Decrypted {
                    original_headers: None,
                }
            } else {
                Content::AsReceived
            }
        }
    }
}

/// True when the bytes are not all ASCII (8-bit content, UTF-8 header fields).
pub fn is_8bit(bytes: &[u8]) -> bool {
    !bytes.is_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(headers: &str, want: Option<Loop>) {
        assert_eq!(loop_reason(headers.as_bytes()), want, "{headers:?}");
    }

    #[test]
    fn content_table() {
        let check = |state: serde_json::Value, want: Content| {
            let state = state.as_object().cloned().unwrap_or_default();
            assert_eq!(content(&state), want, "{state:?}");
        };
        use serde_json::json;
        check(json!({}), Content::AsReceived);
        check(
            json!({"crypto": {"encrypted": {"scheme": "openpgp"}}}),
            Content::AsReceived,
        );
        for result in ["failed", "no-key"] {
            check(
                json!({"crypto": {"decrypted": {"result": result}}}),
                Content::AsReceived,
            );
        }
        check(
            json!({"crypto": {"decrypted": {"result": "decrypted"}}}),
            Content::Decrypted {
                original_headers: None,
            },
        );
        check(
            json!({"crypto": {"decrypted": {"result": "decrypted",
                "original_headers": "Subject: x\r\n"}}}),
            Content::Decrypted {
                original_headers: Some(b"Subject: x\r\n".to_vec()),
            },
        );
        // a record that does not parse still keeps the plaintext from going back
        check(
            json!({"crypto": {"decrypted": {"result": "decrypted", "original_headers": 7}}}),
            Content::Decrypted {
                original_headers: None,
            },
        );
        check(
            json!({"crypto": {"decrypted": {"result": "what"}}}),
            Content::AsReceived,
        );
    }

    #[test]
    fn loop_table() {
        let report = |t: &str| Some(Loop::Report(t.into()));
        check("Subject: hi\r\nFrom: a@example.org\r\n", None);
        check(
            "Content-Type: multipart/report; report-type=delivery-status;\r\n\tboundary=\"x\"\r\n",
            report("delivery-status"),
        );
        check(
            "content-type: Multipart/Report; boundary=x; Report-Type=\"Global-Delivery-Status\"\r\n",
            report("global-delivery-status"),
        );
        check(
            "Content-Type: multipart/report; report-type=disposition-notification; boundary=x\r\n",
            report("disposition-notification"),
        );
        check(
            "Content-Type: multipart/report; report-type=feedback-report; boundary=x\r\n",
            None,
        );
        check("Content-Type: multipart/mixed; boundary=x\r\n", None);
        check("Auto-Submitted: auto-replied\r\n", Some(Loop::AutoReplied));
        check(
            "Auto-Submitted: Auto-Replied (vacation)\r\n",
            Some(Loop::AutoReplied),
        );
        check(
            "auto-submitted:auto-replied; owner-email=a@example.org\r\n",
            Some(Loop::AutoReplied),
        );
        check("Auto-Submitted: auto-generated\r\n", None);
        check("Auto-Submitted: no\r\n", None);
        check("", None);
    }
}
