//! S/MIME interoperability with the `openssl` command (OpenSSL 3): what `pepsi_crypto::smime`
//! encrypts and signs, openssl decrypts and verifies, and the other way round. A test CA
//! and a CA-issued certificate for alice are made with openssl itself, so both sides are
//! checked against certificates neither produced for the other.
//!
//! The openssl command is required: without it these tests fail, they never skip.

use std::path::Path;
use std::process::Command;

use pepsi_contract::message;
use pepsi_crypto::smime;
use pepsi_crypto::{KeyPair, SigStatus, Verification, mime};
use pepsi_testkit::pki::{self, openssl};

const HEADERS: &[u8] = b"From: alice@example.test\r\nTo: bob@example.test\r\nSubject: plans\r\n\
    MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
    Content-Transfer-Encoding: 8bit\r\n";
const BODY: &[u8] = b"Meet at noon.\r\nBring the keys.\r\n";
const ENTITY: &[u8] =
    b"Content-Type: text/plain; charset=utf-8\r\n\r\nHello Bob,\r\nthe plan stands.\r\n";

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::write(dir.join(name), data).unwrap();
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// A message openssl wrote (LF line ends) as the server stores it: CRLF, split.
fn stored(raw: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let raw = mime::to_crlf(raw);
    let (h, b) = message::split(&raw);
    (h.to_vec(), b.to_vec())
}

/// ca.pem/ca.key: a test CA; alice.pem/alice.key: alice@example.test issued by it (SAN
/// email, emailProtection); alice.p12: her certificate, key and the CA, password
/// "alice-pw".
fn make_ca_and_alice(dir: &Path) {
    pki::issue(
        dir,
        "alice",
        "/CN=Alice/emailAddress=alice@example.test",
        "subjectAltName=email:alice@example.test\n\
         extendedKeyUsage=emailProtection\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n\
         basicConstraints=CA:FALSE\n",
    );
    openssl(
        dir,
        &[
            "pkcs12",
            "-export",
            "-in",
            "alice.pem",
            "-inkey",
            "alice.key",
            "-certfile",
            "ca.pem",
            "-name",
            "alice",
            "-passout",
            "pass:alice-pw",
            "-out",
            "alice.p12",
        ],
    );
}

fn der_of(dir: &Path, pem_file: &str) -> Vec<u8> {
    let mut certs = smime::certificates(&read(dir, pem_file)).unwrap();
    assert_eq!(certs.len(), 1, "{pem_file}");
    certs.remove(0)
}

fn alice_from_p12(dir: &Path) -> KeyPair {
    let alice = smime::import(&read(dir, "alice.p12"), Some("alice-pw")).unwrap();
    assert_eq!(alice.info.addresses, ["alice@example.test"]);
    assert!(alice.info.has_secret && alice.info.can_sign && alice.info.can_encrypt);
    assert_eq!(
        smime::certificates(&alice.public).unwrap(),
        [der_of(dir, "alice.pem"), der_of(dir, "ca.pem")]
    );
    alice
}

/// bob.pem/bob.key: an identity made here, written out for openssl.
fn bob(dir: &Path) -> KeyPair {
    let bob = smime::generate_self_signed("bob@example.test", 30).unwrap();
    write(
        dir,
        "bob.pem",
        smime::certificates_pem(&bob.public).unwrap().as_bytes(),
    );
    write(
        dir,
        "bob.key",
        smime::key_pem(&bob.secret).unwrap().as_bytes(),
    );
    bob
}

fn lf(data: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(data)
        .replace("\r\n", "\n")
        .into_bytes()
}

#[test]
fn openssl_decrypts_and_verifies_what_we_encrypt_and_sign() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca_and_alice(dir);
    let alice = alice_from_p12(dir);
    let bob = bob(dir);

    let p = smime::encrypt(
        HEADERS,
        BODY,
        &[&bob.public],
        Some((&alice.public, &alice.secret)),
    )
    .unwrap();
    write(dir, "message.eml", &message::join(&p.headers, &p.body));

    for (tool, out) in [
        ("cms", "decrypted-cms.eml"),
        ("smime", "decrypted-smime.eml"),
    ] {
        openssl(
            dir,
            &[
                tool,
                "-decrypt",
                "-in",
                "message.eml",
                "-recip",
                "bob.pem",
                "-inkey",
                "bob.key",
                "-out",
                out,
            ],
        );
    }
    let decrypted = read(dir, "decrypted-cms.eml");
    assert_eq!(decrypted, read(dir, "decrypted-smime.eml"));
    assert!(
        decrypted.starts_with(
            b"Content-Type: multipart/signed; protocol=\"application/pkcs7-signature\""
        ),
        "{}",
        String::from_utf8_lossy(&decrypted)
    );

    let verified = openssl(
        dir,
        &[
            "cms",
            "-verify",
            "-in",
            "decrypted-cms.eml",
            "-CAfile",
            "ca.pem",
            "-out",
            "content.eml",
        ],
    );
    let said = String::from_utf8_lossy(&verified.stderr);
    assert!(said.contains("Verification successful"), "{said}");
    assert_eq!(
        lf(&read(dir, "content.eml")),
        lf(&mime::inner_entity(HEADERS, BODY))
    );

    // A CA openssl does not know: the signature still verifies, the chain does not.
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "1",
            "-subj",
            "/CN=Other CA",
        ],
    );
    let refused = Command::new("openssl")
        .args([
            "cms",
            "-verify",
            "-in",
            "decrypted-cms.eml",
            "-CAfile",
            "other.pem",
            "-out",
            "x",
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

#[test]
fn openssl_verifies_our_signature() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca_and_alice(dir);
    let alice = alice_from_p12(dir);

    let s = smime::sign(HEADERS, BODY, &alice.public, &alice.secret).unwrap();
    write(dir, "signed.eml", &message::join(&s.headers, &s.body));
    let verified = openssl(
        dir,
        &[
            "smime",
            "-verify",
            "-in",
            "signed.eml",
            "-CAfile",
            "ca.pem",
            "-out",
            "content.eml",
        ],
    );
    let said = String::from_utf8_lossy(&verified.stderr);
    assert!(said.contains("Verification successful"), "{said}");
    assert_eq!(
        lf(&read(dir, "content.eml")),
        lf(&mime::inner_entity(HEADERS, BODY))
    );

    // Our own reading agrees, and a changed byte is caught by openssl too.
    let ca = der_of(dir, "ca.pem");
    assert_eq!(
        smime::verify(&s.headers, &s.body, &[&ca]).unwrap().status,
        SigStatus::Good
    );
    let altered = String::from_utf8(s.body.clone())
        .unwrap()
        .replacen("noon", "nine", 1);
    write(
        dir,
        "altered.eml",
        &message::join(&s.headers, altered.as_bytes()),
    );
    let refused = Command::new("openssl")
        .args([
            "smime",
            "-verify",
            "-in",
            "altered.eml",
            "-CAfile",
            "ca.pem",
            "-out",
            "x",
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

#[test]
fn we_decrypt_what_openssl_encrypts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca_and_alice(dir);
    let alice = alice_from_p12(dir);
    let bob = bob(dir);
    let ca = der_of(dir, "ca.pem");
    write(dir, "entity.eml", ENTITY);

    // Unsigned, to both our generated identity (bob) and the imported one (alice).
    openssl(
        dir,
        &[
            "smime",
            "-encrypt",
            "-aes256",
            "-in",
            "entity.eml",
            "-to",
            "bob@example.test",
            "-from",
            "alice@example.test",
            "-subject",
            "Plans",
            "-out",
            "encrypted.eml",
            "bob.pem",
            "alice.pem",
        ],
    );
    let (h, b) = stored(&read(dir, "encrypted.eml"));
    assert!(smime::is_encrypted(&h));
    for id in [&bob, &alice] {
        let d = smime::decrypt(&h, &b, &[(&id.public, &id.secret)], &[&ca]).unwrap();
        assert_eq!(d.decrypted_with, id.info.fingerprint);
        assert_eq!(d.verification, Verification::unsigned());
        assert_eq!(d.body, b"Hello Bob,\r\nthe plan stands.\r\n");
        let headers = String::from_utf8(d.headers).unwrap();
        assert!(headers.contains("Subject: Plans\r\n"), "{headers}");
        assert!(
            headers.contains("From: alice@example.test\r\n"),
            "{headers}"
        );
        assert!(
            headers.contains("Content-Type: text/plain; charset=utf-8\r\n"),
            "{headers}"
        );
        assert!(!headers.contains("pkcs7"), "{headers}");
    }

    // Signed by alice (CA-issued), then enveloped for bob.
    openssl(
        dir,
        &[
            "cms",
            "-sign",
            "-in",
            "entity.eml",
            "-signer",
            "alice.pem",
            "-inkey",
            "alice.key",
            "-certfile",
            "ca.pem",
            "-out",
            "signed.eml",
        ],
    );
    openssl(
        dir,
        &[
            "cms",
            "-encrypt",
            "-aes256",
            "-in",
            "signed.eml",
            "-to",
            "bob@example.test",
            "-from",
            "alice@example.test",
            "-subject",
            "Signed plans",
            "-out",
            "signed-encrypted.eml",
            "bob.pem",
        ],
    );
    let (h, b) = stored(&read(dir, "signed-encrypted.eml"));
    let bob_id: (&[u8], &[u8]) = (&bob.public, &bob.secret);
    let d = smime::decrypt(&h, &b, &[bob_id], &[&ca]).unwrap();
    assert_eq!(
        d.verification.status,
        SigStatus::Good,
        "{:?}",
        d.verification
    );
    assert_eq!(
        d.verification.signer.as_deref(),
        Some(&*alice.info.fingerprint)
    );
    assert_eq!(d.verification.signer_addresses, ["alice@example.test"]);
    assert_eq!(d.body, b"Hello Bob,\r\nthe plan stands.\r\n");
    let headers = String::from_utf8(d.headers).unwrap();
    assert!(headers.contains("Subject: Signed plans\r\n"), "{headers}");
    assert!(
        headers.contains("Content-Type: text/plain; charset=utf-8\r\n"),
        "{headers}"
    );

    let d = smime::decrypt(&h, &b, &[bob_id], &[]).unwrap();
    assert!(
        matches!(d.verification.status, SigStatus::Unverified(_)),
        "{:?}",
        d.verification
    );
    assert_eq!(
        d.verification.signer.as_deref(),
        Some(&*alice.info.fingerprint)
    );
    assert_eq!(d.body, b"Hello Bob,\r\nthe plan stands.\r\n");

    // Opaque signed-data inside the envelope reads the same.
    openssl(
        dir,
        &[
            "smime",
            "-sign",
            "-nodetach",
            "-in",
            "entity.eml",
            "-signer",
            "alice.pem",
            "-inkey",
            "alice.key",
            "-out",
            "opaque.eml",
        ],
    );
    openssl(
        dir,
        &[
            "smime",
            "-encrypt",
            "-aes256",
            "-in",
            "opaque.eml",
            "-out",
            "opaque-encrypted.eml",
            "bob.pem",
        ],
    );
    let (h, b) = stored(&read(dir, "opaque-encrypted.eml"));
    let d = smime::decrypt(&h, &b, &[bob_id], &[&ca]).unwrap();
    assert_eq!(
        d.verification.status,
        SigStatus::Good,
        "{:?}",
        d.verification
    );
    assert_eq!(d.body, b"Hello Bob,\r\nthe plan stands.\r\n");

    // Not for this identity.
    let carol = smime::generate_self_signed("carol@example.test", 1).unwrap();
    assert!(matches!(
        smime::decrypt(&h, &b, &[(&carol.public, &carol.secret)], &[&ca]),
        Err(pepsi_crypto::CryptoError::NoKey(_))
    ));
}

#[test]
fn we_verify_what_openssl_signs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca_and_alice(dir);
    let ca = der_of(dir, "ca.pem");
    let alice_cert = der_of(dir, "alice.pem");
    write(dir, "entity.eml", ENTITY);

    openssl(
        dir,
        &[
            "smime",
            "-sign",
            "-in",
            "entity.eml",
            "-signer",
            "alice.pem",
            "-inkey",
            "alice.key",
            "-to",
            "bob@example.test",
            "-from",
            "alice@example.test",
            "-subject",
            "Plans",
            "-out",
            "signed.eml",
        ],
    );
    let (h, b) = stored(&read(dir, "signed.eml"));
    assert!(String::from_utf8_lossy(&h).contains("multipart/signed"));
    let v = smime::verify(&h, &b, &[&ca]).unwrap();
    assert_eq!(v.status, SigStatus::Good, "{v:?}");
    assert_eq!(v.signer_addresses, ["alice@example.test"]);
    assert_eq!(
        smime::signer_certificates(&h, &b).unwrap(),
        std::slice::from_ref(&alice_cert)
    );
    let v = smime::verify(&h, &b, &[]).unwrap();
    assert!(matches!(v.status, SigStatus::Unverified(_)), "{v:?}");

    let altered = String::from_utf8(b.clone())
        .unwrap()
        .replacen("stands", "is off", 1);
    let v = smime::verify(&h, altered.as_bytes(), &[&ca]).unwrap();
    assert!(matches!(v.status, SigStatus::Bad(_)), "{v:?}");

    // Opaque signed-data, with the CA carried in the signature.
    openssl(
        dir,
        &[
            "smime",
            "-sign",
            "-nodetach",
            "-in",
            "entity.eml",
            "-signer",
            "alice.pem",
            "-inkey",
            "alice.key",
            "-certfile",
            "ca.pem",
            "-out",
            "opaque.eml",
        ],
    );
    let (h, b) = stored(&read(dir, "opaque.eml"));
    assert_eq!(
        smime::verify(&h, &b, &[&ca]).unwrap().status,
        SigStatus::Good
    );
    assert_eq!(
        smime::signer_certificates(&h, &b).unwrap(),
        [alice_cert, ca]
    );
}

#[test]
fn legacy_pkcs12_imports() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_ca_and_alice(dir);
    // RC2-40 and 3DES, as older Windows and macOS export.
    openssl(
        dir,
        &[
            "pkcs12",
            "-export",
            "-legacy",
            "-in",
            "alice.pem",
            "-inkey",
            "alice.key",
            "-passout",
            "pass:old",
            "-out",
            "legacy.p12",
        ],
    );
    let kp = smime::import(&read(dir, "legacy.p12"), Some("old")).unwrap();
    assert_eq!(kp.public, der_of(dir, "alice.pem"));
    assert_eq!(kp.info.addresses, ["alice@example.test"]);
}
