//! The portal's links, pure: one definition of their form, used by the stage that mails
//! them and by pepsi-httpd that serves them.
//!
//! - The recipient's link: `{base}/secure/{link_id}/{generation}/{link half}`. The half
//!   travels in the path, not in a fragment, since the server needs it to open the message
//!   and the portal runs no script; pepsi-httpd writes no request path to its log and sends
//!   `Referrer-Policy: no-referrer`, so the half goes nowhere else.
//! - The sender's link: `{base}/secure/manage/{link_id}/{manage token}`.
//!
//! `base` is `[pepsi] SECURE_LINK_URL`, the portal's public https origin.

use crate::seal::LinkHalf;

/// The longest `SECURE_LINK_URL`: a link with its half stays one line of a mail.
/// Where the portal's paths start.
pub const PREFIX: &str = "/secure";
/// Where the sender's pages start, below [`PREFIX`].
pub const MANAGE: &str = "manage";

/// `[pepsi] SECURE_LINK_URL` as stored text: `None` when unset or empty, an error naming the
/// value when it is not an `https://` URL without a path, query or trailing slash.
pub fn portal_base(value: Option<&str>) -> Result<Option<String>, String> {
    pepsi_conf::config::https_origin(
        "SECURE_LINK_URL",
        "the public base of the secure-link portal",
        value,
    )
}

/// The recipient's link to the message `link_id` of `generation`.
pub fn link_url(base: &str, link_id: &str, generation: i32, half: &LinkHalf) -> String {
    format!("{base}{PREFIX}/{link_id}/{generation}/{}", half.encode())
}

/// The sender's link to the page of the message `link_id`.
pub fn manage_url(base: &str, link_id: &str, manage_token: &str) -> String {
    format!("{base}{PREFIX}/{MANAGE}/{link_id}/{manage_token}")
}

/// Whether `text` has the form of a link id (22 characters of base64url), as the path
/// segment is checked before any lookup.
pub fn is_link_id(text: &str) -> bool {
    text.len() == 22
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_an_https_origin() {
        assert_eq!(portal_base(None), Ok(None));
        assert_eq!(portal_base(Some("  ")), Ok(None));
        assert_eq!(
            portal_base(Some(" https://mail.example.org:8443 ")),
            Ok(Some("https://mail.example.org:8443".into()))
        );
        for bad in [
            "http://mail.example.org",
            "https://",
            "https://mail.example.org/",
            "https://mail.example.org/portal",
            "https://mail.example.org?x=1",
            "https://user@mail.example.org",
            "https://mail example.org",
        ] {
            let e = portal_base(Some(bad)).unwrap_err();
            assert!(
                e.contains("SECURE_LINK_URL") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        assert!(portal_base(Some(&format!("https://{}", "a".repeat(200)))).is_err());
    }

    #[test]
    fn links_have_one_form() {
        let half = LinkHalf::from_bytes([1; 32]);
        let id = "AAAAAAAAAAAAAAAAAAAAAA";
        let link = link_url("https://m.example", id, 3, &half);
        assert_eq!(
            link,
            format!("https://m.example/secure/{id}/3/{}", half.encode())
        );
        let manage = manage_url("https://m.example", id, "tok");
        assert_eq!(manage, format!("https://m.example/secure/manage/{id}/tok"));
        assert!(is_link_id(id));
        assert!(!is_link_id("AAAA") && !is_link_id("AAAAAAAAAAAAAAAAAAAAA/"));
    }
}
