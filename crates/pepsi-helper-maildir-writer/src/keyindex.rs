//! Which keyed deliveries a Maildir's `new/` and `cur/` hold, known without reading them.
//!
//! A keyed delivery first asks whether its copy is stored already ([`crate::maildir`]).
//! Reading `new/` and `cur/` for that costs time that grows with the mailbox (about 4 ms a
//! delivery with 10,000 files in `cur/`, 28 ms with 50,000: docs/delivery.md), and almost
//! every answer is "no". The index keeps, per directory, the keys of the keyed names in it:
//! filled by one read of the directory the first time the writer delivers into it, kept
//! current from then on by inotify, whoever changes the directory (this writer, another
//! one, the mailbox owner's reader moving `new/` to `cur/` or deleting).
//!
//! It answers only "surely not there" or "may be there". Events are read before every
//! answer, and the kernel queues an event before the change that makes it returns, so a
//! change made before the question is always seen. Where the index could be wrong it says
//! "may be there" and the caller reads the directory as before: a key counted twice (a
//! file created while the directory was being read is seen both ways) stays counted until
//! its file goes, and two keys with the same 64-bit hash share a count. When it cannot
//! know — no inotify, a filesystem whose changes on other hosts inotify does not report
//! (NFS and every other network or FUSE filesystem: only local ones are indexed), events
//! lost to a full queue (every index is dropped and filled again) — it says nothing, and
//! the caller reads the directory.
//!
//! Bounded: at most `max_dirs` directories (the least recently used is dropped, its watch
//! removed), a directory with more than [`MAX_KEYS`] keyed names is not indexed, about 20
//! bytes per keyed name held.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::fsat::{Dir, Inotify};

/// Directories indexed at once unless `--key-index-dirs` says otherwise: a Maildir is two
/// (`new/` and `cur/`).
pub const DEFAULT_DIRS: usize = 256;

/// The most `--key-index-dirs` may be.
pub const MAX_DIRS: usize = pepsi_conf::mailbox::MAX_KEY_INDEX_DIRS;

/// A directory holding more keyed names than this is read for each delivery, not indexed.
pub const MAX_KEYS: usize = 1_000_000;

/// The changes to an indexed directory that the index follows, and its own end.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_EXCL_UNLINK;

/// Local filesystems, whose every change inotify reports (`statfs` magic numbers): ext2/3/4,
/// XFS, Btrfs, tmpfs, F2FS, ZFS, bcachefs.
const LOCAL: [i64; 7] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0xF2F5_2010,
    0x2FC1_2FC1,
    0xCA45_1A4E,
];

/// The index of one writer process.
pub struct KeyIndex {
    inotify: Option<Inotify>,
    max_dirs: usize,
    /// Indexed directories by watch descriptor.
    dirs: HashMap<i32, Indexed>,
    /// Each indexed directory's watch, by its device and inode.
    by_inode: HashMap<(u64, u64), i32>,
    /// Advances with every question: which directory was used least recently.
    clock: u64,
}

struct Indexed {
    inode: (u64, u64),
    /// Hash of a keyed name's key part → how many names in the directory have it.
    keys: HashMap<u64, u32>,
    used: u64,
}

impl KeyIndex {
    /// An index of at most `max_dirs` directories; 0, or no inotify here: an index that
    /// never answers.
    pub fn new(max_dirs: usize) -> KeyIndex {
        let inotify = if max_dirs == 0 {
            None
        } else {
            match Inotify::new() {
                Ok(i) => Some(i),
                Err(e) => {
                    tracing::warn!(
                        "no inotify ({e}): every keyed delivery reads new/ and cur/ of its Maildir"
                    );
                    None
                }
            }
        };
        KeyIndex {
            inotify,
            max_dirs,
            dirs: HashMap::new(),
            by_inode: HashMap::new(),
            clock: 0,
        }
    }

    /// How many directories are indexed now.
    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// Whether `dir` (readable, see [`Dir::reopen`]) may hold a name starting with the keyed
    /// prefix `prefix` (as [`crate::maildir::keyed_prefix`] makes it): `Some(false)` when it
    /// surely holds none, `Some(true)` when it may, `None` when the index cannot tell (read
    /// the directory).
    pub fn may_hold(&mut self, dir: &Dir, prefix: &[u8]) -> Option<bool> {
        let key = key_of(prefix).map(hash)?;
        self.drain()?;
        let st = dir.stat().ok()?;
        self.clock += 1;
        let wd = match self.by_inode.get(&(st.dev, st.ino)) {
            Some(&wd) => wd,
            None => self.index(dir, (st.dev, st.ino))?,
        };
        let indexed = self.dirs.get_mut(&wd)?;
        indexed.used = self.clock;
        Some(indexed.keys.contains_key(&key))
    }

    /// Starts indexing `dir`: the watch first, then one read of the directory, then the
    /// events of changes made meanwhile.
    fn index(&mut self, dir: &Dir, inode: (u64, u64)) -> Option<i32> {
        if !dir.filesystem().is_ok_and(|t| LOCAL.contains(&t)) {
            return None;
        }
        if self.dirs.len() >= self.max_dirs {
            self.evict();
        }
        let inotify = self.inotify.as_ref()?;
        let wd = match inotify.watch(dir, MASK) {
            Ok(wd) => wd,
            Err(e) => {
                tracing::debug!("cannot watch a Maildir directory ({e}): read instead");
                return None;
            }
        };
        let mut keys: HashMap<u64, u32> = HashMap::new();
        let mut over = false;
        let read = dir.each_entry(|name, _| {
            if let Some(k) = key_of(name) {
                *keys.entry(hash(k)).or_default() += 1;
                over = keys.len() > MAX_KEYS;
            }
            over
        });
        if read.is_err() || over {
            let _ = inotify.unwatch(wd);
            return None;
        }
        // A watch of the same inode under an older entry (it cannot happen while IN_IGNORED
        // is read for every watch that ends; drop it all the same).
        if let Some(old) = self.dirs.remove(&wd) {
            self.by_inode.remove(&old.inode);
        }
        self.dirs.insert(
            wd,
            Indexed {
                inode,
                keys,
                used: self.clock,
            },
        );
        self.by_inode.insert(inode, wd);
        self.drain()?;
        Some(wd)
    }

    /// Applies every queued event; `None` (and nothing indexed) when they cannot be read.
    fn drain(&mut self) -> Option<()> {
        let inotify = self.inotify.as_ref()?;
        let events = match inotify.read() {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!("reading inotify events: {e}; the Maildir index starts again");
                self.forget_all();
                return None;
            }
        };
        for ev in events {
            if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                tracing::info!("inotify queue overflowed: the Maildir index starts again");
                self.forget_all();
                continue;
            }
            if ev.mask & libc::IN_IGNORED != 0 {
                if let Some(gone) = self.dirs.remove(&ev.wd) {
                    self.by_inode.remove(&gone.inode);
                }
                continue;
            }
            if ev.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_UNMOUNT) != 0 {
                self.drop_dir(ev.wd);
                continue;
            }
            let Some(indexed) = self.dirs.get_mut(&ev.wd) else {
                continue;
            };
            let Some(k) = ev.name.as_deref().and_then(key_of).map(hash) else {
                continue;
            };
            if ev.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
                *indexed.keys.entry(k).or_default() += 1;
            } else if ev.mask & (libc::IN_DELETE | libc::IN_MOVED_FROM) != 0
                && let Entry::Occupied(mut n) = indexed.keys.entry(k)
            {
                *n.get_mut() -= 1;
                if *n.get() == 0 {
                    n.remove();
                }
            }
        }
        Some(())
    }

    /// Stops indexing the least recently used directory.
    fn evict(&mut self) {
        if let Some(wd) = self
            .dirs
            .iter()
            .min_by_key(|(_, d)| d.used)
            .map(|(&wd, _)| wd)
        {
            self.drop_dir(wd);
        }
    }

    fn drop_dir(&mut self, wd: i32) {
        if let Some(gone) = self.dirs.remove(&wd) {
            self.by_inode.remove(&gone.inode);
            if let Some(i) = &self.inotify {
                let _ = i.unwatch(wd);
            }
        }
    }

    fn forget_all(&mut self) {
        let wds: Vec<i32> = self.dirs.keys().copied().collect();
        for wd in wds {
            self.drop_dir(wd);
        }
    }
}

/// The key part of a keyed Maildir name, `<secs>.M<usecs>W<row>K<16 hex digits>.` (what
/// [`crate::maildir::keyed_prefix`] makes), whatever host, size and flags follow; `None` for
/// any other name.
pub fn key_of(name: &[u8]) -> Option<&[u8]> {
    fn digits(s: &[u8], at: usize) -> usize {
        s[at..].iter().take_while(|b| b.is_ascii_digit()).count()
    }
    let mut at = usize::from(name.first() == Some(&b'-'));
    let n = digits(name, at);
    if n == 0 || name.get(at + n) != Some(&b'.') || name.get(at + n + 1) != Some(&b'M') {
        return None;
    }
    at += n + 2;
    let n = digits(name, at);
    if n == 0 || name.get(at + n) != Some(&b'W') {
        return None;
    }
    at += n + 1;
    let n = digits(name, at);
    if n == 0 || name.get(at + n) != Some(&b'K') {
        return None;
    }
    at += n + 1;
    let hex = name.get(at..at + 16)?;
    if !hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        || name.get(at + 16) != Some(&b'.')
    {
        return None;
    }
    Some(&name[..at + 17])
}

/// FNV-1a, 64 bits: the same for a key in every process and run.
fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    const A: &str = "1733550000.M123456W42K0123456789abcdef.";
    const B: &str = "1733550000.M123456W43K0123456789abcdef.";

    fn open(p: &Path) -> Dir {
        Dir::open(p).unwrap()
    }

    #[test]
    fn key_parts_as_a_table() {
        let cases: [(&str, Option<&str>); 9] = [
            ("1733550000.M123456W42K0123456789abcdef.host,S=10", Some(A)),
            (
                "1733550000.M123456W42K0123456789abcdef.host,S=10:2,RS",
                Some(A),
            ),
            (
                "-1.M999999W7K00000000000000ff.h",
                Some("-1.M999999W7K00000000000000ff."),
            ),
            ("1733550000.M123456P99Q1.host,S=10", None),
            ("1733550000.M123456W42K0123456789ABCDEF.host", None),
            ("1733550000.M123456W42K0123456789abcde.host", None),
            ("1733550000.M123456W42K0123456789abcdef", None),
            (".M1W2K0123456789abcdef.h", None),
            ("maildirsize", None),
        ];
        for (name, want) in cases {
            assert_eq!(key_of(name.as_bytes()), want.map(str::as_bytes), "{name}");
        }
    }

    #[test]
    fn the_index_follows_every_change_to_the_directory() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("new");
        fs::create_dir(&d).unwrap();
        // Before the first question: found by the first read.
        fs::write(d.join(format!("{A}h,S=1")), b"x").unwrap();
        fs::write(d.join("1.M2P3Q4.h,S=1"), b"x").unwrap();
        let dir = open(&d);
        let mut ix = KeyIndex::new(4);
        assert_eq!(ix.may_hold(&dir, A.as_bytes()), Some(true));
        assert_eq!(ix.may_hold(&dir, B.as_bytes()), Some(false));
        assert_eq!(ix.len(), 1);
        // Created after: seen from its event.
        fs::write(d.join(format!("{B}other,S=2")), b"xy").unwrap();
        assert_eq!(ix.may_hold(&dir, B.as_bytes()), Some(true));
        // Renamed within the directory (a reader changing flags): still there.
        fs::rename(
            d.join(format!("{B}other,S=2")),
            d.join(format!("{B}other,S=2:2,S")),
        )
        .unwrap();
        assert_eq!(ix.may_hold(&dir, B.as_bytes()), Some(true));
        // Moved out (new/ to cur/) and deleted: gone.
        let cur = t.path().join("cur");
        fs::create_dir(&cur).unwrap();
        fs::rename(
            d.join(format!("{B}other,S=2:2,S")),
            cur.join(format!("{B}other,S=2:2,S")),
        )
        .unwrap();
        assert_eq!(ix.may_hold(&dir, B.as_bytes()), Some(false));
        let cur_dir = open(&cur);
        assert_eq!(ix.may_hold(&cur_dir, B.as_bytes()), Some(true));
        fs::remove_file(d.join(format!("{A}h,S=1"))).unwrap();
        assert_eq!(ix.may_hold(&dir, A.as_bytes()), Some(false));
        assert_eq!(ix.len(), 2);
        // Not a keyed prefix: no answer.
        assert_eq!(ix.may_hold(&dir, b"maildirsize"), None);
    }

    #[test]
    fn a_directory_replaced_or_dropped_is_read_again() {
        let t = tempfile::tempdir().unwrap();
        let (d1, d2) = (t.path().join("a"), t.path().join("b"));
        fs::create_dir(&d1).unwrap();
        fs::create_dir(&d2).unwrap();
        let mut ix = KeyIndex::new(1);
        let (a, b) = (open(&d1), open(&d2));
        assert_eq!(ix.may_hold(&a, A.as_bytes()), Some(false));
        // One directory at most: asking about b drops a, whose change is then not followed...
        assert_eq!(ix.may_hold(&b, A.as_bytes()), Some(false));
        fs::write(d1.join(format!("{A}h")), b"").unwrap();
        // ...but read again when asked.
        assert_eq!(ix.may_hold(&a, A.as_bytes()), Some(true));
        assert_eq!(ix.len(), 1);
        // A directory removed and made again under its name is another directory.
        fs::remove_file(d1.join(format!("{A}h"))).unwrap();
        drop(a);
        fs::remove_dir(&d1).unwrap();
        fs::create_dir(&d1).unwrap();
        fs::write(d1.join(format!("{B}h")), b"").unwrap();
        let a = open(&d1);
        assert_eq!(ix.may_hold(&a, B.as_bytes()), Some(true));
        assert_eq!(ix.may_hold(&a, A.as_bytes()), Some(false));
    }

    #[test]
    fn switched_off_it_never_answers() {
        let t = tempfile::tempdir().unwrap();
        let mut ix = KeyIndex::new(0);
        assert_eq!(ix.may_hold(&open(t.path()), A.as_bytes()), None);
        assert!(ix.is_empty());
    }
}
