//! SMTP AUTH (RFC 4954) for the two mechanisms smarthosts ask for: PLAIN (RFC 4616), sent
//! with its initial response, and LOGIN. Pure, no I/O: which mechanism, and the lines to send.

use crate::caps::Capabilities;

/// A mechanism this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Login,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Login => "LOGIN",
        }
    }
}

/// PLAIN when offered (one round trip), else LOGIN; `None` when the peer offers neither.
pub fn choose(caps: &Capabilities) -> Option<Mechanism> {
    let offers = |m: &str| caps.auth.iter().any(|a| a == m);
    if offers("PLAIN") {
        Some(Mechanism::Plain)
    } else if offers("LOGIN") {
        Some(Mechanism::Login)
    } else {
        None
    }
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

    #[test]
    fn plain_is_preferred() {
        let caps = |mechs: &[&str]| Capabilities {
            auth: mechs.iter().map(|m| m.to_string()).collect(),
            ..Capabilities::default()
        };
        assert_eq!(choose(&caps(&["LOGIN", "PLAIN"])), Some(Mechanism::Plain));
        assert_eq!(
            choose(&caps(&["CRAM-MD5", "LOGIN"])),
            Some(Mechanism::Login)
        );
        assert_eq!(choose(&caps(&["CRAM-MD5", "XOAUTH2"])), None);
        assert_eq!(choose(&caps(&[])), None);
    }
}
