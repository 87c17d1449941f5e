//! SMTP AUTH (RFC 4954) for the mechanisms smarthosts ask for. With a password: PLAIN
//! (RFC 4616), sent with its initial response, else LOGIN. With an OAuth 2.0 access token
//! (a bearer token, RFC 6750): OAUTHBEARER (RFC 7628), else XOAUTH2 (the older form Google
//! and Microsoft 365 still offer). Pure, no I/O: which mechanism, and the lines to send.

use crate::caps::Capabilities;
use crate::reply::Reply;

/// A mechanism this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Login,
    OAuthBearer,
    XOAuth2,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Login => "LOGIN",
            Mechanism::OAuthBearer => "OAUTHBEARER",
            Mechanism::XOAuth2 => "XOAUTH2",
        }
    }
}

/// What a client logs in with, which decides the mechanisms it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secret {
    Password,
    /// An OAuth 2.0 access token.
    BearerToken,
}

impl Secret {
    /// The mechanisms this client speaks for the secret, in the order it prefers them.
    pub fn mechanisms(self) -> &'static [Mechanism] {
        match self {
            Secret::Password => &[Mechanism::Plain, Mechanism::Login],
            Secret::BearerToken => &[Mechanism::OAuthBearer, Mechanism::XOAuth2],
        }
    }

    /// "password", "access token": how messages name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Secret::Password => "password",
            Secret::BearerToken => "access token",
        }
    }
}

/// The first of `secret`'s mechanisms (PLAIN before LOGIN: one round trip; OAUTHBEARER, the
/// standard, before XOAUTH2) that the peer offers; `None` when it offers none of them.
pub fn choose(caps: &Capabilities, secret: Secret) -> Option<Mechanism> {
    secret
        .mechanisms()
        .iter()
        .copied()
        .find(|m| caps.auth.iter().any(|a| a == m.as_str()))
}

/// `AUTH PLAIN <base64(NUL user NUL password)>` CRLF, with an empty authorization identity.
pub fn plain_command(username: &str, password: &str) -> String {
    let mut raw = Vec::with_capacity(username.len() + password.len() + 2);
    raw.push(0);
    raw.extend_from_slice(username.as_bytes());
    raw.push(0);
    raw.extend_from_slice(password.as_bytes());
    format!("AUTH PLAIN {}\r\n", crate::encoding::base64_encode(&raw))
}

/// One base64 line answering a 334 challenge.
pub fn response_line(text: &str) -> String {
    format!("{}\r\n", crate::encoding::base64_encode(text.as_bytes()))
}

/// The separator of OAUTHBEARER's and XOAUTH2's key-value pairs (`^A`).
const KVSEP: u8 = 0x01;

/// The OAUTHBEARER initial client response (RFC 7628 §3.1): the GS2 header naming the user
/// as authorization identity (`n,a=<user>,`, `,` and `=` escaped as `=2C` and `=3D`), then
/// `host=` and `port=` when the connection has them, `auth=Bearer <token>`, each pair ended
/// by `^A`, and a final `^A`.
pub fn oauthbearer_response(
    username: &str,
    token: &str,
    host: Option<&str>,
    port: Option<u16>,
) -> Vec<u8> {
    let user = username.replace('=', "=3D").replace(',', "=2C");
    let mut raw = format!("n,a={user},").into_bytes();
    raw.push(KVSEP);
    if let Some(host) = host {
        raw.extend_from_slice(format!("host={host}").as_bytes());
        raw.push(KVSEP);
    }
    if let Some(port) = port {
        raw.extend_from_slice(format!("port={port}").as_bytes());
        raw.push(KVSEP);
    }
    raw.extend_from_slice(format!("auth=Bearer {token}").as_bytes());
    raw.push(KVSEP);
    raw.push(KVSEP);
    raw
}

/// The XOAUTH2 initial client response (Google's and Microsoft's definition):
/// `user=<user>^Aauth=Bearer <token>^A^A`.
pub fn xoauth2_response(username: &str, token: &str) -> Vec<u8> {
    let mut raw = format!("user={username}").into_bytes();
    raw.push(KVSEP);
    raw.extend_from_slice(format!("auth=Bearer {token}").as_bytes());
    raw.push(KVSEP);
    raw.push(KVSEP);
    raw
}

/// The longest command line, CRLF included (RFC 5321 §4.5.3.1.4), which an AUTH command
/// with its initial response must fit (RFC 4954 §4).
pub const MAX_COMMAND_LINE: usize = 512;

/// How AUTH `mechanism` starts with `initial` as its first response: `AUTH <mechanism>
/// <base64>` CRLF when that fits in [`MAX_COMMAND_LINE`]; else (an access token is often
/// a JWT of a kilobyte or more) `AUTH <mechanism>` CRLF alone, and the base64 line, second,
/// answers the server's empty `334` challenge, as RFC 4954 §4 requires.
pub fn initial_lines(mechanism: Mechanism, initial: &[u8]) -> (String, Option<String>) {
    let encoded = crate::encoding::base64_encode(initial);
    let one = format!("AUTH {} {encoded}\r\n", mechanism.as_str());
    if one.len() <= MAX_COMMAND_LINE {
        (one, None)
    } else {
        (
            format!("AUTH {}\r\n", mechanism.as_str()),
            Some(format!("{encoded}\r\n")),
        )
    }
}

/// What the client answers a server's error challenge with, so the server can end the
/// exchange with its final (failure) reply: a single `^A` for OAUTHBEARER (RFC 7628
/// §3.2.3), an empty response for XOAUTH2.
pub fn abort_line(mechanism: Mechanism) -> &'static str {
    match mechanism {
        Mechanism::OAuthBearer => "AQ==\r\n",
        _ => "\r\n",
    }
}

/// The most of a server's error challenge kept for messages.
pub const MAX_ERROR_CHALLENGE: usize = 300;

/// The text of a server's error challenge after a refused access token: the base64 of a
/// `334` reply decoded (RFC 7628 §3.2.2: JSON such as `{"status":"invalid_token",…}`), its
/// control characters dropped and at most [`MAX_ERROR_CHALLENGE`] characters kept; the
/// reply's text as it is when it is not base64.
pub fn error_challenge(reply: &Reply) -> String {
    let text = reply.text();
    let decoded = crate::encoding::base64_decode(text.trim())
        .map(|raw| String::from_utf8_lossy(&raw).into_owned())
        .unwrap_or(text);
    let mut shown: String = decoded
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_ERROR_CHALLENGE + 1)
        .collect();
    if shown.chars().count() > MAX_ERROR_CHALLENGE {
        shown = shown.chars().take(MAX_ERROR_CHALLENGE).collect::<String>() + "…";
    }
    if shown.is_empty() {
        "(empty)".to_owned()
    } else {
        shown
    }
}

/// Whether `token` can travel as a bearer token (RFC 6750 §2.1, b64token: letters, digits,
/// `-._~+/`, then `=` padding only), so it cannot break the `^A`-separated response.
pub fn is_bearer_token(token: &str) -> bool {
    let body = token.trim_end_matches('=');
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_table() {
        for (raw, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(
                crate::encoding::base64_encode(raw.as_bytes()),
                encoded,
                "{raw:?}"
            );
        }
        assert_eq!(crate::encoding::base64_encode(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn plain_and_login_lines() {
        // RFC 4616 §4 example: "\0tim\0tanstaaftanstaaf"
        assert_eq!(
            plain_command("tim", "tanstaaftanstaaf"),
            "AUTH PLAIN AHRpbQB0YW5zdGFhZnRhbnN0YWFm\r\n"
        );
        assert_eq!(response_line("user"), "dXNlcg==\r\n");
    }

    /// The token of RFC 7628's examples.
    const RFC_TOKEN: &str = "vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==";

    #[test]
    fn bearer_responses_byte_for_byte() {
        let b64 = crate::encoding::base64_encode;
        let table: [(&str, Vec<u8>, &[u8], &str); 4] = [
            (
                // RFC 7628 §4.1 (IMAP): host and port given.
                "oauthbearer, RFC 7628 §4.1",
                oauthbearer_response(
                    "user@example.com",
                    RFC_TOKEN,
                    Some("server.example.com"),
                    Some(143),
                ),
                b"n,a=user@example.com,\x01host=server.example.com\x01port=143\x01\
                  auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==\x01\x01",
                "bixhPXVzZXJAZXhhbXBsZS5jb20sAWhvc3Q9c2VydmVyLmV4YW1wbGUuY29tAXBvcnQ9MTQzAWF1dGg9\
                 QmVhcmVyIHZGOWRmdDRxbVRjMk52YjNSbGNrQmhiSFJoZG1semRHRXVZMjl0Q2c9PQEB",
            ),
            (
                // RFC 7628 §4.2 and §4.3 (SMTP, the submission port).
                "oauthbearer, RFC 7628 §4.2",
                oauthbearer_response(
                    "user@example.com",
                    RFC_TOKEN,
                    Some("server.example.com"),
                    Some(587),
                ),
                b"n,a=user@example.com,\x01host=server.example.com\x01port=587\x01\
                  auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==\x01\x01",
                "bixhPXVzZXJAZXhhbXBsZS5jb20sAWhvc3Q9c2VydmVyLmV4YW1wbGUuY29tAXBvcnQ9NTg3AWF1dGg9\
                 QmVhcmVyIHZGOWRmdDRxbVRjMk52YjNSbGNrQmhiSFJoZG1semRHRXVZMjl0Q2c9PQEB",
            ),
            (
                // A unix socket has neither; `,` and `=` in the name are escaped (RFC 5801).
                "oauthbearer, no host, escaped name",
                oauthbearer_response("a,b=c", "t0k", None, None),
                b"n,a=a=2Cb=3Dc,\x01auth=Bearer t0k\x01\x01",
                "bixhPWE9MkNiPTNEYywBYXV0aD1CZWFyZXIgdDBrAQE=",
            ),
            (
                // Google's XOAUTH2 example (developers.google.com, "OAuth 2.0 Mechanism").
                "xoauth2, Google's example",
                xoauth2_response(
                    "someuser@example.com",
                    "ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg",
                ),
                b"user=someuser@example.com\x01auth=Bearer \
                  ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg\x01\x01",
                "dXNlcj1zb21ldXNlckBleGFtcGxlLmNvbQFhdXRoPUJlYXJlciB5YTI5LnZGOWRmdDRxbVRjMk52YjNS\
                 bGNrQmhkSFJoZG1semRHRXVZMjl0Q2cBAQ==",
            ),
        ];
        for (what, got, raw, encoded) in table {
            assert_eq!(got, raw, "{what}");
            assert_eq!(b64(&got), encoded, "{what}");
        }
    }

    #[test]
    fn a_long_initial_response_waits_for_the_empty_challenge() {
        let short = xoauth2_response("relay@example.org", "t0k");
        let (first, second) = initial_lines(Mechanism::XOAuth2, &short);
        assert_eq!(
            first,
            format!(
                "AUTH XOAUTH2 {}\r\n",
                crate::encoding::base64_encode(&short)
            )
        );
        assert_eq!(second, None);
        // A JWT-sized token: over 512 octets with the command.
        let long = oauthbearer_response("relay@example.org", &"x".repeat(1500), None, None);
        let (first, second) = initial_lines(Mechanism::OAuthBearer, &long);
        assert_eq!(first, "AUTH OAUTHBEARER\r\n");
        assert_eq!(
            second.unwrap(),
            format!("{}\r\n", crate::encoding::base64_encode(&long))
        );
        // The limit is on the whole line, CRLF included: 512 octets go on one line, 513 not.
        let mut seen = (false, false);
        for n in 360..390 {
            let raw = vec![b'a'; n];
            let line = 13 + crate::encoding::base64_encode(&raw).len() + 2; // "AUTH XOAUTH2 "
            let one_line = initial_lines(Mechanism::XOAuth2, &raw).1.is_none();
            assert_eq!(one_line, line <= MAX_COMMAND_LINE, "{line} octets");
            seen = (seen.0 || one_line, seen.1 || !one_line);
        }
        assert_eq!(seen, (true, true));
    }

    #[test]
    fn the_error_challenge_is_answered_as_each_mechanism_says() {
        assert_eq!(abort_line(Mechanism::OAuthBearer), "AQ==\r\n");
        assert_eq!(
            crate::encoding::base64_decode("AQ==").unwrap(),
            [KVSEP],
            "a single ^A"
        );
        assert_eq!(abort_line(Mechanism::XOAuth2), "\r\n");
    }

    #[test]
    fn error_challenges_table() {
        let challenge = |text: &str| Reply::plain(334, vec![text.to_owned()]);
        for (text, want) in [
            // RFC 7628 §4.3
            (
                "eyJzdGF0dXMiOiJpbnZhbGlkX3Rva2VuIiwic2NvcGUiOiJleGFtcGxlX3Njb3BlIiwib3BlbmlkLWNvbmZpZ3VyYXRpb24iOiJodHRwczovL2V4YW1wbGUuY29tLy53ZWxsLWtub3duL29wZW5pZC1jb25maWd1cmF0aW9uIn0=",
                r#"{"status":"invalid_token","scope":"example_scope","openid-configuration":"https://example.com/.well-known/openid-configuration"}"#,
            ),
            // Google's XOAUTH2 failure: the JSON ends in a newline, dropped
            (
                "eyJzdGF0dXMiOiI0MDEiLCJzY2hlbWVzIjoiYmVhcmVyIG1hYyIsInNjb3BlIjoiaHR0cHM6Ly9tYWlsLmdvb2dsZS5jb20vIn0K",
                r#"{"status":"401","schemes":"bearer mac","scope":"https://mail.google.com/"}"#,
            ),
            ("not base64 at all", "not base64 at all"),
            ("", "(empty)"),
        ] {
            assert_eq!(error_challenge(&challenge(text)), want, "{text:?}");
        }
        let long = crate::encoding::base64_encode("x".repeat(1000).as_bytes());
        let shown = error_challenge(&challenge(&long));
        assert_eq!(shown.chars().count(), MAX_ERROR_CHALLENGE + 1);
        assert!(shown.ends_with('…'), "{shown}");
    }

    #[test]
    fn mechanism_choice_table() {
        let caps = |mechs: &[&str]| Capabilities {
            auth: mechs.iter().map(|m| m.to_string()).collect(),
            ..Capabilities::default()
        };
        use Mechanism::*;
        use Secret::*;
        for (offered, secret, want) in [
            (&["LOGIN", "PLAIN"][..], Password, Some(Plain)),
            (&["CRAM-MD5", "LOGIN"], Password, Some(Login)),
            (&["CRAM-MD5", "XOAUTH2"], Password, None),
            (&["OAUTHBEARER", "XOAUTH2"], Password, None),
            (&[], Password, None),
            (&["XOAUTH2", "OAUTHBEARER"], BearerToken, Some(OAuthBearer)),
            (&["PLAIN", "LOGIN", "XOAUTH2"], BearerToken, Some(XOAuth2)),
            (&["OAUTHBEARER"], BearerToken, Some(OAuthBearer)),
            // A token is never sent as a password.
            (&["PLAIN", "LOGIN"], BearerToken, None),
            (&[], BearerToken, None),
        ] {
            assert_eq!(
                choose(&caps(offered), secret),
                want,
                "{offered:?} {secret:?}"
            );
        }
    }

    #[test]
    fn bearer_token_syntax_table() {
        for (token, ok) in [
            (RFC_TOKEN, true),
            ("ya29.a0AfH6SMB-x_y~z+/", true),
            (
                "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwcyJ9.c2ln",
                true,
            ),
            ("", false),
            ("==", false),
            ("a b", false),
            ("tok\x01en", false),
            ("a=b", false),
            ("tök", false),
        ] {
            assert_eq!(is_bearer_token(token), ok, "{token:?}");
        }
    }
}
