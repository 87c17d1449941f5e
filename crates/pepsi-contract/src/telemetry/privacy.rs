//! What of a span may leave its host: with `[pepsi-telemetry-client] ADDRESSES` off (the
//! default) no envelope address, and nothing address-shaped in an error text (a peer's
//! "550 <bob@example.org>: unknown user" becomes "550 <[address]>: unknown user"). The
//! sending processes apply it before a span reaches the socket (`Emitter`) and the client
//! again as a span arrives, so a record from a process configured otherwise is held to the
//! client's rule. Pure.
//!
//! An address is known by its `@`. What carries none cannot be told from any other word and
//! stays: a bare local part (`<bob>: unknown user`), and the start of a local part where a
//! text was cut before its `@`. A text cut after the `@` is masked like a whole address, so
//! `... <bob@` at the end of a cut text leaves as `... <[address]`.

use std::borrow::Cow;

use super::wire::SpanRecord;

/// What replaces an address in an error text when addresses may not leave the host.
pub const ADDRESS_MARK: &str = "[address]";

/// The record as the client keeps it: with `addresses` off, without its envelope and with
/// the addresses in its error text masked.
pub fn admit(mut rec: SpanRecord, addresses: bool) -> SpanRecord {
    if !addresses {
        rec.mail_from = None;
        rec.rcpt_to = Vec::new();
        if let Some(error) = &rec.error
            && let Cow::Owned(masked) = mask_addresses(error)
        {
            rec.error = Some(masked);
        }
    }
    rec
}

fn is_local_char(c: char) -> bool {
    c.is_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.".contains(c)
}

fn is_domain_char(c: char) -> bool {
    c.is_alphanumeric() || c == '.' || c == '-'
}

/// Where the local part before the `@` at `at` starts: at the opening quote of a quoted
/// local part (`"john doe"@`, escapes inside taken as such), else at the first of the run
/// of characters a dot-atom may hold (a stray closing quote included). `at` when there is
/// none.
fn local_start(chars: &[(usize, char)], at: usize) -> usize {
    if at > 0 && chars[at - 1].1 == '"' {
        let mut k = at - 1;
        while k > 0 {
            k -= 1;
            if chars[k].1 != '"' {
                continue;
            }
            let escapes = chars[..k]
                .iter()
                .rev()
                .take_while(|&&(_, c)| c == '\\')
                .count();
            if escapes % 2 == 0 {
                return k;
            }
        }
    }
    let mut l = at;
    if l > 0 && chars[l - 1].1 == '"' {
        l -= 1;
    }
    while l > 0 && is_local_char(chars[l - 1].1) {
        l -= 1;
    }
    l
}

/// `text` with every `local@domain` replaced by [`ADDRESS_MARK`]; borrowed when it holds
/// none. The local part may be quoted (`"john doe"@example.org`). A `local@` that ends the
/// text (one cut short after its `@`) is masked too; any other `@` without a local part or
/// a domain stays, and so does anything without an `@`.
pub fn mask_addresses(text: &str) -> Cow<'_, str> {
    if !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let offset = |k: usize| chars.get(k).map_or(text.len(), |&(o, _)| o);
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (k, &(_, c)) in chars.iter().enumerate() {
        if c != '@' {
            continue;
        }
        let l = local_start(&chars, k);
        let mut r = k + 1;
        while r < chars.len() && is_domain_char(chars[r].1) {
            r += 1;
        }
        // A sentence's full stop is not the domain's.
        while r > k + 1 && chars[r - 1].1 == '.' {
            r -= 1;
        }
        let cut_after_at = k + 1 == chars.len();
        if l == k || (r == k + 1 && !cut_after_at) {
            continue;
        }
        ranges.push((offset(l), offset(r)));
    }
    if ranges.is_empty() {
        return Cow::Borrowed(text);
    }
    // A quoted local part may hold an `@` of its own: its range starts before the inner one.
    ranges.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in ranges {
        if end <= at {
            continue;
        }
        if start >= at {
            out.push_str(&text[at..start]);
            out.push_str(ADDRESS_MARK);
        }
        at = end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::wire::{MAX_ERROR, SpanKind, SpanOutcome};
    use crate::telemetry::{SpanId, TraceId};

    fn record() -> SpanRecord {
        SpanRecord {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            parent: None,
            kind: SpanKind::Pass,
            program: "pepsi-stage-relay".into(),
            pid: 7,
            stage: Some("relay".into()),
            queue_id: Some(1),
            message_id: None,
            start_ns: 1,
            end_ns: 2,
            outcome: SpanOutcome::Failed,
            next_stage: None,
            fused_into: None,
            dispatch_wait_ms: None,
            error: None,
            rcpt_count: Some(1),
            size: None,
            mail_from: Some("alice@example.org".into()),
            rcpt_to: vec!["bob@example.org".into()],
            sender_dropped: 0,
        }
    }

    #[test]
    fn addresses_in_error_texts() {
        let cases = [
            ("no address here", "no address here"),
            (
                "550 5.1.1 <bob@example.org>: unknown user",
                "550 5.1.1 <[address]>: unknown user",
            ),
            ("to bob@example.org.", "to [address]."),
            ("a@b, c.d+e@f-g.example", "[address], [address]"),
            ("o'brien@example.ie bounced", "[address] bounced"),
            ("jürgen@bücher.example", "[address]"),
            ("user@ is no address", "user@ is no address"),
            ("@example.org", "@example.org"),
            ("a@b@c", "[address]"),
            ("@", "@"),
            // A quoted local part goes whole, with its spaces, escapes and `@`.
            (
                r#"550 <"john doe"@example.org>: unknown"#,
                "550 <[address]>: unknown",
            ),
            (r#""a\"b c"@example.org x"#, "[address] x"),
            (r#""a@b"@example.org"#, "[address]"),
            (r#"to "x y"@ example.org"#, r#"to "x y"@ example.org"#),
            (r#"stray"@example.org"#, "[address]"),
            // Without an `@` nothing tells a local part from a word: it stays.
            (
                "550 5.1.1 <bob>: unknown user",
                "550 5.1.1 <bob>: unknown user",
            ),
            // A text cut right after the `@` (or inside the domain) keeps no local part.
            ("550 5.1.1 <bob@", "550 5.1.1 <[address]"),
            ("550 5.1.1 <bob@exa", "550 5.1.1 <[address]"),
            (r#"550 <"john doe"@"#, "550 <[address]"),
            ("user@", "[address]"),
        ];
        for (text, want) in cases {
            assert_eq!(mask_addresses(text), want, "{text}");
        }
        assert!(matches!(mask_addresses("plain"), Cow::Borrowed(_)));
        assert!(matches!(mask_addresses("a @ b"), Cow::Borrowed(_)));
    }

    #[test]
    fn an_error_cut_to_its_limit_right_after_the_at_leaves_no_local_part() {
        // As the client reads it: the record's error is cut to MAX_ERROR before `admit`.
        let prefix = "x".repeat(MAX_ERROR - "<bob@".len());
        let mut rec = record();
        rec.error = Some(format!("{prefix}<bob@example.org>: unknown user"));
        let read = SpanRecord::decode(&serde_json::to_vec(&rec).unwrap()).unwrap();
        assert!(read.error.as_deref().unwrap().ends_with("<bob@"));
        let admitted = admit(read, false);
        let error = admitted.error.unwrap();
        assert_eq!(error, format!("{prefix}<{ADDRESS_MARK}"));
        assert!(!error.contains("bob"));
    }
}
