//! `pepsi-stage-secure-link worker` against a real database: who is reached by secure link
//! (an authenticated sender's tag or header, an `always` policy, the encrypt stage's
//! fallback; never a local recipient, a stranger's tag or a `never` domain), what the
//! notice and the receipt carry and do not carry, the link in the notice opening the sealed
//! message through the store's codes and sessions, and a pass run again sending nothing
//! twice.

use std::path::PathBuf;

use pepsi_secure_link::seal::LinkHalf;
use pepsi_secure_link::store;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;

pub const STAGE_PROGRAM: &str = env!("CARGO_BIN_EXE_pepsi-stage-secure-link");
const STAGE: &str = STAGE_PROGRAM;
/// A pass that ended its row (every recipient secured).
pub const FINISHED: &str = "0 {\"finished\":true}";

const BODY: &str = "The quarterly numbers are attached in words: revenue rose by 7%.\r\n";

pub struct Setup {
    _dir: tempfile::TempDir,
    pub config: PathBuf,
}

/// A secure-link stage `secure` (messages on to `out`, notices too, receipts at
/// `receipts`, returns at `bounce`), example.test local, with `extra` appended.
pub async fn setup(db: &TestDb, extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
             LOCAL_DOMAINS = example.test\nSECURE_LINK_URL = https://mail.example.test\n\n\
             [stage-secure]\nPROGRAM = pepsi-stage-secure-link\nNEXT_STAGE = out\n\
             BOUNCE_STAGE = bounce\nRECEIPT_STAGE = receipts\n\n\
             [stage-out]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-receipts]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-discard\n\n{extra}",
            db.url
        ),
    )
    .unwrap();
    Setup { _dir: dir, config }
}

pub fn headers(subject: &str, extra: &str) -> String {
    format!(
        "From: Alice Example <alice@example.test>\r\nTo: bob@remote.example, carol@example.test\r\n\
         Subject: {subject}\r\nDate: Tue, 05 Jan 2027 10:00:00 +0000\r\n\
         Message-ID: <q3@example.test>\r\n{extra}"
    )
}

/// A message from alice to `rcpt` (authenticated as alice when `auth`), claimed at `stage`.
pub async fn message(
    db: &TestDb,
    rcpt: &[&str],
    headers: &str,
    auth: bool,
    state: Value,
    stage: &str,
) -> i64 {
    let mut state = state;
    state["origin"] = json!({"client_addr": "192.0.2.7", "helo": "client", "esmtp": true,
        "smtputf8": false, "body": null, "tls": null, "listener": "submission", "iprev": null,
        "authserv_id": "mx.example.test",
        "auth_user": if auth { json!("alice@example.test") } else { Value::Null }});
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("alice@example.test")
        .bind(rcpt.iter().map(|r| r.to_string()).collect::<Vec<_>>())
        .bind(headers.as_bytes())
        .bind(BODY.as_bytes())
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, stage).await;
    id
}

/// One queue row as these tests read it.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub stage: String,
    pub status: String,
    pub mail_from: String,
    pub rcpt: Vec<String>,
    pub state: Value,
    pub raw: Vec<u8>,
}

pub async fn rows(db: &TestDb) -> Vec<Row> {
    use sqlx::Row as _;
    let rows = sqlx::query(
        "SELECT w.workqueue_id, w.stage, w.status::text AS status, w.mail_from, w.rcpt_to, \
                w.state, w.headers, b.body \
           FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
          ORDER BY w.workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    rows.iter()
        .map(|r| Row {
            id: r.get("workqueue_id"),
            stage: r.get("stage"),
            status: r.get("status"),
            mail_from: r.get("mail_from"),
            rcpt: r.get("rcpt_to"),
            state: r.get("state"),
            raw: [
                r.get::<Vec<u8>, _>("headers"),
                b"\r\n".to_vec(),
                r.get::<Vec<u8>, _>("body"),
            ]
            .concat(),
        })
        .collect()
}

pub fn text(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

/// The links kept: (link id, sender, recipient, sealed bytes).
pub async fn links(db: &TestDb) -> Vec<(String, String, String, Vec<u8>)> {
    sqlx::query_as(
        "SELECT link_id, sender, recipient, ciphertext FROM pepsi.secure_link_message \
         ORDER BY message_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The decoded text of a mail.
pub fn body_text(raw: &[u8]) -> String {
    mail_parser::MessageParser::default()
        .parse(raw)
        .unwrap()
        .body_text(0)
        .unwrap()
        .into_owned()
}

/// The recipient's link in a notice: (link id, generation, link half).
pub fn link_in(notice: &[u8]) -> (String, i32, LinkHalf) {
    let text = body_text(notice);
    let start = text
        .find("https://mail.example.test/secure/")
        .unwrap_or_else(|| panic!("no link in {text}"));
    let link = text[start..].split_whitespace().next().unwrap();
    let parts: Vec<&str> = link
        .trim_start_matches("https://mail.example.test/secure/")
        .split('/')
        .collect();
    assert_eq!(parts.len(), 3, "{link}");
    (
        parts[0].to_owned(),
        parts[1].parse().unwrap(),
        LinkHalf::parse(parts[2]).unwrap(),
    )
}

/// The link opened as the portal opens it: a code sent, checked, the message read.
pub async fn open(db: &TestDb, notice: &[u8]) -> Vec<u8> {
    let (link_id, generation, half) = link_in(notice);
    let mut tx = db.pool.begin().await.unwrap();
    let code = store::send_code(&mut tx, &link_id, generation, "192.0.2.9")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let session = store::check_code(&db.pool, &link_id, generation, code.as_str(), "192.0.2.9")
        .await
        .unwrap();
    store::open(&db.pool, &link_id, &half, &session, "192.0.2.9")
        .await
        .unwrap()
}

#[tokio::test]
async fn tagged_mail_from_an_authenticated_sender_reaches_the_external_recipient_by_link_only() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    let id = message(
        &db,
        &["bob@remote.example", "carol@example.test"],
        &headers("[secure] Q3 figures", "X-Pepsi-Secure-Link: yes\r\n"),
        true,
        json!({}),
        "secure",
    )
    .await;
    assert_eq!(support::run_ids(STAGE, &s.config, &[id]).await, vec!["0"]);
    let r = rows(&db).await;
    assert_eq!(r.len(), 2, "{r:#?}");
    // carol (local) gets the original, without the control header; the tag stays.
    assert_eq!(
        (r[0].id, r[0].stage.as_str(), r[0].rcpt.clone()),
        (id, "out", vec!["carol@example.test".to_owned()])
    );
    let carols = text(&r[0].raw);
    assert!(
        carols.contains(BODY) && carols.contains("Subject: [secure] Q3 figures"),
        "{carols}"
    );
    assert!(!carols.contains("X-Pepsi-Secure-Link"), "{carols}");
    // bob's copy waits at this stage, marked: it is sealed in a pass of its own.
    let split = r[1].clone();
    assert_eq!(
        (
            split.stage.as_str(),
            split.status.as_str(),
            split.rcpt.clone()
        ),
        ("secure", "pending", vec!["bob@remote.example".to_owned()])
    );
    assert_eq!(split.state["secure_link"], json!({"reason": "asked"}));
    assert!(links(&db).await.is_empty());

    support::claim(&db.pool, split.id, "secure").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[split.id]).await,
        vec![FINISHED]
    );
    let r = rows(&db).await;
    assert!(
        r.iter().all(|row| row.id != split.id),
        "the secured row ends: {r:#?}"
    );
    let notice = r
        .iter()
        .find(|row| row.state["secure_link"]["made"] == "notice")
        .expect("a notice");
    let receipt = r
        .iter()
        .find(|row| row.state["secure_link"]["made"] == "receipt")
        .expect("a receipt");
    assert_eq!(
        r.len(),
        3,
        "carol's copy, the notice and the receipt: {r:#?}"
    );

    // The notice: to bob, from alice, saying who and how, carrying nothing sealed.
    assert_eq!(
        (
            notice.stage.as_str(),
            notice.mail_from.as_str(),
            notice.rcpt.clone()
        ),
        (
            "out",
            "alice@example.test",
            vec!["bob@remote.example".to_owned()]
        )
    );
    let n = text(&notice.raw);
    assert!(
        !n.contains("quarterly") && !n.contains("Q3") && !n.contains("revenue"),
        "{n}"
    );
    let parsed = mail_parser::MessageParser::default()
        .parse(&notice.raw)
        .unwrap();
    assert_eq!(
        parsed.subject(),
        Some("Secure message from Alice Example <alice@example.test>")
    );
    assert_eq!(
        parsed.from().unwrap().first().unwrap().address(),
        Some("alice@example.test")
    );
    assert_eq!(
        parsed.header_raw("Auto-Submitted").map(str::trim),
        Some("auto-generated")
    );
    assert!(parsed.message_id().unwrap().ends_with("@mx.example.test"));
    assert!(parsed.date().is_some());
    let nt = body_text(&notice.raw);
    assert!(
        nt.contains("one-time code") && nt.contains("bob@remote.example"),
        "{nt}"
    );

    // The sealed row holds neither the body nor the subject in the clear.
    let kept = links(&db).await;
    assert_eq!(kept.len(), 1);
    let (link_id, sender, recipient, sealed) = &kept[0];
    assert_eq!(
        (sender.as_str(), recipient.as_str()),
        ("alice@example.test", "bob@remote.example")
    );
    for clear in [&b"quarterly"[..], b"Q3 figures", b"revenue"] {
        assert!(
            !sealed.windows(clear.len()).any(|w| w == clear),
            "{clear:?} in the sealed row"
        );
    }
    // The link opens it: the message as sent, the header gone and the tag cut.
    let opened = text(&open(&db, &notice.raw).await);
    assert!(opened.contains(BODY), "{opened}");
    assert!(opened.contains("Subject: Q3 figures\r\n"), "{opened}");
    assert!(
        !opened.contains("X-Pepsi-Secure-Link") && !opened.contains("[secure]"),
        "{opened}"
    );

    // The receipt: to alice, from the null sender, with bob's manage link.
    assert_eq!(
        (
            receipt.stage.as_str(),
            receipt.mail_from.as_str(),
            receipt.rcpt.clone()
        ),
        ("receipts", "", vec!["alice@example.test".to_owned()])
    );
    let rt = body_text(&receipt.raw);
    assert!(
        rt.contains(&format!(
            "https://mail.example.test/secure/manage/{link_id}/"
        )),
        "{rt}"
    );
    assert!(
        rt.contains("bob@remote.example") && !rt.contains("quarterly"),
        "{rt}"
    );
    assert!(
        !text(&receipt.raw).contains("Q3 figures"),
        "the subject stays sealed"
    );
    let events: Vec<String> = store::access_log(&db.pool, link_id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.event)
        .collect();
    assert_eq!(events, ["created", "code_sent", "session_opened", "opened"]);
}

#[tokio::test]
async fn untagged_mail_and_a_strangers_tag_pass_untouched() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    let plain_headers = headers("Q3 figures", "");
    let plain = message(
        &db,
        &["bob@remote.example"],
        &plain_headers,
        true,
        json!({}),
        "secure",
    )
    .await;
    let stranger_headers = headers("[secure] Q3 figures", "X-Pepsi-Secure-Link: yes\r\n");
    let stranger = message(
        &db,
        &["bob@remote.example"],
        &stranger_headers,
        false,
        json!({}),
        "secure",
    )
    .await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[plain, stranger]).await,
        vec!["0", "0"]
    );
    let r = rows(&db).await;
    assert_eq!(r.len(), 2, "{r:#?}");
    assert!(
        r.iter()
            .all(|row| row.stage == "out" && row.rcpt == ["bob@remote.example"])
    );
    assert_eq!(
        text(&r[0].raw),
        format!("{plain_headers}\r\n{BODY}"),
        "untouched"
    );
    // The stranger's header is removed; nothing else happens.
    assert_eq!(
        text(&r[1].raw),
        format!("{}\r\n{BODY}", headers("[secure] Q3 figures", "")),
        "only the control header removed"
    );
    assert!(links(&db).await.is_empty());
}

#[tokio::test]
async fn a_never_policy_wins_over_the_senders_tag() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    sqlx::query("INSERT INTO pepsi.secure_link_policy (scope, domain, mode) VALUES ('recipient_domain', 'remote.example', 'never')")
        .execute(&db.pool)
        .await
        .unwrap();
    let id = message(
        &db,
        &["bob@remote.example"],
        &headers("[secure] Q3 figures", ""),
        true,
        json!({}),
        "secure",
    )
    .await;
    assert_eq!(support::run_ids(STAGE, &s.config, &[id]).await, vec!["0"]);
    let r = rows(&db).await;
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(
        (r[0].stage.as_str(), r[0].rcpt.clone()),
        ("out", vec!["bob@remote.example".to_owned()])
    );
    assert!(text(&r[0].raw).contains(BODY));
    assert!(links(&db).await.is_empty());
}

#[tokio::test]
async fn an_always_recipient_domain_policy_secures_untagged_mail_for_its_lifetime() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    sqlx::query(
        "INSERT INTO pepsi.secure_link_policy (scope, domain, mode, lifetime) \
         VALUES ('recipient_domain', 'remote.example', 'always', '7 days'), \
                ('sender_domain', 'example.test', 'never', '30 days')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // From a stranger (no AUTH): the domain's policy does not ask who sent it.
    let id = message(
        &db,
        &["bob@remote.example", "dan@remote.example"],
        &headers("Q3 figures", ""),
        false,
        json!({}),
        "secure",
    )
    .await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    let r = rows(&db).await;
    let notices: Vec<&Row> = r
        .iter()
        .filter(|row| row.state["secure_link"]["made"] == "notice")
        .collect();
    let receipts: Vec<&Row> = r
        .iter()
        .filter(|row| row.state["secure_link"]["made"] == "receipt")
        .collect();
    assert_eq!(
        (r.len(), notices.len(), receipts.len()),
        (3, 2, 1),
        "{r:#?}"
    );
    assert!(
        r.iter().all(|row| row.id != id),
        "the whole row was secured in this pass"
    );
    // One receipt lists both recipients.
    let rt = body_text(&receipts[0].raw);
    assert!(
        rt.contains("bob@remote.example") && rt.contains("dan@remote.example"),
        "{rt}"
    );
    // The recipient domain's row wins over the sender domain's `never`, and gives the
    // lifetime (7 days, not LIFETIME's 30).
    let short: Vec<bool> = sqlx::query_scalar(
        "SELECT expires_at < now() + interval '8 days' AND expires_at > now() + interval '6 days' \
           FROM pepsi.secure_link_message ORDER BY message_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(short, [true, true]);
    for n in notices {
        assert!(text(&open(&db, &n.raw).await).contains(BODY));
    }
}

/// A worker killed after the links, notices and receipt were committed and before the pass
/// committed: the pass run again finds its token taken, ends the row and sends nothing.
#[tokio::test]
async fn a_secure_link_pass_run_again_after_its_links_were_made_sends_nothing_twice() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    let id = message(
        &db,
        &["bob@remote.example"],
        &headers("[secure] Q3 figures", ""),
        true,
        json!({}),
        "secure",
    )
    .await;
    sqlx::query("INSERT INTO pepsi.clone_token (token) VALUES ($1)")
        .bind(format!("secure-link:{id}"))
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    assert!(rows(&db).await.is_empty(), "the row ended, nothing queued");
    assert!(links(&db).await.is_empty(), "no second link");
}

#[tokio::test]
async fn the_stage_does_not_start_without_the_portals_url() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    let text = std::fs::read_to_string(&s.config).unwrap();
    for (line, want) in [
        ("", "SECURE_LINK_URL is not set"),
        (
            "SECURE_LINK_URL = http://mail.example.test\n",
            "SECURE_LINK_URL = http://mail.example.test",
        ),
    ] {
        std::fs::write(
            &s.config,
            text.replace("SECURE_LINK_URL = https://mail.example.test\n", line),
        )
        .unwrap();
        let err = support::worker_start_error(STAGE, &s.config);
        assert!(err.contains(want), "{err}");
    }
}

/// The encrypt stage's fallback reaching this stage: a recipient in a domain the policy
/// lets fall back gets a link; one whose policy says `never` (or that is local) is
/// returned with 5.7.5, as the encrypt stage would have.
#[tokio::test]
async fn an_encrypt_fallback_row_is_secured_or_returned_never_sent_in_the_clear() {
    let db = TestDb::new().await;
    let s = setup(&db, "").await;
    sqlx::query(
        "INSERT INTO pepsi.secure_link_policy (scope, domain, mode) \
         VALUES ('recipient_domain', 'remote.example', 'fallback'), \
                ('recipient_domain', 'closed.example', 'never')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let id = message(
        &db,
        &[
            "bob@remote.example",
            "eve@closed.example",
            "carol@example.test",
        ],
        &headers("Q3 figures", ""),
        true,
        json!({"secure_link": {"reason": "encrypt-fallback"}}),
        "secure",
    )
    .await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    let r = rows(&db).await;
    let returned: Vec<&Row> = r.iter().filter(|row| row.stage == "bounce").collect();
    assert_eq!(returned.len(), 1, "{r:#?}");
    assert_eq!(
        returned[0].rcpt,
        ["eve@closed.example", "carol@example.test"]
    );
    assert_eq!(returned[0].state["bounce"]["enhanced_status"], "5.7.5");
    assert!(
        returned[0].state["bounce"]["recipients"]["carol@example.test"]["diagnostic"]
            .as_str()
            .unwrap()
            .contains("no key")
    );
    let notice = r
        .iter()
        .find(|row| row.state["secure_link"]["made"] == "notice")
        .expect("bob's notice");
    assert_eq!(notice.rcpt, ["bob@remote.example"]);
    assert!(text(&open(&db, &notice.raw).await).contains(BODY));
    assert!(
        r.iter()
            .all(|row| row.stage != "out" || row.state["secure_link"]["made"] == "notice"),
        "nothing goes on in the clear: {r:#?}"
    );
}
