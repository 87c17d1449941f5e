//! pepsi-stage-dkim-sign as a worker process against a real database: a message from a
//! domain with an RSA and an Ed25519 key gets two signatures that dkimpy (an independent
//! implementation, fed the public keys without DNS) verifies; only the header block changes
//! (same body row); From is over-signed, so an added From breaks the signatures; mail from a
//! subdomain signs with the parent's keys only when PARENT_DOMAINS says so; mail from a
//! domain without keys advances unsigned. With DATABASE_KEYS the enabled rows of
//! pepsi.signing_key sign too (a disabled or unparsable row does not, a KEYS file shadows a
//! row of the same selector), and a failing key query is a temporary error.

use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;

use crate::support;

const DKIM_SIGN: &str = env!("CARGO_BIN_EXE_pepsi-stage-dkim-sign");

/// Verifies every DKIM-Signature of the message; prints a JSON list of results.
const VERIFY: &str = r#"
head = msg.split(b'\r\n\r\n', 1)[0]
n = sum(1 for l in head.split(b'\r\n') if l.lower().startswith(b'dkim-signature:'))
def check(i):
    try:
        return bool(dkim.DKIM(msg).verify(idx=i, dnsfunc=dnsfunc))
    except dkim.ValidationError as e:
        print('signature %d: %s' % (i, e), file=sys.stderr)
        return False
print(json.dumps([check(i) for i in range(n)]))
"#;

fn verify(message: &[u8], keys: &serde_json::Value) -> Vec<bool> {
    serde_json::from_value(support::dkimpy(VERIFY, keys, message)).unwrap()
}

const BODY: &str = "Hello,  world \r\n\r\nA second   paragraph.\r\n\r\n\r\n";

fn headers(from: &str) -> String {
    format!(
        "From: Alice <{from}>\r\nTo: bob@remote.test\r\nSubject: signed  mail\r\n\
         Date: Mon, 30 Nov 2026 03:00:00 +0000\r\nMessage-ID: <m1@example.test>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n\
         X-Unsigned: not in h=\r\n"
    )
}

/// A message running at stage `dkim`.
async fn running(db: &TestDb, from: &str) -> i64 {
    running_with(db, from, headers(from).as_bytes(), BODY.as_bytes()).await
}

async fn running_with(db: &TestDb, from: &str, headers: &[u8], body: &[u8]) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add($1, ARRAY['bob@remote.test'], $2, $3, '{}'::jsonb)",
    )
    .bind(from)
    .bind(headers)
    .bind(body)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = 'dkim' WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

/// (stage, status, headers, body_id, body)
async fn fetch(db: &TestDb, id: i64) -> (String, String, Vec<u8>, i64, Vec<u8>) {
    sqlx::query_as(
        "SELECT w.stage, w.status::text, w.headers, w.body_id, b.body FROM pepsi.workqueue w \
         JOIN pepsi.workqueue_body b USING (body_id) WHERE w.workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

fn dkim_fields(headers: &[u8]) -> Vec<String> {
    // Unfold, then keep the DKIM-Signature fields.
    let text = String::from_utf8(headers.to_vec())
        .unwrap()
        .replace("\r\n ", " ")
        .replace("\r\n\t", " ");
    text.split("\r\n")
        .filter(|l| l.to_ascii_lowercase().starts_with("dkim-signature:"))
        .map(str::to_owned)
        .collect()
}

fn tag<'a>(field: &'a str, name: &str) -> &'a str {
    field
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .map(str::trim)
        .find_map(|t| t.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {field}"))
}

#[tokio::test]
async fn signs_with_rsa_and_ed25519_and_dkimpy_verifies() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_pub) = support::keypair(dir.path(), "rsa", support::RSA);
    let (ed, ed_pub) = support::keypair(dir.path(), "ed", support::ED25519);
    let (parent, parent_pub) = support::keypair(dir.path(), "parent", support::ED25519);
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\
             [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
             KEYS = example.test:rsa1:{}, Example.Test:ed1:{}, parent.test:p1:{}\n\
             PARENT_DOMAINS = yes\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            db.url,
            rsa.display(),
            ed.display(),
            parent.display()
        ),
    )
    .unwrap();

    let signed = running(&db, "alice@Example.TEST").await;
    let sub = running(&db, "carol@mail.parent.test").await;
    let unsigned = running(&db, "dave@nokey.test").await;
    let before: Vec<_> = [
        fetch(&db, signed).await,
        fetch(&db, sub).await,
        fetch(&db, unsigned).await,
    ]
    .into();

    let input = format!("{signed}\n{sub}\n{unsigned}\n");
    let lines = tokio::task::spawn_blocking(move || support::stage_worker(DKIM_SIGN, &cfg, &input))
        .await
        .unwrap();
    assert_eq!(lines, ["0", "0", "0"]);

    let keys = serde_json::json!({
        "rsa1._domainkey.example.test": ["rsa", rsa_pub],
        "ed1._domainkey.example.test": ["ed25519", ed_pub],
        "p1._domainkey.parent.test": ["ed25519", parent_pub],
    });

    // Two signatures, prepended to the unchanged header block; same body row.
    let (stage, status, hdrs, body_id, body) = fetch(&db, signed).await;
    assert_eq!((stage.as_str(), status.as_str()), ("relay", "pending"));
    assert_eq!(body_id, before[0].3, "the body row is untouched");
    assert_eq!(body, BODY.as_bytes());
    assert!(hdrs.ends_with(&before[0].2), "the old header block follows");
    let fields = dkim_fields(&hdrs);
    assert_eq!(fields.len(), 2, "{fields:?}");
    let algos: Vec<&str> = fields.iter().map(|f| tag(f, "a")).collect();
    assert!(
        algos.contains(&"rsa-sha256") && algos.contains(&"ed25519-sha256"),
        "{algos:?}"
    );
    for f in &fields {
        assert_eq!(tag(f, "d"), "example.test");
        assert_eq!(tag(f, "c"), "relaxed/relaxed");
        let h: Vec<String> = tag(f, "h")
            .split(':')
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        assert_eq!(
            h.iter().filter(|h| *h == "from").count(),
            2,
            "From over-signed: {h:?}"
        );
        for name in [
            "to",
            "subject",
            "date",
            "message-id",
            "mime-version",
            "content-type",
        ] {
            assert!(h.contains(&name.to_owned()), "{name} in {h:?}");
        }
        assert!(!h.contains(&"x-unsigned".to_owned()));
    }
    let mut message = hdrs.clone();
    message.extend_from_slice(b"\r\n");
    message.extend_from_slice(&body);
    assert_eq!(verify(&message, &keys), [true, true]);

    // The verification is real: a changed subject, an added From or a changed body fail;
    // an unsigned header may change.
    let text = String::from_utf8(message.clone()).unwrap();
    let tampered = [
        text.replace("Subject: signed  mail", "Subject: changed"),
        // Above the signed From: without over-signing, h=from would cover only the lowest
        // From and the signature would still verify.
        format!("From: mallory@evil.test\r\n{text}"),
        text.replace("A second", "A third"),
    ];
    for t in &tampered {
        assert_ne!(t, &text);
        assert_eq!(verify(t.as_bytes(), &keys), [false, false], "{t}");
    }
    let harmless = text.replace("X-Unsigned: not in h=", "X-Unsigned: changed");
    assert_eq!(verify(harmless.as_bytes(), &keys), [true, true]);

    // A subdomain signs with its parent's key (PARENT_DOMAINS).
    let (stage, _, hdrs, body_id, body) = fetch(&db, sub).await;
    assert_eq!(stage, "relay");
    assert_eq!(body_id, before[1].3);
    let fields = dkim_fields(&hdrs);
    assert_eq!(fields.len(), 1);
    assert_eq!(tag(&fields[0], "d"), "parent.test");
    let mut message = hdrs;
    message.extend_from_slice(b"\r\n");
    message.extend_from_slice(&body);
    assert_eq!(verify(&message, &keys), [true]);

    // No key for the From domain: advanced exactly as it was.
    let after = fetch(&db, unsigned).await;
    assert_eq!(after.0, "relay");
    assert_eq!((&after.2, after.3), (&before[2].2, before[2].3));
}

#[tokio::test]
async fn an_8bit_message_is_signed_in_its_7bit_form_unless_seven_bit_is_off() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_pub) = support::keypair(dir.path(), "rsa", support::RSA);
    let cfg = dir.path().join("pepsi.conf");
    let stage = |name: &str, seven_bit: &str| {
        format!(
            "[stage-{name}]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
             KEYS = example.test:rsa1:{}\n{seven_bit}\n",
            rsa.display()
        )
    };
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n{}{}[stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            db.url,
            stage("dkim", ""),
            stage("dkim8", "SEVEN_BIT = no"),
        ),
    )
    .unwrap();
    let headers = headers("alice@example.test")
        .replace("us-ascii", "utf-8")
        .replace(
            "MIME-Version: 1.0\r\n",
            "MIME-Version: 1.0\r\nContent-Transfer-Encoding: 8bit\r\n",
        );
    let body = "Grüße aus Zürich, 25 °C.\r\n".as_bytes();
    let converted = running_with(&db, "alice@example.test", headers.as_bytes(), body).await;
    let kept = running_with(&db, "alice@example.test", headers.as_bytes(), body).await;
    sqlx::query("UPDATE pepsi.workqueue SET stage = 'dkim8' WHERE workqueue_id = $1")
        .bind(kept)
        .execute(&db.pool)
        .await
        .unwrap();
    let before = fetch(&db, converted).await;

    let input = format!("{converted}\n{kept}\n");
    let lines = tokio::task::spawn_blocking(move || support::stage_worker(DKIM_SIGN, &cfg, &input))
        .await
        .unwrap();
    assert_eq!(lines, ["0", "0"]);
    let keys = serde_json::json!({"rsa1._domainkey.example.test": ["rsa", rsa_pub]});

    // Converted: quoted-printable, a body row of its own, and the signature covers that form.
    let (stage, _, hdrs, body_id, new_body) = fetch(&db, converted).await;
    assert_eq!(stage, "relay");
    assert_ne!(body_id, before.3, "the rewritten body is a new row");
    assert!(
        new_body.is_ascii(),
        "{}",
        String::from_utf8_lossy(&new_body)
    );
    assert_eq!(
        new_body,
        b"Gr=C3=BC=C3=9Fe aus Z=C3=BCrich, 25 =C2=B0C.\r\n"
    );
    let text = String::from_utf8(hdrs.clone()).unwrap();
    assert!(
        text.contains("Content-Transfer-Encoding: quoted-printable\r\n")
            && !text.contains("Content-Transfer-Encoding: 8bit"),
        "{text}"
    );
    let mut message = hdrs;
    message.extend_from_slice(b"\r\n");
    message.extend_from_slice(&new_body);
    assert_eq!(verify(&message, &keys), [true]);

    // SEVEN_BIT = no: signed as it is, same body row.
    let (_, _, hdrs, kept_body_id, kept_body) = fetch(&db, kept).await;
    assert_eq!(kept_body, body);
    assert_ne!(kept_body_id, body_id);
    assert!(
        String::from_utf8(hdrs.clone())
            .unwrap()
            .contains("Content-Transfer-Encoding: 8bit")
    );
    let mut message = hdrs;
    message.extend_from_slice(b"\r\n");
    message.extend_from_slice(&kept_body);
    assert_eq!(verify(&message, &keys), [true]);
}

#[tokio::test]
async fn an_unreadable_key_file_stops_the_worker_naming_it() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\
             [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{}\n",
            db.url,
            missing.display()
        ),
    )
    .unwrap();
    let out = Command::new(DKIM_SIGN)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
    assert!(stderr.contains("[stage-dkim] KEYS"), "{stderr}");
}

/// Stores a key in pepsi.signing_key as the operator does: as the config role.
async fn store_key(
    db: &TestDb,
    domain: &str,
    selector: &str,
    pem: &std::path::Path,
    enabled: bool,
) {
    let pem = std::fs::read_to_string(pem).unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE \"pepsi-config\"")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pepsi.signing_key (domain, selector, private_key, enabled) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(domain)
    .bind(selector)
    .bind(pem)
    .bind(enabled)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn keys_stored_in_the_database_sign_and_disabled_or_broken_rows_do_not() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_pub) = support::keypair(dir.path(), "rsa", support::RSA);
    let (ed, ed_pub) = support::keypair(dir.path(), "ed", support::ED25519);
    let (off, _) = support::keypair(dir.path(), "off", support::ED25519);
    let (ec, _) = support::keypair(dir.path(), "ec", pepsi_testkit::keys::EC_P256);
    let (file, file_pub) = support::keypair(dir.path(), "file", support::ED25519);
    let (row, _) = support::keypair(dir.path(), "row", support::ED25519);
    store_key(&db, "example.test", "rsa1", &rsa, true).await;
    store_key(&db, "example.test", "ed1", &ed, true).await;
    store_key(&db, "example.test", "off1", &off, false).await;
    // PEM armour around a P-256 key: the table accepts it, DKIM cannot sign with it.
    store_key(&db, "example.test", "bad1", &ec, true).await;
    // The same domain and selector as a KEYS file: the file signs.
    store_key(&db, "other.test", "s1", &row, true).await;

    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\
             [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
             DATABASE_KEYS = yes\n\
             [stage-dkimf]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
             DATABASE_KEYS = yes\nKEYS = other.test:s1:{}\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            db.url,
            file.display()
        ),
    )
    .unwrap();
    let first = running(&db, "alice@example.test").await;
    let second = running(&db, "alice@example.test").await;
    let other = running(&db, "bob@other.test").await;
    support::claim(&db.pool, other, "dkimf").await;

    let input = format!("{first}\n{second}\n{other}\n");
    let (lines, log) =
        tokio::task::spawn_blocking(move || support::stage_worker_logged(DKIM_SIGN, &cfg, &input))
            .await
            .unwrap();
    assert_eq!(lines, ["0", "0", "0"], "{log}");

    let keys = serde_json::json!({
        "rsa1._domainkey.example.test": ["rsa", rsa_pub],
        "ed1._domainkey.example.test": ["ed25519", ed_pub],
        "s1._domainkey.other.test": ["ed25519", file_pub],
    });
    for id in [first, second] {
        let (stage, _, hdrs, _, body) = fetch(&db, id).await;
        assert_eq!(stage, "relay");
        let fields = dkim_fields(&hdrs);
        let mut selectors: Vec<&str> = fields.iter().map(|f| tag(f, "s")).collect();
        selectors.sort();
        assert_eq!(
            selectors,
            ["ed1", "rsa1"],
            "neither off1 (disabled) nor bad1"
        );
        let mut message = hdrs.clone();
        message.extend_from_slice(b"\r\n");
        message.extend_from_slice(&body);
        assert_eq!(verify(&message, &keys), [true, true]);
    }
    // Read once per worker: the broken row is reported once, naming domain and selector.
    let reports: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("bad1._domainkey.example.test"))
        .collect();
    assert_eq!(reports.len(), 1, "{log}");
    assert!(
        reports[0].contains("ERROR") && reports[0].contains("not a usable private key"),
        "{log}"
    );
    assert!(!log.contains("off1"), "a disabled row is not read: {log}");

    // The file's key signs for other.test; the row with the same selector does not.
    let (_, _, hdrs, _, body) = fetch(&db, other).await;
    let fields = dkim_fields(&hdrs);
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert_eq!(tag(&fields[0], "s"), "s1");
    let mut message = hdrs;
    message.extend_from_slice(b"\r\n");
    message.extend_from_slice(&body);
    assert_eq!(verify(&message, &keys), [true]);
    assert!(
        log.lines()
            .any(|l| l.contains("s1._domainkey.other.test") && l.contains("KEYS has a file")),
        "{log}"
    );
}

#[tokio::test]
async fn a_failing_key_query_is_a_temporary_error_and_nothing_goes_out_unsigned() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\
             [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
             DATABASE_KEYS = yes\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    // The query fails as it would if the table were out of reach.
    sqlx::query("ALTER TABLE pepsi.signing_key RENAME TO signing_key_elsewhere")
        .execute(&db.pool)
        .await
        .unwrap();
    let id = running(&db, "alice@example.test").await;
    let before = fetch(&db, id).await;
    let input = format!("{id}\n");
    let (lines, log) =
        tokio::task::spawn_blocking(move || support::stage_worker_logged(DKIM_SIGN, &cfg, &input))
            .await
            .unwrap();
    assert_eq!(lines.len(), 1, "{log}");
    let (code, report) = lines[0].split_once(' ').unwrap();
    assert_eq!(code, "1");
    let report: serde_json::Value = serde_json::from_str(report).unwrap();
    assert_eq!(report["temporary"], true, "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("pepsi.signing_key"),
        "{report}"
    );
    let after = fetch(&db, id).await;
    assert_eq!(after, before, "neither signed nor advanced");
}

/// RFC 8058 section 4: mail offering one-click unsubscription has `List-Unsubscribe` and
/// `List-Unsubscribe-Post` under the signature (a missing `-Post` signed as absent, so none
/// can be added); other mail does not name them, so a list elsewhere may add its own.
#[tokio::test]
async fn one_click_fields_are_signed_only_in_mail_that_offers_them() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (ed, ed_pub) = support::keypair(dir.path(), "ed", support::ED25519);
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\
             [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
             KEYS = example.test:ed1:{}\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            db.url,
            ed.display()
        ),
    )
    .unwrap();
    let from = "team@example.test";
    let one_click = format!(
        "{}List-Unsubscribe: <https://lists.example.test/lists/unsubscribe/0a1b>, \
         <mailto:team-leave@example.test>\r\n\
         List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n",
        headers(from)
    );
    let mailto_only = format!(
        "{}List-Unsubscribe: <mailto:team-leave@example.test>\r\n",
        headers(from)
    );
    let ids = [
        running_with(&db, from, one_click.as_bytes(), BODY.as_bytes()).await,
        running_with(&db, from, mailto_only.as_bytes(), BODY.as_bytes()).await,
        running(&db, from).await,
    ];
    let input: String = ids.iter().map(|i| format!("{i}\n")).collect();
    let lines = tokio::task::spawn_blocking(move || support::stage_worker(DKIM_SIGN, &cfg, &input))
        .await
        .unwrap();
    assert_eq!(lines, ["0", "0", "0"]);
    let keys = serde_json::json!({ "ed1._domainkey.example.test": ["ed25519", ed_pub] });
    let mut messages = Vec::new();
    for id in ids {
        let (_, _, hdrs, _, body) = fetch(&db, id).await;
        let fields = dkim_fields(&hdrs);
        assert_eq!(fields.len(), 1);
        let h: Vec<String> = tag(&fields[0], "h")
            .split(':')
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        let mut message = hdrs;
        message.extend_from_slice(b"\r\n");
        message.extend_from_slice(&body);
        assert_eq!(verify(&message, &keys), [true]);
        messages.push((String::from_utf8(message).unwrap(), h));
    }
    for (text, h) in &messages[..2] {
        for name in ["list-unsubscribe", "list-unsubscribe-post"] {
            assert!(h.contains(&name.to_owned()), "{name} in {h:?}");
        }
        let changed = text.replace("0a1b>", "ffff>").replace(
            "<mailto:team-leave@example.test>\r\n",
            "<mailto:other-leave@example.test>\r\n",
        );
        assert_ne!(&changed, text);
        assert_eq!(verify(changed.as_bytes(), &keys), [false], "{changed}");
    }
    // A -Post added to the mailto-only message breaks its signature.
    let added = messages[1].0.replace(
        "List-Unsubscribe: <mailto:",
        "List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\nList-Unsubscribe: <mailto:",
    );
    assert_eq!(verify(added.as_bytes(), &keys), [false]);
    // Plain mail: neither is named, so a list that adds them keeps the signature valid.
    let (plain, h) = &messages[2];
    assert!(!h.iter().any(|n| n.starts_with("list-")), "{h:?}");
    let listed = plain.replace(
        "X-Unsigned:",
        "List-Unsubscribe: <mailto:x-leave@lists.example.net>\r\nX-Unsigned:",
    );
    assert_eq!(verify(listed.as_bytes(), &keys), [true]);
}
