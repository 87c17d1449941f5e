//! The helper's files on disk: writing a token file so that a reader sees the old one or
//! the new one and never a part (a temporary file in the same directory, synced, renamed
//! over the old one, the directory synced), with the mode and the group it must have; and
//! the lock that keeps two runs from spending one refresh token at once.
//!
//! A written file takes the group of its directory (`pepsi-token` in an installed system's
//! /var/lib/pepsi/tokens), so the set-group-id smarthost stage can read an access token
//! (mode 0640) and no one but the helper's account a refresh token (mode 0600).

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// The mode of an access-token file: its owner writes, its group (the smarthost stage's,
/// through its set-group-id bit) reads.
pub const ACCESS_TOKEN_MODE: u32 = 0o640;
/// The mode of a refresh-token file: the helper's account alone.
pub const REFRESH_TOKEN_MODE: u32 = 0o600;

/// Why a file could not be written or locked; each names the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {what}: {error}")]
pub struct StoreError {
    pub path: PathBuf,
    pub what: &'static str,
    pub error: std::io::Error,
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Replaces `path` with `contents`, mode `mode`, the group of its directory.
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), StoreError> {
    let dir = directory_of(path);
    let fail = |what, error| StoreError {
        path: path.to_owned(),
        what,
        error,
    };
    let group = std::fs::metadata(dir)
        .map_err(|e| fail("cannot read its directory", e))?
        .gid();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Made 0600 by tempfile, so no one reads it before its mode and group are right.
    let mut temp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| fail("cannot create a temporary file beside it", e))?;
    let file = temp.as_file();
    if file
        .metadata()
        .map_err(|e| fail("cannot read the temporary file", e))?
        .gid()
        != group
    {
        std::os::unix::fs::fchown(file, None, Some(group))
            .map_err(|e| fail("cannot give it the group of its directory", e))?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| fail("cannot set its mode", e))?;
    temp.write_all(contents)
        .map_err(|e| fail("cannot write it", e))?;
    temp.as_file()
        .sync_all()
        .map_err(|e| fail("cannot sync it", e))?;
    temp.persist(path)
        .map_err(|e| fail("cannot rename the temporary file over it", e.error))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fail("cannot sync its directory", e))?;
    Ok(())
}

/// Held while an account's refresh token is used: a lock on the directory of its refresh
/// token file (the file itself is replaced when the server rotates it, so a lock on it
/// would not be seen by the next run). Released when dropped.
pub struct Lock(#[allow(dead_code)] File);

/// Waits for the lock of the refresh token in `refresh_token_file`'s directory.
pub fn lock(refresh_token_file: &Path) -> Result<Lock, StoreError> {
    let dir = directory_of(refresh_token_file);
    let fail = |what, error| StoreError {
        path: dir.to_owned(),
        what,
        error,
    };
    let handle = File::open(dir).map_err(|e| fail("cannot open the directory to lock it", e))?;
    handle
        .lock()
        .map_err(|e| fail("cannot lock the directory", e))?;
    Ok(Lock(handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_replaces_the_old_one_with_its_mode_and_the_directory_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m365.json");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        for (text, mode) in [("new", ACCESS_TOKEN_MODE), ("newer", REFRESH_TOKEN_MODE)] {
            write_atomically(&path, text.as_bytes(), mode).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(meta.mode() & 0o7777, mode);
            assert_eq!(meta.gid(), std::fs::metadata(dir.path()).unwrap().gid());
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["m365.json"], "no temporary file is left");

        let err = write_atomically(&dir.path().join("no/such/dir/t.json"), b"x", 0o640)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no/such/dir/t.json") && err.contains("directory"),
            "{err}"
        );
    }

    #[test]
    fn the_lock_is_held_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m365.refresh");
        let held = lock(&file).unwrap();
        let other = File::open(dir.path()).unwrap();
        assert!(other.try_lock().is_err(), "a second run waits");
        drop(held);
        assert!(other.try_lock().is_ok());
    }
}
