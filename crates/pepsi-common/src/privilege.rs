//! Acting as another account: a scoped switch of the effective uid, gid and supplementary
//! groups, taken only when the process runs with effective uid 0. The setuid-root helpers
//! (the Maildir writer, which writes as the mailbox owner, and the `.forward` reader, which
//! reads as the account) use it; nothing else may.
//!
//! Its callers are single-threaded, so the effective ids are the whole process's. Root stays
//! the saved uid during a switch (that is what lets the guard switch back); the owner cannot
//! signal or trace the process meanwhile, because its real uid is the caller's and a setuid
//! process is not dumpable. If switching back fails the process aborts: it must never go on
//! with an identity it did not choose.

use std::io;

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
