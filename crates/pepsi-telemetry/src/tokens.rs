//! The bearer tokens a client must send (`Authorization: Bearer <token>`): read from
//! `TOKEN_FILE` once at start, kept only as SHA-256 digests, and compared digest against
//! digest in constant time, every digest every time, so neither the answer's timing nor its
//! content tells a client how close its guess came.
//!
//! The file: one token a line, `#` starts a comment line, blank lines are skipped. A token is
//! 16 to 512 visible ASCII characters (it travels in an HTTP header); anything else is
//! refused at start with the line that holds it.

use std::path::Path;

use sha2::{Digest as _, Sha256};

/// The shortest token accepted: a guessable token is no credential.
pub const MIN_TOKEN_LEN: usize = 16;
const MAX_TOKEN_LEN: usize = 512;

/// Why the token file cannot be used; the text names the file and, where there is one, the
/// line.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("TOKEN_FILE {path}: cannot read it: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("TOKEN_FILE {path}: holds no token (one a line, # for comments)")]
    Empty { path: String },
    #[error("TOKEN_FILE {path} line {line}: {problem}")]
    Line {
        path: String,
        line: usize,
        problem: String,
    },
}

/// The accepted tokens, as digests.
#[derive(Clone)]
pub struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} accepted)", self.digests.len())
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Tokens {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Tokens, TokenFileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: name.clone(),
            source,
        })?;
        Tokens::parse(&text, &name)
    }

    /// Reads the file's text; `name` names it in errors.
    pub fn parse(text: &str, name: &str) -> Result<Tokens, TokenFileError> {
        let mut digests = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() || token.starts_with('#') {
                continue;
            }
            let problem = if !token.bytes().all(|b| b.is_ascii_graphic()) {
                Some("a token is visible ASCII characters without spaces".to_owned())
            } else if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len()) {
                Some(format!(
                    "a token of {} characters; expected {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN}",
                    token.len()
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(TokenFileError::Line {
                    path: name.to_owned(),
                    line: n + 1,
                    problem,
                });
            }
            digests.push(digest(token.as_bytes()));
        }
        if digests.is_empty() {
            return Err(TokenFileError::Empty {
                path: name.to_owned(),
            });
        }
        Ok(Tokens { digests })
    }

    /// How many tokens are accepted.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Never true: `parse` refuses a file without a token.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `token` is one of them. Every stored digest is compared in full.
    pub fn accepts(&self, token: &[u8]) -> bool {
        let presented = digest(token);
        let mut matched = 0u8;
        for stored in &self.digests {
            let mut diff = 0u8;
            for (a, b) in stored.iter().zip(presented.iter()) {
                diff |= a ^ b;
            }
            matched |= u8::from(diff == 0);
        }
        std::hint::black_box(matched) == 1
    }

    /// Whether an `Authorization` header value carries an accepted bearer token (the scheme
    /// is case-insensitive, RFC 9110 §11.1).
    pub fn authorizes(&self, header: Option<&[u8]>) -> bool {
        let Some(value) = header else {
            return false;
        };
        let Some(scheme) = value.get(..7) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        let token = value[7..].trim_ascii();
        !token.is_empty() && self.accepts(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# the Pepsi hosts\n\nmx1-0123456789abcdef\n  mx2-fedcba9876543210  \n";

    #[test]
    fn the_file_lines_and_the_header() {
        let t = Tokens::parse(FILE, "tokens").unwrap();
        assert_eq!(t.len(), 2);
        let cases: &[(Option<&[u8]>, bool)] = &[
            (Some(b"Bearer mx1-0123456789abcdef"), true),
            (Some(b"bearer mx2-fedcba9876543210"), true),
            (Some(b"BEARER  mx2-fedcba9876543210 "), true),
            (Some(b"Bearer mx1-0123456789abcde"), false),
            (Some(b"Bearer mx1-0123456789abcdeff"), false),
            (Some(b"Basic mx1-0123456789abcdef"), false),
            (Some(b"Bearer "), false),
            (Some(b"Bearer"), false),
            (Some(b"mx1-0123456789abcdef"), false),
            (Some(b"Bearer # the Pepsi hosts"), false),
            (None, false),
        ];
        for (header, want) in cases {
            assert_eq!(
                t.authorizes(*header),
                *want,
                "{:?}",
                header.map(String::from_utf8_lossy)
            );
        }
    }

    #[test]
    fn a_file_without_a_usable_token_is_refused_naming_the_line() {
        let cases = [
            (
                "",
                "TOKEN_FILE f: holds no token (one a line, # for comments)",
            ),
            ("# only a comment\n\n", "TOKEN_FILE f: holds no token"),
            (
                "# x\nshort\n",
                "TOKEN_FILE f line 2: a token of 5 characters; expected 16 to 512",
            ),
            (
                "with a space 0123456789\n",
                "TOKEN_FILE f line 1: a token is visible ASCII characters without spaces",
            ),
        ];
        for (text, want) in cases {
            let e = Tokens::parse(text, "f").unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        let e = Tokens::load(Path::new("/nonexistent/tokens"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("TOKEN_FILE /nonexistent/tokens: cannot read it:"),
            "{e}"
        );
    }
}
