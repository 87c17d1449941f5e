//! pepsi-stage-relay-to-smarthost as a worker process against real SMTP servers and a real
//! PostgreSQL: the scripted server of `support::lmtp` in SMTP mode (per-recipient and
//! after-the-dot replies, recording what it received), and a private Postfix that offers
//! STARTTLS and SMTP AUTH through a private Dovecot's auth service.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::lmtp::TestLmtp;

const SMARTHOST: &str = env!("CARGO_BIN_EXE_pepsi-stage-relay-to-smarthost");

/// A message with a line that needs dot-stuffing and 8-bit text.
const RAW: &[u8] = b"From: sender@example.test\r\nTo: a@x.example\r\nSubject: relayed\r\n\r\n\
.starts with a dot\r\nGr\xc3\xbc\xc3\x9fe\r\nlast line\r\n";

/// A configuration whose stage `smarthost` relays to `host:port` with `extra` options.
fn config(db: &TestDb, dir: &Path, host: &str, port: u16, extra: &str) -> PathBuf {
    let path = dir.join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n\n[stage-smarthost]\nPROGRAM = pepsi-stage-relay-to-smarthost\n\
             HOST = {host}\nPORT = {port}\nHELO_NAME = out.example.test\nBOUNCE_STAGE = bounce\n\
             CONNECT_TIMEOUT = 5s\nCOMMAND_TIMEOUT = 20s\nDATA_TIMEOUT = 20s\n{extra}\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-bounce\n",
            db.url
        ),
    )
    .unwrap();
    path
}

/// A message running at stage `smarthost`, each recipient asking NOTIFY=FAILURE.
async fn message(db: &TestDb, rcpt: &[&str], raw: &[u8]) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let dsn: Vec<Value> = rcpt
        .iter()
        .map(|r| json!({"notify": ["FAILURE"], "orcpt": format!("rfc822;{r}")}))
        .collect();
    let state = json!({"dsn": {"ret": "HDRS", "envid": "env-1", "rcpt": dsn}});
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
    support::claim(&db.pool, id, "smarthost").await;
    id
}

async fn worker(cfg: &Path, ids: &[i64]) -> Vec<String> {
    support::run_ids(SMARTHOST, cfg, ids).await
}

#[tokio::test]
async fn a_refused_recipient_is_bounced_and_the_others_delivered_in_one_transaction() {
    let server = TestLmtp::smtp(
        &[("b@x.example", "550 5.1.1 <b@x.example> no such user")],
        &[],
    )
    .await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), "127.0.0.1", server.port(), "TLS = none\n");
    let id = message(&db, &["a@x.example", "b@x.example", "c@y.example"], RAW).await;

    assert_eq!(worker(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);

    let got = server.messages();
    assert_eq!(got.len(), 1, "one transaction for every recipient: {got:?}");
    assert_eq!(got[0].mail_from, "sender@example.test");
    assert_eq!(got[0].rcpt, vec!["a@x.example", "c@y.example"]);
    assert_eq!(
        got[0].data, RAW,
        "the smarthost receives the message byte for byte"
    );
    {
        let log = server.log.lock().unwrap();
        assert_eq!(log.commands[0], "EHLO out.example.test");
        let mail = log.commands.iter().find(|c| c.starts_with("MAIL")).unwrap();
        assert_eq!(
            mail,
            &format!(
                "MAIL FROM:<sender@example.test> SIZE={} BODY=8BITMIME RET=HDRS ENVID=env-1",
                RAW.len()
            )
        );
        let rcpt = log.commands.iter().find(|c| c.starts_with("RCPT")).unwrap();
        assert_eq!(
            rcpt,
            "RCPT TO:<a@x.example> NOTIFY=FAILURE ORCPT=rfc822;a@x.example"
        );
    }

    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "only the bounce clone is left: {rows:?}");
    let (_, stage, status, rcpt, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    assert_eq!(rcpt, &vec!["b@x.example".to_owned()]);
    let bounce = &state["bounce"];
    assert_eq!(bounce["kind"], "permanent");
    assert_eq!(bounce["stage"], "smarthost");
    assert_eq!(bounce["smtp_code"], 550);
    assert_eq!(bounce["enhanced_status"], "5.1.1");
    assert_eq!(bounce["remote_mta"], "smtp.test");
    assert_eq!(bounce["phase"], "RCPT");
}

#[tokio::test]
async fn a_4xx_after_the_data_pauses_every_recipient_and_the_retry_delivers() {
    let server = TestLmtp::smtp(&[], &[("a@x.example", "451 4.3.0 queue full, try later")]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        "127.0.0.1",
        server.port(),
        "TLS = none\nRETRY_INITIAL = 1m\n",
    );
    let id = message(&db, &["a@x.example", "b@x.example"], RAW).await;

    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    assert!(server.messages().is_empty());
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (row_id, stage, status, rcpt, state) = &rows[0];
    assert_eq!(*row_id, id);
    assert_eq!((stage.as_str(), status.as_str()), ("smarthost", "paused"));
    assert_eq!(
        rcpt,
        &vec!["a@x.example".to_owned(), "b@x.example".to_owned()]
    );
    assert_eq!(state["attempts"], 1);
    let last = state["last_error"].as_str().unwrap();
    assert!(
        last.starts_with("451 4.3.0 queue full, try later") && last.contains("smtp.test"),
        "{last}"
    );

    // The smarthost recovers; the dispatcher claims the row again when its pause ends.
    server.rescript(&[], &[]);
    support::claim(&db.pool, id, "smarthost").await;
    assert_eq!(worker(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    let got = server.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].rcpt, vec!["a@x.example", "b@x.example"]);
    assert!(
        support::rows(&db.pool).await.is_empty(),
        "delivered: the row is gone"
    );
}

#[tokio::test]
async fn the_connection_is_kept_for_the_next_message_and_reset_before_it() {
    let server = TestLmtp::smtp(&[], &[]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), "127.0.0.1", server.port(), "TLS = none\n");
    let first = message(&db, &["a@x.example"], RAW).await;
    let second = message(&db, &["d@x.example"], b"Subject: two\r\n\r\nsecond\r\n").await;

    assert_eq!(
        worker(&cfg, &[first, second]).await,
        vec![r#"0 {"finished":true}"#, r#"0 {"finished":true}"#]
    );
    let got = server.messages();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].data, b"Subject: two\r\n\r\nsecond\r\n");
    let log = server.log.lock().unwrap();
    assert_eq!(
        log.connections, 1,
        "the second message reuses the connection"
    );
    let ehlo = log
        .commands
        .iter()
        .filter(|c| c.starts_with("EHLO"))
        .count();
    assert_eq!(ehlo, 1);
    let rset = log.commands.iter().position(|c| c == "RSET").unwrap();
    let second_mail = log
        .commands
        .iter()
        .rposition(|c| c.starts_with("MAIL"))
        .unwrap();
    assert!(rset < second_mail, "{:?}", log.commands);
}

#[tokio::test]
async fn with_connection_idle_zero_each_message_gets_its_own_session() {
    let server = TestLmtp::smtp(&[], &[]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        "127.0.0.1",
        server.port(),
        "TLS = none\nCONNECTION_IDLE = 0\n",
    );
    let first = message(&db, &["a@x.example"], RAW).await;
    let second = message(&db, &["d@x.example"], RAW).await;
    assert_eq!(worker(&cfg, &[first, second]).await.len(), 2);
    let log = server.log.lock().unwrap();
    assert_eq!(log.connections, 2);
    assert_eq!(log.commands.iter().filter(|c| *c == "QUIT").count(), 2);
    assert_eq!(log.messages.len(), 2);
}

#[tokio::test]
async fn tls_verify_against_a_server_without_starttls_pauses_and_sends_nothing() {
    // TLS is not given: verify is the default.
    let server = TestLmtp::smtp(&[], &[]).await;
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), "127.0.0.1", server.port(), "");
    let id = message(&db, &["a@x.example"], RAW).await;

    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (_, stage, status, _, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("smarthost", "paused"));
    let last = state["last_error"].as_str().unwrap();
    assert!(
        last.contains("4.7.4") && last.contains("STARTTLS"),
        "{last}"
    );
    let log = server.log.lock().unwrap();
    assert!(
        !log.commands.iter().any(|c| c.starts_with("MAIL")),
        "nothing goes out in clear text: {:?}",
        log.commands
    );
}

/// A private Dovecot that runs only its auth service: a passwd-file of one user and a
/// client socket for Postfix's `smtpd_sasl_type = dovecot`. Stopped when dropped.
struct DovecotAuth {
    conf: PathBuf,
    socket: PathBuf,
}

impl DovecotAuth {
    fn start(root: &Path, user: &str, password: &str) -> DovecotAuth {
        let d = root.join("dovecot");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("passwd"), format!("{user}:{{PLAIN}}{password}\n")).unwrap();
        let conf = d.join("dovecot.conf");
        let r = d.display();
        std::fs::write(
            &conf,
            format!(
                "protocols = none\nbase_dir = {r}/run\nstate_dir = {r}/state\n\
                 log_path = {r}/dovecot.log\nssl = no\ndefault_internal_user = nobody\n\
                 default_internal_group = nogroup\ndefault_login_user = nobody\n\
                 auth_mechanisms = plain login\nauth_failure_delay = 0\n\
                 passdb {{\n  driver = passwd-file\n  args = {r}/passwd\n}}\n\
                 service auth {{\n  unix_listener auth-postfix {{\n    mode = 0666\n  }}\n}}\n"
            ),
        )
        .unwrap();
        // Without -F the master daemonizes once its sockets exist; its output goes to a
        // file, since the daemon keeps it open (a pipe would never reach end of file).
        let out = d.join("dovecot.out");
        let status = Command::new(sbin("dovecot", "dovecot-core"))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(d.join("dovecot.err")).unwrap())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "dovecot did not start: {}{}",
            std::fs::read_to_string(d.join("dovecot.err")).unwrap_or_default(),
            std::fs::read_to_string(d.join("dovecot.log")).unwrap_or_default()
        );
        let socket = d.join("run/auth-postfix");
        wait_for(
            || socket.exists(),
            || format!("dovecot's {}", socket.display()),
        );
        DovecotAuth { conf, socket }
    }
}

impl Drop for DovecotAuth {
    fn drop(&mut self) {
        let _ = Command::new(sbin("dovecot", "dovecot-core"))
            .arg("-c")
            .arg(&self.conf)
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A private Postfix instance (own config and queue directories, its smtpd on a free
/// loopback port) as an authenticated smarthost: STARTTLS with the test CA's certificate,
/// AUTH through Dovecot, relay only for authenticated clients, everything relayed on to
/// `[127.0.0.1]:<sink>`. Stopped when dropped.
struct PostfixSmarthost {
    etc: PathBuf,
    log: PathBuf,
    port: u16,
}

impl PostfixSmarthost {
    fn start(root: &Path, ca: &support::ingress::TestCa, auth: &DovecotAuth, sink: u16) -> Self {
        let pf = root.join("postfix");
        let etc = pf.join("etc");
        for d in ["etc", "queue", "data"] {
            std::fs::create_dir_all(pf.join(d)).unwrap();
        }
        let status = Command::new("chown")
            .arg("postfix")
            .arg(pf.join("data"))
            .status()
            .unwrap();
        assert!(
            status.success(),
            "chown postfix: is the postfix user there?"
        );
        let port = support::free_port();
        let master = std::fs::read_to_string("/etc/postfix/master.cf")
            .expect("/etc/postfix/master.cf: install the Debian package postfix");
        let master: String = master
            .lines()
            .map(|l| {
                if l.starts_with("smtp      inet") {
                    format!("{port}      inet  n       -       n       -       -       smtpd\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(etc.join("master.cf"), master).unwrap();
        let log = root.join("postfix.log");
        let p = pf.display();
        std::fs::write(
            etc.join("main.cf"),
            format!(
                "compatibility_level = 3.6\nqueue_directory = {p}/queue\ndata_directory = {p}/data\n\
                 mail_owner = postfix\ninet_interfaces = 127.0.0.1\ninet_protocols = ipv4\n\
                 myhostname = smarthost.example.test\nmydestination =\nlocal_recipient_maps =\n\
                 mynetworks = 127.0.0.254/32\nrelayhost = [127.0.0.1]:{sink}\n\
                 smtp_tls_security_level = none\n\
                 smtpd_tls_security_level = may\nsmtpd_tls_cert_file = {cert}\n\
                 smtpd_tls_key_file = {key}\nsmtpd_tls_auth_only = yes\nsmtpd_tls_loglevel = 1\n\
                 smtpd_sasl_auth_enable = yes\nsmtpd_sasl_type = dovecot\n\
                 smtpd_sasl_path = {sasl}\n\
                 smtpd_relay_restrictions = permit_sasl_authenticated, reject\n\
                 maillog_file_prefixes = /var, /dev/stdout, {root}\nmaillog_file = {log}\n",
                cert = ca.cert.display(),
                key = ca.key.display(),
                sasl = auth.socket.display(),
                root = root.display(),
                log = log.display(),
            ),
        )
        .unwrap();
        // As for Dovecot: the daemon keeps its output open, so it goes to a file.
        let out = root.join("postfix-start.out");
        let file = std::fs::File::create(&out).unwrap();
        let status = Command::new(sbin("postfix", "postfix"))
            .arg("-c")
            .arg(&etc)
            .arg("start")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "postfix did not start: {}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        let me = PostfixSmarthost { etc, log, port };
        wait_for(
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            || format!("postfix smtpd on 127.0.0.1:{port}"),
        );
        me
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log has a line containing every one of `words`, and returns it.
    fn wait_log_line(&self, words: &[&str]) -> String {
        let found = || {
            self.log()
                .lines()
                .find(|l| words.iter().all(|w| l.contains(w)))
                .map(str::to_owned)
        };
        wait_for(
            || found().is_some(),
            || format!("a postfix log line with {words:?}:\n{}", self.log()),
        );
        found().unwrap()
    }
}

impl Drop for PostfixSmarthost {
    fn drop(&mut self) {
        let _ = Command::new(sbin("postfix", "postfix"))
            .arg("-c")
            .arg(&self.etc)
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `name` in PATH or /usr/sbin; the message names the Debian package to install.
fn sbin(name: &str, package: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d: PathBuf| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing: install the Debian package {package} \
                 (scripts/apt-packages.txt lists it and scripts/test.sh installs it)"
            )
        })
}

/// Polls `done` for up to a minute; the panic says what never happened.
fn wait_for(done: impl Fn() -> bool, what: impl Fn() -> String) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gave up waiting for {}",
            what()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Multi-threaded: the test waits for Postfix with blocking sleeps while the sink it relays
// to is served on the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postfix_with_auth_pauses_on_a_wrong_password_and_relays_over_tls_with_the_right_one() {
    let root = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        // Postfix's daemons (user postfix) reach their queue and Dovecot's socket in here.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ca = support::ingress::TestCa::new(root.path());
    let sink = TestLmtp::smtp(&[], &[]).await;
    let auth = DovecotAuth::start(root.path(), "pepsi", "s3cret");
    let postfix = PostfixSmarthost::start(root.path(), &ca, &auth, sink.port());

    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        "127.0.0.1",
        postfix.port,
        &format!(
            "TLS = verify\nTLS_CA_FILE = {}\nTLS_SERVER_NAME = localhost\nAUTH_USERNAME = pepsi\n\
             RETRY_INITIAL = 1m\n",
            ca.ca.display()
        ),
    );
    // The password lives in a secrets fragment beside the configuration, as in production.
    let secrets = dir.path().join("secrets.d");
    std::fs::create_dir(&secrets).unwrap();
    let fragment = secrets.join("10-smarthost.conf");
    let write_password = |password: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(
            &fragment,
            format!("[stage-smarthost]\nAUTH_PASSWORD = {password}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&fragment, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    let id = message(&db, &["a@x.example", "b@y.example"], RAW).await;

    // A wrong password: Postfix answers 535 5.7.8, a permanent code, but it is about this
    // server's configuration, not the message: the message waits with a clear last_error.
    write_password("wrong");
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "nothing bounced: {rows:?}");
    let (_, stage, status, rcpt, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("smarthost", "paused"));
    assert_eq!(rcpt.len(), 2);
    let last = state["last_error"].as_str().unwrap();
    assert!(
        last.starts_with("535 5.7.8") && last.contains("AUTH"),
        "{last}"
    );
    postfix.wait_log_line(&["authentication failed", "sasl_username=pepsi"]);
    assert!(sink.messages().is_empty());

    // The operator fixes the password; the retry relays over verified TLS, authenticated.
    write_password("s3cret");
    support::claim(&db.pool, id, "smarthost").await;
    assert_eq!(worker(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    assert!(support::rows(&db.pool).await.is_empty());
    let tls = postfix.wait_log_line(&["TLS connection established from localhost[127.0.0.1]"]);
    assert!(tls.contains("TLSv1."), "{tls}");
    let queued = postfix.wait_log_line(&["client=localhost[127.0.0.1]", "sasl_username=pepsi"]);
    assert!(queued.contains("sasl_method="), "{queued}");
    postfix.wait_log_line(&["to=<b@y.example>", "status=sent"]);
    wait_for(
        || !sink.messages().is_empty(),
        || "the message at the sink".into(),
    );
    let got = sink.messages();
    assert_eq!(got[0].mail_from, "sender@example.test");
    assert_eq!(got[0].rcpt, vec!["a@x.example", "b@y.example"]);
    // Postfix adds its Received (authenticated TLS: ESMTPSA) and the Date and Message-Id
    // the message lacked; header fields and body are otherwise as sent.
    let data = String::from_utf8_lossy(&got[0].data);
    let (_, body) = pepsi_contract::message::split(RAW);
    assert!(
        data.contains("with ESMTPSA")
            && data.contains("\r\nSubject: relayed\r\n")
            && data.ends_with(&format!("\r\n\r\n{}", String::from_utf8_lossy(body))),
        "{data}"
    );
}

#[tokio::test]
async fn a_smarthost_slower_than_attempt_timeout_pauses_the_message_and_one_over_max_runtime_stops_the_worker()
 {
    // A smarthost that takes the connection and never greets (COMMAND_TIMEOUT is 20 s).
    let tarpit = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tarpit.local_addr().unwrap().port();
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        "127.0.0.1",
        port,
        "TLS = none\nATTEMPT_TIMEOUT = 2s\n",
    );
    let id = message(&db, &["a@x.example", "b@x.example"], RAW).await;
    assert_eq!(worker(&cfg, &[id]).await, vec!["0"]);
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (_, stage, status, _, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("smarthost", "paused"));
    let last = state["last_error"].as_str().unwrap();
    assert!(last.contains("ATTEMPT_TIMEOUT (2s)"), "{last}");

    let cfg = config(
        &db,
        dir.path(),
        "127.0.0.1",
        port,
        "TLS = none\nATTEMPT_TIMEOUT = 10m\n",
    );
    let err = support::worker_start_error(SMARTHOST, &cfg);
    assert!(
        err.contains(
            "ATTEMPT_TIMEOUT = 600s does not end 10s before MAX_RUNTIME = 300s of [stage-smarthost]"
        ),
        "{err}"
    );
    drop(tarpit);
}
