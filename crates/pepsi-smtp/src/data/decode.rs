//! The message text of DATA and BDAT, checked byte by byte as it arrives. Pure: the
//! session feeds it whatever the socket gave and it answers whether the data has ended.
//!
//! It must never recognise an end of data other than CRLF "." CRLF, and must never let a
//! bare LF or a bare CR through: both are what SMTP smuggling relies on (a receiver that
//! ends the data at LF "." LF sees commands where this server sees text). A problem does
//! not stop the scan: the decoder keeps reading to the real end so that whatever follows
//! the false end is swallowed as data, never run as commands, and the message is refused.

/// Why received data is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataProblem {
    /// LF not preceded by CR.
    BareLf,
    /// CR not followed by LF.
    BareCr,
    /// Larger than the size limit; the rest was read and dropped.
    TooBig,
    /// The server's budget of message bytes in memory (all sessions together) ran out.
    NoStorage,
    /// A line longer than the line limit.
    LineTooLong,
}

/// The result of feeding bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// All input consumed; the data goes on.
    More,
    /// The end-of-data line ended after `consumed` bytes of this input.
    Done { consumed: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    LineStart,
    Dot,
    DotCr,
    Mid,
    Cr,
}

/// Decodes DATA (dot-stuffed, ends at CRLF.CRLF) or checks BDAT chunks (raw bytes).
#[derive(Debug)]
pub struct DataDecoder {
    dot_stuffed: bool,
    st: St,
    out: Vec<u8>,
    size: u64,
    max_size: u64,
    line_len: usize,
    /// Longest line accepted, CRLF excluded.
    max_line: usize,
    problem: Option<DataProblem>,
}

impl DataDecoder {
    /// A decoder for DATA. `max_line` counts the CRLF, as RFC 5321's 1000 does.
    pub fn dot_stuffed(max_size: u64, max_line: usize) -> Self {
        Self::new(true, max_size, max_line)
    }

    /// A checker for the chunks of one BDAT transaction.
    pub fn raw(max_size: u64, max_line: usize) -> Self {
        Self::new(false, max_size, max_line)
    }

    fn new(dot_stuffed: bool, max_size: u64, max_line: usize) -> Self {
        DataDecoder {
            dot_stuffed,
            st: St::LineStart,
            out: Vec::new(),
            size: 0,
            max_size,
            line_len: 0,
            max_line: max_line.saturating_sub(2),
            problem: None,
        }
    }

    /// The first problem seen, if any.
    pub fn problem(&self) -> Option<DataProblem> {
        self.problem
    }

    /// Size of the message so far (after un-stuffing), counting what was dropped.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes of the message held so far (nothing once a problem was seen).
    pub fn held(&self) -> u64 {
        self.out.len() as u64
    }

    /// The server cannot hold more of this message: the rest is read and dropped, and the
    /// message is refused at its end.
    pub fn out_of_storage(&mut self) {
        self.flag(DataProblem::NoStorage);
    }

    /// Checks that raw data ended on a line boundary; call after the last BDAT chunk.
    pub fn finish_raw(&mut self) {
        if self.st == St::Cr {
            self.flag(DataProblem::BareCr);
        }
    }

    /// The decoded message; empty once a problem was seen.
    pub fn into_message(self) -> Vec<u8> {
        self.out
    }

    fn flag(&mut self, problem: DataProblem) {
        if self.problem.is_none() {
            self.problem = Some(problem);
        }
        // Nothing of a refused message is kept.
        self.out = Vec::new();
    }

    fn emit(&mut self, bytes: &[u8]) {
        self.size += bytes.len() as u64;
        if self.size > self.max_size {
            self.flag(DataProblem::TooBig);
        }
        if self.problem.is_none() {
            self.out.extend_from_slice(bytes);
        }
    }

    fn text(&mut self, byte: u8) {
        self.line_len += 1;
        if self.line_len > self.max_line {
            self.flag(DataProblem::LineTooLong);
        }
        self.emit(&[byte]);
        self.st = St::Mid;
    }

    fn line_end(&mut self) {
        self.emit(b"\r\n");
        self.line_len = 0;
        self.st = St::LineStart;
    }

    /// Consumes `input`.
    pub fn feed(&mut self, input: &[u8]) -> Feed {
        for (i, &b) in input.iter().enumerate() {
            match (self.st, b) {
                (St::LineStart, b'.') if self.dot_stuffed => self.st = St::Dot,
                (St::Dot, b'\r') => self.st = St::DotCr,
                (St::DotCr, b'\n') => return Feed::Done { consumed: i + 1 },
                (St::Dot, b'\n') => {
                    // LF "." LF / CRLF "." LF: the classic smuggling ends.
                    self.flag(DataProblem::BareLf);
                    self.after_bare_lf();
                }
                (St::DotCr, _) => {
                    // CRLF "." CR x: the dot was a line of its own text with a bare CR.
                    self.flag(DataProblem::BareCr);
                    self.st = St::Mid;
                    self.byte_in_line(b);
                }
                // A stuffed leading dot is dropped; the byte after it is text.
                (St::Dot, _) => self.byte_in_line(b),
                (St::Cr, b'\n') => self.line_end(),
                (St::Cr, _) => {
                    self.flag(DataProblem::BareCr);
                    self.st = St::Mid;
                    self.byte_in_line(b);
                }
                (St::LineStart | St::Mid, _) => self.byte_in_line(b),
            }
        }
        Feed::More
    }

    fn byte_in_line(&mut self, b: u8) {
        match b {
            b'\r' => self.st = St::Cr,
            b'\n' => {
                self.flag(DataProblem::BareLf);
                self.after_bare_lf();
            }
            _ => self.text(b),
        }
    }

    /// A bare LF ends no line: a "." after it must not start the end-of-data line, or
    /// LF "." CRLF would end the data where a lenient peer ends it too.
    fn after_bare_lf(&mut self) {
        self.line_len = 0;
        self.st = St::Mid;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` one byte at a time and all at once; both must agree on where the data
    /// ended (None: not yet), the problem, and the message when there is none.
    fn check(input: &[u8], end: Option<usize>, expected: Result<&[u8], DataProblem>) {
        for split in [1usize, input.len().max(1)] {
            let mut dec = DataDecoder::dot_stuffed(64, 20);
            let mut done = None;
            let mut offset = 0;
            for chunk in input.chunks(split) {
                if let Feed::Done { consumed } = dec.feed(chunk) {
                    done = Some(offset + consumed);
                    break;
                }
                offset += chunk.len();
            }
            let what = format!(
                "{:?} fed in chunks of {split}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(done, end, "end of {what}");
            match dec.problem() {
                Some(p) => assert_eq!(Err(p), expected, "{what}"),
                None => assert_eq!(Ok(dec.into_message().as_slice()), expected, "{what}"),
            }
        }
    }

    #[test]
    fn data_table() {
        use DataProblem::*;
        check(b".\r\n", Some(3), Ok(b""));
        check(b"a\r\n.\r\nMAIL", Some(6), Ok(b"a\r\n"));
        check(b"..x\r\n.\r\n", Some(8), Ok(b".x\r\n"));
        check(b"a\r\n..\r\n.\r\n", Some(10), Ok(b"a\r\n.\r\n"));
        check(b"a\r\n\r\n.\r\n", Some(8), Ok(b"a\r\n\r\n"));
        // Not an end: the data goes on.
        check(b"a\r\n.x\r\n", None, Ok(b"a\r\nx\r\n"));
        // Smuggling sequences: each refused, and only the real CRLF.CRLF (at 22) ends.
        let after = |false_end: &str| format!("a{false_end}MAIL\r\n.\r\n");
        for false_end in [
            "\n.\n", "\r\n.\n", "\n.\r\n", "\r.\r", "\r\n.\r", "\r.\r\n", "\r.\n",
        ] {
            let input = after(false_end);
            // The first stray octet decides which problem is reported.
            let problem = if false_end.starts_with('\n') || false_end == "\r\n.\n" {
                BareLf
            } else {
                BareCr
            };
            check(input.as_bytes(), Some(input.len()), Err(problem));
        }
        check(b"a\r\n.\r\r\n.\r\n", Some(10), Err(BareCr));
        check(b"a\rb\r\n.\r\n", Some(8), Err(BareCr));
        check(b"a\nb\r\n.\r\n", Some(8), Err(BareLf));
        // Limits: 20 octets a line including CRLF, 64 octets a message.
        check(
            b"123456789012345678\r\n.\r\n",
            Some(23),
            Ok(b"123456789012345678\r\n"),
        );
        check(b"1234567890123456789\r\n.\r\n", Some(24), Err(LineTooLong));
        let big = [b"0123456789\r\n".as_slice(); 6].concat();
        check(&[big.as_slice(), b".\r\n"].concat(), Some(75), Err(TooBig));
    }

    #[test]
    fn raw_chunks() {
        let mut dec = DataDecoder::raw(100, 1000);
        assert_eq!(dec.feed(b"a\r"), Feed::More);
        assert_eq!(dec.feed(b"\n.\r\nb\r\n"), Feed::More);
        dec.finish_raw();
        assert_eq!(dec.problem(), None);
        assert_eq!(dec.into_message(), b"a\r\n.\r\nb\r\n");

        let mut dec = DataDecoder::raw(100, 1000);
        dec.feed(b"a\r");
        dec.finish_raw();
        assert_eq!(dec.problem(), Some(DataProblem::BareCr));

        let mut dec = DataDecoder::raw(100, 1000);
        dec.feed(b"a\nb");
        assert_eq!(dec.problem(), Some(DataProblem::BareLf));
    }
}
