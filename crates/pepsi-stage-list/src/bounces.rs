//! Bounces and complaints to a list's `-bounces` addresses (docs/lists.md, "Bounces"): the
//! report read (RFC 3464 delivery status notifications, ours and foreign ones, RFC 6533's
//! global form, and RFC 5965 feedback reports), what it says about which address, and how a
//! member's bounce score moves. Pure: no I/O, no SQL; the stage's `bounce` stores what these
//! functions decide.

use mail_parser::{MessageParser, MimeHeaders as _};

/// The most recipient groups of one report read: a list's bounce concerns one member, a
/// report naming more is read no further.
pub const MAX_GROUPS: usize = 50;

/// The most characters of a diagnostic kept in `list_bounce_event.diagnostic`.
pub const MAX_DIAGNOSTIC_CHARS: usize = 500;

/// The most characters of a report's Message-ID kept.
pub const MAX_MESSAGE_ID_CHARS: usize = 250;

/// The highest score stored (`list_bounce_score.score` is numeric(8,2); a threshold is below
/// 10000, so this is past every one).
pub const MAX_SCORE: f64 = 10_000.0;

/// What a report says happened to a message for an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 5.x.x other than 5.7.x: the address does not take mail. Scores 1.
    Hard,
    /// 4.x.x: a temporary failure the sender gave up on. Scores 0.5, once a day.
    Soft,
    /// 5.7.x: the content or the sender was refused (spam filters, policy); not the
    /// member's fault, recorded but never counted.
    Policy,
    /// An RFC 5965 feedback report of abuse or fraud: the person does not want the mail.
    Complaint,
}

impl Kind {
    /// The word `list_bounce_event.kind` stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Hard => "hard",
            Kind::Soft => "soft",
            Kind::Policy => "policy",
            Kind::Complaint => "complaint",
        }
    }
}

/// The kind of an RFC 3463 status (`5.1.1`, `4.2.2`), or `None` for one that reports no
/// failure (2.x.x) or is not a status.
pub fn status_kind(status: &str) -> Option<Kind> {
    let mut parts = status.split('.');
    let class = parts.next()?;
    let subject = parts.next()?;
    let detail = parts.next()?;
    let digits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    if parts.next().is_some() || !digits(subject, 3) || !digits(detail, 3) {
        return None;
    }
    match class {
        "5" if subject == "7" => Some(Kind::Policy),
        "5" => Some(Kind::Hard),
        "4" => Some(Kind::Soft),
        _ => None,
    }
}

/// One thing a report says: what happened (`kind`, `status`, `diagnostic`) and for which
/// addresses (Final-Recipient and Original-Recipient of a DSN; Original-Rcpt-To and
/// Removal-Recipient of a feedback report), lower case, each once. A report that is no
/// RFC 3464 or 5965 report names no address.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub kind: Kind,
    pub status: String,
    pub diagnostic: String,
    pub addresses: Vec<String>,
}

/// A report as read: its Message-ID (without angle brackets, empty without one) and its
/// findings, in the report's order. No finding: the report says nothing a list counts (a
/// delivery report of success, an unreadable message, a feedback report of another type).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub message_id: String,
    pub findings: Vec<Finding>,
}

impl Report {
    /// What the report says about `member`, whose VERP address it came to: the finding
    /// naming the member, else the first (a forwarding member's report names the address
    /// the mail went on to).
    pub fn about(&self, member: &str) -> Option<&Finding> {
        self.findings
            .iter()
            .find(|f| f.addresses.iter().any(|a| a == member))
            .or_else(|| self.findings.first())
    }

    /// Every address the report names with what it says about it, each address once (its
    /// first finding): a report to the plain `-bounces` address names the member only
    /// there.
    pub fn named(&self) -> Vec<(&str, &Finding)> {
        let mut out: Vec<(&str, &Finding)> = Vec::new();
        for f in &self.findings {
            for a in &f.addresses {
                if !out.iter().any(|(seen, _)| *seen == a) {
                    out.push((a, f));
                }
            }
        }
        out
    }
}

/// Reads the report `raw` (the header block, the empty line, the body, as much of it as was
/// fetched). A `multipart/report` is read by its parts: every `message/delivery-status` or
/// `message/global-delivery-status` part's recipient groups with a failure status, and a
/// `message/feedback-report` part whose Feedback-Type is `abuse` or `fraud` (a complaint).
/// Any other message is read as before reports were parsed: its first `Status:` line.
pub fn read(raw: &[u8]) -> Report {
    let parser = MessageParser::new();
    let Some(message) = parser.parse(raw) else {
        return Report {
            message_id: String::new(),
            findings: Vec::new(),
        };
    };
    let message_id: String = message
        .message_id()
        .unwrap_or_default()
        .chars()
        .take(MAX_MESSAGE_ID_CHARS)
        .collect();
    let mut findings: Vec<Finding> = Vec::new();
    let mut structured = false;
    for part in message.parts.iter().skip(1) {
        let Some(ct) = part.content_type() else {
            continue;
        };
        if !ct.ctype().eq_ignore_ascii_case("message") {
            continue;
        }
        let subtype = ct.subtype().unwrap_or_default().to_ascii_lowercase();
        match subtype.as_str() {
            "delivery-status" | "global-delivery-status" => {
                structured = true;
                for group in groups(part.contents()).into_iter().skip(1) {
                    if findings.len() >= MAX_GROUPS {
                        break;
                    }
                    if let Some(f) = recipient(&group) {
                        findings.push(f);
                    }
                }
            }
            "feedback-report" => {
                structured = true;
                if let Some(group) = groups(part.contents()).into_iter().next()
                    && let Some(f) = feedback(&group)
                {
                    findings.push(f);
                }
            }
            _ => {}
        }
    }
    if !structured {
        // A report that is no multipart/report: the first Status line of the body.
        let body = message
            .parts
            .first()
            .map(|p| &raw[(p.offset_body as usize).min(raw.len())..])
            .unwrap_or_default();
        if let Some(status) = first_status(body)
            && let Some(kind) = status_kind(&status)
        {
            findings.push(Finding {
                kind,
                status,
                diagnostic: String::new(),
                addresses: Vec::new(),
            });
        }
    }
    Report {
        message_id,
        findings,
    }
}

/// The field groups of a delivery-status or feedback-report body (groups are separated by
/// empty lines), each as (lower-case name, unfolded value) pairs, read by mail-parser as
/// header blocks.
fn groups(body: &[u8]) -> Vec<Vec<(String, String)>> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let parser = MessageParser::new();
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        if block.trim().is_empty() {
            continue;
        }
        if out.len() > MAX_GROUPS {
            break;
        }
        let block = format!("{}\r\n\r\n", block.trim_matches('\n').replace('\n', "\r\n"));
        let Some(parsed) = parser.parse_headers(block.as_bytes()) else {
            continue;
        };
        let fields: Vec<(String, String)> = parsed
            .headers()
            .iter()
            .map(|h| {
                (
                    h.name.as_str().to_ascii_lowercase(),
                    // Unfolded: a folded Diagnostic-Code reads as one line.
                    h.value
                        .as_text()
                        .unwrap_or_default()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                )
            })
            .collect();
        out.push(fields);
    }
    out
}

fn field<'a>(group: &'a [(String, String)], name: &str) -> Option<&'a str> {
    group
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The address of an `addr-type; address` field (RFC 3464: `rfc822; bob@example.org`, RFC
/// 6533: `utf-8; ...`), or of a bare address (RFC 5965), in the form member addresses are
/// stored in (`Address::key`: the local part lower case, the domain normalised).
pub fn typed_address(value: &str) -> Option<String> {
    let address = match value.split_once(';') {
        Some((_, a)) => a,
        None => value,
    };
    let address = address
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .trim();
    if address.len() > 254 || address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return None;
    }
    // The form member addresses are stored in (`list_member.address`).
    let parsed = pepsi_conf::address::Address::parse(address).ok()?;
    (!parsed.domain().is_empty()).then(|| parsed.key())
}

/// A per-recipient group of a DSN: a finding when its Status reports a failure. The
/// Action field is not asked: a `delayed` report (4.x.x) is a soft bounce too.
fn recipient(group: &[(String, String)]) -> Option<Finding> {
    let status = field(group, "status")?
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let kind = status_kind(&status)?;
    let mut addresses: Vec<String> = Vec::new();
    for name in ["final-recipient", "original-recipient"] {
        if let Some(a) = field(group, name).and_then(typed_address)
            && !addresses.contains(&a)
        {
            addresses.push(a);
        }
    }
    Some(Finding {
        kind,
        status,
        diagnostic: field(group, "diagnostic-code")
            .unwrap_or_default()
            .chars()
            .take(MAX_DIAGNOSTIC_CHARS)
            .collect(),
        addresses,
    })
}

/// An RFC 5965 feedback report: a complaint when its Feedback-Type is `abuse` or `fraud`
/// (the person does not want the mail); `not-spam`, `virus`, `auth-failure` (RFC 6591) and
/// the rest say nothing about whether the person wants the list.
fn feedback(group: &[(String, String)]) -> Option<Finding> {
    let feedback_type = field(group, "feedback-type")?.to_ascii_lowercase();
    if !matches!(feedback_type.as_str(), "abuse" | "fraud") {
        return None;
    }
    let mut addresses: Vec<String> = Vec::new();
    for (name, value) in group {
        if (name == "original-rcpt-to" || name == "removal-recipient")
            && let Some(a) = typed_address(value)
            && !addresses.contains(&a)
        {
            addresses.push(a);
        }
    }
    Some(Finding {
        kind: Kind::Complaint,
        status: String::new(),
        diagnostic: format!("feedback-type {feedback_type}"),
        addresses,
    })
}

/// The value of the first `Status:` line of `body` that holds a status.
fn first_status(body: &[u8]) -> Option<String> {
    String::from_utf8_lossy(body).lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        let status = value.split_whitespace().next()?;
        (name.trim().eq_ignore_ascii_case("Status") && status_kind(status).is_some())
            .then(|| status.to_owned())
    })
}

/// A member's score as stored, before a bounce is counted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    pub score: f64,
    /// Days since the last counted bounce (`current_date - last_bounce_on`); `None`: none.
    pub days_since_last: Option<i64>,
}

/// A list's rules for counting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// `bounce_score_threshold`.
    pub threshold: f64,
    /// `bounce_info_stale_after`, in seconds.
    pub stale_after_secs: f64,
}

/// What counting one bounce does to a score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counted {
    /// The score to store.
    pub score: f64,
    /// Whether this bounce counted (`last_bounce_on` becomes today).
    pub counted: bool,
    /// Whether the score is at the threshold: a member still enabled is disabled.
    pub reached: bool,
}

/// Counts one bounce of `kind` on `prev`. A score whose last counted bounce is older than
/// `stale_after_secs` starts again from 0. A hard bounce adds 1; a soft one adds 0.5 unless
/// a bounce counted today already (a mailbox full for a week costs 3.5, not a point per
/// post); policy refusals and complaints add nothing.
pub fn count(prev: Score, kind: Kind, rules: Rules) -> Counted {
    let stale = prev
        .days_since_last
        .is_some_and(|d| (d as f64) * 86_400.0 > rules.stale_after_secs);
    let base = if stale { 0.0 } else { prev.score };
    let add = match kind {
        Kind::Hard => 1.0,
        Kind::Soft if prev.days_since_last == Some(0) => 0.0,
        Kind::Soft => 0.5,
        Kind::Policy | Kind::Complaint => 0.0,
    };
    if add == 0.0 {
        return Counted {
            score: prev.score,
            counted: false,
            reached: false,
        };
    }
    let score = ((base + add) * 100.0).round() / 100.0;
    let score = score.min(MAX_SCORE);
    Counted {
        score,
        counted: true,
        reached: score >= rules.threshold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_kinds_table() {
        let cases: &[(&str, Option<Kind>)] = &[
            ("5.1.1", Some(Kind::Hard)),
            ("5.2.2", Some(Kind::Hard)),
            ("5.7.1", Some(Kind::Policy)),
            ("5.7.26", Some(Kind::Policy)),
            ("4.2.2", Some(Kind::Soft)),
            ("4.7.1", Some(Kind::Soft)),
            ("2.0.0", None),
            ("5.1", None),
            ("5.1.1.1", None),
            ("5.x.1", None),
            ("", None),
            ("550", None),
        ];
        for (status, kind) in cases {
            assert_eq!(status_kind(status), *kind, "{status}");
        }
    }

    #[test]
    fn typed_addresses_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("rfc822; Bob@Example.ORG", Some("bob@example.org")),
            ("rfc822;<bob@example.org>", Some("bob@example.org")),
            ("utf-8; jöran@example.org", Some("jöran@example.org")),
            ("bob@example.org", Some("bob@example.org")),
            (
                "rfc822; Bob@Bücher.example",
                Some("bob@xn--bcher-kva.example"),
            ),
            ("rfc822; bob", None),
            ("rfc822; @example.org", None),
            ("rfc822; bob @example.org", None),
            ("", None),
        ];
        for (value, address) in cases {
            assert_eq!(typed_address(value).as_deref(), *address, "{value}");
        }
    }

    const OURS: &str = "From: MAILER-DAEMON@mx.example.org\r\n\
        To: team+bounces-bob=example.net@example.org\r\n\
        Subject: Undelivered Mail Returned to Sender\r\n\
        Message-ID: <dsn.17@mx.example.org>\r\n\
        MIME-Version: 1.0\r\n\
        Content-Type: multipart/report; report-type=\"delivery-status\";\r\n boundary=\"BOUNDARY\"\r\n\
        \r\n\
        --BOUNDARY\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        \r\n\
        Status: 4.4.4 (a line of the human part, not a field)\r\n\
        --BOUNDARY\r\n\
        Content-Type: message/delivery-status\r\n\
        \r\n\
        Reporting-MTA: dns; mx.example.org\r\n\
        Arrival-Date: Sun, 6 Dec 2026 02:00:00 +0000\r\n\
        \r\n\
        Original-Recipient: rfc822; Bob@Example.net\r\n\
        Final-Recipient: rfc822; bob@example.net\r\n\
        Action: failed\r\n\
        Status: 5.1.1\r\n\
        Remote-MTA: dns; mx.example.net\r\n\
        Diagnostic-Code: smtp; 550 5.1.1 <bob@example.net>:\r\n  no such user\r\n\
        \r\n\
        --BOUNDARY\r\n\
        Content-Type: text/rfc822-headers\r\n\
        \r\n\
        Status: 5.7.1\r\n\
        --BOUNDARY--\r\n";

    fn report(body_parts: &str) -> String {
        format!(
            "From: postmaster@example.com\r\nMessage-ID: <r1@example.com>\r\n\
             MIME-Version: 1.0\r\n\
             Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n\
             --b\r\nContent-Type: text/plain\r\n\r\nsorry\r\n{body_parts}--b--\r\n"
        )
    }

    fn finding(kind: Kind, status: &str, diagnostic: &str, addresses: &[&str]) -> Finding {
        Finding {
            kind,
            status: status.to_owned(),
            diagnostic: diagnostic.to_owned(),
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    #[test]
    fn reports_table() {
        let two = report(
            "--b\r\nContent-Type: message/delivery-status\r\n\r\n\
             Reporting-MTA: dns; example.com\r\n\r\n\
             Final-Recipient: rfc822; ann@example.com\r\nAction: delayed\r\nStatus: 4.2.2\r\n\
             Diagnostic-Code: smtp; 452 4.2.2 mailbox full\r\n\r\n\
             Final-Recipient: rfc822; cy@example.com\r\nAction: failed\r\nStatus: 5.7.1 (spam)\r\n\r\n\
             Final-Recipient: rfc822; dee@example.com\r\nAction: delivered\r\nStatus: 2.0.0\r\n\r\n",
        );
        let global = report(
            "--b\r\nContent-Type: message/global-delivery-status\r\n\
             Content-Transfer-Encoding: base64\r\n\r\n\
             UmVwb3J0aW5nLU1UQTogZG5zOyBleGFtcGxlLmNvbQ0KDQpGaW5hbC1SZWNpcGllbnQ6IHV0Zi04OyBq\r\n\
             w7ZyYW5AZXhhbXBsZS5jb20NCkFjdGlvbjogZmFpbGVkDQpTdGF0dXM6IDUuMi4xDQo=\r\n",
        );
        let arf = |t: &str| {
            report(&format!(
                "--b\r\nContent-Type: message/feedback-report\r\n\r\n\
                 Feedback-Type: {t}\r\nUser-Agent: fbl/1\r\nVersion: 1\r\n\
                 Original-Mail-From: <team+bounces-eve=example.com@example.org>\r\n\
                 Original-Rcpt-To: <Eve@example.com>\r\n\
                 Removal-Recipient: eve@example.com\r\n\r\n\
                 --b\r\nContent-Type: text/rfc822-headers\r\n\r\n\
                 Subject: a post\r\n\r\n"
            ))
        };
        let cases: Vec<(String, &str, Vec<Finding>)> = vec![
            (
                OURS.to_owned(),
                "dsn.17@mx.example.org",
                vec![finding(
                    Kind::Hard,
                    "5.1.1",
                    "smtp; 550 5.1.1 <bob@example.net>: no such user",
                    &["bob@example.net"],
                )],
            ),
            (
                two,
                "r1@example.com",
                vec![
                    finding(
                        Kind::Soft,
                        "4.2.2",
                        "smtp; 452 4.2.2 mailbox full",
                        &["ann@example.com"],
                    ),
                    finding(Kind::Policy, "5.7.1", "", &["cy@example.com"]),
                ],
            ),
            (
                global,
                "r1@example.com",
                vec![finding(Kind::Hard, "5.2.1", "", &["jöran@example.com"])],
            ),
            (
                arf("abuse"),
                "r1@example.com",
                vec![finding(
                    Kind::Complaint,
                    "",
                    "feedback-type abuse",
                    &["eve@example.com"],
                )],
            ),
            (arf("not-spam"), "r1@example.com", vec![]),
            (arf("auth-failure"), "r1@example.com", vec![]),
            // No multipart/report: the first Status line of the body, as before.
            (
                "Subject: Undelivered\r\n\r\nReporting-MTA: dns; x\r\n\r\nStatus: 5.1.1\r\n"
                    .to_owned(),
                "",
                vec![finding(Kind::Hard, "5.1.1", "", &[])],
            ),
            (
                "Subject: Status: 5.1.1\r\n\r\nnothing here\r\n".to_owned(),
                "",
                vec![],
            ),
            // A report with a delivery-status part and no failure says nothing.
            (
                report(
                    "--b\r\nContent-Type: message/delivery-status\r\n\r\n\
                     Reporting-MTA: dns; x\r\n\r\nFinal-Recipient: rfc822; a@b.c\r\nStatus: 2.0.0\r\n\r\n",
                ),
                "r1@example.com",
                vec![],
            ),
            ("".to_owned(), "", vec![]),
        ];
        for (raw, message_id, findings) in cases {
            let r = read(raw.as_bytes());
            assert_eq!(r.message_id, message_id, "{raw}");
            assert_eq!(r.findings, findings, "{raw}");
        }
    }

    #[test]
    fn about_and_named() {
        let r = Report {
            message_id: String::new(),
            findings: vec![
                finding(Kind::Soft, "4.2.2", "", &["a@x.org", "b@x.org"]),
                finding(Kind::Hard, "5.1.1", "", &["c@x.org", "a@x.org"]),
            ],
        };
        assert_eq!(r.about("c@x.org").unwrap().status, "5.1.1");
        assert_eq!(r.about("zz@x.org").unwrap().status, "4.2.2");
        let named: Vec<(&str, &str)> = r
            .named()
            .into_iter()
            .map(|(a, f)| (a, f.status.as_str()))
            .collect();
        assert_eq!(
            named,
            vec![
                ("a@x.org", "4.2.2"),
                ("b@x.org", "4.2.2"),
                ("c@x.org", "5.1.1")
            ]
        );
        let many = Report {
            message_id: String::new(),
            findings: vec![],
        };
        assert!(many.about("a@x.org").is_none());
    }

    #[test]
    fn counting_table() {
        let rules = Rules {
            threshold: 3.0,
            stale_after_secs: 7.0 * 86_400.0,
        };
        let s = |score: f64, days: Option<i64>| Score {
            score,
            days_since_last: days,
        };
        let c = |score: f64, counted: bool, reached: bool| Counted {
            score,
            counted,
            reached,
        };
        let cases: &[(Score, Kind, Counted)] = &[
            (s(0.0, None), Kind::Hard, c(1.0, true, false)),
            (s(2.0, Some(0)), Kind::Hard, c(3.0, true, true)),
            (s(2.5, Some(3)), Kind::Hard, c(3.5, true, true)),
            (s(0.0, None), Kind::Soft, c(0.5, true, false)),
            // A soft bounce counts once a day.
            (s(0.5, Some(0)), Kind::Soft, c(0.5, false, false)),
            (s(0.5, Some(1)), Kind::Soft, c(1.0, true, false)),
            (s(2.5, Some(1)), Kind::Soft, c(3.0, true, true)),
            // Policy refusals and complaints never count.
            (s(2.5, Some(1)), Kind::Policy, c(2.5, false, false)),
            (s(2.5, Some(1)), Kind::Complaint, c(2.5, false, false)),
            // Stale: 8 days past a 7-day limit starts from 0; 7 days is not stale.
            (s(2.5, Some(8)), Kind::Hard, c(1.0, true, false)),
            (s(2.0, Some(7)), Kind::Hard, c(3.0, true, true)),
            (s(2.5, Some(8)), Kind::Soft, c(0.5, true, false)),
            (s(9_999.5, Some(0)), Kind::Hard, c(MAX_SCORE, true, true)),
        ];
        for (prev, kind, want) in cases {
            assert_eq!(count(*prev, *kind, rules), *want, "{prev:?} {kind:?}");
        }
        let hourly = Rules {
            threshold: 5.0,
            stale_after_secs: 3_600.0,
        };
        assert_eq!(
            count(s(4.0, Some(1)), Kind::Hard, hourly),
            c(1.0, true, false)
        );
    }
}
