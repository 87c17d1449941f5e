//! `pepsi-setup check-dns`: what a mail domain publishes in the DNS, checked against what it
//! should publish — the records of [`crate::dns::records`], the DKIM key of
//! `pepsi.signing_key`, and the MX host's address and reverse DNS. Each record comes out
//! `ok`, `missing`, `wrong` (with what was found and the exact zone-file line to publish
//! instead), `failed` (the lookup did not answer) or `unchecked` (no DKIM key to compare
//! with), as a [`Report`] a person reads as a table and a page or script reads as JSON.
//!
//! [`check`] is the pure decision over an [`Expected`] and what was [`Found`]; [`lookup`] is
//! the I/O, through `pepsi_outbound::dns` (the resolver every Pepsi program uses), and
//! [`stored_key`] reads the key. A lookup that failed (SERVFAIL, a refusal, no answer in
//! time) is reported as failed and never as missing: this module must never tell an operator
//! to publish a record the DNS could not be asked about.
//!
//! Where exact text is too strict the comparison is semantic (see [`check`]): an SPF record
//! that lets the MX send is right whatever else it says, a DMARC record needs a policy, an
//! MTA-STS record an id, a TLS-RPT record a report address, and a DKIM record the very key
//! the signing stage signs with.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use pepsi_outbound::dns::{Dns, Lookup, MxAnswer};
use pepsi_smtp::encoding::{base64_decode, base64_encode};
use serde::Serialize;

use crate::dns;

/// What a checked record is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Mx,
    Spf,
    Dkim,
    Dmarc,
    MtaSts,
    TlsRpt,
    /// The MX host's A/AAAA records.
    Address,
    /// The reverse DNS of one of the MX host's addresses.
    Ptr,
}

impl Kind {
    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Mx => "MX",
            Kind::Spf => "SPF",
            Kind::Dkim => "DKIM",
            Kind::Dmarc => "DMARC",
            Kind::MtaSts => "MTA-STS",
            Kind::TlsRpt => "TLS-RPT",
            Kind::Address => "address",
            Kind::Ptr => "PTR",
        }
    }
}

/// The verdict on one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Published, and it says what it should.
    Ok,
    /// Not published.
    Missing,
    /// Published, and it does not say what it should.
    Wrong,
    /// The lookup failed: nothing is known about the record.
    Failed,
    /// There is nothing to compare it with (no DKIM key).
    Unchecked,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Missing => "missing",
            Status::Wrong => "wrong",
            Status::Failed => "failed",
            Status::Unchecked => "unchecked",
        }
    }
}

/// One record checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordCheck {
    pub kind: Kind,
    /// The name looked up, without the trailing dot.
    pub name: String,
    /// The record type looked up: `MX`, `TXT`, `A/AAAA` or `PTR`.
    #[serde(rename = "type")]
    pub rtype: &'static str,
    pub status: Status,
    /// What was found that claims to be this record, as text: for TXT only the records
    /// with its version tag (an SPF check ignores the domain's other TXT records).
    pub found: Vec<String>,
    /// For `missing` and `wrong`: the zone-file line to publish (in place of what was
    /// found); None otherwise.
    pub publish: Option<String>,
    /// Why, in words.
    pub reason: String,
}

/// Every record of a domain, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub domain: String,
    pub mx: String,
    pub checks: Vec<RecordCheck>,
}

impl Report {
    /// Whether every record is ok.
    pub fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.status == Status::Ok)
    }
}

/// What the domain should publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The mail domain, lower case.
    pub domain: String,
    /// The host that receives its mail, lower case.
    pub mx: String,
    /// Where DMARC and TLS reports go, in a DMARC or TLS-RPT record to publish.
    pub reports: String,
    /// The id of an MTA-STS record to publish.
    pub policy_id: String,
    pub dkim: Dkim,
}

/// The DKIM key the domain signs with, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dkim {
    Key {
        selector: String,
        key: PublicKey,
    },
    /// No key to compare with: the record is looked up under `selector` when one is known,
    /// and reported unchecked for `why`.
    NoKey {
        selector: Option<String>,
        why: String,
    },
}

/// The public half of a DKIM key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub algorithm: dns::Algorithm,
    /// The `p=` value to publish, base64, as `pepsi-setup dns` prints it (an RSA key's
    /// SubjectPublicKeyInfo, an Ed25519 key's 32 octets).
    pub p: String,
    /// The same RSA key as a PKCS#1 RSAPublicKey, which verifiers accept in `p=` too.
    pub pkcs1: Option<Vec<u8>>,
}

/// The public key of a PEM private key (`pepsi.signing_key`'s `private_key`): the key the
/// signing stages load (`pepsi_outbound::keys::parse_private_key`), RSA or Ed25519,
/// PKCS#8 or PKCS#1.
pub fn public_key(pem: &str) -> Result<PublicKey, String> {
    use aws_lc_rs::encoding::{AsDer, PublicKeyX509Der};
    use aws_lc_rs::signature::KeyPair as _;
    use rustls_pemfile::Item;
    pepsi_outbound::keys::parse_private_key(pem.as_bytes())?;
    let item = rustls_pemfile::read_all(&mut pem.as_bytes())
        .filter_map(Result::ok)
        .find(|i| matches!(i, Item::Pkcs8Key(_) | Item::Pkcs1Key(_)));
    let rsa = |key: aws_lc_rs::rsa::KeyPair| -> Result<PublicKey, String> {
        let spki: PublicKeyX509Der = key
            .public_key()
            .as_der()
            .map_err(|_| "cannot encode the RSA public key")?;
        Ok(PublicKey {
            algorithm: dns::Algorithm::Rsa,
            p: base64_encode(spki.as_ref()),
            pkcs1: Some(key.public_key().as_ref().to_vec()),
        })
    };
    match item {
        Some(Item::Pkcs8Key(p8)) => {
            let bytes = p8.secret_pkcs8_der();
            if let Ok(key) = aws_lc_rs::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(bytes)
            {
                return Ok(PublicKey {
                    algorithm: dns::Algorithm::Ed25519,
                    p: base64_encode(key.public_key().as_ref()),
                    pkcs1: None,
                });
            }
            rsa(aws_lc_rs::rsa::KeyPair::from_pkcs8(bytes).map_err(|e| e.to_string())?)
        }
        Some(Item::Pkcs1Key(p1)) => {
            rsa(aws_lc_rs::rsa::KeyPair::from_der(p1.secret_pkcs1_der())
                .map_err(|e| e.to_string())?)
        }
        _ => Err("neither an RSA nor an Ed25519 key".into()),
    }
}

/// What the DNS answered for one name and type: `Err` is a lookup that failed, and why.
pub type Answer<T> = Result<T, String>;

/// Everything looked up for a domain. A name without records of the type, or that does
/// not exist, is an empty list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The domain's MX records, `(preference, host)`, hosts lower case without the dot.
    pub mx: Answer<Vec<(u16, String)>>,
    /// The TXT records at the domain itself (SPF among them), each record's strings joined.
    pub txt: Answer<Vec<String>>,
    /// At `<selector>._domainkey.<domain>`; empty when no selector is known.
    pub dkim: Answer<Vec<String>>,
    /// At `_dmarc.<domain>`.
    pub dmarc: Answer<Vec<String>>,
    /// At `_mta-sts.<domain>`.
    pub mta_sts: Answer<Vec<String>>,
    /// At `_smtp._tls.<domain>`.
    pub tls_rpt: Answer<Vec<String>>,
    /// The MX host's A and AAAA records.
    pub addresses: Answer<Vec<IpAddr>>,
    /// Each address's PTR names, lower case without the dot.
    pub ptr: Vec<(IpAddr, Answer<Vec<String>>)>,
}

/// The records `pepsi-setup dns` would print for what is expected: the ones to publish.
fn plan(e: &Expected) -> dns::Plan {
    let (selector, algorithm, public_key) = match &e.dkim {
        Dkim::Key { selector, key } => (selector.clone(), key.algorithm, key.p.clone()),
        Dkim::NoKey { selector, .. } => (
            selector.clone().unwrap_or_default(),
            dns::Algorithm::Rsa,
            String::new(),
        ),
    };
    dns::Plan {
        domain: e.domain.clone(),
        mx: e.mx.clone(),
        selector,
        algorithm,
        public_key,
        reports: e.reports.clone(),
        // What `pepsi-setup dns` starts a domain with.
        dmarc: dns::DmarcPolicy::None,
        mta_sts: dns::MtaSts::Testing,
        policy_id: e.policy_id.clone(),
        tlsa: None,
    }
}

/// The name the DKIM record is looked up at; None when no selector is known.
pub fn dkim_name(e: &Expected) -> Option<String> {
    match &e.dkim {
        Dkim::Key { selector, .. } => Some(selector.clone()),
        Dkim::NoKey { selector, .. } => selector.clone(),
    }
    .map(|s| format!("{s}._domainkey.{}", e.domain))
}

/// The PTR name of `ip`: `d.c.b.a.in-addr.arpa`, or the nibbles under `ip6.arpa`.
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => {
            let [a, b, c, d] = a.octets();
            format!("{d}.{c}.{b}.{a}.in-addr.arpa")
        }
        IpAddr::V6(a) => {
            let mut out = String::new();
            for byte in a.octets().iter().rev() {
                out.push_str(&format!("{:x}.{:x}.", byte & 0xf, byte >> 4));
            }
            out + "ip6.arpa"
        }
    }
}

/// One zone-file line, as `pepsi-setup dns` prints it: TXT values quoted, in strings of at
/// most 255 octets; host names with their trailing dot.
pub fn zone_line(name: &str, rtype: &str, value: &str) -> String {
    let value = match rtype {
        "MX" => match value.split_once(' ') {
            Some((pref, host)) => format!("{pref} {host}."),
            None => format!("10 {value}."),
        },
        "PTR" => format!("{value}."),
        "TXT" => value
            .as_bytes()
            .chunks(255)
            .map(|c| format!("\"{}\"", String::from_utf8_lossy(c)))
            .collect::<Vec<_>>()
            .join(" "),
        _ => value.to_owned(),
    };
    format!("{name}. 3600 IN {rtype} {value}")
}

/// A TXT record's `tag=value` fields (RFC 6376 §3.2, RFC 7489 §6.4), tags lower case; Err
/// names a field without `=`.
fn tags(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            f.split_once('=')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .ok_or_else(|| format!("the field {f:?} has no '='"))
        })
        .collect()
}

/// The TXT records whose first field is `v=<version>` (case aside): the ones that claim to
/// be the record checked; the others at the name are not its business.
fn claims<'a>(answers: &'a [String], version: &str) -> Vec<&'a String> {
    answers
        .iter()
        .filter(|t| {
            let first = t
                .trim_start()
                .split(|c: char| c == ';' || c.is_whitespace())
                .next()
                .unwrap_or("");
            first.eq_ignore_ascii_case(&format!("v={version}"))
        })
        .collect()
}

/// Whether `net` (`addr` or `addr/len` of an SPF `ip4:`/`ip6:` term) holds `ip`.
fn covers(net: &str, ip: IpAddr) -> bool {
    let (addr, len) = match net.split_once('/') {
        Some((a, l)) => match l.parse::<u32>() {
            Ok(l) => (a, Some(l)),
            Err(_) => return false,
        },
        None => (net, None),
    };
    match (addr.parse::<IpAddr>(), ip) {
        (Ok(IpAddr::V4(n)), IpAddr::V4(a)) => {
            let len = len.unwrap_or(32).min(32);
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (Ok(IpAddr::V6(n)), IpAddr::V6(a)) => {
            let len = len.unwrap_or(128).min(128);
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Judges one SPF record: Ok(how it lets the MX send), or Err((why not, the record with
/// that mended)). The record is right when it lets the MX send for the domain — an `mx`
/// term for the domain itself, an `a` term naming the MX host, or `ip4:`/`ip6:` terms
/// holding each of its addresses, each with the pass qualifier — and does not end in
/// `+all` (every host on the internet allowed). `include:`, `redirect=` and `exists:` are
/// not followed: the MX named only through one of those counts as not allowed. The mended
/// record keeps every other term: `mx` is put first, `+all` becomes `-all`.
fn judge_spf(
    text: &str,
    domain: &str,
    mx: &str,
    addresses: &[IpAddr],
) -> Result<String, (String, String)> {
    let mut terms: Vec<String> = text
        .split_ascii_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect();
    let mut how = None;
    let mut nets = Vec::new();
    let mut plus_all = None;
    for (i, term) in terms.iter().enumerate() {
        let (pass, rest) = match term.as_bytes().first() {
            Some(b'+') => (true, &term[1..]),
            Some(b'-' | b'~' | b'?') => (false, &term[1..]),
            _ => (true, term.as_str()),
        };
        let lower = rest.to_ascii_lowercase();
        let (name, arg) = match lower.find([':', '/', '=']) {
            Some(at) => lower.split_at(at),
            None => (lower.as_str(), ""),
        };
        // The domain an `a` or `mx` term names: its own, or the current domain.
        let target = || match arg.strip_prefix(':') {
            Some(spec) => spec.split('/').next().unwrap_or("").trim_end_matches('.'),
            None => domain,
        };
        match name {
            "all" if pass => plus_all = Some(i),
            "mx" if pass && target() == domain => how = how.or(Some("mx".to_owned())),
            "a" if pass && target() == mx => how = how.or(Some(format!("a:{mx}"))),
            "ip4" | "ip6" if pass => {
                if let Some(net) = arg.strip_prefix(':') {
                    nets.push(net.to_owned());
                }
            }
            _ => {}
        }
    }
    if how.is_none()
        && !addresses.is_empty()
        && addresses
            .iter()
            .all(|ip| nets.iter().any(|net| covers(net, *ip)))
    {
        how = Some("ip4/ip6 terms holding its addresses".to_owned());
    }
    let mut why = Vec::new();
    if how.is_none() {
        why.push(format!(
            "does not let {mx} send (no mx term for {domain}; include:, redirect= and \
             exists: are not followed)"
        ));
    }
    if let Some(i) = plus_all {
        why.push(format!(
            "ends in {}, which lets every host on the internet send as {domain}",
            terms[i]
        ));
        terms[i] = "-all".into();
    }
    match how {
        Some(how) if why.is_empty() => Ok(format!("lets {mx} send ({how})")),
        how => {
            if how.is_none() {
                terms.insert(0, "mx".into());
            }
            let mended = std::iter::once("v=spf1".to_owned())
                .chain(terms)
                .collect::<Vec<_>>()
                .join(" ");
            Err((why.join("; "), mended))
        }
    }
}

/// Judges one DKIM record against `key`: `v=DKIM1` if a version is given (first), the key
/// type of `k=` (default rsa), and `p=` decoding to our key (the RSA key as
/// SubjectPublicKeyInfo or as PKCS#1).
fn judge_dkim(text: &str, key: &PublicKey) -> Result<(), String> {
    let tags = tags(text)?;
    let tag = |name: &str| {
        tags.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if let Some(pos) = tags.iter().position(|(k, _)| k == "v")
        && (pos != 0 || tags[0].1 != "DKIM1")
    {
        return Err(format!(
            "v={} must come first and be DKIM1 (RFC 6376 §3.6.1)",
            tags[pos].1
        ));
    }
    let want = match key.algorithm {
        dns::Algorithm::Rsa => "rsa",
        dns::Algorithm::Ed25519 => "ed25519",
    };
    let k = tag("k").unwrap_or("rsa");
    if !k.eq_ignore_ascii_case(want) {
        return Err(format!("k={k}, where the key is {want}"));
    }
    let p = match tag("p") {
        None => return Err("the record has no p= (the public key)".into()),
        Some("") => return Err("p= is empty: the key is revoked".into()),
        Some(p) => p,
    };
    let p: String = p.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(bytes) = base64_decode(&p) else {
        return Err("p= is not base64".into());
    };
    if base64_decode(&key.p).as_deref() == Some(&bytes[..])
        || key.pkcs1.as_deref() == Some(&bytes[..])
    {
        Ok(())
    } else {
        Err("p= is another public key than the one the domain signs with".into())
    }
}

/// Judges one DMARC record: a `p=` of none, quarantine or reject (RFC 7489 §6.3).
fn judge_dmarc(text: &str) -> Result<String, String> {
    let tags = tags(text)?;
    match tags.iter().find(|(k, _)| k == "p").map(|(_, v)| v.as_str()) {
        Some(p @ ("none" | "quarantine" | "reject")) => Ok(format!("policy p={p}")),
        Some(p) => Err(format!("p={p} is not none, quarantine or reject")),
        None => Err("the record has no p= (the policy)".into()),
    }
}

/// Judges one TLS-RPT record: `v=TLSRPTv1` first and a `rua=` naming at least one
/// `mailto:` or `https:` URI (RFC 8460 §3).
fn judge_tls_rpt(text: &str) -> Result<String, String> {
    let tags = tags(text)?;
    if tags.first().map(|(k, v)| (k.as_str(), v.as_str())) != Some(("v", "TLSRPTv1")) {
        return Err("the record does not begin with v=TLSRPTv1".into());
    }
    let uris: Vec<&str> = tags
        .iter()
        .filter(|(k, _)| k == "rua")
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|u| {
            let u = u.to_ascii_lowercase();
            (u.starts_with("mailto:") && u.len() > 7) || u.starts_with("https://")
        })
        .collect();
    if uris.is_empty() {
        return Err("the record names no mailto: or https: report address in rua=".into());
    }
    Ok(format!("reports go to {}", uris.join(", ")))
}

/// A row of the report for one TXT record at `name`: missing when nothing claims to be it,
/// wrong when more than one does, else as `judge` says (`Ok(reason)`, or `Err((reason,
/// record to publish instead))`). With a `version`, the records claiming to be it are those
/// that begin with `v=<version>`; without, every record at the name (a DKIM key's name is
/// its alone, and `v=` is optional there).
fn txt_check(
    kind: Kind,
    name: &str,
    version: Option<&str>,
    answer: &Answer<Vec<String>>,
    publish: &str,
    judge: impl Fn(&str) -> Result<String, (String, String)>,
) -> RecordCheck {
    let row = |status, found: Vec<String>, publish: Option<String>, reason: String| RecordCheck {
        kind,
        name: name.to_owned(),
        rtype: "TXT",
        status,
        found,
        publish: publish.map(|v| zone_line(name, "TXT", &v)),
        reason,
    };
    let answers = match answer {
        Ok(answers) => answers,
        Err(why) => return row(Status::Failed, vec![], None, why.clone()),
    };
    let found: Vec<String> = match version {
        Some(v) => claims(answers, v).into_iter().cloned().collect(),
        None => answers.clone(),
    };
    match found.as_slice() {
        [] => {
            let reason = match (answers.len(), version) {
                (n, Some(v)) if n > 0 => {
                    format!("none of the {n} TXT record(s) at {name} begins with v={v}")
                }
                _ => format!("no TXT record at {name}"),
            };
            row(Status::Missing, found, Some(publish.to_owned()), reason)
        }
        [one] => match judge(one) {
            Ok(reason) => row(Status::Ok, found, None, reason),
            Err((reason, mended)) => row(Status::Wrong, found, Some(mended), reason),
        },
        many => {
            let what = match version {
                Some(v) => format!("{} TXT records begin with v={v}", many.len()),
                None => format!("{} TXT records at {name}", many.len()),
            };
            let reason =
                format!("{what} where one is allowed: receivers may take any, or none; keep one");
            row(Status::Wrong, found, Some(publish.to_owned()), reason)
        }
    }
}

/// Decides every record. The rules, record by record:
///
/// - MX: ok when the domain's MX records name the MX host (at any preference).
/// - SPF: exactly one `v=spf1` TXT record at the domain, which lets the MX send and does not
///   end in `+all` ([`judge_spf`]); the record to publish is that one mended, or `v=spf1 mx
///   -all` when there is none.
/// - DKIM: exactly one TXT record at `<selector>._domainkey`, whose `p=` is the domain's key
///   and `k=` its type; unchecked without a key.
/// - DMARC: exactly one `v=DMARC1` record with a valid `p=` (any policy).
/// - MTA-STS: exactly one `v=STSv1` record with a valid id (`pepsi_smtp::sts`, as the relay
///   reads it).
/// - TLS-RPT: exactly one `v=TLSRPTv1` record with a mailto: or https: `rua=`.
/// - address: the MX host has an A or AAAA record.
/// - PTR: each of those addresses' PTR names the MX host (published by whoever holds the
///   address).
///
/// A record that is missing or wrong carries the line to publish: what `pepsi-setup dns`
/// prints for the domain (the DMARC policy p=none it starts with, the reports to
/// `reports`).
pub fn check(e: &Expected, f: &Found) -> Report {
    let records = dns::records(&plan(e));
    let value = |name: &str, kind: &str| {
        records
            .iter()
            .find(|r| r.name == name && r.kind == kind)
            .map(|r| r.value.clone())
            .unwrap_or_default()
    };
    let d = &e.domain;
    let mut checks = Vec::new();

    // MX.
    let mx_value = value(d, "MX");
    let row = |status, found, publish: bool, reason| RecordCheck {
        kind: Kind::Mx,
        name: d.clone(),
        rtype: "MX",
        status,
        found,
        publish: publish.then(|| zone_line(d, "MX", &mx_value)),
        reason,
    };
    checks.push(match &f.mx {
        Err(why) => row(Status::Failed, vec![], false, why.clone()),
        Ok(mx) => {
            let found = mx.iter().map(|(p, h)| format!("{p} {h}")).collect();
            if mx.is_empty() {
                row(
                    Status::Missing,
                    found,
                    true,
                    format!("{d} has no MX record"),
                )
            } else if let Some((p, _)) = mx.iter().find(|(_, h)| *h == e.mx) {
                row(Status::Ok, found, false, format!("names {} at {p}", e.mx))
            } else {
                row(
                    Status::Wrong,
                    found,
                    true,
                    format!("no MX record names {}", e.mx),
                )
            }
        }
    });

    // SPF.
    let addresses = f.addresses.as_deref().unwrap_or_default();
    checks.push(txt_check(
        Kind::Spf,
        d,
        Some("spf1"),
        &f.txt,
        &value(d, "TXT"),
        |text| judge_spf(text, d, &e.mx, addresses),
    ));

    // DKIM.
    checks.push(match &e.dkim {
        Dkim::Key { selector, key } => {
            let name = format!("{selector}._domainkey.{d}");
            let publish = value(&name, "TXT");
            txt_check(Kind::Dkim, &name, None, &f.dkim, &publish, |text| {
                judge_dkim(text, key)
                    .map(|()| "the key the domain signs with".to_owned())
                    .map_err(|why| (why, publish.clone()))
            })
        }
        Dkim::NoKey { selector, why } => RecordCheck {
            kind: Kind::Dkim,
            found: match (&f.dkim, selector) {
                (Ok(found), Some(_)) => found.clone(),
                _ => vec![],
            },
            name: dkim_name(e).unwrap_or_else(|| format!("_domainkey.{d}")),
            rtype: "TXT",
            status: Status::Unchecked,
            publish: None,
            reason: why.clone(),
        },
    });

    // DMARC.
    let name = format!("_dmarc.{d}");
    let publish = value(&name, "TXT");
    checks.push(txt_check(
        Kind::Dmarc,
        &name,
        Some("DMARC1"),
        &f.dmarc,
        &publish,
        |text| judge_dmarc(text).map_err(|why| (why, publish.clone())),
    ));

    // MTA-STS.
    let name = format!("_mta-sts.{d}");
    let publish = value(&name, "TXT");
    checks.push(txt_check(
        Kind::MtaSts,
        &name,
        Some("STSv1"),
        &f.mta_sts,
        &publish,
        |text| match pepsi_smtp::sts::Record::parse(text) {
            Ok(r) => Ok(format!("policy id {}", r.id)),
            Err(why) => Err((why, publish.clone())),
        },
    ));

    // TLS-RPT.
    let name = format!("_smtp._tls.{d}");
    let publish = value(&name, "TXT");
    checks.push(txt_check(
        Kind::TlsRpt,
        &name,
        Some("TLSRPTv1"),
        &f.tls_rpt,
        &publish,
        |text| judge_tls_rpt(text).map_err(|why| (why, publish.clone())),
    ));

    // The MX host's addresses, and their reverse DNS.
    let row = |status, found, publish: bool, reason| RecordCheck {
        kind: Kind::Address,
        name: e.mx.clone(),
        rtype: "A/AAAA",
        status,
        found,
        publish: publish.then(|| zone_line(&e.mx, "A", "<the public IPv4 address of the MX>")),
        reason,
    };
    checks.push(match &f.addresses {
        Err(why) => row(Status::Failed, vec![], false, why.clone()),
        Ok(a) if a.is_empty() => row(
            Status::Missing,
            vec![],
            true,
            format!("{} has no A or AAAA record: mail cannot reach it", e.mx),
        ),
        Ok(a) => row(
            Status::Ok,
            a.iter().map(IpAddr::to_string).collect(),
            false,
            format!("{} address(es)", a.len()),
        ),
    });
    for (ip, answer) in &f.ptr {
        let name = reverse_name(*ip);
        let publish = zone_line(&name, "PTR", &e.mx);
        let owner = "published by whoever holds the address (the hosting provider)";
        let row = |status, found, publish: Option<String>, reason| RecordCheck {
            kind: Kind::Ptr,
            name: name.clone(),
            rtype: "PTR",
            status,
            found,
            publish,
            reason,
        };
        checks.push(match answer {
            Err(why) => row(Status::Failed, vec![], None, why.clone()),
            Ok(names) if names.is_empty() => row(
                Status::Missing,
                vec![],
                Some(publish),
                format!("{ip} has no reverse DNS; {owner}"),
            ),
            Ok(names) if names.contains(&e.mx) => row(
                Status::Ok,
                names.clone(),
                None,
                format!("{ip} names {}", e.mx),
            ),
            Ok(names) => row(
                Status::Wrong,
                names.clone(),
                Some(publish),
                format!("{ip} names {} and not {}; {owner}", names.join(", "), e.mx),
            ),
        });
    }
    Report {
        domain: e.domain.clone(),
        mx: e.mx.clone(),
        checks,
    }
}

impl fmt::Display for Report {
    /// A table (record, name, status), then for each record that is not ok why, what was
    /// found, and the line to publish.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0)
            .max(4);
        writeln!(f, "{:<8} {:<width$} STATUS", "RECORD", "NAME")?;
        for c in &self.checks {
            writeln!(
                f,
                "{:<8} {:<width$} {}",
                c.kind.label(),
                c.name,
                c.status.as_str()
            )?;
        }
        for c in self.checks.iter().filter(|c| c.status != Status::Ok) {
            writeln!(f)?;
            writeln!(
                f,
                "{} {}: {}: {}",
                c.kind.label(),
                c.name,
                c.status.as_str(),
                c.reason
            )?;
            for found in &c.found {
                writeln!(f, "  found:   {found}")?;
            }
            if let Some(line) = &c.publish {
                writeln!(f, "  publish: {line}")?;
            }
        }
        let ok = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Ok)
            .count();
        writeln!(f)?;
        writeln!(
            f,
            "{ok} of {} records of {} are as they should be",
            self.checks.len(),
            self.domain
        )
    }
}

/// `lookup`, or a failure when it has not answered within `limit`.
async fn within<T>(
    limit: Duration,
    what: &str,
    lookup: impl Future<Output = Result<T, Lookup>>,
) -> Result<T, Lookup> {
    tokio::time::timeout(limit, lookup)
        .await
        .unwrap_or_else(|_| {
            Err(Lookup::Failed(format!(
                "no answer for {what} within {limit:?}"
            )))
        })
}

/// Looks every record up through `dns`, each lookup given at most `limit`; the PTR records
/// of the MX host's addresses once those are known. Never fails: a failed lookup is the
/// answer's `Err`.
pub async fn lookup(dns: &Dns, e: &Expected, limit: Duration) -> Found {
    use hickory_resolver::proto::rr::{RData, RecordType};
    let txt = |name: String| async move {
        within(limit, &name, dns.txt(&name))
            .await
            .map_err(|l| l.to_string())
    };
    let d = &e.domain;
    let mx = async {
        match within(limit, d, dns.mx(d)).await {
            Ok(MxAnswer::Records(r)) => {
                Ok(r.into_iter().map(|r| (r.preference, r.exchange)).collect())
            }
            Ok(MxAnswer::NoRecords | MxAnswer::NoDomain) => Ok(vec![]),
            Err(l) => Err(l.to_string()),
        }
    };
    let dkim = async {
        match dkim_name(e) {
            Some(name) => txt(name).await,
            None => Ok(vec![]),
        }
    };
    let addresses = async {
        match within(limit, &e.mx, dns.addresses(&e.mx, true)).await {
            Ok(a) => Ok(a.addresses),
            Err(Lookup::NoDomain | Lookup::NoRecords) => Ok(vec![]),
            Err(l) => Err(l.to_string()),
        }
    };
    let (mx, txt_d, dkim, dmarc, mta_sts, tls_rpt, addresses) = tokio::join!(
        mx,
        txt(d.clone()),
        dkim,
        txt(format!("_dmarc.{d}")),
        txt(format!("_mta-sts.{d}")),
        txt(format!("_smtp._tls.{d}")),
        addresses,
    );
    // One after the other: a host has a handful of addresses at most.
    let mut ptr = Vec::new();
    for ip in addresses.as_deref().unwrap_or_default() {
        let name = reverse_name(*ip);
        let answer = match within(limit, &name, dns.records(&name, RecordType::PTR)).await {
            Ok(records) => Ok(records
                .iter()
                .filter_map(|r| match r {
                    RData::PTR(p) => {
                        Some(p.0.to_ascii().trim_end_matches('.').to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()),
            Err(Lookup::NoDomain | Lookup::NoRecords) => Ok(vec![]),
            Err(l) => Err(l.to_string()),
        };
        ptr.push((*ip, answer));
    }
    Found {
        mx,
        txt: txt_d,
        dkim,
        dmarc,
        mta_sts,
        tls_rpt,
        addresses,
        ptr,
    }
}

/// What `domain` should publish with `mx` as its MX: the DKIM key read through `conn`
/// (the one of `selector`, else the domain's newest enabled key; without a connection the
/// DKIM record is reported unchecked), reports to `reports`.
pub async fn expected(
    conn: Option<&mut sqlx::PgConnection>,
    domain: String,
    mx: String,
    selector: Option<&str>,
    reports: String,
) -> anyhow::Result<Expected> {
    let dkim = match conn {
        None => Dkim::NoKey {
            selector: selector.map(str::to_owned),
            why: "no database to read the DKIM key from: give --database-url URL or set \
                  [database] URL"
                .into(),
        },
        Some(conn) => match stored_key(conn, &domain, selector)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read pepsi.signing_key: {e}"))?
        {
            Some((selector, pem)) => {
                let key = public_key(&pem).map_err(|e| {
                    anyhow::anyhow!(
                        "the key of {domain}, selector {selector}, in pepsi.signing_key: {e}"
                    )
                })?;
                Dkim::Key { selector, key }
            }
            None => Dkim::NoKey {
                why: match selector {
                    Some(s) => format!(
                        "pepsi.signing_key has no key for {domain} under selector {s}: \
                         make one with pepsi-setup dns"
                    ),
                    None => format!(
                        "pepsi.signing_key has no enabled key for {domain}: make one with \
                         pepsi-setup dns, or name one with --selector"
                    ),
                },
                selector: selector.map(str::to_owned),
            },
        },
    };
    Ok(Expected {
        domain,
        mx,
        reports,
        policy_id: chrono::Utc::now().format("%Y%m%dT%H%M%S").to_string(),
        dkim,
    })
}

/// The resolver the configuration names: `[pepsi] DNS_SERVERS` (none: the system's) and
/// `[pepsi] DNS_TIMEOUT` per query (default 5 s).
pub fn resolver_options(
    cfg: &pepsi_conf::config::Config,
) -> Result<(Vec<std::net::SocketAddr>, Duration), pepsi_conf::config::ConfigError> {
    let pepsi = cfg.section("pepsi");
    let servers = pepsi_outbound::dns::servers_opt(&pepsi)?.unwrap_or_default();
    let timeout = pepsi
        .duration_opt("DNS_TIMEOUT")?
        .filter(|t| !t.is_zero())
        .unwrap_or(Duration::from_secs(5));
    Ok((servers, timeout))
}

/// Looks up what `expected` names through `servers` (none: the system's resolver), each
/// query within `timeout`, and checks it.
pub async fn run(
    servers: &[std::net::SocketAddr],
    timeout: Duration,
    expected: &Expected,
) -> anyhow::Result<Report> {
    let resolver = Dns::new(servers, timeout)?;
    // Two attempts per server, and a little more.
    let limit = timeout * 2 * (servers.len().max(1) as u32) + Duration::from_secs(1);
    let found = lookup(&resolver, expected, limit).await;
    Ok(check(expected, &found))
}

/// The PEM private key of `domain` in `pepsi.signing_key` under `selector`, or when none is
/// given its newest enabled key: `(selector, pem)`. Read-only.
pub async fn stored_key(
    conn: &mut sqlx::PgConnection,
    domain: &str,
    selector: Option<&str>,
) -> Result<Option<(String, String)>, sqlx::Error> {
    match selector {
        Some(s) => {
            sqlx::query_as(
                "SELECT selector, private_key FROM pepsi.signing_key \
                 WHERE domain = $1 AND selector = $2",
            )
            .bind(domain)
            .bind(s)
            .fetch_optional(conn)
            .await
        }
        None => {
            sqlx::query_as(
                "SELECT selector, private_key FROM pepsi.signing_key \
                 WHERE domain = $1 AND enabled ORDER BY created_at DESC, selector DESC LIMIT 1",
            )
            .bind(domain)
            .fetch_optional(conn)
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=";

    fn expected() -> Expected {
        Expected {
            domain: "example.org".into(),
            mx: "mx.example.org".into(),
            reports: "postmaster@example.org".into(),
            policy_id: "20261201T000000".into(),
            dkim: Dkim::Key {
                selector: "s1".into(),
                key: PublicKey {
                    algorithm: dns::Algorithm::Rsa,
                    p: KEY.into(),
                    pkcs1: Some(vec![1, 2, 3]),
                },
            },
        }
    }

    /// Everything published as it should be, the MX host at 192.0.2.25.
    fn good() -> Found {
        Found {
            mx: Ok(vec![(10, "mx.example.org".into())]),
            txt: Ok(vec!["v=spf1 mx -all".into()]),
            dkim: Ok(vec![format!("v=DKIM1; k=rsa; p={KEY}")]),
            dmarc: Ok(vec!["v=DMARC1; p=none".into()]),
            mta_sts: Ok(vec!["v=STSv1; id=1;".into()]),
            tls_rpt: Ok(vec!["v=TLSRPTv1; rua=mailto:tls@example.org".into()]),
            addresses: Ok(vec!["192.0.2.25".parse().unwrap()]),
            ptr: vec![(
                "192.0.2.25".parse().unwrap(),
                Ok(vec!["mx.example.org".into()]),
            )],
        }
    }

    /// The verdict wanted: the status, and the line to publish (or a piece of the reason).
    enum Want<'a> {
        Ok,
        Missing(&'a str),
        Wrong(&'a str),
        WrongBecause(&'a str),
        Failed,
    }

    /// Checks `found` (a change to the good answers) and compares the row of `kind`.
    fn check(kind: Kind, found: impl FnOnce(&mut Found), want: Want<'_>) {
        let mut f = good();
        found(&mut f);
        let report = super::check(&expected(), &f);
        let row = report
            .checks
            .iter()
            .find(|c| c.kind == kind)
            .unwrap_or_else(|| panic!("no {kind:?} row: {report:?}"));
        let (status, publish) = match want {
            Want::Ok => (Status::Ok, None),
            Want::Missing(p) => (Status::Missing, Some(p)),
            Want::Wrong(p) => (Status::Wrong, Some(p)),
            Want::WrongBecause(why) => {
                assert!(row.reason.contains(why), "{row:?}");
                (Status::Wrong, row.publish.as_deref())
            }
            Want::Failed => (Status::Failed, None),
        };
        assert_eq!(row.status, status, "{row:?}");
        assert_eq!(row.publish.as_deref(), publish, "{row:?}");
        // Every other row is as good as before.
        for other in report.checks.iter().filter(|c| c.kind != kind) {
            assert_eq!(other.status, Status::Ok, "{other:?}");
        }
    }

    fn txt(v: &[&str]) -> Answer<Vec<String>> {
        Ok(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn the_good_domain_is_all_ok() {
        let report = super::check(&expected(), &good());
        assert!(report.all_ok(), "{report:?}");
        let kinds: Vec<Kind> = report.checks.iter().map(|c| c.kind).collect();
        use Kind::*;
        assert_eq!(kinds, [Mx, Spf, Dkim, Dmarc, MtaSts, TlsRpt, Address, Ptr]);
    }

    #[test]
    fn mx_table() {
        let mx = "example.org. 3600 IN MX 10 mx.example.org.";
        check(Kind::Mx, |f| f.mx = Ok(vec![]), Want::Missing(mx));
        check(
            Kind::Mx,
            |f| f.mx = Ok(vec![(10, "mail.other.net".into())]),
            Want::Wrong(mx),
        );
        check(
            Kind::Mx,
            |f| {
                f.mx = Ok(vec![
                    (5, "a.other.net".into()),
                    (20, "mx.example.org".into()),
                ])
            },
            Want::Ok,
        );
        check(Kind::Mx, |f| f.mx = Err("SERVFAIL".into()), Want::Failed);
    }

    #[test]
    fn spf_table() {
        let line = |v: &str| format!("example.org. 3600 IN TXT \"{v}\"");
        let cases: &[(&[&str], Want<'_>)] = &[
            (&["v=spf1 mx -all"], Want::Ok),
            (&["v=spf1 mx ~all"], Want::Ok),
            (&["V=SPF1 +MX include:_spf.other.net ?all"], Want::Ok),
            (&["v=spf1 mx:example.org/24 -all"], Want::Ok),
            (&["v=spf1 a:mx.example.org -all"], Want::Ok),
            (&["v=spf1 ip4:192.0.2.0/24 -all"], Want::Ok),
            (&["v=spf1 ip4:192.0.2.25 -all"], Want::Ok),
            // Other TXT records at the domain are not the SPF check's business.
            (&["google-site-verification=x", "v=spf1 mx -all"], Want::Ok),
            (&[], Want::Missing(&line("v=spf1 mx -all"))),
            (&["hello"], Want::Missing(&line("v=spf1 mx -all"))),
            // v=spf10 is not v=spf1.
            (&["v=spf10 mx"], Want::Missing(&line("v=spf1 mx -all"))),
            (
                &["v=spf1 include:_spf.other.net -all"],
                Want::Wrong(&line("v=spf1 mx include:_spf.other.net -all")),
            ),
            (
                &["v=spf1 -mx ip4:198.51.100.0/24 -all"],
                Want::Wrong(&line("v=spf1 mx -mx ip4:198.51.100.0/24 -all")),
            ),
            (
                &["v=spf1 mx:other.net a -all"],
                Want::Wrong(&line("v=spf1 mx mx:other.net a -all")),
            ),
            (&["v=spf1 mx +all"], Want::Wrong(&line("v=spf1 mx -all"))),
            (&["v=spf1 all"], Want::Wrong(&line("v=spf1 mx -all"))),
            (
                &["v=spf1 mx -all", "v=spf1 a -all"],
                Want::Wrong(&line("v=spf1 mx -all")),
            ),
        ];
        for (found, want) in cases {
            let want = match want {
                Want::Ok => Want::Ok,
                Want::Missing(p) => Want::Missing(p),
                Want::Wrong(p) => Want::Wrong(p),
                _ => unreachable!(),
            };
            check(Kind::Spf, |f| f.txt = txt(found), want);
        }
        check(
            Kind::Spf,
            |f| f.txt = txt(&["v=spf1 +all"]),
            Want::WrongBecause("lets every host on the internet send"),
        );
        check(Kind::Spf, |f| f.txt = Err("timeout".into()), Want::Failed);
    }

    #[test]
    fn dkim_table() {
        let publish = format!("s1._domainkey.example.org. 3600 IN TXT \"v=DKIM1; k=rsa; p={KEY}\"");
        let other = "MCowBQYDK2VwAyEAq3FtgJ6T5NdKYjtkLy+jTWdbsl8HhBdx5hjZaiCHfwk=";
        let cases: &[(&[&str], Want<'_>)] = &[
            (&[&format!("v=DKIM1; k=rsa; p={KEY}")], Want::Ok),
            // No v=, no k= (rsa), the key split by spaces as some zone editors do.
            (&[&format!("p={} {}", &KEY[..10], &KEY[10..])], Want::Ok),
            // The same RSA key as PKCS#1.
            (&["v=DKIM1; p=AQID"], Want::Ok),
            (&[], Want::Missing(&publish)),
            (
                &[&format!("v=DKIM1; k=rsa; p={other}")],
                Want::Wrong(&publish),
            ),
            (
                &[&format!("v=DKIM1; k=ed25519; p={KEY}")],
                Want::Wrong(&publish),
            ),
            (&["v=DKIM1; k=rsa; p="], Want::Wrong(&publish)),
            (&["v=DKIM1; k=rsa"], Want::Wrong(&publish)),
            (&["v=DKIM1; p=***"], Want::Wrong(&publish)),
            (
                &[&format!("k=rsa; v=DKIM1; p={KEY}")],
                Want::Wrong(&publish),
            ),
            (&["hello"], Want::Wrong(&publish)),
            (
                &[&format!("v=DKIM1; p={KEY}"), &format!("v=DKIM1; p={KEY}")],
                Want::Wrong(&publish),
            ),
        ];
        for (found, want) in cases {
            let want = match want {
                Want::Ok => Want::Ok,
                Want::Missing(p) => Want::Missing(p),
                Want::Wrong(p) => Want::Wrong(p),
                _ => unreachable!(),
            };
            check(Kind::Dkim, |f| f.dkim = txt(found), want);
        }
        check(
            Kind::Dkim,
            |f| f.dkim = txt(&[&format!("v=DKIM1; p={other}")]),
            Want::WrongBecause("another public key"),
        );
        check(Kind::Dkim, |f| f.dkim = Err("REFUSED".into()), Want::Failed);
    }

    #[test]
    fn without_a_key_dkim_is_unchecked_and_says_why() {
        let e = Expected {
            dkim: Dkim::NoKey {
                selector: None,
                why: "no enabled key for example.org in pepsi.signing_key".into(),
            },
            ..expected()
        };
        let report = super::check(&e, &good());
        let dkim = &report.checks[2];
        assert_eq!(
            (dkim.status, dkim.name.as_str(), dkim.publish.as_deref()),
            (Status::Unchecked, "_domainkey.example.org", None)
        );
        assert!(dkim.reason.contains("no enabled key"), "{dkim:?}");
        assert!(!report.all_ok());
        assert_eq!(dkim_name(&e), None);
    }

    #[test]
    fn dmarc_mta_sts_and_tls_rpt_tables() {
        let dmarc = "_dmarc.example.org. 3600 IN TXT \
                     \"v=DMARC1; p=none; rua=mailto:postmaster@example.org\"";
        let sts = "_mta-sts.example.org. 3600 IN TXT \"v=STSv1; id=20261201T000000;\"";
        let rpt = "_smtp._tls.example.org. 3600 IN TXT \
                   \"v=TLSRPTv1; rua=mailto:postmaster@example.org\"";
        type Case<'a> = (Kind, &'a [&'a str], Option<&'a str>, Status);
        let cases: &[Case<'_>] = &[
            (
                Kind::Dmarc,
                &["v=DMARC1; p=reject; rua=mailto:d@x.net"],
                None,
                Status::Ok,
            ),
            (Kind::Dmarc, &["v=DMARC1;p=quarantine"], None, Status::Ok),
            (Kind::Dmarc, &[], Some(dmarc), Status::Missing),
            (
                Kind::Dmarc,
                &["v=DMARC1; rua=mailto:d@x.net"],
                Some(dmarc),
                Status::Wrong,
            ),
            (
                Kind::Dmarc,
                &["v=DMARC1; p=maybe"],
                Some(dmarc),
                Status::Wrong,
            ),
            (
                Kind::Dmarc,
                &["v=DMARC1; p=none", "v=DMARC1; p=reject"],
                Some(dmarc),
                Status::Wrong,
            ),
            (Kind::MtaSts, &["v=STSv1; id=abc"], None, Status::Ok),
            (Kind::MtaSts, &[], Some(sts), Status::Missing),
            (Kind::MtaSts, &["v=STSv1;"], Some(sts), Status::Wrong),
            (Kind::MtaSts, &["v=STSv1; id=a-b"], Some(sts), Status::Wrong),
            (
                Kind::TlsRpt,
                &["v=TLSRPTv1; rua=https://r.example/x"],
                None,
                Status::Ok,
            ),
            (
                Kind::TlsRpt,
                &["v=TLSRPTv1;rua=mailto:a@b.net,mailto:c@d.net"],
                None,
                Status::Ok,
            ),
            (Kind::TlsRpt, &[], Some(rpt), Status::Missing),
            (Kind::TlsRpt, &["v=TLSRPTv1"], Some(rpt), Status::Wrong),
            (
                Kind::TlsRpt,
                &["v=TLSRPTv1; rua=ftp://x"],
                Some(rpt),
                Status::Wrong,
            ),
        ];
        for (kind, found, publish, status) in cases {
            let want = match (status, publish) {
                (Status::Ok, _) => Want::Ok,
                (Status::Missing, Some(p)) => Want::Missing(p),
                (Status::Wrong, Some(p)) => Want::Wrong(p),
                _ => unreachable!(),
            };
            check(
                *kind,
                |f| match kind {
                    Kind::Dmarc => f.dmarc = txt(found),
                    Kind::MtaSts => f.mta_sts = txt(found),
                    _ => f.tls_rpt = txt(found),
                },
                want,
            );
        }
    }

    #[test]
    fn address_and_ptr_table() {
        let ip: IpAddr = "192.0.2.25".parse().unwrap();
        let ptr = "25.2.0.192.in-addr.arpa. 3600 IN PTR mx.example.org.";
        check(
            Kind::Ptr,
            |f| f.ptr = vec![(ip, Ok(vec![]))],
            Want::Missing(ptr),
        );
        check(
            Kind::Ptr,
            |f| f.ptr = vec![(ip, Ok(vec!["host-25.provider.net".into()]))],
            Want::Wrong(ptr),
        );
        check(
            Kind::Ptr,
            |f| f.ptr = vec![(ip, Err("SERVFAIL".into()))],
            Want::Failed,
        );
        check(
            Kind::Address,
            |f| f.addresses = Err("timeout".into()),
            Want::Failed,
        );
        // No address: no PTR to look up, the SPF ip4 rule has nothing to hold.
        let mut f = good();
        f.addresses = Ok(vec![]);
        f.ptr = vec![];
        let report = super::check(&expected(), &f);
        let row = &report.checks[6];
        assert_eq!((row.kind, row.status), (Kind::Address, Status::Missing));
        assert_eq!(report.checks.len(), 7);
    }

    #[test]
    fn reverse_names_and_zone_lines() {
        assert_eq!(
            reverse_name("192.0.2.25".parse().unwrap()),
            "25.2.0.192.in-addr.arpa"
        );
        assert_eq!(
            reverse_name("2001:db8::1".parse().unwrap()),
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa"
        );
        let long = zone_line("s._domainkey.x.org", "TXT", &"A".repeat(300));
        assert_eq!(long.matches('"').count(), 4, "{long}");
        assert_eq!(
            zone_line("x.org", "MX", "10 mx.x.org"),
            "x.org. 3600 IN MX 10 mx.x.org."
        );
        for (net, ip, inside) in [
            ("192.0.2.0/24", "192.0.2.25", true),
            ("192.0.2.0/25", "192.0.2.200", false),
            ("0.0.0.0/0", "198.51.100.1", true),
            ("192.0.2.25", "192.0.2.25", true),
            ("192.0.2.0/x", "192.0.2.25", false),
            ("2001:db8::/32", "2001:db8::1", true),
            ("2001:db8::/32", "192.0.2.25", false),
        ] {
            assert_eq!(covers(net, ip.parse().unwrap()), inside, "{net} {ip}");
        }
    }

    #[test]
    fn the_table_names_each_record_and_what_to_publish() {
        let mut f = good();
        f.dmarc = Ok(vec![]);
        let report = super::check(&expected(), &f);
        let text = report.to_string();
        assert!(text.starts_with("RECORD "), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("DMARC ") && l.ends_with(" missing")),
            "{text}"
        );
        assert!(
            text.contains(
                "  publish: _dmarc.example.org. 3600 IN TXT \
                 \"v=DMARC1; p=none; rua=mailto:postmaster@example.org\"\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("7 of 8 records of example.org are as they should be\n"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["checks"][3]["kind"], "dmarc");
        assert_eq!(json["checks"][3]["status"], "missing");
        assert_eq!(json["checks"][3]["type"], "TXT");
        assert_eq!(json["checks"][0]["publish"], serde_json::Value::Null);
    }

    #[test]
    fn the_public_key_of_a_generated_key_is_the_one_dns_prints() {
        for algorithm in [dns::Algorithm::Rsa, dns::Algorithm::Ed25519] {
            let (pem, p) = crate::generate_key(algorithm).unwrap();
            let key = public_key(&pem).unwrap();
            assert_eq!((key.algorithm, key.p.as_str()), (algorithm, p.as_str()));
        }
        assert!(public_key("hello").is_err());
    }
}
