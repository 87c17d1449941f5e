//! The extensions a server offers in its EHLO or LHLO reply. Pure, no I/O.

use crate::reply::Reply;

/// What the peer said it supports. Unknown keywords are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub pipelining: bool,
    /// `SIZE`: `Some(0)` when offered without a limit, `Some(n)` for a limit of n bytes.
    pub size: Option<u64>,
    pub eight_bit_mime: bool,
    pub smtputf8: bool,
    pub dsn: bool,
    pub chunking: bool,
    pub enhanced_status_codes: bool,
    pub starttls: bool,
    /// `AUTH` mechanisms, upper-case, in the server's order.
    pub auth: Vec<String>,
}

impl Capabilities {
    /// Reads the keyword lines of a 250 EHLO/LHLO reply (the first line is the server's name).
    pub fn parse(reply: &Reply) -> Capabilities {
        let mut caps = Capabilities::default();
        for line in reply.lines.iter().skip(1) {
            let mut words = line.split_ascii_whitespace();
            let Some(keyword) = words.next() else {
                continue;
            };
            let keyword = keyword.to_ascii_uppercase();
            // Some old servers wrote `AUTH=PLAIN LOGIN`.
            let (keyword, first_arg) = match keyword.split_once('=') {
                Some((k, a)) => (k.to_owned(), Some(a.to_owned())),
                None => (keyword, None),
            };
            let args: Vec<String> = first_arg
                .into_iter()
                .filter(|a| !a.is_empty())
                .chain(words.map(str::to_owned))
                .collect();
            match keyword.as_str() {
                "PIPELINING" => caps.pipelining = true,
                "SIZE" => {
                    caps.size = Some(args.first().and_then(|a| a.parse().ok()).unwrap_or(0));
                }
                "8BITMIME" => caps.eight_bit_mime = true,
                "SMTPUTF8" => caps.smtputf8 = true,
                "DSN" => caps.dsn = true,
                "CHUNKING" => caps.chunking = true,
                "ENHANCEDSTATUSCODES" => caps.enhanced_status_codes = true,
                "STARTTLS" => caps.starttls = true,
                "AUTH" => {
                    for mech in args {
                        let mech = mech.to_ascii_uppercase();
                        if !caps.auth.contains(&mech) {
                            caps.auth.push(mech);
                        }
                    }
                }
                _ => {}
            }
        }
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::parse_reply;

    fn check(lines: &[&str], expected: Capabilities) {
        let reply = parse_reply(lines).unwrap();
        assert_eq!(Capabilities::parse(&reply), expected, "{lines:?}");
    }

    #[test]
    fn capability_table() {
        check(&["250 mx.example"], Capabilities::default());
        check(
            &[
                "250-mx.example Hello",
                "250-PIPELINING",
                "250-SIZE 10240000",
                "250-8BITMIME",
                "250-SMTPUTF8",
                "250-DSN",
                "250-CHUNKING",
                "250-ENHANCEDSTATUSCODES",
                "250-STARTTLS",
                "250 AUTH PLAIN LOGIN",
            ],
            Capabilities {
                pipelining: true,
                size: Some(10_240_000),
                eight_bit_mime: true,
                smtputf8: true,
                dsn: true,
                chunking: true,
                enhanced_status_codes: true,
                starttls: true,
                auth: vec!["PLAIN".into(), "LOGIN".into()],
            },
        );
        // Dovecot's LHLO reply
        check(
            &[
                "250-vm",
                "250-8BITMIME",
                "250-CHUNKING",
                "250-ENHANCEDSTATUSCODES",
                "250 PIPELINING",
            ],
            Capabilities {
                pipelining: true,
                eight_bit_mime: true,
                chunking: true,
                enhanced_status_codes: true,
                ..Capabilities::default()
            },
        );
        // lower case, SIZE without a limit, old AUTH= form merged with the new one
        check(
            &[
                "250-mx",
                "250-size",
                "250-auth=login",
                "250-AUTH PLAIN login",
                "250 X-UNKNOWN 1 2",
            ],
            Capabilities {
                size: Some(0),
                auth: vec!["LOGIN".into(), "PLAIN".into()],
                ..Capabilities::default()
            },
        );
        // a keyword on the greeting line is the server's name, not a capability
        check(
            &["250-PIPELINING", "250 DSN"],
            Capabilities {
                dsn: true,
                ..Capabilities::default()
            },
        );
    }
}
