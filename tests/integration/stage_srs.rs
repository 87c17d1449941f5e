//! pepsi-stage-srs as a worker process against a real database: the forward stage rewrites a
//! foreign sender (SRS0, or SRS1 for another forwarder's SRS0) and leaves local, null and our
//! own SRS senders alone; the reverse stage turns valid SRS recipients back into the original
//! addresses and bounces forged and expired ones, splitting a message that mixes both.

use std::os::unix::fs::PermissionsExt as _;

use pepsi_stage_srs::srs::{Srs, day_number};
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;

const SRS: &str = env!("CARGO_BIN_EXE_pepsi-stage-srs");
const SECRET: &str = "test-secret-1";

/// The main file and, when `secrets`, a `secrets.d/` fragment with `[srs] SECRETS`.
fn config(db: &TestDb, dir: &tempfile::TempDir, secrets: bool) -> std::path::PathBuf {
    let path = dir.path().join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n[pepsi]\nLOCAL_DOMAINS = example.test\nHOSTNAME = mx.example.test\n\
             [stage-srs]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = next\nSRS_DOMAIN = srs.example.test\n\
             [stage-unsrs]\nPROGRAM = pepsi-stage-srs\nMODE = reverse\nNEXT_STAGE = next\n\
             BOUNCE_STAGE = bounce\nSRS_DOMAIN = srs.example.test\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-bounce\n",
            db.url
        ),
    )
    .unwrap();
    if secrets {
        let sd = dir.path().join("secrets.d");
        std::fs::create_dir(&sd).unwrap();
        let frag = sd.join("10-srs.conf");
        // The first secret signs; the second (a retired one) still verifies.
        std::fs::write(&frag, format!("[srs]\nSECRETS = {SECRET}, old-secret\n")).unwrap();
        std::fs::set_permissions(&frag, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

/// A message running at `stage`, one dsn entry per recipient.
async fn running(db: &TestDb, stage: &str, from: &str, rcpt: &[&str]) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let dsn_rcpt: Vec<Value> = rcpt
        .iter()
        .map(|r| json!({"notify": ["FAILURE"], "orcpt": format!("rfc822;{r}")}))
        .collect();
    let state = json!({"dsn": {"ret": "HDRS", "rcpt": dsn_rcpt}, "keep": 1});
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add($1, $2, 'Subject: x\r\n'::bytea, 'y\r\n'::bytea, $3)",
    )
    .bind(from)
    .bind(&rcpt)
    .bind(&state)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    claim(db, id, stage).await;
    id
}

async fn claim(db: &TestDb, id: i64, stage: &str) {
    support::claim(&db.pool, id, stage).await;
}

async fn fetch(db: &TestDb, id: i64) -> (String, String, String, Vec<String>, Value) {
    sqlx::query_as(
        "SELECT stage, status::text, mail_from, rcpt_to, state FROM pepsi.workqueue \
         WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn run(cfg: std::path::PathBuf, ids: &[i64]) -> Vec<String> {
    support::run_ids(SRS, &cfg, ids).await
}

fn today() -> u64 {
    day_number(std::time::SystemTime::now())
}

#[tokio::test]
async fn forward_rewrites_foreign_senders_only() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, true);
    let ours = Srs::new(&[SECRET], 21).unwrap();
    let elsewhere = Srs::new(&["their-secret"], 21).unwrap();
    let their_srs0 = elsewhere
        .forward("carol@origin.test", "fwd.other.test", today())
        .unwrap();
    let our_srs0 = ours
        .forward("dave@origin.test", "srs.example.test", today())
        .unwrap();

    let foreign = running(&db, "srs", "Alice@Remote.test", &["bob@example.test"]).await;
    let local = running(&db, "srs", "bob@example.test", &["x@remote.test"]).await;
    let null = running(&db, "srs", "", &["bob@example.test"]).await;
    let srs0 = running(&db, "srs", &their_srs0, &["bob@example.test"]).await;
    let own = running(&db, "srs", &our_srs0, &["bob@example.test"]).await;
    assert_eq!(run(cfg, &[foreign, local, null, srs0, own]).await, ["0"; 5]);

    // A foreign sender becomes SRS0 at the SRS domain, which reverses to it.
    let (stage, status, from, rcpt, state) = fetch(&db, foreign).await;
    assert_eq!((stage.as_str(), status.as_str()), ("next", "pending"));
    assert!(from.starts_with("SRS0="), "{from}");
    // The sender is kept as written (libsrs2 does too); only the hash lower-cases.
    assert!(
        from.ends_with("=Remote.test=Alice@srs.example.test"),
        "{from}"
    );
    assert_eq!(ours.reverse(&from, today()).unwrap(), "Alice@Remote.test");
    assert_eq!(rcpt, ["bob@example.test"]);
    assert_eq!(state["srs"]["mail_from"], "Alice@Remote.test");
    assert_eq!(state["keep"], 1);

    // Local, null and our own SRS senders are left alone.
    for (id, want) in [
        (local, "bob@example.test"),
        (null, ""),
        (own, our_srs0.as_str()),
    ] {
        let (stage, status, from, _, state) = fetch(&db, id).await;
        assert_eq!((stage.as_str(), status.as_str()), ("next", "pending"));
        assert_eq!(from, want);
        assert!(state.get("srs").is_none(), "{state}");
    }

    // Another forwarder's SRS0 becomes SRS1, which reverses to that SRS0.
    let (_, _, from, _, _) = fetch(&db, srs0).await;
    assert!(from.starts_with("SRS1="), "{from}");
    assert!(from.contains("=fwd.other.test=="), "{from}");
    assert_eq!(ours.reverse(&from, today()).unwrap(), their_srs0);
}

#[tokio::test]
async fn reverse_restores_valid_and_bounces_forged_recipients() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, true);
    let ours = Srs::new(&[SECRET], 21).unwrap();
    let retired = Srs::new(&["old-secret"], 21).unwrap();
    let valid = ours
        .forward("alice@remote.test", "srs.example.test", today())
        .unwrap();
    let by_old = retired
        .forward("erin@remote.test", "SRS.example.test", today())
        .unwrap();
    let forged = Srs::new(&["attacker"], 21)
        .unwrap()
        .forward("victim@remote.test", "srs.example.test", today())
        .unwrap();

    let expired = ours
        .forward("frank@remote.test", "srs.example.test", today() - 22)
        .unwrap();

    let good = running(&db, "unsrs", "", &[&valid, "bob@example.test", &by_old]).await;
    let bad = running(&db, "unsrs", "", &[&forged, &expired]).await;
    let mixed = running(&db, "unsrs", "", &[&forged, &valid]).await;
    let plain = running(&db, "unsrs", "x@remote.test", &["bob@example.test"]).await;
    assert_eq!(run(cfg.clone(), &[good, bad, mixed, plain]).await, ["0"; 4]);

    // Valid SRS recipients become the originals, one for one; dsn.rcpt unchanged.
    let (stage, status, _, rcpt, state) = fetch(&db, good).await;
    assert_eq!((stage.as_str(), status.as_str()), ("next", "pending"));
    assert_eq!(
        rcpt,
        ["alice@remote.test", "bob@example.test", "erin@remote.test"]
    );
    assert_eq!(state["dsn"]["rcpt"].as_array().unwrap().len(), 3);
    assert_eq!(state["dsn"]["rcpt"][0]["orcpt"], format!("rfc822;{valid}"));

    // A forged one is bounced: permanent, 5.1.1, saying why.
    let (stage, status, _, rcpt, state) = fetch(&db, bad).await;
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    assert_eq!(rcpt, [forged.clone(), expired.clone()]);
    assert_eq!(state["bounce"]["kind"], "permanent");
    assert_eq!(state["bounce"]["enhanced_status"], "5.1.1");
    let why = state["bounce"]["recipients"][&forged]["diagnostic"]
        .as_str()
        .unwrap();
    assert!(why.contains("hash does not verify"), "{why}");
    let why = state["bounce"]["recipients"][&expired]["diagnostic"]
        .as_str()
        .unwrap();
    assert!(why.contains("expired"), "{why}");

    // Mixed: the forged recipient is split off to a sibling at this stage; this row goes on
    // with the reversed valid one.
    let (stage, _, _, rcpt, state) = fetch(&db, mixed).await;
    assert_eq!(stage, "next");
    assert_eq!(rcpt, ["alice@remote.test"]);
    assert_eq!(state["dsn"]["rcpt"][0]["orcpt"], format!("rfc822;{valid}"));
    let sibling: i64 = sqlx::query_scalar(
        "SELECT workqueue_id FROM pepsi.workqueue WHERE workqueue_id NOT IN ($1, $2, $3, $4)",
    )
    .bind(good)
    .bind(bad)
    .bind(mixed)
    .bind(plain)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let (stage, status, _, rcpt, state) = fetch(&db, sibling).await;
    assert_eq!((stage.as_str(), status.as_str()), ("unsrs", "pending"));
    assert_eq!(rcpt, std::slice::from_ref(&forged));
    assert_eq!(state["dsn"]["rcpt"][0]["orcpt"], format!("rfc822;{forged}"));
    claim(&db, sibling, "unsrs").await;
    assert_eq!(run(cfg, &[sibling]).await, ["0"]);
    let (stage, _, _, _, state) = fetch(&db, sibling).await;
    assert_eq!(stage, "bounce");
    assert_eq!(state["bounce"]["enhanced_status"], "5.1.1");

    // No SRS recipient: advanced as it was.
    let (stage, _, from, rcpt, _) = fetch(&db, plain).await;
    assert_eq!(stage, "next");
    assert_eq!(
        (from.as_str(), rcpt),
        ("x@remote.test", vec!["bob@example.test".to_owned()])
    );
}

#[tokio::test]
async fn refuses_to_start_without_secrets() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, false);
    let out = std::process::Command::new(SRS)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SECRETS"), "{err}");
    assert!(out.stdout.is_empty());
}
