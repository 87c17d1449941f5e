//! Interop of `pepsi_crypto::openpgp` with the real GnuPG (2.2, `/usr/bin/gpg`), both ways:
//! what we encrypt and sign gpg decrypts and verifies, and what gpg encrypts and signs we
//! decrypt and verify. Each test runs gpg in a fresh GNUPGHOME of its own; a missing gpg
//! fails the tests, it does not skip them.

use std::path::Path;
use std::process::{Command, Output};

use pepsi_crypto::{SigStatus, mime, openpgp};
use pepsi_testkit::gpg::{GPG, Gpg};

const HEADERS: &[u8] = b"From: Alice <alice@example.test>\r\nTo: Bob <bob@example.test>\r\n\
    Subject: interop\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
    Content-Transfer-Encoding: 8bit\r\n";
const BODY: &[u8] = "Hello Bob,\r\n\r\nthis went through GnuPG \u{2013} both ways.\r\n".as_bytes();

fn status(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_status(status: &str, word: &str, containing: &str) {
    let prefix = format!("[GNUPG:] {word}");
    assert!(
        status.lines().any(|l| {
            let rest = l.strip_prefix(&prefix);
            rest.is_some_and(|r| (r.is_empty() || r.starts_with(' ')) && r.contains(containing))
        }),
        "no {word} naming {containing:?} in gpg's status:\n{status}"
    );
}

/// The parts of a multipart message, each split into its header block and body.
fn parts(headers: &[u8], body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let ct = mime::content_type(headers).expect("a Content-Type");
    let boundary = ct.param("boundary").expect("a boundary");
    mime::multipart_parts(body, boundary)
        .unwrap()
        .into_iter()
        .map(|p| {
            let (h, b) = pepsi_contract::message::split(p);
            (h.to_vec(), b.to_vec())
        })
        .collect()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn gpg_decrypts_and_verifies_what_we_encrypt_and_sign() {
    let gpg = Gpg::new();
    let alice = openpgp::generate("alice@example.test", Some("Alice"), None).unwrap();
    let bob = openpgp::generate("bob@example.test", Some("Bob"), Some(3600 * 24 * 30)).unwrap();
    gpg.import("bob.key", openpgp::armor(&bob.secret).unwrap().as_bytes());
    gpg.import("alice.pub", &alice.public);

    let sealed = openpgp::encrypt(HEADERS, BODY, &[&bob.public], Some(&alice.secret)).unwrap();
    let parts = parts(&sealed.headers, &sealed.body);
    assert_eq!(parts.len(), 2);
    assert!(parts[1].1.starts_with(b"-----BEGIN PGP MESSAGE-----\r\n"));
    let msg = gpg.write("msg.asc", &parts[1].1);
    let out_path = gpg.path("plain");
    let out = gpg.run(&["--output", path_str(&out_path), "--decrypt", path_str(&msg)]);
    let st = status(&out);
    assert_status(&st, "DECRYPTION_OKAY", "");
    assert_status(&st, "GOODMDC", "");
    assert_status(&st, "GOODSIG", &alice.info.fingerprint[24..]);
    assert_status(&st, "VALIDSIG", &alice.info.fingerprint);
    assert_eq!(
        std::fs::read(&out_path).unwrap(),
        mime::inner_entity(HEADERS, BODY)
    );
}

#[test]
fn we_decrypt_and_verify_what_gpg_encrypts_and_signs() {
    let gpg = Gpg::new();
    let bob_fpr = gpg.generate("Bob <bob@example.test>", true);
    let bob_public = gpg.export("--export", "bob@example.test");
    let bob_secret = gpg.export("--export-secret-keys", "bob@example.test");
    let info = &openpgp::inspect(&bob_secret).unwrap()[0];
    assert_eq!(info.fingerprint, bob_fpr);
    assert!(info.has_secret && info.can_encrypt && info.can_sign);
    // One of ours as a second recipient: gpg encrypts to our key as well.
    let carol = openpgp::generate("carol@example.test", None, None).unwrap();
    gpg.import("carol.pub", &carol.public);

    let entity = b"Content-Type: text/plain; charset=us-ascii\r\n\r\nFrom GnuPG, signed.\r\n";
    let file = gpg.write("entity", entity);
    let armored_path = gpg.path("entity.asc");
    gpg.run(&[
        "--encrypt",
        "--sign",
        "--armor",
        "--local-user",
        &bob_fpr,
        "-r",
        "bob@example.test",
        "-r",
        "carol@example.test",
        "--output",
        path_str(&armored_path),
        path_str(&file),
    ]);
    let armored = mime::to_crlf(&std::fs::read(&armored_path).unwrap());

    let headers =
        b"From: Bob <bob@example.test>\r\nTo: carol@example.test\r\nSubject: from gpg\r\n\
        MIME-Version: 1.0\r\nContent-Type: multipart/encrypted;\r\n \
        protocol=\"application/pgp-encrypted\"; boundary=\"gpg-b\"\r\n";
    let mut body = b"--gpg-b\r\nContent-Type: application/pgp-encrypted\r\n\r\nVersion: 1\r\n\r\n\
        --gpg-b\r\nContent-Type: application/octet-stream\r\n\r\n"
        .to_vec();
    body.extend_from_slice(&armored);
    body.extend_from_slice(b"\r\n--gpg-b--\r\n");
    assert!(openpgp::is_encrypted(headers));

    let opened = openpgp::decrypt(headers, &body, &[&bob_secret], &[&bob_public]).unwrap();
    assert_eq!(opened.decrypted_with, bob_fpr);
    assert_eq!(opened.verification.status, SigStatus::Good);
    assert_eq!(
        opened.verification.signer.as_deref(),
        Some(bob_fpr.as_str())
    );
    assert_eq!(opened.verification.signer_addresses, ["bob@example.test"]);
    assert_eq!(opened.body, b"From GnuPG, signed.\r\n");
    assert_eq!(
        opened.headers,
        b"From: Bob <bob@example.test>\r\nTo: carol@example.test\r\nSubject: from gpg\r\n\
          MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n"
    );

    let ours = openpgp::decrypt(headers, &body, &[&carol.secret], &[]).unwrap();
    assert_eq!(ours.decrypted_with, carol.info.fingerprint);
    assert_eq!(
        ours.verification.status,
        SigStatus::Unverified(bob_fpr.clone())
    );
    assert_eq!(ours.body, opened.body);
}

#[test]
fn gpg_verifies_our_detached_signature() {
    let gpg = Gpg::new();
    let alice = openpgp::generate("alice@example.test", Some("Alice"), None).unwrap();
    gpg.import("alice.pub", &alice.public);

    let signed = openpgp::sign(HEADERS, BODY, &alice.secret).unwrap();
    let parts = {
        let ct = mime::content_type(&signed.headers).unwrap();
        let raw = mime::multipart_parts(&signed.body, ct.param("boundary").unwrap()).unwrap();
        raw.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
    };
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0], mime::inner_entity(HEADERS, BODY));
    let (sig_headers, sig) = pepsi_contract::message::split(&parts[1]);
    assert!(String::from_utf8_lossy(sig_headers).contains("application/pgp-signature"));

    let entity = gpg.write("entity", &parts[0]);
    let sig = gpg.write("entity.asc", sig);
    let out = gpg.run(&["--verify", path_str(&sig), path_str(&entity)]);
    let st = status(&out);
    assert_status(&st, "GOODSIG", &alice.info.fingerprint[24..]);
    assert_status(&st, "VALIDSIG", &alice.info.fingerprint);

    // The same signature over one changed byte is refused by gpg too.
    let mut altered = parts[0].clone();
    let last = altered.len() - 3;
    altered[last] ^= 0x20;
    let altered = gpg.write("altered", &altered);
    let refused = Command::new(GPG)
        .arg("--homedir")
        .arg(gpg.home.path())
        .args(["--batch", "--status-fd", "1", "--verify"])
        .arg(&sig)
        .arg(&altered)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert_status(&status(&refused), "BADSIG", &alice.info.fingerprint[24..]);
}

#[test]
fn we_verify_a_gpg_detached_signature() {
    let gpg = Gpg::new();
    let dave_fpr = gpg.generate("Dave <dave@example.test>", false);
    let dave_public = gpg.export("--export", "dave@example.test");

    let entity = b"Content-Type: text/plain; charset=us-ascii\r\n\r\nSigned by GnuPG.\r\n";
    let file = gpg.write("entity", entity);
    let sig_path = gpg.path("entity.asc");
    gpg.run(&[
        "--detach-sign",
        "--armor",
        "--digest-algo",
        "SHA256",
        "--output",
        path_str(&sig_path),
        path_str(&file),
    ]);
    let sig = mime::to_crlf(&std::fs::read(&sig_path).unwrap());

    let headers =
        b"From: Dave <dave@example.test>\r\nSubject: signed by gpg\r\nMIME-Version: 1.0\r\n\
        Content-Type: multipart/signed; micalg=pgp-sha256;\r\n \
        protocol=\"application/pgp-signature\"; boundary=\"sig-b\"\r\n";
    let build = |entity: &[u8]| {
        let mut body = b"--sig-b\r\n".to_vec();
        body.extend_from_slice(entity);
        body.extend_from_slice(
            b"\r\n--sig-b\r\nContent-Type: application/pgp-signature; name=\"signature.asc\"\r\n\r\n",
        );
        body.extend_from_slice(&sig);
        body.extend_from_slice(b"\r\n--sig-b--\r\n");
        body
    };

    let v = openpgp::verify(headers, &build(entity), &[&dave_public]).unwrap();
    assert_eq!(v.status, SigStatus::Good);
    assert_eq!(v.signer.as_deref(), Some(dave_fpr.as_str()));
    assert_eq!(v.signer_addresses, ["dave@example.test"]);

    let v = openpgp::verify(headers, &build(entity), &[]).unwrap();
    assert_eq!(v.status, SigStatus::Unverified(dave_fpr.clone()));

    let mut altered = entity.to_vec();
    let at = altered.len() - 4;
    altered[at] = b'X';
    let v = openpgp::verify(headers, &build(&altered), &[&dave_public]).unwrap();
    assert!(matches!(v.status, SigStatus::Bad(_)), "{v:?}");
}

/// Guards against a compression bomb: a small message that decompresses far beyond its size
/// is refused, not read into memory.
#[test]
fn a_message_that_decompresses_without_bound_is_refused() {
    let gpg = Gpg::new();
    let carol = openpgp::generate("carol@example.test", None, None).unwrap();
    gpg.import("carol.pub", &carol.public);
    // 64 MiB of one byte, which zlib shrinks to about 64 KiB.
    let mut entity = b"Content-Type: text/plain\r\n\r\n".to_vec();
    entity.resize(64 << 20, b'a');
    let file = gpg.write("big", &entity);
    let armored_path = gpg.path("big.asc");
    gpg.run(&[
        "--encrypt",
        "--armor",
        "--compress-algo",
        "zlib",
        "--compress-level",
        "9",
        "-r",
        "carol@example.test",
        "--output",
        path_str(&armored_path),
        path_str(&file),
    ]);
    let armored = mime::to_crlf(&std::fs::read(&armored_path).unwrap());
    assert!(
        armored.len() < 1 << 20,
        "gpg compressed it: {}",
        armored.len()
    );
    let headers =
        b"From: x@example.test\r\nMIME-Version: 1.0\r\nContent-Type: multipart/encrypted;\r\n \
        protocol=\"application/pgp-encrypted\"; boundary=\"b\"\r\n";
    let mut body = b"--b\r\nContent-Type: application/pgp-encrypted\r\n\r\nVersion: 1\r\n\r\n\
        --b\r\nContent-Type: application/octet-stream\r\n\r\n"
        .to_vec();
    body.extend_from_slice(&armored);
    body.extend_from_slice(b"\r\n--b--\r\n");
    let refused = openpgp::decrypt(headers, &body, &[&carol.secret], &[]);
    let err = refused.expect_err("refused").to_string();
    assert!(err.contains("decompresses to more than"), "{err}");
}
