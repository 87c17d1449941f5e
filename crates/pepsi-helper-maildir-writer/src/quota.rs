//! Maildir++ quota: the `maildirsize` file a Maildir's readers and writers share, so an
//! IMAP server on the same Maildir (Dovecot's `maildir` quota backend) and the writer agree
//! on what a mailbox holds.
//!
//! The file's first line defines the quota (`<bytes>S,<messages>C`, either part left out
//! when unlimited); each further line is a change, `<bytes> <messages>`, appended by whoever
//! added or removed mail (negative for removals). The usage is the sum of the changes. The
//! file is rebuilt from the directory (every message file of `cur/` and `new/`, of the inbox
//! and of each `.Folder`) when it is missing, unreadable, defines other limits than asked,
//! has grown past [`MAX_FILE`] octets, or (as Maildir++ asks of a writer about to refuse
//! mail) when it would refuse and is older than [`STALE_AFTER`]. A rebuild writes `tmp/`
//! first and renames over the old file, so a reader never sees half of one.
//!
//! [`parse`], [`definition`] and [`size_from_name`] are pure; the rest works on the
//! Maildir's open directory ([`crate::fsat`]) as the caller's effective user (the mailbox
//! owner), never on a path looked up again.

use std::io::{self, Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fsat::{Dir, Stat};

/// The file's name in the Maildir.
pub const FILE: &str = "maildirsize";
/// A file longer than this is rebuilt (Maildir++: 5120 octets).
pub const MAX_FILE: u64 = 5120;
/// A file older than this is rebuilt before it is allowed to refuse a message.
pub const STALE_AFTER: Duration = Duration::from_secs(15 * 60);

pub use pepsi_conf::mailbox::{Limits, Usage};

/// The definition line for `limits` (without its LF): `10485760S,1000C`, `10485760S`,
/// `1000C`, or `0S` when neither is limited.
pub fn definition(limits: Limits) -> String {
    let mut parts = Vec::new();
    if let Some(b) = limits.bytes {
        parts.push(format!("{b}S"));
    }
    if let Some(c) = limits.messages {
        parts.push(format!("{c}C"));
    }
    if parts.is_empty() {
        "0S".into()
    } else {
        parts.join(",")
    }
}

/// Parses a definition line into limits (`0` of a part, like a missing part, is unlimited).
fn parse_definition(line: &str) -> Option<Limits> {
    let mut limits = Limits::default();
    for part in line.trim().split(',').filter(|p| !p.is_empty()) {
        let (digits, unit) = part.split_at(part.len().checked_sub(1)?);
        let n: u64 = digits.parse().ok()?;
        let n = (n > 0).then_some(n);
        match unit {
            "S" => limits.bytes = n,
            "C" => limits.messages = n,
            _ => return None,
        }
    }
    Some(limits)
}

/// The limits the file defines and the sum of its changes (negative totals count as zero).
/// `None` when the file does not follow the format.
pub fn parse(text: &str) -> Option<(Limits, Usage)> {
    let mut lines = text.lines();
    let limits = parse_definition(lines.next()?)?;
    let (mut bytes, mut messages) = (0i64, 0i64);
    for line in lines {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let b: i64 = fields.next()?.parse().ok()?;
        let c: i64 = fields.next()?.parse().ok()?;
        if fields.next().is_some() {
            return None;
        }
        bytes = bytes.saturating_add(b);
        messages = messages.saturating_add(c);
    }
    Some((
        limits,
        Usage {
            bytes: bytes.max(0) as u64,
            messages: messages.max(0) as u64,
        },
    ))
}

/// `,S=<n>` in a message file's base name (before any `:2,` flags).
pub fn size_from_name(name: &str) -> Option<u64> {
    let base = name.split(':').next().unwrap_or(name);
    base.split(',')
        .skip(1)
        .find_map(|f| f.strip_prefix("S="))
        .and_then(|s| s.parse().ok())
}

/// Counts the message files of `cur/` and `new/` of the inbox and of every Maildir++ folder
/// (a subdirectory whose name starts with `.`), sizes from `,S=` where names carry it. `maildir`
/// is the Maildir opened readable; nothing is looked up through a symbolic link.
pub fn scan(maildir: &Dir) -> io::Result<Usage> {
    let mut usage = Usage::default();
    let mut folders = vec![maildir.reopen(libc::O_RDONLY)?];
    for (name, is_dir) in maildir.entries()? {
        let text = name.to_string_lossy();
        if !text.starts_with('.') {
            continue;
        }
        let is_dir = match is_dir {
            Some(d) => d,
            None => maildir.stat_at(&name).is_ok_and(|s| s.is_dir()),
        };
        if !is_dir {
            continue;
        }
        // By its own bytes: a folder whose name is not UTF-8 counts too.
        match maildir.open_dir(&name) {
            Ok(d) => folders.push(d),
            // Removed by a reader meanwhile, or a link: not part of this Maildir.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    for folder in folders {
        for sub in ["cur", "new"] {
            let dir = match folder.open_dir(sub) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for (name, _) in dir.entries()? {
                let name_text = name.to_string_lossy();
                if name_text.starts_with('.') {
                    continue;
                }
                let size = match size_from_name(&name_text) {
                    Some(s) => s,
                    None => match dir.stat_at(&name) {
                        Ok(m) if m.is_file() => m.size,
                        Ok(_) => continue,
                        // Moved or expunged meanwhile by a reader: it no longer counts.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    },
                };
                usage.bytes = usage.bytes.saturating_add(size);
                usage.messages += 1;
            }
        }
    }
    Ok(usage)
}

/// Rebuilds `maildirsize` from the directory for `limits` and returns the usage found.
pub fn rebuild(maildir: &Dir, limits: Limits, unique: &str) -> io::Result<Usage> {
    let usage = scan(maildir)?;
    let tmp = maildir.open_dir("tmp")?;
    let name = format!("{unique}.maildirsize");
    let text = format!(
        "{}\n{} {}\n",
        definition(limits),
        usage.bytes,
        usage.messages
    );
    let written = tmp
        .create_file(&name, 0o600)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|_| f.sync_all()))
        .and_then(|_| tmp.rename(&name, maildir, FILE));
    if let Err(e) = written {
        let _ = tmp.unlink(&name);
        return Err(e);
    }
    Ok(usage)
}

/// Why [`current`] rebuilt the file, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Summed from the file as it was.
    File,
    /// Rebuilt from the directory.
    Rebuilt,
}

/// The usage of `maildir` under `limits`: from `maildirsize`, rebuilt when it is missing,
/// malformed, defines other limits, is longer than [`MAX_FILE`], or (when a message of
/// `size` would not fit) older than [`STALE_AFTER`]. `force` always rebuilds.
pub fn current(
    maildir: &Dir,
    limits: Limits,
    size: u64,
    force: bool,
    unique: &str,
) -> io::Result<(Usage, Source)> {
    if !force {
        match read_file(maildir) {
            Ok((text, meta)) => {
                if let Some((defined, usage)) = parse(&text)
                    && defined == limits
                    && meta.size <= MAX_FILE
                {
                    let modified = UNIX_EPOCH + Duration::from_secs(meta.mtime.max(0) as u64);
                    let fresh = SystemTime::now()
                        .duration_since(modified)
                        .is_ok_and(|age| age < STALE_AFTER);
                    if limits.fits(usage, size) || fresh {
                        return Ok((usage, Source::File));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
            Err(e) => return Err(e),
        }
    }
    rebuild(maildir, limits, unique).map(|u| (u, Source::Rebuilt))
}

/// The text of `maildirsize` and what fstat says of it.
fn read_file(maildir: &Dir) -> io::Result<(String, Stat)> {
    let mut f = maildir.open_file(FILE)?;
    let meta = Stat::of_file(&f)?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok((text, meta))
}

/// Appends one change (`<bytes> <messages>`) in a single write, so concurrent writers'
/// lines never interleave.
pub fn record(maildir: &Dir, bytes: i64, messages: i64) -> io::Result<()> {
    let mut f = maildir.append_file(FILE)?;
    f.write_all(format!("{bytes} {messages}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn definitions_and_files_as_a_table() {
        let l = |b: Option<u64>, c: Option<u64>| Limits {
            bytes: b,
            messages: c,
        };
        for (limits, line) in [
            (l(Some(10485760), Some(1000)), "10485760S,1000C"),
            (l(Some(100), None), "100S"),
            (l(None, Some(7)), "7C"),
            (l(None, None), "0S"),
        ] {
            assert_eq!(definition(limits), line);
            assert_eq!(parse_definition(line), Some(limits), "{line}");
        }
        let u = |bytes, messages| Usage { bytes, messages };
        for (text, want) in [
            ("100S,5C\n", Some((l(Some(100), Some(5)), u(0, 0)))),
            ("100S\n40 2\n10 1\n", Some((l(Some(100), None), u(50, 3)))),
            // A reader's expunge is a negative line.
            ("100S\n40 2\n-15 -1\n", Some((l(Some(100), None), u(25, 1)))),
            ("100S\n10 1\n-40 -3\n", Some((l(Some(100), None), u(0, 0)))),
            ("0S\n\n5 1\n", Some((l(None, None), u(5, 1)))),
            ("", None),
            ("100X\n", None),
            ("100S\n10\n", None),
            ("100S\nten 1\n", None),
            ("100S\n1 2 3\n", None),
        ] {
            assert_eq!(parse(text), want, "{text:?}");
        }
        let lim = l(Some(100), Some(3));
        assert!(lim.fits(u(90, 2), 10));
        assert!(!lim.fits(u(90, 2), 11));
        assert!(!lim.fits(u(0, 3), 1));
        assert!(l(None, None).fits(u(u64::MAX, u64::MAX), 1));
    }

    /// A Maildir++ folder is counted by its own bytes: one whose name is not UTF-8 is no
    /// smaller than its neighbours.
    #[test]
    fn a_folder_whose_name_is_not_utf8_counts() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let md = dir.path();
        let folder = md.join(std::ffi::OsStr::from_bytes(b".Caf\xe9"));
        for sub in ["tmp", "new", "cur"] {
            fs::create_dir_all(md.join(sub)).unwrap();
            fs::create_dir_all(folder.join(sub)).unwrap();
        }
        fs::write(folder.join("cur/5.M1P1Q1.h,S=11:2,S"), b"").unwrap();
        let usage = scan(&Dir::open(md).unwrap()).unwrap();
        assert_eq!(
            usage,
            Usage {
                bytes: 11,
                messages: 1
            }
        );
    }

    #[test]
    fn the_file_is_rebuilt_from_every_folder_and_summed_after() {
        let dir = tempfile::tempdir().unwrap();
        let md = dir.path();
        let d = Dir::open(md).unwrap();
        for sub in ["tmp", "new", "cur", ".Sent/cur", ".Sent/new", ".Sent/tmp"] {
            fs::create_dir_all(md.join(sub)).unwrap();
        }
        fs::write(md.join("new/1.M1P1Q1.h,S=100"), b"ignored: S= is the size").unwrap();
        fs::write(md.join("cur/2.M1P1Q1.h:2,S"), vec![b'x'; 30]).unwrap();
        fs::write(md.join(".Sent/cur/3.M1P1Q1.h,S=7:2,S"), b"").unwrap();
        fs::write(md.join("tmp/4.M1P1Q1.h,S=1000"), b"").unwrap();
        let limits = Limits {
            bytes: Some(1000),
            messages: Some(10),
        };
        let (usage, source) = current(&d, limits, 1, false, "u1").unwrap();
        assert_eq!(source, Source::Rebuilt, "no file yet");
        assert_eq!(
            usage,
            Usage {
                bytes: 137,
                messages: 3
            },
            "tmp/ does not count; folders do"
        );
        assert_eq!(
            fs::read_to_string(md.join(FILE)).unwrap(),
            "1000S,10C\n137 3\n"
        );
        record(&d, 50, 1).unwrap();
        record(&d, -30, -1).unwrap();
        let (usage, source) = current(&d, limits, 1, false, "u2").unwrap();
        assert_eq!(
            (usage, source),
            (
                Usage {
                    bytes: 157,
                    messages: 3
                },
                Source::File
            )
        );
        // Other limits: rebuilt from the directory.
        let other = Limits {
            bytes: Some(2000),
            messages: None,
        };
        let (usage, source) = current(&d, other, 1, false, "u3").unwrap();
        assert_eq!(
            (usage, source),
            (
                Usage {
                    bytes: 137,
                    messages: 3
                },
                Source::Rebuilt
            )
        );
        assert!(
            fs::read_to_string(md.join(FILE))
                .unwrap()
                .starts_with("2000S\n")
        );
        // A long file is rebuilt too.
        for _ in 0..2000 {
            record(&d, 1, 0).unwrap();
        }
        let (_, source) = current(&d, other, 1, false, "u4").unwrap();
        assert_eq!(source, Source::Rebuilt);
        let (_, source) = current(&d, other, 1, true, "u5").unwrap();
        assert_eq!(source, Source::Rebuilt, "forced");
        assert_eq!(
            fs::read_dir(md.join("tmp")).unwrap().count(),
            1,
            "no rebuild left a file in tmp/"
        );
    }
}
