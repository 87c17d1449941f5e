//! Signing keys of the DKIM and ARC stages: the `domain:selector:path` list of `KEYS`, the
//! domain and selector syntax, the PEM private keys (RSA or Ed25519), and the signed
//! header lists both signatures share.
//!
//! Also the keys stored in `pepsi.signing_key` (`fetch_stored_keys`, one read-only query).
//!
//! Reads key files and the key table only when asked (at a worker's start, or on its first
//! message); never touches the queue.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mail_auth::common::crypto::{DkimKey, Ed25519Key, RsaKey, Sha256};
use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::pem::PemObject;

/// The header fields a DKIM signature or an ARC message signature covers when the stage's
/// `HEADERS` is not set. A listed field the message lacks is signed as absent (it is named
/// in `h=`), so no `List-*` field is here: a mailing list adding List-Id would break it.
pub const DEFAULT_HEADERS: &[&str] = &[
    "From",
    "Reply-To",
    "Sender",
    "To",
    "Cc",
    "Subject",
    "Date",
    "Message-ID",
    "In-Reply-To",
    "References",
    "MIME-Version",
    "Content-Type",
    "Content-Transfer-Encoding",
    "Content-Disposition",
    "Content-Language",
];

/// One `domain:selector:path` item of `KEYS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// Lower case, without a trailing dot.
    pub domain: String,
    pub selector: String,
    pub path: PathBuf,
}

fn valid_label_chars(s: &str, extra: &[u8]) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || extra.contains(&b))
        && !s.starts_with('.')
        && !s.ends_with('.')
        && !s.contains("..")
}

/// A signing domain (`d=`) as configured: lower-cased, trailing dot removed; `None` when it
/// is not a dotted domain name of letters, digits and hyphens.
pub fn signing_domain(value: &str) -> Option<String> {
    let domain = value.trim().trim_end_matches('.').to_ascii_lowercase();
    (valid_label_chars(&domain, b".") && domain.contains('.')).then_some(domain)
}

/// Whether `value` is a usable selector (`s=`): labels of letters, digits, `-` and `_`.
pub fn valid_selector(value: &str) -> bool {
    valid_label_chars(value, b"._")
}

/// Parses `KEYS`: items `domain:selector:path` separated by commas (or newlines); the path
/// may itself contain colons. Returns what was expected on failure.
pub fn parse_keys(value: &str) -> Result<Vec<KeySpec>, String> {
    let expected = |item: &str, why: &str| {
        format!("{why} in {item:?}: expected items domain:selector:/path/to/key.pem")
    };
    let mut keys = Vec::new();
    for item in value
        .split([',', '\n'])
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        let mut parts = item.splitn(3, ':');
        let (Some(domain), Some(selector), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(expected(item, "missing field"));
        };
        let Some(domain) = signing_domain(domain) else {
            return Err(expected(item, "not a domain name"));
        };
        let (selector, path) = (selector.trim(), path.trim());
        if !valid_selector(selector) {
            return Err(expected(item, "not a selector"));
        }
        if path.is_empty() {
            return Err(expected(item, "no key file"));
        }
        let spec = KeySpec {
            domain,
            selector: selector.to_owned(),
            path: PathBuf::from(path),
        };
        if keys
            .iter()
            .any(|k: &KeySpec| k.domain == spec.domain && k.selector == spec.selector)
        {
            return Err(expected(item, "selector given twice for the domain"));
        }
        keys.push(spec);
    }
    if keys.is_empty() {
        return Err("at least one domain:selector:/path/to/key.pem".to_owned());
    }
    Ok(keys)
}

/// Reads a private key from a PEM file (`parse_private_key`). The error names the file and
/// says what was expected; the caller adds the option it came from.
pub fn load_key(path: &Path) -> anyhow::Result<DkimKey> {
    let pem =
        std::fs::read(path).with_context(|| format!("key file {}: cannot read", path.display()))?;
    parse_private_key(&pem).map_err(|why| anyhow::anyhow!("key file {}: {why}", path.display()))
}

/// Parses a PEM private key: PKCS#8 (`BEGIN PRIVATE KEY`, RSA or Ed25519, as `openssl
/// genpkey` writes) or PKCS#1 (`BEGIN RSA PRIVATE KEY`). The error says what was wrong and
/// what was expected; the caller names where the key came from.
pub fn parse_private_key(pem: &[u8]) -> Result<DkimKey, String> {
    let not_a_key = |why: String| {
        format!(
            "not a usable private key ({why}); expected a PEM RSA or Ed25519 private key \
             (PKCS#8 or PKCS#1)"
        )
    };
    let der = PrivateKeyDer::from_pem_slice(pem).map_err(|e| not_a_key(e.to_string()))?;
    match der {
        PrivateKeyDer::Pkcs8(p8) => {
            if let Ok(key) = Ed25519Key::from_pkcs8_maybe_unchecked_der(p8.secret_pkcs8_der()) {
                return Ok(DkimKey::Ed25519(key));
            }
            RsaKey::<Sha256>::from_key_der(PrivateKeyDer::Pkcs8(p8))
                .map(DkimKey::Rsa)
                .map_err(|e| not_a_key(format!("neither an RSA nor an Ed25519 key: {e}")))
        }
        der @ PrivateKeyDer::Pkcs1(_) => RsaKey::<Sha256>::from_key_der(der)
            .map(DkimKey::Rsa)
            .map_err(|e| not_a_key(e.to_string())),
        _ => Err(not_a_key(
            "an EC key: DKIM and ARC sign with RSA or Ed25519".to_owned(),
        )),
    }
}

/// One enabled row of `pepsi.signing_key`, its key still PEM text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub domain: String,
    pub selector: String,
    pub private_key: String,
}

/// The enabled keys of `pepsi.signing_key` (patch pepsi-0003), in a stable order. Read-only:
/// the pipeline role may select from that table and nothing more.
pub async fn fetch_stored_keys(pool: &sqlx::PgPool) -> Result<Vec<StoredKey>, sqlx::Error> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT domain, selector, private_key FROM pepsi.signing_key WHERE enabled \
         ORDER BY domain, selector",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(domain, selector, private_key)| StoredKey {
            domain,
            selector,
            private_key,
        })
        .collect())
}

/// Checks a `HEADERS` list: each item must be a header field name (printable ASCII without
/// `:`). Returns the offending item.
pub fn check_header_names(list: &[String]) -> Result<(), String> {
    match list
        .iter()
        .find(|h| h.is_empty() || !h.bytes().all(|b| b.is_ascii_graphic() && b != b':'))
    {
        Some(bad) => Err(format!("{bad:?} is not a header field name")),
        None => Ok(()),
    }
}

/// The `h=` list: `headers` with From listed twice (over-signed, so a second From added
/// above the signed one breaks the signature), each other name once.
pub fn signed_headers(headers: &[String]) -> Vec<String> {
    let mut out: Vec<String> = vec!["From".into(), "From".into()];
    for h in headers {
        if !out.iter().any(|o| o.eq_ignore_ascii_case(h)) {
            out.push(h.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    use super::*;

    /// `openssl genpkey` arguments for each kind of key (pepsi-testkit has the same; it
    /// links pepsi-outbound, so pepsi-outbound's own tests cannot use it).
    mod keys {
        pub const RSA: &[&str] = &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"];
        pub const ED25519: &[&str] = &["-algorithm", "ED25519"];
        pub const EC_P256: &[&str] = &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    }

    /// Writes `openssl genpkey <args>` to `dir/name` (PEM) and returns its path.
    fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
        let path = dir.join(name);
        let status = Command::new("openssl")
            .arg("genpkey")
            .args(args)
            .arg("-out")
            .arg(&path)
            .stderr(Stdio::null())
            .status()
            .expect("openssl must be installed");
        assert!(status.success(), "openssl genpkey {args:?}");
        path
    }

    #[test]
    fn keys_spec_table() {
        let good = parse_keys(
            "Example.Test.:sel1:/etc/pepsi/dkim/a.pem, example.test:ed1:/k/b:c.pem\n other.test:s_2:k.pem",
        )
        .unwrap();
        assert_eq!(
            good,
            vec![
                KeySpec {
                    domain: "example.test".into(),
                    selector: "sel1".into(),
                    path: "/etc/pepsi/dkim/a.pem".into()
                },
                KeySpec {
                    domain: "example.test".into(),
                    selector: "ed1".into(),
                    path: "/k/b:c.pem".into()
                },
                KeySpec {
                    domain: "other.test".into(),
                    selector: "s_2".into(),
                    path: "k.pem".into()
                },
            ]
        );
        for (bad, why) in [
            ("", "at least one"),
            ("example.test:sel1", "missing field"),
            ("example.test", "missing field"),
            ("example.test:sel1:", "no key file"),
            ("localhost:sel1:/k.pem", "not a domain"),
            ("exa mple.test:sel1:/k.pem", "not a domain"),
            ("example.test::/k.pem", "not a selector"),
            ("example.test:s el:/k.pem", "not a selector"),
            ("example.test:s1:/a.pem, EXAMPLE.test:s1:/b.pem", "twice"),
        ] {
            let err = parse_keys(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn domains_selectors_and_header_lists() {
        assert_eq!(
            signing_domain(" Mail.Example.TEST. ").unwrap(),
            "mail.example.test"
        );
        for bad in ["", "localhost", "a..b", ".a.b", "a b.c", "a_b.c"] {
            assert_eq!(signing_domain(bad), None, "{bad:?}");
        }
        assert!(valid_selector("arc-2026_a.b"));
        assert!(!valid_selector("a b") && !valid_selector("") && !valid_selector("a;b"));
        let list = |s: &[&str]| s.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        assert!(check_header_names(&list(&["From", "X-A"])).is_ok());
        assert!(
            check_header_names(&list(&["From", "Bad:Name"]))
                .unwrap_err()
                .contains("Bad:Name")
        );
        assert_eq!(
            signed_headers(&list(&["to", "From", "Subject", "TO"])),
            ["From", "From", "to", "Subject"]
        );
    }

    #[test]
    fn key_files_load_or_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let rsa = openssl_key(dir.path(), "rsa.pem", keys::RSA);
        let ed = openssl_key(dir.path(), "ed.pem", keys::ED25519);
        let ec = openssl_key(dir.path(), "ec.pem", keys::EC_P256);
        assert!(matches!(load_key(&rsa).unwrap(), DkimKey::Rsa(_)));
        assert!(matches!(load_key(&ed).unwrap(), DkimKey::Ed25519(_)));

        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a key\n").unwrap();
        for (path, why) in [
            (&missing, "cannot read"),
            (&garbage, "not a usable private key"),
            (&ec, "neither an RSA nor an Ed25519 key"),
        ] {
            let err = format!("{:#}", load_key(path).err().unwrap());
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains(why), "{err}");
        }
    }
}
