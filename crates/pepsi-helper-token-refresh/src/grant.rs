//! The OAuth 2.0 refresh grant (RFC 6749 §6): a POST of `grant_type=refresh_token` to an
//! authorisation server's token endpoint, and its answer — a new access token (§5.1), or a
//! refusal with an `error` code (§5.2). The form and the reading of the answer are pure
//! ([`form`], [`read_answer`]) and tested as tables; [`refresh`] sends one request with the
//! client's deadline and reads at most [`MAX_ANSWER`] bytes of the answer.
//!
//! Never log or return a token or a secret in an error: errors carry the server's `error`
//! and `error_description`, or what was wrong with its answer.

use base64::Engine as _;
use serde::Deserialize;

/// The most of an answer read.
pub const MAX_ANSWER: usize = 64 * 1024;
/// The most of an `error_description` (or of an unexpected answer) shown.
const MAX_SHOWN: usize = 300;

/// How the client proves who it is (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// `client_id` (and `client_secret`) in the form: what Microsoft's and Google's
    /// endpoints take.
    Body,
    /// HTTP Basic with the form-encoded id and secret: what every server must take.
    Basic,
}

/// The client registered with the authorisation server.
#[derive(Clone, PartialEq, Eq)]
pub struct Client {
    pub id: String,
    pub secret: Option<String>,
    pub auth: ClientAuth,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("secret", &self.secret.as_ref().map(|_| "<hidden>"))
            .field("auth", &self.auth)
            .finish()
    }
}

/// What a successful refresh gave.
#[derive(Clone, PartialEq, Eq)]
pub struct Granted {
    pub access_token: String,
    /// Seconds the token is valid from now, when the server said (RFC 6749 recommends it).
    pub expires_in: Option<u64>,
    /// A new refresh token, when the server rotates them: the old one may no longer work.
    pub refresh_token: Option<String>,
}

impl std::fmt::Debug for Granted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Granted")
            .field("expires_in", &self.expires_in)
            .field("rotated", &self.refresh_token.is_some())
            .finish()
    }
}

/// Why a refresh gave no token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// The server refused (RFC 6749 §5.2), e.g. `invalid_grant` for a refresh token that
    /// was revoked or expired: retrying will not help until an operator acts.
    #[error("refused the refresh (HTTP {status}): {error}{}", description.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Refused {
        status: u16,
        error: String,
        description: Option<String>,
    },
    /// No answer, a deadline passed, or the server failed (5xx, 429): the next run may
    /// succeed.
    #[error("{0}")]
    Unavailable(String),
    /// An answer that is not the protocol's.
    #[error("{0}")]
    Invalid(String),
}

/// `application/x-www-form-urlencoded` (RFC 6749 Appendix B): letters, digits and `*-._`
/// as they are, a space as `+`, every other byte of the UTF-8 as `%XX`.
pub fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The request's body, and its `Authorization` header under [`ClientAuth::Basic`]:
/// `grant_type=refresh_token`, the refresh token, `scope` when given, and the client's id
/// and secret in the body under [`ClientAuth::Body`].
pub fn form(client: &Client, refresh_token: &str, scope: Option<&str>) -> (String, Option<String>) {
    let mut pairs: Vec<(&str, &str)> = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh_token),
    ];
    if let Some(scope) = scope {
        pairs.push(("scope", scope));
    }
    let header = match client.auth {
        ClientAuth::Body => {
            pairs.push(("client_id", &client.id));
            if let Some(secret) = &client.secret {
                pairs.push(("client_secret", secret));
            }
            None
        }
        ClientAuth::Basic => {
            let pair = format!(
                "{}:{}",
                form_encode(&client.id),
                form_encode(client.secret.as_deref().unwrap_or(""))
            );
            Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
        }
    };
    let body = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    (body, header)
}

#[derive(Deserialize)]
struct Success {
    access_token: String,
    token_type: String,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
    #[serde(default)]
    refresh_token: Option<String>,
}

#[derive(Deserialize)]
struct Failure {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// `text` cut to [`MAX_SHOWN`] characters, controls dropped, for a message.
fn shown(text: &str) -> String {
    let clean: String = text.chars().filter(|c| !c.is_control()).collect();
    let clean = clean.trim();
    if clean.chars().count() > MAX_SHOWN {
        clean.chars().take(MAX_SHOWN).collect::<String>() + "…"
    } else {
        clean.to_owned()
    }
}

/// The answer of HTTP status `status` with `body`: a token (200 and §5.1's JSON, token type
/// `Bearer`), a refusal (400 or 401 with §5.2's JSON), or why it is neither.
pub fn read_answer(status: u16, body: &[u8]) -> Result<Granted, GrantError> {
    if status == 429 || status >= 500 {
        return Err(GrantError::Unavailable(format!(
            "answered HTTP {status}: {}",
            shown(&String::from_utf8_lossy(body))
        )));
    }
    if status != 200 {
        return match serde_json::from_slice::<Failure>(body) {
            Ok(f) => Err(GrantError::Refused {
                status,
                error: shown(&f.error),
                description: f
                    .error_description
                    .map(|d| shown(&d))
                    .filter(|d| !d.is_empty()),
            }),
            Err(_) => Err(GrantError::Invalid(format!(
                "answered HTTP {status} without an OAuth error: {}",
                shown(&String::from_utf8_lossy(body))
            ))),
        };
    }
    let ok: Success = serde_json::from_slice(body).map_err(|e| {
        GrantError::Invalid(format!(
            "answered HTTP 200 with no token (RFC 6749 §5.1 wants access_token and token_type): {e}"
        ))
    })?;
    if !ok.token_type.eq_ignore_ascii_case("bearer") {
        return Err(GrantError::Invalid(format!(
            "answered a token of type {:?}, not Bearer",
            shown(&ok.token_type)
        )));
    }
    if ok.access_token.is_empty() || !ok.access_token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(GrantError::Invalid(
            "answered an access_token that is empty or holds spaces, controls or non-ASCII".into(),
        ));
    }
    // A number, though some servers send it as a string of digits.
    let expires_in = match ok.expires_in {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
        Some(_) => None,
    };
    if let Some(rt) = &ok.refresh_token
        && (rt.is_empty() || !rt.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(GrantError::Invalid(
            "answered a refresh_token that is empty or holds spaces, controls or non-ASCII".into(),
        ));
    }
    Ok(Granted {
        access_token: ok.access_token,
        expires_in,
        refresh_token: ok.refresh_token,
    })
}

/// One refresh at `endpoint` through `http` (which carries the deadline): the form, then
/// at most [`MAX_ANSWER`] bytes of the answer.
pub async fn refresh(
    http: &reqwest::Client,
    endpoint: &str,
    client: &Client,
    refresh_token: &str,
    scope: Option<&str>,
) -> Result<Granted, GrantError> {
    let (body, authorization) = form(client, refresh_token, scope);
    let mut request = http
        .post(endpoint)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(reqwest::header::ACCEPT, "application/json")
        .body(body);
    if let Some(value) = authorization {
        request = request.header(reqwest::header::AUTHORIZATION, value);
    }
    // reqwest's errors name the URL, never the body.
    let unavailable = |e: reqwest::Error| GrantError::Unavailable(e.without_url().to_string());
    let mut response = request.send().await.map_err(unavailable)?;
    let status = response.status().as_u16();
    let mut answer = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(unavailable)? {
        if answer.len() + chunk.len() > MAX_ANSWER {
            return Err(GrantError::Invalid(format!(
                "answered more than {MAX_ANSWER} bytes"
            )));
        }
        answer.extend_from_slice(&chunk);
    }
    read_answer(status, &answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding_table() {
        for (text, want) in [
            ("abcXYZ019", "abcXYZ019"),
            ("*-._", "*-._"),
            ("a b", "a+b"),
            ("~+/=&", "%7E%2B%2F%3D%26"),
            (
                "https://outlook.office.com/SMTP.Send offline_access",
                "https%3A%2F%2Foutlook.office.com%2FSMTP.Send+offline_access",
            ),
            ("é", "%C3%A9"),
            ("", ""),
        ] {
            assert_eq!(form_encode(text), want, "{text:?}");
        }
    }

    #[test]
    fn the_refresh_request_table() {
        let client = |auth, secret: Option<&str>| Client {
            id: "9e5f94bc-e8a4-4e73-b8be-63364c29d753".into(),
            secret: secret.map(str::to_owned),
            auth,
        };
        for (client, scope, body, header) in [
            (
                // RFC 6749 §6's example, the client in the body
                client(ClientAuth::Body, Some("s3cr+t")),
                None,
                "grant_type=refresh_token&refresh_token=tGzv3JOkF0XG5Qx2TlKWIA\
                 &client_id=9e5f94bc-e8a4-4e73-b8be-63364c29d753&client_secret=s3cr%2Bt",
                None,
            ),
            (
                // a public client: no secret; a scope
                client(ClientAuth::Body, None),
                Some("https://outlook.office.com/SMTP.Send offline_access"),
                "grant_type=refresh_token&refresh_token=tGzv3JOkF0XG5Qx2TlKWIA\
                 &scope=https%3A%2F%2Foutlook.office.com%2FSMTP.Send+offline_access\
                 &client_id=9e5f94bc-e8a4-4e73-b8be-63364c29d753",
                None,
            ),
            (
                // HTTP Basic of the form-encoded id and secret (RFC 6749 §2.3.1)
                client(ClientAuth::Basic, Some("s3cr+t")),
                None,
                "grant_type=refresh_token&refresh_token=tGzv3JOkF0XG5Qx2TlKWIA",
                // base64("9e5f94bc-e8a4-4e73-b8be-63364c29d753:s3cr%2Bt")
                Some("Basic OWU1Zjk0YmMtZThhNC00ZTczLWI4YmUtNjMzNjRjMjlkNzUzOnMzY3IlMkJ0"),
            ),
        ] {
            let (b, h) = form(&client, "tGzv3JOkF0XG5Qx2TlKWIA", scope);
            assert_eq!(b, body, "{client:?}");
            assert_eq!(h.as_deref(), header, "{client:?}");
        }
        assert!(!format!("{:?}", client(ClientAuth::Body, Some("s3cr+t"))).contains("s3cr"));
    }

    #[test]
    fn answers_table() {
        let granted = |token: &str, expires: Option<u64>, rotated: Option<&str>| Granted {
            access_token: token.into(),
            expires_in: expires,
            refresh_token: rotated.map(str::to_owned),
        };
        let refused = |status, error: &str, description: Option<&str>| GrantError::Refused {
            status,
            error: error.into(),
            description: description.map(str::to_owned),
        };
        for (status, body, want) in [
            // RFC 6749 §5.1's example
            (
                200,
                r#"{"access_token":"2YotnFZFEjr1zCsicMWpAA","token_type":"example","expires_in":3600}"#,
                Err(GrantError::Invalid(
                    "answered a token of type \"example\", not Bearer".into(),
                )),
            ),
            (
                200,
                r#"{"access_token":"2YotnFZFEjr1zCsicMWpAA","token_type":"Bearer","expires_in":3600}"#,
                Ok(granted("2YotnFZFEjr1zCsicMWpAA", Some(3600), None)),
            ),
            // Microsoft's: a rotated refresh token, extra members
            (
                200,
                r#"{"token_type":"Bearer","scope":"SMTP.Send","expires_in":4319,"ext_expires_in":4319,"access_token":"eyJ0.eyJh.c2ln","refresh_token":"0.AXEA-new"}"#,
                Ok(granted("eyJ0.eyJh.c2ln", Some(4319), Some("0.AXEA-new"))),
            ),
            (
                200,
                r#"{"access_token":"t","token_type":"bearer","expires_in":"3599"}"#,
                Ok(granted("t", Some(3599), None)),
            ),
            (
                200,
                r#"{"access_token":"t","token_type":"Bearer"}"#,
                Ok(granted("t", None, None)),
            ),
            (
                200,
                r#"{"token_type":"Bearer","expires_in":3600}"#,
                Err(GrantError::Invalid("answered HTTP 200 with no token (RFC 6749 §5.1 wants access_token and token_type): missing field `access_token` at line 1 column 41".into())),
            ),
            (
                200,
                r#"{"access_token":"a b","token_type":"Bearer"}"#,
                Err(GrantError::Invalid("answered an access_token that is empty or holds spaces, controls or non-ASCII".into())),
            ),
            // RFC 6749 §5.2
            (
                400,
                r#"{"error":"invalid_grant","error_description":"AADSTS70008: The refresh token has expired due to inactivity."}"#,
                Err(refused(400, "invalid_grant", Some("AADSTS70008: The refresh token has expired due to inactivity."))),
            ),
            (
                401,
                r#"{"error":"invalid_client"}"#,
                Err(refused(401, "invalid_client", None)),
            ),
            (
                400,
                "<html>Bad Request</html>",
                Err(GrantError::Invalid(
                    "answered HTTP 400 without an OAuth error: <html>Bad Request</html>".into(),
                )),
            ),
            (
                503,
                "down for maintenance\n",
                Err(GrantError::Unavailable("answered HTTP 503: down for maintenance".into())),
            ),
            (
                429,
                "",
                Err(GrantError::Unavailable("answered HTTP 429: ".into())),
            ),
        ] {
            assert_eq!(read_answer(status, body.as_bytes()), want, "{status} {body}");
        }
        let e = refused(400, "invalid_grant", Some("revoked")).to_string();
        assert_eq!(e, "refused the refresh (HTTP 400): invalid_grant: revoked");
        let long = format!(
            r#"{{"error":"invalid_grant","error_description":"{}"}}"#,
            "x".repeat(1000)
        );
        let Err(GrantError::Refused { description, .. }) = read_answer(400, long.as_bytes()) else {
            panic!("refused");
        };
        assert_eq!(description.unwrap().chars().count(), MAX_SHOWN + 1);
    }
}
