//! Where each discovery method looks for an address's key: the WKD URLs (draft-koch-openpgp-
//! webkey-service: the z-base-32 SHA-1 of the lower-case local part, advanced and direct
//! methods), the DNS names of OPENPGPKEY (RFC 7929) and SMIMEA (RFC 8162) records (the
//! SHA2-256 of the local part, truncated to 28 octets, in hex), and a VKS keyserver's
//! by-email URL. Pure.

use sha1::Digest as _;

/// The methods, as `key_request.methods_asked` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Wkd,
    OpenPgpKey,
    Smimea,
    Keyserver,
}

impl Method {
    pub fn parse(s: &str) -> Option<Method> {
        match s {
            "wkd" => Some(Method::Wkd),
            "openpgpkey" => Some(Method::OpenPgpKey),
            "smimea" => Some(Method::Smimea),
            "keyserver" => Some(Method::Keyserver),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Wkd => "wkd",
            Method::OpenPgpKey => "openpgpkey",
            Method::Smimea => "smimea",
            Method::Keyserver => "keyserver",
        }
    }
}

/// z-base-32 (the human-oriented base-32 of WKD), no padding.
pub fn zbase32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ybndrfg8ejkmcpqxot1uwisza345h769";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in data {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// The two WKD URLs of an address, advanced first: `https://openpgpkey.<domain>/.well-known/
/// openpgpkey/<domain>/hu/<hash>?l=<local>` and `https://<domain>/.well-known/openpgpkey/
/// hu/<hash>?l=<local>`. `port` is appended when it is not 443.
pub fn wkd_urls(local: &str, domain: &str, port: u16) -> [String; 2] {
    // ASCII letters only, as the draft says: GnuPG hashes the same bytes.
    let hash = zbase32(&sha1::Sha1::digest(local.to_ascii_lowercase().as_bytes()));
    let domain = domain.to_ascii_lowercase();
    let port = if port == 443 {
        String::new()
    } else {
        format!(":{port}")
    };
    let l = percent(local);
    [
        format!(
            "https://openpgpkey.{domain}{port}/.well-known/openpgpkey/{domain}/hu/{hash}?l={l}"
        ),
        format!("https://{domain}{port}/.well-known/openpgpkey/hu/{hash}?l={l}"),
    ]
}

/// The owner name of an address's OPENPGPKEY (`_openpgpkey`) or SMIMEA (`_smimecert`)
/// record.
pub fn dane_name(local: &str, domain: &str, label: &str) -> String {
    let digest = sha2::Sha256::digest(local.as_bytes());
    let hex: String = digest[..28].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.{label}.{}", domain.to_ascii_lowercase())
}

/// A VKS keyserver's lookup URL for an address.
pub fn vks_url(keyserver: &str, address: &str) -> String {
    format!(
        "{}/vks/v1/by-email/{}",
        keyserver.trim_end_matches('/'),
        percent(address)
    )
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wkd_hash_and_urls_of_the_specification_example() {
        // The example address of draft-koch-openpgp-webkey-service §3.1.
        let [advanced, direct] = wkd_urls("Joe.Doe", "Example.ORG", 443);
        assert_eq!(
            advanced,
            "https://openpgpkey.example.org/.well-known/openpgpkey/example.org/hu/\
             iy9q119eutrkn8s1mk4r39qejnbu3n5q?l=Joe.Doe"
        );
        assert_eq!(
            direct,
            "https://example.org/.well-known/openpgpkey/hu/iy9q119eutrkn8s1mk4r39qejnbu3n5q?l=Joe.Doe"
        );
        assert!(wkd_urls("a", "x.test", 8443)[1].starts_with("https://x.test:8443/"));
        assert_eq!(zbase32(&[]), "");
        assert_eq!(zbase32(&[0]), "yy");
        assert_eq!(zbase32(&[0xff]), "9h");
    }

    #[test]
    fn dane_names_and_keyserver_urls() {
        // RFC 7929 §3 example: hugh@example.com.
        assert_eq!(
            dane_name("hugh", "example.com", "_openpgpkey"),
            "c93f1e400f26708f98cb19d936620da35eec8f72e57f9eec01c1afd6._openpgpkey.example.com"
        );
        assert!(
            dane_name("hugh", "Example.COM", "_smimecert").ends_with("._smimecert.example.com")
        );
        assert_eq!(
            vks_url("https://keys.example/", "a+b@x.test"),
            "https://keys.example/vks/v1/by-email/a%2Bb%40x.test"
        );
        for m in ["wkd", "openpgpkey", "smimea", "keyserver"] {
            assert_eq!(Method::parse(m).unwrap().as_str(), m);
        }
        assert_eq!(Method::parse("ldap"), None);
    }
}
