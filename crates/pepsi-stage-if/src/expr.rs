//! The condition language of `pepsi-stage-if`: parsed once at start, evaluated per message
//! without I/O against what the message offers (`Facts`).
//!
//! ```text
//! condition := or
//! or        := and ("or" and)*
//! and       := unary ("and" unary)*
//! unary     := "not" unary | "(" condition ")" | "exists" operand
//!            | "all_rcpt_local" | "any_rcpt_local" | operand [op operand]
//! op        := "==" | "!=" | "~" | "!~" | "contains" | "<" | "<=" | ">" | ">="
//! operand   := mail_from | rcpt_to | auth_user | state.<path> | header:<Name>
//!            | "string" | 'string' | number | true | false | null
//! ```
//!
//! An operand is a list of values (rcpt_to has one per recipient, a header one per field,
//! a missing state key none); a comparison holds when some pair of values satisfies it, and
//! `!=`/`!~` are the negations of `==`/`~`. An operand on its own holds when some value is
//! truthy.

use std::fmt;

use regex::Regex;
use serde_json::Value;

/// A parsed condition.
#[derive(Debug, Clone)]
pub enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Compare(Operand, Op, Operand),
    Exists(Operand),
    Truthy(Operand),
    AllRcptLocal,
    AnyRcptLocal,
}

/// Something a condition reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    MailFrom,
    RcptTo,
    AuthUser,
    /// `state.a.b`: the path below state.
    State(Vec<String>),
    /// `header:Subject`: every field of that name.
    Header(String),
    Literal(Value),
}

#[derive(Debug, Clone)]
pub enum Op {
    Eq,
    Ne,
    Match(Regex),
    NotMatch(Regex),
    Contains,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A syntax error: the character column (1-based) and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at column {}: {}", self.column, self.message)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Num(f64),
    Sym(&'static str),
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Word(w) => write!(f, "`{w}`"),
            Tok::Str(s) => write!(f, "the string {s:?}"),
            Tok::Num(n) => write!(f, "the number {n}"),
            Tok::Sym(s) => write!(f, "`{s}`"),
            Tok::End => f.write_str("the end"),
        }
    }
}

/// Tokens with their character columns.
fn lex(text: &str) -> Result<Vec<(Tok, usize)>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let err = |column: usize, message: String| ParseError { column, message };
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        if let Some(sym) = ["==", "!=", "!~", "<=", ">="]
            .into_iter()
            .find(|s| *s == two)
        {
            out.push((Tok::Sym(sym), col));
            i += 2;
            continue;
        }
        if let Some(sym) = ["~", "<", ">", "(", ")"]
            .into_iter()
            .find(|s| s.starts_with(c))
        {
            out.push((Tok::Sym(sym), col));
            i += 1;
            continue;
        }
        if c == '"' || c == '\'' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(err(col, "a string that is never closed".into())),
                    Some(&q) if q == c => break,
                    Some('\\') => {
                        // Only the quote and the backslash are escaped; any other
                        // backslash stays, so regular expressions read as written.
                        match chars.get(i + 1) {
                            Some(&e) if e == c || e == '\\' => s.push(e),
                            Some(&e) => {
                                s.push('\\');
                                s.push(e);
                            }
                            None => return Err(err(col, "a string that is never closed".into())),
                        }
                        i += 2;
                        continue;
                    }
                    Some(&ch) => s.push(ch),
                }
                i += 1;
            }
            i += 1;
            out.push((Tok::Str(s), col));
            continue;
        }
        if c.is_ascii_digit() || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let n = text
                .parse::<f64>()
                .map_err(|_| err(col, format!("{text:?} is not a number")))?;
            out.push((Tok::Num(n), col));
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || matches!(chars[i], '_' | '.' | ':' | '-'))
            {
                i += 1;
            }
            out.push((Tok::Word(chars[start..i].iter().collect()), col));
            continue;
        }
        return Err(err(col, format!("unexpected character {c:?}")));
    }
    out.push((Tok::End, chars.len() + 1));
    Ok(out)
}

/// Parses a condition.
pub fn parse(text: &str) -> Result<Expr, ParseError> {
    let mut p = Parser {
        toks: lex(text)?,
        pos: 0,
    };
    let e = p.or()?;
    match p.peek() {
        Tok::End => Ok(e),
        other => Err(p.error(format!("expected `and`, `or` or the end, found {other}"))),
    }
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn column(&self) -> usize {
        self.toks[self.pos].1
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].0.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn error(&self, message: String) -> ParseError {
        ParseError {
            column: self.column(),
            message,
        }
    }

    fn keyword(&self, word: &str) -> bool {
        matches!(self.peek(), Tok::Word(w) if w.eq_ignore_ascii_case(word))
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.and()?;
        while self.keyword("or") {
            self.next();
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.unary()?;
        while self.keyword("and") {
            self.next();
            e = Expr::And(Box::new(e), Box::new(self.unary()?));
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.keyword("not") {
            self.next();
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.keyword("exists") {
            self.next();
            return Ok(Expr::Exists(self.operand()?));
        }
        if self.keyword("all_rcpt_local") {
            self.next();
            return Ok(Expr::AllRcptLocal);
        }
        if self.keyword("any_rcpt_local") {
            self.next();
            return Ok(Expr::AnyRcptLocal);
        }
        if *self.peek() == Tok::Sym("(") {
            self.next();
            let e = self.or()?;
            if *self.peek() != Tok::Sym(")") {
                return Err(self.error(format!("expected `)`, found {}", self.peek())));
            }
            self.next();
            return Ok(e);
        }
        let left = self.operand()?;
        let op_col = self.column();
        let op = match self.peek() {
            Tok::Sym("==") => Op::Eq,
            Tok::Sym("!=") => Op::Ne,
            Tok::Sym("<") => Op::Lt,
            Tok::Sym("<=") => Op::Le,
            Tok::Sym(">") => Op::Gt,
            Tok::Sym(">=") => Op::Ge,
            Tok::Sym("~") | Tok::Sym("!~") => {
                let negated = *self.peek() == Tok::Sym("!~");
                self.next();
                let col = self.column();
                let Tok::Str(pattern) = self.next() else {
                    return Err(ParseError {
                        column: col,
                        message: "expected a quoted regular expression after `~`".into(),
                    });
                };
                let re = Regex::new(&pattern).map_err(|e| ParseError {
                    column: col,
                    message: format!("invalid regular expression: {e}"),
                })?;
                let op = if negated {
                    Op::NotMatch(re)
                } else {
                    Op::Match(re)
                };
                return Ok(Expr::Compare(left, op, Operand::Literal(Value::Null)));
            }
            Tok::Word(w) if w.eq_ignore_ascii_case("contains") => Op::Contains,
            _ => return Ok(Expr::Truthy(left)),
        };
        self.next();
        let right = self.operand()?;
        if matches!(op, Op::Lt | Op::Le | Op::Gt | Op::Ge)
            && !matches!(right, Operand::Literal(Value::Number(_)))
            && !matches!(left, Operand::Literal(Value::Number(_)))
        {
            return Err(ParseError {
                column: op_col,
                message: "`<`, `<=`, `>` and `>=` compare with a number".into(),
            });
        }
        Ok(Expr::Compare(left, op, right))
    }

    fn operand(&mut self) -> Result<Operand, ParseError> {
        let col = self.column();
        let bad = |message: String| ParseError {
            column: col,
            message,
        };
        match self.next() {
            Tok::Str(s) => Ok(Operand::Literal(Value::String(s))),
            Tok::Num(n) => Ok(Operand::Literal(
                serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number),
            )),
            Tok::Word(w) => {
                let lower = w.to_ascii_lowercase();
                match lower.as_str() {
                    "mail_from" => Ok(Operand::MailFrom),
                    "rcpt_to" => Ok(Operand::RcptTo),
                    "auth_user" => Ok(Operand::AuthUser),
                    "true" => Ok(Operand::Literal(Value::Bool(true))),
                    "false" => Ok(Operand::Literal(Value::Bool(false))),
                    "null" => Ok(Operand::Literal(Value::Null)),
                    _ if lower.starts_with("state.") => {
                        let path: Vec<String> = w[6..].split('.').map(str::to_owned).collect();
                        if path.iter().any(String::is_empty) {
                            return Err(bad(format!("{w:?} has an empty path step")));
                        }
                        Ok(Operand::State(path))
                    }
                    _ if lower.starts_with("header:") => {
                        let name = &w[7..];
                        if name.is_empty() || name.contains(['.', ':']) {
                            return Err(bad(format!("{w:?} does not name a header field")));
                        }
                        Ok(Operand::Header(name.to_owned()))
                    }
                    _ => Err(bad(format!(
                        "expected mail_from, rcpt_to, auth_user, state.<path>, header:<Name> or a value, found `{w}`"
                    ))),
                }
            }
            other => Err(bad(format!("expected an operand, found {other}"))),
        }
    }
}

impl Expr {
    /// True when evaluating needs the header block.
    pub fn uses_headers(&self) -> bool {
        self.any(&|e| match e {
            Expr::Compare(l, _, r) => {
                matches!(l, Operand::Header(_)) || matches!(r, Operand::Header(_))
            }
            Expr::Exists(o) | Expr::Truthy(o) => matches!(o, Operand::Header(_)),
            _ => false,
        })
    }

    /// True when evaluating needs to know which recipients are local.
    pub fn uses_locality(&self) -> bool {
        self.any(&|e| matches!(e, Expr::AllRcptLocal | Expr::AnyRcptLocal))
    }

    fn any(&self, f: &dyn Fn(&Expr) -> bool) -> bool {
        f(self)
            || match self {
                Expr::And(a, b) | Expr::Or(a, b) => a.any(f) || b.any(f),
                Expr::Not(a) => a.any(f),
                _ => false,
            }
    }

    /// Evaluates the condition against one message.
    pub fn eval(&self, m: &Facts<'_>) -> bool {
        match self {
            Expr::And(a, b) => a.eval(m) && b.eval(m),
            Expr::Or(a, b) => a.eval(m) || b.eval(m),
            Expr::Not(a) => !a.eval(m),
            Expr::Exists(o) => !m.values(o).is_empty(),
            Expr::Truthy(o) => m.values(o).iter().any(truthy),
            Expr::AllRcptLocal => !m.rcpt_local.is_empty() && m.rcpt_local.iter().all(|&l| l),
            Expr::AnyRcptLocal => m.rcpt_local.iter().any(|&l| l),
            Expr::Compare(l, op, r) => {
                let left = m.values(l);
                let right = m.values(r);
                let address = is_address(l) || is_address(r);
                let any = |f: &dyn Fn(&Value, &Value) -> bool| {
                    left.iter().any(|a| right.iter().any(|b| f(a, b)))
                };
                match op {
                    Op::Eq => any(&|a, b| equal(a, b, address)),
                    Op::Ne => !any(&|a, b| equal(a, b, address)),
                    Op::Match(re) => left.iter().any(|a| re.is_match(&text(a))),
                    Op::NotMatch(re) => !left.iter().any(|a| re.is_match(&text(a))),
                    Op::Contains => {
                        any(&|a, b| text(a).to_lowercase().contains(&text(b).to_lowercase()))
                    }
                    Op::Lt => any(&|a, b| numbers(a, b).is_some_and(|(x, y)| x < y)),
                    Op::Le => any(&|a, b| numbers(a, b).is_some_and(|(x, y)| x <= y)),
                    Op::Gt => any(&|a, b| numbers(a, b).is_some_and(|(x, y)| x > y)),
                    Op::Ge => any(&|a, b| numbers(a, b).is_some_and(|(x, y)| x >= y)),
                }
            }
        }
    }
}

fn is_address(o: &Operand) -> bool {
    matches!(o, Operand::MailFrom | Operand::RcptTo | Operand::AuthUser)
}

/// A scalar's text: strings as they are, other values in JSON form.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn equal(a: &Value, b: &Value, address: bool) -> bool {
    if let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) {
        return x == y;
    }
    if address {
        text(a).eq_ignore_ascii_case(&text(b))
    } else {
        text(a) == text(b)
    }
}

fn numbers(a: &Value, b: &Value) -> Option<(f64, f64)> {
    let n = |v: &Value| v.as_f64().or_else(|| v.as_str()?.trim().parse().ok());
    Some((n(a)?, n(b)?))
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// What a condition can read of one message.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    pub mail_from: &'a str,
    pub rcpt_to: &'a [String],
    pub auth_user: Option<&'a str>,
    pub state: Option<&'a serde_json::Map<String, Value>>,
    /// The header block, when loaded.
    pub headers: Option<&'a [u8]>,
    /// One flag per recipient: its domain is local (empty when not computed).
    pub rcpt_local: Vec<bool>,
}

impl Facts<'_> {
    fn values(&self, o: &Operand) -> Vec<Value> {
        match o {
            Operand::MailFrom => vec![Value::String(self.mail_from.to_owned())],
            Operand::RcptTo => self.rcpt_to.iter().cloned().map(Value::String).collect(),
            Operand::AuthUser => self
                .auth_user
                .map(|u| Value::String(u.to_owned()))
                .into_iter()
                .collect(),
            Operand::Literal(v) => vec![v.clone()],
            Operand::Header(name) => header_values(self.headers.unwrap_or_default(), name)
                .into_iter()
                .map(Value::String)
                .collect(),
            Operand::State(path) => {
                let mut current: Vec<&Value> = Vec::new();
                if let Some(v) = self.state.and_then(|s| s.get(&path[0])) {
                    current.push(v);
                }
                for step in &path[1..] {
                    current = current
                        .into_iter()
                        .flat_map(|v| match v {
                            Value::Array(items) => items.iter().collect::<Vec<_>>(),
                            other => vec![other],
                        })
                        .filter_map(|v| v.get(step.as_str()))
                        .collect();
                }
                current
                    .into_iter()
                    .flat_map(|v| match v {
                        Value::Array(items) => items.clone(),
                        Value::Null => Vec::new(),
                        other => vec![other.clone()],
                    })
                    .collect()
            }
        }
    }
}

/// The values of every field named `name` (case-insensitive) in a header block, unfolded
/// and trimmed; not MIME-decoded.
pub fn header_values(headers: &[u8], name: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(headers);
    let mut out: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with([' ', '\t']) {
            if let Some(v) = current.as_mut() {
                v.push_str(line);
            }
            continue;
        }
        if let Some(v) = current.take() {
            out.push(v.trim().to_owned());
        }
        if let Some((field, value)) = line.split_once(':')
            && field.trim_end().eq_ignore_ascii_case(name)
        {
            current = Some(value.to_owned());
        }
    }
    if let Some(v) = current.take() {
        out.push(v.trim().to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts<'a>(state: &'a serde_json::Map<String, Value>, rcpt: &'a [String]) -> Facts<'a> {
        Facts {
            mail_from: "Sender@Example.org",
            rcpt_to: rcpt,
            auth_user: None,
            state: Some(state),
            headers: Some(
                b"Subject: Cheap\r\n  watches\r\nX-Spam: yes\r\nReceived: a\r\nReceived: b\r\n",
            ),
            rcpt_local: vec![true, false],
        }
    }

    #[test]
    fn evaluation_table() {
        let state = json!({
            "junk": true, "attempts": 3, "origin": {"listener": "mx"},
            "auth": {"dkim": [{"result": "fail"}, {"result": "pass", "domain": "example.org"}],
                     "spf": {"result": "softfail"}},
            "empty": ""
        });
        let state = state.as_object().unwrap().clone();
        let rcpt = vec!["a@local.test".to_owned(), "b@remote.test".to_owned()];
        let m = facts(&state, &rcpt);
        let cases = [
            ("state.junk", true),
            ("state.junk == true", true),
            ("not state.junk", false),
            ("state.empty", false),
            ("exists state.empty", true),
            ("exists state.missing", false),
            ("state.missing != 'x'", true),
            ("state.attempts == 3", true),
            ("state.attempts >= 4", false),
            ("state.attempts > 2 and state.attempts < 4", true),
            ("state.origin.listener == \"mx\"", true),
            ("state.auth.dkim.result == 'pass'", true),
            ("state.auth.dkim.result != 'pass'", false),
            ("state.auth.spf.result ~ '^(soft)?fail$'", true),
            ("mail_from == 'sender@example.org'", true),
            ("mail_from ~ '@example\\.org$'", false),
            ("state.origin.listener ~ '^\\w+$'", true),
            ("state.origin.listener == 'm\\'x'", false),
            ("mail_from ~ '(?i)@example\\.org$'", true),
            ("rcpt_to == 'B@remote.test'", true),
            ("rcpt_to contains 'REMOTE'", true),
            ("exists auth_user", false),
            ("header:subject == 'Cheap  watches'", true),
            ("header:Subject contains 'watch'", true),
            ("header:X-Spam == 'yes' or state.junk", true),
            ("header:Received == 'b'", true),
            ("exists header:DKIM-Signature", false),
            ("any_rcpt_local", true),
            ("all_rcpt_local", false),
            ("not (all_rcpt_local or state.junk)", false),
            (
                "state.junk and not any_rcpt_local or state.attempts == 3",
                true,
            ),
        ];
        for (text, expected) in cases {
            let e = parse(text).unwrap_or_else(|err| panic!("{text}: {err}"));
            assert_eq!(e.eval(&m), expected, "{text}");
        }
    }

    #[test]
    fn syntax_errors_name_the_column() {
        let cases = [
            ("state.junk ==", 14, "expected an operand"),
            ("state.junk = 1", 12, "unexpected character"),
            ("mail_from ~ mail_from", 13, "quoted regular expression"),
            ("mail_from ~ '('", 13, "invalid regular expression"),
            ("(state.a", 9, "expected `)`"),
            ("state.a state.b", 9, "expected `and`, `or` or the end"),
            ("subject == 'x'", 1, "expected mail_from"),
            ("'unclosed", 1, "never closed"),
            ("state..a", 1, "empty path step"),
            ("mail_from > 'x'", 11, "compare with a number"),
        ];
        for (text, column, needle) in cases {
            let err = parse(text).unwrap_err();
            assert_eq!(err.column, column, "{text}: {err}");
            assert!(err.message.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn what_a_condition_needs() {
        assert!(parse("header:Subject ~ 'x'").unwrap().uses_headers());
        assert!(
            parse("not (state.a or exists header:X)")
                .unwrap()
                .uses_headers()
        );
        assert!(!parse("state.a").unwrap().uses_headers());
        assert!(parse("state.a and all_rcpt_local").unwrap().uses_locality());
        assert!(!parse("state.a").unwrap().uses_locality());
    }
}
