//! One account's refresh: whether its access token is due ([`why_refresh`], pure), and
//! the run that reads its refresh token, asks the token endpoint and stores what came back
//! ([`refresh_account`]), under the account's lock.

use std::io::Read as _;
use std::path::Path;

use chrono::{DateTime, Utc};

use crate::account::{Account, DEFAULT_LIFETIME};
use crate::grant::{self, GrantError};
use crate::store;
use crate::token_file::{self, AccessToken};

/// The largest refresh token file read.
pub const MAX_REFRESH_TOKEN_FILE: u64 = 16 * 1024;

/// Why the account's token is to be refreshed now, or `None` while it stays valid longer
/// than `refresh_before`. `current` is the token file as read (or why it could not be).
pub fn why_refresh(
    current: &Result<AccessToken, String>,
    now: DateTime<Utc>,
    refresh_before: std::time::Duration,
    force: bool,
) -> Option<String> {
    let token = match current {
        Err(why) => return Some(format!("no usable token yet ({why})")),
        Ok(token) => token,
    };
    if force {
        return Some("asked to (--force)".into());
    }
    let before = chrono::Duration::from_std(refresh_before).unwrap_or(chrono::Duration::MAX);
    if token.is_expired(now) {
        Some(format!("it expired at {}", token.expires()))
    } else if token.expires_at - now <= before {
        Some(format!(
            "it expires at {}, within REFRESH_BEFORE ({}s)",
            token.expires(),
            refresh_before.as_secs()
        ))
    } else {
        None
    }
}

/// The refresh token in `path`: its one line, trimmed, of printable ASCII.
pub fn read_refresh_token(path: &Path) -> Result<String, String> {
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_REFRESH_TOKEN_FILE + 1).read_to_end(&mut text))
        .map_err(|e| format!("refresh token file {}: cannot read it: {e}", path.display()))?;
    let bad = |why: &str| format!("refresh token file {}: {why}", path.display());
    if text.len() as u64 > MAX_REFRESH_TOKEN_FILE {
        return Err(bad(&format!("larger than {MAX_REFRESH_TOKEN_FILE} bytes")));
    }
    let token = std::str::from_utf8(&text)
        .map(str::trim)
        .map_err(|_| bad("not text"))?;
    if token.is_empty() {
        return Err(bad(
            "empty: put the refresh token the provider's consent flow gave in it",
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "not one token: spaces, line breaks, controls or non-ASCII in it",
        ));
    }
    Ok(token.to_owned())
}

/// What became of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its token is valid for longer than REFRESH_BEFORE: nothing done.
    Fresh { expires_at: String },
    /// A new token was stored; `rotated`: a new refresh token too.
    Refreshed {
        expires_at: String,
        why: String,
        rotated: bool,
    },
}

/// Why an account's refresh failed: the account, and what went wrong (the endpoint and
/// the server's `error` and `error_description` for a refusal).
#[derive(Debug, thiserror::Error)]
#[error("account {account}: {detail}")]
pub struct AccountError {
    pub account: String,
    pub detail: String,
    /// True when the server refused (RFC 6749 §5.2): an operator must act.
    pub refused: bool,
}

/// The HTTP client of one account: its deadline, its CA file, HTTPS only, no redirect.
fn http_client(account: &Account) -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(account.timeout)
        .connect_timeout(account.timeout)
        .https_only(true)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!(
            "pepsi-helper-token-refresh/",
            env!("CARGO_PKG_VERSION")
        ));
    if let Some(path) = &account.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| format!("TLS_CA_FILE {}: cannot read it: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("TLS_CA_FILE {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "TLS_CA_FILE {}: holds no PEM certificate",
                path.display()
            ));
        }
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| format!("HTTP client: {e}"))
}

/// Refreshes `account`'s access token when it is due (or `force`), under its lock: the
/// refresh grant with its refresh token, then the rotated refresh token (when the server
/// sent one) and the access token stored, each replaced whole.
pub async fn refresh_account(account: &Account, force: bool) -> Result<Outcome, AccountError> {
    let fail = |detail: String, refused: bool| AccountError {
        account: account.name.clone(),
        detail,
        refused,
    };
    let _lock = store::lock(&account.refresh_token_file).map_err(|e| fail(e.to_string(), false))?;
    // Read under the lock: another run may have refreshed while this one waited.
    let current = token_file::read_any(&account.token_file).map_err(|e| e.to_string());
    let Some(why) = why_refresh(&current, Utc::now(), account.refresh_before, force) else {
        let expires_at = current.map(|t| t.expires()).unwrap_or_default();
        tracing::debug!(account = %account.name, %expires_at, "fresh");
        return Ok(Outcome::Fresh { expires_at });
    };
    tracing::debug!(account = %account.name, "refreshing: {why}");
    let refresh_token =
        read_refresh_token(&account.refresh_token_file).map_err(|e| fail(e, false))?;
    let http = http_client(account).map_err(|e| fail(e, false))?;
    let asked = Utc::now();
    let granted = grant::refresh(
        &http,
        &account.endpoint,
        &account.client,
        &refresh_token,
        account.scope.as_deref(),
    )
    .await
    .map_err(|e| {
        let refused = matches!(e, GrantError::Refused { .. });
        fail(format!("token endpoint {}: {e}", account.endpoint), refused)
    })?;
    // A rotated refresh token first: the old one may be spent already.
    let rotated = granted
        .refresh_token
        .as_ref()
        .filter(|new| **new != refresh_token);
    if let Some(new) = rotated {
        store::write_atomically(
            &account.refresh_token_file,
            format!("{new}\n").as_bytes(),
            store::REFRESH_TOKEN_MODE,
        )
        .map_err(|e| {
            fail(
                format!("the provider rotated the refresh token, and storing it failed: {e}"),
                false,
            )
        })?;
    }
    // The lifetime counts from when the request went out, so the file never claims more.
    let lifetime = granted
        .expires_in
        .map(std::time::Duration::from_secs)
        .unwrap_or(DEFAULT_LIFETIME);
    let token = AccessToken {
        access_token: granted.access_token,
        expires_at: asked + chrono::Duration::from_std(lifetime).unwrap_or(chrono::Duration::MAX),
    };
    store::write_atomically(
        &account.token_file,
        token.render().as_bytes(),
        store::ACCESS_TOKEN_MODE,
    )
    .map_err(|e| fail(e.to_string(), false))?;
    Ok(Outcome::Refreshed {
        expires_at: token.expires(),
        why,
        rotated: rotated.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn when_a_token_is_due_table() {
        let token = |expires: &str| {
            Ok(AccessToken {
                access_token: "t".into(),
                expires_at: at(expires),
            })
        };
        let now = at("2026-12-10T12:00:00Z");
        let ten = Duration::from_secs(600);
        for (current, force, want) in [
            (token("2026-12-10T13:00:00Z"), false, None),
            (token("2026-12-10T12:10:01Z"), false, None),
            (
                token("2026-12-10T12:10:00Z"),
                false,
                Some("it expires at 2026-12-10T12:10:00Z, within REFRESH_BEFORE (600s)"),
            ),
            (
                token("2026-12-10T12:00:00Z"),
                false,
                Some("it expired at 2026-12-10T12:00:00Z"),
            ),
            (
                token("2026-12-10T13:00:00Z"),
                true,
                Some("asked to (--force)"),
            ),
            (
                Err("access token file /t/x.json: cannot read it: No such file".into()),
                false,
                Some(
                    "no usable token yet (access token file /t/x.json: cannot read it: No such file)",
                ),
            ),
        ] {
            assert_eq!(
                why_refresh(&current, now, ten, force).as_deref(),
                want,
                "{current:?} {force}"
            );
        }
    }

    #[test]
    fn refresh_token_files_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m365.refresh");
        for (text, want) in [
            ("0.AXEA-abc_DEF\n", Ok("0.AXEA-abc_DEF")),
            ("  1//0gxyz  \r\n", Ok("1//0gxyz")),
            ("", Err("empty: put the refresh token")),
            ("\n\n", Err("empty")),
            ("a b\n", Err("not one token")),
            ("one\ntwo\n", Err("not one token")),
        ] {
            std::fs::write(&path, text).unwrap();
            let got = read_refresh_token(&path);
            match (got, want) {
                (Ok(t), Ok(w)) => assert_eq!(t, w),
                (Err(e), Err(w)) => {
                    assert!(e.contains(w) && e.contains("m365.refresh"), "{e}");
                    assert!(!e.contains("two"), "the error never shows the token: {e}");
                }
                (got, want) => panic!("{text:?}: {got:?}, wanted {want:?}"),
            }
        }
        let err = read_refresh_token(&dir.path().join("none")).unwrap_err();
        assert!(err.contains("cannot read it"), "{err}");
    }
}
