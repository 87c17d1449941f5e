//! The mbox format, both ways: reading an export (a Mailman archive, a public-inbox
//! `mboxrd` download) message by message, and writing one. Pure over `BufRead`/`Write`, and
//! bounded: a message longer than the reader's limit is skipped whole and reported, never
//! held in memory.
//!
//! A message starts at a line beginning `From ` (the "From_ line": envelope sender and
//! date) at the start of the file or after an empty line. Lines inside a message that would
//! read as a From_ line were escaped by the writer with `>`:
//! - `mboxrd` (what this module writes, and public-inbox's): every `>*From ` line got one
//!   more `>`, so reading removes one from each;
//! - `mboxo` (older writers): only `From ` lines got one, so `>From ` in a message is
//!   ambiguous; reading removes one `>` from `>From ` lines alone.
//!
//! Lines are LF in an mbox file and CRLF in a stored message: reading turns every line end
//! into CRLF, writing every CRLF into LF.

use std::io::{self, BufRead, Write};

/// How `>From ` lines were escaped (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Mboxrd,
    Mboxo,
}

impl Format {
    pub fn parse(text: &str) -> Option<Format> {
        match text {
            "mboxrd" => Some(Format::Mboxrd),
            "mboxo" => Some(Format::Mboxo),
            _ => None,
        }
    }
}

/// One item of an mbox file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A message: its From_ line (without `From ` and the line end) and the message, with
    /// CRLF line ends and without the empty line that separates it from the next.
    Message { from_line: String, raw: Vec<u8> },
    /// A message longer than the limit, skipped: its From_ line and its length in bytes.
    TooLong { from_line: String, bytes: u64 },
}

/// Reads an mbox file one message at a time.
pub struct Reader<R> {
    input: R,
    format: Format,
    max_bytes: u64,
    /// The From_ line that starts the next message, once read.
    next_from: Option<String>,
    /// Whether the file has been read to its end.
    done: bool,
    /// Bytes read so far (progress).
    pub bytes_read: u64,
    line: Vec<u8>,
}

impl<R: BufRead> Reader<R> {
    /// A reader of `input` that skips messages longer than `max_bytes`.
    pub fn new(input: R, format: Format, max_bytes: u64) -> Reader<R> {
        Reader {
            input,
            format,
            max_bytes,
            next_from: None,
            done: false,
            bytes_read: 0,
            line: Vec::new(),
        }
    }

    /// The next line into `self.line` (with its LF); false at the end.
    fn read_line(&mut self) -> io::Result<bool> {
        self.line.clear();
        let n = self.input.read_until(b'\n', &mut self.line)?;
        self.bytes_read += n as u64;
        Ok(n > 0)
    }

    /// The next item, `None` at the end of the file. Text before the first From_ line is
    /// not a message and is skipped; a file with no From_ line at all is an error.
    pub fn next_item(&mut self) -> io::Result<Option<Item>> {
        if self.done {
            return Ok(None);
        }
        let from_line = match self.next_from.take() {
            Some(f) => f,
            None => loop {
                if !self.read_line()? {
                    self.done = true;
                    if self.bytes_read > 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "no line starting \"From \" in the file: it is not an mbox",
                        ));
                    }
                    return Ok(None);
                }
                if let Some(f) = from_line_text(&self.line) {
                    break f;
                }
            },
        };
        let mut raw: Vec<u8> = Vec::new();
        let mut bytes: u64 = 0;
        let mut too_long = false;
        // An empty line is held back until the next line shows whether it separates
        // messages.
        let mut blank_pending = false;
        loop {
            if !self.read_line()? {
                self.done = true;
                break;
            }
            if blank_pending && let Some(next) = from_line_text(&self.line) {
                self.next_from = Some(next);
                break;
            }
            let line = trim_line_end(&self.line);
            let is_blank = line.is_empty();
            let mut emit: Vec<u8> = Vec::new();
            if blank_pending {
                emit.extend_from_slice(b"\r\n");
            }
            blank_pending = is_blank;
            if !is_blank {
                emit.extend_from_slice(unescape(line, self.format));
                emit.extend_from_slice(b"\r\n");
            }
            bytes += emit.len() as u64;
            if bytes > self.max_bytes {
                too_long = true;
                raw = Vec::new();
            }
            if !too_long {
                raw.extend_from_slice(&emit);
            }
        }
        // The empty line before EOF, if held, ends the message; it is not part of it.
        Ok(Some(if too_long {
            Item::TooLong { from_line, bytes }
        } else {
            Item::Message { from_line, raw }
        }))
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = io::Result<Item>;

    fn next(&mut self) -> Option<io::Result<Item>> {
        self.next_item().transpose()
    }
}

/// The From_ line's text when `line` is one (`From ` and something after it).
fn from_line_text(line: &[u8]) -> Option<String> {
    let rest = line.strip_prefix(b"From ")?;
    let rest = trim_line_end(rest);
    (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned())
}

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A message line with its escape removed.
fn unescape(line: &[u8], format: Format) -> &[u8] {
    let quoted = line.iter().take_while(|b| **b == b'>').count();
    let escaped = quoted > 0
        && line[quoted..].starts_with(b"From ")
        && (format == Format::Mboxrd || quoted == 1);
    if escaped { &line[1..] } else { line }
}

/// Writes one message (`raw`, CRLF or LF line ends) in mboxrd form after the From_ line
/// `From <from_line>`, followed by the empty line that separates it from the next.
pub fn write_message(out: &mut impl Write, from_line: &str, raw: &[u8]) -> io::Result<()> {
    writeln!(out, "From {}", from_line.replace(['\r', '\n'], " "))?;
    let mut lines = raw.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if lines.peek().is_none() && line.is_empty() {
            break;
        }
        let quoted = line.iter().take_while(|b| **b == b'>').count();
        if line[quoted..].starts_with(b"From ") {
            out.write_all(b">")?;
        }
        out.write_all(line)?;
        out.write_all(b"\n")?;
    }
    out.write_all(b"\n")
}

/// The From_ line of a message sent by `sender` (an address, `MAILER-DAEMON` when empty)
/// at `when`, in the asctime form mbox readers expect.
pub fn from_line_of(sender: &str, when: chrono::DateTime<chrono::Utc>) -> String {
    let sender = if sender.is_empty() {
        "MAILER-DAEMON"
    } else {
        sender
    };
    let sender: String = sender
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect();
    format!("{sender} {}", when.format("%a %b %e %H:%M:%S %Y"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, format: Format, max: u64) -> Vec<Item> {
        Reader::new(text.as_bytes(), format, max)
            .collect::<io::Result<Vec<_>>>()
            .unwrap()
    }

    fn msg(from: &str, raw: &str) -> Item {
        Item::Message {
            from_line: from.to_owned(),
            raw: raw.as_bytes().to_vec(),
        }
    }

    #[test]
    fn reading_table() {
        let two = "From a@x Mon Jan  1 00:00:00 2024\nSubject: one\n\nbody\n>From here\n\n\
                   From b@y Tue Jan  2 00:00:00 2024\nSubject: two\n\n>>From quoted\nend\n";
        let cases: Vec<(&str, &str, Format, Vec<Item>)> = vec![
            (
                "two messages, mboxrd",
                two,
                Format::Mboxrd,
                vec![
                    msg(
                        "a@x Mon Jan  1 00:00:00 2024",
                        "Subject: one\r\n\r\nbody\r\nFrom here\r\n",
                    ),
                    msg(
                        "b@y Tue Jan  2 00:00:00 2024",
                        "Subject: two\r\n\r\n>From quoted\r\nend\r\n",
                    ),
                ],
            ),
            (
                "the same read as mboxo keeps >>From",
                two,
                Format::Mboxo,
                vec![
                    msg(
                        "a@x Mon Jan  1 00:00:00 2024",
                        "Subject: one\r\n\r\nbody\r\nFrom here\r\n",
                    ),
                    msg(
                        "b@y Tue Jan  2 00:00:00 2024",
                        "Subject: two\r\n\r\n>>From quoted\r\nend\r\n",
                    ),
                ],
            ),
            (
                "a From line not after an empty line is text",
                "From a@x d\nSubject: s\n\nline\nFrom inside\n",
                Format::Mboxrd,
                vec![msg("a@x d", "Subject: s\r\n\r\nline\r\nFrom inside\r\n")],
            ),
            (
                "CRLF files, text before the first From_ line, empty lines kept",
                "junk\r\nFrom a@x d\r\nA: 1\r\n\r\nx\r\n\r\n\r\ny\r\n",
                Format::Mboxrd,
                vec![msg("a@x d", "A: 1\r\n\r\nx\r\n\r\n\r\ny\r\n")],
            ),
            ("an empty file", "", Format::Mboxrd, vec![]),
        ];
        for (what, text, format, want) in cases {
            assert_eq!(read(text, format, 1 << 20), want, "{what}");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_skipped_and_counted() {
        let text = "From a@x d\nA: 1\n\n0123456789\n\nFrom b@y d\nB: 2\n\nok\n";
        let items = read(text, Format::Mboxrd, 12);
        assert_eq!(
            items,
            vec![
                Item::TooLong {
                    from_line: "a@x d".into(),
                    bytes: 20
                },
                msg("b@y d", "B: 2\r\n\r\nok\r\n"),
            ]
        );
    }

    #[test]
    fn not_an_mbox() {
        let err = Reader::new(&b"Subject: x\n\nbody\n"[..], Format::Mboxrd, 100)
            .next()
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("not an mbox"), "{err}");
    }

    #[test]
    fn written_messages_read_back_the_same() {
        let messages = [
            "Subject: a\r\n\r\nFrom the start\r\n>From once\r\n>>From twice\r\n",
            "Subject: b\r\n\r\nlast line without end",
            "Subject: c\r\n\r\n\r\n",
        ];
        let mut out = Vec::new();
        for m in messages {
            write_message(&mut out, "x@y Mon Jan  1 00:00:00 2024", m.as_bytes()).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("\n>From the start\n>>From once\n>>>From twice\n"),
            "{text}"
        );
        let back = read(&text, Format::Mboxrd, 1 << 20);
        let raws: Vec<String> = back
            .into_iter()
            .map(|i| match i {
                Item::Message { raw, .. } => String::from_utf8(raw).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            raws,
            [
                messages[0].to_owned(),
                "Subject: b\r\n\r\nlast line without end\r\n".to_owned(),
                messages[2].to_owned(),
            ]
        );
    }

    #[test]
    fn from_lines() {
        let when = chrono::DateTime::parse_from_rfc3339("2024-03-05T07:08:09Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            from_line_of("a@example.org", when),
            "a@example.org Tue Mar  5 07:08:09 2024"
        );
        assert_eq!(
            from_line_of("", when),
            "MAILER-DAEMON Tue Mar  5 07:08:09 2024"
        );
        assert_eq!(Format::parse("mboxo"), Some(Format::Mboxo));
        assert_eq!(Format::parse("maildir"), None);
    }
}
