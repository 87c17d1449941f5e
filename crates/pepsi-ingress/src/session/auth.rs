//! AUTH PLAIN and LOGIN (RFC 4954, RFC 4616) against the mailbox account store. Refused
//! before TLS unless the listener explicitly allows it, since both send the password as is.

use super::Session;
use super::conn::{End, Line};
use crate::accounts::{AuthError, verify_password};
use pepsi_smtp::Reply;
use pepsi_smtp::params::{base64_decode, base64_encode};

/// Longest SASL response line we read (RFC 4954 §4 asks for at least 12288).
const MAX_RESPONSE: usize = 12288;

/// How a client's credentials came out of the SASL exchange.
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials {
    Given { user: String, password: Vec<u8> },
    Malformed(&'static str),
}

/// Decodes a PLAIN response: `authzid NUL authcid NUL password`. Acting as another user
/// (an authzid different from the authcid) is not offered.
pub fn plain(response: &str) -> Credentials {
    let Some(bytes) = base64_decode(response) else {
        return Credentials::Malformed("response is not base64");
    };
    let parts: Vec<&[u8]> = bytes.split(|&b| b == 0).collect();
    let [authz, user, password] = parts.as_slice() else {
        return Credentials::Malformed("expected authzid, authcid and password separated by NUL");
    };
    let Ok(user) = std::str::from_utf8(user) else {
        return Credentials::Malformed("user name is not UTF-8");
    };
    if user.is_empty() {
        return Credentials::Malformed("empty user name");
    }
    if !authz.is_empty() && *authz != user.as_bytes() {
        return Credentials::Malformed("authorization identity differs from the user");
    }
    Credentials::Given {
        user: user.to_owned(),
        password: password.to_vec(),
    }
}

impl Session {
    pub(super) async fn auth(
        &mut self,
        mechanism: String,
        initial: Option<String>,
    ) -> Result<Reply, End> {
        if !self.listener.config.auth {
            return Ok(Reply::new(
                502,
                "5.5.1",
                "AUTH is not offered on this listener",
            ));
        }
        if self.auth_user.is_some() {
            return Ok(Reply::new(503, "5.5.1", "already authenticated"));
        }
        if self.in_transaction() {
            return Ok(Reply::new(
                503,
                "5.5.1",
                "AUTH is not allowed during a mail transaction",
            ));
        }
        if self.helo.is_none() {
            return Ok(Reply::new(503, "5.5.1", "send EHLO first"));
        }
        if self.tls.is_none() && !self.listener.config.plaintext_auth {
            return Ok(Reply::new(
                538,
                "5.7.11",
                "encryption required: use STARTTLS before AUTH",
            ));
        }
        let credentials = match mechanism.as_str() {
            "PLAIN" => {
                let response = match initial {
                    // "=" is an empty initial response (RFC 4954 §4).
                    Some(r) if r == "=" => String::new(),
                    Some(r) => r,
                    None => match self.challenge("").await? {
                        Some(r) => r,
                        None => return Ok(cancelled()),
                    },
                };
                plain(&response)
            }
            "LOGIN" => {
                let user = match initial {
                    Some(r) => Some(r),
                    None => self.challenge(&base64_encode(b"Username:")).await?,
                };
                let Some(user) = user else {
                    return Ok(cancelled());
                };
                let Some(password) = self.challenge(&base64_encode(b"Password:")).await? else {
                    return Ok(cancelled());
                };
                match (base64_decode(&user), base64_decode(&password)) {
                    (Some(u), Some(p)) => match String::from_utf8(u) {
                        Ok(user) if !user.is_empty() => Credentials::Given { user, password: p },
                        _ => Credentials::Malformed("user name is empty or not UTF-8"),
                    },
                    _ => Credentials::Malformed("response is not base64"),
                }
            }
            other => {
                return Ok(Reply::new(
                    504,
                    "5.5.4",
                    format!("mechanism {other} is not supported; use PLAIN or LOGIN"),
                ));
            }
        };
        Ok(match credentials {
            Credentials::Malformed(why) => Reply::new(501, "5.5.2", why),
            Credentials::Given { user, password } => {
                let s = &self.settings;
                let client = crate::limits::client_network(
                    self.peer.ip(),
                    s.client_prefix_v4,
                    s.client_prefix_v6,
                )
                .to_string();
                let account = user.to_lowercase();
                // Each attempt counts as a failure of the client network and the account
                // from here on, before the password is checked, so sessions trying at the
                // same time cannot all pass the limit together; a login that does not
                // fail gives the counts back when the attempts are dropped.
                let shared = &self.shared;
                let attempts = shared.auth_client_failures.reserve(&client).and_then(|c| {
                    shared
                        .auth_account_failures
                        .reserve(&account)
                        .map(|a| (c, a))
                });
                let Some((client_attempt, account_attempt)) = attempts else {
                    tracing::info!(peer = %self.peer, user = ?account, "login refused: too many failed logins (AUTH_FAILURES_PER_CLIENT / _PER_ACCOUNT)");
                    return Ok(Reply::new(
                        454,
                        "4.7.0",
                        "too many failed logins, try again later",
                    ));
                };
                // Argon2id is slow on purpose: at most AUTH_CONCURRENCY checks run at once.
                let Ok(_permit) = self.shared.auth_checks.acquire().await else {
                    return Ok(Reply::new(454, "4.7.0", "temporary authentication failure"));
                };
                let verdict = match tokio::time::timeout(
                    self.settings.lookup_timeout,
                    verify_password(&self.shared.pool, &user, &password),
                )
                .await
                {
                    Ok(verdict) => verdict,
                    Err(_) => Err(AuthError::TimedOut(self.settings.lookup_timeout)),
                };
                if matches!(verdict, Err(AuthError::Invalid(_))) {
                    client_attempt.failed();
                    account_attempt.failed();
                } else {
                    drop((client_attempt, account_attempt));
                }
                match verdict {
                    Ok(account) => {
                        tracing::info!(peer = %self.peer, user = %account, "authenticated");
                        self.auth_user = Some(account);
                        Reply::new(235, "2.7.0", "authentication succeeded")
                    }
                    Err(AuthError::Invalid(name)) => {
                        // The client chose this name: logged escaped, so a newline in it
                        // cannot start a forged log line.
                        tracing::info!(peer = %self.peer, user = ?name, "authentication failed");
                        Reply::new(535, "5.7.8", "authentication credentials invalid")
                    }
                    Err(e @ (AuthError::Temporary(_) | AuthError::TimedOut(_))) => {
                        tracing::warn!("account store: {e}");
                        Reply::new(454, "4.7.0", "temporary authentication failure")
                    }
                }
            }
        })
    }

    /// Sends a 334 challenge and reads the answer; None when the client cancels with `*`.
    async fn challenge(&mut self, text: &str) -> Result<Option<String>, End> {
        self.conn.reply(&Reply::plain(334, vec![text.to_owned()]));
        let timeout = self.settings.command_timeout;
        match self.conn.line(MAX_RESPONSE, timeout).await? {
            Line::Text(t) if t == b"*" => Ok(None),
            Line::Text(t) => Ok(Some(String::from_utf8_lossy(&t).into_owned())),
            Line::TooLong => Ok(Some(String::from("!"))),
        }
    }
}

fn cancelled() -> Reply {
    Reply::new(501, "5.0.0", "authentication cancelled")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_table() {
        let given = |u: &str, p: &str| Credentials::Given {
            user: u.into(),
            password: p.as_bytes().to_vec(),
        };
        let cases = [
            (
                base64_encode(b"\0alice@example.test\0secret"),
                given("alice@example.test", "secret"),
            ),
            (base64_encode(b"alice\0alice\0pw"), given("alice", "pw")),
            (
                base64_encode(b"bob\0alice\0pw"),
                Credentials::Malformed("authorization identity differs from the user"),
            ),
            (
                base64_encode(b"\0\0pw"),
                Credentials::Malformed("empty user name"),
            ),
            (
                base64_encode(b"alice\0pw"),
                Credentials::Malformed("expected authzid, authcid and password separated by NUL"),
            ),
            (
                "!!".to_owned(),
                Credentials::Malformed("response is not base64"),
            ),
            (
                String::new(),
                Credentials::Malformed("expected authzid, authcid and password separated by NUL"),
            ),
        ];
        for (response, expected) in cases {
            assert_eq!(plain(&response), expected, "{response:?}");
        }
    }
}
