//! Reading one account's `~/.forward` as that account.
//!
//! The account comes from the system's password database (`getpwnam_r`); one whose uid is
//! below the minimum (root and the system accounts, by default under 1000) has no
//! `.forward` here. Running as root, the read runs as the account (its uid, its primary
//! group only), so it sees exactly what the account may see; never as root. The home
//! directory is opened first and trusted only when it is owned by the account (or root) and
//! writable by no one else (otherwise another user could put a file of the account's under
//! the name `.forward`); the file is then opened inside it without following a symbolic link
//! and trusted only when it is a regular file owned by the account (or root), writable by no
//! one else, and at most `protocol::MAX_FILE` bytes. Anything else is answered `unsafe` and
//! ignored by the stage, as Postfix's local(8) and sendmail ignore a `.forward` they cannot
//! trust.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use pepsi_conf::privilege::{self, Identity};

use crate::protocol::{MAX_FILE, Reply};

/// The lowest uid whose `.forward` is read unless configured otherwise.
pub const DEFAULT_MIN_UID: u32 = 1000;

/// What the reader is allowed to do, fixed at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Accounts with a lower uid have no `.forward` (root never has).
    pub min_uid: u32,
}

pub use pepsi_conf::privilege::{Account, account};

/// The answer for `name`'s `.forward`.
pub fn read_forward(opts: &Options, name: &str) -> Reply {
    let account = match account(name) {
        Ok(Some(a)) => a,
        Ok(None) => return Reply::None(format!("no account {name}")),
        Err(e) => return Reply::temp("4.3.0", format!("looking up account {name}: {e}")),
    };
    if account.uid == 0 || account.uid < opts.min_uid {
        return Reply::None(format!(
            "account {name} has uid {}, below MIN_UID {}",
            account.uid, opts.min_uid
        ));
    }
    if !account.home.is_absolute() {
        return Reply::None(format!("account {name} has no absolute home directory"));
    }
    // Only as the account: root's view of the file system is never what decides.
    let _as_account = if privilege::is_root() {
        match privilege::switch_to(Identity {
            uid: account.uid,
            gid: account.gid,
        }) {
            Ok(g) => Some(g),
            Err(e) => {
                return Reply::temp(
                    "4.3.0",
                    format!("cannot switch to account {name} (uid {}): {e}", account.uid),
                );
            }
        }
    } else {
        None
    };
    read_in_home(&account.home, account.uid)
}

/// Opens and checks `home` and its `.forward` for the account `uid`, as the current
/// identity.
pub fn read_in_home(home: &Path, uid: u32) -> Reply {
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOCTTY)
        .open(home);
    let dir = match dir {
        Ok(d) => d,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => {
                    Reply::None(format!("no home directory {}", home.display()))
                }
                Some(libc::EACCES) | Some(libc::EPERM) => Reply::Unsafe(format!(
                    "home directory {} is not readable by its account: {e}",
                    home.display()
                )),
                _ => Reply::temp("4.3.0", format!("opening {}: {e}", home.display())),
            };
        }
    };
    match dir.metadata() {
        Ok(meta) => {
            if let Some(why) = distrust_home(&meta_facts(&meta), uid) {
                return Reply::Unsafe(format!("home directory {} {why}", home.display()));
            }
        }
        Err(e) => return Reply::temp("4.3.0", format!("{}: {e}", home.display())),
    }
    let path = home.join(".forward");
    let shown = path.display();
    // SAFETY: a plain openat on a descriptor we own and a NUL-terminated name; the result is
    // checked before it becomes a File, which then owns it. A FIFO must not hold the
    // reader; a symbolic link is not followed (ELOOP).
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".forward".as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    let file = if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: fd is a fresh descriptor nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    };
    let mut file: File = match file {
        Ok(f) => f,
        Err(e) => {
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => Reply::None(format!("no {shown}")),
                Some(libc::ELOOP) => Reply::Unsafe(format!("{shown} is a symbolic link")),
                Some(libc::EACCES) | Some(libc::EPERM) => {
                    Reply::Unsafe(format!("{shown} is not readable by its account: {e}"))
                }
                _ => Reply::temp("4.3.0", format!("opening {shown}: {e}")),
            };
        }
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Reply::temp("4.3.0", format!("{shown}: {e}")),
    };
    if let Some(why) = distrust(&meta_facts(&meta), uid) {
        return Reply::Unsafe(format!("{shown} {why}"));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    if let Err(e) = (&mut file).take(MAX_FILE + 1).read_to_end(&mut bytes) {
        return Reply::temp("4.3.0", format!("reading {shown}: {e}"));
    }
    if bytes.len() as u64 > MAX_FILE {
        return Reply::Unsafe(format!("{shown} grew past {MAX_FILE} bytes while read"));
    }
    Reply::File(bytes)
}

/// What the trust rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub regular: bool,
    pub owner: u32,
    pub mode: u32,
    pub len: u64,
}

fn meta_facts(meta: &std::fs::Metadata) -> Facts {
    Facts {
        regular: meta.file_type().is_file(),
        owner: meta.uid(),
        mode: meta.mode(),
        len: meta.len(),
    }
}

/// Why a home directory (or a file in it) with these facts is not trusted for account `uid`,
/// or `None`: owned by someone else than the account or root, or writable by others.
pub fn distrust_home(f: &Facts, uid: u32) -> Option<String> {
    if f.owner != uid && f.owner != 0 {
        return Some(format!(
            "is owned by uid {}, not the account's {uid}",
            f.owner
        ));
    }
    if f.mode & 0o022 != 0 {
        return Some(format!(
            "is writable by {} (mode {:o})",
            if f.mode & 0o002 != 0 {
                "anyone"
            } else {
                "its group"
            },
            f.mode & 0o7777
        ));
    }
    None
}

/// Why a file with these facts is not trusted as account `uid`'s `.forward`, or `None`.
pub fn distrust(f: &Facts, uid: u32) -> Option<String> {
    if !f.regular {
        return Some("is not a regular file".into());
    }
    if let Some(why) = distrust_home(f, uid) {
        return Some(why);
    }
    if f.len > MAX_FILE {
        return Some(format!("is {} bytes, more than {MAX_FILE}", f.len));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_rule_table() {
        let ok = Facts {
            regular: true,
            owner: 1001,
            mode: 0o100644,
            len: 40,
        };
        let cases: &[(Facts, Option<&str>)] = &[
            (ok, None),
            (Facts { owner: 0, ..ok }, None),
            (
                Facts {
                    mode: 0o100600,
                    ..ok
                },
                None,
            ),
            (
                Facts {
                    regular: false,
                    ..ok
                },
                Some("not a regular file"),
            ),
            (Facts { owner: 1002, ..ok }, Some("owned by uid 1002")),
            (
                Facts {
                    mode: 0o100664,
                    ..ok
                },
                Some("writable by its group"),
            ),
            (
                Facts {
                    mode: 0o100646,
                    ..ok
                },
                Some("writable by anyone"),
            ),
            (
                Facts {
                    len: MAX_FILE + 1,
                    ..ok
                },
                Some("more than"),
            ),
            (
                Facts {
                    len: MAX_FILE,
                    ..ok
                },
                None,
            ),
        ];
        for (facts, want) in cases {
            // The home directory's rule is the file's on owner and mode, and only those.
            let home = distrust_home(facts, 1001);
            match want {
                Some(w) if w.contains("owned") || w.contains("writable") => {
                    assert!(
                        home.as_deref().is_some_and(|h| h.contains(w)),
                        "home {facts:?}"
                    )
                }
                _ => assert_eq!(home, None, "home {facts:?}"),
            }
            let got = distrust(facts, 1001);
            match want {
                None => assert_eq!(got, None, "{facts:?}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w)),
                    "{facts:?}: {got:?}"
                ),
            }
        }
    }

    /// The reader's answers for what a home directory may hold, as the current user.
    #[test]
    fn files_are_read_only_when_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(home, 0o755);
        let me = privilege::current().uid;
        let path = home.join(".forward");
        assert!(matches!(read_in_home(home, me), Reply::None(_)));
        let gone = read_in_home(&home.join("gone"), me);
        assert!(
            matches!(&gone, Reply::None(w) if w.contains("no home")),
            "{gone:?}"
        );
        std::fs::write(&path, "bob@example.org\n").unwrap();
        mode(&path, 0o644);
        assert_eq!(
            read_in_home(home, me),
            Reply::File(b"bob@example.org\n".to_vec())
        );
        // A home others may write is not trusted, whatever the file looks like.
        mode(home, 0o775);
        let shared = read_in_home(home, me);
        assert!(
            matches!(&shared, Reply::Unsafe(w) if w.contains("home directory") && w.contains("its group")),
            "{shared:?}"
        );
        mode(home, 0o755);
        mode(&path, 0o666);
        assert!(matches!(read_in_home(home, me), Reply::Unsafe(w) if w.contains("anyone")));
        std::fs::remove_file(&path).unwrap();
        let target = home.join("elsewhere");
        std::fs::write(&target, "x@example.org\n").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let link = read_in_home(home, me);
        assert!(
            matches!(&link, Reply::Unsafe(w) if w.contains("symbolic link")),
            "{link:?}"
        );
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(read_in_home(home, me), Reply::Unsafe(w) if w.contains("regular")));
    }

    #[test]
    fn accounts_come_from_the_password_database() {
        let root = account("root").unwrap().unwrap();
        assert_eq!(root.uid, 0);
        assert!(root.home.is_absolute());
        assert_eq!(account("no-such-account-here").unwrap(), None);
        // root's .forward is never read, whatever MIN_UID says.
        let opts = Options { min_uid: 0 };
        assert!(matches!(read_forward(&opts, "root"), Reply::None(w) if w.contains("uid 0")));
    }
}
