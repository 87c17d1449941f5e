//! One delivery into a Maildir: confine the path under the root, find the owner, switch to
//! it, check the quota (Maildir++ `maildirsize`, [`quota`]), write `tmp/<unique>`, fsync, rename into `new/`, fsync `new/` (now,
//! or at the next [`Writer::sync`] for a `dir-sync later` delivery: the directory is kept
//! open from the delivery, so the sync reaches the very directory written, whatever its
//! path names by then).
//!
//! The path is walked one component at a time from open directories ([`confine`],
//! [`crate::fsat`]): the owner the write runs as is read from the descriptor of the very
//! directory reached, and every later open, rename and `maildirsize` update is relative to
//! it, so a Maildir swapped for a symbolic link after the check changes nothing (security
//! review 2026-12-04, finding 6).
//!
//! A delivery with a key (the queue row and its incarnation, [`protocol::DeliveryKey`]) has
//! a file name derived from the key and the recipient ([`keyed_prefix`]): asked again after
//! a crash, it finds its own copy in `new/` or `cur/` and stores no second one, and finishes
//! or replaces one left in `tmp/`.
//!
//! Every outcome is a [`Reply`]; this module never panics on input and never leaves a
//! partial file in `new/` (the file reaches `new/` only by a rename after its data is
//! synced; a failed write removes its `tmp/` file).

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::fsat::{self, Dir, Stat};
use crate::keyindex::{self, KeyIndex};
use crate::privilege::{self, Identity};
use crate::protocol::{self, DirSync, Reply, Request, UsageRequest};
use crate::quota;

/// At most this many `new/` directories wait for a sync; a delivery into one more syncs its
/// directory at once.
pub const MAX_UNSYNCED: usize = 256;

/// At most this many symbolic links are followed for one mailbox path (as the kernel's
/// own limit).
const MAX_LINKS: usize = 40;

/// What the writer may do, fixed at start.
#[derive(Debug, Clone)]
pub struct Options {
    /// Every mailbox must resolve (symlinks followed) to a path under this directory.
    pub root: PathBuf,
    /// Create a missing Maildir (and missing directories above it, under the root).
    pub create: bool,
    /// As root, write into a mailbox owned by root (otherwise refused).
    pub allow_root_owner: bool,
    /// At most this many `new/` and `cur/` directories in the index of keyed copies
    /// ([`KeyIndex`]); 0: read both directories for every keyed delivery.
    pub key_index_dirs: usize,
}

/// The writer: options plus what makes file names unique.
pub struct Writer {
    opts: Options,
    /// The canonical root.
    root: PathBuf,
    host: String,
    pid: u32,
    counter: u64,
    /// `new/` directories renamed into by `dir-sync later` deliveries since the last sync,
    /// each open since its delivery.
    unsynced: Vec<(PathBuf, Dir)>,
    /// Which keyed copies the Maildirs written hold, without reading them each time.
    index: KeyIndex,
}

/// A Maildir's directories, open, as the owner.
struct Maildir {
    /// The Maildir itself (readable: `maildirsize`, its folders).
    top: Dir,
    tmp: Dir,
    new: Dir,
}

impl Maildir {
    fn open(dir: &Dir, path: &Path) -> Result<Maildir, Failed> {
        let top = dir
            .reopen(libc::O_RDONLY)
            .map_err(|e| ("opening", path.to_path_buf(), e))?;
        let sub = |name: &str| {
            top.open_dir(name)
                .map_err(|e| ("opening", path.join(name), e))
        };
        Ok(Maildir {
            tmp: sub("tmp")?,
            new: sub("new")?,
            top,
        })
    }
}

impl Writer {
    /// Fails when the root does not exist or is not a directory.
    pub fn new(opts: Options) -> io::Result<Writer> {
        let root = std::fs::canonicalize(&opts.root)
            .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", opts.root.display())))?;
        if !root.is_dir() {
            return Err(io::Error::other(format!(
                "root {} is not a directory",
                root.display()
            )));
        }
        let index = KeyIndex::new(opts.key_index_dirs.min(keyindex::MAX_DIRS));
        Ok(Writer {
            opts,
            root,
            host: maildir_host(&hostname()),
            pid: std::process::id(),
            counter: 0,
            unsynced: Vec::new(),
            index,
        })
    }

    /// Delivers one request.
    pub fn deliver(&mut self, req: &Request) -> Reply {
        let found = match confine(&self.root, &req.mailbox) {
            Ok(f) => f,
            Err(reply) => return reply,
        };
        // The mailbox itself, or (when creating) the nearest directory above it that exists:
        // its owner, read from the open directory, is who the write runs as.
        let (mailbox, opened, missing) = match found {
            Found::Exists { path, dir } => (path, dir, None),
            Found::Missing { path, .. } if !self.opts.create => {
                return Reply::perm(
                    "5.1.1",
                    format!("no such mailbox: {} does not exist", path.display()),
                );
            }
            Found::Missing {
                path,
                above,
                missing,
            } => (path, above, Some(missing)),
        };
        let owner_of = match opened.stat() {
            Ok(s) => s,
            Err(e) => return io_reply("looking up", &mailbox, e, privilege::current()),
        };
        let what = if missing.is_none() {
            "mailbox"
        } else {
            "the directory above mailbox"
        };
        let (who, _switched) = match self.become_owner(&mailbox, &owner_of, what) {
            Ok(switched) => switched,
            Err(reply) => return reply,
        };
        let dir = match missing {
            None => opened,
            Some(missing) => match create_maildir(opened, &missing) {
                Ok(d) => d,
                Err(e) => return io_reply("creating", &mailbox, e, who),
            },
        };
        let md = match Maildir::open(&dir, &mailbox) {
            Ok(md) => md,
            Err((op, path, e)) => return io_reply(op, &path, e, who),
        };
        let headers = req.prepended_headers();
        let size = (headers.len() + req.message.len()) as u64;
        let limits = req.limits();
        let new_dir = mailbox.join("new");
        let known = self.unsynced.iter().any(|(p, _)| *p == new_dir);
        let dir_sync = match req.dir_sync {
            DirSync::Later if !known && self.unsynced.len() >= MAX_UNSYNCED => DirSync::Now,
            other => other,
        };
        let keyed = req.key.map(|k| keyed_prefix(k, &req.delivered_to));
        if let Some(prefix) = &keyed {
            match stored_already(&mut self.index, &md, prefix) {
                Ok(None) => {}
                Ok(Some((sub, name))) => {
                    tracing::info!(mailbox = %mailbox.display(), "{sub}/{name} is this delivery's copy, stored before: not written again");
                    if sub == "new" {
                        // It may have been renamed by a writer that died before syncing new/.
                        match self.after_rename(&md.new, new_dir, known, dir_sync) {
                            Ok(()) => {}
                            Err(e) => return io_reply("syncing", &mailbox.join("new"), e, who),
                        }
                    }
                    if !limits.any() {
                        return Reply::Ok(name);
                    }
                    let unique = self.unique_name(0);
                    return match quota::current(&md.top, limits, 0, false, &unique) {
                        Ok((usage, _)) => Reply::Stored { name, usage },
                        Err(e) => io_reply("measuring", &mailbox, e, who),
                    };
                }
                Err((op, path, e)) => return io_reply(op, &mailbox.join(path), e, who),
            }
        }
        let mut used = None;
        if limits.any() {
            let unique = self.unique_name(0);
            match quota::current(&md.top, limits, size, false, &unique) {
                Ok((usage, _)) if !limits.fits(usage, size) => {
                    return Reply::Full {
                        usage,
                        text: format!(
                            "mailbox full: {} bytes in {} messages used, {size} more for this \
                             message; the quota is {}",
                            usage.bytes,
                            usage.messages,
                            quota::definition(limits)
                        ),
                    };
                }
                Ok((usage, _)) => used = Some(usage),
                Err(e) => return io_reply("measuring", &mailbox, e, who),
            }
        }
        let name = match &keyed {
            Some(prefix) => format!("{prefix}{},S={size}", self.host),
            None => self.unique_name(size),
        };
        let content = [headers.as_slice(), req.message.as_slice()];
        let written = match &keyed {
            Some(prefix) => finish_or_clear(&md.tmp, prefix, &name, &content),
            None => Ok(None),
        }
        .map_err(|(op, path, e)| (op, mailbox.join("tmp").join(path), e))
        .and_then(|complete| write_into(&md, &mailbox, &name, &content, complete));
        if let Err((op, path, e)) = written {
            return io_reply(op, &path, e, who);
        }
        if let Err(e) = self.after_rename(&md.new, new_dir, known, dir_sync) {
            // The message is in new/ already; a failure here is reported as transient. A
            // keyed retry finds the copy; an unkeyed one may store a second copy: better
            // than losing the only one.
            return io_reply("syncing", &mailbox.join("new"), e, who);
        }
        let Some(before) = used else {
            return Reply::Ok(name);
        };
        // The message is in new/: a change line that cannot be written only leaves the file
        // behind the directory until its next rebuild, so the delivery still counts.
        if let Err(e) = quota::record(&md.top, size as i64, 1) {
            tracing::warn!(mailbox = %mailbox.display(), "cannot update {}: {e}", quota::FILE);
        }
        Reply::Stored {
            name,
            usage: quota::Usage {
                bytes: before.bytes.saturating_add(size),
                messages: before.messages + 1,
            },
        }
    }

    /// After a rename into `new`: syncs it now, or keeps it open for the next [`Writer::sync`].
    fn after_rename(
        &mut self,
        new: &Dir,
        path: PathBuf,
        known: bool,
        dir_sync: DirSync,
    ) -> io::Result<()> {
        match dir_sync {
            DirSync::Now => new.sync(),
            DirSync::Later if known => Ok(()),
            DirSync::Later => {
                self.unsynced.push((path, new.try_clone()?));
                Ok(())
            }
        }
    }

    /// Answers `usage`: the mailbox's usage under the request's limits, as its owner.
    pub fn usage(&mut self, req: &UsageRequest) -> Reply {
        let (mailbox, dir) = match confine(&self.root, &req.mailbox) {
            Ok(Found::Exists { path, dir }) => (path, dir),
            Ok(Found::Missing { path, .. }) => {
                return Reply::perm(
                    "5.1.1",
                    format!("no such mailbox: {} does not exist", path.display()),
                );
            }
            Err(reply) => return reply,
        };
        let owner = match dir.stat() {
            Ok(s) => s,
            Err(e) => return io_reply("looking up", &mailbox, e, privilege::current()),
        };
        let (who, _switched) = match self.become_owner(&mailbox, &owner, "mailbox") {
            Ok(switched) => switched,
            Err(reply) => return reply,
        };
        let top = match dir.reopen(libc::O_RDONLY) {
            Ok(d) => d,
            Err(e) => return io_reply("opening", &mailbox, e, who),
        };
        let unique = self.unique_name(0);
        match quota::current(&top, req.limits, 0, req.rebuild, &unique) {
            Ok((usage, _)) => Reply::Usage(usage),
            Err(e) => io_reply("measuring", &mailbox, e, who),
        }
    }

    /// Who works on `mailbox`: the owner of `owner_of` (the mailbox, or the directory above
    /// it, `what`, as fstat of its open descriptor says) when running as root, switched to
    /// until the guard drops; otherwise this process's own user. A root owner is refused
    /// unless ALLOW_ROOT_OWNER.
    fn become_owner(
        &self,
        mailbox: &Path,
        owner_of: &Stat,
        what: &str,
    ) -> Result<(Identity, Option<privilege::Switched>), Reply> {
        let who = if privilege::is_root() {
            Identity {
                uid: owner_of.uid,
                gid: owner_of.gid,
            }
        } else {
            privilege::current()
        };
        if who.uid == 0 && !self.opts.allow_root_owner {
            return Err(Reply::temp(
                "4.3.5",
                format!(
                    "{what} {} owned by root; refusing to write as root (allow it with ALLOW_ROOT_OWNER)",
                    mailbox.display()
                ),
            ));
        }
        if !privilege::is_root() || who.uid == 0 {
            return Ok((who, None));
        }
        match privilege::switch_to(who) {
            Ok(g) => Ok((who, Some(g))),
            Err(e) => Err(Reply::temp(
                "4.3.0",
                format!("cannot switch to the mailbox owner ({who}): {e}"),
            )),
        }
    }

    /// Syncs every `new/` that `dir-sync later` deliveries renamed into since the last sync:
    /// `ok synced <n>`, or `temp 4.3.0` naming the first directory that failed (the others
    /// are synced all the same; none is tried again).
    pub fn sync(&mut self) -> Reply {
        let dirs = std::mem::take(&mut self.unsynced);
        let n = dirs.len();
        let mut failed = None;
        for (path, dir) in dirs {
            if let Err(e) = dir.sync()
                && failed.is_none()
            {
                failed = Some(Reply::temp(
                    "4.3.0",
                    format!("syncing {}: {e}", path.display()),
                ));
            }
        }
        failed.unwrap_or_else(|| Reply::Ok(format!("synced {n}")))
    }

    /// How many `new/` directories wait for a sync.
    pub fn unsynced(&self) -> usize {
        self.unsynced.len()
    }

    /// `<secs>.M<usecs>P<pid>Q<n>.<host>,S=<size>`: unique per the Maildir convention
    /// (time, process, a per-process counter, host); `S=` lets readers skip a stat.
    fn unique_name(&mut self, size: u64) -> String {
        self.counter += 1;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!(
            "{}.M{}P{}Q{}.{},S={size}",
            now.as_secs(),
            now.subsec_micros(),
            self.pid,
            self.counter,
            self.host
        )
    }
}

/// The start of the file name of a keyed delivery, everything before the host:
/// `<secs>.M<usecs>W<row>K<hash>.`, where `secs.usecs` is the row's incarnation (its
/// `received_at`), `row` the queue row and `hash` 16 hex digits of FNV-1a over the recipient
/// exactly as the envelope has it. The file is `<prefix><host>,S=<size>`: a Maildir name
/// (`time.unique.host`) whose unique part no other delivery shares, and which a retry finds
/// whatever host it runs on and whatever flags a reader added in `cur/`.
pub fn keyed_prefix(key: protocol::DeliveryKey, delivered_to: &str) -> String {
    let secs = key.incarnation.div_euclid(1_000_000);
    let usecs = key.incarnation.rem_euclid(1_000_000);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in delivered_to.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{secs}.M{usecs}W{}K{hash:016x}.", key.row)
}

/// The copy of a keyed delivery already in `new/` or `cur/` (looked at in that order, so a
/// reader moving it between them meanwhile is still seen): the directory and the name. A
/// directory the index says surely holds none is not read.
fn stored_already(
    index: &mut KeyIndex,
    md: &Maildir,
    prefix: &str,
) -> Result<Option<(&'static str, String)>, Failed> {
    let fail = |sub: &str, e| ("reading", PathBuf::from(sub), e);
    if index.may_hold(&md.new, prefix.as_bytes()) != Some(false)
        && let Some(name) = find(&md.new, prefix).map_err(|e| fail("new", e))?
    {
        return Ok(Some(("new", name)));
    }
    let cur = match md.top.open_dir("cur") {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(("opening", PathBuf::from("cur"), e)),
    };
    if index.may_hold(&cur, prefix.as_bytes()) == Some(false) {
        return Ok(None);
    }
    Ok(find(&cur, prefix)
        .map_err(|e| fail("cur", e))?
        .map(|name| ("cur", name)))
}

/// The first entry of `dir` whose name starts with `prefix`.
fn find(dir: &Dir, prefix: &str) -> io::Result<Option<String>> {
    Ok(dir
        .find_prefix(prefix.as_bytes())?
        .map(|n| n.to_string_lossy().into_owned()))
}

/// Before a keyed write: whether `tmp/<name>` holds the complete copy already (written by
/// an attempt that died before its rename: it is then only synced and renamed, through the
/// file returned, locked). Every other file of this delivery in `tmp/` (partial, or another
/// size or host) is removed. A file another writer still holds locked (the same delivery
/// under way in a second worker) is left alone and the attempt fails, to be retried.
fn finish_or_clear(
    tmp: &Dir,
    prefix: &str,
    name: &str,
    content: &[&[u8]],
) -> Result<Option<File>, Failed> {
    let mut complete = None;
    let entries = tmp.entries().map_err(|e| ("reading", PathBuf::new(), e))?;
    for (entry, _) in entries {
        let entry = entry.to_string_lossy().into_owned();
        if !entry.starts_with(prefix) {
            continue;
        }
        let file = match tmp.open_file(&entry) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            // Not a regular file: nothing writes it, it only goes.
            Err(_) => None,
        };
        if let Some(f) = &file {
            match fsat::try_lock(f) {
                Ok(true) => {}
                Ok(false) => {
                    return Err((
                        "waiting for",
                        PathBuf::from(&entry),
                        io::Error::new(
                            io::ErrorKind::WouldBlock,
                            "another delivery of this message is writing it",
                        ),
                    ));
                }
                Err(e) => return Err(("locking", PathBuf::from(&entry), e)),
            }
            // Locked: no live writer has it, and the name may have changed hands meanwhile.
            if !tmp.holds(&entry, f).unwrap_or(false) {
                continue;
            }
        }
        if complete.is_none()
            && entry == name
            && file.is_some()
            && same_content(tmp, name, content).unwrap_or(false)
        {
            complete = file;
            continue;
        }
        match tmp.unlink(&entry) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(("removing", PathBuf::from(entry), e)),
        }
    }
    Ok(complete)
}

/// Whether the file `name` in `dir` holds exactly the concatenation of `content`.
fn same_content(dir: &Dir, name: &str, content: &[&[u8]]) -> io::Result<bool> {
    let mut f = dir.open_file(name)?;
    let want: u64 = content.iter().map(|c| c.len() as u64).sum();
    if Stat::of_file(&f)?.size != want {
        return Ok(false);
    }
    let mut buf = vec![0u8; 64 * 1024];
    for part in content {
        let mut rest = *part;
        while !rest.is_empty() {
            let n = rest.len().min(buf.len());
            f.read_exact(&mut buf[..n])?;
            if buf[..n] != rest[..n] {
                return Ok(false);
            }
            rest = &rest[n..];
        }
    }
    Ok(true)
}

/// Where a mailbox path leads.
#[derive(Debug)]
pub enum Found {
    /// The Maildir exists: its path with every link resolved, and the directory itself, open.
    Exists { path: PathBuf, dir: Dir },
    /// It does not: its path as far as resolved, the nearest existing directory above it
    /// (open), and the names below that one that are missing.
    Missing {
        path: PathBuf,
        above: Dir,
        missing: Vec<OsString>,
    },
}

impl Found {
    /// The mailbox's path, links resolved.
    pub fn path(&self) -> &Path {
        match self {
            Found::Exists { path, .. } | Found::Missing { path, .. } => path,
        }
    }
}

/// Refuses a mailbox that is relative, has `.`/`..` components, or resolves (symlinks
/// followed, as far as it exists) outside `root` or to the root itself. The path is walked
/// from `/` one component at a time, each opened relative to the directory before it without
/// following links (`O_PATH|O_NOFOLLOW`); a symbolic link is read from the very link whose
/// owner was checked and its target walked the same way. The directory returned is the one
/// the walk reached, open: nothing is looked up by path again.
pub fn confine(root: &Path, mailbox: &Path) -> Result<Found, Reply> {
    let escape = |why: &str| {
        Reply::temp(
            "4.3.5",
            format!(
                "mailbox path {} refused: {why} (root {})",
                mailbox.display(),
                root.display()
            ),
        )
    };
    if !mailbox.is_absolute() {
        return Err(escape("not an absolute path"));
    }
    let raw = mailbox.as_os_str().as_encoded_bytes();
    if raw.split(|&b| b == b'/').any(|c| c == b"." || c == b"..") {
        return Err(escape("it has a . or .. component"));
    }
    let looking_up = |p: &Path, e: io::Error| {
        Reply::temp(
            "4.3.0",
            format!(
                "resolving mailbox path {}: looking up {}: {e}",
                mailbox.display(),
                p.display()
            ),
        )
    };
    let inside = |p: &Path| -> Result<(), Reply> {
        if !p.starts_with(root) {
            return Err(escape(&format!("it resolves to {}", p.display())));
        }
        if p == root {
            return Err(escape("it is the root itself"));
        }
        Ok(())
    };
    let top = Path::new("/");
    let mut pending: VecDeque<OsString> = mailbox
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            _ => None,
        })
        .collect();
    // `at` is the path of `cur`, every link resolved.
    let mut at = top.to_path_buf();
    let mut cur = Dir::open(top).map_err(|e| looking_up(top, e))?;
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        // Only a trusted link's target brings these.
        if name == OsStr::new(".") {
            continue;
        }
        if name == OsStr::new("..") {
            cur = cur.parent().map_err(|e| looking_up(&at, e))?;
            at.pop();
            continue;
        }
        let here = at.join(&name);
        let node = match cur.open_node(&name) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut missing = vec![name];
                missing.extend(pending);
                // What is made must be below what was walked: `..` or `.` from a trusted
                // link's target would otherwise be followed by the directories made for it,
                // which `inside` (comparing components) cannot see.
                if missing
                    .iter()
                    .any(|n| n == OsStr::new("..") || n == OsStr::new("."))
                {
                    return Err(escape(&format!(
                        "a link leads through {}, which does not exist, to a . or .. component",
                        at.join(&missing[0]).display()
                    )));
                }
                let mut path = at.clone();
                path.extend(&missing);
                inside(&path)?;
                return Ok(Found::Missing {
                    path,
                    above: cur,
                    missing,
                });
            }
            Err(e) => return Err(looking_up(&here, e)),
        };
        let st = node.stat().map_err(|e| looking_up(&here, e))?;
        if st.is_symlink() {
            // A symbolic link below the root is followed only when root or the helper's own
            // user owns it: a link a mailbox owner planted would choose another owner's
            // Maildir, and with it the identity the write runs as. Links outside the root's
            // tree (the root itself given through a link, say) are the administrator's.
            if at.starts_with(root) && !trusted_owner(st.uid) {
                return Err(escape(&format!(
                    "{} is a symbolic link owned by uid {} (only links owned by root or by \
                     this helper's user are followed)",
                    here.display(),
                    st.uid
                )));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(looking_up(&here, io::Error::from_raw_os_error(libc::ELOOP)));
            }
            let target = PathBuf::from(node.readlink().map_err(|e| looking_up(&here, e))?);
            if target.is_absolute() {
                cur = Dir::open(top).map_err(|e| looking_up(top, e))?;
                at = top.to_path_buf();
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => pending.push_front(n.to_owned()),
                    Component::ParentDir => pending.push_front("..".into()),
                    _ => {}
                }
            }
            continue;
        }
        if pending.is_empty() && !st.is_dir() {
            inside(&here)?;
            return Err(Reply::temp(
                "4.3.0",
                format!("mailbox {} is not a directory", here.display()),
            ));
        }
        cur = node.into_dir().map_err(|e| looking_up(&here, e))?;
        at = here;
    }
    inside(&at)?;
    Ok(Found::Exists { path: at, dir: cur })
}

/// Whether a symbolic link owned by `uid` may be followed: root's, or the real user's the
/// helper runs as (who configured it).
fn trusted_owner(uid: u32) -> bool {
    // SAFETY: getuid has no preconditions and cannot fail.
    uid == 0 || uid == unsafe { libc::getuid() }
}

/// Creates the `missing` directories below `above`, then tmp/ new/ cur/, mode 0700, as the
/// current effective user, each relative to the one before (a link put in the way is
/// refused). The directory holding each one it created is fsynced, so a new Maildir
/// survives a crash like the message written into it. Returns the Maildir, open.
fn create_maildir(above: Dir, missing: &[OsString]) -> io::Result<Dir> {
    let mut cur = above;
    let mut changed: Vec<Dir> = Vec::new();
    let make = |dir: &Dir, name: &OsStr, changed: &mut Vec<Dir>| -> io::Result<()> {
        match dir.mkdir(name, 0o700) {
            Ok(()) => {
                changed.push(dir.reopen(libc::O_RDONLY)?);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    };
    for name in missing {
        make(&cur, name, &mut changed)?;
        let node = cur.open_node(name)?;
        if !node.stat()?.is_dir() {
            return Err(io::Error::other(format!(
                "{} appeared as something else than a directory",
                name.to_string_lossy()
            )));
        }
        cur = node.into_dir()?;
    }
    for sub in ["tmp", "new", "cur"] {
        make(&cur, OsStr::new(sub), &mut changed)?;
    }
    for dir in changed.iter().rev() {
        dir.sync()?;
    }
    Ok(cur)
}

type Failed = (&'static str, PathBuf, io::Error);

/// tmp/ → fsync → new/ (the caller syncs new/). `complete`: `tmp/<name>` holds the copy
/// already, only synced and renamed. On failure the tmp/ file is removed.
fn write_into(
    md: &Maildir,
    mailbox: &Path,
    name: &str,
    content: &[&[u8]],
    complete: Option<File>,
) -> Result<(), Failed> {
    let tmp = mailbox.join("tmp").join(name);
    // The file stays open (and locked, for a keyed delivery) until after its rename.
    let written = match complete {
        Some(file) => file
            .sync_all()
            .map(|_| file)
            .map_err(|e| ("syncing", tmp.clone(), e)),
        None => md
            .tmp
            .create_file(name, 0o600)
            .map_err(|e| ("creating", tmp.clone(), e))
            .and_then(|file| lock_own(&md.tmp, name, file, &tmp))
            .and_then(|mut file| {
                content
                    .iter()
                    .try_for_each(|part| file.write_all(part))
                    .and_then(|_| file.sync_all())
                    .map(|_| file)
                    .map_err(|e| ("writing", tmp.clone(), e))
            }),
    };
    let moved = written.and_then(|file| {
        md.tmp
            .rename(name, &md.new, name)
            .map(|_| drop(file))
            .map_err(|e| ("renaming into", mailbox.join("new"), e))
    });
    if let Err(e) = moved {
        // A file this attempt did not make, or no longer holds, is not its to remove.
        if !matches!(e.0, "creating" | "locking") {
            let _ = md.tmp.unlink(name);
        }
        return Err(e);
    }
    Ok(())
}

/// Locks the file this attempt just made in `tmp/` and checks the name is still that file: a
/// second writer of the same delivery that removed it in the instant between its creation and
/// the lock has made its own, which this attempt must not rename.
fn lock_own(dir: &Dir, name: &str, file: File, path: &Path) -> Result<File, Failed> {
    let locking = |e| ("locking", path.to_path_buf(), e);
    let taken = fsat::try_lock(&file).map_err(locking)?;
    if !taken || !dir.holds(name, &file).unwrap_or(false) {
        return Err(locking(io::Error::new(
            io::ErrorKind::WouldBlock,
            "another delivery of this message is writing it",
        )));
    }
    Ok(file)
}

/// Maps an I/O failure to a reply: a full disk, I/O errors and permission problems are
/// transient (an operator can fix them, the message waits); a filesystem quota is "mailbox
/// full" like QUOTA.
fn io_reply(op: &str, path: &Path, e: io::Error, who: Identity) -> Reply {
    let what = format!("{op} {}", path.display());
    match e.raw_os_error() {
        Some(libc::EDQUOT) => Reply::perm(
            "5.2.2",
            format!("mailbox full: {what}: filesystem quota exceeded"),
        ),
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => Reply::temp(
            "4.3.0",
            format!(
                "permission denied {what} as {who}: {e}; check the mailbox ownership and modes"
            ),
        ),
        Some(libc::ENOSPC) => Reply::temp("4.3.1", format!("{what}: {e} (disk full)")),
        _ => Reply::temp("4.3.0", format!("{what}: {e}")),
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the result is NUL-terminated or truncated.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The host part of a Maildir name: `/` and `:` are written `\057` and `\072`, as the
/// Maildir specification asks; `,` (the info separator Pepsi uses for `S=`) as `\054`.
pub fn maildir_host(host: &str) -> String {
    let mut out = String::new();
    for c in host.chars() {
        match c {
            '/' => out.push_str("\\057"),
            ':' => out.push_str("\\072"),
            ',' => out.push_str("\\054"),
            c if c.is_control() || c == '.' && out.is_empty() => {}
            c => out.push(c),
        }
    }
    if out.is_empty() {
        "localhost".into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_escaped() {
        assert_eq!(maildir_host("mx1.example.test"), "mx1.example.test");
        assert_eq!(maildir_host("a/b:c,d"), "a\\057b\\072c\\054d");
        assert_eq!(maildir_host(""), "localhost");
    }

    /// The name of a keyed delivery: the incarnation as the time, the row and a hash of the
    /// recipient exactly as given in the unique part, the host and size after.
    #[test]
    fn keyed_names_as_a_table() {
        let key = |row, incarnation| protocol::DeliveryKey { row, incarnation };
        let cases = [
            (
                key(81723, 1_733_318_400_123_456),
                "alice@example.test",
                "1733318400.M123456W81723K",
            ),
            (key(1, 1_733_318_400_000_001), "a@b", "1733318400.M1W1K"),
            (key(i64::MAX, 0), "a@b", "0.M0W9223372036854775807K"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (k, rcpt, start) in cases {
            let p = keyed_prefix(k, rcpt);
            assert!(p.starts_with(start), "{p}");
            assert!(p.ends_with('.') && p.matches('.').count() == 2, "{p}");
            let hash = &p[start.len()..p.len() - 1];
            assert!(
                hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
                "{p}"
            );
            assert_eq!(p, keyed_prefix(k, rcpt), "the same key, the same name");
            assert!(seen.insert(p));
        }
        // Another recipient, row or incarnation: another name.
        let base = keyed_prefix(key(5, 10), "alice@example.test");
        for other in [
            keyed_prefix(key(5, 10), "Alice@example.test"),
            keyed_prefix(key(5, 10), "bob@example.test"),
            keyed_prefix(key(6, 10), "alice@example.test"),
            keyed_prefix(key(5, 11), "alice@example.test"),
        ] {
            assert_ne!(base, other);
        }
        // What readers see: `time.unique.host`, the info after a comma, no `/` or `:`.
        let name = format!("{base}{},S=42", maildir_host("mx1.example.test"));
        assert_eq!(name.split('.').next(), Some("0"));
        assert!(!name.contains('/') && !name.contains(':'), "{name}");
        assert_eq!(quota::size_from_name(&name), Some(42));
    }

    #[test]
    fn confinement_table() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("alice/Maildir")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("evil")).unwrap();
        std::os::unix::fs::symlink(root.join("alice"), root.join("alias")).unwrap();
        // A trusted link whose target climbs out through a directory that does not exist:
        // what `--create` would make must not follow the `..`.
        std::os::unix::fs::symlink(root.join("gone/../../escaped"), root.join("climb")).unwrap();
        let r = |s: &str| root.join(s);
        let cases: Vec<(PathBuf, Result<PathBuf, &str>)> = vec![
            (r("alice/Maildir"), Ok(r("alice/Maildir"))),
            (r("bob/Maildir"), Ok(r("bob/Maildir"))),
            (r("alias/Maildir"), Ok(r("alice/Maildir"))),
            (r("alice/../../etc"), Err(". or .. component")),
            (r("./alice"), Err(". or .. component")),
            (r("evil/Maildir"), Err("it resolves to")),
            (
                r("climb/Maildir"),
                Err("does not exist, to a . or .. component"),
            ),
            (PathBuf::from("/etc/Maildir"), Err("it resolves to")),
            (PathBuf::from("alice/Maildir"), Err("not an absolute path")),
            (root.clone(), Err("the root itself")),
        ];
        for (path, want) in cases {
            match (confine(&root, &path), want) {
                (Ok(got), Ok(want)) => assert_eq!(got.path(), want, "{path:?}"),
                (Err(Reply::Temp { status, text }), Err(want)) => {
                    assert_eq!(status, "4.3.5", "{path:?}");
                    assert!(text.contains(want), "{path:?}: {text}");
                }
                (got, want) => panic!("{path:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
