//! The report as mail (RFC 8460 §5.3), both ways: [`compose`] writes the message this
//! server sends to a `mailto:` rua, [`extract`] finds the report in one it receives. Pure.

use chrono::{DateTime, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::content_type::ContentType;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::{BodyPart, MimePart};
use mail_parser::{MessageParser, MimeHeaders};
use pepsi_conf::text::one_line;

use crate::report::{self, Report};

/// The largest report mail [`extract`] reads.
pub const MAX_MAIL_BYTES: usize = 20 * 1024 * 1024;

/// What a report mail is made of besides the report.
pub struct Envelope<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub message_id: &'a str,
    pub now: DateTime<Utc>,
}

/// The report mail: `multipart/report; report-type="tlsrpt"` with a short text and the
/// gzip'ed report as an `application/tlsrpt+gzip` attachment named as §5.3 says, the
/// subject and the `TLS-Report-Domain` / `TLS-Report-Submitter` fields.
pub fn compose(report: &Report, domain: &str, e: &Envelope<'_>) -> Vec<u8> {
    let submitter = one_line(&report.organization_name);
    let text = format!(
        "This is an aggregate TLS report (RFC 8460) from {submitter} for {domain}, \
         covering {} to {}.\r\nThe report is attached as {}.\r\n",
        report.date_range.start_datetime.to_rfc3339(),
        report.date_range.end_datetime.to_rfc3339(),
        report::file_name(report, domain)
    );
    let body = MimePart::new(
        ContentType::new("multipart/report").attribute("report-type", "tlsrpt"),
        vec![
            MimePart::new(
                ContentType::new("text/plain").attribute("charset", "utf-8"),
                BodyPart::Text(text.into()),
            ),
            MimePart::new(
                ContentType::new("application/tlsrpt+gzip"),
                BodyPart::Binary(report::gzip(report).into()),
            )
            .attachment(report::file_name(report, domain)),
        ],
    );
    MessageBuilder::new()
        .from(one_line(e.from))
        .to(one_line(e.to))
        // As §5.3 writes it, unencoded (the parts are ASCII host names and ids).
        .header(
            "Subject",
            Raw::new(format!(
                "Report Domain: {domain} Submitter: {submitter} Report-ID: <{}>",
                one_line(&report.report_id)
            )),
        )
        .date(Date::new(e.now.timestamp()))
        .message_id(one_line(e.message_id))
        .header("TLS-Report-Domain", Raw::new(domain.to_owned()))
        .header("TLS-Report-Submitter", Raw::new(submitter))
        .header("Auto-Submitted", Raw::new("auto-generated"))
        .body(body)
        .write_to_vec()
        .expect("writing to memory")
}

/// The report in a received mail: the first part of type `application/tlsrpt+gzip` or
/// `application/tlsrpt+json` (or, from senders that label it loosely, a part named
/// `*.json.gz` or `*.json`), parsed and validated.
pub fn extract(raw: &[u8]) -> Result<Report, String> {
    if raw.len() > MAX_MAIL_BYTES {
        return Err(format!(
            "the mail is {} bytes, more than the {MAX_MAIL_BYTES} read",
            raw.len()
        ));
    }
    let message = MessageParser::default()
        .parse(raw)
        .ok_or("the input is not a mail message")?;
    for part in message.parts.iter() {
        let kind = part
            .content_type()
            .map(|c| {
                format!("{}/{}", c.ctype(), c.subtype().unwrap_or_default()).to_ascii_lowercase()
            })
            .unwrap_or_default();
        let name = part
            .attachment_name()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let is_report = kind == "application/tlsrpt+gzip"
            || kind == "application/tlsrpt+json"
            || name.ends_with(".json.gz")
            || name.ends_with(".json");
        if is_report {
            return report::parse(part.contents());
        }
    }
    Err("the mail carries no application/tlsrpt+gzip or +json part".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Counted, Submitter, build};

    #[test]
    fn a_report_mail_reads_back() {
        let s = Submitter {
            organization: "Example Mail".into(),
            contact: "postmaster@relay.example".into(),
            hostname: "relay.example".into(),
        };
        let day = chrono::NaiveDate::from_ymd_opt(2026, 12, 5).unwrap();
        let r = build(
            &s,
            "b.test",
            day,
            &[Counted {
                policy_type: "sts".into(),
                policy_string: vec!["version: STSv1".into()],
                mx_host: "mx.b.test".into(),
                receiving_ip: "192.0.2.9".into(),
                result_type: "certificate-expired".into(),
                sessions: 4,
                detail: "Expired".into(),
            }],
        );
        let raw = compose(
            &r,
            "b.test",
            &Envelope {
                from: "postmaster@relay.example",
                to: "tls@b.test",
                message_id: "1.tlsrpt@relay.example",
                now: Utc::now(),
            },
        );
        // Unfolded, as a reader sees the fields.
        let text = String::from_utf8_lossy(&raw).replace("\r\n ", " ");
        assert!(text.contains("Subject: Report Domain: b.test Submitter: Example Mail Report-ID: <20261205.b.test@relay.example>"), "{text}");
        assert!(text.contains("TLS-Report-Domain: b.test"), "{text}");
        assert!(text.contains("multipart/report"), "{text}");
        assert!(
            text.contains("report-type=\"tlsrpt\"") || text.contains("report-type=tlsrpt"),
            "{text}"
        );
        assert!(text.contains("application/tlsrpt+gzip"), "{text}");
        assert_eq!(extract(&raw), Ok(r));
        assert!(
            extract(b"From: a@b\r\n\r\nhello\r\n")
                .unwrap_err()
                .contains("no application/tlsrpt")
        );
    }
}
