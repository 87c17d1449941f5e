//! DMARC mitigation of a list post (docs/lists.md, "DMARC"). A list that sends a post under
//! its author's From, with the subject prefixed and a footer added, breaks the author's DKIM
//! signature and is not the author's SPF: receivers that honour the author domain's
//! `p=reject` or `p=quarantine` refuse or bin the copy, and count that against the member.
//! So when the From domain publishes one of those, the copy goes out under the list's
//! address (`munge_from`) or as a message of the list's with the post attached (`wrap`).
//!
//! Pure: the policy of a DMARC record, the names a lookup asks, the treatment of a policy
//! under the list's `dmarc_mitigation`, and the header and body rewrites, each tested as a
//! table. The I/O (the DNS through `pepsi_outbound::dns`, the cache in
//! `pepsi.list_dmarc_policy`) sits in [`policy`] at the end, and never holds a post longer
//! than its timeout: a lookup that fails or takes longer counts as `p=reject`.

use pepsi_conf::text::one_line;
use std::time::Duration;

use mail_builder::headers::Header as _;
use mail_builder::headers::address::Address;
use pepsi_contract::message;
use pepsi_outbound::dns::{Dns, Lookup};
use sha2::{Digest, Sha256};

use crate::post::ListFacts;

/// A From domain's DMARC policy as `list_dmarc_policy.policy` stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    None,
    Quarantine,
    Reject,
    /// No DMARC record at the domain or its organisational domain.
    Absent,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Quarantine => "quarantine",
            Policy::Reject => "reject",
            Policy::Absent => "absent",
        }
    }

    pub fn parse(word: &str) -> Option<Policy> {
        Some(match word.trim().to_ascii_lowercase().as_str() {
            "none" => Policy::None,
            "quarantine" => Policy::Quarantine,
            "reject" => Policy::Reject,
            "absent" => Policy::Absent,
            _ => return None,
        })
    }
}

/// What the copy of a post undergoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Sent under the author's From.
    Leave,
    /// From becomes `"Author via List" <list>`; the author goes to Reply-To or Cc.
    MungeFrom,
    /// A message of the list's carrying the post as a message/rfc822 part.
    Wrap,
}

/// The treatment under the list's `dmarc_mitigation` (`munge_from`, `wrap`, `none`) of a
/// From domain's policy; `None` is a lookup that failed or ran out of time, taken as
/// `p=reject`: a copy mitigated needlessly still arrives, one not mitigated may be refused
/// by every receiver that enforces DMARC and counted as the member's bounce.
pub fn treatment(mitigation: &str, policy: Option<Policy>) -> Treatment {
    let enforced = match policy {
        Some(Policy::Reject | Policy::Quarantine) | None => true,
        Some(Policy::None | Policy::Absent) => false,
    };
    match mitigation {
        _ if !enforced => Treatment::Leave,
        "munge_from" => Treatment::MungeFrom,
        "wrap" => Treatment::Wrap,
        _ => Treatment::Leave,
    }
}

/// The tags of one DMARC record that decide a policy: `p` and `sp` (RFC 7489 §6.3), `None`
/// when absent or not a policy word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub p: Option<Policy>,
    pub sp: Option<Policy>,
}

/// One TXT record read as DMARC: `None` unless it starts with the tag `v=DMARC1`.
pub fn parse_record(txt: &str) -> Option<Record> {
    let mut tags = txt.split(';').map(|t| {
        let (k, v) = t.split_once('=').unwrap_or((t, ""));
        (k.trim().to_ascii_lowercase(), v.trim())
    });
    match tags.next() {
        Some((k, v)) if k == "v" && v == "DMARC1" => {}
        _ => return None,
    }
    let mut record = Record { p: None, sp: None };
    for (k, v) in tags {
        let word = Policy::parse(v).filter(|p| *p != Policy::Absent);
        match k.as_str() {
            "p" if record.p.is_none() => record.p = word,
            "sp" if record.sp.is_none() => record.sp = word,
            _ => {}
        }
    }
    Some(record)
}

/// The DMARC record among a name's TXT records: exactly one, or none (RFC 7489 §6.6.3:
/// several DMARC records are as none).
pub fn record_among(txts: &[String]) -> Option<Record> {
    let mut found = txts.iter().filter_map(|t| parse_record(t));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// The policy a record gives the author's domain: its `p` when it is the domain's own,
/// else (the organisational domain's) its `sp`, then its `p`. A record without a valid `p`
/// is taken as `none` (RFC 7489 §6.6.3 allows treating it so).
pub fn applies(record: Record, own: bool) -> Policy {
    let p = if own {
        record.p
    } else {
        record.sp.or(record.p)
    };
    p.unwrap_or(Policy::None)
}

/// The most parent names a lookup asks after the domain's own.
pub const MAX_PARENTS: usize = 4;

/// The names a lookup asks, in order: `_dmarc.<domain>`, then `_dmarc.` of its parents
/// from the nearest down to two labels. No public suffix list ships with Pepsi, so the
/// organisational domain (RFC 7489 §3.2) is found as DMARCbis finds it, by walking up the
/// tree; a long name asks only its shortest parents (at most [`MAX_PARENTS`]), where an
/// organisational domain sits.
pub fn names_to_ask(domain: &str) -> Vec<String> {
    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = domain.split('.').collect();
    let mut names = vec![format!("_dmarc.{domain}")];
    if labels.len() > 2 {
        let first_parent = (labels.len() - 2).saturating_sub(MAX_PARENTS - 1).max(1);
        for i in first_parent..=labels.len() - 2 {
            names.push(format!("_dmarc.{}", labels[i..].join(".")));
        }
    }
    names
}

/// The author of a post as its first From field gives them: (display name decoded, or
/// empty; the address). `None` without a From address.
pub fn author(headers: &[u8]) -> Option<(String, String)> {
    let mut block = headers.to_vec();
    block.extend_from_slice(b"\r\n");
    let parsed = mail_parser::MessageParser::default().parse_headers(&block)?;
    let from = parsed.from()?.first()?;
    let address = from.address()?.to_owned();
    let name = from.name().map(one_line).unwrap_or_default();
    Some((name, address))
}

/// The domain of `address`, lower-case, IDN as punycode (`Address::key`).
pub fn domain_of(address: &str) -> Option<String> {
    let key = pepsi_conf::address::Address::parse(address).ok()?.key();
    pepsi_conf::address::domain_part(&key).map(str::to_owned)
}

/// The list's From for a post of `author`: `"Name via List" <list>` (RFC 2047-encoded when
/// not ASCII), as a complete field with CRLF.
pub fn list_from(author: &(String, String), list: &ListFacts<'_>) -> Vec<u8> {
    let who = if author.0.is_empty() {
        author.1.as_str()
    } else {
        author.0.as_str()
    };
    let list_name = if list.display_name.trim().is_empty() {
        list.address.to_owned()
    } else {
        one_line(list.display_name)
    };
    let name = format!("{who} via {list_name}");
    let mut field = b"From: ".to_vec();
    Address::new_address(Some(name), list.address).write_header(&mut field, 6);
    field
}

/// Fields the list removes from a mitigated post: signatures over the original From,
/// subject and body, which the list copy no longer matches (the remote branch signs the
/// copy with the list domain's key).
pub const BROKEN_FIELDS: &[&str] = &["DKIM-Signature", "DomainKey-Signature"];

/// The header block of a post whose From the list takes (`munge_from`): From is the list's
/// ([`list_from`]); the author's From goes to Reply-To when replies go to the sender and the
/// post has no Reply-To of its own, else (replies go to the list or an explicit address,
/// which `post::headers` then writes) to Cc, so a reply to all still reaches the author.
/// The original signatures are removed ([`BROKEN_FIELDS`]).
pub fn munge(headers: &[u8], list: &ListFacts<'_>) -> Vec<u8> {
    let Some(author) = author(headers) else {
        return headers.to_vec();
    };
    let original = message::field_values(headers, "From")
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut h = message::remove_fields(headers, "From");
    for name in BROKEN_FIELDS {
        h = message::remove_fields(&h, name);
    }
    h.extend_from_slice(&list_from(&author, list));
    keep_author(&mut h, &original, list);
    h
}

/// Where the author's From value goes once From is the list's (see [`munge`]).
fn keep_author(h: &mut Vec<u8>, original: &str, list: &ListFacts<'_>) {
    let original = one_line(original);
    if list.reply_goes_to == "sender" {
        if !message::has_field(h, "Reply-To") {
            push(h, "Reply-To", &original);
        }
        return;
    }
    let cc: Vec<String> = message::field_values(h, "Cc");
    let mut values: Vec<String> = cc.iter().map(|v| one_line(v)).collect();
    values.push(original);
    *h = message::remove_fields(h, "Cc");
    push(h, "Cc", &values.join(", "));
}

/// The fields of the post a wrapping message keeps, so it threads and reads as the post, and
/// the marks of the lists it went through (`X-Loop`), so a loop through lists still stops.
pub const WRAP_KEEPS: &[&str] = &[
    "X-Loop",
    "To",
    "Cc",
    "Subject",
    "Date",
    "Message-ID",
    "In-Reply-To",
    "References",
    "Reply-To",
];

/// The message of the list's that carries a post (`wrap`): the post's threading and
/// addressing fields ([`WRAP_KEEPS`]), the list's From with the author kept as [`munge`]
/// keeps them, and a multipart/mixed body of a short note and the post itself, untouched, as
/// message/rfc822 (its own DKIM signature still verifies there).
pub fn wrap(headers: &[u8], body: &[u8], list: &ListFacts<'_>) -> (Vec<u8>, Vec<u8>) {
    let Some(author) = author(headers) else {
        return (headers.to_vec(), body.to_vec());
    };
    let original = message::field_values(headers, "From")
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut h = Vec::new();
    for field in message::fields(headers) {
        let keep = message::field_name(field).is_some_and(|n| {
            WRAP_KEEPS
                .iter()
                .any(|k| k.as_bytes().eq_ignore_ascii_case(n))
        });
        if keep {
            h.extend_from_slice(field);
        }
    }
    h.extend_from_slice(&list_from(&author, list));
    keep_author(&mut h, &original, list);
    let boundary = boundary(headers, body);
    push(&mut h, "MIME-Version", "1.0");
    push(
        &mut h,
        "Content-Type",
        &format!("multipart/mixed; boundary=\"{boundary}\""),
    );
    let eight_bit = headers.iter().chain(body).any(|b| *b >= 0x80);
    let mut b = Vec::with_capacity(headers.len() + body.len() + 512);
    b.extend_from_slice(
        format!(
            "This is a message in MIME format.\r\n\r\n--{boundary}\r\n\
             Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n\
             The post of {} to {} is attached: the DMARC policy of its domain does not let the \
             list send it on under its author's address.\r\n\r\n--{boundary}\r\n\
             Content-Type: message/rfc822\r\nContent-Disposition: inline\r\n\
             Content-Transfer-Encoding: {}\r\n\r\n",
            one_line(&author.1),
            list.address,
            if eight_bit { "8bit" } else { "7bit" }
        )
        .as_bytes(),
    );
    b.extend_from_slice(headers);
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(body);
    if !body.is_empty() && !body.ends_with(b"\r\n") {
        b.extend_from_slice(b"\r\n");
    }
    // The CRLF before a delimiter belongs to it (RFC 2046 §5.1.1): the post keeps its own.
    b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (h, b)
}

/// A boundary drawn from the post's own hash: it cannot occur in the post unless the post
/// contains its own SHA-256.
fn boundary(headers: &[u8], body: &[u8]) -> String {
    let mut d = Sha256::new();
    d.update(headers);
    d.update(body);
    let hex: String = d.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("=_list_{hex}")
}

fn push(h: &mut Vec<u8>, name: &str, value: &str) {
    h.extend_from_slice(name.as_bytes());
    h.extend_from_slice(b": ");
    h.extend_from_slice(value.as_bytes());
    h.extend_from_slice(b"\r\n");
}

/// The DMARC policy of `domain` from the DNS: the names of [`names_to_ask`] in turn, the
/// first DMARC record found deciding ([`applies`]). A name without one (NXDOMAIN, no TXT,
/// no DMARC TXT) passes to the next; a failed lookup ends it.
pub async fn look_up(dns: &Dns, domain: &str) -> Result<Policy, String> {
    use hickory_resolver::proto::rr::{RData, RecordType};
    for (i, name) in names_to_ask(domain).iter().enumerate() {
        let txts: Vec<String> = match dns.records(name, RecordType::TXT).await {
            Ok(records) => records
                .iter()
                .filter_map(|r| match r {
                    RData::TXT(t) => Some(
                        t.txt_data
                            .iter()
                            .map(|s| String::from_utf8_lossy(s).into_owned())
                            .collect(),
                    ),
                    _ => None,
                })
                .collect(),
            Err(Lookup::NoDomain | Lookup::NoRecords) => Vec::new(),
            Err(failed @ Lookup::Failed(_)) => return Err(format!("{name}: {failed}")),
        };
        if let Some(record) = record_among(&txts) {
            return Ok(applies(record, i == 0));
        }
    }
    Ok(Policy::Absent)
}

/// How the list stage asks: the resolver, how long one post's lookup may take, how long an
/// answer is kept.
pub struct Asker<'a> {
    pub dns: Option<&'a Dns>,
    pub timeout: Duration,
    pub cache_for: Duration,
}

/// The DMARC policy of `domain`: from `pepsi.list_dmarc_policy` while its answer lasts, else
/// looked up within `timeout` and stored for `cache_for`. `Err` (not stored) when the
/// lookup failed or ran out of time, or there is no resolver.
pub async fn policy(pool: &sqlx::PgPool, ask: &Asker<'_>, domain: &str) -> Result<Policy, String> {
    let cached: Option<String> = sqlx::query_scalar(
        "SELECT policy FROM pepsi.list_dmarc_policy WHERE domain = $1 AND expires_at > now()",
    )
    .bind(domain)
    .fetch_optional(pool)
    .await
    .map_err(|e| format!("reading list_dmarc_policy: {e}"))?;
    if let Some(p) = cached.as_deref().and_then(Policy::parse) {
        return Ok(p);
    }
    let Some(dns) = ask.dns else {
        return Err("no DNS resolver".into());
    };
    let found = match tokio::time::timeout(ask.timeout, look_up(dns, domain)).await {
        Ok(r) => r?,
        Err(_) => return Err(format!("no answer within {:?}", ask.timeout)),
    };
    sqlx::query(
        "INSERT INTO pepsi.list_dmarc_policy (domain, policy, fetched_at, expires_at) \
         VALUES ($1, $2, now(), now() + make_interval(secs => $3)) \
         ON CONFLICT (domain) DO UPDATE SET policy = EXCLUDED.policy, \
         fetched_at = EXCLUDED.fetched_at, expires_at = EXCLUDED.expires_at",
    )
    .bind(domain)
    .bind(found.as_str())
    .bind(ask.cache_for.as_secs_f64())
    .execute(pool)
    .await
    .map_err(|e| format!("writing list_dmarc_policy: {e}"))?;
    Ok(found)
}

/// A post's copy after the list's `dmarc_mitigation` (`mitigation`): the header block and
/// body to send, and what was done. The From domain's policy is asked only when the list
/// mitigates at all and the post has a From address.
pub async fn mitigate(
    pool: &sqlx::PgPool,
    ask: &Asker<'_>,
    mitigation: &str,
    headers: &[u8],
    body: &[u8],
    list: &ListFacts<'_>,
) -> (Vec<u8>, Vec<u8>, Treatment) {
    let domain = author(headers).and_then(|(_, address)| domain_of(&address));
    // A From in the list's own domain aligns with the copy's envelope sender (SPF) and the
    // remote branch's signature (DKIM), so its policy is met as it is.
    let list_domain = pepsi_conf::address::domain_part(list.address);
    let Some(domain) = domain.filter(|d| mitigation != "none" && Some(d.as_str()) != list_domain)
    else {
        return (headers.to_vec(), body.to_vec(), Treatment::Leave);
    };
    let found = match policy(pool, ask, &domain).await {
        Ok(p) => Some(p),
        Err(why) => {
            tracing::warn!(list = %list.address, %domain, %why, "DMARC policy unknown: taken as p=reject");
            None
        }
    };
    let t = treatment(mitigation, found);
    tracing::info!(list = %list.address, %domain, policy = found.map_or("unknown", Policy::as_str), treatment = ?t, "DMARC");
    match t {
        Treatment::Leave => (headers.to_vec(), body.to_vec(), t),
        Treatment::MungeFrom => (munge(headers, list), body.to_vec(), t),
        Treatment::Wrap => {
            let (h, b) = wrap(headers, body, list);
            (h, b, t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Policy as P;

    fn team(reply: &'static str) -> ListFacts<'static> {
        ListFacts {
            address: "team@example.org",
            display_name: "The Team",
            subject_prefix: "[team]",
            reply_goes_to: reply,
            reply_to_address: None,
        }
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn records_table() {
        let r = |p, sp| Some(Record { p, sp });
        let cases: &[(&str, Option<Record>)] = &[
            ("v=DMARC1; p=reject", r(Some(P::Reject), None)),
            (
                "v=DMARC1;p=quarantine;sp=none;rua=mailto:d@x",
                r(Some(P::Quarantine), Some(P::None)),
            ),
            ("v=DMARC1; p=REJECT; pct=10", r(Some(P::Reject), None)),
            ("  v = DMARC1 ; p = none ", r(Some(P::None), None)),
            ("v=DMARC1; p=bogus", r(None, None)),
            ("v=DMARC1", r(None, None)),
            ("v=DMARC1; p=absent", r(None, None)),
            ("v=spf1 -all", None),
            ("p=reject; v=DMARC1", None),
            ("v=DMARC2; p=reject", None),
            ("", None),
        ];
        for (txt, want) in cases {
            assert_eq!(parse_record(txt), *want, "{txt:?}");
        }
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(
            record_among(&s(&["v=spf1 -all", "v=DMARC1; p=reject"])),
            r(Some(P::Reject), None)
        );
        assert_eq!(
            record_among(&s(&["v=DMARC1; p=reject", "v=DMARC1; p=none"])),
            None,
            "two records are none"
        );
        assert_eq!(record_among(&[]), None);
    }

    #[test]
    fn policies_and_treatments_table() {
        let rec = |p, sp| Record { p, sp };
        let cases: &[(Record, bool, Policy)] = &[
            (rec(Some(P::Reject), Some(P::None)), true, P::Reject),
            (rec(Some(P::Reject), Some(P::None)), false, P::None),
            (rec(Some(P::Quarantine), None), false, P::Quarantine),
            (rec(None, Some(P::Reject)), true, P::None),
            (rec(None, None), false, P::None),
        ];
        for (record, own, want) in cases {
            assert_eq!(applies(*record, *own), *want, "{record:?} own={own}");
        }
        let t: &[(&str, Option<Policy>, Treatment)] = &[
            ("munge_from", Some(P::Reject), Treatment::MungeFrom),
            ("munge_from", Some(P::Quarantine), Treatment::MungeFrom),
            ("munge_from", Some(P::None), Treatment::Leave),
            ("munge_from", Some(P::Absent), Treatment::Leave),
            ("munge_from", None, Treatment::MungeFrom),
            ("wrap", Some(P::Reject), Treatment::Wrap),
            ("wrap", Some(P::None), Treatment::Leave),
            ("wrap", None, Treatment::Wrap),
            ("none", Some(P::Reject), Treatment::Leave),
            ("none", None, Treatment::Leave),
        ];
        for (mitigation, policy, want) in t {
            assert_eq!(
                treatment(mitigation, *policy),
                *want,
                "{mitigation} {policy:?}"
            );
        }
        for p in [P::None, P::Quarantine, P::Reject, P::Absent] {
            assert_eq!(Policy::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn names_to_ask_table() {
        let cases: &[(&str, &[&str])] = &[
            ("example.com", &["_dmarc.example.com"]),
            (
                "Mail.Example.COM.",
                &["_dmarc.mail.example.com", "_dmarc.example.com"],
            ),
            (
                "a.b.example.co.uk",
                &[
                    "_dmarc.a.b.example.co.uk",
                    "_dmarc.b.example.co.uk",
                    "_dmarc.example.co.uk",
                    "_dmarc.co.uk",
                ],
            ),
            (
                "a.b.c.d.e.f.example.org",
                &[
                    "_dmarc.a.b.c.d.e.f.example.org",
                    "_dmarc.d.e.f.example.org",
                    "_dmarc.e.f.example.org",
                    "_dmarc.f.example.org",
                    "_dmarc.example.org",
                ],
            ),
            ("localhost", &["_dmarc.localhost"]),
        ];
        for (domain, want) in cases {
            assert_eq!(names_to_ask(domain), *want, "{domain}");
        }
    }

    #[test]
    fn munged_headers_table() {
        let post = "From: Bob Smith <bob@reject.test>\r\nTo: team@example.org\r\n\
                    Subject: hi\r\nDKIM-Signature: v=1; d=reject.test;\r\n b=abc\r\n";
        // (reply_goes_to, extra fields of the post, fields wanted, fields not wanted)
        let cases: &[(&str, &str, &[&str], &[&str])] = &[
            (
                "sender",
                "",
                &[
                    "From: \"Bob Smith via The Team\" <team@example.org>\r\n",
                    "Reply-To: Bob Smith <bob@reject.test>\r\n",
                ],
                &["DKIM-Signature", "Cc:", "From: Bob"],
            ),
            (
                "sender",
                "Reply-To: bob-home@reject.test\r\n",
                &["Reply-To: bob-home@reject.test\r\n"],
                &["Reply-To: Bob Smith", "Cc:"],
            ),
            (
                "list",
                "Cc: carol@example.net\r\n",
                &["Cc: carol@example.net, Bob Smith <bob@reject.test>\r\n"],
                &["Reply-To: Bob"],
            ),
            (
                "explicit",
                "",
                &["Cc: Bob Smith <bob@reject.test>\r\n"],
                &["Reply-To: Bob"],
            ),
        ];
        for (reply, extra, want, not) in cases {
            let h = text(&munge(format!("{post}{extra}").as_bytes(), &team(reply)));
            for w in *want {
                assert!(h.contains(w), "{reply}: {w:?} in {h}");
            }
            for n in *not {
                assert!(!h.contains(n), "{reply}: no {n:?} in {h}");
            }
            assert_eq!(
                h.matches("\r\nFrom:").count() + h.starts_with("From:") as usize,
                1
            );
        }
        // A name that is no address of its own, one that is not ASCII, none at all.
        let cases: &[(&str, &str)] = &[
            (
                "From: bob@reject.test\r\n",
                "\"bob@reject.test via The Team\"",
            ),
            (
                "From: <bob@reject.test>\r\n",
                "\"bob@reject.test via The Team\"",
            ),
            (
                "From: =?utf-8?q?J=C3=B6rg?= <j@reject.test>\r\n",
                "=?utf-8?",
            ),
        ];
        for (post, want) in cases {
            let h = munge(post.as_bytes(), &team("sender"));
            let h = text(&h);
            assert!(h.contains(want), "{want:?} in {h}");
            let mut raw = h.into_bytes();
            raw.extend_from_slice(b"\r\nx\r\n");
            let parsed = mail_parser::MessageParser::default().parse(&raw).unwrap();
            let from = parsed.from().unwrap().first().unwrap();
            assert_eq!(from.address(), Some("team@example.org"));
            assert!(from.name().unwrap().ends_with(" via The Team"), "{from:?}");
        }
        assert_eq!(
            author(b"From: =?utf-8?q?J=C3=B6rg?= <j@reject.test>\r\n"),
            Some(("Jörg".to_owned(), "j@reject.test".to_owned()))
        );
        // No From: nothing to take.
        assert_eq!(munge(b"Subject: x\r\n", &team("sender")), b"Subject: x\r\n");
    }

    #[test]
    fn a_wrapped_post_is_attached_whole() {
        let post = b"From: Bob <bob@reject.test>\r\nTo: team@example.org\r\nSubject: hi\r\n\
            Message-ID: <1@reject.test>\r\nDKIM-Signature: v=1; d=reject.test; b=abc\r\n\
            X-Other: dropped outside\r\nX-Loop: other@example.net\r\n";
        let (h, b) = wrap(post, b"hello\r\n", &team("sender"));
        let (h, b) = (text(&h), text(&b));
        for w in [
            "From: \"Bob via The Team\" <team@example.org>\r\n",
            "Reply-To: Bob <bob@reject.test>\r\n",
            "Subject: hi\r\n",
            "Message-ID: <1@reject.test>\r\n",
            "MIME-Version: 1.0\r\n",
            "X-Loop: other@example.net\r\n",
        ] {
            assert!(h.contains(w), "{w:?} in {h}");
        }
        assert!(!h.contains("DKIM") && !h.contains("X-Other"), "{h}");
        let mut raw = h.into_bytes();
        raw.extend_from_slice(b"\r\n");
        raw.extend_from_slice(b.as_bytes());
        let parsed = mail_parser::MessageParser::default().parse(&raw).unwrap();
        let inner = parsed
            .attachments()
            .find_map(|a| a.message())
            .expect("a message/rfc822 part");
        assert_eq!(inner.subject(), Some("hi"));
        assert_eq!(
            inner.from().unwrap().first().unwrap().address(),
            Some("bob@reject.test")
        );
        assert!(
            inner
                .header_raw("DKIM-Signature")
                .is_some_and(|v| v.contains("d=reject.test")),
            "the post keeps its signature inside"
        );
        assert_eq!(inner.body_text(0).as_deref(), Some("hello\r\n"));
    }
}
