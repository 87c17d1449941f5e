//! SMTP replies: a basic code, an RFC 3463 enhanced status code and text, rendered as one
//! or several lines. Every reply the server sends goes through `Reply`, so none lacks its
//! enhanced code (greeting and EHLO aside, where RFC 2034 omits it).

use std::fmt::Write as _;

/// One SMTP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    /// `x.y.z`, or empty for the greeting and EHLO, which carry none.
    pub enhanced: &'static str,
    pub lines: Vec<String>,
}

impl Reply {
    pub fn new(code: u16, enhanced: &'static str, text: impl Into<String>) -> Reply {
        Reply {
            code,
            enhanced,
            lines: vec![text.into()],
        }
    }

    /// A reply without an enhanced code (greeting, EHLO, 334 challenges).
    pub fn plain(code: u16, lines: Vec<String>) -> Reply {
        Reply {
            code,
            enhanced: "",
            lines,
        }
    }

    /// True for 4xx and 5xx.
    pub fn is_error(&self) -> bool {
        self.code >= 400
    }

    /// The wire form: `250-first`, …, `250 last`, each ending in CRLF. Text is cleaned of
    /// CR and LF so a value echoed from the client cannot start a reply line of its own.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let count = self.lines.len().max(1);
        for i in 0..count {
            let text = self.lines.get(i).map(String::as_str).unwrap_or("");
            let sep = if i + 1 == count { ' ' } else { '-' };
            let _ = write!(out, "{}{sep}", self.code);
            if !self.enhanced.is_empty() {
                let _ = write!(out, "{} ", self.enhanced);
            }
            for c in text.chars() {
                out.push(if c == '\r' || c == '\n' { ' ' } else { c });
            }
            out.push_str("\r\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(reply: Reply, wire: &str) {
        assert_eq!(reply.render(), wire);
    }

    #[test]
    fn render_table() {
        check(Reply::new(250, "2.0.0", "ok"), "250 2.0.0 ok\r\n");
        check(
            Reply::plain(250, vec!["mx greets x".into(), "PIPELINING".into()]),
            "250-mx greets x\r\n250 PIPELINING\r\n",
        );
        check(
            Reply::new(501, "5.5.2", "bad\r\n250 injected"),
            "501 5.5.2 bad  250 injected\r\n",
        );
        check(Reply::plain(334, vec![String::new()]), "334 \r\n");
    }
}
