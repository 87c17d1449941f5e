//! Directory file descriptors and the `*at` calls on them: every file the writer touches is
//! named relative to a directory it holds open, never by a path looked up again later, so a
//! directory swapped for a symbolic link after it was checked cannot redirect a write
//! (security review 2026-12-04, finding 6).
//!
//! Nothing here follows a symbolic link: every name is opened with `O_NOFOLLOW` (a link is a
//! refusal, `ELOOP`), and the one way to read a link is [`Dir::open_node`] + [`Node::readlink`]
//! on the very link whose owner was checked. This module makes no decisions.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// What `fstat` says about a node, the few fields the writer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// The device and inode: which file this is, whatever its name.
    pub dev: u64,
    pub ino: u64,
}

impl Stat {
    fn of(st: &libc::stat) -> Stat {
        Stat {
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    /// fstat of an open file.
    pub fn of_file(f: &File) -> io::Result<Stat> {
        fstat(f.as_raw_fd())
    }

    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }

    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the name {name:?} contains a NUL byte"),
        )
    })
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fstat(fd: libc::c_int) -> io::Result<Stat> {
    // SAFETY: an all-zero stat is a valid value; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the caller's lifetime; st is a valid out pointer.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(Stat::of(&st))
}

/// Any node opened `O_PATH|O_NOFOLLOW`: a symbolic link itself, a directory, a file. Opening
/// one has no side effect (a FIFO or a device is not opened for I/O).
#[derive(Debug)]
pub struct Node(OwnedFd);

impl Node {
    pub fn stat(&self) -> io::Result<Stat> {
        fstat(self.0.as_raw_fd())
    }

    /// The target of this symbolic link (the very link opened, not one found again by name).
    pub fn readlink(&self) -> io::Result<OsString> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: the empty path with an O_PATH fd reads that link; buf is valid for its length.
        let n = unsafe {
            libc::readlinkat(
                self.0.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(OsString::from_vec(buf))
    }

    /// This node as a directory: `ENOTDIR` when it is not one. The directory is the one this
    /// node refers to (opened through `.` relative to it, no name looked up again).
    pub fn into_dir(self) -> io::Result<Dir> {
        let dir = Dir(self.0);
        dir.reopen(libc::O_PATH)
    }
}

/// An open directory. Opened with `O_PATH` it can be walked through and named relative to
/// ([`Dir::open_node`], [`Dir::mkdir`], ...); [`Dir::reopen`] gives one that can also be read
/// and synced.
#[derive(Debug)]
pub struct Dir(OwnedFd);

impl Dir {
    /// Opens `path` (an absolute path the administrator chose: symbolic links are followed).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: c is a valid C string; the returned fd is owned below.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: fd was just opened and is owned by nothing else.
        Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn openat(&self, name: &OsStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
        let c = cstr(name)?;
        // SAFETY: self.0 is an open directory fd; c is a valid C string.
        let fd = cvt(unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                libc::c_uint::from(mode),
            )
        })?;
        // SAFETY: fd was just opened and is owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The same directory opened again with `flags` (`O_RDONLY` to read and sync it; the
    /// check of read permission is the caller's current effective user's).
    pub fn reopen(&self, flags: libc::c_int) -> io::Result<Dir> {
        self.openat(OsStr::new("."), flags | libc::O_DIRECTORY, 0)
            .map(Dir)
    }

    pub fn stat(&self) -> io::Result<Stat> {
        fstat(self.0.as_raw_fd())
    }

    /// The entry `name`, whatever it is, without following it.
    pub fn open_node(&self, name: &OsStr) -> io::Result<Node> {
        self.openat(name, libc::O_PATH, 0).map(Node)
    }

    /// The subdirectory `name`, readable; a symbolic link is refused (`ELOOP`), a file too
    /// (`ENOTDIR`).
    pub fn open_dir(&self, name: impl AsRef<OsStr>) -> io::Result<Dir> {
        self.openat(name.as_ref(), libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map(Dir)
    }

    /// The parent directory (`..`), for a trusted link's target that climbs.
    pub fn parent(&self) -> io::Result<Dir> {
        self.openat(OsStr::new(".."), libc::O_PATH | libc::O_DIRECTORY, 0)
            .map(Dir)
    }

    /// Creates the file `name` (it must not exist), write-only.
    pub fn create_file(&self, name: &str, mode: libc::mode_t) -> io::Result<File> {
        self.openat(
            OsStr::new(name),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            mode,
        )
        .map(File::from)
    }

    /// Opens the regular file `name` for reading (`O_NONBLOCK`, so a FIFO planted under the
    /// name cannot hang the writer; refused below).
    pub fn open_file(&self, name: &str) -> io::Result<File> {
        let f = File::from(self.openat(OsStr::new(name), libc::O_RDONLY | libc::O_NONBLOCK, 0)?);
        if !fstat(f.as_raw_fd())?.is_file() {
            return Err(io::Error::other(format!("{name} is not a regular file")));
        }
        Ok(f)
    }

    /// Whether the entry `name` is the very file `file` is open on (not followed).
    pub fn holds(&self, name: &str, file: &File) -> io::Result<bool> {
        let here = self.stat_at(OsStr::new(name))?;
        let open = Stat::of_file(file)?;
        Ok((here.dev, here.ino) == (open.dev, open.ino))
    }

    /// Opens the existing regular file `name` to append to it.
    pub fn append_file(&self, name: &str) -> io::Result<File> {
        let f = File::from(self.openat(
            OsStr::new(name),
            libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK,
            0,
        )?);
        if !fstat(f.as_raw_fd())?.is_file() {
            return Err(io::Error::other(format!("{name} is not a regular file")));
        }
        Ok(f)
    }

    /// `lstat` of the entry `name`.
    pub fn stat_at(&self, name: &OsStr) -> io::Result<Stat> {
        let c = cstr(name)?;
        // SAFETY: see fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: self.0 is an open directory fd; c is valid; st is a valid out pointer.
        cvt(unsafe {
            libc::fstatat(
                self.0.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(Stat::of(&st))
    }

    pub fn mkdir(&self, name: &OsStr, mode: libc::mode_t) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: self.0 is an open directory fd; c is valid.
        cvt(unsafe { libc::mkdirat(self.0.as_raw_fd(), c.as_ptr(), mode) }).map(|_| ())
    }

    /// Renames `from` here to `to` in `dir` (replacing a file of that name there).
    pub fn rename(&self, from: &str, dir: &Dir, to: &str) -> io::Result<()> {
        let (a, b) = (cstr(OsStr::new(from))?, cstr(OsStr::new(to))?);
        // SAFETY: both fds are open directories; both names are valid C strings.
        cvt(unsafe {
            libc::renameat(
                self.0.as_raw_fd(),
                a.as_ptr(),
                dir.0.as_raw_fd(),
                b.as_ptr(),
            )
        })
        .map(|_| ())
    }

    pub fn unlink(&self, name: &str) -> io::Result<()> {
        let c = cstr(OsStr::new(name))?;
        // SAFETY: self.0 is an open directory fd; c is valid.
        cvt(unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), 0) }).map(|_| ())
    }

    /// fsync of the directory (it must have been opened readable, [`Dir::reopen`]).
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: self.0 is an open fd.
        cvt(unsafe { libc::fsync(self.0.as_raw_fd()) }).map(|_| ())
    }

    /// A second descriptor of this directory, for keeping it past this value.
    pub fn try_clone(&self) -> io::Result<Dir> {
        self.0.try_clone().map(Dir)
    }

    /// The entries' names (without `.` and `..`) and whether each is known to be a
    /// directory (`None`: the filesystem did not say, ask [`Dir::stat_at`]). The directory
    /// must be readable ([`Dir::reopen`]).
    pub fn entries(&self) -> io::Result<Vec<(OsString, Option<bool>)>> {
        let mut out = Vec::new();
        self.each_entry(|name, dir| {
            out.push((OsString::from_vec(name.to_vec()), dir));
            false
        })?;
        Ok(out)
    }

    /// The first entry whose name starts with `prefix`, read without copying the others'
    /// names (a `cur/` may hold a hundred thousand).
    pub fn find_prefix(&self, prefix: &[u8]) -> io::Result<Option<OsString>> {
        let mut found = None;
        self.each_entry(|name, _| {
            if name.starts_with(prefix) {
                found = Some(OsString::from_vec(name.to_vec()));
                true
            } else {
                false
            }
        })?;
        Ok(found)
    }

    /// The magic number of the filesystem holding this directory (`statfs`'s `f_type`).
    pub fn filesystem(&self) -> io::Result<i64> {
        // SAFETY: an all-zero statfs is a valid value; fstatfs fills it or fails.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open for the call; st is a valid out pointer.
        cvt(unsafe { libc::fstatfs(self.0.as_raw_fd(), &mut st) })?;
        Ok(st.f_type as i64)
    }

    /// Calls `f` with each entry's name and kind (see [`Dir::entries`]) until it returns
    /// true.
    pub fn each_entry(&self, mut f: impl FnMut(&[u8], Option<bool>) -> bool) -> io::Result<()> {
        // fdopendir takes the descriptor over; give it a copy, rewound.
        let fd = self.0.try_clone()?;
        // SAFETY: fd is an open directory; lseek has no memory effects.
        if unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        // SAFETY: raw is an open directory fd that the DIR stream now owns.
        let dirp = unsafe { libc::fdopendir(raw) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so raw is still ours to close.
            unsafe { libc::close(raw) };
            return Err(e);
        }
        let result = loop {
            // SAFETY: errno is thread-local; clearing it tells end of stream from an error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: dirp is a valid open stream until closedir below.
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                break if e.raw_os_error() == Some(0) {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: readdir returned a valid entry, its name NUL-terminated, valid until
            // the next readdir on this stream.
            let (name, kind) = unsafe {
                (
                    std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()),
                    (*ent).d_type,
                )
            };
            let name = name.to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let dir = match kind {
                libc::DT_DIR => Some(true),
                libc::DT_UNKNOWN => None,
                _ => Some(false),
            };
            if f(name, dir) {
                break Ok(());
            }
        };
        // SAFETY: dirp is valid and closed once.
        unsafe { libc::closedir(dirp) };
        result
    }
}

impl AsRawFd for Dir {
    fn as_raw_fd(&self) -> libc::c_int {
        self.0.as_raw_fd()
    }
}

/// An inotify instance, non-blocking: watches on directories and the events they queue.
#[derive(Debug)]
pub struct Inotify(OwnedFd);

/// One event read from an [`Inotify`]: the watch, what happened and, for an event about an
/// entry of the watched directory, its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub wd: i32,
    pub mask: u32,
    pub name: Option<Vec<u8>>,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: no pointers; the returned fd is owned below.
        let fd = cvt(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        // SAFETY: fd was just created and is owned by nothing else.
        Ok(Inotify(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches the very directory `dir` refers to (through `/proc/self/fd`, no path looked up
    /// again) for `mask`: the watch descriptor, the same one for a directory watched already.
    pub fn watch(&self, dir: &Dir, mask: u32) -> io::Result<i32> {
        let path = format!("/proc/self/fd/{}\0", dir.0.as_raw_fd());
        // SAFETY: path is NUL-terminated; the inotify fd is open.
        cvt(unsafe {
            libc::inotify_add_watch(
                self.0.as_raw_fd(),
                path.as_ptr().cast(),
                mask | libc::IN_ONLYDIR,
            )
        })
    }

    /// Ends the watch `wd` (its `IN_IGNORED` event follows).
    pub fn unwatch(&self, wd: i32) -> io::Result<()> {
        // SAFETY: no pointers; the inotify fd is open.
        cvt(unsafe { libc::inotify_rm_watch(self.0.as_raw_fd(), wd) }).map(|_| ())
    }

    /// Every event queued now, oldest first (none: an empty list, never a wait).
    pub fn read(&self) -> io::Result<Vec<Event>> {
        let mut events = Vec::new();
        // Aligned for inotify_event; room for many events with names of NAME_MAX.
        let mut buf = vec![0u64; 4096];
        let header = std::mem::size_of::<libc::inotify_event>();
        loop {
            // SAFETY: buf is valid for its length in bytes.
            let n = unsafe {
                libc::read(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len() * std::mem::size_of::<u64>(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(events);
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: the kernel wrote n bytes of whole events into buf.
            let bytes =
                unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
            let mut at = 0;
            while at + header <= bytes.len() {
                // SAFETY: a whole event header starts at `at` (the kernel writes whole events).
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(bytes[at..].as_ptr().cast()) };
                let len = ev.len as usize;
                let raw =
                    &bytes[(at + header).min(bytes.len())..(at + header + len).min(bytes.len())];
                let name = (len > 0).then(|| {
                    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                    raw[..end].to_vec()
                });
                events.push(Event {
                    wd: ev.wd,
                    mask: ev.mask,
                    name,
                });
                at += header + len;
            }
        }
    }
}

/// Takes an exclusive `flock` on `file` without waiting: false while another open file holds
/// one. A keyed delivery's file in `tmp/` is locked by the writer writing it, for as long as
/// it lives, so a second writer of the same delivery (two workers on one row after a lost
/// claim) never removes, completes or renames a file still being written.
pub fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: the fd is open for the call; flock has no memory effects.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}
