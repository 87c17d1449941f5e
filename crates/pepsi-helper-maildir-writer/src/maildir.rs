//! One delivery into a Maildir: confine the path under the root, find the owner, switch to
//! it, check the quota (Maildir++ `maildirsize`, [`quota`]), write `tmp/<unique>`, fsync, rename into `new/`, fsync `new/` (now,
//! or at the next [`Writer::sync`] for a `dir-sync later` delivery: the directory is kept
//! open from the delivery, so the sync reaches the very directory written, whatever its
//! path names by then).
//!
//! Every outcome is a [`Reply`]; this module never panics on input and never leaves a
//! partial file in `new/` (the file reaches `new/` only by a rename after its data is
//! synced; a failed write removes its `tmp/` file).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::privilege::{self, Identity};
use crate::protocol::{DirSync, Reply, Request, UsageRequest};
use crate::quota;

/// At most this many `new/` directories wait for a sync; a delivery into one more syncs its
/// directory at once.
pub const MAX_UNSYNCED: usize = 256;

/// What the writer may do, fixed at start.
#[derive(Debug, Clone)]
pub struct Options {
    /// Every mailbox must resolve (symlinks followed) to a path under this directory.
    pub root: PathBuf,
    /// Create a missing Maildir (and missing directories above it, under the root).
    pub create: bool,
    /// As root, write into a mailbox owned by root (otherwise refused).
    pub allow_root_owner: bool,
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
    unsynced: Vec<(PathBuf, File)>,
}

impl Writer {
    /// Fails when the root does not exist or is not a directory.
    pub fn new(opts: Options) -> io::Result<Writer> {
        let root = fs::canonicalize(&opts.root)
            .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", opts.root.display())))?;
        if !root.is_dir() {
            return Err(io::Error::other(format!(
                "root {} is not a directory",
                root.display()
            )));
        }
        Ok(Writer {
            opts,
            root,
            host: maildir_host(&hostname()),
            pid: std::process::id(),
            counter: 0,
            unsynced: Vec::new(),
        })
    }

    /// Delivers one request.
    pub fn deliver(&mut self, req: &Request) -> Reply {
        let mailbox = match confine(&self.root, &req.mailbox) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        // The mailbox itself, or (when creating) the nearest directory above it that exists:
        // its owner is who the write runs as.
        let (exists, owner_of) = match fs::metadata(&mailbox) {
            Ok(m) if m.is_dir() => (true, m),
            Ok(_) => {
                return Reply::temp(
                    "4.3.0",
                    format!("mailbox {} is not a directory", mailbox.display()),
                );
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !self.opts.create {
                    return Reply::perm(
                        "5.1.1",
                        format!("no such mailbox: {} does not exist", mailbox.display()),
                    );
                }
                match nearest_existing(&mailbox) {
                    Ok(m) => (false, m),
                    Err(e) => return io_reply("looking up", &mailbox, e, privilege::current()),
                }
            }
            Err(e) => return io_reply("looking up", &mailbox, e, privilege::current()),
        };
        let what = if exists {
            "mailbox"
        } else {
            "the directory above mailbox"
        };
        let (who, _switched) = match self.become_owner(&mailbox, &owner_of, what) {
            Ok(switched) => switched,
            Err(reply) => return reply,
        };
        if !exists && let Err(e) = create_maildir(&self.root, &mailbox) {
            return io_reply("creating", &mailbox, e, who);
        }
        let headers = req.prepended_headers();
        let size = (headers.len() + req.message.len()) as u64;
        let limits = req.limits();
        let mut used = None;
        if limits.any() {
            let unique = self.unique_name(0);
            match quota::current(&mailbox, limits, size, false, &unique) {
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
        let name = self.unique_name(size);
        let new_dir = mailbox.join("new");
        let known = self.unsynced.iter().any(|(p, _)| *p == new_dir);
        let dir_sync = match req.dir_sync {
            DirSync::Later if !known && self.unsynced.len() >= MAX_UNSYNCED => DirSync::Now,
            other => other,
        };
        let stored = match write_into(&mailbox, &name, &headers, &req.message, dir_sync) {
            Ok(None) => name,
            Ok(Some(dir)) => {
                if !known {
                    self.unsynced.push((new_dir, dir));
                }
                name
            }
            Err((op, path, e)) => return io_reply(op, &path, e, who),
        };
        let Some(before) = used else {
            return Reply::Ok(stored);
        };
        // The message is in new/: a change line that cannot be written only leaves the file
        // behind the directory until its next rebuild, so the delivery still counts.
        if let Err(e) = quota::record(&mailbox, size as i64, 1) {
            tracing::warn!(mailbox = %mailbox.display(), "cannot update {}: {e}", quota::FILE);
        }
        Reply::Stored {
            name: stored,
            usage: quota::Usage {
                bytes: before.bytes.saturating_add(size),
                messages: before.messages + 1,
            },
        }
    }

    /// Answers `usage`: the mailbox's usage under the request's limits, as its owner.
    pub fn usage(&mut self, req: &UsageRequest) -> Reply {
        let mailbox = match confine(&self.root, &req.mailbox) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        let owner = match fs::metadata(&mailbox) {
            Ok(m) if m.is_dir() => m,
            Ok(_) => {
                return Reply::temp(
                    "4.3.0",
                    format!("mailbox {} is not a directory", mailbox.display()),
                );
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Reply::perm(
                    "5.1.1",
                    format!("no such mailbox: {} does not exist", mailbox.display()),
                );
            }
            Err(e) => return io_reply("looking up", &mailbox, e, privilege::current()),
        };
        let (who, _switched) = match self.become_owner(&mailbox, &owner, "mailbox") {
            Ok(switched) => switched,
            Err(reply) => return reply,
        };
        let unique = self.unique_name(0);
        match quota::current(&mailbox, req.limits, 0, req.rebuild, &unique) {
            Ok((usage, _)) => Reply::Usage(usage),
            Err(e) => io_reply("measuring", &mailbox, e, who),
        }
    }

    /// Who works on `mailbox`: the owner of `owner_of` (the mailbox, or the directory above
    /// it, `what`) when running as root, switched to until the guard drops; otherwise this
    /// process's own user. A root owner is refused unless ALLOW_ROOT_OWNER.
    fn become_owner(
        &self,
        mailbox: &Path,
        owner_of: &fs::Metadata,
        what: &str,
    ) -> Result<(Identity, Option<privilege::Switched>), Reply> {
        let who = if privilege::is_root() {
            Identity {
                uid: owner_of.uid(),
                gid: owner_of.gid(),
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
            if let Err(e) = dir.sync_all()
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

/// Refuses a mailbox that is relative, has `.`/`..` components, or resolves (symlinks
/// followed, as far as it exists) outside `root`. Returns the resolved path.
pub fn confine(root: &Path, mailbox: &Path) -> Result<PathBuf, Reply> {
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
    // Resolve the longest existing prefix, then append the rest (which does not exist, so
    // holds no symlink).
    let mut existing = mailbox.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    let resolved = loop {
        match fs::canonicalize(&existing) {
            Ok(p) => break p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(name) = existing.file_name() else {
                    return Err(escape("no part of it exists"));
                };
                rest.push(name.to_owned());
                existing.pop();
            }
            Err(e) => {
                return Err(Reply::temp(
                    "4.3.0",
                    format!("resolving mailbox path {}: {e}", mailbox.display()),
                ));
            }
        }
    };
    let mut full = resolved;
    for part in rest.iter().rev() {
        full.push(part);
    }
    if full.components().any(|c| matches!(c, Component::ParentDir)) || !full.starts_with(root) {
        return Err(escape(&format!("it resolves to {}", full.display())));
    }
    // A symbolic link below the root is followed only when root or the helper's own user
    // owns it: a link a mailbox owner planted would choose another owner's Maildir, and with
    // it the identity the write runs as.
    // Links outside the root's tree (the root itself given through a link, say) are the
    // administrator's and not checked.
    let inside = |link: &Path| {
        link.parent()
            .and_then(|p| fs::canonicalize(p).ok())
            .is_some_and(|p| p.starts_with(root))
    };
    let mut walked = PathBuf::new();
    for part in mailbox.components() {
        walked.push(part);
        match fs::symlink_metadata(&walked) {
            Ok(m) if m.file_type().is_symlink() && !trusted_owner(m.uid()) && inside(&walked) => {
                return Err(escape(&format!(
                    "{} is a symbolic link owned by uid {} (only links owned by root or by \
                     this helper's user are followed)",
                    walked.display(),
                    m.uid()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e) => {
                return Err(Reply::temp(
                    "4.3.0",
                    format!("looking up {}: {e}", walked.display()),
                ));
            }
        }
    }
    if full == root {
        return Err(escape("it is the root itself"));
    }
    Ok(full)
}

/// Whether a symbolic link owned by `uid` may be followed: root's, or the real user's the
/// helper runs as (who configured it).
fn trusted_owner(uid: u32) -> bool {
    // SAFETY: getuid has no preconditions and cannot fail.
    uid == 0 || uid == unsafe { libc::getuid() }
}

/// Metadata of the nearest existing directory above `path`.
fn nearest_existing(path: &Path) -> io::Result<fs::Metadata> {
    let mut p = path.to_path_buf();
    while p.pop() {
        match fs::metadata(&p) {
            Ok(m) => return Ok(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no directory above it exists",
    ))
}

/// Creates the missing directories from under `root` down to `mailbox`, then tmp/ new/ cur/,
/// mode 0700, as the current effective user. The directory holding each one it created is
/// fsynced, so a new Maildir survives a crash like the message written into it.
fn create_maildir(root: &Path, mailbox: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.mode(0o700);
    let mut parents: Vec<PathBuf> = Vec::new();
    let mut create = |p: &Path| match builder.create(p) {
        Ok(()) => {
            if let Some(parent) = p.parent()
                && !parents.iter().any(|q| q == parent)
            {
                parents.push(parent.to_path_buf());
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    };
    let mut p = root.to_path_buf();
    for part in mailbox.strip_prefix(root).unwrap_or(mailbox).components() {
        p.push(part);
        create(&p)?;
    }
    for sub in ["tmp", "new", "cur"] {
        create(&mailbox.join(sub))?;
    }
    for dir in parents.iter().rev() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

type Failed = (&'static str, PathBuf, io::Error);

/// tmp/ → fsync → new/ → fsync new/ (`DirSync::Now`), or new/ opened and returned for a later
/// sync (`DirSync::Later`). On failure the tmp/ file is removed.
fn write_into(
    mailbox: &Path,
    name: &str,
    headers: &[u8],
    message: &[u8],
    dir_sync: DirSync,
) -> Result<Option<File>, Failed> {
    let tmp = mailbox.join("tmp").join(name);
    let new_dir = mailbox.join("new");
    let new = new_dir.join(name);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| ("creating", tmp.clone(), e))?;
    let written = file
        .write_all(headers)
        .and_then(|_| file.write_all(message))
        .and_then(|_| file.sync_all())
        .map_err(|e| ("writing", tmp.clone(), e));
    drop(file);
    let moved = written
        .and_then(|_| fs::rename(&tmp, &new).map_err(|e| ("renaming into", new_dir.clone(), e)));
    if let Err(e) = moved {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable only once the directory is synced. The message is in new/
    // already; a failure here is reported as transient, and a retry may store a second
    // copy: better than losing the only one.
    let dir = File::open(&new_dir).map_err(|e| ("syncing", new_dir.clone(), e))?;
    match dir_sync {
        DirSync::Later => Ok(Some(dir)),
        DirSync::Now => dir
            .sync_all()
            .map(|_| None)
            .map_err(|e| ("syncing", new_dir.clone(), e)),
    }
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

    #[test]
    fn confinement_table() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir_all(root.join("alice/Maildir")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("evil")).unwrap();
        std::os::unix::fs::symlink(root.join("alice"), root.join("alias")).unwrap();
        let r = |s: &str| root.join(s);
        let cases: Vec<(PathBuf, Result<PathBuf, &str>)> = vec![
            (r("alice/Maildir"), Ok(r("alice/Maildir"))),
            (r("bob/Maildir"), Ok(r("bob/Maildir"))),
            (r("alias/Maildir"), Ok(r("alice/Maildir"))),
            (r("alice/../../etc"), Err(". or .. component")),
            (r("./alice"), Err(". or .. component")),
            (r("evil/Maildir"), Err("it resolves to")),
            (PathBuf::from("/etc/Maildir"), Err("it resolves to")),
            (PathBuf::from("alice/Maildir"), Err("not an absolute path")),
            (root.clone(), Err("the root itself")),
        ];
        for (path, want) in cases {
            match (confine(&root, &path), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{path:?}"),
                (Err(Reply::Temp { status, text }), Err(want)) => {
                    assert_eq!(status, "4.3.5", "{path:?}");
                    assert!(text.contains(want), "{path:?}: {text}");
                }
                (got, want) => panic!("{path:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
