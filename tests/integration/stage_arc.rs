//! pepsi-stage-arc as a worker process, fed by the real ingress (its verdicts from a
//! dnsmasq the test starts) and checked by dkimpy, an independent ARC implementation given
//! the public keys without DNS: a first hop seals `i=1; cv=none` with an Ed25519 and with
//! an RSA key and the chain verifies; the AAR repeats the ingress verdicts under its
//! authserv-id; a changed header fails verification; the sealed message, received again,
//! is verified `arc=pass` by the ingress and sealed `i=2; cv=pass`, which dkimpy accepts;
//! tampered with on the way it gets `cv=fail`, and nobody seals after that. Messages the
//! stage cannot or must not seal advance unchanged, and a bad key file stops the worker
//! naming the option and the file.

use std::path::Path;
use std::process::{Command, Stdio};

use mail_auth::common::crypto::Ed25519Key;
use mail_auth::common::headers::HeaderWriter as _;
use mail_auth::dkim::DkimSigner;
use pepsi_smtp::encoding::base64_encode;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::ingress::{Client, Dns, Ingress, row};

const ARC: &str = env!("CARGO_BIN_EXE_pepsi-stage-arc");

/// dkimpy's chain validation: `cv` is "pass", "fail" or null (a chain that ended with a
/// cv=fail seal), `sets` the per-instance checks, newest first. dkimpy admits only
/// rsa-sha256 in ARC fields (its `ARC_HASH_ALGORITHMS`); the script lets ARC use the
/// Ed25519-SHA256 of its DKIM verifier (RFC 8463) too, so both key types are checked by
/// dkimpy's own code.
const ARC_VERIFY: &str = r#"
dkim.ARC_HASH_ALGORITHMS[b'ed25519-sha256'] = dkim.HASH_ALGORITHMS[b'ed25519-sha256']
cv, results, reason = dkim.arc_verify(msg, dnsfunc=dnsfunc)
print(json.dumps({"cv": cv.decode() if cv is not None else None, "reason": reason,
    "sets": [{"i": r["instance"], "ams": r.get("ams-valid"), "as": r.get("as-valid"),
              "cv": r["cv"].decode()} for r in results]}))
"#;

/// Checks the newest ARC-Seal over its own set only (RFC 8617 §5.1.2, the scope of a
/// `cv=fail` seal): the older sets are cut out and dkimpy's signature check is run on the
/// seal with `h=` results and message signature. Prints true or false.
const OWN_SET_SEAL: &str = r#"
import re
head, body = msg.split(b'\r\n\r\n', 1)
fields = re.split(rb'\r\n(?![ \t])', head)
newest = max(int(m.group(1)) for f in fields if f.lower().startswith(b'arc-')
             for m in [re.search(rb'\bi=(\d+)', f)])
keep = [f for f in fields if not f.lower().startswith(b'arc-')
        or int(re.search(rb'\bi=(\d+)', f).group(1)) == newest]
a = dkim.ARC(b'\r\n'.join(keep) + b'\r\n\r\n' + body)
seal = [v for (n, v) in a.headers if n.lower() == b'arc-seal'][0]
sig = dkim.util.parse_tag_value(seal)
sig[b'c'] = b'relaxed/relaxed'  # ARC seals are always relaxed (RFC 8617 §5.1.1)
print(json.dumps(bool(a.verify_sig(sig, [b'arc-authentication-results',
    b'arc-message-signature'], (b'ARC-Seal', seal), dnsfunc))))
"#;

fn arc_verify(message: &[u8], keys: &Value) -> Value {
    support::dkimpy(ARC_VERIFY, keys, message)
}

/// The TXT record of an Ed25519 key for dnsmasq: the raw key is the DER's last 32 bytes.
fn ed25519_record(public_der: &Path) -> String {
    let der = std::fs::read(public_der).unwrap();
    format!(
        "v=DKIM1; k=ed25519; p={}",
        base64_encode(&der[der.len() - 32..])
    )
}

/// The header block unfolded, one field per line.
fn unfolded(headers: &[u8]) -> Vec<String> {
    String::from_utf8(headers.to_vec())
        .unwrap()
        .replace("\r\n ", " ")
        .replace("\r\n\t", " ")
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The unfolded fields named `name`, top first.
fn named(headers: &[u8], name: &str) -> Vec<String> {
    let prefix = format!("{}:", name.to_ascii_lowercase());
    unfolded(headers)
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().starts_with(&prefix))
        .collect()
}

fn message(r: &support::ingress::Row) -> Vec<u8> {
    let mut m = r.headers.clone();
    m.extend_from_slice(b"\r\n");
    m.extend_from_slice(&r.body);
    m
}

const BODY: &str = "Hello,  world \r\n\r\nA second   paragraph.\r\n";

#[tokio::test]
async fn sealed_chains_verify_with_dkimpy_across_two_hops_and_end_after_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (ed, ed_pub) = support::keypair(dir.path(), "ed", support::ED25519);
    let (rsa, rsa_pub) = support::keypair(dir.path(), "rsa", support::RSA);
    let origin_key = Ed25519Key::generate_pkcs8().unwrap();
    let origin_public = Ed25519Key::from_pkcs8_der(&origin_key)
        .unwrap()
        .public_key();
    let dns = Dns::start(&[
        "--txt-record=origin.test,v=spf1 ip4:127.0.0.1 -all".into(),
        format!(
            "--txt-record=sel._domainkey.origin.test,v=DKIM1; k=ed25519; p={}",
            base64_encode(&origin_public)
        ),
        "--txt-record=_dmarc.origin.test,v=DMARC1; p=reject".into(),
        // The ingress verifies the first hop's Ed25519 seal when the message comes back.
        format!(
            "--txt-record=ed1._domainkey.fwd.test,{}",
            ed25519_record(&ed_pub)
        ),
    ]);
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 5s\nAUTHSERV_ID = mx.fwd.test\n",
            dns.port
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\
             [stage-arc-ed]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = relay\n\
             DOMAIN = fwd.test\nSELECTOR = ed1\nKEY_FILE = {}\n\
             [stage-arc-rsa]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = relay\n\
             DOMAIN = fwd.test\nSELECTOR = rsa1\nKEY_FILE = {}\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            ingress.db.url,
            ed.display(),
            rsa.display()
        ),
    )
    .unwrap();
    let keys = json!({
        "ed1._domainkey.fwd.test": ["ed25519", ed_pub],
        "rsa1._domainkey.fwd.test": ["rsa", rsa_pub],
    });
    let pool = &ingress.db.pool;

    // The author's message, DKIM-signed by origin.test, arrives at the forwarder.
    let original = format!(
        "From: Alice <alice@origin.test>\r\nTo: list@example.test\r\nSubject: forwarded  mail\r\n\
         Date: Mon, 30 Nov 2026 03:00:00 +0000\r\nMessage-ID: <m1@origin.test>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n{BODY}"
    );
    let signature = DkimSigner::from_key(Ed25519Key::from_pkcs8_der(&origin_key).unwrap())
        .domain("origin.test")
        .selector("sel")
        .headers(["From", "To", "Subject", "Date", "Message-ID"])
        .sign(original.as_bytes())
        .unwrap();
    let original = format!("{}{original}", signature.to_header());
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mail.origin.test", 250).await;
    let to_ed = c
        .deliver(
            "alice@origin.test",
            &["list@example.test"],
            original.as_bytes(),
        )
        .await;
    let to_rsa = c
        .deliver(
            "alice@origin.test",
            &["list@example.test"],
            original.as_bytes(),
        )
        .await;
    let arrived = row(&ingress.db, to_ed).await;
    assert_eq!(arrived.state["auth"]["dkim"][0]["result"], "pass");
    assert_eq!(arrived.state["auth"]["arc"]["result"], "none");
    // Each message's own header block (their Received fields may differ by a second).
    let before = [
        arrived.headers.clone(),
        row(&ingress.db, to_rsa).await.headers,
    ];

    // First hop: i=1, cv=none, one message per key type.
    support::claim(pool, to_ed, "arc-ed").await;
    support::claim(pool, to_rsa, "arc-rsa").await;
    assert_eq!(
        support::run_ids(ARC, &cfg, &[to_ed, to_rsa]).await,
        ["0", "0"]
    );
    let mut first_hop = Vec::new();
    for ((id, algorithm), old) in [(to_ed, "ed25519-sha256"), (to_rsa, "rsa-sha256")]
        .into_iter()
        .zip(&before)
    {
        let r = row(&ingress.db, id).await;
        assert_eq!((r.stage.as_str(), r.status.as_str()), ("relay", "pending"));
        assert_eq!(r.body, arrived.body, "the body is untouched");
        assert!(r.headers.ends_with(old), "the old block follows");
        let seal = named(&r.headers, "ARC-Seal");
        assert_eq!(seal.len(), 1, "{seal:?}");
        assert!(seal[0].starts_with("ARC-Seal: i=1;"), "{}", seal[0]);
        assert!(seal[0].contains("cv=none;"), "{}", seal[0]);
        assert!(seal[0].contains(&format!("a={algorithm};")), "{}", seal[0]);
        let ams = named(&r.headers, "ARC-Message-Signature");
        assert!(ams[0].contains(&format!("a={algorithm};")), "{}", ams[0]);

        // The AAR repeats the ingress's verdicts under its authserv-id.
        let aar = named(&r.headers, "ARC-Authentication-Results");
        assert_eq!(aar.len(), 1);
        let aar = &aar[0];
        assert!(
            aar.starts_with("ARC-Authentication-Results: i=1; mx.fwd.test;"),
            "{aar}"
        );
        for verdict in [
            "spf=pass smtp.mailfrom=origin.test",
            "dkim=pass header.d=origin.test header.s=sel",
            "dmarc=pass header.from=origin.test policy.dmarc=reject",
            "arc=none",
        ] {
            assert!(aar.contains(verdict), "{verdict} in {aar}");
            let method = verdict.split(' ').next().unwrap();
            let ar = &named(&r.headers, "Authentication-Results")[0];
            assert!(ar.contains(method), "the ingress said {method} too: {ar}");
        }

        let sealed = message(&r);
        let v = arc_verify(&sealed, &keys);
        assert_eq!(v["cv"], "pass", "{v}");
        assert_eq!(
            v["sets"],
            json!([{"i": 1, "ams": true, "as": true, "cv": "none"}])
        );

        // The verification is real: a header the message signature covers, or the
        // sealed results, changed after sealing.
        let text = String::from_utf8(sealed.clone()).unwrap();
        for tampered in [
            text.replace("Subject: forwarded  mail", "Subject: altered"),
            text.replace("dmarc=pass", "dmarc=none"),
            text.replace("A second", "A third"),
        ] {
            assert_ne!(tampered, text);
            let v = arc_verify(tampered.as_bytes(), &keys);
            assert_eq!(v["cv"], "fail", "{v}");
        }
        first_hop.push(text);
    }

    // Second hop: the Ed25519-sealed message comes back to the ingress (as to a second
    // forwarder), intact and with its subject altered on the way.
    let sealed = &first_hop[0];
    let altered = sealed.replace("Subject: forwarded  mail", "Subject: altered");
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.fwd.test", 250).await;
    let intact = c
        .deliver(
            "alice@origin.test",
            &["list@example.test"],
            sealed.as_bytes(),
        )
        .await;
    let broken = c
        .deliver(
            "alice@origin.test",
            &["list@example.test"],
            altered.as_bytes(),
        )
        .await;
    assert_eq!(
        row(&ingress.db, intact).await.state["auth"]["arc"]["result"],
        "pass"
    );
    assert_eq!(
        row(&ingress.db, broken).await.state["auth"]["arc"]["result"],
        "fail"
    );
    support::claim(pool, intact, "arc-rsa").await;
    support::claim(pool, broken, "arc-rsa").await;
    assert_eq!(
        support::run_ids(ARC, &cfg, &[intact, broken]).await,
        ["0", "0"]
    );

    let r = row(&ingress.db, intact).await;
    let seals = named(&r.headers, "ARC-Seal");
    assert_eq!(seals.len(), 2);
    assert!(
        seals[0].starts_with("ARC-Seal: i=2;") && seals[0].contains("cv=pass;"),
        "{}",
        seals[0]
    );
    let aar = &named(&r.headers, "ARC-Authentication-Results")[0];
    assert!(aar.starts_with("ARC-Authentication-Results: i=2; mx.fwd.test;"));
    assert!(aar.contains("arc=pass"), "{aar}");
    let v = arc_verify(&message(&r), &keys);
    assert_eq!(v["cv"], "pass", "{v}");
    assert_eq!(
        v["sets"],
        json!([
            {"i": 2, "ams": true, "as": true, "cv": "pass"},
            {"i": 1, "ams": true, "as": true, "cv": "none"},
        ])
    );
    assert_eq!(
        support::dkimpy(OWN_SET_SEAL, &keys, &message(&r)),
        false,
        "a cv=pass seal covers the whole chain, not its own set alone"
    );

    // The broken chain is sealed cv=fail: the new message signature holds, the chain does
    // not validate, and it has ended.
    let r = row(&ingress.db, broken).await;
    let seals = named(&r.headers, "ARC-Seal");
    assert!(
        seals[0].starts_with("ARC-Seal: i=2;") && seals[0].contains("cv=fail;"),
        "{}",
        seals[0]
    );
    let aar = &named(&r.headers, "ARC-Authentication-Results")[0];
    assert!(aar.contains("arc=fail"), "{aar}");
    let v = arc_verify(&message(&r), &keys);
    assert_ne!(v["cv"], "pass", "{v}");
    assert_eq!(v["sets"][0]["i"], 2);
    assert_eq!(v["sets"][0]["cv"], "fail");
    assert_eq!(v["sets"][0]["ams"], true, "{v}");
    assert_eq!(
        support::dkimpy(OWN_SET_SEAL, &keys, &message(&r)),
        true,
        "the cv=fail seal signs its own set"
    );

    // Third hop: nobody adds to a chain that ended with cv=fail.
    let ended = message(&r);
    let again = c
        .deliver("alice@origin.test", &["list@example.test"], &ended)
        .await;
    let before = row(&ingress.db, again).await;
    assert_eq!(before.state["auth"]["arc"]["result"], "fail");
    support::claim(pool, again, "arc-rsa").await;
    assert_eq!(support::run_ids(ARC, &cfg, &[again]).await, ["0"]);
    let after = row(&ingress.db, again).await;
    assert_eq!(after.stage, "relay");
    assert_eq!(after.headers, before.headers, "not sealed again");
}

/// A message queued at `stage` with `headers` and `state`, as the tests below need it.
async fn queued(db: &TestDb, stage: &str, headers: &str, state: Value) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('a@origin.test', ARRAY['b@remote.test'], $1, $2, $3)",
    )
    .bind(headers.as_bytes())
    .bind(BODY.as_bytes())
    .bind(state)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    support::claim(&db.pool, id, stage).await;
    id
}

async fn headers_and_stage(db: &TestDb, id: i64) -> (Vec<u8>, String) {
    sqlx::query_as("SELECT headers, stage FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn messages_that_cannot_or_must_not_be_sealed_advance_unchanged() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (ed, ed_pub) = support::keypair(dir.path(), "ed", support::ED25519);
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {url}\n\
             [stage-arc]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = relay\n\
             DOMAIN = fwd.test\nSELECTOR = ed1\nKEY_FILE = {key}\n\
             [stage-arc-all]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = relay\n\
             DOMAIN = fwd.test\nSELECTOR = ed1\nKEY_FILE = {key}\n\
             SEAL = all\nAUTHSERV_ID = submit.fwd.test\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            url = db.url,
            key = ed.display(),
        ),
    )
    .unwrap();
    let plain = "From: a@origin.test\r\nTo: b@remote.test\r\nSubject: s\r\n";
    let verified = json!({"auth": {"arc": {"result": "none"}}});
    let cases = [
        // (stage, headers, state, expected log line)
        (
            "arc",
            "From: a@origin.test\r\nthis line is not a field\r\nSubject: s\r\n".to_owned(),
            verified.clone(),
            "not ARC sealed: header line 2 is not a field",
        ),
        (
            "arc",
            format!("ARC-Seal: cv=none; d=x.test; s=s; b=AAAA\r\n{plain}"),
            json!({"auth": {"arc": {"result": "fail"}}}),
            "not ARC sealed: ARC-Seal field without a valid i= tag",
        ),
        // Locally submitted (no state.auth) and SEAL = forwarded: not sealed, not logged
        // above debug.
        (
            "arc",
            plain.to_owned(),
            json!({"origin": {"auth_user": "a@origin.test"}}),
            "",
        ),
    ];
    let mut ids = Vec::new();
    for (stage, headers, state, _) in &cases {
        ids.push(queued(&db, stage, headers, state.clone()).await);
    }
    // SEAL = all seals the local message, under AUTHSERV_ID, naming the SMTP AUTH user.
    let local = queued(
        &db,
        "arc-all",
        plain,
        json!({"origin": {"auth_user": "a@origin.test", "client_addr": "127.0.0.1"}}),
    )
    .await;
    ids.push(local);

    let input: String = ids.iter().map(|i| format!("{i}\n")).collect();
    let cfg2 = cfg.clone();
    let (lines, log) =
        tokio::task::spawn_blocking(move || support::stage_worker_logged(ARC, &cfg2, &input))
            .await
            .unwrap();
    assert_eq!(lines, ["0", "0", "0", "0"], "{log}");
    for ((_, headers, _, want), id) in cases.iter().zip(&ids) {
        let (after, stage) = headers_and_stage(&db, *id).await;
        assert_eq!(stage, "relay");
        assert_eq!(after, headers.as_bytes(), "advanced unchanged");
        assert!(log.contains(want), "{want:?} in {log}");
    }
    assert_eq!(log.matches("not ARC sealed").count(), 2, "{log}");
    assert!(
        log.contains("is an Ed25519 key: many ARC validators accept only rsa-sha256"),
        "{log}"
    );

    let (after, stage) = headers_and_stage(&db, local).await;
    assert_eq!(stage, "relay");
    let aar = &named(&after, "ARC-Authentication-Results")[0];
    assert_eq!(
        aar,
        "ARC-Authentication-Results: i=1; submit.fwd.test; auth=pass smtp.auth=a@origin.test"
    );
    let mut m = after.clone();
    m.extend_from_slice(b"\r\n");
    m.extend_from_slice(BODY.as_bytes());
    let v = arc_verify(&m, &json!({"ed1._domainkey.fwd.test": ["ed25519", ed_pub]}));
    assert_eq!(v["cv"], "pass", "{v}");
}

#[tokio::test]
async fn a_missing_or_wrong_key_file_stops_the_worker_naming_option_and_file() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let (ec, _) = support::keypair(dir.path(), "ec", pepsi_testkit::keys::EC_P256);
    for (key, why) in [(&missing, "cannot read"), (&ec, "not a usable private key")] {
        let cfg = dir.path().join("pepsi.conf");
        std::fs::write(
            &cfg,
            format!(
                "[database]\nURL = {}\n\
                 [stage-arc]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = relay\n\
                 DOMAIN = fwd.test\nSELECTOR = s1\nKEY_FILE = {}\n",
                db.url,
                key.display()
            ),
        )
        .unwrap();
        let out = Command::new(ARC)
            .args(["worker", "-c"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("[stage-arc] KEY_FILE"), "{stderr}");
        assert!(stderr.contains(&key.display().to_string()), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    }
}
