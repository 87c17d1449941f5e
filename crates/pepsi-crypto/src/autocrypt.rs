//! Autocrypt Level 1 (https://autocrypt.org/level1.html): the `Autocrypt` header a sender
//! attaches to announce its key (§2.1), reading it back from a message by the rules of
//! §2.3, and the `Autocrypt-Gossip` headers inside an encrypted message.

use pepsi_contract::message;
use pepsi_smtp::encoding::{base64_decode, base64_encode};
use sequoia_openpgp as pgp;

use pgp::Packet;
use pgp::cert::prelude::*;
use pgp::serialize::SerializeInto;
use pgp::types::RevocationStatus;

use crate::openpgp::{policy, read_cert};
use crate::{CryptoError, Result};

/// The longest header line written, the limit RFC 5322 §2.1.1 recommends.
const LINE: usize = 78;

/// Whether the sender wants encryption whenever both sides can do it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreferEncrypt {
    Mutual,
    NoPreference,
}

impl PreferEncrypt {
    pub fn as_str(self) -> &'static str {
        match self {
            PreferEncrypt::Mutual => "mutual",
            PreferEncrypt::NoPreference => "nopreference",
        }
    }
}

/// One valid Autocrypt (or Autocrypt-Gossip) header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The address the key is for, lower-case.
    pub addr: String,
    pub prefer_encrypt: PreferEncrypt,
    /// The certificate, binary, without any secret key material.
    pub keydata: Vec<u8>,
}

fn malformed(why: impl Into<String>) -> CryptoError {
    CryptoError::Malformed {
        what: "Autocrypt header",
        why: why.into(),
    }
}

/// Parses one Autocrypt header value (§2.1): `addr` and `keydata` required, `type` 1 if
/// present, `prefer-encrypt=mutual` or no preference, attributes starting with `_`
/// ignored and any other unknown one making the header invalid.
pub fn parse(value: &str) -> Result<Header> {
    let mut addr: Option<String> = None;
    let mut prefer = PreferEncrypt::NoPreference;
    let mut keydata: Option<String> = None;
    let mut seen: Vec<String> = Vec::new();
    for attribute in value.split(';') {
        let attribute = attribute.trim();
        if attribute.is_empty() {
            continue;
        }
        let Some((name, v)) = attribute.split_once('=') else {
            return Err(malformed(format!("attribute {attribute:?} has no value")));
        };
        let name = name.trim().to_ascii_lowercase();
        let v = v.trim();
        if seen.contains(&name) {
            return Err(malformed(format!("attribute {name:?} given twice")));
        }
        seen.push(name.clone());
        match name.as_str() {
            "addr" => addr = Some(v.to_lowercase()),
            "type" if v == "1" => {}
            "type" => return Err(malformed(format!("type {v:?} is not 1"))),
            "prefer-encrypt" if v == "mutual" => prefer = PreferEncrypt::Mutual,
            "prefer-encrypt" => prefer = PreferEncrypt::NoPreference,
            "keydata" => keydata = Some(v.to_owned()),
            n if n.starts_with('_') => {}
            n => return Err(malformed(format!("unknown critical attribute {n:?}"))),
        }
    }
    let addr = addr.ok_or_else(|| malformed("no addr attribute"))?;
    if addr.is_empty() || !addr.contains('@') {
        return Err(malformed(format!("addr {addr:?} is not an e-mail address")));
    }
    let keydata = keydata.ok_or_else(|| malformed("no keydata attribute"))?;
    let compact: String = keydata.chars().filter(|c| !c.is_whitespace()).collect();
    let bytes = base64_decode(&compact)
        .ok_or_else(|| malformed(format!("keydata for {addr} is not base64")))?;
    let cert = read_cert(&bytes).map_err(|e| malformed(format!("keydata for {addr}: {e}")))?;
    // Serialized as a certificate: whatever secret parts a sender leaked stay out.
    let keydata = cert
        .to_vec()
        .map_err(|e| malformed(format!("keydata for {addr}: {e}")))?;
    Ok(Header {
        addr,
        prefer_encrypt: prefer,
        keydata,
    })
}

/// The smallest certificate Autocrypt sends (§2.1): the primary key, the user ID for
/// `addr` with its binding signature, and the newest valid encryption subkey (one for
/// transport encryption when there is one) with its binding.
fn minimal_cert(cert: &Cert, addr: &str) -> Result<Cert> {
    let p = policy();
    let fpr = cert.fingerprint().to_hex();
    let no_key = |why: String| CryptoError::NoKey(format!("certificate {fpr} {why}"));
    if matches!(
        cert.revocation_status(&p, None),
        RevocationStatus::Revoked(_)
    ) {
        return Err(no_key("is revoked".into()));
    }
    let vc = cert
        .with_policy(&p, None)
        .map_err(|e| no_key(format!("is not valid: {e:#}")))?;
    let userid = vc
        .userids()
        .filter(|ua| !matches!(ua.revocation_status(), RevocationStatus::Revoked(_)))
        .find(|ua| ua.userid().email_normalized().ok().flatten().as_deref() == Some(addr))
        .ok_or_else(|| no_key(format!("has no valid user ID for {addr}")))?;
    let subkey = vc
        .keys()
        .subkeys()
        .supported()
        .alive()
        .revoked(false)
        .for_transport_encryption()
        .for_storage_encryption()
        // Mail is transport: a key flagged for it wins over a storage-only one.
        .max_by_key(|ka| {
            let transport = ka.key_flags().is_some_and(|f| f.for_transport_encryption());
            (transport, ka.key().creation_time())
        })
        .ok_or_else(|| no_key("has no valid encryption subkey".into()))?;
    let packets: Vec<Packet> = vec![
        vc.primary_key().key().clone().into(),
        userid.userid().clone().into(),
        userid.binding_signature().clone().into(),
        subkey.key().clone().into(),
        subkey.binding_signature().clone().into(),
    ];
    Cert::from_packets(packets.into_iter())
        .map(Cert::strip_secret_key_material)
        .map_err(|e| CryptoError::Failed(format!("{e:#}")))
}

/// The Autocrypt header value for our outgoing mail, folded to follow `Autocrypt: `.
pub fn header_value(address: &str, cert: &[u8], prefer: PreferEncrypt) -> Result<String> {
    let addr = address.trim().to_lowercase();
    let minimal = minimal_cert(&read_cert(cert)?, &addr)?;
    let keydata = base64_encode(
        &minimal
            .to_vec()
            .map_err(|e| CryptoError::Failed(format!("{e:#}")))?,
    );

    let mut value = format!("addr={addr};");
    let mut width = "Autocrypt: ".len() + value.len();
    let mut pieces = Vec::new();
    if prefer == PreferEncrypt::Mutual {
        pieces.push(" prefer-encrypt=mutual;");
    }
    pieces.push(" keydata=");
    for piece in pieces {
        if width + piece.len() > LINE {
            value.push_str("\r\n");
            width = 0;
        }
        value.push_str(piece);
        width += piece.len();
    }
    // A fold before each line of key data, one space and 76 characters wide.
    for chunk in keydata.as_bytes().chunks(LINE - 2) {
        value.push_str("\r\n ");
        value.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
    }
    Ok(value)
}

/// The sender's Autocrypt header of a message (§2.3): the one valid `Autocrypt` header
/// whose `addr` is the From address; none when there is none or more than one.
pub fn from_message(headers: &[u8], from_address: &str) -> Option<Header> {
    let from = from_address.trim().to_lowercase();
    let mut matching = message::field_values(headers, "Autocrypt")
        .into_iter()
        .filter_map(|v| parse(&v).ok())
        .filter(|h| h.addr == from);
    let first = matching.next()?;
    matching.next().is_none().then_some(first)
}

/// The valid Autocrypt-Gossip headers of a decrypted inner entity's header block.
pub fn gossip(headers: &[u8]) -> Vec<Header> {
    message::field_values(headers, "Autocrypt-Gossip")
        .into_iter()
        .filter_map(|v| parse(&v).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openpgp;
    use pgp::parse::Parse;

    fn keydata_of(address: &str) -> (crate::KeyPair, String) {
        let k = openpgp::generate(address, None, None).unwrap();
        let b64 = base64_encode(&k.public);
        (k, b64)
    }

    #[test]
    fn parse_table() {
        let (k, kd) = keydata_of("alice@example.test");
        let folded: String = kd
            .as_bytes()
            .chunks(60)
            .map(|c| format!(" {}\r\n", std::str::from_utf8(c).unwrap()))
            .collect();
        let cases: Vec<(String, Option<(&str, PreferEncrypt)>)> = vec![
            (
                format!("addr=alice@example.test; keydata={kd}"),
                Some(("alice@example.test", PreferEncrypt::NoPreference)),
            ),
            (
                format!("addr=Alice@Example.TEST; prefer-encrypt=mutual; keydata={folded}"),
                Some(("alice@example.test", PreferEncrypt::Mutual)),
            ),
            (
                format!(
                    "type=1; addr=alice@example.test; prefer-encrypt=nopreference; keydata={kd};"
                ),
                Some(("alice@example.test", PreferEncrypt::NoPreference)),
            ),
            (
                format!("addr=alice@example.test; prefer-encrypt=sometimes; keydata={kd}"),
                Some(("alice@example.test", PreferEncrypt::NoPreference)),
            ),
            (
                format!("addr=alice@example.test; _note=hi; keydata={kd}"),
                Some(("alice@example.test", PreferEncrypt::NoPreference)),
            ),
            (format!("keydata={kd}"), None),
            ("addr=alice@example.test".to_owned(), None),
            (
                format!("addr=alice@example.test; colour=blue; keydata={kd}"),
                None,
            ),
            (
                format!("addr=alice@example.test; type=2; keydata={kd}"),
                None,
            ),
            (format!("addr=alice@example.test; keydata=!!{kd}"), None),
            ("addr=alice@example.test; keydata=aGVsbG8=".to_owned(), None),
            (
                format!("addr=alice@example.test; addr=eve@example.test; keydata={kd}"),
                None,
            ),
            (format!("addr=; keydata={kd}"), None),
            (format!("addr alice@example.test; keydata={kd}"), None),
        ];
        for (value, want) in cases {
            match (parse(&value), want) {
                (Ok(h), Some((addr, prefer))) => {
                    assert_eq!(h.addr, addr, "{value}");
                    assert_eq!(h.prefer_encrypt, prefer, "{value}");
                    assert_eq!(h.keydata, k.public, "{value}");
                }
                (Err(CryptoError::Malformed { .. }), None) => {}
                (got, want) => panic!("{value:?}: got {got:?}, want {want:?}"),
            }
        }
        // Secret parts in keydata are dropped.
        let leaked = parse(&format!(
            "addr=alice@example.test; keydata={}",
            base64_encode(&k.secret)
        ))
        .unwrap();
        assert_eq!(leaked.keydata, k.public);
    }

    #[test]
    fn header_value_is_folded_minimal_and_parses_back() {
        let (cert, _) = CertBuilder::new()
            .set_cipher_suite(CipherSuite::Cv25519)
            .add_userid("Alice <alice@example.test>")
            .add_userid("Alice <alice@work.example>")
            .add_signing_subkey()
            .add_transport_encryption_subkey()
            .add_storage_encryption_subkey()
            .generate()
            .unwrap();
        let tsk = cert.as_tsk().to_vec().unwrap();
        let value = header_value("Alice@Example.test", &tsk, PreferEncrypt::Mutual).unwrap();
        assert!(
            value.starts_with("addr=alice@example.test; prefer-encrypt=mutual; keydata=\r\n "),
            "{value}"
        );
        let field = format!("Autocrypt: {value}\r\n");
        for line in field.split("\r\n").filter(|l| !l.is_empty()) {
            assert!(line.len() <= LINE, "{} characters: {line}", line.len());
        }
        assert!(
            field
                .split("\r\n")
                .skip(1)
                .all(|l| l.is_empty() || l.starts_with(' '))
        );
        let unfolded = message::field_values(field.as_bytes(), "Autocrypt").remove(0);
        let h = parse(&unfolded).unwrap();
        assert_eq!(h.addr, "alice@example.test");
        assert_eq!(h.prefer_encrypt, PreferEncrypt::Mutual);

        let minimal = Cert::from_bytes(&h.keydata).unwrap();
        assert_eq!(minimal.fingerprint(), cert.fingerprint());
        assert!(!minimal.is_tsk());
        assert_eq!(minimal.userids().count(), 1);
        assert_eq!(
            minimal.userids().next().unwrap().userid().value(),
            b"Alice <alice@example.test>"
        );
        assert_eq!(minimal.keys().subkeys().count(), 1);
        let p = policy();
        let vc = minimal.with_policy(&p, None).unwrap();
        assert_eq!(vc.keys().subkeys().for_transport_encryption().count(), 1);
        let info = openpgp::inspect(&h.keydata).unwrap().remove(0);
        assert!(info.can_encrypt);
        assert_eq!(info.addresses, ["alice@example.test"]);

        let plain = header_value("alice@example.test", &tsk, PreferEncrypt::NoPreference).unwrap();
        assert!(plain.starts_with("addr=alice@example.test; keydata=\r\n "));
        assert_eq!(
            parse(&plain).unwrap().prefer_encrypt,
            PreferEncrypt::NoPreference
        );

        assert!(matches!(
            header_value("bob@example.test", &tsk, PreferEncrypt::Mutual),
            Err(CryptoError::NoKey(_))
        ));
    }

    #[test]
    fn the_sender_header_must_be_unique() {
        let (a, _) = keydata_of("alice@example.test");
        let (b, _) = keydata_of("bob@example.test");
        let va = header_value("alice@example.test", &a.public, PreferEncrypt::Mutual).unwrap();
        let va2 = header_value("alice@example.test", &b.public, PreferEncrypt::Mutual);
        assert!(va2.is_err(), "bob's key has no user ID for alice");
        let vb = header_value("bob@example.test", &b.public, PreferEncrypt::NoPreference).unwrap();
        let one = format!(
            "From: alice@example.test\r\nAutocrypt: {va}\r\nAutocrypt: {vb}\r\nAutocrypt: addr=alice@example.test; keydata=AAAA\r\n"
        );
        let h = from_message(one.as_bytes(), "alice@example.test").unwrap();
        assert_eq!(h.addr, "alice@example.test");
        assert_eq!(
            openpgp::inspect(&h.keydata).unwrap()[0].fingerprint,
            a.info.fingerprint
        );
        assert_eq!(from_message(one.as_bytes(), "carol@example.test"), None);

        let forged = format!(
            "addr=alice@example.test; keydata={}",
            base64_encode(&b.public)
        );
        let two = format!("{one}Autocrypt: {forged}\r\n");
        assert_eq!(from_message(two.as_bytes(), "alice@example.test"), None);
        assert!(from_message(two.as_bytes(), "bob@example.test").is_some());
    }

    #[test]
    fn gossip_headers_are_read_and_invalid_ones_skipped() {
        let (a, _) = keydata_of("alice@example.test");
        let (b, _) = keydata_of("bob@example.test");
        let ga =
            header_value("alice@example.test", &a.public, PreferEncrypt::NoPreference).unwrap();
        let gb = header_value("bob@example.test", &b.public, PreferEncrypt::NoPreference).unwrap();
        let h = format!(
            "Content-Type: text/plain\r\nAutocrypt-Gossip: {ga}\r\nAutocrypt-Gossip: addr=x@y; bad=1; keydata=AAAA\r\nautocrypt-gossip: {gb}\r\nAutocrypt: {ga}\r\n"
        );
        let g = gossip(h.as_bytes());
        assert_eq!(
            g.iter().map(|h| h.addr.as_str()).collect::<Vec<_>>(),
            ["alice@example.test", "bob@example.test"]
        );
        assert!(gossip(b"Content-Type: text/plain\r\n").is_empty());
    }
}
