//! Members as CSV: reading a Mailman 3 members export (the Postorius download and what
//! `mailman members` gives, turned into CSV) for `import`, and writing `export`'s, which
//! `import` reads back.
//!
//! The format: a header row naming an `email` column and, optionally, a `display_name`
//! column (the common spellings, any letter case: `email`, `E-mail`, `Email Address`,
//! `address`; `display_name`, `Display Name`, `name`, `real_name`, `full_name`); other columns
//! are ignored. A file whose first row holds an address and no such header is read as
//! headerless: the address first, the display name second. Every row is checked on its
//! own; a row that is not a member is reported with its line number and never stops the
//! rest. Pure apart from the reader and writer it is handed.

use std::collections::HashSet;
use std::io::Write;

use serde::Serialize;

use crate::names;

/// The header `export` writes.
pub const HEADER: [&str; 2] = ["email", "display_name"];

/// The longest display name stored (the schema's CHECK).
pub const MAX_NAME_CHARS: usize = 200;

const EMAIL_NAMES: [&str; 5] = [
    "email",
    "e_mail",
    "email_address",
    "e_mail_address",
    "address",
];
const NAME_NAMES: [&str; 6] = [
    "display_name",
    "name",
    "real_name",
    "realname",
    "full_name",
    "fullname",
];

/// Where the columns are: from a header row, or the first two of a headerless file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns {
    pub email: usize,
    pub name: Option<usize>,
    /// The first row is a header (not a member).
    pub header: bool,
}

/// A header cell as compared: trimmed, byte-order mark removed, lower-case, spaces and
/// hyphens as `_`.
fn header_word(cell: &str) -> String {
    cell.trim_start_matches('\u{feff}')
        .trim()
        .to_lowercase()
        .replace([' ', '-'], "_")
}

/// The columns the first row names; the error says what the header must hold.
pub fn columns(first: &[&str]) -> Result<Columns, String> {
    let words: Vec<String> = first.iter().map(|c| header_word(c)).collect();
    let find = |names: &[&str]| words.iter().position(|w| names.contains(&w.as_str()));
    if let Some(email) = find(&EMAIL_NAMES) {
        return Ok(Columns {
            email,
            name: find(&NAME_NAMES),
            header: true,
        });
    }
    if first.first().is_some_and(|c| c.contains('@')) {
        return Ok(Columns {
            email: 0,
            // A later row may have a name where the first has none.
            name: Some(1),
            header: false,
        });
    }
    Err(format!(
        "line 1: the header names no email column (it has: {}); the first row must name \
         an email column (email, address) and may name a display_name column \
         (display_name, name)",
        first
            .iter()
            .map(|c| format!("{:?}", c.trim_start_matches('\u{feff}')))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// A row that is not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Invalid {
    pub line: u64,
    /// The row's email cell as written.
    pub text: String,
    pub reason: String,
}

/// One member to import: its address as stored and its display name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub line: u64,
    pub address: String,
    pub display_name: String,
}

/// What a file holds: the members to import (each address once, in file order), the lines
/// that repeat an earlier address, and the lines that are not members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub entries: Vec<Entry>,
    pub duplicates: Vec<u64>,
    pub invalid: Vec<Invalid>,
    /// Rows read, the header not counted.
    pub rows: u64,
}

/// Line numbers of records by their byte offsets, counted forward: the reader's own line
/// count lags a line behind after a CRLF, and its record offset may point at the line end
/// before the record (or at blank lines it skips).
struct Lines<'a> {
    bytes: &'a [u8],
    at: usize,
    line: u64,
}

impl Lines<'_> {
    /// The line of the first byte of the record that starts at `offset` or after the line
    /// ends there.
    fn of(&mut self, offset: usize) -> u64 {
        let mut start = offset.min(self.bytes.len());
        while start < self.bytes.len() && matches!(self.bytes[start], b'\r' | b'\n') {
            start += 1;
        }
        if start >= self.at {
            self.line += self.bytes[self.at..start]
                .iter()
                .filter(|b| **b == b'\n')
                .count() as u64;
            self.at = start;
        }
        self.line
    }
}

/// Reads a members file. An error is a file that cannot be read as CSV at all (no email
/// column); a bad row is only an `Invalid`.
pub fn read(bytes: &[u8]) -> Result<Parsed, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(bytes);
    let mut lines = Lines {
        bytes,
        at: 0,
        line: 1,
    };
    let mut out = Parsed::default();
    let mut seen: HashSet<String> = HashSet::new();
    let mut cols: Option<Columns> = None;
    let mut record = csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            // Reading from memory, with every row as bytes and of any length: the reader
            // has nothing left to refuse.
            Err(e) => return Err(format!("line {}: {e}", lines.line)),
        }
        let line = lines.of(record.position().map_or(0, |p| p.byte() as usize));
        let cells: Vec<String> = record
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let c = match cols {
            Some(c) => c,
            None => {
                let first: Vec<&str> = cells.iter().map(String::as_str).collect();
                let c = columns(&first)?;
                cols = Some(c);
                if c.header {
                    continue;
                }
                c
            }
        };
        out.rows += 1;
        let raw = |i: usize| record.get(i).unwrap_or_default();
        let cell = |i: usize| cells.get(i).map(String::as_str).unwrap_or_default();
        let text = cell(c.email).trim_start_matches('\u{feff}').to_owned();
        let invalid = |reason: String| Invalid {
            line,
            text: text.clone(),
            reason,
        };
        if std::str::from_utf8(raw(c.email)).is_err()
            || c.name.is_some_and(|n| std::str::from_utf8(raw(n)).is_err())
        {
            out.invalid
                .push(invalid("the row is not UTF-8 text".into()));
            continue;
        }
        if text.trim().is_empty() {
            out.invalid.push(invalid("no address".into()));
            continue;
        }
        let address = match names::member_address(&text) {
            Ok(a) => a,
            Err(e) => {
                out.invalid.push(invalid(e));
                continue;
            }
        };
        let display_name = display_name(c.name.map(cell).unwrap_or_default());
        if display_name.chars().count() > MAX_NAME_CHARS {
            out.invalid.push(invalid(format!(
                "the display name is longer than {MAX_NAME_CHARS} characters"
            )));
            continue;
        }
        if !seen.insert(address.clone()) {
            out.duplicates.push(line);
            continue;
        }
        out.entries.push(Entry {
            line,
            address,
            display_name,
        });
    }
    Ok(out)
}

/// A display name as stored: control characters (a newline inside quotes) as spaces,
/// white space around it removed.
pub fn display_name(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// Writes `rows` (address, display name) under `HEADER`.
pub fn write(out: impl Write, rows: &[(String, String)]) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record(HEADER)?;
    for (address, name) in rows {
        w.write_record([address, name])?;
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_recognised_in_their_common_spellings() {
        let header = |email, name| {
            Ok(Columns {
                email,
                name,
                header: true,
            })
        };
        let cases: &[(&[&str], Result<Columns, &str>)] = &[
            (&["email", "display_name"], header(0, Some(1))),
            (&["Email", "Display Name"], header(0, Some(1))),
            (&["\u{feff}email", "name"], header(0, Some(1))),
            (&["display_name", "email"], header(1, Some(0))),
            (&["Address"], header(0, None)),
            (
                &["E-mail", "Full Name", "delivery_mode"],
                header(0, Some(1)),
            ),
            (&["name", "moderation", " EMAIL "], header(2, Some(0))),
            (&["Email Address", "Real Name"], header(0, Some(1))),
            (
                &["alice@example.org", "Alice"],
                Ok(Columns {
                    email: 0,
                    name: Some(1),
                    header: false,
                }),
            ),
            (
                &["alice@example.org"],
                Ok(Columns {
                    email: 0,
                    name: Some(1),
                    header: false,
                }),
            ),
            (
                &["mail", "who"],
                Err("the header names no email column (it has: \"mail\", \"who\")"),
            ),
            (&[""], Err("no email column")),
        ];
        for (row, want) in cases {
            match (columns(row), want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{row:?}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{row:?}: {e}"),
                (g, w) => panic!("{row:?}: {g:?}, wanted {w:?}"),
            }
        }
    }

    #[test]
    fn a_file_gives_its_members_its_repeats_and_its_bad_lines_by_number() {
        let file = "Email,Display Name,delivery_mode\r\n\
                    Alice@Example.org,Alice Liddell,regular\r\n\
                    bob@example.net,,digest\r\n\
                    not an address,Nobody,regular\r\n\
                    \"carol@example.com\",\"Carol, the Second\",regular\r\n\
                    ALICE@example.org,Alice again,regular\r\n\
                    ,empty,regular\r\n\
                    dave@example,Dave,regular\r\n\
                    \"erin@example.org\",\"Erin\nSmith\",regular\r\n";
        let parsed = read(file.as_bytes()).unwrap();
        let got: Vec<(u64, &str, &str)> = parsed
            .entries
            .iter()
            .map(|e| (e.line, e.address.as_str(), e.display_name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (2, "alice@example.org", "Alice Liddell"),
                (3, "bob@example.net", ""),
                (5, "carol@example.com", "Carol, the Second"),
                (9, "erin@example.org", "Erin Smith"),
            ]
        );
        assert_eq!(parsed.duplicates, [6]);
        let bad: Vec<(u64, &str)> = parsed
            .invalid
            .iter()
            .map(|i| (i.line, i.text.as_str()))
            .collect();
        assert_eq!(bad, [(4, "not an address"), (7, ""), (8, "dave@example")]);
        assert!(parsed.invalid[0].reason.contains("is not an address: no @"));
        assert_eq!(parsed.invalid[1].reason, "no address");
        assert_eq!(parsed.rows, 8);
    }

    #[test]
    fn a_headerless_file_and_odd_rows_are_read() {
        let parsed =
            read("a@example.org\nb@example.org,Bee,extra\n\nc@example.org\n".as_bytes()).unwrap();
        let got: Vec<(&str, &str)> = parsed
            .entries
            .iter()
            .map(|e| (e.address.as_str(), e.display_name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a@example.org", ""),
                ("b@example.org", "Bee"),
                ("c@example.org", "")
            ]
        );
        // A blank line is skipped, and counted.
        let lines: Vec<u64> = parsed.entries.iter().map(|e| e.line).collect();
        assert_eq!(lines, [1, 2, 4]);
        assert!(read("".as_bytes()).unwrap().entries.is_empty());
        let e = read("who,what\nx,y\n".as_bytes()).unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
        // Bytes that are not UTF-8 spoil only their row.
        let mut bytes = b"email,name\nx@example.org,".to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe]);
        bytes.extend_from_slice(b"\ny@example.org,Y\n");
        let parsed = read(bytes.as_slice()).unwrap();
        assert_eq!(parsed.entries.len(), 1);
        assert_eq!(parsed.invalid[0].line, 2);
        assert_eq!(parsed.invalid[0].reason, "the row is not UTF-8 text");
        let long = format!("email,name\nx@example.org,{}\n", "n".repeat(201));
        assert!(
            read(long.as_bytes()).unwrap().invalid[0]
                .reason
                .contains("longer than 200")
        );
    }

    #[test]
    fn what_export_writes_import_reads_back() {
        let rows = vec![
            ("a@example.org".to_owned(), "Plain".to_owned()),
            (
                "b@example.org".to_owned(),
                "With, comma \"and quotes\"".to_owned(),
            ),
            ("c@example.org".to_owned(), String::new()),
        ];
        let mut out = Vec::new();
        write(&mut out, &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("email,display_name\n"), "{text}");
        let back = read(text.as_bytes()).unwrap();
        let got: Vec<(String, String)> = back
            .entries
            .into_iter()
            .map(|e| (e.address, e.display_name))
            .collect();
        assert_eq!(got, rows);
    }
}
