//! The pure part of the secure-link portal: the paths' segments read, a refusal's status
//! and words, the reply form's bounds, the session cookie. No I/O; tested as tables.

use axum::http::StatusCode;
use pepsi_secure_link::seal::LinkHalf;
use pepsi_secure_link::store::Refusal;

/// The longest reply text the portal takes, in bytes.
pub const MAX_REPLY: usize = 64 * 1024;
/// The most fields a form of the portal may post.
const MAX_FIELDS: usize = 4;
/// The session cookie of a recipient.
pub const COOKIE: &str = "pepsi_secure";

/// A recipient's link as its path names it: `{link_id}/{generation}/{half}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPath {
    pub link_id: String,
    pub generation: i32,
    pub half: LinkHalf,
}

impl LinkPath {
    /// The three segments read, or `None` when one is not of its form.
    pub fn parse(link_id: &str, generation: &str, half: &str) -> Option<LinkPath> {
        if !pepsi_secure_link::url::is_link_id(link_id) {
            return None;
        }
        let generation = generation
            .parse::<i32>()
            .ok()
            .filter(|g| *g >= 1 && !generation.starts_with('+'))?;
        Some(LinkPath {
            link_id: link_id.to_owned(),
            generation,
            half: LinkHalf::parse(half).ok()?,
        })
    }

    /// The path of the link's page, for forms and redirects.
    pub fn path(&self) -> String {
        pepsi_secure_link::url::link_url("", &self.link_id, self.generation, &self.half)
    }

    /// The path the session cookie is limited to.
    pub fn cookie_path(&self) -> String {
        format!("{}/{}", pepsi_secure_link::url::PREFIX, self.link_id)
    }
}

/// The status and the words of a page refusing for `r`.
pub fn refusal(r: Refusal) -> (StatusCode, &'static str, String) {
    let (status, title) = match r {
        Refusal::Unknown | Refusal::WrongKey => (StatusCode::NOT_FOUND, "Link not found"),
        Refusal::Expired => (StatusCode::GONE, "Link expired"),
        Refusal::Revoked => (StatusCode::GONE, "Link withdrawn"),
        Refusal::Purged => (StatusCode::GONE, "Message deleted"),
        Refusal::Superseded => (StatusCode::GONE, "Link replaced"),
        Refusal::TooManyCodes => (StatusCode::TOO_MANY_REQUESTS, "Too many codes"),
        Refusal::NoCode
        | Refusal::CodeExpired
        | Refusal::WrongCode { .. }
        | Refusal::Locked
        | Refusal::NoSession => (StatusCode::FORBIDDEN, "Code needed"),
    };
    let text = match r {
        Refusal::Unknown | Refusal::WrongKey => {
            "This link is not known here, or it is incomplete. Copy the whole link from the \
             message you received."
                .to_owned()
        }
        Refusal::Expired => "This link has expired: the message can no longer be read. Ask \
                             its sender to send it again."
            .to_owned(),
        Refusal::Revoked => {
            "The sender withdrew this message: it can no longer be read.".to_owned()
        }
        Refusal::Purged => "This message was deleted: it can no longer be read.".to_owned(),
        Refusal::Superseded => "A newer link to this message was sent to you: only the \
                                latest link works. Look for the newest notice."
            .to_owned(),
        other => {
            let mut t = other.to_string();
            if let Some(first) = t.get_mut(..1) {
                first.make_ascii_uppercase();
            }
            t.push('.');
            t
        }
    };
    (status, title, text)
}

/// The reply a form posts: its text, bounded, with line ends made CRLF. An error names
/// what is wrong.
pub fn reply_text(fields: &[(String, String)]) -> Result<String, String> {
    if fields.len() > MAX_FIELDS {
        return Err(format!("the form has more than {MAX_FIELDS} fields"));
    }
    let text = fields
        .iter()
        .find(|(k, _)| k == "text")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    if text.trim().is_empty() {
        return Err("the reply is empty".into());
    }
    if text.len() > MAX_REPLY {
        return Err(format!("the reply is longer than {} KiB", MAX_REPLY / 1024));
    }
    if text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\r' | '\n' | '\t'))
    {
        return Err("the reply holds control characters".into());
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.replace("\r\n", "\n").replace('\r', "\n").split('\n') {
        out.push_str(line);
        out.push_str("\r\n");
    }
    Ok(out)
}

/// The code a form posts, at most `code::MAX_INPUT` bytes (the store normalises it).
pub fn typed_code(fields: &[(String, String)]) -> Result<&str, String> {
    if fields.len() > MAX_FIELDS {
        return Err(format!("the form has more than {MAX_FIELDS} fields"));
    }
    let code = fields
        .iter()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.trim())
        .unwrap_or_default();
    if code.is_empty() {
        return Err("enter the code from the message we sent".into());
    }
    if code.len() > pepsi_secure_link::code::MAX_INPUT {
        return Err("that is not a code: a code is 8 digits".into());
    }
    Ok(code)
}

/// The `Set-Cookie` value of a session for `link`, for `max_age` seconds.
pub fn session_cookie(link: &LinkPath, token: &str, max_age: i64, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path={}; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        link.cookie_path(),
        if secure { "; Secure" } else { "" }
    )
}

/// Whether `value` can be a session token (43 characters of base64url), before any lookup.
pub fn is_token(value: &str) -> bool {
    value.len() == 43
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "AAAAAAAAAAAAAAAAAAAAAA";

    #[test]
    fn link_paths_are_read_strictly() {
        let half = LinkHalf::from_bytes([9; 32]).encode();
        let ok = LinkPath::parse(ID, "2", &half).unwrap();
        assert_eq!(ok.generation, 2);
        assert_eq!(ok.path(), format!("/secure/{ID}/2/{half}"));
        assert_eq!(ok.cookie_path(), format!("/secure/{ID}"));
        for (id, g, h) in [
            ("short", "1", half.as_str()),
            (ID, "0", half.as_str()),
            (ID, "-1", half.as_str()),
            (ID, "+1", half.as_str()),
            (ID, "x", half.as_str()),
            (ID, "99999999999", half.as_str()),
            (ID, "1", "short"),
            (ID, "1", ""),
        ] {
            assert_eq!(LinkPath::parse(id, g, h), None, "{id} {g} {h}");
        }
    }

    #[test]
    fn refusals_have_a_status_and_plain_words() {
        let cases = [
            (Refusal::Unknown, StatusCode::NOT_FOUND, "incomplete"),
            (Refusal::WrongKey, StatusCode::NOT_FOUND, "incomplete"),
            (Refusal::Expired, StatusCode::GONE, "expired"),
            (Refusal::Revoked, StatusCode::GONE, "withdrew"),
            (Refusal::Purged, StatusCode::GONE, "deleted"),
            (
                Refusal::Superseded,
                StatusCode::GONE,
                "only the latest link",
            ),
            (
                Refusal::TooManyCodes,
                StatusCode::TOO_MANY_REQUESTS,
                "last hour",
            ),
            (
                Refusal::WrongCode { left: 3 },
                StatusCode::FORBIDDEN,
                "Wrong code; 3 tries left.",
            ),
            (
                Refusal::Locked,
                StatusCode::FORBIDDEN,
                "Too many wrong codes",
            ),
        ];
        for (r, status, words) in cases {
            let (s, _, text) = refusal(r);
            assert_eq!(s, status, "{r:?}");
            assert!(text.contains(words), "{r:?}: {text}");
        }
    }

    #[test]
    fn replies_are_bounded_and_get_crlf() {
        let f = |v: &str| vec![("text".to_owned(), v.to_owned())];
        assert_eq!(
            reply_text(&f("Thanks,\nBob")).unwrap(),
            "Thanks,\r\nBob\r\n"
        );
        assert_eq!(reply_text(&f("a\r\nb\rc")).unwrap(), "a\r\nb\r\nc\r\n");
        for (v, err) in [
            ("", "empty"),
            ("  \n ", "empty"),
            ("a\u{0}b", "control"),
            (&"x".repeat(MAX_REPLY + 1), "64 KiB"),
        ] {
            assert!(reply_text(&f(v)).unwrap_err().contains(err), "{err}");
        }
        let many: Vec<(String, String)> = (0..5).map(|i| (format!("f{i}"), "v".into())).collect();
        assert!(reply_text(&many).unwrap_err().contains("fields"));
        let c = |v: &str| vec![("code".to_owned(), v.to_owned())];
        assert_eq!(typed_code(&c(" 1234 5678 ")).unwrap(), "1234 5678");
        assert!(typed_code(&c("")).unwrap_err().contains("enter the code"));
        assert!(typed_code(&c(&"1".repeat(40))).is_err());
    }

    #[test]
    fn the_cookie_is_the_links_alone() {
        let link = LinkPath::parse(ID, "1", &LinkHalf::from_bytes([1; 32]).encode()).unwrap();
        let tok = "t".repeat(43);
        assert!(is_token(&tok) && !is_token("t") && !is_token(&"t;".repeat(22)[..43]));
        assert_eq!(
            session_cookie(&link, &tok, 1800, true),
            format!(
                "pepsi_secure={tok}; Path=/secure/{ID}; Max-Age=1800; HttpOnly; SameSite=Lax; Secure"
            )
        );
        assert!(!session_cookie(&link, &tok, 1, false).contains("Secure"));
    }
}
