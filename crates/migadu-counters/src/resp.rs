//! The counting path's Redis wire format (RESP2), without I/O: the counting transaction as
//! bytes, a reply read from borrowed bytes, and what one transaction's replies mean. Both ends
//! of the counting connection (`redis_conn` writing and reading, the tests playing Redis)
//! use these definitions; nothing here may block, allocate per byte or trust a length it read.

use crate::counting::KeyResult;

/// One reply, borrowing its text from the connection's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    Status(&'a [u8]),
    Error(&'a [u8]),
    Int(i64),
    /// `None` is RESP2's null bulk string (`$-1`).
    Bulk(Option<&'a [u8]>),
    /// `None` is RESP2's null array (`*-1`).
    Array(Option<Vec<Reply<'a>>>),
}

/// The bytes cannot be a RESP2 reply; the connection is out of step and must be dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed redis reply: {0}")]
    Malformed(&'static str),
    #[error("redis reply larger than {0} bytes")]
    TooLarge(usize),
}

/// The largest reply the counting connection accepts: the counting path's replies are a few
/// dozen bytes, and a ROLE reply lists a few replicas.
pub const MAX_REPLY: usize = 1 << 20;
/// How deep arrays may nest (ROLE's replica list is the deepest the connection reads: 3).
const MAX_DEPTH: usize = 4;

/// Parses one reply at the start of `buf`: `Ok(None)` while it is incomplete, else the reply
/// and the bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>, ProtocolError> {
    parse_at(buf, 0, 0)
}

fn parse_at(
    buf: &[u8],
    at: usize,
    depth: usize,
) -> Result<Option<(Reply<'_>, usize)>, ProtocolError> {
    let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') else {
        if buf.len() - at > MAX_REPLY {
            return Err(ProtocolError::TooLarge(MAX_REPLY));
        }
        return Ok(None);
    };
    let nl = at + nl;
    if nl == at || buf[nl - 1] != b'\r' {
        return Err(ProtocolError::Malformed("line without its CRLF"));
    }
    if nl == at + 1 {
        return Err(ProtocolError::Malformed("reply without its type"));
    }
    let line_end = nl - 1;
    let line = &buf[at + 1..line_end];
    let next = line_end + 2;
    let kind = buf[at];
    Ok(Some(match kind {
        b'+' => (Reply::Status(line), next),
        b'-' => (Reply::Error(line), next),
        b':' => (Reply::Int(int(line)?), next),
        b'$' => {
            let len = int(line)?;
            if len == -1 {
                (Reply::Bulk(None), next)
            } else {
                let len = usize::try_from(len)
                    .map_err(|_| ProtocolError::Malformed("negative bulk length"))?;
                if len > MAX_REPLY {
                    return Err(ProtocolError::TooLarge(MAX_REPLY));
                }
                if buf.len() < next + len + 2 {
                    return Ok(None);
                }
                if &buf[next + len..next + len + 2] != b"\r\n" {
                    return Err(ProtocolError::Malformed("bulk string without its CRLF"));
                }
                (Reply::Bulk(Some(&buf[next..next + len])), next + len + 2)
            }
        }
        b'*' => {
            let count = int(line)?;
            if count == -1 {
                (Reply::Array(None), next)
            } else {
                let count = usize::try_from(count)
                    .map_err(|_| ProtocolError::Malformed("negative array length"))?;
                if depth >= MAX_DEPTH {
                    return Err(ProtocolError::Malformed("arrays nested too deep"));
                }
                // Each element takes at least three bytes, so a count the buffer's bound
                // cannot hold is refused before anything is reserved for it.
                if count > MAX_REPLY / 3 {
                    return Err(ProtocolError::TooLarge(MAX_REPLY));
                }
                let mut items = Vec::with_capacity(count.min(64));
                let mut pos = next;
                for _ in 0..count {
                    if pos >= buf.len() {
                        return Ok(None);
                    }
                    match parse_at(buf, pos, depth + 1)? {
                        Some((item, after)) => {
                            items.push(item);
                            pos = after;
                        }
                        None => return Ok(None),
                    }
                }
                (Reply::Array(Some(items)), pos)
            }
        }
        _ => return Err(ProtocolError::Malformed("unknown reply type")),
    }))
}

fn int(line: &[u8]) -> Result<i64, ProtocolError> {
    let bad = ProtocolError::Malformed("not an integer");
    let (neg, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(bad);
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(bad);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(i64::from(d - b'0')))
            .ok_or(ProtocolError::Malformed("integer out of range"))?;
    }
    Ok(if neg { -n } else { n })
}

/// Appends one command as a RESP2 array of bulk strings.
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_usize(out, args.len());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        push_usize(out, a.len());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_usize(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Appends the counting transaction of one request: MULTI, `INCR key` and `EXPIRE key ttl`
/// for each key, EXEC. Its replies are `2 + 2 * keys.len()` (`TxReplies`).
pub fn encode_counting_tx(out: &mut Vec<u8>, keys: &[&str], ttl_seconds: i64) {
    let mut ttl = Vec::with_capacity(20);
    push_usize(&mut ttl, ttl_seconds.unsigned_abs() as usize);
    encode_command(out, &[b"MULTI"]);
    for k in keys {
        encode_command(out, &[b"INCR", k.as_bytes()]);
        encode_command(out, &[b"EXPIRE", k.as_bytes(), &ttl]);
    }
    encode_command(out, &[b"EXEC"]);
}

/// What one counting transaction's replies came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxOutcome {
    /// Each key's INCR reply: the new value, or that key's own error.
    Done(Vec<KeyResult>),
    /// Redis ran none of it (EXECABORT: a command refused while queued, READONLY on a demoted
    /// master; or MULTI refused and every INCR with it): safe to send again.
    Refused(String),
}

/// Reads the replies of one `encode_counting_tx` transaction, one at a time, in order.
pub struct TxReplies {
    keys: usize,
    seen: usize,
    /// MULTI's error, when MULTI was refused: the commands after it then ran (or failed) one
    /// by one, and their own replies are the results.
    multi_refused: Option<String>,
    queue_error: Option<String>,
    direct: Vec<KeyResult>,
}

impl TxReplies {
    pub fn new(keys: usize) -> TxReplies {
        TxReplies {
            keys,
            seen: 0,
            multi_refused: None,
            queue_error: None,
            direct: Vec::new(),
        }
    }

    /// Takes the next reply; the outcome comes with the last one (EXEC's).
    pub fn feed(&mut self, reply: &Reply<'_>) -> Option<TxOutcome> {
        let i = self.seen;
        self.seen += 1;
        let commands = 2 * self.keys;
        if i == 0 {
            if let Reply::Error(e) = reply {
                self.multi_refused = Some(text(e));
                self.direct = Vec::with_capacity(self.keys);
            } else if !matches!(reply, Reply::Status(_)) {
                self.multi_refused = Some(format!("unexpected MULTI reply {}", show(reply)));
                self.direct = Vec::with_capacity(self.keys);
            }
            return None;
        }
        if i <= commands {
            if self.multi_refused.is_some() {
                // INCR replies are the even commands (1, 3, ...); EXPIRE's are left aside.
                if i % 2 == 1 {
                    self.direct.push(key_result(reply));
                }
            } else if let Reply::Error(e) = reply {
                self.queue_error.get_or_insert_with(|| text(e));
            }
            return None;
        }
        Some(self.exec(reply))
    }

    fn exec(&mut self, reply: &Reply<'_>) -> TxOutcome {
        if let Some(why) = self.multi_refused.take() {
            let direct = std::mem::take(&mut self.direct);
            return if direct.iter().any(|r| matches!(r, KeyResult::Counted(_))) {
                TxOutcome::Done(direct)
            } else {
                TxOutcome::Refused(why)
            };
        }
        match reply {
            Reply::Array(Some(items)) if items.len() == 2 * self.keys => {
                TxOutcome::Done(items.iter().step_by(2).map(key_result).collect())
            }
            Reply::Error(e) => TxOutcome::Refused(match self.queue_error.take() {
                Some(q) => format!("{} ({q})", text(e)),
                None => text(e),
            }),
            other => TxOutcome::Refused(format!("unexpected EXEC reply {}", show(other))),
        }
    }
}

fn key_result(reply: &Reply<'_>) -> KeyResult {
    match reply {
        Reply::Int(n) => KeyResult::Counted(*n),
        Reply::Error(e) => KeyResult::Failed(text(e)),
        other => KeyResult::Failed(format!("unexpected reply {}", show(other))),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A reply as a log line shows it, cut short.
fn show(reply: &Reply<'_>) -> String {
    let mut s = format!("{reply:?}");
    if s.len() > 120 {
        let mut cut = 117;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &[u8], want: Result<Option<(Reply<'_>, usize)>, ProtocolError>) {
        assert_eq!(parse(input), want, "{:?}", String::from_utf8_lossy(input));
    }

    #[test]
    fn replies_parse_or_wait_for_more() {
        use Reply::*;
        check(b"+OK\r\n", Ok(Some((Status(b"OK"), 5))));
        check(b"+QUEUED\r\n+OK", Ok(Some((Status(b"QUEUED"), 9))));
        check(b"-ERR no\r\n", Ok(Some((Error(b"ERR no"), 9))));
        check(b":42\r\n", Ok(Some((Int(42), 5))));
        check(b":-7\r\n", Ok(Some((Int(-7), 5))));
        check(b"$3\r\nabc\r\n", Ok(Some((Bulk(Some(b"abc")), 9))));
        check(b"$0\r\n\r\n", Ok(Some((Bulk(Some(b"")), 6))));
        check(b"$-1\r\n", Ok(Some((Bulk(None), 5))));
        check(b"*-1\r\n", Ok(Some((Array(None), 5))));
        check(b"*0\r\n", Ok(Some((Array(Some(vec![])), 4))));
        check(
            b"*2\r\n:1\r\n-WRONGTYPE x\r\n",
            Ok(Some((Array(Some(vec![Int(1), Error(b"WRONGTYPE x")])), 22))),
        );
        check(
            b"*2\r\n*1\r\n$1\r\na\r\n:3\r\n",
            Ok(Some((
                Array(Some(vec![Array(Some(vec![Bulk(Some(b"a"))])), Int(3)])),
                19,
            ))),
        );
        // incomplete at every cut
        let whole = b"*2\r\n:1\r\n$5\r\nhello\r\n";
        for cut in 0..whole.len() {
            check(&whole[..cut], Ok(None));
        }
    }

    #[test]
    fn bytes_that_are_no_reply_are_refused() {
        let malformed = |what| Err(ProtocolError::Malformed(what));
        check(b"?x\r\n", malformed("unknown reply type"));
        check(b":1\n", malformed("line without its CRLF"));
        check(b"\n", malformed("line without its CRLF"));
        check(b"\r\n", malformed("reply without its type"));
        check(b":12a\r\n", malformed("not an integer"));
        check(b":\r\n", malformed("not an integer"));
        check(b":99999999999999999999\r\n", malformed("not an integer"));
        check(
            b":9999999999999999999\r\n",
            malformed("integer out of range"),
        );
        check(b"$-2\r\n", malformed("negative bulk length"));
        check(b"*-5\r\n", malformed("negative array length"));
        check(
            b"$3\r\nabcde\r\n",
            malformed("bulk string without its CRLF"),
        );
        check(
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            malformed("arrays nested too deep"),
        );
        check(b"$99999999\r\n", Err(ProtocolError::TooLarge(MAX_REPLY)));
        check(b"*99999999\r\n", Err(ProtocolError::TooLarge(MAX_REPLY)));
        let mut endless = vec![b'+'];
        endless.resize(MAX_REPLY + 2, b'a');
        check(&endless, Err(ProtocolError::TooLarge(MAX_REPLY)));
    }

    #[test]
    fn the_counting_transaction_is_multi_incr_expire_exec() {
        let mut out = Vec::new();
        encode_counting_tx(&mut out, &["cnt/A/a@b/d/2026-12-07/o", "k2"], 2_678_400);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "*1\r\n$5\r\nMULTI\r\n\
             *2\r\n$4\r\nINCR\r\n$24\r\ncnt/A/a@b/d/2026-12-07/o\r\n\
             *3\r\n$6\r\nEXPIRE\r\n$24\r\ncnt/A/a@b/d/2026-12-07/o\r\n$7\r\n2678400\r\n\
             *2\r\n$4\r\nINCR\r\n$2\r\nk2\r\n\
             *3\r\n$6\r\nEXPIRE\r\n$2\r\nk2\r\n$7\r\n2678400\r\n\
             *1\r\n$4\r\nEXEC\r\n"
        );
    }

    /// Feeds the replies of a two-key transaction, given as raw RESP, and returns the outcome.
    fn outcome(raw: &[u8]) -> Option<TxOutcome> {
        let mut tx = TxReplies::new(2);
        let mut rest = raw;
        let mut last = None;
        while !rest.is_empty() {
            let (reply, used) = parse(rest).unwrap().expect("a whole reply");
            assert!(last.is_none(), "replies after EXEC's");
            last = tx.feed(&reply);
            rest = &rest[used..];
        }
        last
    }

    #[test]
    fn a_transactions_replies_come_to_its_outcome() {
        use KeyResult::*;
        use TxOutcome::*;
        let queued = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n";
        let table: &[(&[u8], Option<TxOutcome>)] = &[
            (
                b"*4\r\n:3\r\n:1\r\n:9\r\n:1\r\n",
                Some(Done(vec![Counted(3), Counted(9)])),
            ),
            (
                b"*4\r\n-WRONGTYPE Operation against a key\r\n:1\r\n:9\r\n:1\r\n",
                Some(Done(vec![
                    Failed("WRONGTYPE Operation against a key".into()),
                    Counted(9),
                ])),
            ),
            (
                b"-EXECABORT Transaction discarded\r\n",
                Some(Refused("EXECABORT Transaction discarded".into())),
            ),
            (
                b"*-1\r\n",
                Some(Refused("unexpected EXEC reply Array(None)".into())),
            ),
            (
                b"*2\r\n:3\r\n:1\r\n",
                Some(Refused(
                    "unexpected EXEC reply Array(Some([Int(3), Int(1)]))".into(),
                )),
            ),
        ];
        for (exec, want) in table {
            let raw = [&queued[..], exec].concat();
            assert_eq!(&outcome(&raw), want, "{}", String::from_utf8_lossy(exec));
        }
        // a command refused while queued: EXEC aborts, and the outcome names both errors
        assert_eq!(
            outcome(b"+OK\r\n+QUEUED\r\n-READONLY replica\r\n+QUEUED\r\n+QUEUED\r\n-EXECABORT discarded\r\n"),
            Some(Refused("EXECABORT discarded (READONLY replica)".into()))
        );
        // MULTI refused: the commands ran one by one, and their own replies are the results
        assert_eq!(
            outcome(b"-ERR MULTI calls can not be nested\r\n:4\r\n:1\r\n:5\r\n:1\r\n-ERR EXEC without MULTI\r\n"),
            Some(Done(vec![Counted(4), Counted(5)]))
        );
        // ... unless none of them counted: then nothing ran, and it may be sent again
        assert_eq!(
            outcome(b"-NOAUTH Authentication required\r\n-NOAUTH a\r\n-NOAUTH a\r\n-NOAUTH a\r\n-NOAUTH a\r\n-NOAUTH a\r\n"),
            Some(Refused("NOAUTH Authentication required".into()))
        );
        // no outcome before EXEC's reply
        assert_eq!(outcome(queued), None);
    }
}
