//! The payload of `ARC-Authentication-Results` (RFC 8617 §4.1.1, RFC 8601 syntax) rebuilt
//! from what the ingress recorded: the verdicts in `state.auth`, the connection facts in
//! `state.origin` (`iprev`, `client_addr`, `auth_user`) and its `authserv_id`, so the set
//! repeats what this server's `Authentication-Results` field said at the door.
//!
//! Pure: state in, text out. Values that are not tokens are quoted, results that are not
//! result names are left out; nothing from the state reaches the header unchecked.

use pepsi_contract::state::Origin;
use serde_json::{Map, Value};

/// Whether `s` may stand as an RFC 8601 pvalue without quotes: a token (RFC 2045) or a
/// domain name or address.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_graphic() && !b"()<>,;:\\\"/[]?=".contains(&b) // '@' is allowed in a pvalue
        })
}

/// A property value: as is when it is a token, else a quoted-string without control or
/// non-ASCII characters.
fn pvalue(s: &str) -> String {
    if is_token(s) {
        return s.to_owned();
    }
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// A result keyword as RFC 8601 names them (`pass`, `fail`, `softfail`, …): lower-case
/// letters only.
fn result_name(r: &str) -> Option<&str> {
    (!r.is_empty() && r.bytes().all(|b| b.is_ascii_lowercase())).then_some(r)
}

fn text<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key)?.as_str().filter(|s| !s.is_empty())
}

/// `method=result [reason="…"] ptype.property=value …` for a `state.auth` verdict.
fn entry(method: &str, verdict: &Value, props: &[(&str, Option<&str>)]) -> Option<String> {
    let result = verdict.get("result")?.as_str()?;
    entry_of(method, result, text(verdict, "reason"), props)
}

/// `method=result [reason="…"] ptype.property=value …`; None when `result` is not a
/// result name.
fn entry_of(
    method: &str,
    result: &str,
    reason: Option<&str>,
    props: &[(&str, Option<&str>)],
) -> Option<String> {
    let result = result_name(result)?;
    let mut out = format!("{method}={result}");
    if result != "pass"
        && let Some(reason) = reason
    {
        out.push_str(&format!(" reason={}", pvalue(reason)));
    }
    for (prop, value) in props {
        if let Some(value) = value {
            out.push_str(&format!(" {prop}={}", pvalue(value)));
        }
    }
    Some(out)
}

/// The authserv-id the results are issued under: `state.origin.authserv_id` when it is a
/// usable one, else `fallback`.
pub fn authserv_id<'s>(origin: &'s Origin, fallback: &'s str) -> &'s str {
    origin
        .authserv_id
        .as_deref()
        .filter(|id| is_token(id))
        .unwrap_or(fallback)
}

/// The results, one `method=result props` entry each, in the order the ingress's field
/// has them: iprev, SPF (HELO, then MAIL FROM), DKIM (one per signature), DMARC, ARC, and
/// the SMTP AUTH identity when the client authenticated.
pub fn results(origin: &Origin, state: &Map<String, Value>) -> Vec<String> {
    let null = Value::Null;
    let auth = state.get("auth").unwrap_or(&null);
    let client = origin.client_addr.map(|a| a.to_string());
    let client = client.as_deref();
    let mut out = Vec::new();
    if let Some(iprev) = &origin.iprev {
        out.extend(entry_of(
            "iprev",
            &iprev.result,
            None,
            &[("policy.iprev", client)],
        ));
    }
    if let Some(spf) = auth.get("spf") {
        if let Some(helo) = spf.get("helo") {
            out.extend(entry("spf", helo, &[("smtp.helo", text(helo, "domain"))]));
        }
        out.extend(entry("spf", spf, &[("smtp.mailfrom", text(spf, "domain"))]));
    }
    for dkim in auth
        .get("dkim")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.extend(entry(
            "dkim",
            dkim,
            &[
                ("header.d", text(dkim, "domain")),
                ("header.s", text(dkim, "selector")),
            ],
        ));
    }
    if let Some(dmarc) = auth.get("dmarc") {
        out.extend(entry(
            "dmarc",
            dmarc,
            &[
                ("header.from", text(dmarc, "domain")),
                ("policy.dmarc", text(dmarc, "policy")),
            ],
        ));
    }
    if let Some(arc) = auth.get("arc") {
        out.extend(entry("arc", arc, &[("smtp.remote-ip", client)]));
    }
    if let Some(user) = origin.auth_user.as_deref().filter(|u| !u.is_empty()) {
        out.push(format!("auth=pass smtp.auth={}", pvalue(user)));
    }
    out
}

/// The payload after `i=N; `: the authserv-id, then each result on its own folded line,
/// or `none` (RFC 8601 §2.2) when there is nothing to report.
pub fn payload(authserv_id: &str, results: &[String]) -> String {
    if results.is_empty() {
        return format!("{authserv_id}; none");
    }
    let mut out = authserv_id.to_owned();
    for r in results {
        out.push_str(";\r\n\t");
        out.push_str(r);
    }
    out
}
