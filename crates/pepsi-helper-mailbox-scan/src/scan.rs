//! The scan: which messages of a Maildir say whom its owner trusts, and the addresses in
//! them. Mail in a sent folder names the people the owner wrote to (its To, Cc and Bcc);
//! a message flagged replied (`R` in its `cur/` name) names a person the owner answered
//! (its From). Junk, trash and drafts teach nothing and are not read.
//!
//! Everything is bounded: the newest `max_messages` candidates are read (by modification
//! time), at most [`MAX_HEADER`] bytes of each, and at most `max_findings` addresses are
//! reported. Only regular files are opened, never through a symbolic link and never
//! waiting on a FIFO.

use std::collections::{BinaryHeap, HashSet};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use pepsi_contract::message;

use crate::protocol::{self, Finding};

/// The most of a message read for its header block.
pub const MAX_HEADER: usize = 64 * 1024;

/// The folders (Maildir++ names, without the leading dot) taken for sent mail when none is
/// configured: the names common IMAP clients use.
pub const DEFAULT_SENT_FOLDERS: &[&str] = &["Sent", "Sent Messages", "Sent Items", "INBOX.Sent"];

/// Folders never searched for replied messages (compared by their last dot-separated
/// component, in any letter case).
pub const SKIPPED_FOLDERS: &[&str] = &["Junk", "Spam", "Trash", "Deleted Messages", "Drafts"];

/// What a scan reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Sent folders, by Maildir++ name (`Sent`, `INBOX.Sent`), compared in any letter case.
    pub sent_folders: Vec<String>,
    /// The most messages read, newest first.
    pub max_messages: usize,
    /// The most addresses reported.
    pub max_findings: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sent_folders: DEFAULT_SENT_FOLDERS.iter().map(|s| s.to_string()).collect(),
            max_messages: 20_000,
            max_findings: 5_000,
        }
    }
}

/// What a message can teach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    /// A message of a sent folder: its recipients.
    Sent,
    /// A message flagged replied: its author.
    Replied,
}

/// A message to read. Ordered so that the heap's top is the oldest kept.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    newest_first: std::cmp::Reverse<SystemTime>,
    path: PathBuf,
    kind: Kind,
}

/// True when a Maildir file name carries the replied flag: `…:2,<flags>` with `R` among
/// the flags.
pub fn is_replied(name: &str) -> bool {
    name.rsplit_once(":2,")
        .is_some_and(|(_, flags)| flags.bytes().any(|b| b == b'R'))
}

fn folder_is(name: &str, list: &[String]) -> bool {
    list.iter().any(|f| f.eq_ignore_ascii_case(name))
}

fn skipped(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    SKIPPED_FOLDERS.iter().any(|s| s.eq_ignore_ascii_case(last))
}

/// The folders of `maildir` to read, with what each teaches: the Maildir++ subfolders
/// (`.Name`) named as sent folders, and for replies the Maildir itself (the inbox) and every
/// other subfolder but junk, trash and drafts.
fn folders(maildir: &Path, opts: &Options) -> io::Result<Vec<(PathBuf, Kind)>> {
    let mut out = vec![(maildir.to_path_buf(), Kind::Replied)];
    for entry in fs::read_dir(maildir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(folder) = name.to_str().and_then(|n| n.strip_prefix('.')) else {
            continue;
        };
        if folder.is_empty() || folder == "." || !entry.file_type()?.is_dir() {
            continue;
        }
        if folder_is(folder, &opts.sent_folders) {
            out.push((entry.path(), Kind::Sent));
        } else if !skipped(folder) {
            out.push((entry.path(), Kind::Replied));
        }
    }
    Ok(out)
}

/// The header block of the message at `path`: at most [`MAX_HEADER`] bytes, up to the
/// empty line that ends it.
fn header_block(path: &Path) -> io::Result<Vec<u8>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut buf = Vec::with_capacity(8192);
    file.take(MAX_HEADER as u64).read_to_end(&mut buf)?;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"));
    if let Some(end) = end {
        buf.truncate(end);
    }
    Ok(buf)
}

/// Scans `maildir`, handing each finding to `emit` (the last one is `Done`).
pub fn scan(
    maildir: &Path,
    opts: &Options,
    emit: &mut dyn FnMut(&Finding) -> io::Result<()>,
) -> io::Result<()> {
    if !maildir.join("cur").is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: not a Maildir (no cur/)", maildir.display()),
        ));
    }
    // The newest max_messages candidates, in a heap whose top is the oldest kept.
    let mut heap: BinaryHeap<Candidate> = BinaryHeap::new();
    let mut skipped_count = 0u64;
    for (folder, kind) in folders(maildir, opts)? {
        let subdirs: &[&str] = match kind {
            Kind::Sent => &["cur", "new"],
            Kind::Replied => &["cur"],
        };
        for sub in subdirs {
            let Ok(entries) = fs::read_dir(folder.join(sub)) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with('.') || (kind == Kind::Replied && !is_replied(name)) {
                    continue;
                }
                let Ok(meta) = entry.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                heap.push(Candidate {
                    newest_first: std::cmp::Reverse(
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    ),
                    path: entry.path(),
                    kind,
                });
                if heap.len() > opts.max_messages {
                    heap.pop();
                    skipped_count += 1;
                }
            }
        }
    }
    let mut seen: HashSet<(Kind, String)> = HashSet::new();
    let mut read = 0u64;
    for c in heap.into_sorted_vec() {
        let Ok(headers) = header_block(&c.path) else {
            skipped_count += 1;
            continue;
        };
        read += 1;
        let addresses = match c.kind {
            Kind::Sent => message::recipient_addresses(&headers),
            Kind::Replied => message::from_addresses(&headers),
        };
        for a in addresses {
            if seen.len() >= opts.max_findings {
                break;
            }
            let Ok(a) = protocol::address(&a.trim().to_lowercase()) else {
                continue;
            };
            if seen.insert((c.kind, a.clone())) {
                emit(&match c.kind {
                    Kind::Sent => Finding::Sent(a),
                    Kind::Replied => Finding::Replied(a),
                })?;
            }
        }
    }
    emit(&Finding::Done {
        messages: read,
        skipped: skipped_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replied_flags() {
        for (name, replied) in [
            ("1700000000.M1P2.host:2,RS", true),
            ("1700000000.M1P2.host:2,S", false),
            ("1700000000.M1P2.host:2,", false),
            ("1700000000.M1P2.host", false),
            ("1700000000.M1P2.host,S=12:2,FR", true),
            ("R:2,S", false),
        ] {
            assert_eq!(is_replied(name), replied, "{name}");
        }
    }

    #[test]
    fn skipped_folders() {
        for (name, skip) in [
            ("Junk", true),
            ("INBOX.Trash", true),
            ("drafts", true),
            ("Work", false),
            ("Work.Junkyard", false),
        ] {
            assert_eq!(skipped(name), skip, "{name}");
        }
    }
}
