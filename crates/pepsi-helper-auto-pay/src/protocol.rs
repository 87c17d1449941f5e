//! The one definition of the wire format between `pepsi-stage-auto-pay` and
//! `pepsi-helper-auto-pay`, both ends. The stage starts the helper once per payment, writes
//! one request line on its stdin and reads one outcome line from its stdout:
//!
//! ```text
//! pay alice@example.org KUDOS:0.5 taler://pay/backend.example/o-17/
//! paid
//! refused no account alice
//! failed wallet exited 1: insufficient balance
//! ```
//!
//! Every field is bounded and carries no white space, control character or NUL, so a line
//! is always one line. The URI check is written here rather than taken from
//! `pepsi_secretary::taler::is_pay_uri` (the same rule: `taler://pay/`, at most 2000
//! printable ASCII characters, no space), because that crate links sqlx and the helper runs
//! with root's privilege until it drops to the user; the amount's check (Taler's
//! `CURRENCY:VALUE`) is `pepsi_contract::settings::secretary::Amount`'s shape, for the same
//! reason. The login must be an address as `pepsi_conf::address` reads one. This module does
//! no I/O.

use pepsi_conf::address::Address;

/// The longest `taler://pay/` URI carried (`pepsi_secretary::taler::MAX_PAY_URI`).
pub const MAX_URI: usize = 2000;
/// The longest login (a mail address, RFC 5321's path limit).
pub const MAX_LOGIN: usize = 254;
/// The longest amount: a currency of 12, `:`, 16 whole digits, `.` and 8 fractional ones.
pub const MAX_AMOUNT: usize = 12 + 1 + 16 + 1 + 8;
/// The longest request line, LF included.
pub const MAX_REQUEST_LINE: usize = "pay ".len() + MAX_LOGIN + 1 + MAX_AMOUNT + 1 + MAX_URI + 1;
/// The longest text an outcome carries; a longer one is cut.
pub const MAX_TEXT: usize = 512;
/// The longest outcome line, LF included.
pub const MAX_OUTCOME_LINE: usize = "refused ".len() + MAX_TEXT + 1;

/// One payment asked of the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The user's mail address (`alice@example.org`): its local part is the system account,
    /// its domain one of the local domains.
    pub login: String,
    /// The `taler://pay/...` URI of the order.
    pub uri: String,
    /// `CURRENCY:VALUE`, the amount the stage checked against the user's limits.
    pub amount: String,
}

impl Request {
    /// The request as written on the wire, LF included. A request that does not pass
    /// [`Request::check`] gives a line the helper refuses.
    pub fn to_line(&self) -> String {
        format!("pay {} {} {}\n", self.login, self.amount, self.uri)
    }

    /// The request in `line` (one trailing LF allowed), checked; the error names what is
    /// wrong.
    pub fn parse(line: &str) -> Result<Request, String> {
        let line = one_line(line, MAX_REQUEST_LINE)?;
        let rest = line
            .strip_prefix("pay ")
            .ok_or_else(|| format!("expected `pay <login> <amount> <uri>`, got {}", shown(line)))?;
        let mut fields = rest.split(' ');
        let (Some(login), Some(amount), Some(uri), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(format!(
                "expected `pay <login> <amount> <uri>`, got {}",
                shown(line)
            ));
        };
        let request = Request {
            login: login.to_owned(),
            uri: uri.to_owned(),
            amount: amount.to_owned(),
        };
        request.check()?;
        Ok(request)
    }

    /// Whether every field is one the helper takes: the stage's check before it asks.
    pub fn check(&self) -> Result<(), String> {
        check_login(&self.login)?;
        check_amount(&self.amount)?;
        check_pay_uri(&self.uri)
    }
}

/// What the helper did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The wallet ran as the user and exited 0.
    Paid,
    /// The helper would not try: an unknown account, a uid below MIN_UID, a malformed
    /// request or URI, no wallet configured.
    Refused(String),
    /// The wallet ran and said no (exited other than 0), timed out, or crashed.
    Failed(String),
}

impl Outcome {
    /// The outcome as written on the wire, LF included; a text is made one line of at most
    /// [`MAX_TEXT`] bytes (control characters become spaces).
    pub fn to_line(&self) -> String {
        match self {
            Outcome::Paid => "paid\n".to_owned(),
            Outcome::Refused(t) => format!("refused {}\n", clean_text(t)),
            Outcome::Failed(t) => format!("failed {}\n", clean_text(t)),
        }
    }

    /// The outcome in `line` (one trailing LF allowed); the error names what is wrong.
    pub fn parse(line: &str) -> Result<Outcome, String> {
        let line = one_line(line, MAX_OUTCOME_LINE)?;
        let (word, text) = line.split_once(' ').unwrap_or((line, ""));
        if text.len() > MAX_TEXT {
            return Err(format!("an outcome text longer than {MAX_TEXT} bytes"));
        }
        match (word, text) {
            ("paid", "") => Ok(Outcome::Paid),
            ("refused", t) if !t.is_empty() => Ok(Outcome::Refused(t.to_owned())),
            ("failed", t) if !t.is_empty() => Ok(Outcome::Failed(t.to_owned())),
            _ => Err(format!("unexpected outcome {}", shown(line))),
        }
    }
}

/// `line` without its one trailing LF, refused when longer than `limit` bytes (LF
/// included) or holding another line break, a CR or a NUL.
fn one_line(line: &str, limit: usize) -> Result<&str, String> {
    let body = line.strip_suffix('\n').unwrap_or(line);
    if body.len() + 1 > limit {
        return Err(format!("a line longer than {} bytes", limit - 1));
    }
    if let Some(c) = body.chars().find(|c| matches!(c, '\r' | '\n' | '\0')) {
        return Err(format!("a line holding {c:?}"));
    }
    Ok(body)
}

/// `text` for an error message: quoted, and cut to 80 characters.
fn shown(text: &str) -> String {
    let cut: String = text.chars().take(80).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// `t` as one line of at most [`MAX_TEXT`] bytes, never empty.
fn clean_text(t: &str) -> String {
    let spaced: String = t
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out = spaced.trim().to_owned();
    if out.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    if out.trim().is_empty() {
        "(no reason given)".to_owned()
    } else {
        out
    }
}

/// A login: an address (`pepsi_conf::address`) of at most [`MAX_LOGIN`] bytes, without
/// white space or control characters.
pub fn check_login(login: &str) -> Result<(), String> {
    if login.is_empty()
        || login.len() > MAX_LOGIN
        || login.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "login {} is not 1 to {MAX_LOGIN} bytes without spaces or control characters",
            shown(login)
        ));
    }
    Address::parse(login).map_err(|e| format!("login: {e}"))?;
    Ok(())
}

/// An amount as GNU Taler writes it, `CURRENCY:VALUE`: a currency of 1 to 12 capital
/// letters or digits (a letter first) and a value of 1 to 16 digits with at most 8 after a
/// point (the rule of `pepsi_contract::settings::secretary::Amount`, which the stage uses).
pub fn check_amount(amount: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "amount {} is not CURRENCY:VALUE (1 to 12 capital letters or digits, a letter \
             first; digits with at most 8 after the point)",
            shown(amount)
        ))
    };
    let Some((currency, value)) = amount.split_once(':') else {
        return bad();
    };
    let currency_ok = !currency.is_empty()
        && currency.len() <= 12
        && currency.as_bytes()[0].is_ascii_uppercase()
        && currency
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    let (whole, frac) = value.split_once('.').unwrap_or((value, ""));
    let digits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    let value_ok = digits(whole, 16) && (!value.contains('.') || digits(frac, 8));
    if currency_ok && value_ok {
        Ok(())
    } else {
        bad()
    }
}

/// A `taler://pay/` URI (scheme and authority in any case) of at most [`MAX_URI`] printable
/// ASCII characters, without spaces, with something after the prefix.
pub fn check_pay_uri(uri: &str) -> Result<(), String> {
    let prefix = uri.get(..12).map(str::to_ascii_lowercase);
    if prefix.as_deref() != Some("taler://pay/") || uri.len() == 12 {
        return Err(format!("uri {} is not a taler://pay/ URI", shown(uri)));
    }
    if uri.len() > MAX_URI {
        return Err(format!("uri is longer than {MAX_URI} bytes"));
    }
    if !uri.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "uri {} holds a character that is not printable ASCII",
            shown(uri)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(login: &str, amount: &str, uri: &str) -> Request {
        Request {
            login: login.into(),
            uri: uri.into(),
            amount: amount.into(),
        }
    }

    const URI: &str = "taler://pay/backend.example/instances/mail/o-17/?c=ABC";

    /// A request reads back as written; one that does not pass the check does not.
    #[test]
    fn requests_table() {
        let long_uri = format!("taler://pay/{}", "a".repeat(MAX_URI - 12));
        let too_long_uri = format!("{long_uri}a");
        let long_login = format!("{}@example.org", "a".repeat(MAX_LOGIN - 12));
        let too_long_login = format!("a{long_login}");
        for (login, amount, uri, error) in [
            ("alice@example.org", "KUDOS:0.5", URI, None),
            ("alice@example.org", "EUR:1", "TALER://PAY/h:8080/o/", None),
            ("Alice@Bücher.example", "TESTKUDOS:0.00000001", URI, None),
            (long_login.as_str(), "EUR:1", long_uri.as_str(), None),
            (
                "alice@example.org",
                "EUR:1",
                too_long_uri.as_str(),
                Some("longer than"),
            ),
            (too_long_login.as_str(), "EUR:1", URI, Some("login")),
            ("alice", "EUR:1", URI, Some("no @")),
            ("@example.org", "EUR:1", URI, Some("empty local part")),
            ("", "EUR:1", URI, Some("login")),
            ("al ice@example.org", "EUR:1", URI, Some("login")),
            ("alice@example.org\r", "EUR:1", URI, Some("login")),
            ("alice@example.org", "eur:1", URI, Some("amount")),
            ("alice@example.org", "EUR", URI, Some("amount")),
            ("alice@example.org", "EUR:", URI, Some("amount")),
            ("alice@example.org", "EUR:1.", URI, Some("amount")),
            ("alice@example.org", "EUR:-1", URI, Some("amount")),
            ("alice@example.org", "EUR:1.123456789", URI, Some("amount")),
            ("alice@example.org", "1EUR:1", URI, Some("amount")),
            ("alice@example.org", "ABCDEFGHIJKLM:1", URI, Some("amount")),
            (
                "alice@example.org",
                "EUR:12345678901234567",
                URI,
                Some("amount"),
            ),
            (
                "alice@example.org",
                "EUR:1",
                "https://x.example/",
                Some("not a taler://pay/"),
            ),
            (
                "alice@example.org",
                "EUR:1",
                "taler://pay/",
                Some("not a taler://pay/"),
            ),
            (
                "alice@example.org",
                "EUR:1",
                "taler://withdraw/x/y",
                Some("not a taler://pay/"),
            ),
            (
                "alice@example.org",
                "EUR:1",
                "taler://pay/h/o/\x01",
                Some("printable"),
            ),
            (
                "alice@example.org",
                "EUR:1",
                "taler://pay/h/ü/",
                Some("printable"),
            ),
            (
                "alice@example.org",
                "EUR:1",
                "taler://pay/h/o\0/",
                Some("printable"),
            ),
        ] {
            let r = request(login, amount, uri);
            match (r.check(), error) {
                (Ok(()), None) => {
                    let line = r.to_line();
                    assert!(
                        line.ends_with('\n') && line.len() <= MAX_REQUEST_LINE,
                        "{line}"
                    );
                    assert_eq!(Request::parse(&line), Ok(r.clone()), "{line}");
                    assert_eq!(Request::parse(line.trim_end_matches('\n')), Ok(r));
                }
                (Err(e), Some(want)) => {
                    assert!(e.contains(want), "{r:?}: {e}");
                    assert!(Request::parse(&r.to_line()).is_err(), "{r:?}");
                }
                (got, want) => panic!("{r:?}: {got:?}, wanted an error with {want:?}"),
            }
        }
    }

    /// Lines that are not a request: the wrong word, fields missing or extra, line breaks,
    /// NUL, and a line past the limit whatever it holds.
    #[test]
    fn malformed_request_lines_table() {
        let long = format!(
            "pay a@b.example EUR:1 taler://pay/{}\n",
            "x".repeat(MAX_REQUEST_LINE)
        );
        for (line, want) in [
            ("", "expected `pay"),
            ("\n", "expected `pay"),
            ("pay\n", "expected `pay"),
            ("PAY a@b.example EUR:1 taler://pay/h/o/\n", "expected `pay"),
            ("pay a@b.example EUR:1\n", "expected `pay"),
            (
                "pay a@b.example EUR:1 taler://pay/h/o/ extra\n",
                "expected `pay",
            ),
            ("pay  a@b.example EUR:1 taler://pay/h/o/\n", "expected `pay"),
            ("pay a@b.example EUR:1 taler://pay/h/o/\r\n", "'\\r'"),
            ("pay a@b.example EUR:1 taler://pay/h/o/\n\n", "'\\n'"),
            ("pay a@b.example EUR:1 taler://pay/h/\0/\n", "'\\0'"),
            (long.as_str(), "longer than"),
        ] {
            let e = Request::parse(line).unwrap_err();
            assert!(e.contains(want), "{line:?}: {e}");
        }
    }

    /// Outcomes read back as written; texts stay one bounded line.
    #[test]
    fn outcomes_table() {
        let long = "é".repeat(MAX_TEXT);
        for (outcome, wire) in [
            (Outcome::Paid, "paid\n".to_owned()),
            (
                Outcome::Refused("no account alice".into()),
                "refused no account alice\n".to_owned(),
            ),
            (
                Outcome::Failed("wallet exited 1: no money".into()),
                "failed wallet exited 1: no money\n".to_owned(),
            ),
            (
                Outcome::Failed("two\nlines\r\0".into()),
                "failed two lines\n".to_owned(),
            ),
            (
                Outcome::Refused(" ".into()),
                "refused (no reason given)\n".to_owned(),
            ),
        ] {
            let line = outcome.to_line();
            assert_eq!(line, wire, "{outcome:?}");
            let back = Outcome::parse(&line).unwrap();
            assert_eq!(back.to_line(), wire, "{outcome:?}");
        }
        let line = Outcome::Failed(long).to_line();
        assert!(line.len() <= MAX_OUTCOME_LINE, "{}", line.len());
        assert!(matches!(Outcome::parse(&line), Ok(Outcome::Failed(t)) if t.len() <= MAX_TEXT));
    }

    #[test]
    fn malformed_outcome_lines_table() {
        let long = format!("failed {}\n", "x".repeat(MAX_OUTCOME_LINE));
        for (line, want) in [
            ("", "unexpected outcome"),
            ("ok\n", "unexpected outcome"),
            ("paid now\n", "unexpected outcome"),
            ("refused\n", "unexpected outcome"),
            ("failed \n", "unexpected outcome"),
            ("Paid\n", "unexpected outcome"),
            ("paid\r\n", "'\\r'"),
            ("failed a\0b\n", "'\\0'"),
            ("paid\npaid\n", "'\\n'"),
            (long.as_str(), "longer than"),
        ] {
            let e = Outcome::parse(line).unwrap_err();
            assert!(e.contains(want), "{line:?}: {e}");
        }
    }
}
