//! pepsi-stage-relay-to-lmtp as a worker process against real LMTP servers and a real
//! PostgreSQL: a small LMTP server written here (TCP and unix socket, scripted per-recipient
//! replies, recording what it received) and a private Dovecot instance.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::lmtp::TestLmtp;

const LMTP: &str = env!("CARGO_BIN_EXE_pepsi-stage-relay-to-lmtp");

/// A message with lines that need dot-stuffing, a dot in the middle of a line, and 8-bit text.
const RAW: &[u8] = b"From: sender@example.test\r\nTo: a@x\r\nSubject: dots\r\n\r\n\
.starts with a dot\r\n..two dots\r\n.\r\nmiddle . dot\r\nGr\xc3\xbc\xc3\x9fe\r\nlast line\r\n";

fn config(db: &TestDb, dir: &Path, target: &str, extra: &str) -> PathBuf {
    let path = dir.join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n\n[stage-lmtp]\nPROGRAM = pepsi-stage-relay-to-lmtp\n\
             LMTP = {target}\nLHLO_NAME = relay.example.test\nBOUNCE_STAGE = bounce\n\
             CONNECT_TIMEOUT = 5s\nCOMMAND_TIMEOUT = 20s\nDATA_TIMEOUT = 20s\n{extra}\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-bounce\n",
            db.url
        ),
    )
    .unwrap();
    path
}

/// A message running at stage `lmtp`, with `state.dsn` giving each recipient a NOTIFY.
async fn message(db: &TestDb, rcpt: &[&str], raw: &[u8]) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let dsn: Vec<Value> = rcpt
        .iter()
        .map(|r| json!({"notify": ["FAILURE"], "orcpt": format!("rfc822;{r}")}))
        .collect();
    let state = json!({"dsn": {"ret": null, "envid": null, "rcpt": dsn}});
    let (headers, body) = pepsi_contract::message::split(raw);
    let id: i64 =
        sqlx::query_scalar("SELECT pepsi.workqueue_add('sender@example.test', $1, $2, $3, $4)")
            .bind(&rcpt)
            .bind(headers)
            .bind(body)
            .bind(&state)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = 'lmtp' WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

async fn worker(cfg: PathBuf, ids: &[i64]) -> Vec<String> {
    support::run_ids(LMTP, &cfg, ids).await
}

/// Every row: (id, stage, status, rcpt_to, state).
async fn rows(db: &TestDb) -> Vec<(i64, String, String, Vec<String>, Value)> {
    support::rows(&db.pool).await
}

#[tokio::test]
async fn a_rejected_recipient_is_bounced_with_the_servers_reply_and_the_other_delivered() {
    let server = TestLmtp::tcp(&[("b@x", "550 5.1.1 <b@x> no such user")], &[]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &server.target, "");
    let id = message(&db, &["a@x", "b@x"], RAW).await;

    let lines = worker(cfg, &[id]).await;
    assert_eq!(lines, vec![r#"0 {"finished":true}"#]);

    let got = server.messages();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].mail_from, "sender@example.test");
    assert_eq!(got[0].rcpt, vec!["a@x"]);
    assert_eq!(
        String::from_utf8_lossy(&got[0].data),
        String::from_utf8_lossy(RAW),
        "the server must receive the message byte for byte"
    );
    assert_eq!(got[0].data, RAW);
    let mail = server
        .log
        .lock()
        .unwrap()
        .commands
        .iter()
        .find(|c| c.starts_with("MAIL"))
        .cloned()
        .unwrap();
    assert_eq!(
        mail,
        format!(
            "MAIL FROM:<sender@example.test> SIZE={} BODY=8BITMIME",
            RAW.len()
        )
    );

    let rows = rows(&db).await;
    assert_eq!(rows.len(), 1, "only the bounce clone is left: {rows:?}");
    let (_, stage, status, rcpt, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    assert_eq!(rcpt, &vec!["b@x".to_owned()]);
    let bounce = &state["bounce"];
    assert_eq!(bounce["kind"], "permanent");
    assert_eq!(bounce["stage"], "lmtp");
    assert_eq!(bounce["smtp_code"], 550);
    assert_eq!(bounce["enhanced_status"], "5.1.1");
    assert_eq!(bounce["reply_text"], "550 5.1.1 <b@x> no such user");
    assert_eq!(bounce["remote_mta"], "lmtp.test");
    assert_eq!(bounce["phase"], "RCPT");
    assert_eq!(bounce["recipients"]["b@x"]["smtp_code"], 550);
    assert!(bounce["recipients"].get("a@x").is_none(), "{bounce}");
    assert_eq!(
        state["dsn"]["rcpt"],
        json!([{"notify": ["FAILURE"], "orcpt": "rfc822;b@x"}])
    );
}

#[tokio::test]
async fn a_deferred_recipient_stays_paused_alone() {
    let server = TestLmtp::tcp(&[("b@x", "452 4.2.2 <b@x> mailbox full")], &[]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &server.target, "RETRY_INITIAL = 1m\n");
    let id = message(&db, &["a@x", "b@x"], RAW).await;

    assert_eq!(worker(cfg, &[id]).await, vec!["0"]);
    let got = server.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].rcpt, vec!["a@x"]);

    let rows = rows(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (row_id, stage, status, rcpt, state) = &rows[0];
    assert_eq!(*row_id, id);
    assert_eq!((stage.as_str(), status.as_str()), ("lmtp", "paused"));
    assert_eq!(rcpt, &vec!["b@x".to_owned()]);
    assert_eq!(state["attempts"], 1);
    let last = state["last_error"].as_str().unwrap();
    assert!(last.starts_with("452 4.2.2 <b@x> mailbox full"), "{last}");
    assert_eq!(state["dsn"]["rcpt"][0]["orcpt"], "rfc822;b@x");
    let timeout: bool = sqlx::query_scalar(
        "SELECT timeout > now() + interval '50 seconds' FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(timeout, "paused for RETRY_INITIAL");
}

/// A server that answers the first recipient after the dot and then falls silent: at
/// ATTEMPT_TIMEOUT the answered recipient stays delivered, the other waits for its retry
/// (4.4.2), and the worker ends its pass well before MAX_RUNTIME would kill it.
#[tokio::test]
async fn attempt_timeout_keeps_the_recipients_answered_before_it() {
    let server = TestLmtp::tcp(&[], &[("b@x", "HANG")]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        &server.target,
        "ATTEMPT_TIMEOUT = 2s
MAX_RUNTIME = 1m
RETRY_INITIAL = 1m
",
    );
    let id = message(&db, &["a@x", "b@x"], RAW).await;

    assert_eq!(worker(cfg.clone(), &[id]).await, vec!["0"]);
    let got = server.messages();
    assert_eq!(got.len(), 1, "the server took the message");
    let rows = rows(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (row_id, stage, status, rcpt, state) = &rows[0];
    assert_eq!(*row_id, id);
    assert_eq!((stage.as_str(), status.as_str()), ("lmtp", "paused"));
    assert_eq!(rcpt, &vec!["b@x".to_owned()], "a@x was delivered");
    let last = state["last_error"].as_str().unwrap();
    assert!(
        last.starts_with("4.4.2") && last.contains("time limit"),
        "{last}"
    );

    // An ATTEMPT_TIMEOUT that MAX_RUNTIME would cut short is refused at start.
    let bad = config(
        &db,
        dir.path(),
        &server.target,
        "ATTEMPT_TIMEOUT = 10m
MAX_RUNTIME = 5m
",
    );
    let text = support::worker_start_error(LMTP, &bad);
    assert!(
        text.contains("ATTEMPT_TIMEOUT = 600s does not end 10s before MAX_RUNTIME = 300s"),
        "{text}"
    );
}

#[tokio::test]
async fn lmtp_replies_after_the_dot_count_per_recipient_and_the_connection_is_kept() {
    let server = TestLmtp::unix(
        &[],
        &[
            ("b@x", "552 5.2.2 <b@x> quota exceeded"),
            ("c@x", "451 4.3.0 <c@x> try again"),
        ],
    )
    .await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &server.target, "");
    let first = message(&db, &["a@x", "b@x", "c@x"], RAW).await;
    let second = message(&db, &["d@x"], b"Subject: two\r\n\r\nsecond\r\n").await;

    assert_eq!(
        worker(cfg, &[first, second]).await,
        vec!["0", r#"0 {"finished":true}"#]
    );
    let got = server.messages();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].rcpt, vec!["a@x", "b@x", "c@x"]);
    assert_eq!(got[1].rcpt, vec!["d@x"]);
    assert_eq!(got[1].data, b"Subject: two\r\n\r\nsecond\r\n");
    {
        let log = server.log.lock().unwrap();
        assert_eq!(
            log.connections, 1,
            "the second message reuses the connection"
        );
        let lhlo = log
            .commands
            .iter()
            .filter(|c| c.starts_with("LHLO"))
            .count();
        assert_eq!(lhlo, 1);
        assert_eq!(log.commands[0], "LHLO relay.example.test");
        let rset = log.commands.iter().position(|c| c == "RSET").unwrap();
        let second_mail = log
            .commands
            .iter()
            .rposition(|c| c.starts_with("MAIL"))
            .unwrap();
        assert!(
            rset < second_mail,
            "RSET before the kept connection's next transaction: {:?}",
            log.commands
        );
    }

    let rows = rows(&db).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let paused = rows.iter().find(|r| r.0 == first).unwrap();
    assert_eq!((paused.1.as_str(), paused.2.as_str()), ("lmtp", "paused"));
    assert_eq!(paused.3, vec!["c@x".to_owned()]);
    let bounce = rows.iter().find(|r| r.1 == "bounce").unwrap();
    assert_eq!(bounce.3, vec!["b@x".to_owned()]);
    let b = &bounce.4["bounce"];
    assert_eq!(b["phase"], "DATA");
    assert_eq!(b["smtp_code"], 552);
    assert_eq!(b["enhanced_status"], "5.2.2");
    assert_eq!(
        b["diagnostic"],
        "<b@x> quota exceeded (in reply to end of DATA command)"
    );
}

#[tokio::test]
async fn connection_refused_pauses_every_recipient() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &format!("127.0.0.1:{port}"), "");
    let id = message(&db, &["a@x", "b@x"], RAW).await;

    assert_eq!(worker(cfg, &[id]).await, vec!["0"]);
    let rows = rows(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (_, stage, status, rcpt, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("lmtp", "paused"));
    assert_eq!(rcpt, &vec!["a@x".to_owned(), "b@x".to_owned()]);
    assert_eq!(state["attempts"], 1);
    let last = state["last_error"].as_str().unwrap();
    assert!(
        last.contains("4.4.1") && last.contains(&format!("cannot connect to 127.0.0.1:{port}")),
        "{last}"
    );
    assert!(state.get("bounce").is_none());
}

/// A private Dovecot: its own configuration, base_dir, passwd-file userdb and Maildirs in a
/// temp dir, LMTP on a unix socket there. Stopped when dropped.
struct Dovecot {
    dir: tempfile::TempDir,
    conf: PathBuf,
    binary: PathBuf,
    child: Child,
}

fn find_dovecot() -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d: PathBuf| d.join("dovecot"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the dovecot binary is missing: install the Debian packages dovecot-core and \
                 dovecot-lmtpd (apt-get install -y dovecot-core dovecot-lmtpd; \
                 scripts/apt-packages.txt lists them and scripts/test.sh installs them)"
            )
        })
}

impl Dovecot {
    fn start(users: &[&str]) -> Dovecot {
        use std::os::unix::fs::PermissionsExt;
        let binary = find_dovecot();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Dovecot's mail processes run as nobody: they must reach the Maildirs.
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut passwd = String::new();
        for user in users {
            let home = root.join("mail").join(user);
            std::fs::create_dir_all(&home).unwrap();
            std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
            passwd.push_str(&format!(
                "{user}:{{PLAIN}}x:65534:65534::{}::\n",
                home.display()
            ));
        }
        std::fs::write(root.join("passwd"), passwd).unwrap();
        let conf = root.join("dovecot.conf");
        let r = root.display();
        std::fs::write(
            &conf,
            format!(
                "protocols = lmtp\nbase_dir = {r}/run\nstate_dir = {r}/state\n\
                 log_path = {r}/dovecot.log\nssl = no\nlisten = 127.0.0.1\n\
                 default_internal_user = nobody\ndefault_internal_group = nogroup\n\
                 default_login_user = nobody\nmail_location = maildir:~/Maildir\n\
                 passdb {{\n  driver = passwd-file\n  args = {r}/passwd\n}}\n\
                 userdb {{\n  driver = passwd-file\n  args = {r}/passwd\n}}\n\
                 service lmtp {{\n  unix_listener lmtp {{\n    mode = 0666\n  }}\n}}\n"
            ),
        )
        .unwrap();
        let output = std::fs::File::create(root.join("dovecot.out")).unwrap();
        let child = Command::new(&binary)
            .arg("-F")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .unwrap();
        let d = Dovecot {
            dir,
            conf,
            binary,
            child,
        };
        let socket = d.socket();
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "dovecot did not open {}: {}{}",
                socket.display(),
                std::fs::read_to_string(d.dir.path().join("dovecot.out")).unwrap_or_default(),
                std::fs::read_to_string(d.dir.path().join("dovecot.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/lmtp")
    }

    /// The files in `user`'s Maildir/new.
    fn new_mail(&self, user: &str) -> Vec<Vec<u8>> {
        let new = self.dir.path().join("mail").join(user).join("Maildir/new");
        match std::fs::read_dir(&new) {
            Ok(entries) => entries
                .map(|e| std::fs::read(e.unwrap().path()).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

impl Drop for Dovecot {
    fn drop(&mut self) {
        let _ = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.conf)
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn dovecot_stores_the_message_in_the_maildir_and_refuses_an_unknown_user() {
    let dovecot = Dovecot::start(&["alice@example.test"]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let target = format!("unix:{}", dovecot.socket().display());
    let cfg = config(&db, dir.path(), &target, "");
    let id = message(&db, &["alice@example.test", "nobody@example.test"], RAW).await;

    assert_eq!(worker(cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);

    let mail = dovecot.new_mail("alice@example.test");
    assert_eq!(mail.len(), 1, "one message in alice's Maildir/new");
    // Dovecot stores LF line ends and prepends its trace fields.
    let stored = String::from_utf8(mail[0].clone()).unwrap();
    let sent = String::from_utf8(RAW.to_vec())
        .unwrap()
        .replace("\r\n", "\n");
    assert!(
        stored.ends_with(&sent),
        "the stored message must end with the message as sent:\n{stored}"
    );
    assert!(
        stored.contains("Delivered-To: alice@example.test"),
        "{stored}"
    );
    assert!(stored.contains("by "), "{stored}");

    let rows = rows(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (_, stage, _, rcpt, state) = &rows[0];
    assert_eq!(stage, "bounce");
    assert_eq!(rcpt, &vec!["nobody@example.test".to_owned()]);
    let b = &state["bounce"];
    assert_eq!(b["smtp_code"], 550);
    assert_eq!(b["enhanced_status"], "5.1.1");
    assert_eq!(b["phase"], "RCPT");
    let text = b["reply_text"].as_str().unwrap();
    assert!(
        text.starts_with("550 5.1.1 <nobody@example.test> User doesn't exist"),
        "{text}"
    );
}
