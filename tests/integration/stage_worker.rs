//! Stage programs as programs: `pepsi-stage-discard worker` over its real stdin/stdout
//! protocol against a real database, and `pepsi-setup db` as an operator runs it.

use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;

use crate::support;

const DISCARD: &str = env!("CARGO_BIN_EXE_pepsi-stage-discard");
const SETUP: &str = env!("CARGO_BIN_EXE_pepsi-setup");

fn config(db: &TestDb, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n\n[stage-discard]\nPROGRAM = pepsi-stage-discard\n\n[stage-relay]\nPROGRAM = pepsi-stage-relay-to-lmtp\n",
            db.url
        ),
    )
    .unwrap();
    path
}

/// A message running at `stage`, or left pending when `stage` is None.
async fn message(db: &TestDb, stage: Option<&str>) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'Subject: x\r\n'::bytea, 'y\r\n'::bytea)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    if let Some(stage) = stage {
        sqlx::query(
            "UPDATE pepsi.workqueue SET status = 'running', stage = $2 WHERE workqueue_id = $1",
        )
        .bind(id)
        .bind(stage)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    id
}

/// Feeds `input` to a discard worker and returns its stdout lines.
fn worker(cfg: &std::path::Path, input: String) -> Vec<String> {
    support::stage_worker(DISCARD, cfg, &input)
}

async fn exists(db: &TestDb, id: i64) -> Option<(String, String)> {
    sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn echo_id_to_the_discard_worker_finishes_the_message() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let id = message(&db, Some("discard")).await;
    let lines = tokio::task::spawn_blocking(move || worker(&cfg, format!("{id}\n")))
        .await
        .unwrap();
    assert_eq!(lines, vec![r#"0 {"finished":true}"#]);
    assert_eq!(exists(&db, id).await, None);
    let bodies: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue_body")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(bodies, 0);
}

#[tokio::test]
async fn bad_ids_get_a_nonzero_status_the_row_stays_and_the_worker_goes_on() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let pending = message(&db, None).await;
    let foreign = message(&db, Some("relay")).await;
    let good = message(&db, Some("discard")).await;
    let input = format!("abc\n{pending}\n{foreign}\n987654321\n{good}\n");
    let lines = tokio::task::spawn_blocking(move || worker(&cfg, input))
        .await
        .unwrap();
    assert_eq!(lines.len(), 5, "{lines:?}");
    let expect = [
        "workqueue id \\\"abc\\\" is not a number",
        "is pending, not running",
        "whose PROGRAM is \\\"pepsi-stage-relay-to-lmtp\\\", not pepsi-stage-discard",
        "does not exist",
    ];
    for (line, want) in lines.iter().zip(expect) {
        assert!(line.starts_with("1 {"), "non-zero status: {line}");
        assert!(line.contains(want), "{line:?} should mention {want:?}");
        let json: serde_json::Value = serde_json::from_str(&line[2..]).unwrap();
        assert_eq!(json["temporary"], false);
    }
    assert_eq!(lines[4], r#"0 {"finished":true}"#);
    assert_eq!(
        exists(&db, pending).await,
        Some(("init".into(), "pending".into()))
    );
    assert_eq!(
        exists(&db, foreign).await,
        Some(("relay".into(), "running".into()))
    );
    assert_eq!(exists(&db, good).await, None);
}

/// A row not as the dispatcher handed it (pending, at a stage of another program: what a
/// PostgreSQL crash that lost a claim or a handed-forward advance leaves; or gone) is
/// answered `"misplaced":true`, so the dispatcher returns it rather than failing it; a bad
/// id is not.
#[tokio::test]
async fn a_row_not_as_handed_is_answered_misplaced_and_a_bad_id_is_not() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let pending = message(&db, None).await;
    let foreign = message(&db, Some("relay")).await;
    let input = format!("abc\n{pending}\n{foreign}\n987654321\n");
    let lines = tokio::task::spawn_blocking(move || worker(&cfg, input))
        .await
        .unwrap();
    let misplaced: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(&l[2..]).unwrap()["misplaced"].clone())
        .collect();
    assert_eq!(
        misplaced,
        vec![
            serde_json::Value::Null,
            serde_json::Value::Bool(true),
            serde_json::Value::Bool(true),
            serde_json::Value::Bool(true)
        ],
        "{lines:?}"
    );
}

#[tokio::test]
async fn two_workers_on_different_rows_at_once_do_not_interfere() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let mut ids = Vec::new();
    for _ in 0..60 {
        ids.push(message(&db, Some("discard")).await);
    }
    let keep = message(&db, Some("relay")).await;
    let (a, b) = ids.split_at(30);
    let input = |ids: &[i64]| ids.iter().map(|i| format!("{i}\n")).collect::<String>();
    let (ia, ib) = (input(a), input(b));
    let (ca, cb) = (cfg.clone(), cfg.clone());
    let ta = tokio::task::spawn_blocking(move || worker(&ca, ia));
    let tb = tokio::task::spawn_blocking(move || worker(&cb, ib));
    let (la, lb) = (ta.await.unwrap(), tb.await.unwrap());
    assert_eq!(la, vec![r#"0 {"finished":true}"#; 30]);
    assert_eq!(lb, vec![r#"0 {"finished":true}"#; 30]);
    let left: Vec<i64> = sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, vec![keep]);
}

#[test]
fn a_malformed_configuration_stops_the_worker_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.conf");
    std::fs::write(
        &path,
        "[database]\nURL = postgres://x/y\nthis line is not an option\n",
    )
    .unwrap();
    let out = Command::new(DISCARD)
        .args(["worker", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "stdout belongs to the status protocol"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:3", path.display())), "{err}");
}

#[test]
fn worker_help_documents_the_protocol() {
    let out = Command::new(DISCARD)
        .args(["worker", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("echo <workqueue_id> | PROGRAM worker"),
        "{help}"
    );
    assert!(help.contains("--config"), "{help}");
}

fn setup_db(url: &str, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(SETUP)
        .args(["db", "--database-url", url])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn pepsi_setup_db_is_idempotent_and_check_exits_2_when_work_remains() {
    let db = TestDb::new().await;
    let url = db.url.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || setup_db(&url, &[]))
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    let level = pepsi_setup::schema::PATCHES.last().unwrap().name;
    assert!(
        out.starts_with(&format!("patch level: {level} (current, grants verified)")),
        "{out}"
    );
    assert!(out.contains("nothing to change"), "{out}");

    sqlx::raw_sql("REVOKE SELECT ON pepsi.settings FROM \"pepsi-config\"")
        .execute(&db.pool)
        .await
        .unwrap();
    let url = db.url.clone();
    let (code, out, _) =
        tokio::task::spawn_blocking(move || setup_db(&url, &["--check", "--json"]))
            .await
            .unwrap();
    assert_eq!(code, 2, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["current"], false);
    assert_eq!(
        report["privileges_wrong"][0],
        "pepsi-config lacks SELECT on pepsi.settings"
    );

    let url = db.url.clone();
    let (code, out, _) = tokio::task::spawn_blocking(move || setup_db(&url, &[]))
        .await
        .unwrap();
    assert_eq!(code, 0);
    assert!(
        out.contains("changed: GRANT SELECT ON pepsi.\"settings\" TO \"pepsi-config\""),
        "{out}"
    );
}

/// `pepsi-setup dns` without --key-file stores the key as a row the signing stage reads,
/// and never replaces one: the same selector again is refused, naming it.
#[tokio::test]
async fn pepsi_setup_dns_stores_the_key_in_the_database_and_never_replaces_it() {
    let db = TestDb::new().await;
    let dns = |url: String| {
        tokio::task::spawn_blocking(move || {
            let out = Command::new(SETUP)
                .args(["dns", "example.test", "--mx", "mx.example.test"])
                .args([
                    "--selector",
                    "s1",
                    "--algorithm",
                    "ed25519",
                    "--mta-sts",
                    "off",
                ])
                .args(["--database-url", &url])
                .output()
                .unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let (code, out, err) = dns(db.url.clone()).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("s1._domainkey.example.test. 3600 IN TXT \"v=DKIM1; k=ed25519; p="),
        "{out}"
    );
    assert!(!out.contains("_mta-sts"), "MTA-STS off: {out}");
    assert!(
        out.contains("DKIM private key: pepsi.signing_key (example.test, s1)"),
        "{out}"
    );
    let pem: String = sqlx::query_scalar(
        "SELECT private_key FROM pepsi.signing_key WHERE domain = 'example.test' AND selector = 's1'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(pepsi_outbound::keys::parse_private_key(pem.as_bytes()).is_ok());

    let (code, out, err) = dns(db.url.clone()).await.unwrap();
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("already has a key for example.test under selector s1"),
        "{err}"
    );
    let still: String = sqlx::query_scalar("SELECT private_key FROM pepsi.signing_key")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(still, pem, "the stored key is unchanged");
}

/// `pepsi-setup dns --certificate` prints the MX's DANE-EE TLSA record (3 1 1): the
/// SHA-256 of the certificate's public key, as openssl computes it, and the MTA-STS record
/// and policy the relay stage's parser reads back.
#[test]
fn pepsi_setup_dns_prints_the_tlsa_record_of_the_certificate_and_a_policy_that_parses() {
    let dir = tempfile::tempdir().unwrap();
    let ca = crate::support::ingress::TestCa::new(dir.path());
    let openssl = |cmd: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let want = openssl(&format!(
        "openssl x509 -in {} -noout -pubkey | openssl pkey -pubin -outform DER | openssl dgst -sha256 -r",
        ca.cert.display()
    ));
    let want = want.split_whitespace().next().unwrap().to_owned();
    let out = Command::new(SETUP)
        .args([
            "dns",
            "example.test",
            "--mx",
            "mx.example.test",
            "--selector",
            "s1",
        ])
        .args(["--mta-sts", "enforce", "--json", "--certificate"])
        .arg(&ca.cert)
        .arg("--key-file")
        .arg(dir.path().join("dkim.pem"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let records = json["records"].as_array().unwrap();
    let tlsa = records
        .iter()
        .find(|r| r["type"] == "TLSA")
        .expect("a TLSA record");
    assert_eq!(tlsa["name"], "_25._tcp.mx.example.test");
    assert_eq!(tlsa["value"], format!("3 1 1 {want}"));
    let sts = records
        .iter()
        .find(|r| r["name"] == "_mta-sts.example.test")
        .unwrap();
    assert!(
        pepsi_smtp::sts::Record::parse(sts["value"].as_str().unwrap()).is_ok(),
        "{sts}"
    );
    let policy =
        pepsi_smtp::sts::Policy::parse(json["mta_sts_policy"].as_str().unwrap().as_bytes())
            .unwrap();
    assert_eq!(policy.mode, pepsi_smtp::sts::Mode::Enforce);
    assert!(policy.allows("mx.example.test"));

    let bad = dir.path().join("not-a-cert.pem");
    std::fs::write(&bad, "hello\n").unwrap();
    let out = Command::new(SETUP)
        .args([
            "dns",
            "example.test",
            "--mx",
            "mx.example.test",
            "--certificate",
        ])
        .arg(&bad)
        .arg("--key-file")
        .arg(dir.path().join("dkim2.pem"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not-a-cert.pem holds no PEM certificate"),
        "{err}"
    );
}

#[test]
fn pepsi_setup_without_a_database_names_the_missing_option() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pepsi.conf");
    std::fs::write(&path, "[pepsi]\n").unwrap();
    let out = Command::new(SETUP)
        .args(["db", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("URL") && err.to_lowercase().contains("database"),
        "{err}"
    );
}

#[tokio::test]
async fn with_return_status_the_discard_stage_sends_mail_back_through_the_bounce_stage() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\n[stage-remote]\nPROGRAM = pepsi-stage-discard\n\
             BOUNCE_STAGE = bounce\nRETURN_STATUS = 5.4.4\nRETURN_TEXT = no relay configured\n",
            db.url
        ),
    )
    .unwrap();
    let id = message(&db, Some("remote")).await;
    assert_eq!(worker(&cfg, format!("{id}\n")), vec!["0"]);
    let (stage, status, bounce): (String, String, serde_json::Value) = sqlx::query_as(
        "SELECT stage, status::text, state->'bounce' FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    assert_eq!(bounce["kind"], "permanent");
    assert_eq!(bounce["enhanced_status"], "5.4.4");
    assert_eq!(bounce["diagnostic"], "no relay configured");
    assert_eq!(bounce["stage"], "remote");
}

/// Every section is parsed when the worker starts (stage contract v2): a transient
/// RETURN_STATUS in any discard section stops the worker before it reads an id, with an
/// error naming the section and the option, and the message is left as it was.
#[tokio::test]
async fn a_bad_option_in_any_section_stops_the_worker_before_its_first_id() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\n[stage-remote]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-odd]\nPROGRAM = pepsi-stage-discard\nBOUNCE_STAGE = bounce\nRETURN_STATUS = 4.4.4\n",
            db.url
        ),
    )
    .unwrap();
    let id = message(&db, Some("remote")).await;
    let mut child = Command::new(DISCARD)
        .arg("worker")
        .arg("-c")
        .arg(&cfg)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        let _ = writeln!(stdin, "{id}");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "no status line: {:?}", out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[stage-odd]") && err.contains("RETURN_STATUS"),
        "{err}"
    );
    assert_eq!(
        exists(&db, id).await,
        Some(("remote".to_owned(), "running".to_owned()))
    );
}

/// A message with `rcpt_to`, running at `stage`.
async fn message_to(db: &TestDb, stage: &str, rcpt_to: &[&str]) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('a@example.test', $1, 'Subject: x\r\n'::bytea, 'y\r\n'::bytea)",
    )
    .bind(rcpt_to)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    support::claim(&db.pool, id, stage).await;
    id
}

#[tokio::test]
async fn domain_and_address_overrides_apply_to_the_messages_they_are_for() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(
        &cfg,
        format!(
            "[database]\nURL = {}\n\n[stage-remote]\nPROGRAM = pepsi-stage-discard\nBOUNCE_STAGE = bounce\n\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    // Globally the stage drops; mail for blocked.example is returned instead, except to one
    // address of it whose own row says something else again.
    sqlx::query(
        "INSERT INTO pepsi.config_override (scope, section, option, value) VALUES \
         ('domain:blocked.example', 'stage-remote', 'RETURN_STATUS', '5.7.1'), \
         ('domain:blocked.example', 'stage-remote', 'RETURN_TEXT', 'blocked by policy'), \
         ('address:vip@blocked.example', 'stage-remote', 'RETURN_STATUS', '5.2.1')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let one = message_to(&db, "remote", &["X@Blocked.Example"]).await;
    let two = message_to(&db, "remote", &["a@blocked.example", "b@blocked.example"]).await;
    let vip = message_to(&db, "remote", &["vip@blocked.example"]).await;
    let mixed = message_to(&db, "remote", &["a@blocked.example", "c@ok.example"]).await;
    let ok = message_to(&db, "remote", &["c@ok.example"]).await;
    let answers = support::run_ids(DISCARD, &cfg, &[one, two, vip, mixed, ok]).await;
    assert_eq!(answers.len(), 5, "{answers:?}");
    assert!(answers.iter().all(|a| a.starts_with('0')), "{answers:?}");
    let left = support::rows(&db.pool).await;
    let status_of = |id: i64| {
        left.iter()
            .find(|r| r.0 == id)
            .map(|r| (r.1.clone(), r.4["bounce"]["enhanced_status"].clone()))
    };
    let returned = |code: &str| Some(("bounce".to_owned(), serde_json::json!(code)));
    assert_eq!(
        status_of(one),
        returned("5.7.1"),
        "one recipient of the domain"
    );
    assert_eq!(
        status_of(two),
        returned("5.7.1"),
        "recipients all of the domain"
    );
    assert_eq!(
        status_of(vip),
        returned("5.2.1"),
        "the address's own row wins"
    );
    // Recipients of two domains have no one scope: the global section (drop) applies.
    assert_eq!(status_of(mixed), None, "{left:?}");
    assert_eq!(status_of(ok), None, "{left:?}");
    let text = left.iter().find(|r| r.0 == one).unwrap().4["bounce"]["diagnostic"].clone();
    assert_eq!(text, "blocked by policy");

    // A scoped row that the stage cannot read stops the worker at start, naming the scope.
    sqlx::query(
        "INSERT INTO pepsi.config_override (scope, section, option, value) VALUES \
         ('domain:broken.example', 'stage-remote', 'RETURN_STATUS', '2.0.0')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let err = support::worker_start_error(DISCARD, &cfg);
    assert!(
        err.contains("[stage-remote] for scope domain:broken.example")
            && err.contains("RETURN_STATUS"),
        "{err}"
    );
}

/// Issue 34 item 4: a pass whose load waits on a lock (or on a database that stops
/// answering) gives up after `[database] STATEMENT_TIMEOUT` as a temporary failure, so the
/// row is retried rather than failed and the worker is not held; the same row passes once the
/// lock is gone.
#[tokio::test]
async fn a_pass_held_by_a_lock_on_the_queue_is_a_temporary_failure_after_statement_timeout() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replacen("[database]\n", "[database]\nSTATEMENT_TIMEOUT = 2s\n", 1),
    )
    .unwrap();
    let id = message(&db, Some("discard")).await;
    let mut child = tokio::process::Command::new(DISCARD)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The worker is up (its first pass answered) before the queue is locked.
    let other = message(&db, Some("discard")).await;
    stdin
        .write_all(format!("{other}\n").as_bytes())
        .await
        .unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker answered")
        .unwrap()
        .unwrap();
    assert!(first.starts_with('0'), "{first}");

    let mut locker = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE pepsi.workqueue IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    stdin.write_all(format!("{id}\n").as_bytes()).await.unwrap();
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("the pass gave up after STATEMENT_TIMEOUT")
        .unwrap()
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(1500),
        "answered after {waited:?}: {line}"
    );
    let (code, json) = line.split_once(' ').expect("a failure with its reason");
    assert_eq!(code, "1", "{line}");
    let report: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(report["temporary"], true, "{line}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("statement timeout"),
        "{line}"
    );
    locker.rollback().await.unwrap();
    assert_eq!(
        exists(&db, id).await,
        Some(("discard".into(), "running".into()))
    );

    stdin.write_all(format!("{id}\n").as_bytes()).await.unwrap();
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("the worker answered")
        .unwrap()
        .unwrap();
    assert!(line.starts_with('0'), "{line}");
    assert_eq!(
        exists(&db, id).await,
        None,
        "discarded once the lock is gone"
    );
    drop(stdin);
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

/// Runs the stage worker `program` as root in a private mount namespace where
/// /etc/pepsi/pepsi.conf names `url` (no password) and root's home holds a `.pgpass` of user
/// nobody (mode 0600) with a line without colons; the copy runs with `mode` (04755: through
/// a set-user-id bit, as nobody). Returns its stderr.
fn run_beside_a_pgpass(program: &str, url: &str, mode: &str) -> String {
    const SCRIPT: &str = r#"set -e
T=$1; BIN=$2; URL=$3; MODE=$4
mount -t tmpfs tmpfs "$T"
mkdir -p "$T/up/pepsi" "$T/work" "$T/home" "$T/bin"
printf '[database]\nURL = %s\n[stage-discard]\nPROGRAM = pepsi-stage-discard\n' "$URL" > "$T/up/pepsi/pepsi.conf"
mount -t overlay overlay -o lowerdir=/etc,upperdir="$T/up",workdir="$T/work" /etc
printf 'leaked-pgpass-line-without-colons\n' > "$T/home/.pgpass"
chown 65534 "$T/home/.pgpass"
chmod 600 "$T/home/.pgpass"
mount --bind "$T/home" /root
cp "$BIN" "$T/bin/stage"
chown 65534 "$T/bin/stage"
chmod "$MODE" "$T/bin/stage"
unset HOME
exec "$T/bin/stage" worker -L debug < /dev/null
"#;
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", SCRIPT, "sh"])
        .arg(dir.path())
        .args([program, url, mode])
        .output()
        .expect("run unshare");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Security review 2026-12-04 #9: a stage started through its set-user-id bit (the crypto
/// stages) pins HOME to /nonexistent, so the database client never reads the caller's
/// `~/.pgpass` with the bit's identity and never logs its lines to the caller.
#[tokio::test]
async fn security_review_9_a_setuid_stage_never_reads_the_callers_pgpass() {
    let db = TestDb::new().await;
    let url = db.url.replacen("postgres@", "", 1);
    assert!(!url.contains('@'), "{url}");
    // Without the bit, the client reads root's .pgpass (HOME is unset): the fixture works.
    let plain = run_beside_a_pgpass(DISCARD, &url, "0755");
    assert!(
        plain.contains("leaked-pgpass-line-without-colons"),
        "{plain}"
    );
    // Through the bit, as nobody: the URL is parsed and the connection made as nobody, but
    // no .pgpass of the caller is read.
    let setuid = run_beside_a_pgpass(DISCARD, &url, "4755");
    assert!(setuid.contains("nobody"), "{setuid}");
    assert!(
        !setuid.contains("leaked-pgpass-line-without-colons"),
        "{setuid}"
    );
    assert!(setuid.contains("/nonexistent/.pgpass"), "{setuid}");
}

/// The names of `pid`'s threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .collect()
}

/// A worker fed through pipes, as the dispatcher feeds it, reads its ids and writes its
/// status lines on its own thread. Between two ids it waits with no thread of tokio's
/// blocking pool: reading stdin through that pool kept a thread blocked in read(2) and sent
/// every id across two threads and back.
#[tokio::test]
async fn a_worker_fed_by_pipes_waits_for_its_next_id_on_its_own_thread() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let first = message(&db, Some("discard")).await;
    let second = message(&db, Some("discard")).await;
    let mut child = Command::new(DISCARD)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (threads, answers) = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead as _, Write as _};
        let mut answer = || {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            line.trim_end().to_owned()
        };
        writeln!(stdin, "{first}").unwrap();
        let one = answer();
        // Answered and waiting: the worker is in its read of the next id.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let threads = thread_names(pid);
        writeln!(stdin, "{second}").unwrap();
        let two = answer();
        drop(stdin);
        assert!(child.wait().unwrap().success(), "the worker ends at EOF");
        (threads, vec![one, two])
    })
    .await
    .unwrap();
    assert_eq!(answers, [r#"0 {"finished":true}"#; 2]);
    assert!(
        !threads.iter().any(|t| t.starts_with("tokio")),
        "no blocking-pool thread while waiting for an id: {threads:?}"
    );
    assert_eq!(exists(&db, first).await, None);
    assert_eq!(exists(&db, second).await, None);
}

/// Run by hand with its ids in a file and its answers sent to a file, neither a pipe, the
/// worker reads and writes them as it always did (through tokio's blocking pool) and
/// answers every id.
#[tokio::test]
async fn a_worker_reads_its_ids_from_a_file_and_answers_into_a_file() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    let done = message(&db, Some("discard")).await;
    let pending = message(&db, None).await;
    let ids = dir.path().join("ids");
    std::fs::write(&ids, format!("{done}\n{pending}\n")).unwrap();
    let answers = dir.path().join("answers");
    let status = Command::new(DISCARD)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(std::fs::File::open(&ids).unwrap())
        .stdout(std::fs::File::create(&answers).unwrap())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let lines: Vec<String> = std::fs::read_to_string(&answers)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], r#"0 {"finished":true}"#);
    assert!(
        lines[1].starts_with("1 {") && lines[1].contains("is pending, not running"),
        "{}",
        lines[1]
    );
    assert_eq!(exists(&db, done).await, None);
}
