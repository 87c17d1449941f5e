//! `pepsi-stage-auto-pay worker` against a real database, the real pepsi-helper-auto-pay (run
//! as root, as its bit makes it, dropping to a useradd account), the test wallet and the
//! loopback merchant stand-in (support::taler, declared test peers): a challenge from
//! someone the user wrote to, whose domain vouched for it, is paid as the user within the
//! limits and filed away, once; over a limit, from a stranger, forged in a correspondent's
//! name or malformed, it is not paid, the refusal recorded and
//! reported to the user, and the challenge delivered.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use pepsi_testkit::TestDb;
use serde_json::json;

use crate::support;
use crate::support::taler::{Account, Merchant};

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-auto-pay");
const HELPER: &str = env!("CARGO_BIN_EXE_pepsi-helper-auto-pay");

/// The stage's configuration, and the helper's wrapper that hands it the same file (the
/// installed helper reads /etc/pepsi/pepsi.conf through its bit).
fn config(db: &TestDb, dir: &Path) -> PathBuf {
    let path = dir.join("pepsi.conf");
    let wrapper = dir.join("helper");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {HELPER} -c {} \"$@\"\n", path.display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\nLOCAL_DOMAINS = example.test\n\n\
             [stage-autopay]\nPROGRAM = pepsi-stage-auto-pay\nNEXT_STAGE = next\n\
             NOTICE_STAGE = notices\nHELPER = {}\nHELPER_TIMEOUT = 30s\n\n\
             [stage-notices]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n\n\
             [pepsi-helper-auto-pay]\nWALLET = /usr/bin/python3 {}\nTIMEOUT = 20s\n",
            db.url,
            wrapper.display(),
            support::taler::wallet_program().display()
        ),
    )
    .unwrap();
    path
}

/// A challenge from `from` to `to` with `postage` header lines, at the stage, its From
/// domain vouched for by DKIM (as the ingress records it).
async fn challenge(db: &TestDb, from: &str, to: &str, postage: &str) -> i64 {
    let domain = from.rsplit('@').next().unwrap();
    let auth = json!({"auth": {"dkim": [{"result": "pass", "domain": domain}]}});
    challenge_with(db, from, to, postage, auth).await
}

/// The same with `state` as the ingress left it.
async fn challenge_with(
    db: &TestDb,
    from: &str,
    to: &str,
    postage: &str,
    state: serde_json::Value,
) -> i64 {
    let headers = format!(
        "From: {from}\r\nTo: {to}\r\nSubject: Please confirm your message\r\n\
         Auto-Submitted: auto-replied\r\n{postage}"
    );
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add('', $1, $2, $3, $4)")
        .bind(vec![to.to_owned()])
        .bind(headers.as_bytes())
        .bind(b"Pay or confirm.\r\n".as_slice())
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "autopay").await;
    id
}

fn postage(uri: &str, amount: &str) -> String {
    format!("X-Pepsi-Postage: {uri}\r\nX-Pepsi-Postage-Amount: {amount}\r\n")
}

async fn at(db: &TestDb, id: i64) -> Option<(String, String)> {
    sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

/// The payments recorded: (payee, order, amount, status, reason).
async fn payments(db: &TestDb) -> Vec<(String, String, String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT payee, order_id, currency || ':' || trim_scale(value)::text, status, reason \
         FROM pepsi.auto_pay_payment ORDER BY payment_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The notices queued for the user: their bodies.
async fn notices(db: &TestDb, user: &str) -> Vec<String> {
    let rows: Vec<(Vec<String>, Vec<u8>)> = sqlx::query_as(
        "SELECT q.rcpt_to, b.body FROM pepsi.workqueue q JOIN pepsi.workqueue_body b USING (body_id) \
         WHERE q.stage = 'notices' ORDER BY q.workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(rcpt, body)| {
            assert_eq!(rcpt, [user]);
            String::from_utf8(body).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn challenges_are_paid_as_the_user_within_limits_and_refusals_are_reported() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let merchant = Merchant::start(dir.path());
    let user = Account::create("s");
    let login = format!("{}@example.test", user.name);
    let cfg = config(&db, dir.path());
    sqlx::query("INSERT INTO pepsi.settings (address, name, value) VALUES ($1, 'auto_pay', $2)")
        .bind(&login)
        .bind(json!({"per_payment": "KUDOS:1", "per_month": "KUDOS:1"}))
        .execute(&db.pool)
        .await
        .unwrap();
    // The user wrote to bob lately (the whitelist stage learnt it from their mail).
    sqlx::query(
        "INSERT INTO pepsi.whitelist (mailbox, sender, origin) VALUES ($1, 'bob@b.test', 'sent')",
    )
    .bind(&login)
    .execute(&db.pool)
    .await
    .unwrap();

    // Paid as the user, filed away; the same challenge again is not paid twice.
    let (o1, uri1) = merchant.order();
    let id = challenge(&db, "bob@b.test", &login, &postage(&uri1, "KUDOS:0.5")).await;
    support::run_ids(STAGE, &cfg, &[id]).await;
    assert_eq!(at(&db, id).await, None, "a paid challenge is filed away");
    assert!(merchant.paid(&o1));
    assert_eq!(
        user.wallet_log(),
        [(user.uid, uri1.clone())],
        "the wallet ran as the user"
    );
    assert_ne!(user.uid, 0);
    let again = challenge(&db, "bob@b.test", &login, &postage(&uri1, "KUDOS:0.5")).await;
    support::run_ids(STAGE, &cfg, &[again]).await;
    assert_eq!(at(&db, again).await, None);
    assert_eq!(user.wallet_log().len(), 1, "paid once");

    // The second half of the month's limit, then nothing more this month.
    let (o2, uri2) = merchant.order();
    let id = challenge(&db, "bob@b.test", &login, &postage(&uri2, "KUDOS:0.5")).await;
    support::run_ids(STAGE, &cfg, &[id]).await;
    assert!(merchant.paid(&o2));
    let (o3, uri3) = merchant.order();
    let over_month = challenge(&db, "bob@b.test", &login, &postage(&uri3, "KUDOS:0.5")).await;
    support::run_ids(STAGE, &cfg, &[over_month]).await;
    assert!(!merchant.paid(&o3));
    assert_eq!(
        at(&db, over_month).await,
        Some(("next".into(), "pending".into())),
        "an unpaid challenge reaches the user"
    );
    // Over the limit of one payment, and from someone the user did not write to.
    let (o4, uri4) = merchant.order();
    let over_one = challenge(&db, "bob@b.test", &login, &postage(&uri4, "KUDOS:5")).await;
    let (o5, uri5) = merchant.order();
    let stranger = challenge(&db, "eve@b.test", &login, &postage(&uri5, "KUDOS:0.5")).await;
    let malformed = challenge(
        &db,
        "bob@b.test",
        &login,
        &postage("https://b.test/pay", "KUDOS:0.5"),
    )
    .await;
    // In bob's name, but his domain vouched for nothing (SPF failed, no signature).
    let (o6, uri6) = merchant.order();
    let forged = challenge_with(
        &db,
        "bob@b.test",
        &login,
        &postage(&uri6, "KUDOS:0.5"),
        json!({"auth": {"spf": {"result": "fail", "domain": "b.test"}, "dkim": []}}),
    )
    .await;
    support::run_ids(STAGE, &cfg, &[over_one, stranger, malformed, forged]).await;
    for (id, order) in [(over_one, &o4), (stranger, &o5), (forged, &o6)] {
        assert_eq!(at(&db, id).await, Some(("next".into(), "pending".into())));
        assert!(!merchant.paid(order));
    }
    assert_eq!(
        at(&db, malformed).await,
        Some(("next".into(), "pending".into()))
    );
    assert_eq!(
        user.wallet_log().len(),
        2,
        "only the two payments within the limits"
    );

    let recorded = payments(&db).await;
    let statuses: Vec<(&str, &str, &str)> = recorded
        .iter()
        .map(|p| (p.1.as_str(), p.2.as_str(), p.3.as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            (o1.as_str(), "KUDOS:0.5", "paid"),
            (o2.as_str(), "KUDOS:0.5", "paid"),
            (o3.as_str(), "KUDOS:0.5", "refused"),
            (o4.as_str(), "KUDOS:5", "refused"),
            (o5.as_str(), "KUDOS:0.5", "refused"),
            (o6.as_str(), "KUDOS:0.5", "refused"),
        ]
    );
    let reasons: Vec<String> = recorded.iter().filter_map(|p| p.4.clone()).collect();
    assert!(
        reasons[0].contains("above your limit of KUDOS:1"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("above your limit of KUDOS:1 a payment"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].contains("not written to eve@b.test"),
        "{reasons:?}"
    );
    let told = notices(&db, &login).await;
    assert_eq!(told.len(), 5, "each refusal is reported: {told:?}");
    assert!(told[3].contains("malformed request"), "{}", told[3]);
    assert!(told[4].contains("may be forged"), "{}", told[4]);
    let state: serde_json::Value =
        sqlx::query_scalar("SELECT state FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(over_month)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        state["auto_pay"]["refused"]
            .as_str()
            .unwrap()
            .contains("this month"),
        "{state}"
    );
}

/// Mail to a user who did not consent is never paid for, whatever it carries.
#[tokio::test(flavor = "multi_thread")]
async fn without_consent_nothing_is_paid() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let merchant = Merchant::start(dir.path());
    let cfg = config(&db, dir.path());
    let (order, uri) = merchant.order();
    let id = challenge(
        &db,
        "bob@b.test",
        "carol@example.test",
        &postage(&uri, "KUDOS:0.5"),
    )
    .await;
    support::run_ids(STAGE, &cfg, &[id]).await;
    assert_eq!(at(&db, id).await, Some(("next".into(), "pending".into())));
    assert!(!merchant.paid(&order));
    assert!(payments(&db).await.is_empty());
}
