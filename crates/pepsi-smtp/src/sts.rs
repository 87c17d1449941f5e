//! MTA-STS (RFC 8461), the one definition both ends use: the `_mta-sts` TXT record, the
//! policy file a domain serves at `https://mta-sts.<domain>/.well-known/mta-sts.txt`, and
//! whether an MX host name matches one of the policy's `mx` patterns. The relay to the
//! internet reads a peer's policy with it; pepsi-httpd writes our own with
//! [`Policy::to_text`], and pepsi-setup prints the TXT record with [`Record::to_text`].
//!
//! Pure: no DNS, no HTTP. Everything here is bounded: a policy longer than
//! [`MAX_POLICY_BYTES`] or with more than [`MAX_MX_PATTERNS`] patterns is refused.

use std::fmt;

/// The largest policy body read (RFC 8461 §3.3 suggests a limit of this order).
pub const MAX_POLICY_BYTES: usize = 64 * 1024;

/// The most `mx` patterns one policy may hold.
pub const MAX_MX_PATTERNS: usize = 100;

/// The largest `max_age` (RFC 8461 §3.2: 31557600 seconds, about a year).
pub const MAX_AGE_LIMIT: u32 = 31_557_600;

/// Where a domain's policy is fetched from.
pub fn policy_url(domain: &str, port: u16) -> String {
    if port == 443 {
        format!("https://mta-sts.{domain}/.well-known/mta-sts.txt")
    } else {
        format!("https://mta-sts.{domain}:{port}/.well-known/mta-sts.txt")
    }
}

/// The policy host of `domain`: the name its certificate must carry.
pub fn policy_host(domain: &str) -> String {
    format!("mta-sts.{domain}")
}

/// The TXT record of `_mta-sts.<domain>`: the policy's current id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: String,
}

impl Record {
    /// Parses one TXT record (its strings already joined): `v=STSv1; id=<1-32 alphanumeric>;`
    /// with `v` first; other fields are ignored (§3.1).
    pub fn parse(text: &str) -> Result<Record, String> {
        let mut fields = text.split(';').map(str::trim).filter(|f| !f.is_empty());
        match fields.next() {
            Some("v=STSv1") => {}
            other => {
                return Err(format!(
                    "the record does not begin with v=STSv1 (found {:?})",
                    other.unwrap_or("")
                ));
            }
        }
        let mut id = None;
        for field in fields {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| format!("the field {field:?} has no '='"))?;
            if key.trim() == "id" {
                let value = value.trim();
                if value.is_empty()
                    || value.len() > 32
                    || !value.bytes().all(|b| b.is_ascii_alphanumeric())
                {
                    return Err(format!(
                        "the id {value:?} is not 1 to 32 letters and digits"
                    ));
                }
                id = Some(value.to_owned());
            }
        }
        id.map(|id| Record { id })
            .ok_or_else(|| "the record has no id".to_owned())
    }

    /// The one record among the TXT answers of `_mta-sts.<domain>`: those that do not begin
    /// with `v=STSv1` are discarded, and anything but exactly one left means no policy
    /// (§3.1). `Ok(None)` when no record claims to be one.
    pub fn select(answers: &[String]) -> Result<Option<Record>, String> {
        let claims: Vec<&String> = answers
            .iter()
            .filter(|t| t.trim_start().starts_with("v=STSv1"))
            .collect();
        match claims.as_slice() {
            [] => Ok(None),
            [one] => Record::parse(one).map(Some),
            many => Err(format!(
                "{} TXT records begin with v=STSv1, where one is allowed",
                many.len()
            )),
        }
    }

    /// The record as published.
    pub fn to_text(&self) -> String {
        format!("v=STSv1; id={};", self.id)
    }
}

/// What a policy asks of a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Refuse MX hosts outside the policy and any session without a valid certificate.
    Enforce,
    /// Deliver as without a policy, and report what would have failed.
    Testing,
    /// The domain has withdrawn its policy.
    None,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Testing => "testing",
            Mode::None => "none",
        }
    }

    pub fn parse(text: &str) -> Result<Mode, String> {
        match text.trim() {
            "enforce" => Ok(Mode::Enforce),
            "testing" => Ok(Mode::Testing),
            "none" => Ok(Mode::None),
            other => Err(format!(
                "the mode {other:?} is not enforce, testing or none"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy file (§3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    /// Seconds the policy may be cached.
    pub max_age: u32,
    /// The `mx` patterns, lower case, without a trailing dot: a host name, or `*.` and a
    /// domain for any one label under it.
    pub mx: Vec<String>,
}

impl Policy {
    /// Parses a policy body: `key: value` lines ended by CRLF or LF, `version: STSv1`,
    /// `mode`, `max_age` and (unless the mode is `none`) at least one `mx`. Unknown keys are
    /// ignored; a missing or repeated required key, or a bad value, refuses the policy.
    pub fn parse(body: &[u8]) -> Result<Policy, String> {
        if body.len() > MAX_POLICY_BYTES {
            return Err(format!(
                "the policy is {} bytes, more than the {MAX_POLICY_BYTES} read",
                body.len()
            ));
        }
        let text = std::str::from_utf8(body).map_err(|_| "the policy is not UTF-8".to_owned())?;
        let (mut version, mut mode, mut max_age) = (None, None, None);
        let mut mx = Vec::new();
        let once = |slot: &Option<String>, key: &str| match slot {
            Some(_) => Err(format!("the key {key:?} appears twice")),
            None => Ok(()),
        };
        for (n, line) in text.lines().enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() {
                continue;
            }
            let (key, value) = line
                .split_once(':')
                .ok_or_else(|| format!("line {}: {line:?} is not key: value", n + 1))?;
            let value = value.trim().to_owned();
            match key.trim() {
                "version" => {
                    once(&version, "version")?;
                    version = Some(value);
                }
                "mode" => {
                    once(&mode, "mode")?;
                    mode = Some(value);
                }
                "max_age" => {
                    once(&max_age, "max_age")?;
                    max_age = Some(value);
                }
                "mx" => {
                    if mx.len() == MAX_MX_PATTERNS {
                        return Err(format!("more than {MAX_MX_PATTERNS} mx patterns"));
                    }
                    mx.push(parse_pattern(&value)?);
                }
                _ => {}
            }
        }
        match version.as_deref() {
            Some("STSv1") => {}
            Some(other) => return Err(format!("the version {other:?} is not STSv1")),
            None => return Err("the policy has no version".to_owned()),
        }
        let mode = Mode::parse(&mode.ok_or("the policy has no mode")?)?;
        let max_age = max_age.ok_or("the policy has no max_age")?;
        let max_age = max_age
            .parse::<u64>()
            .ok()
            .filter(|_| max_age.len() <= 10 && max_age.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("the max_age {max_age:?} is not a number of seconds"))?
            .min(u64::from(MAX_AGE_LIMIT)) as u32;
        if mx.is_empty() && mode != Mode::None {
            return Err(format!("the {mode} policy names no mx"));
        }
        Ok(Policy { mode, max_age, mx })
    }

    /// Whether `host` (an MX host name) is one the policy allows.
    pub fn allows(&self, host: &str) -> bool {
        self.mx.iter().any(|p| matches(p, host))
    }

    /// The policy as served, with CRLF line ends.
    pub fn to_text(&self) -> String {
        let mut text = format!("version: STSv1\r\nmode: {}\r\n", self.mode.as_str());
        for mx in &self.mx {
            text.push_str(&format!("mx: {mx}\r\n"));
        }
        text.push_str(&format!("max_age: {}\r\n", self.max_age));
        text
    }

    /// The policy string of a TLS-RPT report (RFC 8460 §4.4): its lines, without line ends.
    pub fn lines(&self) -> Vec<String> {
        self.to_text()
            .split("\r\n")
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// One `mx` value checked: a host name of letters, digits, hyphens and dots, optionally
/// after `*.`; lower case, the trailing dot gone.
pub fn parse_pattern(value: &str) -> Result<String, String> {
    let lower = value.trim().trim_end_matches('.').to_ascii_lowercase();
    let name = lower.strip_prefix("*.").unwrap_or(&lower);
    let labels_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if labels_ok {
        Ok(lower)
    } else {
        Err(format!(
            "the mx pattern {value:?} is not a host name or *.domain"
        ))
    }
}

/// RFC 8461 §4.1: a pattern is the host name itself, or `*.` and a domain, matching any host
/// one label below it (`*.example.com` matches `mx.example.com`, not `a.b.example.com`, nor
/// `example.com`). Case and a trailing dot do not matter.
pub fn matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let pattern = pattern.trim_end_matches('.');
    match pattern.strip_prefix("*.") {
        Some(parent) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest.eq_ignore_ascii_case(parent)),
        None => host.eq_ignore_ascii_case(pattern),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txt_records() {
        let ok = [
            ("v=STSv1; id=20160831085700Z;", "20160831085700Z"),
            ("v=STSv1;id=abc", "abc"),
            ("v=STSv1; id=abc; extension=1;", "abc"),
        ];
        for (text, id) in ok {
            assert_eq!(
                Record::parse(text).map(|r| r.id),
                Ok(id.to_owned()),
                "{text}"
            );
        }
        let bad = [
            ("id=abc; v=STSv1;", "does not begin"),
            ("v=STSv2; id=abc;", "does not begin"),
            ("v=STSv1;", "no id"),
            ("v=STSv1; id=;", "1 to 32"),
            ("v=STSv1; id=a-b;", "1 to 32"),
            ("v=STSv1; id=123456789012345678901234567890123;", "1 to 32"),
            ("v=STSv1; id", "no '='"),
        ];
        for (text, why) in bad {
            let err = Record::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        assert_eq!(Record { id: "x1".into() }.to_text(), "v=STSv1; id=x1;");
    }

    #[test]
    fn one_record_among_the_txt_answers() {
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(Record::select(&s(&[])), Ok(None));
        assert_eq!(Record::select(&s(&["v=spf1 -all"])), Ok(None));
        assert_eq!(
            Record::select(&s(&["v=spf1 -all", "v=STSv1; id=a1;"])),
            Ok(Some(Record { id: "a1".into() }))
        );
        assert!(
            Record::select(&s(&["v=STSv1; id=a1;", "v=STSv1; id=a2;"]))
                .unwrap_err()
                .contains("2 TXT records")
        );
        assert!(Record::select(&s(&["v=STSv1; id=;"])).is_err());
    }

    #[test]
    fn policy_files() {
        let p = Policy::parse(
            b"version: STSv1\r\nmode: enforce\r\nmx: mail.example.com\r\nmx: *.Example.NET.\r\nmax_age: 604800\r\n",
        )
        .unwrap();
        assert_eq!(p.mode, Mode::Enforce);
        assert_eq!(p.max_age, 604_800);
        assert_eq!(p.mx, ["mail.example.com", "*.example.net"]);
        // LF line ends, unknown keys, blank lines
        let p = Policy::parse(
            b"version: STSv1\nmode: testing\n\nmx: mx.a.test\nmax_age: 86400\nextra: x\n",
        )
        .unwrap();
        assert_eq!((p.mode, p.max_age), (Mode::Testing, 86400));
        // none needs no mx; a huge max_age is capped
        let p = Policy::parse(b"version: STSv1\nmode: none\nmax_age: 9999999999\n").unwrap();
        assert_eq!(
            (p.mode, p.max_age, p.mx.len()),
            (Mode::None, MAX_AGE_LIMIT, 0)
        );
        let bad: [(&[u8], &str); 10] = [
            (b"mode: enforce\nmx: a.test\nmax_age: 1\n", "no version"),
            (
                b"version: STSv2\nmode: enforce\nmx: a.test\nmax_age: 1\n",
                "not STSv1",
            ),
            (
                b"version: STSv1\nmode: on\nmx: a.test\nmax_age: 1\n",
                "not enforce",
            ),
            (
                b"version: STSv1\nmode: enforce\nmax_age: 1\n",
                "names no mx",
            ),
            (b"version: STSv1\nmode: enforce\nmx: a.test\n", "no max_age"),
            (
                b"version: STSv1\nmode: enforce\nmx: a.test\nmax_age: -1\n",
                "not a number",
            ),
            (
                b"version: STSv1\nmode: enforce\nmode: testing\nmx: a.test\nmax_age: 1\n",
                "twice",
            ),
            (
                b"version: STSv1\nmode: enforce\nmx: a b.test\nmax_age: 1\n",
                "mx pattern",
            ),
            (b"version: STSv1\nmode enforce\n", "not key: value"),
            (b"\xff\xfe", "not UTF-8"),
        ];
        for (body, why) in bad {
            let err = Policy::parse(body).unwrap_err();
            assert!(
                err.contains(why),
                "{:?}: {err}",
                String::from_utf8_lossy(body)
            );
        }
        let big = vec![b'#'; MAX_POLICY_BYTES + 1];
        assert!(Policy::parse(&big).unwrap_err().contains("more than"));
        let many: String =
            std::iter::once("version: STSv1\nmode: enforce\nmax_age: 1\n".to_owned())
                .chain((0..=MAX_MX_PATTERNS).map(|i| format!("mx: m{i}.test\n")))
                .collect();
        assert!(
            Policy::parse(many.as_bytes())
                .unwrap_err()
                .contains("more than")
        );
    }

    #[test]
    fn a_policy_written_reads_back() {
        let p = Policy {
            mode: Mode::Enforce,
            max_age: 86400,
            mx: vec!["mx1.example.org".into(), "*.example.org".into()],
        };
        assert_eq!(Policy::parse(p.to_text().as_bytes()), Ok(p.clone()));
        assert_eq!(
            p.lines(),
            [
                "version: STSv1",
                "mode: enforce",
                "mx: mx1.example.org",
                "mx: *.example.org",
                "max_age: 86400"
            ]
        );
    }

    #[test]
    fn mx_patterns_match_as_rfc_8461_says() {
        let table = [
            ("mail.example.com", "mail.example.com", true),
            ("mail.example.com", "MAIL.Example.com.", true),
            ("mail.example.com", "mail2.example.com", false),
            ("*.example.com", "mx1.example.com", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", "a.b.example.com", false),
            ("*.example.com", ".example.com", false),
            ("*.example.com", "mx1.example.com.evil.test", false),
        ];
        for (pattern, host, want) in table {
            assert_eq!(matches(pattern, host), want, "{pattern} vs {host}");
        }
        let p = Policy {
            mode: Mode::Enforce,
            max_age: 1,
            mx: vec!["*.example.com".into(), "backup.example.net".into()],
        };
        assert!(p.allows("mx.example.com") && p.allows("backup.example.net"));
        assert!(!p.allows("mx.evil.test"));
    }

    #[test]
    fn policy_urls() {
        assert_eq!(
            policy_url("example.com", 443),
            "https://mta-sts.example.com/.well-known/mta-sts.txt"
        );
        assert_eq!(
            policy_url("a.test", 8443),
            "https://mta-sts.a.test:8443/.well-known/mta-sts.txt"
        );
        assert_eq!(policy_host("a.test"), "mta-sts.a.test");
    }
}
