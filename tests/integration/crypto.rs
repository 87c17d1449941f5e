//! End-to-end encryption through the whole system (docs/crypto.md): keys managed with the
//! real pepsi-keys, mail encrypted and signed on the way out and read by the real GnuPG and
//! OpenSSL, mail they encrypt decrypted on the way in for an identity that opted in, the
//! parking of a message whose encryption is required until key discovery settles, and the
//! Autocrypt state learnt from inbound mail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pepsi_testkit::gpg::Gpg;
use pepsi_testkit::pki::{self, openssl};
use serde_json::Value;

use crate::support;
use crate::support::system::System;

const WAIT: Duration = Duration::from_secs(30);

fn keys_tool() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-keys", env!("CARGO_BIN_EXE_pepsi-keys"))
}

/// Runs pepsi-keys with the system's configuration; (exit code, stdout, stderr).
fn keys(sys: &System, args: &[&str]) -> (i32, String, String) {
    // The system's command logs at debug; keep what the tool says on stderr to its errors.
    let out = sys
        .command(&keys_tool())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// pepsi-keys that must succeed; its stdout.
fn keys_ok(sys: &System, args: &[&str]) -> String {
    let (code, out, err) = keys(sys, args);
    assert_eq!(code, 0, "pepsi-keys {args:?}: {out}{err}");
    out
}

/// `[crypto] KEK` (and RETIRED_KEKS) in a secrets fragment of the system, replacing the last.
fn set_kek(sys: &System, current: &str, retired: &[&str]) {
    let path = sys.dir.path().join("secrets.d/30-crypto.conf");
    let mut text = format!("[crypto]\nKEK = {current}\n");
    if !retired.is_empty() {
        text.push_str(&format!("RETIRED_KEKS = {}\n", retired.join(", ")));
    }
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

fn new_kek(sys: &System, id: &str) -> String {
    keys_ok(sys, &["kek-new", "--id", id]).trim().to_owned()
}

/// The fingerprint in pepsi-keys' `<address>: <scheme> identity <FPR>` line.
fn fingerprint_of(line: &str) -> String {
    line.split_whitespace()
        .find(|w| w.len() >= 40 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no fingerprint in {line:?}"))
        .to_owned()
}

fn text(m: &[u8]) -> String {
    String::from_utf8_lossy(m).into_owned()
}

async fn set_setting(sys: &System, address: &str, name: &str, value: Value) {
    sqlx::query(
        "INSERT INTO pepsi.settings (address, name, value) VALUES ($1, $2, $3) \
         ON CONFLICT (address, name) DO UPDATE SET value = EXCLUDED.value",
    )
    .bind(address)
    .bind(name)
    .bind(value)
    .execute(&sys.db.pool)
    .await
    .unwrap();
}

async fn set_password(sys: &System, address: &str) {
    sqlx::query("INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2)")
        .bind(address)
        .bind(pepsi_ingress::accounts::hash_password(b"pw").unwrap())
        .execute(&sys.db.pool)
        .await
        .unwrap();
}

/// A MIME message around an RFC 3156 payload.
fn pgp_message(from: &str, to: &str, subject: &str, armored: &str) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\nDate: Thu, 03 Dec 2026 10:00:00 +0000\r\n\
         Message-ID: <{subject}.{pid}@remote.test>\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/encrypted; protocol=\"application/pgp-encrypted\"; boundary=\"b1\"\r\n\
         \r\n--b1\r\nContent-Type: application/pgp-encrypted\r\n\r\nVersion: 1\r\n\r\n--b1\r\n\
         Content-Type: application/octet-stream\r\n\r\n{armored}\r\n--b1--\r\n",
        pid = std::process::id(),
        armored = armored.replace("\r\n", "\n").replace('\n', "\r\n").trim_end(),
    )
    .into_bytes()
}

fn plain(from: &str, to: &str, subject: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\nDate: Thu, 03 Dec 2026 10:00:00 +0000\r\n\
         Message-ID: <{subject}.{}@example.test>\r\n{extra}\r\n{body}",
        std::process::id()
    )
    .into_bytes()
}

/// The armored OpenPGP message inside a stored RFC 3156 message.
fn armored_payload(stored: &str) -> &str {
    const END: &str = "-----END PGP MESSAGE-----";
    let start = stored
        .find("-----BEGIN PGP MESSAGE-----")
        .expect("an armored message");
    let end = stored.find(END).expect("its end") + END.len();
    &stored[start..end]
}

/// The header field `name` of a stored message, unfolded.
fn field(message: &[u8], name: &str) -> Option<String> {
    let (headers, _) = support::system::split(message);
    let text = text(headers).replace("\r\n ", " ").replace("\r\n\t", " ");
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

async fn queue_at(sys: &System, stage: &str) -> Vec<(i64, String, Vec<String>, Value)> {
    sys.queue()
        .await
        .into_iter()
        .filter(|(_, s, _, _, _)| s == stage)
        .map(|(id, _, status, rcpt, state)| (id, status, rcpt, state))
        .collect()
}

async fn wait_parked(sys: &System, n: usize) -> Vec<(i64, String, Vec<String>, Value)> {
    let until = Instant::now() + WAIT;
    loop {
        let rows: Vec<_> = queue_at(sys, "encrypt")
            .await
            .into_iter()
            .filter(|(_, status, _, _)| status == "paused")
            .collect();
        if rows.len() >= n {
            return rows;
        }
        assert!(
            Instant::now() < until,
            "{n} rows parked at encrypt: {:#?}\n{}",
            sys.queue().await,
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What pepsi-keydisc does when it settles a request: the answer recorded, the parked rows
/// released, the dispatcher woken.
async fn settle(sys: &System, address: &str, found: bool) {
    let sql = if found {
        "UPDATE pepsi.key_request SET status = 'found', settled_at = now(), \
         methods_replied = '{\"wkd\": {\"result\": \"found\"}}' WHERE address = $1"
    } else {
        "UPDATE pepsi.key_request SET status = 'none', settled_at = now(), \
         negative_until = now() + interval '1 hour', \
         methods_replied = '{\"wkd\": {\"result\": \"none\"}}' WHERE address = $1"
    };
    sqlx::query(sql)
        .bind(address)
        .execute(&sys.db.pool)
        .await
        .unwrap();
    let n: i32 = sqlx::query_scalar("SELECT pepsi.keydisc_release($1)")
        .bind(address)
        .fetch_one(&sys.db.pool)
        .await
        .unwrap();
    assert!(n >= 1, "no row was parked for {address}");
    pepsi_contract::db::notify_workqueue(&sys.db.pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn pepsi_keys_keeps_private_keys_sealed_through_their_whole_lifecycle() {
    let sys = System::new("", &[]).await;
    let work = tempfile::tempdir().unwrap();
    let k1 = new_kek(&sys, "k1");
    assert!(k1.starts_with("k1:"), "{k1}");

    // Without a KEK nothing is sealed: a clear error, not a key stored in the clear.
    let (code, _, err) = keys(&sys, &["generate", "alice@example.test"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("[crypto] KEK is not set"), "{err}");
    // A KEK in the main file is refused: it must not sit beside what it seals.
    let mut conf = std::fs::read_to_string(&sys.config).unwrap();
    conf.push_str(&format!("\n[crypto]\nKEK = {k1}\n"));
    std::fs::write(&sys.config, &conf).unwrap();
    let (code, _, err) = keys(&sys, &["generate", "alice@example.test"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("must be set in a secrets.d fragment"), "{err}");
    std::fs::write(
        &sys.config,
        conf.replace(&format!("\n[crypto]\nKEK = {k1}\n"), ""),
    )
    .unwrap();
    set_kek(&sys, &k1, &[]);

    let out = keys_ok(&sys, &["generate", "alice@example.test", "--name", "Alice"]);
    assert!(
        out.contains("openpgp identity") && out.contains("(primary)"),
        "{out}"
    );
    let first = fingerprint_of(&out);
    let out = keys_ok(
        &sys,
        &[
            "generate",
            "alice@example.test",
            "--scheme",
            "smime",
            "--valid-days",
            "30",
        ],
    );
    assert!(
        out.contains("smime identity") && out.contains("(primary)"),
        "{out}"
    );

    // Sealed: the stored bytes are not the key, and only the crypto role reads them.
    let (sealed, kek_id): (Vec<u8>, String) = sqlx::query_as(
        "SELECT private_wrapped, kek_id FROM pepsi.crypto_identity WHERE fingerprint = $1",
    )
    .bind(&first)
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!((sealed[0], kek_id.as_str()), (1, "k1"));
    let armored_secret = keys_ok(
        &sys,
        &[
            "export",
            "alice@example.test",
            "--scheme",
            "openpgp",
            "--secret",
        ],
    );
    assert!(
        armored_secret.contains("BEGIN PGP PRIVATE KEY BLOCK"),
        "{armored_secret}"
    );
    let gpg = Gpg::new();
    gpg.import("alice.sec", armored_secret.as_bytes());
    let listing = text(
        &gpg.run(&["--with-colons", "--list-secret-keys", "alice@example.test"])
            .stdout,
    );
    assert!(
        listing.contains(&first),
        "gpg holds the exported secret key: {listing}"
    );
    let audit: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.event_log WHERE action = 'crypto.identity.export_secret'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(audit, 1, "exporting a private key is audited");

    let list: Value = serde_json::from_str(&keys_ok(&sys, &["list", "--json"])).unwrap();
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    assert!(
        rows.iter()
            .all(|r| r["primary"] == true && r["status"] == "active"),
        "{list}"
    );

    // Rotation: a new primary, the old one retired and still able to decrypt.
    let out = keys_ok(&sys, &["rotate", "alice@example.test"]);
    let second = fingerprint_of(&out);
    assert_ne!(first, second);
    let list: Value =
        serde_json::from_str(&keys_ok(&sys, &["list", "alice@example.test", "--json"])).unwrap();
    let row = |fpr: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|r| r["fingerprint"] == fpr)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            row(&first)["status"].clone(),
            row(&first)["primary"].clone()
        ),
        ("retired".into(), false.into())
    );
    assert_eq!(row(&second)["primary"], true);

    // Revocation: the OpenPGP key carries its revocation signature for publishing.
    keys_ok(&sys, &["revoke", &first, "--reason", "superseded"]);
    let public = keys_ok(&sys, &["export", &first]);
    gpg.import("revoked.asc", public.as_bytes());
    let listing = text(&gpg.run(&["--with-colons", "--list-keys", &first]).stdout);
    assert!(
        listing.lines().any(|l| l.starts_with("pub:r:")),
        "gpg sees it revoked: {listing}"
    );

    // Purge: the private half is gone for good; the primary cannot be purged.
    let (code, _, err) = keys(&sys, &["purge", &second]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("primary identity"), "{err}");
    keys_ok(&sys, &["purge", &first]);
    let gone: Option<Vec<u8>> = sqlx::query_scalar(
        "SELECT private_wrapped FROM pepsi.crypto_identity WHERE fingerprint = $1",
    )
    .bind(&first)
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(gone, None);

    // KEK rotation: re-sealed under the new key, readable with it alone afterwards.
    let k2 = new_kek(&sys, "k2");
    set_kek(&sys, &k2, &[&k1]);
    let out = keys_ok(&sys, &["rewrap"]);
    assert!(
        out.starts_with("2 private key(s) re-sealed under k2"),
        "{out}"
    );
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT kek_id FROM pepsi.crypto_identity WHERE kek_id IS NOT NULL",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(ids, ["k2"]);
    set_kek(&sys, &k2, &[]);
    keys_ok(&sys, &["export", &second, "--secret"]);
    set_kek(&sys, &k1, &[]);
    let (code, _, err) = keys(&sys, &["export", &second, "--secret"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("\"k2\"") && err.contains("do not hold"),
        "{err}"
    );
    set_kek(&sys, &k2, &[]);

    // Bad input: the tool says what was wrong and exits 2.
    let foreign = gpg.generate("Mallory <mallory@example.test>", true);
    let mallory = gpg.export("--export-secret-keys", &foreign);
    std::fs::write(work.path().join("mallory.sec"), &mallory).unwrap();
    let mallory_path = work.path().join("mallory.sec");
    let (code, _, err) = keys(
        &sys,
        &["import", "bob@example.test", mallory_path.to_str().unwrap()],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("names mallory@example.test, not bob@example.test"),
        "{err}"
    );
    let (code, _, err) = keys(&sys, &["generate", "carol@elsewhere.test"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("elsewhere.test is not a local domain"),
        "{err}"
    );
    let (code, _, err) = keys(&sys, &["generate", "not-an-address"]);
    assert_eq!((code, err.contains("not an address")), (2, true), "{err}");
    let (code, _, err) = keys(&sys, &["generate", "a@example.test", "--scheme", "x509"]);
    assert_eq!((code, err.contains("x509")), (2, true), "{err}");
    // An identity made elsewhere imports.
    let out = keys_ok(
        &sys,
        &[
            "import",
            "mallory@example.test",
            mallory_path.to_str().unwrap(),
        ],
    );
    assert!(out.contains(&foreign), "{out}");

    // Peer keys and CAs.
    let public = gpg.export("--export", &foreign);
    std::fs::write(work.path().join("mallory.pub"), &public).unwrap();
    let out = keys_ok(
        &sys,
        &[
            "peer",
            "import",
            work.path().join("mallory.pub").to_str().unwrap(),
        ],
    );
    assert!(
        out.contains("mallory@example.test: openpgp key") && out.contains("(valid)"),
        "{out}"
    );
    let (code, _, err) = keys(&sys, &["peer", "import", mallory_path.to_str().unwrap()]);
    assert_eq!(code, 2, "a secret key is no peer key: {err}");
    pki::issue_email(work.path(), "dave", "dave@remote.test");
    let out = keys_ok(
        &sys,
        &[
            "ca",
            "add",
            work.path().join("ca.pem").to_str().unwrap(),
            "--note",
            "test",
        ],
    );
    assert!(out.contains("Pepsi Test CA"), "{out}");
    let out = keys_ok(
        &sys,
        &[
            "peer",
            "import",
            work.path().join("dave.pem").to_str().unwrap(),
        ],
    );
    assert!(out.contains("dave@remote.test: smime key"), "{out}");
    let cas: Value = serde_json::from_str(&keys_ok(&sys, &["ca", "list", "--json"])).unwrap();
    assert_eq!(cas[0]["note"], "test", "{cas}");
}

/// The inbound graph: decryption and Autocrypt learning before alias expansion.
const INBOUND: &str = "[stage-init]\nNEXT_STAGE = decrypt\n\n\
    [stage-decrypt]\nPROGRAM = pepsi-stage-decrypt\nNEXT_STAGE = learn\n\n\
    [stage-learn]\nPROGRAM = pepsi-stage-autocrypt-learn\nNEXT_STAGE = aliases\n";

#[tokio::test(flavor = "multi_thread")]
async fn mail_to_an_opted_in_identity_arrives_decrypted_with_its_verification() {
    let mut sys = System::new(INBOUND, &["bob", "carol"]).await;
    let work = tempfile::tempdir().unwrap();
    let kek = new_kek(&sys, "k1");
    set_kek(&sys, &kek, &[]);
    let bob_pgp = fingerprint_of(&keys_ok(&sys, &["generate", "bob@example.test"]));
    let bob_smime = fingerprint_of(&keys_ok(
        &sys,
        &["generate", "bob@example.test", "--scheme", "smime"],
    ));
    // carol has an identity too, but has not opted in.
    keys_ok(&sys, &["generate", "carol@example.test"]);
    set_setting(&sys, "bob@example.test", "decrypt", Value::Bool(true)).await;
    sys.start().await;

    // dave, outside, with GnuPG: his key is known to us, ours to him.
    let gpg = Gpg::new();
    let dave = gpg.generate("Dave <dave@remote.test>", true);
    std::fs::write(work.path().join("dave.pub"), gpg.export("--export", &dave)).unwrap();
    keys_ok(
        &sys,
        &[
            "peer",
            "import",
            work.path().join("dave.pub").to_str().unwrap(),
        ],
    );
    gpg.import(
        "bob.asc",
        keys_ok(&sys, &["export", "bob@example.test", "--scheme", "openpgp"]).as_bytes(),
    );
    gpg.import(
        "carol.asc",
        keys_ok(&sys, &["export", "carol@example.test"]).as_bytes(),
    );
    let entity = "Content-Type: text/plain; charset=utf-8\r\n\r\nmeet at the usual place\r\n";
    let plaintext = gpg.write("entity", entity.as_bytes());
    let encrypted = gpg.path("entity.asc");
    gpg.run(&[
        "--armor",
        "--encrypt",
        "--sign",
        "-u",
        &dave,
        "-r",
        "bob@example.test",
        "-r",
        "carol@example.test",
        "--output",
        encrypted.to_str().unwrap(),
        plaintext.to_str().unwrap(),
    ]);
    let armored = std::fs::read_to_string(&encrypted).unwrap();
    let message = pgp_message(
        "Dave <dave@remote.test>",
        "bob@example.test",
        "secret",
        &armored,
    );
    let reply = sys
        .send(
            "dave@remote.test",
            &["bob@example.test", "carol@example.test"],
            &message,
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bob = sys.wait_messages("bob", 1, WAIT).await;
    let got = text(&bob[0]);
    let (_, body) = support::system::split(&bob[0]);
    assert_eq!(text(body), "meet at the usual place\r\n", "{got}");
    assert_eq!(
        field(&bob[0], "Content-Type").as_deref(),
        Some("text/plain; charset=utf-8"),
        "{got}"
    );
    let result = field(&bob[0], "X-Pepsi-Decrypted").unwrap_or_default();
    assert!(
        result.starts_with(&format!("openpgp; key={bob_pgp}; signature=good")),
        "{result}"
    );
    assert!(result.contains(&dave), "the signer is named: {result}");
    // carol did not opt in: her copy stays as dave sent it.
    let carol = sys.wait_messages("carol", 1, WAIT).await;
    assert!(
        text(&carol[0]).contains("-----BEGIN PGP MESSAGE-----"),
        "{}",
        text(&carol[0])
    );
    assert_eq!(field(&carol[0], "X-Pepsi-Decrypted"), None);
    // The decrypt stage proved that dave holds bob's key.
    let proven: Vec<String> = sqlx::query_scalar(
        "SELECT fingerprint FROM pepsi.peer_has_own_key WHERE address = 'dave@remote.test'",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(proven, std::slice::from_ref(&bob_pgp));

    // A result header from outside is never believed: it is removed.
    let forged = plain(
        "dave@remote.test",
        "bob@example.test",
        "forged",
        "X-Pepsi-Decrypted: openpgp; key=X; signature=good\r\n",
        "not encrypted at all\r\n",
    );
    let reply = sys
        .send("dave@remote.test", &["bob@example.test"], &forged)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bob = sys.wait_messages("bob", 2, WAIT).await;
    let forged_copy = bob
        .iter()
        .find(|m| text(m).contains("Subject: forged"))
        .unwrap();
    assert_eq!(
        field(forged_copy, "X-Pepsi-Decrypted"),
        None,
        "{}",
        text(forged_copy)
    );

    // S/MIME, from OpenSSL: signed by a certificate of a CA we trust, encrypted to bob's.
    pki::issue_email(work.path(), "dave", "dave@remote.test");
    keys_ok(
        &sys,
        &["ca", "add", work.path().join("ca.pem").to_str().unwrap()],
    );
    std::fs::write(
        work.path().join("bob.pem"),
        keys_ok(&sys, &["export", "bob@example.test", "--scheme", "smime"]),
    )
    .unwrap();
    std::fs::write(work.path().join("entity"), entity).unwrap();
    openssl(
        work.path(),
        &[
            "smime", "-sign", "-in", "entity", "-signer", "dave.pem", "-inkey", "dave.key", "-out",
            "signed", "-crlfeol",
        ],
    );
    openssl(
        work.path(),
        &[
            "smime",
            "-encrypt",
            "-aes256",
            "-in",
            "signed",
            "-out",
            "encrypted",
            "-from",
            "dave@remote.test",
            "-to",
            "bob@example.test",
            "-subject",
            "smime secret",
            "-crlfeol",
            "bob.pem",
        ],
    );
    let mut message =
        b"Date: Thu, 03 Dec 2026 10:00:00 +0000\r\nMessage-ID: <smime@remote.test>\r\n".to_vec();
    // openssl writes its own header lines with bare LF whatever -crlfeol says.
    let encrypted = std::fs::read_to_string(work.path().join("encrypted")).unwrap();
    message.extend_from_slice(
        encrypted
            .replace("\r\n", "\n")
            .replace('\n', "\r\n")
            .as_bytes(),
    );
    let reply = sys
        .send("dave@remote.test", &["bob@example.test"], &message)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bob = sys.wait_messages("bob", 3, WAIT).await;
    let smime_copy = bob
        .iter()
        .find(|m| text(m).contains("Subject: smime secret"))
        .unwrap();
    assert!(
        text(smime_copy).contains("meet at the usual place"),
        "{}",
        text(smime_copy)
    );
    let result = field(smime_copy, "X-Pepsi-Decrypted").unwrap_or_default();
    assert!(
        result.starts_with(&format!("smime; key={bob_smime}; signature=good")),
        "{result}"
    );

    // Regression: the plaintext goes only to a recipient the message was encrypted to. carol
    // opts in too, but this one is for bob alone; her copy stays encrypted, and the result
    // field a sender forged is gone from it as from bob's.
    set_setting(&sys, "carol@example.test", "decrypt", Value::Bool(true)).await;
    gpg.run(&[
        "--armor",
        "--encrypt",
        "--sign",
        "-u",
        &dave,
        "-r",
        "bob@example.test",
        "--output",
        gpg.path("bob-only.asc").to_str().unwrap(),
        plaintext.to_str().unwrap(),
    ]);
    let armored = std::fs::read_to_string(gpg.path("bob-only.asc")).unwrap();
    let message = pgp_message("dave@remote.test", "bob@example.test", "bob-only", &armored);
    let message = text(&message)
        .replacen(
            "Subject:",
            "X-Pepsi-Decrypted: openpgp; key=X; signature=good\r\nSubject:",
            1,
        )
        .into_bytes();
    let reply = sys
        .send(
            "dave@remote.test",
            &["bob@example.test", "carol@example.test"],
            &message,
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bob = sys.wait_messages("bob", 4, WAIT).await;
    let carol = sys.wait_messages("carol", 2, WAIT).await;
    let bobs = bob
        .iter()
        .find(|m| text(m).contains("Subject: bob-only"))
        .unwrap();
    let carols = carol
        .iter()
        .find(|m| text(m).contains("Subject: bob-only"))
        .unwrap();
    assert!(
        text(bobs).contains("meet at the usual place"),
        "{}",
        text(bobs)
    );
    assert!(
        field(bobs, "X-Pepsi-Decrypted")
            .unwrap()
            .starts_with(&format!("openpgp; key={bob_pgp}")),
        "{}",
        text(bobs)
    );
    assert!(
        !text(carols).contains("meet at the usual place"),
        "{}",
        text(carols)
    );
    assert!(text(carols).contains("-----BEGIN PGP MESSAGE-----"));
    assert_eq!(field(carols, "X-Pepsi-Decrypted"), None, "{}", text(carols));

    // Mail nobody here can decrypt goes on untouched.
    let stranger = gpg.generate("Stranger <stranger@elsewhere.test>", true);
    gpg.run(&[
        "--armor",
        "--encrypt",
        "-r",
        &stranger,
        "--output",
        gpg.path("other.asc").to_str().unwrap(),
        plaintext.to_str().unwrap(),
    ]);
    let armored = std::fs::read_to_string(gpg.path("other.asc")).unwrap();
    let message = pgp_message(
        "dave@remote.test",
        "bob@example.test",
        "unreadable",
        &armored,
    );
    let reply = sys
        .send("dave@remote.test", &["bob@example.test"], &message)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bob = sys.wait_messages("bob", 5, WAIT).await;
    let untouched = bob
        .iter()
        .find(|m| text(m).contains("Subject: unreadable"))
        .unwrap();
    assert!(
        text(untouched).contains(armored.lines().nth(2).unwrap()),
        "{}",
        text(untouched)
    );
    assert_eq!(field(untouched, "X-Pepsi-Decrypted"), None);
}

/// Security review #1: a failure notice about mail decrypted here never returns the
/// plaintext to whoever set the envelope sender, whatever RET asks (decryption oracle).
#[tokio::test(flavor = "multi_thread")]
async fn decryption_oracle_a_dsn_of_decrypted_mail_returns_only_the_encrypted_headers() {
    // bob's mailbox takes 1 KiB, and a message that does not fit is returned at once.
    let graph = format!("{INBOUND}\n[stage-local]\nQUOTA_GRACE = 0\n");
    let mut sys = System::new(&graph, &["bob", "eve"]).await;
    let kek = new_kek(&sys, "k1");
    set_kek(&sys, &kek, &[]);
    keys_ok(&sys, &["generate", "bob@example.test"]);
    set_setting(&sys, "bob@example.test", "decrypt", Value::Bool(true)).await;
    sqlx::query("INSERT INTO pepsi.quota_limit (scope, storage) VALUES ('bob@example.test', 1024)")
        .execute(&sys.db.pool)
        .await
        .unwrap();
    sys.start().await;

    // Someone wrote to bob, encrypted; eve captured the message and sends it to bob again
    // with herself as the envelope sender and RET=FULL.
    let gpg = Gpg::new();
    gpg.import(
        "bob.asc",
        keys_ok(&sys, &["export", "bob@example.test", "--scheme", "openpgp"]).as_bytes(),
    );
    const SECRET: &str = "the vault opens with 4711-kumquat";
    let entity = format!(
        "Content-Type: text/plain; charset=utf-8\r\n\r\n{SECRET}\r\n{}\r\n",
        "padding so that the plaintext does not fit into bob's mailbox. ".repeat(30)
    );
    let plaintext = gpg.write("entity", entity.as_bytes());
    let encrypted = gpg.path("entity.asc");
    gpg.run(&[
        "--armor",
        "--encrypt",
        "-r",
        "bob@example.test",
        "--output",
        encrypted.to_str().unwrap(),
        plaintext.to_str().unwrap(),
    ]);
    let armored = std::fs::read_to_string(&encrypted).unwrap();
    let message = pgp_message(
        "alice@remote.test",
        "bob@example.test",
        "captured",
        &armored,
    );
    let reply = support::system::send_smtp(
        sys.port,
        "eve@example.test",
        &["bob@example.test"],
        &message,
        " RET=FULL",
    )
    .await;
    assert!(reply.starts_with("250"), "{reply}");

    let dsn = sys.wait_messages("eve", 1, WAIT).await;
    let got = text(&dsn[0]);
    assert!(got.contains("5.2.2"), "a failure notice: {got}");
    assert!(
        !got.contains("4711-kumquat") && !got.contains("padding so that"),
        "the notice carries the plaintext: {got}"
    );
    // What comes back is the header block the message arrived with, not the plaintext's.
    assert!(got.contains("text/rfc822-headers"), "{got}");
    assert!(got.contains("Subject: captured"), "{got}");
    assert!(got.contains("multipart/encrypted"), "{got}");
    assert!(!got.contains("X-Pepsi-Decrypted"), "{got}");
    assert!(sys.messages("bob").is_empty(), "bob's mailbox is full");
}

#[tokio::test(flavor = "multi_thread")]
async fn autocrypt_headers_of_inbound_mail_become_peer_state_and_outbound_mail_uses_them() {
    let sub_port = support::free_port();
    let graph = format!(
        "[stage-init]\nNEXT_STAGE = decrypt\n\n\
         [stage-decrypt]\nPROGRAM = pepsi-stage-decrypt\nNEXT_STAGE = learn\n\n\
         [stage-learn]\nPROGRAM = pepsi-stage-autocrypt-learn\nNEXT_STAGE = encrypt\n\n\
         [stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = aliases\nBOUNCE_STAGE = bounce\n\n\
         [listener-sub]\nROLE = submission\nADDRESS = 127.0.0.1:{sub_port}\nALLOW_PLAINTEXT_AUTH = yes\n"
    );
    let mut sys = System::new(&graph, &["alice", "erin"]).await;
    let kek = new_kek(&sys, "k1");
    set_kek(&sys, &kek, &[]);
    sys.start().await;
    set_password(&sys, "erin@example.test").await;
    // erin is a mailbox here whose mail client speaks Autocrypt with its own key.
    let gpg = Gpg::new();
    let erin = gpg.generate("Erin <erin@example.test>", true);
    let keydata = pepsi_smtp::encoding::base64_encode(&gpg.export("--export", &erin));
    let folded: Vec<&str> = keydata
        .as_bytes()
        .chunks(72)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let header = format!(
        "Autocrypt: addr=erin@example.test; prefer-encrypt=mutual; keydata=\r\n {}\r\n",
        folded.join("\r\n ")
    );
    let message = plain(
        "erin@example.test",
        "alice@example.test",
        "hello",
        &header,
        "hi\r\n",
    );
    // Security review #15: through the MX, without AUTH and without a DMARC pass, anyone
    // could have written it: the key is not learnt.
    let reply = sys
        .send("erin@example.test", &["alice@example.test"], &message)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 1, WAIT).await;
    let learnt: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.peer_key WHERE address = 'erin@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(learnt, 0, "learnt from an unauthenticated From");
    // erin herself, logged in on the submission listener.
    let erin_sends = async |message: Vec<u8>| {
        support::system::send_smtp_auth(
            sub_port,
            ("erin@example.test", "pw"),
            "erin@example.test",
            &["alice@example.test"],
            &message,
        )
        .await
    };
    let message = text(&message).replace("hello", "hello2").into_bytes();
    let reply = erin_sends(message).await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 2, WAIT).await;
    let (fpr, source, prefer): (String, String, Option<String>) = sqlx::query_as(
        "SELECT fingerprint, source, prefer_encrypt FROM pepsi.peer_key WHERE address = 'erin@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (fpr.as_str(), source.as_str(), prefer.as_deref()),
        (erin.as_str(), "autocrypt", Some("mutual"))
    );

    // An older message (an earlier Date) changes nothing; a newer one without the header
    // moves last_seen only.
    let older = text(&plain(
        "erin@example.test",
        "alice@example.test",
        "older",
        &header.replace("prefer-encrypt=mutual; ", ""),
        "hi\r\n",
    ))
    .replace("03 Dec 2026", "01 Dec 2026")
    .into_bytes();
    let reply = erin_sends(older).await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 3, WAIT).await;
    let prefer: Option<String> = sqlx::query_scalar(
        "SELECT prefer_encrypt FROM pepsi.peer_key WHERE address = 'erin@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(prefer.as_deref(), Some("mutual"));

    // alice writes to erin: encrypted to the key Autocrypt taught us, which erin's GnuPG
    // reads, and signed by alice's identity with alice's Autocrypt header outside.
    set_password(&sys, "alice@example.test").await;
    let alice = fingerprint_of(&keys_ok(&sys, &["generate", "alice@example.test"]));
    gpg.import(
        "alice.asc",
        keys_ok(&sys, &["export", "alice@example.test"]).as_bytes(),
    );
    let reply = support::system::send_smtp_auth(
        sub_port,
        ("alice@example.test", "pw"),
        "alice@example.test",
        &["erin@example.test"],
        &plain(
            "alice@example.test",
            "erin@example.test",
            "reply",
            "",
            "the answer is 42\r\n",
        ),
    )
    .await;
    assert!(reply.starts_with("250"), "{reply}");
    let got = sys.wait_messages("erin", 1, WAIT).await;
    let stored = text(&got[0]);
    assert!(
        field(&got[0], "Content-Type")
            .unwrap()
            .starts_with("multipart/encrypted"),
        "{stored}"
    );
    let ac = field(&got[0], "Autocrypt").unwrap_or_default();
    assert!(ac.starts_with("addr=alice@example.test;"), "{ac}");
    let payload = gpg.write("reply.asc", armored_payload(&stored).as_bytes());
    let out = gpg.run(&[
        "--decrypt",
        "--output",
        gpg.path("reply.txt").to_str().unwrap(),
        payload.to_str().unwrap(),
    ]);
    let status = text(&out.stdout);
    assert!(status.contains("DECRYPTION_OKAY"), "{status}");
    assert!(
        status.contains(&format!("VALIDSIG {alice}")),
        "signed by alice: {status}"
    );
    let inner = std::fs::read_to_string(gpg.path("reply.txt")).unwrap();
    assert!(inner.contains("the answer is 42"), "{inner}");

    // The same From through the MX, without AUTH, is not alice's to sign:
    // encrypted to erin, unsigned, without alice's Autocrypt header.
    let reply = sys
        .send(
            "alice@example.test",
            &["erin@example.test"],
            &plain(
                "alice@example.test",
                "erin@example.test",
                "forged",
                "",
                "who wrote this\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let got = sys.wait_messages("erin", 2, WAIT).await;
    let forged = got
        .iter()
        .find(|m| text(m).contains("Subject: forged"))
        .unwrap();
    assert_eq!(field(forged, "Autocrypt"), None, "{}", text(forged));
    let payload = gpg.write("forged.asc", armored_payload(&text(forged)).as_bytes());
    let out = gpg.run(&[
        "--decrypt",
        "--output",
        gpg.path("forged.txt").to_str().unwrap(),
        payload.to_str().unwrap(),
    ]);
    let status = text(&out.stdout);
    assert!(status.contains("DECRYPTION_OKAY"), "{status}");
    assert!(!status.contains("SIG"), "not signed: {status}");
}

/// Security review #15: the learn stage takes an Autocrypt key only from a From address
/// the ingress authenticated; the same message with DMARC fail or none changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn autocrypt_learn_ignores_an_unauthenticated_from() {
    let db = pepsi_testkit::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\n[stage-learn]\nPROGRAM = pepsi-stage-autocrypt-learn\n\
             NEXT_STAGE = aliases\n",
            db.url
        ),
    )
    .unwrap();
    let gpg = Gpg::new();
    let fpr = gpg.generate("Erin <erin@example.org>", true);
    let keydata = pepsi_smtp::encoding::base64_encode(&gpg.export("--export", &fpr));
    let folded: Vec<&str> = keydata
        .as_bytes()
        .chunks(72)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let headers = format!(
        "From: erin@example.org\r\nTo: alice@example.test\r\nSubject: hi\r\n\
         Date: Thu, 03 Dec 2026 10:00:00 +0000\r\n\
         Autocrypt: addr=erin@example.org; keydata=\r\n {}\r\n",
        folded.join("\r\n ")
    );
    let learn = pepsi_testkit::programs::program(
        "pepsi-stage-autocrypt-learn",
        env!("CARGO_BIN_EXE_pepsi-stage-autocrypt-learn"),
    );
    let pass = |state: Value| {
        let (db, headers, cfg, learn) = (&db, &headers, &cfg, &learn);
        async move {
            let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
                .bind("erin@example.org")
                .bind(vec!["alice@example.test".to_owned()])
                .bind(headers.as_bytes())
                .bind(&b"hi\r\n"[..])
                .bind(state)
                .fetch_one(&db.pool)
                .await
                .unwrap();
            support::claim(&db.pool, id, "learn").await;
            let out = support::run_ids(learn.to_str().unwrap(), cfg, &[id]).await;
            assert_eq!(out.len(), 1, "{out:?}");
            let stage: String =
                sqlx::query_scalar("SELECT stage FROM pepsi.workqueue WHERE workqueue_id = $1")
                    .bind(id)
                    .fetch_one(&db.pool)
                    .await
                    .unwrap();
            assert_eq!(stage, "aliases", "the message goes on: {out:?}");
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pepsi.peer_key WHERE address = 'erin@example.org'",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap()
        }
    };
    let dmarc = |result: &str| {
        serde_json::json!({"auth": {"dmarc": {"result": result, "domain": "example.org"},
                                    "dkim": []}})
    };
    assert_eq!(pass(serde_json::json!({})).await, 0, "no verdict");
    assert_eq!(pass(dmarc("none")).await, 0, "dmarc=none");
    assert_eq!(pass(dmarc("fail")).await, 0, "dmarc=fail");
    assert_eq!(
        pass(serde_json::json!({"auth": {"dmarc": {"result": "none"},
            "dkim": [{"result": "pass", "domain": "evil.test"}]}}))
        .await,
        0,
        "a DKIM pass of another domain"
    );
    assert_eq!(pass(dmarc("pass")).await, 1, "dmarc=pass");
    let source: String =
        sqlx::query_scalar("SELECT source FROM pepsi.peer_key WHERE address = 'erin@example.org'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(source, "autocrypt");
}

#[tokio::test(flavor = "multi_thread")]
async fn outbound_mail_is_encrypted_to_each_recipients_key_and_read_by_gnupg_and_openssl() {
    let graph = "[stage-init]\nNEXT_STAGE = encrypt\n\n\
        [stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = aliases\nBOUNCE_STAGE = bounce\nSIGN = no\n";
    let mut sys = System::new(graph, &["alice", "dave", "erin", "frank"]).await;
    let work = tempfile::tempdir().unwrap();
    sys.start().await;
    // dave reads OpenPGP (GnuPG), erin S/MIME (OpenSSL), frank has no key.
    let gpg = Gpg::new();
    let dave = gpg.generate("Dave <dave@example.test>", true);
    std::fs::write(work.path().join("dave.pub"), gpg.export("--export", &dave)).unwrap();
    keys_ok(
        &sys,
        &[
            "peer",
            "import",
            work.path().join("dave.pub").to_str().unwrap(),
        ],
    );
    pki::issue_email(work.path(), "erin", "erin@example.test");
    keys_ok(
        &sys,
        &[
            "peer",
            "import",
            work.path().join("erin.pem").to_str().unwrap(),
        ],
    );

    let body = "plans for the launch\r\n";
    let reply = sys
        .send(
            "alice@example.test",
            &["dave@example.test", "erin@example.test"],
            &plain(
                "alice@example.test",
                "dave@example.test, erin@example.test",
                "launch",
                "",
                body,
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let d = sys.wait_messages("dave", 1, WAIT).await;
    let e = sys.wait_messages("erin", 1, WAIT).await;
    // Two schemes: the recipients part ways, each copy encrypted to its reader.
    let dave_copy = text(&d[0]);
    assert!(
        field(&d[0], "Content-Type")
            .unwrap()
            .starts_with("multipart/encrypted"),
        "{dave_copy}"
    );
    assert!(!dave_copy.contains("plans for the launch"), "{dave_copy}");
    assert_eq!(field(&d[0], "Subject").as_deref(), Some("launch"));
    let payload = gpg.write("launch.asc", armored_payload(&dave_copy).as_bytes());
    let out = gpg.run(&[
        "--decrypt",
        "--output",
        gpg.path("launch.txt").to_str().unwrap(),
        payload.to_str().unwrap(),
    ]);
    assert!(
        text(&out.stdout).contains("DECRYPTION_OKAY"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        std::fs::read_to_string(gpg.path("launch.txt"))
            .unwrap()
            .contains("plans for the launch")
    );

    let erin_copy = text(&e[0]);
    assert!(
        field(&e[0], "Content-Type")
            .unwrap()
            .starts_with("application/pkcs7-mime; smime-type=enveloped-data"),
        "{erin_copy}"
    );
    let (_, body_part) = support::system::split(&e[0]);
    std::fs::write(
        work.path().join("erin.msg"),
        [
            b"Content-Type: application/pkcs7-mime; smime-type=enveloped-data; name=smime.p7m\r\n\
           Content-Transfer-Encoding: base64\r\n\r\n"
                .as_slice(),
            body_part,
        ]
        .concat(),
    )
    .unwrap();
    let out = openssl(
        work.path(),
        &[
            "smime", "-decrypt", "-in", "erin.msg", "-recip", "erin.pem", "-inkey", "erin.key",
        ],
    );
    assert!(
        text(&out.stdout).contains("plans for the launch"),
        "{}",
        text(&out.stdout)
    );

    // Opportunistic: one recipient without a key, and the message leaves as it is.
    let reply = sys
        .send(
            "alice@example.test",
            &["dave@example.test", "frank@example.test"],
            &plain(
                "alice@example.test",
                "frank@example.test",
                "open",
                "",
                "nothing secret\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let f = sys.wait_messages("frank", 1, WAIT).await;
    assert!(text(&f[0]).contains("nothing secret"));
    let d = sys.wait_messages("dave", 2, WAIT).await;
    assert!(
        d.iter().any(|m| text(m).contains("nothing secret")),
        "dave's copy is plain too"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn required_encryption_parks_for_discovery_then_leaves_encrypted_or_bounces_from_the_negative_cache()
 {
    let graph = "[stage-init]\nNEXT_STAGE = encrypt\n\n\
        [stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = aliases\nBOUNCE_STAGE = bounce\n\
        SIGN = no\nPOLICY = required\nDISCOVERY_METHODS = wkd, openpgpkey\n";
    let mut sys = System::new(graph, &["alice", "gina", "hank"]).await;
    let work = tempfile::tempdir().unwrap();
    sys.start().await;

    // gina has no key yet: the message waits, and discovery is asked for.
    let reply = sys
        .send(
            "alice@example.test",
            &["gina@example.test"],
            &plain(
                "alice@example.test",
                "gina@example.test",
                "for gina",
                "",
                "sealed\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let parked = wait_parked(&sys, 1).await;
    assert_eq!(
        parked[0].3["keydisc"]["waiting"],
        serde_json::json!(["gina@example.test"])
    );
    let (status, methods): (String, Vec<String>) = sqlx::query_as(
        "SELECT status, methods_asked FROM pepsi.key_request WHERE address = 'gina@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), methods),
        ("pending", vec!["wkd".to_owned(), "openpgpkey".to_owned()])
    );
    assert!(sys.messages("gina").is_empty());
    // Discovery finds her key: the message leaves, encrypted to it.
    let gpg = Gpg::new();
    let gina = gpg.generate("Gina <gina@example.test>", true);
    std::fs::write(work.path().join("gina.pub"), gpg.export("--export", &gina)).unwrap();
    keys_ok(
        &sys,
        &[
            "peer",
            "import",
            work.path().join("gina.pub").to_str().unwrap(),
        ],
    );
    settle(&sys, "gina@example.test", true).await;
    let g = sys.wait_messages("gina", 1, WAIT).await;
    assert!(
        field(&g[0], "Content-Type")
            .unwrap()
            .starts_with("multipart/encrypted"),
        "{}",
        text(&g[0])
    );
    assert!(!text(&g[0]).contains("sealed"));

    // hank has no key anywhere: when discovery settles without one, alice gets a DSN.
    let reply = sys
        .send(
            "alice@example.test",
            &["hank@example.test"],
            &plain(
                "alice@example.test",
                "hank@example.test",
                "for hank",
                "",
                "sealed\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    wait_parked(&sys, 1).await;
    settle(&sys, "hank@example.test", false).await;
    let dsn = sys.wait_messages("alice", 1, WAIT).await;
    let dsn = text(&dsn[0]);
    assert!(
        dsn.contains("hank@example.test") && dsn.contains("5.7.5"),
        "{dsn}"
    );
    assert!(dsn.contains("no key for"), "{dsn}");
    assert!(sys.messages("hank").is_empty());
    let asked: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT requested_at FROM pepsi.key_request WHERE address = 'hank@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();

    // A second message to hank is answered from the negative cache: no new lookup, no wait.
    let reply = sys
        .send(
            "alice@example.test",
            &["hank@example.test"],
            &plain(
                "alice@example.test",
                "hank@example.test",
                "again",
                "",
                "sealed\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let dsns = sys.wait_messages("alice", 2, WAIT).await;
    assert!(
        dsns.iter().any(|m| text(m).contains("again")),
        "the second DSN"
    );
    let (status, again): (String, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
        "SELECT status, requested_at FROM pepsi.key_request WHERE address = 'hank@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), again), ("none", asked), "no new request");

    // Regression: a plaintext labelled as encrypted is not let through as encrypted.
    let labelled = plain(
        "alice@example.test",
        "hank@example.test",
        "labelled",
        "MIME-Version: 1.0\r\nContent-Type: multipart/encrypted; protocol=\"application/pgp-encrypted\"; boundary=x\r\n",
        "--x\r\n\r\nVersion: 1\r\n--x\r\n\r\nnot a PGP message at all\r\n--x--\r\n",
    );
    let reply = sys
        .send("alice@example.test", &["hank@example.test"], &labelled)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let dsns = sys.wait_messages("alice", 3, WAIT).await;
    assert!(
        dsns.iter().any(|m| text(m).contains("labelled")),
        "returned, not delivered"
    );
    assert!(sys.messages("hank").is_empty());
    assert!(
        queue_at(&sys, "encrypt").await.is_empty(),
        "{:?}",
        sys.queue().await
    );
}

/// Security review #8: a recipient domain the URL parser reads as an IPv4 address (hex
/// labels, full-width digits) is refused before any connection, so it cannot aim key
/// discovery at the host's own or its network's services.
#[tokio::test(flavor = "multi_thread")]
async fn keydisc_ssrf_address_literal_domains_are_refused_without_a_connection() {
    // What the WKD port of 127.0.0.1 would answer: it counts the connections it accepts.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    // The DNS answers NXDOMAIN for the names under these top-level labels, so the WKD
    // method goes on to its direct URL on the domain itself.
    let dns = support::ingress::Dns::start_logged(&[
        "--local=/1/".to_owned(),
        "--local=/0x1/".to_owned(),
    ]);
    let graph = format!(
        "[pepsi-keydisc]\nDNS_SERVERS = 127.0.0.1:{}\nWKD_PORT = {port}\nMETHOD_TIMEOUT = 3s\n",
        dns.port
    );
    let sys = System::new(&graph, &[]).await;
    let domains = [
        "0x7f.0.0.1",
        "0x7f.0.0.0x1",
        "\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}",
    ];
    for d in domains {
        let st: String = sqlx::query_scalar("SELECT pepsi.crypto_request_key($1, '{wkd}')")
            .bind(format!("probe@{d}"))
            .fetch_one(&sys.db.pool)
            .await
            .unwrap();
        assert_eq!(st, "pending", "{d}");
    }
    let pass = keydisc(&sys);
    assert_eq!(pass["asked"], domains.len(), "{pass}");
    assert_eq!(pass["found"], 0, "{pass}");
    let accepted = std::iter::from_fn(|| listener.accept().ok()).count();
    assert_eq!(
        accepted, 0,
        "key discovery connected to 127.0.0.1:{port}: {pass}"
    );
    for d in domains {
        let replied: Value = sqlx::query_scalar(
            "SELECT methods_replied FROM pepsi.key_request WHERE address = lower($1)",
        )
        .bind(format!("probe@{d}"))
        .fetch_one(&sys.db.pool)
        .await
        .unwrap();
        assert_eq!(replied["wkd"]["result"], "none", "{d}: {replied}");
        assert!(
            replied["wkd"]["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("is not a domain name"),
            "{d}: {replied}"
        );
    }
}

/// The WKD server of wkd_server.py on a free port, serving `root` with `cert`/`key`.
struct Wkd {
    _proc: support::system::Proc,
    port: u16,
    log: PathBuf,
}

impl Wkd {
    async fn start(dir: &Path, root: &Path) -> Wkd {
        let port = support::free_port();
        let log = dir.join("wkd.log");
        let child = Command::new("/usr/bin/python3")
            .arg(support::root().join("tests/integration/crypto/wkd_server.py"))
            .arg(port.to_string())
            .arg(dir.join("wkd.pem"))
            .arg(dir.join("wkd.key"))
            .arg(root)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("/usr/bin/python3");
        let until = Instant::now() + WAIT;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < until,
                "the WKD server did not listen: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Wkd {
            _proc: support::system::Proc {
                child,
                name: "wkd_server.py",
            },
            port,
            log,
        }
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn keydisc(sys: &System) -> Value {
    let tool =
        pepsi_testkit::programs::program("pepsi-keydisc", env!("CARGO_BIN_EXE_pepsi-keydisc"));
    let out = sys
        .command(&tool)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .args(["--once", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pepsi-keydisc: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread")]
async fn key_discovery_finds_keys_by_wkd_and_openpgpkey_and_answers_a_miss_from_its_cache() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    // The WKD host's certificate, from a test CA pepsi-keydisc is told to trust.
    pki::issue(
        dir,
        "wkd",
        "/CN=openpgpkey.example.test",
        "subjectAltName = DNS:openpgpkey.example.test, DNS:example.test, DNS:other.test\n",
    );
    // gina publishes her key in the domain's WKD, ivan his in DNS; hank nowhere.
    let gpg = Gpg::new();
    let gina = gpg.generate("Gina <gina@example.test>", true);
    let ivan = gpg.generate("Ivan <ivan@example.test>", true);
    // jane's domain has no openpgpkey host: the direct method's URL on the domain itself.
    let jane = gpg.generate("Jane <jane@other.test>", true);
    let [_, jane_direct] = pepsi_keydisc::names::wkd_urls("jane", "other.test", 443);
    let jane_hash = jane_direct
        .split("/hu/")
        .nth(1)
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let direct_hu = dir.join("root/.well-known/openpgpkey/hu");
    std::fs::create_dir_all(&direct_hu).unwrap();
    std::fs::write(direct_hu.join(&jane_hash), gpg.export("--export", &jane)).unwrap();
    let [advanced, _] = pepsi_keydisc::names::wkd_urls("gina", "example.test", 443);
    let hashed = advanced
        .split("/hu/")
        .nth(1)
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let hu = dir.join("root/.well-known/openpgpkey/example.test/hu");
    std::fs::create_dir_all(&hu).unwrap();
    std::fs::write(hu.join(&hashed), gpg.export("--export", &gina)).unwrap();
    let wkd = Wkd::start(dir, &dir.join("root")).await;
    let ivan_name = pepsi_keydisc::names::dane_name("ivan", "example.test", "_openpgpkey");
    let ivan_hex: String = gpg
        .export("--export", &ivan)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let hank_name = pepsi_keydisc::names::dane_name("hank", "example.test", "_openpgpkey");
    let dns = support::ingress::Dns::start_logged(&[
        "--host-record=openpgpkey.example.test,127.0.0.1".to_owned(),
        "--host-record=other.test,127.0.0.1".to_owned(),
        format!("--dns-rr={ivan_name},61,{ivan_hex}"),
    ]);
    let graph = format!(
        "[stage-init]\nNEXT_STAGE = encrypt\n\n\
         [stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = aliases\nBOUNCE_STAGE = bounce\n\
         SIGN = no\nPOLICY = required\nDISCOVERY_METHODS = wkd, openpgpkey\n\n\
         [pepsi-keydisc]\nDNS_SERVERS = 127.0.0.1:{}\nWKD_PORT = {}\nTLS_CA_FILE = {}\nMETHOD_TIMEOUT = 5s\n\
         ALLOW_PRIVATE_ADDRESSES = yes\n",
        dns.port,
        wkd.port,
        dir.join("ca.pem").display()
    );
    let mut sys = System::new(&graph, &["alice", "gina", "ivan", "hank"]).await;
    sys.start().await;

    let reply = sys
        .send(
            "alice@example.test",
            &["gina@example.test", "ivan@example.test"],
            &plain(
                "alice@example.test",
                "gina@example.test, ivan@example.test",
                "found",
                "",
                "sealed\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    wait_parked(&sys, 1).await;
    let pass = keydisc(&sys);
    assert_eq!(
        (pass["asked"].clone(), pass["found"].clone()),
        (2.into(), 2.into()),
        "{pass}"
    );
    assert!(
        wkd.requests().contains(&format!(
            "/.well-known/openpgpkey/example.test/hu/{hashed}?l=gina host=openpgpkey.example.test"
        )),
        "{}",
        wkd.requests()
    );
    let sources: Vec<(String, String, String)> =
        sqlx::query_as("SELECT address, source, fingerprint FROM pepsi.peer_key ORDER BY address")
            .fetch_all(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(
        sources,
        [
            (
                "gina@example.test".to_owned(),
                "wkd".to_owned(),
                gina.clone()
            ),
            (
                "ivan@example.test".to_owned(),
                "openpgpkey".to_owned(),
                ivan.clone()
            ),
        ]
    );
    for user in ["gina", "ivan"] {
        let got = sys.wait_messages(user, 1, WAIT).await;
        let stored = text(&got[0]);
        assert!(
            field(&got[0], "Content-Type")
                .unwrap()
                .starts_with("multipart/encrypted"),
            "{stored}"
        );
        let payload = gpg.write(&format!("{user}.asc"), armored_payload(&stored).as_bytes());
        let out = gpg.run(&[
            "--decrypt",
            "--output",
            gpg.path(&format!("{user}.txt")).to_str().unwrap(),
            payload.to_str().unwrap(),
        ]);
        assert!(
            text(&out.stdout).contains("DECRYPTION_OKAY"),
            "{user}: {}",
            text(&out.stdout)
        );
    }

    // hank: nothing anywhere. The request settles without a key, the message comes back.
    let reply = sys
        .send(
            "alice@example.test",
            &["hank@example.test"],
            &plain(
                "alice@example.test",
                "hank@example.test",
                "missing",
                "",
                "sealed\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    wait_parked(&sys, 1).await;
    let pass = keydisc(&sys);
    assert_eq!(
        (pass["none"].clone(), pass["released"].clone()),
        (1.into(), 1.into()),
        "{pass}"
    );
    let dsn = sys.wait_messages("alice", 1, WAIT).await;
    assert!(text(&dsn[0]).contains("5.7.5"), "{}", text(&dsn[0]));
    let replied: Value = sqlx::query_scalar(
        "SELECT methods_replied FROM pepsi.key_request WHERE address = 'hank@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (
            replied["wkd"]["result"].clone(),
            replied["openpgpkey"]["result"].clone()
        ),
        ("none".into(), "none".into()),
        "{replied}"
    );
    let asked = dns.queries(&hank_name);
    assert_eq!(asked, 1, "one OPENPGPKEY lookup for hank");

    // The direct method, for a domain without the advanced method's host.
    let st: String =
        sqlx::query_scalar("SELECT pepsi.crypto_request_key('jane@other.test', '{wkd}')")
            .fetch_one(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(st, "pending");
    let pass = keydisc(&sys);
    assert_eq!(pass["found"], 1, "{pass}");
    assert!(
        wkd.requests().contains(&format!(
            "GET /.well-known/openpgpkey/hu/{jane_hash}?l=jane host=other.test"
        )),
        "{}",
        wkd.requests()
    );
    let fpr: String = sqlx::query_scalar(
        "SELECT fingerprint FROM pepsi.peer_key WHERE address = 'jane@other.test' AND source = 'wkd'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(fpr, jane);

    // A second message for hank: returned from the negative cache, nothing asked again.
    let reply = sys
        .send(
            "alice@example.test",
            &["hank@example.test"],
            &plain(
                "alice@example.test",
                "hank@example.test",
                "missing-again",
                "",
                "sealed\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 2, WAIT).await;
    let pass = keydisc(&sys);
    assert_eq!(pass["asked"], 0, "{pass}");
    assert_eq!(dns.queries(&hank_name), asked, "no new lookup");
    assert_eq!(
        wkd.requests().matches("l=hank").count(),
        1,
        "{}",
        wkd.requests()
    );
}

/// `[stage-encrypt]` under `POLICY = required` without discovery, after the secure-link
/// stage's test graph (`stage_secure_link::setup`): `secure`, `out`, `bounce`.
const FALLBACK_GRAPH: &str = "[stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = out\n\
    BOUNCE_STAGE = bounce\nSIGN = no\nPOLICY = required\nDISCOVERY = no\n";

const ENCRYPT: &str = env!("CARGO_BIN_EXE_pepsi-stage-encrypt");

/// SECURE_LINK_STAGE: a recipient without a key where encryption is required goes to the
/// secure-link stage instead of a 5.7.5 bounce when the policy of its domain says
/// `fallback`, and is reached there by a link to the message.
#[tokio::test]
async fn required_encryption_without_a_key_falls_back_to_a_secure_link_where_the_policy_allows() {
    use crate::stage_secure_link as sl;
    let db = pepsi_testkit::TestDb::new().await;
    let s = sl::setup(
        &db,
        &format!("{FALLBACK_GRAPH}SECURE_LINK_STAGE = secure\n"),
    )
    .await;
    sqlx::query(
        "INSERT INTO pepsi.secure_link_policy (scope, domain, mode) \
         VALUES ('recipient_domain', 'remote.example', 'fallback')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let id = sl::message(
        &db,
        &["bob@remote.example"],
        &sl::headers("figures", ""),
        true,
        serde_json::json!({}),
        "encrypt",
    )
    .await;
    assert_eq!(support::run_ids(ENCRYPT, &s.config, &[id]).await, vec!["0"]);
    let r = sl::rows(&db).await;
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(
        (r[0].id, r[0].stage.as_str(), r[0].status.as_str()),
        (id, "secure", "pending")
    );
    assert_eq!(
        r[0].state["secure_link"],
        serde_json::json!({"reason": "encrypt-fallback"})
    );
    assert!(
        r[0].state.get("bounce").is_none(),
        "not bounced: {:?}",
        r[0].state
    );

    support::claim(&db.pool, id, "secure").await;
    assert_eq!(
        support::run_ids(sl::STAGE_PROGRAM, &s.config, &[id]).await,
        vec![sl::FINISHED]
    );
    let r = sl::rows(&db).await;
    let notice = r
        .iter()
        .find(|row| row.state["secure_link"]["made"] == "notice")
        .unwrap_or_else(|| panic!("a notice: {r:#?}"));
    assert_eq!(notice.rcpt, ["bob@remote.example"]);
    assert!(sl::text(&sl::open(&db, &notice.raw).await).contains("quarterly"));
    assert!(r.iter().all(|row| row.stage != "bounce"), "{r:#?}");
}

/// Without SECURE_LINK_STAGE, or with it and a policy that does not allow the fallback
/// (`never`, or no row), a recipient without a key is still returned with 5.7.5.
#[tokio::test]
async fn required_encryption_without_a_key_still_bounces_unless_the_fallback_is_set_and_allowed() {
    use crate::stage_secure_link as sl;
    let cases: &[(&str, Option<&str>)] = &[
        ("", Some("fallback")),
        ("SECURE_LINK_STAGE = secure\n", Some("never")),
        ("SECURE_LINK_STAGE = secure\n", None),
    ];
    for (option, mode) in cases {
        let db = pepsi_testkit::TestDb::new().await;
        let s = sl::setup(&db, &format!("{FALLBACK_GRAPH}{option}")).await;
        if let Some(mode) = mode {
            sqlx::query(
                "INSERT INTO pepsi.secure_link_policy (scope, domain, mode) \
                 VALUES ('sender_domain', 'example.test', $1)",
            )
            .bind(mode)
            .execute(&db.pool)
            .await
            .unwrap();
        }
        let id = sl::message(
            &db,
            &["bob@remote.example"],
            &sl::headers("figures", ""),
            true,
            serde_json::json!({}),
            "encrypt",
        )
        .await;
        assert_eq!(support::run_ids(ENCRYPT, &s.config, &[id]).await, vec!["0"]);
        let r = sl::rows(&db).await;
        assert_eq!(r.len(), 1, "{option:?} {mode:?}: {r:#?}");
        assert_eq!(r[0].stage, "bounce", "{option:?} {mode:?}");
        assert_eq!(r[0].state["bounce"]["enhanced_status"], "5.7.5");
        assert!(r[0].state.get("secure_link").is_none());
        assert!(sl::links(&db).await.is_empty());
    }
}
