//! A list's archive (or one month, one thread) written out as an mboxrd file, oldest first,
//! read [`BATCH`] posts at a time through [`store::export`] and never held whole: each post
//! as it was archived after a From_ line of its author and date ([`mbox::write_message`]).
//! `pepsi-archive export` writes it to a file or stdout ([`write_all`]); pepsi-httpd's admin
//! API sends it gzip'ed as it goes, a batch at a time ([`Export::next_batch`] into a
//! [`GzipChunks`]).

use std::io::{self, BufWriter, Write};

use chrono::{DateTime, NaiveDate, Utc};
use flate2::Compression;
use flate2::write::GzEncoder;
use sqlx::PgPool;

use crate::mbox;
use crate::store::{self, Scope};

/// Posts read per query.
pub const BATCH: i64 = 200;

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("writing the mbox: {0}")]
    Write(#[from] io::Error),
}

/// `YYYY-MM` as the first day of that month, or `None` for anything else.
pub fn month(text: &str) -> Option<NaiveDate> {
    let (y, m) = text.split_once('-')?;
    if y.len() != 4 || m.len() != 2 || !y.bytes().chain(m.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, 1)
}

/// An export under way: the posts of a scope of one list, a batch at a time.
#[derive(Debug, Clone)]
pub struct Export {
    list_id: i64,
    scope: Scope,
    /// The date and archive id of the last post written.
    after: Option<(DateTime<Utc>, i64)>,
    done: bool,
    /// Posts written so far.
    pub posts: u64,
    /// Their bytes as archived (before the mbox's escaping).
    pub bytes: u64,
}

impl Export {
    pub fn new(list_id: i64, scope: Scope) -> Export {
        Export {
            list_id,
            scope,
            after: None,
            done: false,
            posts: 0,
            bytes: 0,
        }
    }

    /// Writes the next batch of posts to `out`; `false` (and nothing written) when every
    /// post has been.
    pub async fn next_batch(&mut self, pool: &PgPool, out: &mut impl Write) -> Result<bool, Error> {
        if self.done {
            return Ok(false);
        }
        let batch = store::export(pool, self.list_id, &self.scope, self.after, BATCH).await?;
        let Some(last) = batch.last() else {
            self.done = true;
            return Ok(false);
        };
        self.after = Some((last.date, last.archive_id));
        for p in &batch {
            let from_line = mbox::from_line_of(&p.from_address, p.date);
            mbox::write_message(out, &from_line, &p.raw)?;
            self.posts += 1;
            self.bytes += p.raw.len() as u64;
        }
        Ok(true)
    }
}

/// Writes every post of `scope` to `sink`, gzip'ed when `gzip`, and flushes it: the number
/// of posts and of their bytes.
pub async fn write_all<W: Write>(
    pool: &PgPool,
    list_id: i64,
    scope: Scope,
    sink: W,
    gzip: bool,
) -> Result<(u64, u64), Error> {
    let mut export = Export::new(list_id, scope);
    let mut buffered = BufWriter::with_capacity(1 << 16, sink);
    if gzip {
        let mut gz = GzEncoder::new(buffered, Compression::default());
        while export.next_batch(pool, &mut gz).await? {}
        gz.finish()?.flush()?;
    } else {
        while export.next_batch(pool, &mut buffered).await? {}
        buffered.flush()?;
    }
    Ok((export.posts, export.bytes))
}

/// gzip in memory, taken out in pieces: what is written is compressed, and [`take`]
/// (`GzipChunks::take`) hands over the compressed bytes so far, so a download can be sent
/// as it is made without holding it whole.
pub struct GzipChunks(GzEncoder<Vec<u8>>);

impl GzipChunks {
    pub fn new() -> GzipChunks {
        GzipChunks(GzEncoder::new(Vec::new(), Compression::default()))
    }

    /// The compressed bytes made since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.0.get_mut())
    }

    /// Ends the stream: the last compressed bytes and the gzip trailer.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        self.0.finish()
    }
}

impl Default for GzipChunks {
    fn default() -> Self {
        Self::new()
    }
}

impl Write for GzipChunks {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_are_four_digits_a_dash_and_two() {
        let cases: [(&str, Option<(i32, u32)>); 8] = [
            ("2026-03", Some((2026, 3))),
            ("0001-12", Some((1, 12))),
            ("2026-13", None),
            ("2026-00", None),
            ("2026-3", None),
            ("26-03", None),
            ("March", None),
            ("+026-03", None),
        ];
        for (text, want) in cases {
            let want = want.map(|(y, m)| NaiveDate::from_ymd_opt(y, m, 1).unwrap());
            assert_eq!(month(text), want, "{text}");
        }
    }

    #[test]
    fn gzip_taken_in_pieces_is_one_stream() {
        use std::io::Read as _;
        let mut gz = GzipChunks::new();
        let mut sent = Vec::new();
        let text: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for piece in text.chunks(10_000) {
            gz.write_all(piece).unwrap();
            sent.extend(gz.take());
        }
        sent.extend(gz.finish().unwrap());
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&sent[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, text);
    }
}
