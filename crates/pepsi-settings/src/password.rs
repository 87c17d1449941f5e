//! Reading a mailbox password and hashing it here, so only its Argon2id hash ever reaches
//! the database. The terminal is read with echo off and asked twice; stdin and files give
//! their first line. Nothing here prints or logs a password.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

use anyhow::Context as _;
use pepsi_admin::admin::AdminError;

use crate::Failure;
use pepsi_admin::password::{MAX_PASSWORD_LEN, hash_password};

/// Where the password comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// The controlling terminal on stdin, echo off, asked twice.
    Terminal,
    /// The first line of stdin.
    Stdin,
    /// The first line of a file.
    File(PathBuf),
}

/// The password from `source`, checked by [`check`]; a refusal is `Invalid` (a usage
/// error), a failure to read is `Other`.
pub fn read(source: &PasswordSource) -> Result<String, Failure> {
    let invalid = |text: &str| Failure::Admin(AdminError::Invalid(text.into()));
    let text = match source {
        PasswordSource::Terminal => {
            if !std::io::stdin().is_terminal() {
                return Err(invalid(
                    "no password: stdin is not a terminal; give --password-stdin, --password-file FILE or --no-password",
                ));
            }
            let first = ask("password: ")?;
            check(&first)?;
            let again = ask("again: ")?;
            if first != again {
                return Err(invalid("the two passwords differ: nothing changed"));
            }
            first
        }
        PasswordSource::Stdin => {
            first_line(&mut std::io::stdin().lock()).context("reading the password from stdin")?
        }
        PasswordSource::File(path) => {
            let f = std::fs::File::open(path)
                .with_context(|| format!("opening password file {}", path.display()))?;
            first_line(&mut std::io::BufReader::new(f))
                .with_context(|| format!("reading password file {}", path.display()))?
        }
    };
    check(&text)?;
    Ok(text)
}

/// A password is 1 to MAX_PASSWORD_LEN bytes with no NUL, CR or LF (it is typed, and AUTH
/// PLAIN separates fields with NUL).
pub fn check(password: &str) -> Result<(), AdminError> {
    if password.is_empty() {
        return Err(AdminError::Invalid("the password is empty".into()));
    }
    if password.len() > MAX_PASSWORD_LEN {
        return Err(AdminError::Invalid(format!(
            "the password is {} bytes long; at most {MAX_PASSWORD_LEN} are accepted",
            password.len()
        )));
    }
    if password.contains(['\0', '\r', '\n']) {
        return Err(AdminError::Invalid(
            "the password holds a NUL, CR or LF character".into(),
        ));
    }
    Ok(())
}

/// The Argon2id hash of `password`.
pub fn hash(password: &str) -> anyhow::Result<String> {
    hash_password(password.as_bytes()).map_err(|e| anyhow::anyhow!("hashing the password: {e}"))
}

/// The first line of `r` without its line ending, read at most MAX_PASSWORD_LEN + 2 bytes
/// far (a longer line is reported as too long, not read whole).
fn first_line(r: &mut impl std::io::BufRead) -> anyhow::Result<String> {
    let mut buf = Vec::new();
    std::io::Read::take(&mut *r, MAX_PASSWORD_LEN as u64 + 2).read_until(b'\n', &mut buf)?;
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    String::from_utf8(buf).map_err(|_| anyhow::anyhow!("the password is not UTF-8"))
}

/// Asks on stderr and reads a line from the terminal on stdin with echo off.
fn ask(prompt: &str) -> anyhow::Result<String> {
    use anyhow::bail;
    eprint!("{prompt}");
    std::io::stderr().flush()?;
    let stdin = std::io::stdin();
    let fd = stdin.as_raw_fd();
    // SAFETY: termios is plain data; tcgetattr fills it for a terminal fd, checked below.
    let mut saved: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
        bail!("cannot read the terminal's settings");
    }
    let mut quiet = saved;
    quiet.c_lflag &= !libc::ECHO;
    quiet.c_lflag |= libc::ECHONL;
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) } != 0 {
        bail!("cannot turn the terminal's echo off");
    }
    let line = first_line(&mut stdin.lock());
    // SAFETY: restores the settings read above on the same fd.
    unsafe { libc::tcsetattr(fd, libc::TCSANOW, &saved) };
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_checked() {
        let long = "x".repeat(MAX_PASSWORD_LEN + 1);
        let cases: [(&str, Option<&str>); 5] = [
            ("correct horse", None),
            ("", Some("empty")),
            ("a\nb", Some("NUL, CR or LF")),
            ("a\0b", Some("NUL, CR or LF")),
            (&long, Some("at most 1024")),
        ];
        for (p, want) in cases {
            match (check(p), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, want) => panic!("{p:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn the_first_line_is_the_password() {
        let cases: [(&[u8], &str); 4] = [
            (b"secret\n", "secret"),
            (b"secret\r\nmore\n", "secret"),
            (b"no newline", "no newline"),
            (b"", ""),
        ];
        for (input, want) in cases {
            let got = first_line(&mut std::io::Cursor::new(input)).unwrap();
            assert_eq!(got, want);
        }
    }
}
