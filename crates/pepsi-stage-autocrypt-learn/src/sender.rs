//! Whether a message's From address is authenticated, from the verdicts the ingress recorded
//! in `state.auth` (docs/state.md) and the submission's login in `state.origin.auth_user`.
//! Only such a message may change what we store of its sender's key: anyone can write an
//! Autocrypt header into mail with somebody else's From. Pure; tested as a table.

use pepsi_contract::state::{Auth, Origin};
use serde_json::{Map, Value};

/// How the From address was authenticated, when it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authenticated {
    /// DMARC passed for the From domain.
    Dmarc,
    /// A valid DKIM signature of the From domain or a parent of it (relaxed alignment).
    AlignedDkim,
    /// Submitted here by the mailbox itself, logged in.
    Login,
}

/// How `from` (lower case) is authenticated by `state`, or None. An `auth` or `origin` that
/// does not parse authenticates nothing.
pub fn authenticated(state: &Map<String, Value>, from: &str) -> Option<Authenticated> {
    let domain = pepsi_conf::address::domain_part(from)?.trim_end_matches('.');
    let auth = Auth::from_state(state).ok().flatten().unwrap_or_default();
    let lower = |s: &str| s.to_ascii_lowercase();
    // The verdict is for the From domain the ingress read (an A-label for an IDN, which
    // the From here may spell in Unicode): a From changed since (a filter) does not match.
    if let Some(dmarc) = &auth.dmarc
        && dmarc.result.eq_ignore_ascii_case("pass")
        && dmarc
            .domain
            .as_deref()
            .map(lower)
            .is_none_or(|d| d.trim_end_matches('.') == domain || !domain.is_ascii())
    {
        return Some(Authenticated::Dmarc);
    }
    let aligned = auth.dkim.iter().any(|s| {
        s.result.eq_ignore_ascii_case("pass")
            && s.domain.as_deref().map(lower).is_some_and(|d| {
                let d = d.trim_end_matches('.');
                !d.is_empty()
                    && (d == domain
                        || domain
                            .strip_suffix(d)
                            .is_some_and(|rest| rest.ends_with('.')))
            })
    });
    if aligned {
        return Some(Authenticated::AlignedDkim);
    }
    let login = Origin::from_state(state)
        .ok()
        .flatten()
        .and_then(|o| o.auth_user)
        .map(|u| lower(&u));
    (login.as_deref() == Some(from)).then_some(Authenticated::Login)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(state: Value, from: &str, want: Option<Authenticated>) {
        let map = state.as_object().cloned().unwrap();
        assert_eq!(authenticated(&map, from), want, "{from}: {state}");
    }

    #[test]
    fn autocrypt_learns_only_from_an_authenticated_from() {
        use Authenticated::*;
        let a = "erin@example.org";
        check(json!({}), a, None);
        check(
            json!({"auth": {"dmarc": {"result": "pass", "domain": "example.org"}}}),
            a,
            Some(Dmarc),
        );
        check(
            json!({"auth": {"dmarc": {"result": "PASS", "domain": "Example.org"}}}),
            a,
            Some(Dmarc),
        );
        check(
            json!({"auth": {"dmarc": {"result": "pass", "domain": "evil.test"}}}),
            a,
            None,
        );
        check(
            json!({"auth": {"dmarc": {"result": "pass", "domain": "xn--bcher-kva.example"}}}),
            "erin@bücher.example",
            Some(Dmarc),
        );
        for result in ["fail", "none", "temperror", "permerror"] {
            check(
                json!({"auth": {"dmarc": {"result": result, "domain": "example.org"}}}),
                a,
                None,
            );
        }
        let dkim = |result: &str, domain: &str| {
            json!({"auth": {"dmarc": {"result": "none"}, "dkim": [
                {"result": "fail", "domain": "example.org"},
                {"result": result, "domain": domain}]}})
        };
        check(dkim("pass", "example.org"), a, Some(AlignedDkim));
        check(
            dkim("pass", "example.org"),
            "x@mail.example.org",
            Some(AlignedDkim),
        );
        check(dkim("pass", "mail.example.org"), a, None);
        check(dkim("pass", "le.org"), a, None);
        check(dkim("pass", "evil.test"), a, None);
        check(dkim("fail", "example.org"), a, None);
        check(json!({"origin": {"auth_user": a}}), a, Some(Login));
        check(json!({"origin": {"auth_user": "bob@example.org"}}), a, None);
        check(json!({"origin": {"auth_user": null}}), a, None);
        check(
            json!({"auth": {"dmarc": {"result": "pass"}}}),
            "not-an-address",
            None,
        );
        // a verdict that does not have the shape of one authenticates nothing
        check(
            json!({"auth": {"dmarc": {"result": "pass", "domain": 7}}}),
            a,
            None,
        );
        check(
            json!({"auth": {"dmarc": {"result": "none"}, "dkim": "pass"}}),
            a,
            None,
        );
    }
}
