//! Request validators for `/in`, `/out` and `/counters`: pure functions, no I/O, so the HTTP
//! layer can reject garbage before any CDB or Redis access.

use serde_json::{Map, Value};

use crate::address::parts;

/// Longest address accepted (RFC 5321 path limit).
pub const MAX_ADDRESS_LEN: usize = 254;
/// Longest trace id accepted.
pub const MAX_TRACE_ID_LEN: usize = 128;

/// The two counting routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    In,
    Out,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::In => "in",
            Route::Out => "out",
        }
    }
}

/// A request that passed validation; addresses are normalised (trimmed, lowercased, punycode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountRequest {
    pub route: Route,
    /// Sanitised: printable ASCII only.
    pub trace_id: String,
    /// `/out` only: the login, reduced to its base address.
    pub auth_user: Option<String>,
    /// Never rejects: normalised when it parses, otherwise kept sanitised for the log.
    pub mail_from: String,
    pub recipient: String,
    pub junk: bool,
}

/// Keeps only printable ASCII so a trace id cannot forge log lines, and bounds its length.
pub fn sanitize_trace_id(raw: &str) -> String {
    raw.chars()
        .filter(|c| (' '..='~').contains(c))
        .take(MAX_TRACE_ID_LEN)
        .collect()
}

/// Best-effort trace id from a parsed body, for logging rejections.
pub fn trace_id_of(body: &Value) -> String {
    body.get("trace_id")
        .and_then(Value::as_str)
        .map(sanitize_trace_id)
        .unwrap_or_default()
}

/// Normalises an e-mail address or says why it is not one.
pub fn normalize_address(raw: &str) -> Result<String, &'static str> {
    let addr = raw.trim();
    if addr.is_empty() {
        return Err("empty");
    }
    if addr.is_ascii() {
        normalize_ascii_address(addr)
    } else {
        normalize_any_address(addr)
    }
}

/// `normalize_address` of a trimmed, non-empty address, whatever its characters.
fn normalize_any_address(addr: &str) -> Result<String, &'static str> {
    if addr.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("invalid e-mail address");
    }
    // Exactly one `@`: the domain after the last one never holds another.
    let Some((local, domain)) = parts(addr).filter(|(local, _)| !local.contains('@')) else {
        return Err("invalid e-mail address");
    };
    if local.is_empty() || domain.is_empty() {
        return Err("invalid e-mail address");
    }
    let domain = normalize_domain(domain).ok_or("invalid e-mail address")?;
    let out = format!("{}@{}", local.to_lowercase(), domain);
    if out.len() > MAX_ADDRESS_LEN {
        return Err("too long");
    }
    Ok(out)
}

/// `normalize_address` of a trimmed, non-empty, all-ASCII address (nearly every one): the same
/// rules and answers in one pass and one allocation. Lowercasing the local part and the domain
/// apart is lowercasing the whole, and an ASCII domain needs no punycode.
fn normalize_ascii_address(addr: &str) -> Result<String, &'static str> {
    let b = addr.as_bytes();
    // ASCII whitespace and control characters are the bytes up to the space, and DEL.
    if b.iter().any(|&c| c <= b' ' || c == 0x7f) {
        return Err("invalid e-mail address");
    }
    match b.iter().position(|&c| c == b'@') {
        Some(at) if at > 0 && at + 1 < b.len() && !b[at + 1..].contains(&b'@') => {}
        _ => return Err("invalid e-mail address"),
    }
    if b.len() > MAX_ADDRESS_LEN {
        return Err("too long");
    }
    Ok(addr.to_ascii_lowercase())
}

/// Lowercases a domain and converts an IDN to punycode; `None` when it cannot be a domain.
pub fn normalize_domain(raw: &str) -> Option<String> {
    let d = raw.trim();
    if d.is_empty()
        || d.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '@')
    {
        return None;
    }
    if d.is_ascii() {
        return Some(d.to_ascii_lowercase());
    }
    idna::domain_to_ascii(d).ok().filter(|a| !a.is_empty())
}

/// A login `user@dom@SUFFIX` counts under `user@dom`; anything else goes through unchanged.
pub fn normalize_login(raw: &str) -> Result<String, &'static str> {
    let t = raw.trim();
    if t.matches('@').count() == 2 {
        let (base, suffix) = parts(t).unwrap_or((t, ""));
        if suffix.is_empty() {
            return Err("invalid e-mail address");
        }
        return normalize_address(base);
    }
    normalize_address(t)
}

/// One field of a count request as the rules see it.
#[derive(Clone, Copy)]
enum Raw<'a> {
    /// Absent or `null`.
    Missing,
    Str(&'a str),
    Bool(bool),
    /// Any other JSON type.
    Other,
}

impl<'a> Raw<'a> {
    fn of(obj: &'a Map<String, Value>, name: &str) -> Raw<'a> {
        match obj.get(name) {
            None | Some(Value::Null) => Raw::Missing,
            Some(Value::String(s)) => Raw::Str(s),
            Some(Value::Bool(b)) => Raw::Bool(*b),
            Some(_) => Raw::Other,
        }
    }

    fn str_or_missing(v: Option<&'a str>) -> Raw<'a> {
        v.map_or(Raw::Missing, Raw::Str)
    }
}

/// The fields the rules read, whatever else the body holds.
struct RawRequest<'a> {
    trace_id: Raw<'a>,
    auth_user: Raw<'a>,
    mail_from: Raw<'a>,
    recipient: Raw<'a>,
    junk: Raw<'a>,
}

fn field_str<'a>(raw: Raw<'a>, name: &str) -> Result<Option<&'a str>, String> {
    match raw {
        Raw::Missing => Ok(None),
        Raw::Str(s) => Ok(Some(s)),
        Raw::Bool(_) | Raw::Other => Err(format!("{name}: must be a string")),
    }
}

fn required_address(
    raw: Raw<'_>,
    name: &str,
    norm: fn(&str) -> Result<String, &'static str>,
) -> Result<String, String> {
    match field_str(raw, name)? {
        None => Err(format!("{name}: missing")),
        Some(s) => norm(s).map_err(|why| format!("{name}: {why}")),
    }
}

/// Validates the body of `/in` or `/out`; the error names the field, e.g. `recipient: missing`.
pub fn validate_count_request(route: Route, body: &Value) -> Result<CountRequest, String> {
    let Some(obj) = body.as_object() else {
        return Err("body: expected a JSON object".into());
    };
    validate_raw(
        route,
        RawRequest {
            trace_id: Raw::of(obj, "trace_id"),
            auth_user: Raw::of(obj, "auth_user"),
            mail_from: Raw::of(obj, "mail_from"),
            recipient: Raw::of(obj, "recipient"),
            junk: Raw::of(obj, "junk"),
        },
    )
}

/// The fields of a body as mailqueuer sends it, read straight from the bytes: strings without
/// escapes are borrowed, unknown fields are skipped (but must still be valid JSON).
#[derive(serde::Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default)]
    trace_id: Option<&'a str>,
    #[serde(borrow, default)]
    auth_user: Option<&'a str>,
    #[serde(borrow, default)]
    mail_from: Option<&'a str>,
    #[serde(borrow, default)]
    recipient: Option<&'a str>,
    #[serde(default)]
    junk: Option<bool>,
}

/// The common case without building a `serde_json::Value`: `Some` only for a body that is one
/// JSON object whose fields the rules accept, and then exactly what `validate_count_request`
/// gives for it. `None` for anything else (not an object, a field of another type or given
/// twice, an escaped string, a rejection), which the caller takes through
/// `validate_count_request` on the parsed `Value`: that path words every error.
pub fn accept_count_request(route: Route, body: &[u8]) -> Option<CountRequest> {
    // A derived struct also reads a JSON array by position; only an object may pass.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let f: Fields<'_> = serde_json::from_slice(body).ok()?;
    validate_raw(
        route,
        RawRequest {
            trace_id: Raw::str_or_missing(f.trace_id),
            auth_user: Raw::str_or_missing(f.auth_user),
            mail_from: Raw::str_or_missing(f.mail_from),
            recipient: Raw::str_or_missing(f.recipient),
            junk: f.junk.map_or(Raw::Missing, Raw::Bool),
        },
    )
    .ok()
}

fn validate_raw(route: Route, raw: RawRequest<'_>) -> Result<CountRequest, String> {
    let trace_id = match field_str(raw.trace_id, "trace_id")? {
        None => String::new(),
        Some(t) if t.chars().count() > MAX_TRACE_ID_LEN => {
            return Err(format!(
                "trace_id: longer than {MAX_TRACE_ID_LEN} characters"
            ));
        }
        Some(t) => sanitize_trace_id(t),
    };
    let auth_user = match route {
        Route::Out => Some(required_address(
            raw.auth_user,
            "auth_user",
            normalize_login,
        )?),
        Route::In => None,
    };
    let recipient = required_address(raw.recipient, "recipient", normalize_address)?;
    // mail_from is never counted, so it never rejects a request; it only feeds the exempt check.
    let mail_from = match raw.mail_from {
        Raw::Str(m) => normalize_address(m).unwrap_or_else(|_| sanitize_trace_id(m.trim())),
        _ => String::new(),
    };
    let junk = match route {
        Route::Out => false,
        Route::In => match raw.junk {
            Raw::Missing => false,
            Raw::Bool(b) => b,
            Raw::Str(_) | Raw::Other => return Err("junk: must be a boolean".into()),
        },
    };
    Ok(CountRequest {
        route,
        trace_id,
        auth_user,
        mail_from,
        recipient,
        junk,
    })
}

/// Which side `GET /counters` looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CountersQuery {
    Address(String),
    Domain(String),
}

/// Validates the `/counters` query: exactly one of `address`/`domain`, optional `date` that is
/// a calendar date not after `today`.
pub fn validate_counters_query(
    pairs: &[(String, String)],
    today: chrono::NaiveDate,
) -> Result<(CountersQuery, chrono::NaiveDate), String> {
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let query = match (get("address"), get("domain")) {
        (Some(a), None) => {
            CountersQuery::Address(normalize_address(a).map_err(|why| format!("address: {why}"))?)
        }
        (None, Some(d)) => CountersQuery::Domain(
            normalize_domain(d).ok_or_else(|| format!("domain: invalid domain {d:?}"))?,
        ),
        _ => return Err("address, domain: exactly one is required".into()),
    };
    let date = match get("date") {
        None | Some("") => today,
        Some(d) => {
            let date = parse_iso_date(d).ok_or_else(|| format!("date: {d:?} is not YYYY-MM-DD"))?;
            if date > today {
                return Err(format!("date: {d} is in the future"));
            }
            date
        }
    };
    Ok((query, date))
}

/// Parses exactly `YYYY-MM-DD` (two-digit month and day, as the contract says).
pub fn parse_iso_date(s: &str) -> Option<chrono::NaiveDate> {
    let b = s.as_bytes();
    let shape_ok = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !shape_ok {
        return None;
    }
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(route: Route, body: Value, expected: Result<(&str, &str, &str), &str>) {
        let got = validate_count_request(route, &body);
        match expected {
            Ok((auth, rcpt, from)) => {
                let r = got.unwrap_or_else(|e| panic!("{body}: unexpected error {e}"));
                assert_eq!(r.auth_user.as_deref().unwrap_or(""), auth, "{body}");
                assert_eq!(r.recipient, rcpt, "{body}");
                assert_eq!(r.mail_from, from, "{body}");
            }
            Err(e) => assert_eq!(got.unwrap_err(), e, "{body}"),
        }
    }

    #[test]
    fn out_route_fields() {
        use Route::Out;
        let ok = |a, r, f| Ok((a, r, f));
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"y@example.org"}),
            ok("x@example.com", "y@example.org", ""),
        );
        check(
            Out,
            json!({"auth_user":" X@Example.COM ","recipient":"Y@EXAMPLE.org","mail_from":"X@Example.com"}),
            ok("x@example.com", "y@example.org", "x@example.com"),
        );
        check(
            Out,
            json!({"recipient":"y@example.org"}),
            Err("auth_user: missing"),
        );
        check(
            Out,
            json!({"auth_user":"","recipient":"y@example.org"}),
            Err("auth_user: empty"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com"}),
            Err("recipient: missing"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":""}),
            Err("recipient: empty"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"a@b@c"}),
            Err("recipient: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"a b@c"}),
            Err("recipient: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"ab\n@c"}),
            Err("recipient: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"noat"}),
            Err("recipient: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"@c"}),
            Err("recipient: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"a@"}),
            Err("recipient: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":7}),
            Err("recipient: must be a string"),
        );
        let long = format!("{}@example.com", "a".repeat(250));
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":long}),
            Err("recipient: too long"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"y@xn--mnchen-3ya.de"}),
            ok("x@example.com", "y@xn--mnchen-3ya.de", ""),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"y@MÜNCHEN.de"}),
            ok("x@example.com", "y@xn--mnchen-3ya.de", ""),
        );
        // a login with a suffix counts under its base address
        check(
            Out,
            json!({"auth_user":"X@Example.com@imap","recipient":"y@e.org"}),
            ok("x@example.com", "y@e.org", ""),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com@","recipient":"y@e.org"}),
            Err("auth_user: invalid e-mail address"),
        );
        check(
            Out,
            json!({"auth_user":"a@b@c@d","recipient":"y@e.org"}),
            Err("auth_user: invalid e-mail address"),
        );
        // mail_from never rejects
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"y@e.org","mail_from":"not an address"}),
            ok("x@example.com", "y@e.org", "not an address"),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"y@e.org","mail_from":""}),
            ok("x@example.com", "y@e.org", ""),
        );
        check(
            Out,
            json!({"auth_user":"x@example.com","recipient":"y@e.org","unknown":[1,2]}),
            ok("x@example.com", "y@e.org", ""),
        );
        check(Out, json!([1]), Err("body: expected a JSON object"));
    }

    #[test]
    fn in_route_fields() {
        use Route::In;
        check(
            In,
            json!({"recipient":"y@e.org","mail_from":""}),
            Ok(("", "y@e.org", "")),
        );
        check(
            In,
            json!({"recipient":"y@e.org","auth_user":"garbage"}),
            Ok(("", "y@e.org", "")),
        );
        check(
            In,
            json!({"mail_from":"s@gmail.com"}),
            Err("recipient: missing"),
        );
        check(
            In,
            json!({"recipient":"y@e.org","junk":"yes"}),
            Err("junk: must be a boolean"),
        );
        let r = validate_count_request(In, &json!({"recipient":"y@e.org","junk":true})).unwrap();
        assert!(r.junk);
        let r = validate_count_request(In, &json!({"recipient":"y@e.org"})).unwrap();
        assert!(!r.junk);
    }

    #[test]
    fn trace_id_rules() {
        let r = validate_count_request(
            Route::In,
            &json!({"recipient":"y@e.org","trace_id":"ab\r\n2026-01-01 <x> forged\u{7}é"}),
        )
        .unwrap();
        assert_eq!(r.trace_id, "ab2026-01-01 <x> forged");
        let long = "t".repeat(129);
        assert_eq!(
            validate_count_request(Route::In, &json!({"recipient":"y@e.org","trace_id":long}))
                .unwrap_err(),
            "trace_id: longer than 128 characters"
        );
        assert_eq!(sanitize_trace_id(&"x".repeat(300)).len(), 128);
    }

    #[test]
    fn counters_query() {
        let today = chrono::NaiveDate::from_ymd_opt(2026, 10, 13).unwrap();
        let q = |s: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = s
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            validate_counters_query(&pairs, today)
        };
        assert_eq!(
            q(&[("address", "Me@Example.com")]).unwrap(),
            (CountersQuery::Address("me@example.com".into()), today)
        );
        assert_eq!(
            q(&[("domain", "Example.com"), ("date", "2026-10-12")])
                .unwrap()
                .0,
            CountersQuery::Domain("example.com".into())
        );
        assert_eq!(
            q(&[("domain", "example.com"), ("date", "2026-10-12")])
                .unwrap()
                .1,
            today.pred_opt().unwrap()
        );
        assert_eq!(
            q(&[]).unwrap_err(),
            "address, domain: exactly one is required"
        );
        assert_eq!(
            q(&[("address", "a@b"), ("domain", "b")]).unwrap_err(),
            "address, domain: exactly one is required"
        );
        assert_eq!(
            q(&[("address", "nope")]).unwrap_err(),
            "address: invalid e-mail address"
        );
        assert_eq!(
            q(&[("address", "a@b"), ("date", "2026-10-14")]).unwrap_err(),
            "date: 2026-10-14 is in the future"
        );
        assert_eq!(
            q(&[("address", "a@b"), ("date", "2026-1-4")]).unwrap_err(),
            "date: \"2026-1-4\" is not YYYY-MM-DD"
        );
        assert_eq!(
            q(&[("address", "a@b"), ("date", "2026-02-30")]).unwrap_err(),
            "date: \"2026-02-30\" is not YYYY-MM-DD"
        );
    }

    /// The bytes-level reading of a body agrees with the `Value` one wherever it answers, and
    /// answers for the bodies mailqueuer sends.
    #[test]
    fn direct_reading_agrees_with_the_value_path() {
        use Route::{In, Out};
        // (route, body, taken without a Value)
        let cases: &[(Route, &str, bool)] = &[
            (
                Out,
                r#"{"trace_id":"t1","auth_user":"X@Example.COM","mail_from":"x@example.com","recipient":"y@gmail.com"}"#,
                true,
            ),
            (
                In,
                r#" {"trace_id":"t2","mail_from":"","recipient":"y@example.com","junk":true} "#,
                true,
            ),
            (
                In,
                r#"{"recipient":"y@example.com","junk":null,"x":[1,{"a":2}]}"#,
                true,
            ),
            (
                Out,
                r#"{"auth_user":"a@b.c@SUFFIX","recipient":"y@b.c","mail_from":null}"#,
                true,
            ),
            (In, r#"{"recipient":"y@bé.c"}"#, true),
            (In, r#"{"recipient":"y@b\u00e9.c"}"#, false),
            (In, r#"{"recipient":"y@b.c","recipient":"z@b.c"}"#, false),
            (In, r#"{"recipient":"y@b.c","mail_from":5}"#, false),
            (
                Out,
                r#"{"auth_user":"a@b.c","recipient":"y@b.c","junk":"yes"}"#,
                false,
            ),
            (In, r#"{"recipient":"y@b.c","junk":"yes"}"#, false),
            (In, r#"{"recipient":"y@b.c","trace_id":7}"#, false),
            (In, r#"{"recipient":"nope"}"#, false),
            (Out, r#"{"recipient":"y@b.c"}"#, false),
            (In, r#"["y@b.c"]"#, false),
            (In, r#"{"recipient":"y@b.c"} {}"#, false),
            (In, r#"{"recipient":"y@b.c""#, false),
        ];
        for (route, body, direct) in cases {
            let fast = accept_count_request(*route, body.as_bytes());
            assert_eq!(fast.is_some(), *direct, "{body}");
            if let Some(r) = fast {
                let v: Value = serde_json::from_str(body).unwrap();
                assert_eq!(Ok(r), validate_count_request(*route, &v), "{body}");
            }
        }
    }

    /// The ASCII shortcut answers as the general rule does.
    #[test]
    fn ascii_addresses_take_the_shortcut_with_the_same_answers() {
        let long = format!("{}@example.com", "a".repeat(250));
        let cases = [
            "X@Example.COM",
            "a@b",
            "a@b@c",
            "@b",
            "a@",
            "@",
            "ab",
            "a b@c",
            "a@b\tc",
            "a\u{7f}@b",
            "a\u{1}@b",
            "A.B+tag@Sub.Example.ORG",
            "a@xn--bcher-kva.example",
            long.as_str(),
        ];
        for addr in cases {
            assert_eq!(
                normalize_ascii_address(addr),
                normalize_any_address(addr),
                "{addr:?}"
            );
        }
    }
}
