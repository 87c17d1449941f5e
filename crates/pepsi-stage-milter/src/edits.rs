//! The changes a filter asks for at the end of a message, and how they apply to the stored
//! header block, body and envelope. Pure: no I/O.
//!
//! Header edits follow the milter rules: `add` appends a field; `insert` puts one before the
//! field at `index` (0: first; past the end: last); `change` replaces the `index`-th field of
//! that name (1-based, case-insensitive; 0 counts as 1) with the new value, deletes it when
//! the value is empty, and appends the field when there is no such occurrence. A replaced
//! body arrives in chunks, concatenated here. Line ends in what the filter sends (LF or
//! CRLF) are stored as CRLF.

/// Every change a filter asked for, in the order it asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    pub headers: Vec<HeaderEdit>,
    /// The new body, when the filter replaced it.
    pub body: Option<Vec<u8>>,
    /// The new envelope sender, without angle brackets.
    pub mail_from: Option<String>,
    /// Recipients added, without angle brackets.
    pub add_rcpt: Vec<String>,
    /// Recipients removed, without angle brackets.
    pub delete_rcpt: Vec<String>,
    /// Set when the filter quarantined the message: its reason.
    pub quarantine: Option<String>,
}

impl Edits {
    /// Changes nothing in the message (a quarantine is not a change of content).
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
            && self.body.is_none()
            && self.mail_from.is_none()
            && self.add_rcpt.is_empty()
            && self.delete_rcpt.is_empty()
    }

    /// The body after the replacement chunks so far and `chunk`.
    pub fn append_body(&mut self, chunk: &[u8]) {
        self.body
            .get_or_insert_with(Vec::new)
            .extend_from_slice(chunk);
    }
}

/// One header change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderEdit {
    Add {
        name: String,
        value: Vec<u8>,
    },
    Insert {
        index: u32,
        name: String,
        value: Vec<u8>,
    },
    Change {
        index: u32,
        name: String,
        value: Vec<u8>,
    },
}

/// The fields of a header block, each with its folded lines and line end as stored: the
/// one split both what the filter is sent and where its changes go count by. A line that
/// is neither a field (no colon) nor folded belongs to the field before it.
pub fn fields(headers: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for line in headers.split_inclusive(|&b| b == b'\n') {
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        let continues = matches!(line.first(), Some(b' ' | b'\t')) || !line.contains(&b':');
        match out.last_mut() {
            Some(last) if continues => last.extend_from_slice(line),
            _ => out.push(line.to_vec()),
        }
    }
    out
}

fn name_of(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == b':').unwrap_or(field.len());
    field[..end].trim_ascii_end()
}

/// `Name: value` with CRLF line ends; with `leading_space` the value already carries its
/// separator (as the filter sent it), else one space goes before it.
pub fn field(name: &str, value: &[u8], leading_space: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + value.len() + 4);
    out.extend_from_slice(name.as_bytes());
    out.push(b':');
    if !leading_space {
        out.push(b' ');
    }
    out.extend_from_slice(&crlf(value));
    out.extend_from_slice(b"\r\n");
    out
}

/// `text` with every line end, LF or CRLF, written CRLF.
fn line_ends(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 16);
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'\r' if text.get(i + 1) == Some(&b'\n') => {
                out.extend_from_slice(b"\r\n");
                i += 2;
                continue;
            }
            b'\n' => out.extend_from_slice(b"\r\n"),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// A header value as one field: CRLF line ends, every line after the first folded (a tab
/// put in front of one that does not start with white space), empty lines and bare CRs
/// dropped, no line end after the last line. A filter's value can neither end the header
/// block nor start a field of its own.
pub fn crlf(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 8);
    for (i, line) in value.split(|&b| b == b'\n').enumerate() {
        let line: Vec<u8> = line.iter().copied().filter(|&b| b != b'\r').collect();
        if i > 0 && line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if i > 0 {
            out.extend_from_slice(b"\r\n");
            if !matches!(line.first(), Some(b' ' | b'\t')) {
                out.push(b'\t');
            }
        }
        out.extend_from_slice(&line);
    }
    out
}

/// A body with every line end CRLF, its last line ended too (a replaced body, as filters
/// send LF or CRLF).
pub fn crlf_body(body: &[u8]) -> Vec<u8> {
    let mut out = line_ends(body);
    if !out.is_empty() && !out.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The header block after `edits`, in order. The block keeps its ending blank line, if it
/// had one.
pub fn apply_headers(headers: &[u8], edits: &[HeaderEdit], leading_space: bool) -> Vec<u8> {
    let mut list = fields(headers);
    for edit in edits {
        match edit {
            HeaderEdit::Add { name, value } => list.push(field(name, value, leading_space)),
            HeaderEdit::Insert { index, name, value } => {
                let at = (*index as usize).min(list.len());
                list.insert(at, field(name, value, leading_space));
            }
            HeaderEdit::Change { index, name, value } => {
                let nth = (*index).max(1) as usize;
                let found = list
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| name_of(f).eq_ignore_ascii_case(name.as_bytes()))
                    .nth(nth - 1)
                    .map(|(i, _)| i);
                match (found, value.is_empty()) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (Some(i), false) => list[i] = field(name, value, leading_space),
                    (None, true) => {}
                    (None, false) => list.push(field(name, value, leading_space)),
                }
            }
        }
    }
    let mut out: Vec<u8> = list.concat();
    let ended = headers.ends_with(b"\r\n\r\n") || headers.ends_with(b"\n\n") || headers == b"\r\n";
    if ended {
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The recipients after the filter's deletions and additions: a deleted one goes (compared
/// without angle brackets, case-insensitively), an added one is appended unless already
/// there. Returns the new list and, for each entry, the index it had (`None`: added).
pub fn apply_recipients(rcpt_to: &[String], edits: &Edits) -> Vec<(String, Option<usize>)> {
    let same = |a: &str, b: &str| bare(a).eq_ignore_ascii_case(bare(b));
    let mut out: Vec<(String, Option<usize>)> = rcpt_to
        .iter()
        .enumerate()
        .filter(|(_, r)| !edits.delete_rcpt.iter().any(|d| same(d, r)))
        .map(|(i, r)| (r.clone(), Some(i)))
        .collect();
    for added in &edits.add_rcpt {
        let added = bare(added);
        if !added.is_empty() && !out.iter().any(|(r, _)| same(r, added)) {
            out.push((added.to_owned(), None));
        }
    }
    out
}

/// Whether a filter's sender or recipient can go into the envelope: at most 320 bytes,
/// no white space or control characters, and for a recipient a local part and a domain
/// (the sender may be empty: the null sender).
pub fn valid_address(address: &str, sender: bool) -> bool {
    if address.is_empty() {
        return sender;
    }
    address.len() <= 320
        && !address.chars().any(|c| c.is_whitespace() || c.is_control())
        && !address.contains(['<', '>'])
        && pepsi_conf::address::parts(address)
            .is_some_and(|(local, domain)| !local.is_empty() && !domain.is_empty())
}

/// An address without surrounding space and angle brackets.
pub fn bare(address: &str) -> &str {
    let a = address.trim();
    a.strip_prefix('<')
        .and_then(|a| a.strip_suffix('>'))
        .unwrap_or(a)
        .trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &[u8] = b"Received: from x\r\n\tby y\r\nFrom: a@example.org\r\n\
Subject: one\r\nX-Tag: 1\r\nSubject: two\r\nX-Tag: 2\r\n\r\n";

    fn add(name: &str, value: &str) -> HeaderEdit {
        HeaderEdit::Add {
            name: name.into(),
            value: value.as_bytes().to_vec(),
        }
    }
    fn insert(index: u32, name: &str, value: &str) -> HeaderEdit {
        HeaderEdit::Insert {
            index,
            name: name.into(),
            value: value.as_bytes().to_vec(),
        }
    }
    fn change(index: u32, name: &str, value: &str) -> HeaderEdit {
        HeaderEdit::Change {
            index,
            name: name.into(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn header_edits_as_a_table() {
        let cases: Vec<(Vec<HeaderEdit>, &str)> = vec![
            (vec![], std::str::from_utf8(BLOCK).unwrap()),
            (
                vec![add("X-Spam", "Yes")],
                "Received: from x\r\n\tby y\r\nFrom: a@example.org\r\nSubject: one\r\n\
                 X-Tag: 1\r\nSubject: two\r\nX-Tag: 2\r\nX-Spam: Yes\r\n\r\n",
            ),
            (
                vec![insert(0, "DKIM-Signature", "v=1;\n\tb=abc")],
                "DKIM-Signature: v=1;\r\n\tb=abc\r\nReceived: from x\r\n\tby y\r\n\
                 From: a@example.org\r\nSubject: one\r\nX-Tag: 1\r\nSubject: two\r\n\
                 X-Tag: 2\r\n\r\n",
            ),
            (
                vec![insert(99, "X-Last", "z")],
                "Received: from x\r\n\tby y\r\nFrom: a@example.org\r\nSubject: one\r\n\
                 X-Tag: 1\r\nSubject: two\r\nX-Tag: 2\r\nX-Last: z\r\n\r\n",
            ),
            (
                vec![change(2, "subject", "[SPAM] two")],
                "Received: from x\r\n\tby y\r\nFrom: a@example.org\r\nSubject: one\r\n\
                 X-Tag: 1\r\nsubject: [SPAM] two\r\nX-Tag: 2\r\n\r\n",
            ),
            (
                vec![change(0, "X-Tag", ""), change(1, "X-Tag", "")],
                "Received: from x\r\n\tby y\r\nFrom: a@example.org\r\nSubject: one\r\n\
                 Subject: two\r\n\r\n",
            ),
            (
                vec![change(3, "X-Tag", "3"), change(5, "X-None", "")],
                "Received: from x\r\n\tby y\r\nFrom: a@example.org\r\nSubject: one\r\n\
                 X-Tag: 1\r\nSubject: two\r\nX-Tag: 2\r\nX-Tag: 3\r\n\r\n",
            ),
            (
                vec![change(1, "Received", "")],
                "From: a@example.org\r\nSubject: one\r\nX-Tag: 1\r\nSubject: two\r\n\
                 X-Tag: 2\r\n\r\n",
            ),
        ];
        for (edits, want) in cases {
            let got = apply_headers(BLOCK, &edits, false);
            assert_eq!(String::from_utf8(got).unwrap(), want, "{edits:?}");
        }
    }

    #[test]
    fn a_filter_that_sends_the_leading_space_keeps_its_own() {
        let got = apply_headers(b"A: 1\r\n\r\n", &[add("B", "  indented")], true);
        assert_eq!(got, b"A: 1\r\nB:  indented\r\n\r\n");
    }

    #[test]
    fn a_filters_value_cannot_end_the_header_or_start_a_field() {
        let got = apply_headers(
            b"A: 1\r\n\r\n",
            &[add("X-Info", "a\n\nBcc: x@example.org\r\n\tfolded\rcr")],
            false,
        );
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "A: 1\r\nX-Info: a\r\n\tBcc: x@example.org\r\n\tfoldedcr\r\n\r\n"
        );
        let fields = fields(b"A: 1\r\nno colon here\r\nB: 2\r\n\r\n");
        assert_eq!(fields.len(), 2, "{fields:?}");
    }

    #[test]
    fn filter_addresses_are_checked() {
        for (a, sender, ok) in [
            ("a@example.org", false, true),
            ("", true, true),
            ("", false, false),
            ("a@", false, false),
            ("nodomain", false, false),
            ("a@b\r\nRCPT TO:<x@y>", true, false),
            ("Foo <a@b>", false, false),
        ] {
            assert_eq!(valid_address(a, sender), ok, "{a:?}");
        }
    }

    #[test]
    fn replaced_bodies_end_lines_with_crlf() {
        assert_eq!(crlf_body(b"a\nb\n"), b"a\r\nb\r\n");
        assert_eq!(crlf_body(b"a\r\nb"), b"a\r\nb\r\n");
        assert_eq!(crlf_body(b""), b"");
    }

    #[test]
    fn recipients_are_deleted_and_added_once() {
        let rcpt = vec!["a@example.test".to_owned(), "B@example.test".to_owned()];
        let edits = Edits {
            delete_rcpt: vec!["<b@EXAMPLE.test>".into()],
            add_rcpt: vec![
                "<c@example.test>".into(),
                "a@example.test".into(),
                "<>".into(),
            ],
            ..Edits::default()
        };
        assert_eq!(
            apply_recipients(&rcpt, &edits),
            vec![
                ("a@example.test".to_owned(), Some(0)),
                ("c@example.test".to_owned(), None)
            ]
        );
    }
}
