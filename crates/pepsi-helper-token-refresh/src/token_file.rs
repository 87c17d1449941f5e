//! The access-token file, both ends: what `pepsi-helper-token-refresh` writes and
//! `pepsi-stage-relay-to-smarthost` reads when it opens a connection (`AUTH_TOKEN_FILE`).
//!
//! One JSON object on one line, the token and the moment it stops being valid (RFC 3339, UTC):
//!
//! ```text
//! {"access_token":"eyJ0eXAiOi…","expires_at":"2026-12-10T14:03:27Z"}
//! ```
//!
//! Other members are ignored when read, so a later writer may add some. The file is written
//! whole and renamed into place (`store::write_atomically`), so a reader sees the old token
//! or the new one, never half of either; mode 0640, group `pepsi-token`. Pure but for
//! [`read`], which reads one bounded file and never writes.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

/// The largest token file read (an access token is a few kilobytes at most).
pub const MAX_FILE: u64 = 64 * 1024;

/// An access token and when it expires.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessToken {
    pub access_token: String,
    #[serde(with = "rfc3339")]
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken")
            .field("access_token", &"<hidden>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// `expires_at` as RFC 3339 in UTC, whole seconds (`2026-12-10T14:03:27Z`).
mod rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Secs, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| serde::de::Error::custom(format!("expires_at {text:?}: {e}")))
    }
}

impl AccessToken {
    /// The file's text: the JSON object and a newline.
    pub fn render(&self) -> String {
        let mut text = serde_json::to_string(self).expect("a token serialises");
        text.push('\n');
        text
    }

    /// The file's text read back: the object with a non-empty token of printable ASCII
    /// without spaces (what can go into an AUTH exchange) and an expiry; the error says
    /// which of those is wrong, never showing the token.
    pub fn parse(text: &[u8]) -> Result<AccessToken, String> {
        let token: AccessToken = serde_json::from_slice(text).map_err(|e| {
            format!("not a token file (a JSON object with access_token and expires_at): {e}")
        })?;
        if token.access_token.is_empty()
            || !token.access_token.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err("its access_token is empty or holds spaces, controls or non-ASCII".into());
        }
        Ok(token)
    }

    /// True once `now` reaches the expiry.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        now >= self.expires_at
    }

    /// The expiry as the file writes it.
    pub fn expires(&self) -> String {
        self.expires_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    }
}

/// Why a token file gave no usable token. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("access token file {path}: cannot read it: {error}")]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("access token file {path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error(
        "access token file {path}: the token expired at {expires_at} (pepsi-helper-token-refresh renews it before then: is its timer running, and does `pepsi-helper-token-refresh once` succeed?)"
    )]
    Expired { path: PathBuf, expires_at: String },
}

/// The token in `path`, unless it has expired by `now`.
pub fn read(path: &Path, now: DateTime<Utc>) -> Result<AccessToken, TokenFileError> {
    let token = read_any(path)?;
    if token.is_expired(now) {
        return Err(TokenFileError::Expired {
            path: path.to_owned(),
            expires_at: token.expires(),
        });
    }
    Ok(token)
}

/// The token in `path`, unless it has expired by now: what the smarthost stage reads when
/// it opens a connection.
pub fn read_now(path: &Path) -> Result<AccessToken, TokenFileError> {
    read(path, Utc::now())
}

/// The token in `path`, expired or not.
pub fn read_any(path: &Path) -> Result<AccessToken, TokenFileError> {
    let unreadable = |error| TokenFileError::Unreadable {
        path: path.to_owned(),
        error,
    };
    let mut text = Vec::new();
    std::fs::File::open(path)
        .map_err(unreadable)?
        .take(MAX_FILE + 1)
        .read_to_end(&mut text)
        .map_err(unreadable)?;
    if text.len() as u64 > MAX_FILE {
        return Err(TokenFileError::Malformed {
            path: path.to_owned(),
            reason: format!("larger than {MAX_FILE} bytes"),
        });
    }
    AccessToken::parse(&text).map_err(|reason| TokenFileError::Malformed {
        path: path.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn render_and_parse_table() {
        let token = AccessToken {
            access_token: "ya29.a0Af-x_y~z+/=".into(),
            expires_at: at("2026-12-10T14:03:27.9Z"),
        };
        let text = token.render();
        assert_eq!(
            text,
            "{\"access_token\":\"ya29.a0Af-x_y~z+/=\",\"expires_at\":\"2026-12-10T14:03:27Z\"}\n"
        );
        let back = AccessToken::parse(text.as_bytes()).unwrap();
        assert_eq!(back.access_token, token.access_token);
        assert_eq!(back.expires_at, at("2026-12-10T14:03:27Z"));

        for (text, ok) in [
            (
                r#"{"access_token":"t","expires_at":"2026-12-10T14:03:27Z"}"#,
                Some("t"),
            ),
            // another offset is the same moment; unknown members are ignored
            (
                r#"{"access_token":"t2","expires_at":"2026-12-10T15:03:27+01:00","token_type":"Bearer"}"#,
                Some("t2"),
            ),
            (r#"{"access_token":"t"}"#, None),
            (r#"{"expires_at":"2026-12-10T14:03:27Z"}"#, None),
            (r#"{"access_token":"t","expires_at":"tomorrow"}"#, None),
            (
                r#"{"access_token":"","expires_at":"2026-12-10T14:03:27Z"}"#,
                None,
            ),
            (
                r#"{"access_token":"a b","expires_at":"2026-12-10T14:03:27Z"}"#,
                None,
            ),
            ("t0k3n\n", None),
            ("", None),
        ] {
            let parsed = AccessToken::parse(text.as_bytes());
            assert_eq!(
                parsed.as_ref().ok().map(|t| t.access_token.as_str()),
                ok,
                "{text:?}: {parsed:?}"
            );
        }
        let t =
            AccessToken::parse(br#"{"access_token":"t","expires_at":"2026-12-10T15:03:27+01:00"}"#)
                .unwrap();
        assert_eq!(t.expires(), "2026-12-10T14:03:27Z");
        assert!(!t.is_expired(at("2026-12-10T14:03:26Z")));
        assert!(t.is_expired(at("2026-12-10T14:03:27Z")));
    }

    #[test]
    fn errors_name_the_file_and_never_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m365.json");
        let now = at("2026-12-10T12:00:00Z");
        let err = read(&path, now).unwrap_err().to_string();
        assert!(
            err.contains("m365.json") && err.contains("cannot read"),
            "{err}"
        );

        std::fs::write(
            &path,
            r#"{"access_token":"s3cret tok","expires_at":"2026-12-10T14:03:27Z"}"#,
        )
        .unwrap();
        let err = read(&path, now).unwrap_err().to_string();
        assert!(
            err.contains("m365.json") && !err.contains("s3cret"),
            "{err}"
        );

        std::fs::write(
            &path,
            r#"{"access_token":"s3cret","expires_at":"2026-12-10T11:59:59Z"}"#,
        )
        .unwrap();
        let err = read(&path, now).unwrap_err();
        assert!(matches!(err, TokenFileError::Expired { .. }));
        let err = err.to_string();
        assert!(
            err.contains("m365.json")
                && err.contains("expired at 2026-12-10T11:59:59Z")
                && !err.contains("s3cret"),
            "{err}"
        );
        assert_eq!(read_any(&path).unwrap().access_token, "s3cret");

        std::fs::write(&path, vec![b' '; MAX_FILE as usize + 1]).unwrap();
        let err = read(&path, now).unwrap_err().to_string();
        assert!(err.contains("larger than 65536 bytes"), "{err}");
    }
}
