//! What a program started through a set-id bit needs: the start (`scrub_if_setuid`,
//! `refuse_borrowed_group`, the caller check), the password-database lookups, dropping to
//! the real ids before running another program (`pepsi-whitelist`), and acting as another
//! account: a scoped switch of the effective uid, gid and supplementary groups
//! (`switch_to`), taken only when the process runs with effective uid 0. The switch is the
//! setuid-root helpers' alone (the Maildir writer, which writes as the mailbox owner, and
//! the `.forward` reader, which reads as the account); `stage::main` uses the start for a
//! stage installed with a bit.
//!
//! The switch's callers are single-threaded, so the effective ids are the whole process's.
//! Root stays the saved uid during a switch (that is what lets the guard switch back); the
//! owner cannot signal or trace the process meanwhile, because its real uid is the caller's
//! and a setuid process is not dumpable. If switching back fails the process aborts: it must
//! never go on with an identity it did not choose.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Who an access runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {} gid {}", self.uid, self.gid)
    }
}

/// The process's own effective identity.
pub fn current() -> Identity {
    // SAFETY: getters without arguments or failure modes.
    unsafe {
        Identity {
            uid: libc::geteuid(),
            gid: libc::getegid(),
        }
    }
}

/// True when the effective uid is root: accesses then switch to the account concerned.
pub fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True when the program was started through its setuid bit by another user: the caller's
/// arguments may then only narrow what the system configuration allows.
pub fn is_setuid_invocation() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getuid() != libc::geteuid() }
}

/// What `HOME` is for a program started through its setuid bit: a directory that does not
/// exist (only root could make it).
pub const SETUID_HOME: &str = "/nonexistent";

/// True when started through a setuid bit by another user; the environment, which that
/// user chose, is then emptied before anything reads it (logging, configuration paths), and
/// `HOME` is set to [`SETUID_HOME`]. Call first thing in `main`, while the process has one
/// thread.
///
/// Without HOME the database client looks for `~/.pgpass` in the home directory of the
/// *real* user (`getpwuid(getuid())`), a file the caller controls, opened with the bit's
/// identity, and logs every line of it that holds no `:` to the caller's stderr (security
/// review 2026-12-04 #9). `PGPASSFILE` stays unset (cleared here): the client reads it in
/// addition to `~/.pgpass`, not instead, so `/dev/null` would only add a warning about its
/// permissions to every connection.
pub fn scrub_if_setuid() -> bool {
    let setuid = is_setuid_invocation();
    if setuid {
        // SAFETY: single-threaded, before anything else runs or reads the environment.
        unsafe {
            libc::clearenv();
            std::env::set_var("HOME", SETUID_HOME);
        }
    }
    setuid
}

/// While alive, the process's effective ids are `to`'s; dropping it restores root.
pub struct Switched {
    saved_gid: u32,
    saved_groups: Vec<libc::gid_t>,
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// Becomes `to` (supplementary groups: only `to.gid`). Must be called as root.
pub fn switch_to(to: Identity) -> io::Result<Switched> {
    // SAFETY: plain system calls on values we own; the buffer is sized by the first call.
    unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut());
        let mut saved_groups = vec![0; n.max(0) as usize];
        if n > 0 {
            let got = libc::getgroups(n, saved_groups.as_mut_ptr());
            check(if got < 0 { -1 } else { 0 }, "getgroups")?;
            saved_groups.truncate(got as usize);
        }
        let guard = Switched {
            saved_gid: libc::getegid(),
            saved_groups,
        };
        // From here on, a failure drops the guard, which puts everything back.
        let groups = [to.gid as libc::gid_t];
        check(libc::setgroups(1, groups.as_ptr()), "setgroups")?;
        check(libc::setegid(to.gid), "setegid")?;
        check(libc::seteuid(to.uid), "seteuid")?;
        Ok(guard)
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        // SAFETY: as above; root is the saved uid, so seteuid(0) is allowed.
        let ok = unsafe {
            libc::seteuid(0) == 0
                && libc::setegid(self.saved_gid) == 0
                && libc::setgroups(self.saved_groups.len(), self.saved_groups.as_ptr()) == 0
        };
        if !ok {
            eprintln!(
                "{}: cannot switch back to root: {}; aborting",
                std::env::args().next().unwrap_or_default(),
                io::Error::last_os_error()
            );
            std::process::abort();
        }
    }
}

/// One account as the password database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The login name.
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// The GECOS field, whole (the full name is its first comma-separated part).
    pub gecos: String,
}

/// Runs a reentrant user or group database lookup (`getpwnam_r`, `getpwuid_r`,
/// `getgrnam_r`) with a buffer grown until it fits, and hands the entry found to `read`;
/// `Ok(None)` when there is none. `E` is `libc::passwd` or `libc::group`.
fn entry_lookup<E, T>(
    call: impl Fn(*mut E, *mut libc::c_char, libc::size_t, *mut *mut E) -> libc::c_int,
    read: impl FnOnce(&E) -> T,
) -> io::Result<Option<T>> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `E` is a C struct of integers and pointers, for which all zeroes is a
        // valid value; `call` gets pointers valid for its duration, and the entry's strings
        // point into `buf`, which is not changed before `read` has run.
        let mut entry: E = unsafe { std::mem::zeroed() };
        let mut result: *mut E = std::ptr::null_mut();
        let rc = call(&mut entry, buf.as_mut_ptr().cast(), buf.len(), &mut result);
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        // Some NSS modules say "no such account" with an error number (getpwnam(3), NOTES).
        if matches!(rc, libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM) {
            return Ok(None);
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        if result.is_null() {
            return Ok(None);
        }
        return Ok(Some(read(&entry)));
    }
}

/// The text of a string field of an entry; empty when the pointer is null.
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives the call.
unsafe fn field(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// An `Account` from a password-database entry just returned by a lookup.
fn read_account(pwd: &libc::passwd) -> Account {
    // SAFETY: on success pw_dir, pw_name and pw_gecos are NUL-terminated strings inside the
    // lookup's buffer (or null: an NSS module may leave a field out), which outlives this
    // call. A missing home directory reads as empty, never as a null dereference.
    let home = if pwd.pw_dir.is_null() {
        PathBuf::new()
    } else {
        let dir = unsafe { CStr::from_ptr(pwd.pw_dir) };
        PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()))
    };
    Account {
        name: unsafe { field(pwd.pw_name) },
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
        home,
        gecos: unsafe { field(pwd.pw_gecos) },
    }
}

/// Looks `name` up in the password database (`getpwnam_r`, so NSS modules count); `Ok(None)`
/// when there is no such account.
pub fn account(name: &str) -> io::Result<Option<Account>> {
    let c_name = CString::new(name).map_err(|_| io::Error::other("a name with a NUL byte"))?;
    entry_lookup(
        // SAFETY: the pointers come from entry_lookup, valid for the call.
        |pwd, buf, len, result| unsafe { libc::getpwnam_r(c_name.as_ptr(), pwd, buf, len, result) },
        read_account,
    )
}

/// The account with `uid` in the password database (`getpwuid_r`); `Ok(None)` when there is
/// none.
pub fn account_by_uid(uid: u32) -> io::Result<Option<Account>> {
    entry_lookup(
        // SAFETY: the pointers come from entry_lookup, valid for the call.
        |pwd, buf, len, result| unsafe { libc::getpwuid_r(uid, pwd, buf, len, result) },
        read_account,
    )
}

/// The name of the account with `uid` in the password database (`getpwuid_r`); `Ok(None)`
/// when there is none.
pub fn account_name(uid: u32) -> io::Result<Option<String>> {
    Ok(account_by_uid(uid)?.map(|a| a.name))
}

/// The gid of the group `name` in the group database (`getgrnam_r`, so NSS modules count);
/// `Ok(None)` when there is no such group.
pub fn group_id(name: &str) -> io::Result<Option<u32>> {
    let c_name = CString::new(name).map_err(|_| io::Error::other("a name with a NUL byte"))?;
    entry_lookup(
        // SAFETY: the pointers come from entry_lookup, valid for the call.
        |grp, buf, len, result| unsafe { libc::getgrnam_r(c_name.as_ptr(), grp, buf, len, result) },
        |grp: &libc::group| grp.gr_gid,
    )
}

/// For a child of a setuid program, between fork and exec (`CommandExt::pre_exec`): makes
/// the real, effective and saved uid and gid all the real ones of the process, so the
/// program it runs is its caller's in every respect and cannot take the bit's identity
/// back. Async-signal-safe: two system calls and no allocation.
pub fn become_real_ids() -> io::Result<()> {
    // SAFETY: plain system calls; setting every id to the real one is always permitted.
    unsafe {
        let (uid, gid) = (libc::getuid(), libc::getgid());
        // No allocation here (the error path included): the parent may have other threads.
        if libc::setresgid(gid, gid, gid) != 0 || libc::setresuid(uid, uid, uid) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// For a child of a process running as root, between fork and exec: makes every uid and gid
/// `uid` and `gid`, with `gid` as the only supplementary group, so the program it runs is
/// that account's and cannot become root again. Async-signal-safe, no allocation.
pub fn become_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain system calls on values we own.
    unsafe {
        let groups = [gid as libc::gid_t];
        if libc::setgroups(1, groups.as_ptr()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The real identity of the process: who started it, whatever set-id bits say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealIds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (inherited from the caller; a set-group-id bit adds none).
    pub groups: Vec<u32>,
}

impl RealIds {
    pub fn current() -> RealIds {
        // SAFETY: plain getters; the buffer is sized by the first getgroups call.
        unsafe {
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut groups = vec![0; n.max(0) as usize];
            if n > 0 {
                let got = libc::getgroups(n, groups.as_mut_ptr());
                groups.truncate(got.max(0) as usize);
            }
            RealIds {
                uid: libc::getuid(),
                gid: libc::getgid(),
                groups,
            }
        }
    }
}

/// Whether a setuid helper may serve the user who started it: root, the account `caller`
/// (the one whose stage workers run it), or a real member of `group` (the helper's own group,
/// which an operator's account may belong to). A set-group-id program run by anyone (a stage
/// started with a configuration of the user's own, whose HELPER is a program of theirs)
/// gives that program the group as its *effective* gid only, so it does not pass. `Err` says
/// who was refused, for the helper's one line on stderr.
pub fn check_caller(
    ids: &RealIds,
    caller: &str,
    group: Option<u32>,
    section: &str,
) -> Result<(), String> {
    check_account(ids, caller, &format!("[{section}] CALLER {caller}"), group)
}

/// `check_caller` for a setuid helper whose allowed account is its `[section] CALLER` in
/// `cfg` (the system configuration), by default the service account `pepsi`.
pub fn check_configured_caller(
    cfg: &crate::config::Config,
    section: &str,
    ids: &RealIds,
    group: Option<u32>,
) -> Result<(), String> {
    let caller = cfg
        .section(section)
        .string_opt("CALLER")
        .map_err(|e| e.to_string())?
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| SERVICE_ACCOUNT.to_owned());
    check_caller(ids, caller.trim(), group, section)
}

/// `check_caller` with the allowed account described by `label` in the messages.
fn check_account(
    ids: &RealIds,
    caller: &str,
    label: &str,
    group: Option<u32>,
) -> Result<(), String> {
    if ids.uid == 0 {
        return Ok(());
    }
    let allowed = account(caller)
        .map_err(|e| format!("{label}: {e}"))?
        .ok_or_else(|| format!("{label}: no such account"))?;
    if ids.uid == allowed.uid {
        return Ok(());
    }
    if let Some(g) = group
        && (ids.gid == g || ids.groups.contains(&g))
    {
        return Ok(());
    }
    Err(format!(
        "started by uid {}: only root, {label} (uid {}){} may use this program",
        ids.uid,
        allowed.uid,
        match group {
            Some(g) => format!(" or a member of group {g}"),
            None => String::new(),
        }
    ))
}

/// The account the dispatcher and its stage workers run as in an installed system
/// (packaging/privileges.txt).
pub const SERVICE_ACCOUNT: &str = "pepsi";

/// True when started through a set-group-id bit by a user outside that group.
pub fn is_setgid_invocation() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getgid() != libc::getegid() }
}

/// For a set-group-id stage (its group reads token files or runs a setuid helper): started
/// through its bit, it serves only root, the service account `pepsi` and real members of the
/// group. Anyone else could otherwise run it with a configuration of their own (its token
/// file paths, its HELPER, its smarthost) and so use the group's files through it. Call first
/// thing; `Err` is the one line to print before exiting.
pub fn refuse_borrowed_group() -> Result<(), String> {
    if !is_setgid_invocation() {
        return Ok(());
    }
    // SAFETY: no arguments, cannot fail.
    let group = unsafe { libc::getegid() };
    check_account(
        &RealIds::current(),
        SERVICE_ACCOUNT,
        &format!("the service account {SERVICE_ACCOUNT}"),
        Some(group),
    )
}

/// The group owning this program's executable: the group a set-group-id caller of it is
/// installed with.
pub fn own_group() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(std::env::current_exe().ok()?)
        .ok()
        .map(|m| m.gid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_with_null_string_fields_reads_as_empty_ones() {
        // An NSS module may return an entry without a home directory, name or GECOS field.
        // SAFETY: passwd is plain data; all-zero is null pointers and zero ids.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        pwd.pw_uid = 1234;
        pwd.pw_gid = 5678;
        let a = read_account(&pwd);
        assert_eq!((a.uid, a.gid), (1234, 5678));
        assert_eq!(a.home, PathBuf::new());
        assert!(a.name.is_empty() && a.gecos.is_empty());
    }

    #[test]
    fn callers_table() {
        let nobody = account("nobody").unwrap().expect("the nobody account");
        let ids = |uid, gid, groups: &[u32]| RealIds {
            uid,
            gid,
            groups: groups.to_vec(),
        };
        let other = nobody.uid + 1;
        let cases = [
            (ids(0, 0, &[]), None, true),
            (ids(nobody.uid, 5, &[]), None, true),
            (ids(other, 5, &[]), None, false),
            (ids(other, 4242, &[]), Some(4242), true),
            (ids(other, 5, &[7, 4242]), Some(4242), true),
            (ids(other, 5, &[7]), Some(4242), false),
        ];
        for (who, group, ok) in cases {
            let got = check_caller(&who, "nobody", group, "helper-x");
            assert_eq!(got.is_ok(), ok, "{who:?} {group:?}: {got:?}");
            if let Err(e) = got {
                assert!(
                    e.contains(&format!("started by uid {other}")) && e.contains("CALLER nobody"),
                    "{e}"
                );
            }
        }
        // A setgid program started by someone outside its group, through its bit.
        let e = check_account(
            &ids(other, 5, &[]),
            "nobody",
            "the service account nobody",
            Some(9),
        )
        .unwrap_err();
        assert!(
            e.contains("only root, the service account nobody") && e.contains("group 9"),
            "{e}"
        );
        let e =
            check_caller(&ids(other, 5, &[]), "no-such-caller-x", None, "helper-x").unwrap_err();
        assert!(
            e.contains("no-such-caller-x") && e.contains("no such account"),
            "{e}"
        );
        assert_eq!(account("no-such-account-here").unwrap(), None);
    }

    #[test]
    fn the_password_and_group_databases_answer_by_name_and_by_id() {
        let root = account("root").unwrap().expect("the root account");
        assert_eq!((root.name.as_str(), root.uid, root.gid), ("root", 0, 0));
        assert_eq!(account_by_uid(0).unwrap(), Some(root));
        assert_eq!(account_name(0).unwrap().as_deref(), Some("root"));
        let nobody = account("nobody").unwrap().expect("the nobody account");
        assert_eq!(account_name(nobody.uid).unwrap().as_deref(), Some("nobody"));
        assert_eq!(group_id("root").unwrap(), Some(0));
        assert_eq!(group_id("no-such-group-here").unwrap(), None);
        assert!(account("ro\0ot").is_err());
        assert!(group_id("ro\0ot").is_err());
    }
}
