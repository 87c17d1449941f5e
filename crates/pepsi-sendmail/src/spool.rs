//! The drop directory: where a message goes when the database cannot take it, so that
//! pepsi-sendmail never loses one, and where the pickup (`-q`) finds it.
//!
//! A file is written whole or not at all: into `.tmp.<name>` (created exclusively, read-only
//! for everyone once complete), synced to disk, then renamed to `<name>.msg`, and the
//! directory synced when this process may open it (the pickup, and root, may; a user
//! writing through the set-group-id program has no read permission on a 1730 directory, so
//! the rename is then as durable as the file system makes it). The pickup reads only
//! `*.msg`, so it never sees half a file.
//!
//! A file is `PEPSI-SENDMAIL 1\n`, one line of JSON (the envelope, [`SpoolEnvelope`]), then
//! the stored message (header block, CRLF, body). The pickup trusts none of it: the user
//! owns the file, so the submitter is the file's owner, whatever it says, and the database
//! function checks the rest again.

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use pepsi_contract::state::Dsn;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8] = b"PEPSI-SENDMAIL 1\n";
/// The longest envelope line the pickup reads.
pub const MAX_ENVELOPE: u64 = 1 << 20;

/// The envelope line of a spool file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolEnvelope {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub dsn: Dsn,
    /// The login name the writer claimed (the pickup records the file owner's name).
    #[serde(default)]
    pub user: Option<String>,
}

/// A message read back from the drop directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolFile {
    pub path: PathBuf,
    /// The file's name, which makes the token of its insert.
    pub name: String,
    /// The owner: who submitted it.
    pub uid: u32,
    pub envelope: SpoolEnvelope,
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
}

/// Writes one message; returns the final path.
pub fn write(
    dir: &Path,
    envelope: &SpoolEnvelope,
    headers: &[u8],
    body: &[u8],
) -> std::io::Result<PathBuf> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let mut line = serde_json::to_vec(envelope).map_err(std::io::Error::other)?;
    line.push(b'\n');
    for _ in 0..100 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let name = format!(
            "{}.{:09}.{}.{}",
            now.as_secs(),
            now.subsec_nanos(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let tmp = dir.join(format!(".tmp.{name}"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let result = (|| {
            file.write_all(MAGIC)?;
            file.write_all(&line)?;
            file.write_all(headers)?;
            file.write_all(b"\r\n")?;
            file.write_all(body)?;
            // Readable by the pickup (the directory's owner), which no other user can reach:
            // the directory grants others nothing and its group only write and search.
            file.set_permissions(std::fs::Permissions::from_mode(0o444))?;
            file.sync_all()?;
            let done = dir.join(format!("{name}.msg"));
            std::fs::rename(&tmp, &done)?;
            if let Ok(d) = std::fs::File::open(dir) {
                d.sync_all()?;
            }
            Ok(done)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return result;
    }
    Err(std::io::Error::other(
        "cannot find a free file name in the drop directory",
    ))
}

/// Why a spool file cannot be inserted as it is.
#[derive(Debug, thiserror::Error)]
pub enum BadFile {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Malformed(String),
}

/// The names of the complete files, oldest first (names start with the time).
pub fn list(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".msg") && !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Reads and parses the file `name`, at most `max_message` octets of message.
pub fn read(dir: &Path, name: &str, max_message: u64) -> Result<SpoolFile, BadFile> {
    use std::io::Read as _;
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(BadFile::Malformed("not a regular file".into()));
    }
    let limit = MAGIC.len() as u64 + MAX_ENVELOPE + max_message + 2;
    if meta.len() > limit {
        return Err(BadFile::Malformed(format!(
            "{} octets: more than the envelope and MAX_MESSAGE_SIZE allow",
            meta.len()
        )));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut data)?;
    let rest = data
        .strip_prefix(MAGIC)
        .ok_or_else(|| BadFile::Malformed("it does not start with PEPSI-SENDMAIL 1".into()))?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| BadFile::Malformed("no envelope line".into()))?;
    let envelope: SpoolEnvelope = serde_json::from_slice(&rest[..nl])
        .map_err(|e| BadFile::Malformed(format!("envelope: {e}")))?;
    let message = &rest[nl + 1..];
    if message.len() as u64 > max_message + 2 {
        return Err(BadFile::Malformed(format!(
            "a message of {} octets: more than MAX_MESSAGE_SIZE ({max_message})",
            message.len()
        )));
    }
    let (headers, body) = pepsi_contract::message::split(message);
    Ok(SpoolFile {
        path,
        name: name.to_owned(),
        uid: meta.uid(),
        envelope,
        headers: headers.to_vec(),
        body: body.to_vec(),
    })
}

/// Sets a file the pickup cannot insert aside as `<name>.bad` for an operator.
pub fn set_aside(dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    let to = dir.join(format!("{name}.bad"));
    std::fs::rename(dir.join(name), &to)?;
    Ok(to)
}

/// Removes `.tmp.*` files older than `age`: what a writer killed mid-write left.
pub fn sweep_tmp(dir: &Path, age: std::time::Duration) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().starts_with(".tmp.") {
            continue;
        }
        let old = entry
            .metadata()?
            .modified()?
            .elapsed()
            .is_ok_and(|e| e >= age);
        if old && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_only_complete_files_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let env = SpoolEnvelope {
            mail_from: "a@example.test".into(),
            rcpt_to: vec!["b@example.org".into()],
            dsn: Dsn::default(),
            user: Some("a".into()),
        };
        let path = write(dir.path(), &env, b"Subject: x\r\n", b"body\r\n").unwrap();
        std::fs::write(dir.path().join(".tmp.partial"), b"half").unwrap();
        let names = list(dir.path()).unwrap();
        assert_eq!(names.len(), 1);
        assert_eq!(dir.path().join(&names[0]), path);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        let f = read(dir.path(), &names[0], 1000).unwrap();
        assert_eq!(f.envelope, env);
        assert_eq!(f.headers, b"Subject: x\r\n");
        assert_eq!(f.body, b"body\r\n");
        assert!(matches!(
            read(dir.path(), &names[0], 1),
            Err(BadFile::Malformed(_))
        ));
        std::fs::write(dir.path().join("junk.msg"), b"hello\n").unwrap();
        assert!(matches!(
            read(dir.path(), "junk.msg", 1000),
            Err(BadFile::Malformed(_))
        ));
        assert_eq!(sweep_tmp(dir.path(), std::time::Duration::ZERO).unwrap(), 1);
    }
}
