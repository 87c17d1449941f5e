//! `pepsi-archive import`: an mbox file into a list's archive, message by message through
//! `store::archive_post`, [`BATCH`] messages to a transaction. A message that is too long or
//! no message is counted and named, never fatal; a database error on one message is rolled
//! back to its savepoint and counted, so one bad message costs only itself.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};

use anyhow::Context as _;
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_contract::message;
use serde_json::json;
use sqlx::{Connection as _, PgPool};

use super::db::{self, Counts};
use super::progress::Progress;
use super::{Done, Who, invalid, other, print};
use crate::mbox::{self, Item};
use crate::store;

/// Messages archived per transaction: an import that stops loses at most this many, and
/// the list's archive lock is held no longer than one batch takes.
const BATCH: usize = 500;
/// The most messages skipped that are named one by one (on stderr and in the summary).
const MAX_NAMED: usize = 100;
/// The longest file name recorded in `archive_import`.
const MAX_FILE_NAME: usize = 4096;

/// An import with its input checked: the list's address, the file open and read up to its
/// first message (so a file that is no mbox is refused before connecting).
pub(super) struct Import {
    list: String,
    file: String,
    reader: mbox::Reader<Box<dyn BufRead + Send>>,
    first: Option<Item>,
    total_bytes: Option<u64>,
    max: u64,
    dry_run: bool,
    json: bool,
}

impl Import {
    pub(super) fn open(
        list: String,
        file: &str,
        format: mbox::Format,
        max: u64,
        dry_run: bool,
        json: bool,
    ) -> Result<Import, Failure> {
        let (input, total_bytes): (Box<dyn BufRead + Send>, Option<u64>) = if file == "-" {
            (Box::new(BufReader::new(std::io::stdin())), None)
        } else {
            let f = std::fs::File::open(file).with_context(|| format!("opening {file}"))?;
            let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
            (Box::new(BufReader::with_capacity(1 << 16, f)), size)
        };
        let mut reader = mbox::Reader::new(input, format, max);
        let first = match reader.next_item() {
            Ok(i) => i,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(invalid(format!("{}: {e}", shown_name(file))));
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("reading {}", shown_name(file)))
                    .into());
            }
        };
        Ok(Import {
            list,
            file: file.to_owned(),
            reader,
            first,
            total_bytes,
            max,
            dry_run,
            json,
        })
    }
}

fn shown_name(file: &str) -> String {
    if file == "-" {
        "stdin".to_owned()
    } else {
        file.chars().take(MAX_FILE_NAME).collect()
    }
}

/// Why the message `raw` is no message, if it is not: it is empty, it has no header block,
/// or a line of its header block is no header field (`Name: value`, or a continuation).
pub(crate) fn no_message(raw: &[u8]) -> Option<String> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Some("it is empty".to_owned());
    }
    let (headers, _) = message::split(raw);
    if headers.is_empty() {
        return Some("it has no header fields (it starts with an empty line)".to_owned());
    }
    for field in message::fields(headers) {
        let named =
            message::field_name(field).is_some_and(|n| n.iter().all(|b| (33..=126).contains(b)));
        if !named {
            let line = field.split(|b| *b == b'\r').next().unwrap_or_default();
            let line: String = String::from_utf8_lossy(line).chars().take(60).collect();
            return Some(format!(
                "its header block has a line that is no header field: {line:?}"
            ));
        }
    }
    None
}

/// A message not archived: its number in the file, its From_ line, why.
#[derive(Debug, serde::Serialize)]
struct Skipped {
    number: u64,
    from_line: String,
    why: String,
}

/// The messages skipped: the first [`MAX_NAMED`] named (and told on stderr as they come),
/// the rest counted.
#[derive(Default)]
struct SkippedList {
    named: Vec<Skipped>,
    more: u64,
}

impl SkippedList {
    fn add(&mut self, list: &str, number: u64, from_line: String, why: String) {
        if self.named.len() >= MAX_NAMED {
            self.more += 1;
            return;
        }
        eprintln!("pepsi-archive: {list}: message {number} (From {from_line}) not archived: {why}");
        self.named.push(Skipped {
            number,
            from_line,
            why,
        });
    }
}

pub(super) async fn run(pool: &PgPool, who: &Who, mut imp: Import) -> Done {
    let list = imp.list.clone();
    let found = db::list(pool, &list).await?;
    if found.archive_policy == "none" {
        return Err(other(format!(
            "{list} is not archived (its archive_policy is none), so nothing is imported; \
             `pepsi-list configure {list} archive_policy=private` (or public) archives it"
        )));
    }
    let file_name = shown_name(&imp.file);
    let import_id = match imp.dry_run {
        true => None,
        false => Some(db::import_begin(pool, found.list_id, &file_name, &who.name).await?),
    };
    let mut c = Counts::default();
    let mut skipped = SkippedList::default();
    let mut progress = Progress::new(&list, "messages read", imp.total_bytes);
    // A dry run rolls each batch back: a message seen in an earlier batch is a duplicate
    // the database can no longer tell.
    let mut seen: HashSet<String> = HashSet::new();
    let mut tx = pool.begin().await?;
    let mut archived_at = chrono::Utc::now();
    let mut in_batch = 0usize;
    let mut next = imp.first.take();
    loop {
        let item = match next.take() {
            Some(i) => Some(i),
            None => imp
                .reader
                .next_item()
                .with_context(|| format!("reading {file_name}"))?,
        };
        let Some(item) = item else { break };
        c.read += 1;
        let number = c.read;
        match item {
            Item::TooLong { from_line, bytes } => {
                c.too_long += 1;
                skipped.add(
                    &list,
                    number,
                    from_line,
                    format!(
                        "{bytes} bytes, longer than --max-message-size ({})",
                        imp.max
                    ),
                );
            }
            Item::Message { from_line, raw } => {
                if let Some(why) = no_message(&raw) {
                    c.failed += 1;
                    skipped.add(&list, number, from_line, why);
                } else {
                    let (headers, body) = message::split(&raw);
                    let mut sp = tx.begin().await?;
                    match store::archive_post(&mut sp, found.list_id, headers, body, archived_at)
                        .await
                    {
                        Ok(Some(a)) => {
                            sp.commit().await?;
                            if imp.dry_run && !seen.insert(a.url_id) {
                                c.duplicates += 1;
                            } else {
                                c.archived += 1;
                            }
                        }
                        Ok(None) => {
                            sp.commit().await?;
                            c.duplicates += 1;
                        }
                        Err(store::Error::Database(sqlx::Error::Database(e))) => {
                            sp.rollback().await?;
                            c.failed += 1;
                            skipped.add(
                                &list,
                                number,
                                from_line,
                                format!("the database refused it: {e}"),
                            );
                        }
                        Err(e) => {
                            return Err(anyhow::Error::new(e)
                                .context(format!("archiving message {number} (From {from_line})"))
                                .into());
                        }
                    }
                    in_batch += 1;
                }
            }
        }
        progress.update(c.read, Some(imp.reader.bytes_read), None);
        if in_batch >= BATCH {
            if let Some(id) = import_id {
                db::import_counts(&mut tx, id, &c, false).await?;
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
            tx = pool.begin().await?;
            archived_at = chrono::Utc::now();
            in_batch = 0;
        }
    }
    progress.finish();
    let detail = json!({
        "import_id": import_id,
        "file": file_name,
        "read": c.read,
        "archived": c.archived,
        "duplicates": c.duplicates,
        "too_long": c.too_long,
        "failed": c.failed,
    });
    if let Some(id) = import_id {
        db::import_counts(&mut tx, id, &c, true).await?;
        store::log(
            &mut tx,
            Some(found.list_id),
            &who.name,
            "import",
            detail.clone(),
        )
        .await?;
        let mut audited = detail.clone();
        audited["list"] = json!(list);
        who.audit(&mut tx, "archive.import", audited).await?;
        tx.commit().await?;
        if c.archived > 0 {
            store::analyze(pool).await?;
        }
    } else {
        tx.rollback().await?;
    }
    let mut summary = detail;
    summary["list"] = json!(list);
    summary["dry_run"] = json!(imp.dry_run);
    summary["skipped"] = json!(skipped.named);
    summary["skipped_not_named"] = json!(skipped.more);
    print(imp.json, &summary, || {
        let mut out = if imp.dry_run {
            format!("dry run, nothing stored: {file_name} into the archive of {list}\n")
        } else {
            format!("imported {file_name} into the archive of {list}\n")
        };
        let would = if imp.dry_run { " (would be)" } else { "" };
        out.push_str(&format!(
            "  read        {}\n  archived    {}{would}\n  duplicates  {} (archived already)\n  \
             too long    {}\n  failed      {}\n",
            c.read, c.archived, c.duplicates, c.too_long, c.failed
        ));
        if skipped.more > 0 {
            out.push_str(&format!(
                "  ({} more skipped messages not named)\n",
                skipped.more
            ));
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::no_message;

    #[test]
    fn what_is_no_message() {
        let cases: &[(&str, Option<&str>)] = &[
            ("Subject: a\r\nFrom: b@x\r\n\r\nbody\r\n", None),
            ("Subject: a\r\n folded\r\n\r\n", None),
            ("Subject: no body\r\n", None),
            ("", Some("empty")),
            ("\r\n\r\n", Some("empty")),
            ("\r\nbody only\r\n", Some("no header fields")),
            ("just some text\r\nand more\r\n", Some("no header field")),
            (
                "Subject: a\r\nnot a field\r\n\r\nb\r\n",
                Some("\"not a field\""),
            ),
            (" folded first: x\r\n\r\n", Some("no header field")),
        ];
        for (raw, want) in cases {
            let got = no_message(raw.as_bytes());
            match want {
                None => assert_eq!(got, None, "{raw:?}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w)),
                    "{raw:?}: {got:?}"
                ),
            }
        }
    }
}
