//! Replies, both ways: a server builds a [`Reply`] and sends [`Reply::render`]; a client
//! feeds the lines it read to [`parse_reply`] and gets the same type back. The reply code,
//! the RFC 3463 enhanced status code and the text. Pure, no I/O.

use std::fmt;
use std::fmt::Write as _;

/// The most lines one reply may have, and the longest line in octets without its CRLF
/// (RFC 5321 §4.5.3.1.5 allows 512; real servers send somewhat longer text, so this is
/// lenient but bounded). Beyond them the peer is broken, and the client says so.
pub const MAX_REPLY_LINES: usize = 200;
pub const MAX_LINE: usize = 2000;

/// One complete reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The three-digit reply code.
    pub code: u16,
    /// The RFC 3463 code (`5.1.1`) when the first line carries one of the reply code's class.
    pub enhanced: Option<String>,
    /// The text of each line, after the code, the separator and the enhanced code.
    pub lines: Vec<String>,
}

impl Reply {
    /// A one-line reply with an enhanced status code (`x.y.z`).
    pub fn new(code: u16, enhanced: &str, text: impl Into<String>) -> Reply {
        Reply {
            code,
            enhanced: Some(enhanced.to_owned()),
            lines: vec![text.into()],
        }
    }

    /// A reply without an enhanced code (greeting, EHLO, 334 challenges: RFC 2034 gives
    /// them none).
    pub fn plain(code: u16, lines: Vec<String>) -> Reply {
        Reply {
            code,
            enhanced: None,
            lines,
        }
    }

    /// True for 4xx and 5xx.
    pub fn is_error(&self) -> bool {
        self.code >= 400
    }

    /// The wire form: `250-first`, …, `250 last`, each ending in CRLF, the enhanced code on
    /// every line. Text is cleaned of CR and LF so a value echoed from the peer cannot start
    /// a reply line of its own.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let count = self.lines.len().max(1);
        for i in 0..count {
            let text = self.lines.get(i).map(String::as_str).unwrap_or("");
            let sep = if i + 1 == count { ' ' } else { '-' };
            let _ = write!(out, "{}{sep}", self.code);
            if let Some(enhanced) = &self.enhanced {
                let _ = write!(out, "{enhanced} ");
            }
            for c in text.chars() {
                out.push(if c == '\r' || c == '\n' { ' ' } else { c });
            }
            out.push_str("\r\n");
        }
        out
    }

    /// 2xx or 3xx: the command was accepted (or is waiting for more).
    pub fn is_positive(&self) -> bool {
        (200..400).contains(&self.code)
    }

    /// 4xx: try again later.
    pub fn is_transient(&self) -> bool {
        (400..500).contains(&self.code)
    }

    /// 5xx: do not try again.
    pub fn is_permanent(&self) -> bool {
        self.code >= 500
    }

    /// The text of all lines on one line.
    pub fn text(&self) -> String {
        self.lines
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The enhanced code, or the class default (`2.0.0`, `4.0.0`, `5.0.0`) when the server
    /// gave none.
    pub fn status(&self) -> String {
        self.enhanced
            .clone()
            .unwrap_or_else(|| format!("{}.0.0", (self.code / 100).clamp(2, 5)))
    }
}

/// `550 5.1.1 <b@x> no such user`: the reply on one line, as a bounce quotes it.
impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code)?;
        if let Some(e) = &self.enhanced {
            write!(f, " {e}")?;
        }
        let text = self.text();
        if !text.is_empty() {
            write!(f, " {text}")?;
        }
        Ok(())
    }
}

/// One line of a reply: `250-text` (more follow) or `250 text` (the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub code: u16,
    pub last: bool,
    pub text: String,
}

/// Parses one line, without its line end.
pub fn parse_line(line: &str) -> Result<Line, String> {
    let b = line.as_bytes();
    let digits_ok = b.len() >= 3
        && (b'2'..=b'5').contains(&b[0])
        && (b'0'..=b'5').contains(&b[1])
        && b[2].is_ascii_digit();
    if !digits_ok {
        return Err(format!(
            "expected a reply code from 200 to 599 at the start of {line:?}"
        ));
    }
    let code = line[..3].parse::<u16>().map_err(|e| e.to_string())?;
    let (last, text) = match b.get(3) {
        None => (true, ""),
        Some(b' ') => (true, &line[4..]),
        Some(b'-') => (false, &line[4..]),
        Some(_) => {
            return Err(format!(
                "expected a space or '-' after the code in {line:?}"
            ));
        }
    };
    Ok(Line {
        code,
        last,
        text: text.to_owned(),
    })
}

/// `x.y.z` with x the class of `code`, y up to 3 digits, z up to 3 digits.
fn enhanced_prefix(text: &str, code: u16) -> Option<&str> {
    let word = text.split_ascii_whitespace().next()?;
    let class = crate::encoding::enhanced_status_class(word)?;
    (u16::from(class) == code / 100).then_some(word)
}

/// Assembles the lines of one reply (all but the last marked `-`) into a [`Reply`]. Every
/// line must carry the same code. The enhanced code is taken from the first line when it has
/// one of the reply's class (whether or not the server advertised ENHANCEDSTATUSCODES: a
/// server that sends them without saying so still means them), and removed from every line
/// that repeats it.
pub fn parse_reply<S: AsRef<str>>(lines: &[S]) -> Result<Reply, String> {
    let mut parsed = Vec::with_capacity(lines.len());
    for (i, raw) in lines.iter().enumerate() {
        let line = parse_line(raw.as_ref())?;
        let is_final = i + 1 == lines.len();
        if line.last != is_final {
            return Err(if is_final {
                format!("the reply ends with a continuation line {:?}", raw.as_ref())
            } else {
                format!(
                    "line {:?} ends the reply before its last line",
                    raw.as_ref()
                )
            });
        }
        parsed.push(line);
    }
    let Some(first) = parsed.first() else {
        return Err("empty reply".into());
    };
    let code = first.code;
    if let Some(other) = parsed.iter().find(|l| l.code != code) {
        return Err(format!(
            "reply mixes codes {code} and {} on different lines",
            other.code
        ));
    }
    let enhanced = enhanced_prefix(&first.text, code).map(str::to_owned);
    let lines = parsed
        .into_iter()
        .map(|l| match &enhanced {
            Some(e) if l.text.split_ascii_whitespace().next() == Some(e.as_str()) => {
                l.text.trim_start()[e.len()..].trim_start().to_owned()
            }
            _ => l.text,
        })
        .collect();
    Ok(Reply {
        code,
        enhanced,
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `input` lines → `Ok((code, enhanced, lines))` or `Err(part of the message)`.
    fn check(input: &[&str], expected: Result<(u16, Option<&str>, &[&str]), &str>) {
        let got = parse_reply(input);
        match (got, expected) {
            (Ok(reply), Ok((code, enhanced, lines))) => {
                assert_eq!(reply.code, code, "{input:?}");
                assert_eq!(reply.enhanced.as_deref(), enhanced, "{input:?}");
                assert_eq!(reply.lines, lines, "{input:?}");
            }
            (Err(e), Err(want)) => assert!(e.contains(want), "{input:?}: {e:?} lacks {want:?}"),
            (got, want) => panic!("{input:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn reply_table() {
        check(&["250 OK"], Ok((250, None, &["OK"])));
        check(&["250"], Ok((250, None, &[""])));
        check(&["250 "], Ok((250, None, &[""])));
        check(&["250 2.1.5 Ok"], Ok((250, Some("2.1.5"), &["Ok"])));
        check(
            &["550 5.1.1 <b@x> no such user"],
            Ok((550, Some("5.1.1"), &["<b@x> no such user"])),
        );
        // the class of the enhanced code must match the reply's
        check(&["550 2.1.1 odd"], Ok((550, None, &["2.1.1 odd"])));
        // a version number is not an enhanced code
        check(
            &["220 mx.example ESMTP 1.2.3.4"],
            Ok((220, None, &["mx.example ESMTP 1.2.3.4"])),
        );
        check(&["451 4.3.0"], Ok((451, Some("4.3.0"), &[""])));
        check(
            &["452 4.2.2  mailbox full"],
            Ok((452, Some("4.2.2"), &["mailbox full"])),
        );
        check(
            &[
                "550-5.7.1 line one",
                "550-5.7.1 line two",
                "550 5.7.1 line three",
            ],
            Ok((550, Some("5.7.1"), &["line one", "line two", "line three"])),
        );
        check(
            &[
                "250-mx.example",
                "250-PIPELINING",
                "250 ENHANCEDSTATUSCODES",
            ],
            Ok((
                250,
                None,
                &["mx.example", "PIPELINING", "ENHANCEDSTATUSCODES"],
            )),
        );
        check(
            &["421 4.4.2 mx.example closing connection"],
            Ok((421, Some("4.4.2"), &["mx.example closing connection"])),
        );
        check(
            &["354 End data with <CR><LF>.<CR><LF>"],
            Ok((354, None, &["End data with <CR><LF>.<CR><LF>"])),
        );
        check(&["25 short"], Err("expected a reply code"));
        check(&["hello"], Err("expected a reply code"));
        check(&["650 x"], Err("expected a reply code"));
        check(&["250_x"], Err("expected a space or '-'"));
        check(
            &["250-one", "250-two"],
            Err("ends with a continuation line"),
        );
        check(
            &["250 one", "250 two"],
            Err("ends the reply before its last line"),
        );
        check(&["250-one", "251 two"], Err("mixes codes 250 and 251"));
        check(&[], Err("empty reply"));
    }

    fn rendered(reply: Reply, wire: &str) {
        assert_eq!(reply.render(), wire);
        // What a server sends, a client reads back as the same reply.
        let lines: Vec<&str> = wire.split_terminator("\r\n").collect();
        let back = parse_reply(&lines).unwrap();
        assert_eq!(
            (back.code, back.enhanced),
            (reply.code, reply.enhanced),
            "{wire:?}"
        );
    }

    #[test]
    fn render_table() {
        rendered(Reply::new(250, "2.0.0", "ok"), "250 2.0.0 ok\r\n");
        rendered(
            Reply::plain(250, vec!["mx greets x".into(), "PIPELINING".into()]),
            "250-mx greets x\r\n250 PIPELINING\r\n",
        );
        rendered(
            Reply::new(501, "5.5.2", "bad\r\n250 injected"),
            "501 5.5.2 bad  250 injected\r\n",
        );
        rendered(Reply::plain(334, vec![String::new()]), "334 \r\n");
    }

    #[test]
    fn display_and_status() {
        let r = parse_reply(&["550-5.1.1 <b@x> no", "550 5.1.1 such user"]).unwrap();
        assert_eq!(r.to_string(), "550 5.1.1 <b@x> no such user");
        assert_eq!(r.status(), "5.1.1");
        assert!(r.is_permanent() && !r.is_transient() && !r.is_positive());
        let r = parse_reply(&["452 too many recipients"]).unwrap();
        assert_eq!(r.to_string(), "452 too many recipients");
        assert_eq!(r.status(), "4.0.0");
        assert!(r.is_transient());
    }
}
