//! pepsi-stage-bounce as a worker process against a real PostgreSQL: the row it is given
//! becomes an RFC 3464 DSN to the original sender (null sender, state cleared, at
//! NEXT_STAGE), or is dropped when no notification may be sent. Every DSN is parsed back by
//! an independent MIME parser, Python's `email` package.

use std::process::Command;

use pepsi_testkit::TestDb;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::support;

const BOUNCE: &str = env!("CARGO_BIN_EXE_pepsi-stage-bounce");

const ORIGINAL_HEADERS: &str = "From: Alice <alice@example.test>\r\nTo: bob@remote.example\r\nSubject: quarterly figures\r\nMessage-ID: <orig-1@example.test>\r\n";
const ORIGINAL_BODY: &str = "Here are the figures.\r\n-- \r\nAlice\r\n";

/// Parses a raw message with Python's `email` package and summarises the DSN structure as
/// JSON: top-level fields, the part types, the delivery-status groups, the returned message.
const PARSE: &str = r#"
import email, json, sys
from email import policy
from email.header import Header, decode_header
from email.parser import HeaderParser

def fix(s):
    if s is None:
        return None
    if isinstance(s, Header):
        # compat32 hands raw UTF-8 header bytes back as an unknown-8bit Header.
        return ''.join(b.decode('utf-8') if isinstance(b, bytes) else b
                       for b, _ in decode_header(s))
    s = str(s)
    return s.encode('utf-8', 'surrogateescape').decode('utf-8')

def fields(msg):
    return {k: fix(v) for k, v in msg.items()}

raw = sys.stdin.buffer.read()
m = email.message_from_bytes(raw, policy=policy.compat32)
defects = [type(d).__name__ for part in m.walk() for d in part.defects]
parts = m.get_payload()
out = {
    'from': fix(m['From']), 'to': fix(m['To']), 'subject': fix(m['Subject']),
    'auto_submitted': fix(m['Auto-Submitted']), 'message_id': fix(m['Message-ID']),
    'date': fix(m['Date']), 'mime_version': fix(m['MIME-Version']),
    'cte': fix(m['Content-Transfer-Encoding']),
    'content_type': m.get_content_type(), 'report_type': fix(m.get_param('report-type')),
    'defects': defects, 'parts': [p.get_content_type() for p in parts],
}
out['human'] = parts[0].get_payload(decode=True).decode(parts[0].get_content_charset())
status = parts[1].get_payload()
if parts[1].get_content_type() == 'message/delivery-status':
    groups = [fields(g) for g in status]
else:
    # message/global-delivery-status: the parser sees one embedded message whose header is the
    # per-message group and whose body holds the recipient groups.
    first = status[0]
    groups = [fields(first)]
    rest = first.get_payload(decode=True).decode('utf-8').replace('\r\n', '\n')
    groups += [fields(HeaderParser().parsestr(b)) for b in rest.split('\n\n') if b.strip()]
out['per_message'] = groups[0]
out['recipients'] = groups[1:]
ret = parts[2]
if ret.get_content_type() == 'text/rfc822-headers':
    inner = HeaderParser().parsestr(fix(ret.get_payload()))
    out['returned'] = {'subject': fix(inner['Subject']), 'body': None}
else:
    inner = ret.get_payload()[0]
    body = inner.get_payload(decode=True)
    out['returned'] = {'subject': fix(inner['Subject']),
                       'body': body.decode('utf-8') if body else None}
print(json.dumps(out))
"#;

fn parse(raw: &[u8]) -> Value {
    use std::io::Write as _;
    let mut child = Command::new("python3")
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().unwrap().write_all(raw).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python could not parse the DSN: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(raw)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["defects"],
        json!([]),
        "MIME defects in\n{}",
        String::from_utf8_lossy(raw)
    );
    v
}

fn config(db: &TestDb, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = route\nMAX_LIFETIME = 5d\n\n\
             [stage-bounce-small]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = route\nMAX_RETURN_SIZE = 100\n\n\
             [stage-bounce-full]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = route\nRETURN = full\n\n\
             [stage-bounce-nowhere]\nPROGRAM = pepsi-stage-bounce\n",
            db.url
        ),
    )
    .unwrap();
    path
}

/// A message running at `stage` as a delivery stage leaves it there: received two days ago.
async fn at_bounce(
    db: &TestDb,
    stage: &str,
    from: &str,
    rcpt: &[&str],
    headers: &str,
    body: &str,
    state: Value,
) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind(from)
        .bind(&rcpt)
        .bind(headers.as_bytes())
        .bind(body.as_bytes())
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = $2, \
         received_at = now() - interval '2 days' WHERE workqueue_id = $1",
    )
    .bind(id)
    .bind(stage)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

async fn worker(cfg: &std::path::Path, ids: &[i64]) -> Vec<String> {
    support::run_ids(BOUNCE, cfg, ids).await
}

#[derive(Debug)]
struct Dsn {
    stage: String,
    status: String,
    mail_from: String,
    rcpt_to: Vec<String>,
    state: Value,
    /// Seconds since received_at.
    age: f64,
    headers: Vec<u8>,
    raw: Vec<u8>,
    parsed: Value,
}

/// The row after the pass, its raw message (headers || CRLF || body) parsed by Python.
async fn dsn(db: &TestDb, id: i64) -> Dsn {
    let r = sqlx::query(
        "SELECT stage, status::text, mail_from, rcpt_to, state, headers, b.body, \
         extract(epoch FROM now() - received_at)::float8 \
         FROM pepsi.workqueue JOIN pepsi.workqueue_body b USING (body_id) WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let headers: Vec<u8> = r.get(5);
    let body: Vec<u8> = r.get(6);
    let raw = pepsi_contract::message::join(&headers, &body);
    let parsed = parse(&raw);
    Dsn {
        stage: r.get(0),
        status: r.get(1),
        mail_from: r.get(2),
        rcpt_to: r.get(3),
        state: r.get(4),
        age: r.get(7),
        headers,
        raw,
        parsed,
    }
}

async fn row_exists(db: &TestDb, id: i64) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pepsi.workqueue WHERE workqueue_id = $1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Checks what every DSN must be: a new null-sender message to the original sender, at
/// NEXT_STAGE, with state cleared and a fresh age, RFC 3464-shaped.
fn check_envelope(d: &Dsn, to: &str) {
    assert_eq!((d.stage.as_str(), d.status.as_str()), ("route", "pending"));
    assert_eq!(d.mail_from, "", "a DSN has the null sender");
    assert_eq!(d.rcpt_to, vec![to.to_string()]);
    assert_eq!(d.state, json!({}), "state is cleared");
    assert!(d.age < 3600.0, "a DSN is a new message, age {}s", d.age);
    assert!(
        !d.headers.windows(4).any(|w| w == b"\r\n\r\n"),
        "the header column holds the header block only"
    );
    let p = &d.parsed;
    assert_eq!(
        p["from"],
        "\"Mail Delivery System\" <MAILER-DAEMON@mx.example.test>"
    );
    assert_eq!(p["to"], format!("<{to}>"));
    assert_eq!(p["auto_submitted"], "auto-replied");
    assert_eq!(p["mime_version"], "1.0");
    assert_eq!(p["content_type"], "multipart/report");
    assert!(
        p["message_id"]
            .as_str()
            .unwrap()
            .ends_with("@mx.example.test>")
    );
    assert!(p["date"].is_string());
    assert_eq!(p["per_message"]["Reporting-MTA"], "dns; mx.example.test");
    let raw = String::from_utf8_lossy(&d.raw);
    assert!(
        !raw.replace("\r\n", "").contains(['\r', '\n']),
        "every line ends with CRLF"
    );
}

#[tokio::test]
async fn a_permanent_failure_with_a_remote_reply_becomes_a_dsn_to_the_sender() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let state = json!({
        "origin": {"client_addr": "192.0.2.7"},
        "dsn": {"ret": "HDRS", "envid": "ENV-42", "rcpt": [
            {"notify": null, "orcpt": "rfc822;Bob@Remote.example"}]},
        "attempts": 3,
        "bounce": {"kind": "permanent", "stage": "relay", "remote_mta": "mx.remote.example",
            "smtp_code": 550, "enhanced_status": "5.1.1", "reply_text": "5.1.1 user unknown",
            "phase": "RCPT"}
    });
    let id = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state,
    )
    .await;
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let d = dsn(&db, id).await;
    check_envelope(&d, "alice@example.test");
    let p = &d.parsed;
    assert_eq!(p["subject"], "Undelivered Mail Returned to Sender");
    assert_eq!(p["report_type"], "delivery-status");
    assert_eq!(p["cte"], "7bit");
    assert_eq!(
        p["parts"],
        json!([
            "text/plain",
            "message/delivery-status",
            "text/rfc822-headers"
        ])
    );
    assert_eq!(p["per_message"]["Original-Envelope-Id"], "ENV-42");
    assert!(p["per_message"]["Arrival-Date"].is_string());
    let r = &p["recipients"];
    assert_eq!(r.as_array().unwrap().len(), 1);
    assert_eq!(r[0]["Final-Recipient"], "rfc822; bob@remote.example");
    assert_eq!(r[0]["Original-Recipient"], "rfc822; Bob@Remote.example");
    assert_eq!(r[0]["Action"], "failed");
    assert_eq!(r[0]["Status"], "5.1.1");
    assert_eq!(r[0]["Remote-MTA"], "dns; mx.remote.example");
    assert_eq!(r[0]["Diagnostic-Code"], "smtp; 550 5.1.1 user unknown");
    assert!(r[0]["Last-Attempt-Date"].is_string());
    assert!(r[0].get("Will-Retry-Until").is_none());
    let human = p["human"].as_str().unwrap();
    assert!(
        human.contains("<bob@remote.example>: host mx.remote.example said: 550 5.1.1 user unknown"),
        "{human}"
    );
    assert_eq!(
        p["returned"],
        json!({"subject": "quarterly figures", "body": null})
    );
}

#[tokio::test]
async fn a_delay_notice_says_delayed_and_until_when_it_is_retried() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let state = json!({
        "dsn": {"ret": "FULL", "envid": null, "rcpt": [{"notify": ["DELAY", "FAILURE"], "orcpt": null}]},
        "last_error": "connect to mx.remote.example: connection timed out",
        "bounce": {"kind": "delay", "enhanced_status": "4.4.1", "stage": "relay"}
    });
    let id = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state,
    )
    .await;
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let d = dsn(&db, id).await;
    check_envelope(&d, "alice@example.test");
    let p = &d.parsed;
    assert_eq!(p["subject"], "Delayed Mail (still being retried)");
    assert!(p["per_message"].get("Original-Envelope-Id").is_none());
    let r = &p["recipients"][0];
    assert_eq!(r["Action"], "delayed");
    assert_eq!(r["Status"], "4.4.1");
    assert!(r.get("Original-Recipient").is_none());
    assert_eq!(
        r["Diagnostic-Code"],
        "X-Pepsi; connect to mx.remote.example: connection timed out"
    );
    // Arrival two days ago plus MAX_LIFETIME = 5d: three days from now.
    let until =
        chrono::DateTime::parse_from_rfc2822(r["Will-Retry-Until"].as_str().unwrap()).unwrap();
    let left = until.signed_duration_since(chrono::Utc::now()).num_hours();
    assert!((71..=72).contains(&left), "Will-Retry-Until in {left}h");
    assert_eq!(
        p["parts"][2], "text/rfc822-headers",
        "only a failure returns the full message (RFC 3461 §4.3), whatever RET says"
    );
    assert!(
        p["human"]
            .as_str()
            .unwrap()
            .contains("connection timed out")
    );
}

#[tokio::test]
async fn a_success_notice_goes_only_to_recipients_that_asked_for_it() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let state = json!({
        "dsn": {"ret": "FULL", "envid": "E-7", "rcpt": [
            {"notify": ["SUCCESS"], "orcpt": "rfc822;carol@remote.example"},
            {"notify": ["FAILURE"], "orcpt": null}]},
        "bounce": {"kind": "success", "stage": "relay", "remote_mta": "mx.remote.example",
            "recipients": {"dave@remote.example": {"action": "relayed"}}}
    });
    let id = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["carol@remote.example", "dave@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state,
    )
    .await;
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let d = dsn(&db, id).await;
    check_envelope(&d, "alice@example.test");
    let p = &d.parsed;
    assert_eq!(p["subject"], "Successful Mail Delivery Report");
    assert_eq!(p["recipients"].as_array().unwrap().len(), 1, "{p}");
    let r = &p["recipients"][0];
    assert_eq!(r["Final-Recipient"], "rfc822; carol@remote.example");
    assert_eq!(r["Action"], "delivered");
    assert_eq!(r["Status"], "2.0.0");
    assert_eq!(p["parts"][2], "text/rfc822-headers");
    assert!(!p["human"].as_str().unwrap().contains("dave@"));
}

#[tokio::test]
async fn ret_full_returns_the_whole_message_and_hdrs_or_an_oversized_one_only_its_headers() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let state = |ret: Value| {
        json!({"dsn": {"ret": ret, "envid": null, "rcpt": [{"notify": null, "orcpt": null}]},
               "bounce": {"kind": "permanent", "diagnostic": "mailbox disabled", "enhanced_status": "5.2.1"}})
    };
    let full = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state(json!("FULL")),
    )
    .await;
    let hdrs = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state(json!("HDRS")),
    )
    .await;
    let unset = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state(Value::Null),
    )
    .await;
    let unset_full = at_bounce(
        &db,
        "bounce-full",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state(Value::Null),
    )
    .await;
    let big_body = "x".repeat(200) + "\r\n";
    let oversized = at_bounce(
        &db,
        "bounce-small",
        "alice@example.test",
        &["bob@remote.example"],
        "Subject: big\r\n",
        &big_body,
        state(json!("FULL")),
    )
    .await;
    let lines = worker(&cfg, &[full, hdrs, unset, unset_full, oversized]).await;
    assert_eq!(lines, vec!["0"; 5]);

    let d = dsn(&db, full).await;
    check_envelope(&d, "alice@example.test");
    assert_eq!(d.parsed["parts"][2], "message/rfc822");
    assert_eq!(
        d.parsed["returned"],
        json!({"subject": "quarterly figures", "body": ORIGINAL_BODY})
    );
    assert_eq!(
        d.parsed["recipients"][0]["Diagnostic-Code"],
        "X-Pepsi; mailbox disabled"
    );
    assert_eq!(d.parsed["recipients"][0]["Status"], "5.2.1");

    for (id, why) in [
        (hdrs, "RET=HDRS"),
        (unset, "no RET and RETURN defaults to headers"),
    ] {
        let d = dsn(&db, id).await;
        assert_eq!(d.parsed["parts"][2], "text/rfc822-headers", "{why}");
        assert_eq!(
            d.parsed["returned"],
            json!({"subject": "quarterly figures", "body": null}),
            "{why}"
        );
    }
    let d = dsn(&db, unset_full).await;
    assert_eq!(
        d.parsed["parts"][2], "message/rfc822",
        "RETURN = full applies without RET"
    );

    let d = dsn(&db, oversized).await;
    assert_eq!(d.parsed["parts"][2], "text/rfc822-headers");
    assert_eq!(d.parsed["returned"]["subject"], "big");
    let human = d.parsed["human"].as_str().unwrap();
    assert!(human.contains("larger than 100 bytes"), "{human}");
    // The DSN has a body row of its own; the original body went with its last row.
    let bodies: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue_body WHERE body = $1")
            .bind(big_body.as_bytes())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(bodies, 0);
}

#[tokio::test]
async fn no_dsn_for_notify_never_a_null_sender_a_dsn_or_an_auto_reply() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let permanent = |notify: Value| {
        json!({"dsn": {"ret": null, "envid": null, "rcpt": [{"notify": notify, "orcpt": null}]},
               "bounce": {"kind": "permanent", "diagnostic": "no such user"}})
    };
    let never = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        permanent(json!(["NEVER"])),
    )
    .await;
    let success_only = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        permanent(json!(["SUCCESS"])),
    )
    .await;
    let null_sender = at_bounce(
        &db,
        "bounce",
        "",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        permanent(Value::Null),
    )
    .await;
    let a_dsn = at_bounce(
        &db, "bounce", "mailer-daemon@remote.example", &["alice@example.test"],
        "From: MAILER-DAEMON@remote.example\r\nSubject: Undelivered Mail\r\nMIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=delivery-status;\r\n\tboundary=\"b1\"\r\n",
        "--b1\r\nContent-Type: text/plain\r\n\r\nfailed\r\n--b1--\r\n",
        permanent(Value::Null),
    ).await;
    let auto_reply = at_bounce(
        &db, "bounce", "bob@remote.example", &["alice@example.test"],
        "From: bob@remote.example\r\nSubject: Out of office\r\nAuto-Submitted: auto-replied (vacation)\r\n",
        "I am away.\r\n",
        permanent(Value::Null),
    ).await;
    // An auto-generated message with a real sender is answered: its sender wants bounces.
    let generated = at_bounce(
        &db,
        "bounce",
        "cron@example.test",
        &["bob@remote.example"],
        "From: cron@example.test\r\nSubject: backup report\r\nAuto-Submitted: auto-generated\r\n",
        "ok\r\n",
        permanent(Value::Null),
    )
    .await;
    let ids = [
        never,
        success_only,
        null_sender,
        a_dsn,
        auto_reply,
        generated,
    ];
    let lines = worker(&cfg, &ids).await;
    assert_eq!(
        lines,
        vec![
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#,
            "0"
        ]
    );
    for id in &ids[..5] {
        assert!(!row_exists(&db, *id).await, "row {id} is finished, no DSN");
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        left, 1,
        "nothing but the auto-generated message's DSN exists"
    );
    check_envelope(&dsn(&db, generated).await, "cron@example.test");
}

#[tokio::test]
async fn partial_notify_reports_only_the_recipients_that_want_a_failure_notice() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let state = json!({
        "dsn": {"ret": null, "envid": null, "rcpt": [
            {"notify": ["SUCCESS", "DELAY"], "orcpt": "rfc822;x@remote.example"},
            {"notify": null, "orcpt": "rfc822;y@remote.example"},
            {"notify": ["NEVER"], "orcpt": null}]},
        "bounce": {"kind": "permanent", "smtp_code": 550, "remote_mta": "mx.remote.example",
            "recipients": {"y@remote.example": {"enhanced_status": "5.2.2", "smtp_code": 552, "reply_text": "mailbox full"}}}
    });
    let id = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["x@remote.example", "y@remote.example", "z@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        state,
    )
    .await;
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let d = dsn(&db, id).await;
    check_envelope(&d, "alice@example.test");
    let r = d.parsed["recipients"].as_array().unwrap();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["Final-Recipient"], "rfc822; y@remote.example");
    assert_eq!(r[0]["Original-Recipient"], "rfc822; y@remote.example");
    assert_eq!(r[0]["Status"], "5.2.2");
    assert_eq!(r[0]["Diagnostic-Code"], "smtp; 552 mailbox full");
    let human = d.parsed["human"].as_str().unwrap();
    assert!(human.contains("<y@remote.example>"), "{human}");
    assert!(
        !human.contains("x@remote") && !human.contains("z@remote"),
        "{human}"
    );
}

#[tokio::test]
async fn utf8_content_is_returned_as_message_global_with_8bit_declared() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let state = json!({
        "origin": {"smtputf8": true, "body": "8BITMIME"},
        "dsn": {"ret": "FULL", "envid": null, "rcpt": [{"notify": null, "orcpt": "utf-8;jörg@bücher.example"}]},
        "bounce": {"kind": "permanent", "diagnostic": "Postfach voll: Jörg", "enhanced_status": "5.2.2"}
    });
    let headers =
        "From: Zoë <zoë@example.test>\r\nTo: jörg@bücher.example\r\nSubject: Grüße aus Zürich\r\n";
    let body = "Schöne Grüße!\r\n";
    let id = at_bounce(
        &db,
        "bounce",
        "zoë@example.test",
        &["jörg@bücher.example"],
        headers,
        body,
        state,
    )
    .await;
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let d = dsn(&db, id).await;
    check_envelope(&d, "zoë@example.test");
    let p = &d.parsed;
    assert_eq!(p["cte"], "8bit");
    assert_eq!(p["report_type"], "global-delivery-status");
    assert_eq!(
        p["parts"],
        json!([
            "text/plain",
            "message/global-delivery-status",
            "message/global"
        ])
    );
    let r = &p["recipients"][0];
    assert_eq!(r["Final-Recipient"], "utf-8; jörg@bücher.example");
    assert_eq!(r["Original-Recipient"], "utf-8; jörg@bücher.example");
    assert_eq!(r["Diagnostic-Code"], "X-Pepsi; Postfach voll: Jörg");
    assert_eq!(
        p["returned"],
        json!({"subject": "Grüße aus Zürich", "body": body})
    );
    assert!(
        p["human"]
            .as_str()
            .unwrap()
            .contains("<jörg@bücher.example>: Postfach voll: Jörg")
    );
}

#[tokio::test]
async fn a_malformed_state_or_a_missing_next_stage_fails_the_message_for_an_operator() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let no_bounce = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        json!({"dsn": null}),
    )
    .await;
    let bad_kind = at_bounce(
        &db,
        "bounce",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        json!({"bounce": {"kind": "soft"}}),
    )
    .await;
    let nowhere = at_bounce(
        &db,
        "bounce-nowhere",
        "alice@example.test",
        &["bob@remote.example"],
        ORIGINAL_HEADERS,
        ORIGINAL_BODY,
        json!({"bounce": {"kind": "permanent"}}),
    )
    .await;
    assert_eq!(
        worker(&cfg, &[no_bounce, bad_kind, nowhere]).await,
        vec!["0"; 3]
    );
    for (id, want) in [
        (no_bounce, "state.bounce is missing"),
        (bad_kind, "state.bounce.kind: unknown variant `soft`"),
        (nowhere, "[stage-bounce-nowhere] has no NEXT_STAGE"),
    ] {
        let (status, state, mail_from): (String, Value, String) = sqlx::query_as(
            "SELECT status::text, state, mail_from FROM pepsi.workqueue WHERE workqueue_id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(status, "failed");
        assert_eq!(
            mail_from, "alice@example.test",
            "the message is left as it was"
        );
        let reason = state["bounce_error"].as_str().unwrap_or_default();
        assert!(reason.contains(want), "{reason:?} should contain {want:?}");
    }
}
