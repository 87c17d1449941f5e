//! The pure part of the subscriber pages: what a posted form asks (every field bounded),
//! whether a form came from this site, and the shapes of the tokens the pages take. No
//! I/O; tested as tables.

/// The most fields a form of these pages may post.
pub const MAX_FIELDS: usize = 16;
/// The longest address a form may carry (RFC 5321's path limit, as `pepsi-list` stores).
pub const MAX_ADDRESS: usize = 254;
/// The longest display name (the schema's CHECK on `list_member.display_name`).
pub const MAX_NAME_CHARS: usize = 200;
/// The longest value of any other field.
const MAX_VALUE: usize = 64;

/// The fields of a posted form, checked for count and size: every value within
/// `MAX_VALUE` bytes except `address` and `display_name`, which have their own bounds.
pub fn bounded(fields: &[(String, String)]) -> Result<(), String> {
    if fields.len() > MAX_FIELDS {
        return Err(format!("the form has more than {MAX_FIELDS} fields"));
    }
    for (name, value) in fields {
        if name.len() > MAX_VALUE {
            return Err(format!("a field name is longer than {MAX_VALUE} bytes"));
        }
        match name.as_str() {
            "address" if value.len() > MAX_ADDRESS => {
                return Err(format!(
                    "the address is longer than {MAX_ADDRESS} characters"
                ));
            }
            "display_name" if value.chars().count() > MAX_NAME_CHARS => {
                return Err(format!(
                    "the name is longer than {MAX_NAME_CHARS} characters"
                ));
            }
            "address" | "display_name" => {}
            _ if value.len() > MAX_VALUE => {
                return Err(format!(
                    "the field {name:?} is longer than {MAX_VALUE} bytes"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The first value of field `name`.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A subscription asked by the form: the address as stored and the display name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub address: String,
    pub display_name: String,
}

/// Reads the subscribe form: `address` (required; `check` is the address rule of every
/// operator tool, `pepsi_list::names::member_address`) and `display_name` (optional, one
/// line).
pub fn subscribe(
    fields: &[(String, String)],
    check: impl Fn(&str) -> Result<String, String>,
) -> Result<Subscribe, String> {
    bounded(fields)?;
    let address = field(fields, "address").map(str::trim).unwrap_or_default();
    if address.is_empty() {
        return Err("the form gives no address".into());
    }
    let address = check(address)?;
    let display_name = field(fields, "display_name")
        .map(str::trim)
        .unwrap_or_default();
    if display_name.chars().any(char::is_control) {
        return Err("the name must be one line without control characters".into());
    }
    Ok(Subscribe {
        address,
        display_name: display_name.to_owned(),
    })
}

/// A member's choices as the member page's form sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preferences {
    pub delivery_mode: &'static str,
    pub receive_own_postings: bool,
    pub hide_address: bool,
}

/// What the member page's form asks, for the member row `member_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberAct {
    Save(i64, Preferences),
    Unsubscribe(i64),
}

/// Reads the member page's form: `member` (the row), `do` (`save` or `unsubscribe`) and,
/// for `save`, `delivery_mode` and the checkboxes `receive_own_postings` and `hide_address`
/// (absent: off, as a browser sends an unticked box).
pub fn member_act(fields: &[(String, String)]) -> Result<MemberAct, String> {
    bounded(fields)?;
    let member = field(fields, "member").ok_or("the form names no subscription")?;
    let member = member
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("subscription {member:?} is not a number above 0"))?;
    match field(fields, "do") {
        Some("unsubscribe") => Ok(MemberAct::Unsubscribe(member)),
        Some("save") => {
            let mode = field(fields, "delivery_mode").unwrap_or("regular");
            let delivery_mode = match mode {
                "regular" => "regular",
                "mime_digest" => "mime_digest",
                "plain_digest" => "plain_digest",
                other => {
                    return Err(format!(
                        "delivery mode {other:?}: regular, mime_digest or plain_digest"
                    ));
                }
            };
            let on = |name: &str| field(fields, name).is_some_and(|v| v != "off" && v != "no");
            Ok(MemberAct::Save(
                member,
                Preferences {
                    delivery_mode,
                    receive_own_postings: on("receive_own_postings"),
                    hide_address: on("hide_address"),
                },
            ))
        }
        Some(other) => Err(format!("unknown action {other:?}: save or unsubscribe")),
        None => Err("the form says no action".into()),
    }
}

/// Whether an RFC 8058 POST (or the unsubscribe page's own form, which sends the same
/// field) asks to unsubscribe: the body `List-Unsubscribe=One-Click`.
pub fn one_click(fields: &[(String, String)]) -> bool {
    fields.len() <= MAX_FIELDS
        && field(fields, "List-Unsubscribe").is_some_and(|v| v.eq_ignore_ascii_case("One-Click"))
}

/// Whether a form post may act: not one a browser marks as sent from another site
/// (`Sec-Fetch-Site: cross-site`), and, when it names its `Origin`, from this server's
/// own origin: the one the request was addressed to (`Host`, over `scheme`) or the public
/// base `[pepsi] LIST_WEB_URL`, or `null` when the browser says `Sec-Fetch-Site:
/// same-origin` (a page without Referer names no origin). A client that sends neither field
/// (a script, curl) is not a browser carrying someone's cookies, so it may.
pub fn same_origin(
    sec_fetch_site: Option<&str>,
    origin: Option<&str>,
    host: Option<&str>,
    scheme: &str,
    web_url: Option<&str>,
) -> bool {
    if sec_fetch_site.is_some_and(|v| v.trim().eq_ignore_ascii_case("cross-site")) {
        return false;
    }
    let Some(origin) = origin.map(str::trim) else {
        return true;
    };
    let origin = origin.to_ascii_lowercase();
    // The pages send no Referer (`Referrer-Policy: no-referrer`), so a browser names the
    // origin of their forms `null`; its `Sec-Fetch-Site: same-origin`, a field no page can
    // set, vouches for them.
    if origin == "null"
        && sec_fetch_site.is_some_and(|v| v.trim().eq_ignore_ascii_case("same-origin"))
    {
        return true;
    }
    if let Some(host) = host
        && origin == format!("{scheme}://{}", host.trim().to_ascii_lowercase())
    {
        return true;
    }
    // LIST_WEB_URL may carry a path; its origin is scheme and host.
    web_url.is_some_and(|base| {
        let base = base.to_ascii_lowercase();
        let end = base.strip_prefix("https://").map_or(base.len(), |rest| {
            "https://".len() + rest.find('/').unwrap_or(rest.len())
        });
        origin == base[..end]
    })
}

/// A confirmation or member-link token as `pepsi_contract::list::new_token` makes them:
/// `CONFIRM_TOKEN_LEN` characters of lower-case base32. Case is ignored (a mail client may
/// change it); anything else is no token, and the database is not asked.
pub fn list_token(text: &str) -> Option<String> {
    let t = text.to_ascii_lowercase();
    (t.len() == pepsi_contract::list::CONFIRM_TOKEN_LEN
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)))
    .then_some(t)
}

/// A one-click unsubscribe token (the lists' contract: 32 lower-case hex digits).
pub fn unsubscribe_token(text: &str) -> Option<String> {
    let t = text.to_ascii_lowercase();
    (t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pairs<'a> = Vec<(&'a str, &'a str)>;
    /// The address and name read, or a part of the error.
    type Want<'a> = Result<(&'a str, &'a str), &'a str>;
    /// Sec-Fetch-Site, Origin, Host, LIST_WEB_URL, and whether the post may act.
    type OriginCase<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        bool,
    );

    fn f(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(a: &str) -> Result<String, String> {
        if a.contains('@') && !a.contains(' ') {
            Ok(a.to_lowercase())
        } else {
            Err(format!("address {a:?} is not an address"))
        }
    }

    #[test]
    fn subscribe_forms_table() {
        let long_name = "n".repeat(201);
        let long_address = format!("{}@example.org", "a".repeat(250));
        let many: Vec<(&str, &str)> = vec![("x", "y"); 17];
        let cases: Vec<(Pairs, Want)> = vec![
            (
                vec![("address", "Bob@Example.org")],
                Ok(("bob@example.org", "")),
            ),
            (
                vec![("address", " bob@example.org "), ("display_name", " Bob ")],
                Ok(("bob@example.org", "Bob")),
            ),
            (vec![], Err("no address")),
            (vec![("address", "  ")], Err("no address")),
            (
                vec![("address", "not an address")],
                Err("is not an address"),
            ),
            (vec![("address", &long_address)], Err("longer than 254")),
            (
                vec![("address", "b@example.org"), ("display_name", &long_name)],
                Err("longer than 200"),
            ),
            (
                vec![("address", "b@example.org"), ("display_name", "a\nb")],
                Err("one line"),
            ),
            (many, Err("more than 16 fields")),
        ];
        for (fields, want) in cases {
            let got = subscribe(&f(&fields), check);
            match (&got, &want) {
                (Ok(s), Ok((a, n))) => {
                    assert_eq!((s.address.as_str(), s.display_name.as_str()), (*a, *n))
                }
                (Err(e), Err(part)) => assert!(e.contains(part), "{fields:?}: {e}"),
                _ => panic!("{fields:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn member_forms_table() {
        let prefs = |mode, own, hide| Preferences {
            delivery_mode: mode,
            receive_own_postings: own,
            hide_address: hide,
        };
        let cases: Vec<(Pairs, Result<MemberAct, &str>)> = vec![
            (
                vec![("member", "7"), ("do", "unsubscribe")],
                Ok(MemberAct::Unsubscribe(7)),
            ),
            (
                vec![
                    ("member", "7"),
                    ("do", "save"),
                    ("delivery_mode", "mime_digest"),
                    ("hide_address", "on"),
                ],
                Ok(MemberAct::Save(7, prefs("mime_digest", false, true))),
            ),
            (
                vec![
                    ("member", "7"),
                    ("do", "save"),
                    ("receive_own_postings", "on"),
                ],
                Ok(MemberAct::Save(7, prefs("regular", true, false))),
            ),
            (
                vec![("member", "7"), ("do", "save"), ("delivery_mode", "daily")],
                Err("delivery mode \"daily\""),
            ),
            (vec![("member", "0"), ("do", "save")], Err("above 0")),
            (vec![("member", "x"), ("do", "save")], Err("above 0")),
            (vec![("do", "save")], Err("names no subscription")),
            (vec![("member", "7")], Err("no action")),
            (vec![("member", "7"), ("do", "drop")], Err("unknown action")),
        ];
        for (fields, want) in cases {
            let got = member_act(&f(&fields));
            match (&got, &want) {
                (Ok(a), Ok(w)) => assert_eq!(a, w, "{fields:?}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{fields:?}: {e}"),
                _ => panic!("{fields:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn one_click_bodies_table() {
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[("List-Unsubscribe", "One-Click")], true),
            (&[("List-Unsubscribe", "one-click")], true),
            (&[("List-Unsubscribe", "Yes")], false),
            (&[("unsubscribe", "One-Click")], false),
            (&[], false),
        ];
        for (fields, want) in cases {
            assert_eq!(one_click(&f(fields)), *want, "{fields:?}");
        }
    }

    #[test]
    fn origins_table() {
        let web = Some("https://lists.example.org");
        let cases: &[OriginCase] = &[
            // curl, a script: neither field.
            (None, None, Some("127.0.0.1:8080"), None, true),
            (Some("same-origin"), None, Some("h"), None, true),
            (Some("cross-site"), None, Some("h"), None, false),
            (
                Some("same-origin"),
                Some("http://127.0.0.1:8080"),
                Some("127.0.0.1:8080"),
                None,
                true,
            ),
            (
                None,
                Some("https://evil.example"),
                Some("127.0.0.1:8080"),
                None,
                false,
            ),
            // Behind a proxy: the Host is the backend's, the Origin the public base's.
            (
                None,
                Some("https://lists.example.org"),
                Some("127.0.0.1:8080"),
                web,
                true,
            ),
            (
                None,
                Some("https://lists.example.org"),
                Some("x"),
                Some("https://lists.example.org/sub"),
                true,
            ),
            (
                None,
                Some("https://lists.example.org.evil.example"),
                Some("x"),
                web,
                false,
            ),
            (None, Some("null"), Some("x"), web, false),
            // A page under `Referrer-Policy: no-referrer` posting to itself, as Chromium
            // sends it; not from a sibling site.
            (Some("same-origin"), Some("null"), Some("x"), web, true),
            (Some("same-site"), Some("null"), Some("x"), web, false),
            (Some("cross-site"), Some("null"), Some("x"), web, false),
        ];
        for (site, origin, host, web, want) in cases {
            assert_eq!(
                same_origin(*site, *origin, *host, "http", *web),
                *want,
                "{site:?} {origin:?} {host:?} {web:?}"
            );
        }
    }

    #[test]
    fn token_shapes_table() {
        let t = pepsi_contract::list::new_token().unwrap();
        assert_eq!(list_token(&t), Some(t.clone()));
        assert_eq!(list_token(&t.to_uppercase()), Some(t.clone()));
        assert_eq!(list_token(&t[1..]), None);
        assert_eq!(list_token(&format!("{}1", &t[1..])), None, "1 is no base32");
        assert_eq!(list_token(&"a".repeat(2000)), None);
        let hex = "0123456789abcdef0123456789ABCDEF";
        assert_eq!(unsubscribe_token(hex), Some(hex.to_ascii_lowercase()));
        assert_eq!(unsubscribe_token(&hex[1..]), None);
        assert_eq!(unsubscribe_token(&hex.replace('0', "g")), None);
    }
}
