//! SMTP command lines, both ways: a server [`parse`]s a line (without its CRLF) into a
//! [`Command`]; a client writes a [`Command`] with [`Command::to_line`], which refuses any
//! value that would put a CR, LF or NUL on the line. Pure: no I/O, no session state;
//! whether a command is allowed *now* is the session's business.

use std::fmt;

use crate::address::{Path, parse_path};

/// A parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Helo(String),
    Ehlo(String),
    Mail {
        from: Path,
        params: Vec<Param>,
    },
    Rcpt {
        to: Path,
        params: Vec<Param>,
    },
    Data,
    Bdat {
        size: u64,
        last: bool,
    },
    Rset,
    Noop,
    Quit,
    Help,
    Vrfy,
    Expn,
    StartTls,
    Auth {
        mechanism: String,
        initial: Option<String>,
    },
}

/// An ESMTP parameter `KEY[=value]`, the key upper-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub key: String,
    pub value: Option<String>,
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={v}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// A command line this side will not send: `text` holds `what` (a CR, an LF or a NUL),
/// which the peer would read as the end of the line and the start of a command of its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {text:?}")]
pub struct Unsendable {
    pub what: &'static str,
    pub text: String,
}

/// Checks a command line as it may go out (the text before its final CRLF): no CR, LF or
/// NUL, whatever a stored envelope says, so nothing can be smuggled in as a second command.
pub fn check_line(line: &str) -> Result<(), Unsendable> {
    check_text(line.strip_suffix("\r\n").unwrap_or(line))
}

/// The text of a line, before its CRLF is added: not even a CR LF at its end may pass.
fn check_text(text: &str) -> Result<(), Unsendable> {
    match text.bytes().find(|b| matches!(b, b'\r' | b'\n' | 0)) {
        None => Ok(()),
        Some(b) => Err(Unsendable {
            what: match b {
                b'\r' => "a CR",
                b'\n' => "an LF",
                _ => "a NUL",
            },
            text: text.to_owned(),
        }),
    }
}

impl Command {
    /// The line a client sends, CRLF included, in the form [`parse`] reads back as this
    /// command. A value that would carry a CR, LF or NUL is refused.
    pub fn to_line(&self) -> Result<String, Unsendable> {
        let with_params = |head: String, params: &[Param]| {
            params.iter().fold(head, |line, p| format!("{line} {p}"))
        };
        let text = match self {
            Command::Helo(domain) => format!("HELO {domain}"),
            Command::Ehlo(domain) => format!("EHLO {domain}"),
            Command::Mail { from, params } => with_params(format!("MAIL FROM:{from}"), params),
            Command::Rcpt { to, params } => with_params(format!("RCPT TO:{to}"), params),
            Command::Data => "DATA".into(),
            Command::Bdat { size, last: true } => format!("BDAT {size} LAST"),
            Command::Bdat { size, last: false } => format!("BDAT {size}"),
            Command::Rset => "RSET".into(),
            Command::Noop => "NOOP".into(),
            Command::Quit => "QUIT".into(),
            Command::Help => "HELP".into(),
            Command::Vrfy => "VRFY".into(),
            Command::Expn => "EXPN".into(),
            Command::StartTls => "STARTTLS".into(),
            Command::Auth {
                mechanism,
                initial: Some(initial),
            } => format!("AUTH {mechanism} {initial}"),
            Command::Auth {
                mechanism,
                initial: None,
            } => format!("AUTH {mechanism}"),
        };
        check_text(&text)?;
        Ok(text + "\r\n")
    }
}

/// Why a line is not a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The verb is not one we know (500 5.5.1).
    Unknown(String),
    /// A known verb with bad arguments (501 5.5.4 / 5.1.7 / 5.1.3).
    Syntax(&'static str, String),
}

/// Parses a command line. `line` excludes the CRLF.
pub fn parse(line: &[u8]) -> Result<Command, ParseError> {
    let Ok(line) = std::str::from_utf8(line) else {
        return Err(ParseError::Syntax(
            "5.5.2",
            "command is not valid UTF-8".into(),
        ));
    };
    // A bare LF or CR, a NUL or another control character has no place in a command line;
    // carried into stored parameters, a line break would end a command we write later.
    if line.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(ParseError::Syntax(
            "5.5.2",
            "control character (a bare CR or LF, a NUL) in the command line".into(),
        ));
    }
    let (verb, rest) = match line.find(' ') {
        Some(at) => (&line[..at], &line[at + 1..]),
        None => (line, ""),
    };
    let upper = verb.to_ascii_uppercase();
    let no_args = |cmd: Command| {
        if rest.trim().is_empty() {
            Ok(cmd)
        } else {
            Err(ParseError::Syntax(
                "5.5.4",
                format!("{upper} takes no arguments"),
            ))
        }
    };
    match upper.as_str() {
        "HELO" | "EHLO" => {
            let domain = rest.trim();
            if domain.is_empty() || domain.contains(' ') || !domain.is_ascii() {
                return Err(ParseError::Syntax(
                    "5.5.4",
                    format!("{upper} needs one domain or address literal, got {domain:?}"),
                ));
            }
            if upper == "HELO" {
                Ok(Command::Helo(domain.to_owned()))
            } else {
                Ok(Command::Ehlo(domain.to_owned()))
            }
        }
        "MAIL" => {
            let args = strip_keyword(rest, "FROM:").ok_or_else(|| {
                ParseError::Syntax(
                    "5.5.4",
                    format!("expected MAIL FROM:<address>, got {line:?}"),
                )
            })?;
            let (from, params) = path_and_params(args, true)?;
            Ok(Command::Mail { from, params })
        }
        "RCPT" => {
            let args = strip_keyword(rest, "TO:").ok_or_else(|| {
                ParseError::Syntax("5.5.4", format!("expected RCPT TO:<address>, got {line:?}"))
            })?;
            let (to, params) = path_and_params(args, false)?;
            Ok(Command::Rcpt { to, params })
        }
        "DATA" => no_args(Command::Data),
        "BDAT" => parse_bdat(rest),
        "RSET" => no_args(Command::Rset),
        // NOOP, HELP and VRFY may carry an argument, which we do not need.
        "NOOP" => Ok(Command::Noop),
        "HELP" => Ok(Command::Help),
        "VRFY" => Ok(Command::Vrfy),
        "EXPN" => Ok(Command::Expn),
        "QUIT" => no_args(Command::Quit),
        "STARTTLS" => no_args(Command::StartTls),
        "AUTH" => {
            let mut words = rest.split(' ').filter(|w| !w.is_empty());
            let mechanism = words
                .next()
                .ok_or_else(|| ParseError::Syntax("5.5.4", "AUTH needs a mechanism".into()))?
                .to_ascii_uppercase();
            let initial = words.next().map(str::to_owned);
            if words.next().is_some() {
                return Err(ParseError::Syntax(
                    "5.5.4",
                    "AUTH takes a mechanism and at most one initial response".into(),
                ));
            }
            Ok(Command::Auth { mechanism, initial })
        }
        _ => Err(ParseError::Unknown(verb.chars().take(32).collect())),
    }
}

/// `FROM:` / `TO:` case-insensitively, tolerating the space some clients put after the
/// colon (RFC 5321 forbids it, but refusing would gain nothing).
fn strip_keyword<'a>(rest: &'a str, keyword: &str) -> Option<&'a str> {
    let head = rest.get(..keyword.len())?;
    head.eq_ignore_ascii_case(keyword)
        .then(|| rest[keyword.len()..].trim_start_matches(' '))
}

fn path_and_params(args: &str, is_mail: bool) -> Result<(Path, Vec<Param>), ParseError> {
    let (path, rest) = parse_path(args, is_mail)
        .map_err(|e| ParseError::Syntax(if is_mail { "5.1.7" } else { "5.1.3" }, e))?;
    let mut params = Vec::new();
    for word in rest.split(' ').filter(|w| !w.is_empty()) {
        let (key, value) = match word.split_once('=') {
            Some((k, v)) => (k, Some(v.to_owned())),
            None => (word, None),
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(ParseError::Syntax(
                "5.5.4",
                format!("malformed parameter {word:?}"),
            ));
        }
        params.push(Param {
            key: key.to_ascii_uppercase(),
            value,
        });
    }
    Ok((path, params))
}

fn parse_bdat(rest: &str) -> Result<Command, ParseError> {
    let mut words = rest.split(' ').filter(|w| !w.is_empty());
    let size = words
        .next()
        .filter(|s| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| {
            ParseError::Syntax("5.5.4", format!("BDAT needs a chunk size, got {rest:?}"))
        })?;
    let last = match words.next() {
        None => false,
        Some(w) if w.eq_ignore_ascii_case("LAST") => true,
        Some(w) => {
            return Err(ParseError::Syntax(
                "5.5.4",
                format!("BDAT takes LAST or nothing after the size, got {w:?}"),
            ));
        }
    };
    if words.next().is_some() {
        return Err(ParseError::Syntax(
            "5.5.4",
            "BDAT has too many arguments".into(),
        ));
    }
    Ok(Command::Bdat { size, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Command {
        parse(line.as_bytes()).unwrap_or_else(|e| panic!("{line:?}: {e:?}"))
    }

    fn err(line: &str) -> ParseError {
        parse(line.as_bytes()).expect_err(line)
    }

    #[test]
    fn accepted_table() {
        let cases: &[(&str, Command)] = &[
            (
                "EHLO client.example",
                Command::Ehlo("client.example".into()),
            ),
            ("helo [192.0.2.1]", Command::Helo("[192.0.2.1]".into())),
            ("DATA", Command::Data),
            ("rset", Command::Rset),
            ("NOOP anything", Command::Noop),
            ("VRFY postmaster", Command::Vrfy),
            ("QUIT", Command::Quit),
            ("STARTTLS", Command::StartTls),
            (
                "BDAT 100",
                Command::Bdat {
                    size: 100,
                    last: false,
                },
            ),
            (
                "BDAT 0 LAST",
                Command::Bdat {
                    size: 0,
                    last: true,
                },
            ),
            (
                "AUTH PLAIN AGFAYg==",
                Command::Auth {
                    mechanism: "PLAIN".into(),
                    initial: Some("AGFAYg==".into()),
                },
            ),
            (
                "auth login",
                Command::Auth {
                    mechanism: "LOGIN".into(),
                    initial: None,
                },
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(&ok(line), expected, "{line:?}");
        }
    }

    #[test]
    fn mail_and_rcpt_parameters() {
        match ok("MAIL FROM:<a@example.org> SIZE=100 body=8BITMIME SMTPUTF8") {
            Command::Mail { from, params } => {
                assert_eq!(from.address.as_deref(), Some("a@example.org"));
                let keys: Vec<_> = params.iter().map(|p| p.key.as_str()).collect();
                assert_eq!(keys, ["SIZE", "BODY", "SMTPUTF8"]);
                assert_eq!(params[1].value.as_deref(), Some("8BITMIME"));
                assert_eq!(params[2].value, None);
            }
            other => panic!("{other:?}"),
        }
        match ok("MAIL FROM: <>") {
            Command::Mail { from, .. } => assert_eq!(from.address, None),
            other => panic!("{other:?}"),
        }
        match ok("RCPT TO:<b@example.test> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;b+2Bx@example.test")
        {
            Command::Rcpt { to, params } => {
                assert_eq!(to.address.as_deref(), Some("b@example.test"));
                assert_eq!(params.len(), 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejected_table() {
        let cases: &[(&str, &str)] = &[
            ("EHLO", "5.5.4"),
            ("EHLO a b", "5.5.4"),
            ("MAIL <a@b>", "5.5.4"),
            ("MAIL FROM:a@b", "5.1.7"),
            ("MAIL FROM:<a@b", "5.1.7"),
            ("RCPT TO:<>", "5.1.3"),
            ("RCPT TO:<a@b> =x", "5.5.4"),
            ("DATA now", "5.5.4"),
            ("BDAT", "5.5.4"),
            ("BDAT -1", "5.5.4"),
            ("BDAT 10 FIRST", "5.5.4"),
            ("AUTH", "5.5.4"),
        ];
        for (line, code) in cases {
            match err(line) {
                ParseError::Syntax(c, _) => assert_eq!(c, *code, "{line:?}"),
                other => panic!("{line:?}: {other:?}"),
            }
        }
        assert_eq!(err("XYZZY"), ParseError::Unknown("XYZZY".into()));
        assert_eq!(err(""), ParseError::Unknown(String::new()));
        assert!(matches!(
            parse(b"MAIL FROM:<\xff@b>"),
            Err(ParseError::Syntax("5.5.2", _))
        ));
    }

    /// What a client writes, a server parses back as the same command.
    #[test]
    fn written_commands_parse_back_as_themselves() {
        let mail = ok("MAIL FROM:<a@example.org> SIZE=100 BODY=8BITMIME SMTPUTF8");
        let rcpt = ok("RCPT TO:<b@example.test> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;b+2Bx@x");
        let commands = [
            Command::Ehlo("client.example".into()),
            Command::Helo("[192.0.2.1]".into()),
            mail,
            rcpt,
            Command::Mail {
                from: Path::new(""),
                params: vec![],
            },
            Command::Data,
            Command::Bdat {
                size: 7,
                last: true,
            },
            Command::Bdat {
                size: 0,
                last: false,
            },
            Command::Rset,
            Command::Quit,
            Command::StartTls,
            Command::Auth {
                mechanism: "PLAIN".into(),
                initial: Some("AGFAYg==".into()),
            },
            Command::Auth {
                mechanism: "LOGIN".into(),
                initial: None,
            },
        ];
        for command in commands {
            let line = command.to_line().unwrap();
            let text = line.strip_suffix("\r\n").expect("ends in CRLF");
            assert_eq!(ok(text), command, "{line:?}");
        }
    }

    #[test]
    fn a_command_line_with_a_line_break_inside_is_never_written() {
        let cases = [
            ("RCPT TO:<a@x> ORCPT=rfc822;a@x\r\n", None),
            ("RCPT TO:<a@x>", None),
            ("RCPT TO:<a@x> ORCPT=rfc822\nRSET;a@x\r\n", Some("an LF")),
            ("RCPT TO:<a@x>\rMAIL FROM:<b@y>\r\n", Some("a CR")),
            ("RCPT TO:<a@x>\0\r\n", Some("a NUL")),
            ("RCPT TO:<a@x>\r\n\r\n", Some("a CR")),
        ];
        for (line, refused) in cases {
            assert_eq!(check_line(line).err().map(|e| e.what), refused, "{line:?}");
        }
        let smuggled = Command::Rcpt {
            to: Path::new("a@x"),
            params: vec![Param {
                key: "ORCPT".into(),
                value: Some("rfc822\r\nRSET;a@x".into()),
            }],
        };
        assert_eq!(smuggled.to_line().unwrap_err().what, "a CR");
        // A value that ends in CRLF would add an empty line after the command.
        let trailing = Command::Rcpt {
            to: Path::new("a@x"),
            params: vec![Param {
                key: "ORCPT".into(),
                value: Some("rfc822;a@x\r\n".into()),
            }],
        };
        assert_eq!(trailing.to_line().unwrap_err().what, "a CR");
        assert!(
            Command::Ehlo("a\nb".into()).to_line().is_err(),
            "a domain with a line break"
        );
    }
}
