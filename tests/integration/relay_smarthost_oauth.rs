//! OAuth 2.0 for the smarthost, through real processes: pepsi-stage-relay-to-smarthost as a
//! worker over a real PostgreSQL, logging in with the access token of its AUTH_TOKEN_FILE
//! (SASL OAUTHBEARER or XOAUTH2 after STARTTLS with a verified certificate), and the real
//! pepsi-helper-token-refresh keeping that file fresh.
//!
//! The peers are loopback stand-ins, declared as such: `relay_smarthost_oauth/smarthost.py`
//! (an SMTP server that requires a bearer token, as Microsoft 365's and Gmail's do, and keeps
//! what it is sent) and `relay_smarthost_oauth/token_endpoint.py` (an authorisation server's
//! token endpoint over HTTPS: the refresh grant of RFC 6749 for one client, rotating its
//! refresh token). Both use the test CA's certificate for localhost / 127.0.0.1.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_helper_token_refresh::token_file::AccessToken;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::ingress::TestCa;
use crate::support::system::Proc;

const SMARTHOST: &str = env!("CARGO_BIN_EXE_pepsi-stage-relay-to-smarthost");
const HELPER: &str = env!("CARGO_BIN_EXE_pepsi-helper-token-refresh");

const USER: &str = "relay@example.org";
const CLIENT_ID: &str = "9e5f94bc-e8a4-4e73-b8be-63364c29d753";
const CLIENT_SECRET: &str = "client-s3cret";

const RAW: &[u8] = b"From: sender@example.test\r\nTo: a@x.example\r\nSubject: over oauth\r\n\r\n\
.starts with a dot\r\nbody\r\n";

/// A Python stand-in started on a free port, killed when dropped; `log` gets its events.
struct Peer {
    _proc: Proc,
    port: u16,
    log: PathBuf,
}

impl Peer {
    fn start(script: &str, name: &'static str, dir: &Path, args: &[&str]) -> Peer {
        let port = support::free_port();
        let log = dir.join(format!("{name}-{port}.log"));
        let child = Command::new("/usr/bin/python3")
            .arg(
                support::root()
                    .join("tests/integration/relay_smarthost_oauth")
                    .join(script),
            )
            .arg(port.to_string())
            .args(args)
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}-{port}.err"))).unwrap())
            .spawn()
            .expect("/usr/bin/python3");
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < until,
                "{name} did not listen: {}",
                std::fs::read_to_string(dir.join(format!("{name}-{port}.err"))).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Peer {
            _proc: Proc { child, name },
            port,
            log,
        }
    }

    /// The smarthost stand-in offering `mechanisms`, accepting `USER` with `token` only.
    fn smarthost(dir: &Path, ca: &TestCa, token: &str, mechanisms: &str) -> Peer {
        let (cert, key) = (ca.cert.display().to_string(), ca.key.display().to_string());
        Peer::start(
            "smarthost.py",
            "smarthost.py",
            dir,
            &[&cert, &key, USER, token, mechanisms],
        )
    }

    /// The token endpoint stand-in: `refresh_token` buys `access_token`.
    fn token_endpoint(dir: &Path, ca: &TestCa, refresh_token: &str, access_token: &str) -> Peer {
        let (cert, key) = (ca.cert.display().to_string(), ca.key.display().to_string());
        Peer::start(
            "token_endpoint.py",
            "token_endpoint.py",
            dir,
            &[
                &cert,
                &key,
                CLIENT_ID,
                CLIENT_SECRET,
                refresh_token,
                access_token,
            ],
        )
    }

    /// The events logged so far, one JSON object each.
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == kind)
            .collect()
    }
}

/// The test's files: a configuration whose stage `smarthost` relays to `smarthost_port`
/// with the token of `tokens/m365.json`, and whose `[token-m365]` refreshes it at
/// `endpoint_port` (the client's secret in a secrets fragment).
struct Setup {
    dir: tempfile::TempDir,
    ca: TestCa,
    config: PathBuf,
    token_file: PathBuf,
    refresh_token_file: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path());
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).unwrap();
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o750)).unwrap();
        Setup {
            token_file: tokens.join("m365.json"),
            refresh_token_file: tokens.join("m365.refresh"),
            config: dir.path().join("pepsi.conf"),
            dir,
            ca,
        }
    }

    fn configure(&self, db: &TestDb, smarthost_port: u16, endpoint_port: u16) {
        std::fs::write(
            &self.config,
            format!(
                "[database]\nURL = {db}\n\n\
                 [stage-smarthost]\nPROGRAM = pepsi-stage-relay-to-smarthost\n\
                 HOST = 127.0.0.1\nPORT = {smarthost_port}\nTLS = verify\nTLS_CA_FILE = {ca}\n\
                 AUTH_USERNAME = {USER}\nAUTH_TOKEN_FILE = {token}\n\
                 HELO_NAME = out.example.test\nBOUNCE_STAGE = bounce\nRETRY_INITIAL = 1m\n\
                 CONNECT_TIMEOUT = 5s\nCOMMAND_TIMEOUT = 20s\nDATA_TIMEOUT = 20s\n\n\
                 [stage-bounce]\nPROGRAM = pepsi-stage-bounce\n\n\
                 [token-m365]\n\
                 TOKEN_ENDPOINT = https://127.0.0.1:{endpoint_port}/token\n\
                 CLIENT_ID = {CLIENT_ID}\n\
                 SCOPE = https://outlook.office.com/SMTP.Send offline_access\n\
                 REFRESH_TOKEN_FILE = {refresh}\nTOKEN_FILE = {token}\nTLS_CA_FILE = {ca}\n\
                 TIMEOUT = 20s\n",
                db = db.url,
                ca = self.ca.ca.display(),
                token = self.token_file.display(),
                refresh = self.refresh_token_file.display(),
            ),
        )
        .unwrap();
        let secrets = self.dir.path().join("secrets.d");
        std::fs::create_dir_all(&secrets).unwrap();
        let fragment = secrets.join("30-token.conf");
        std::fs::write(
            &fragment,
            format!("[token-m365]\nCLIENT_SECRET = {CLIENT_SECRET}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&fragment, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// Writes the access-token file as the helper would, expiring `expires_in` from now
    /// (negative: expired).
    fn write_token(&self, token: &str, expires_in: chrono::Duration) {
        let t = AccessToken {
            access_token: token.into(),
            expires_at: chrono::Utc::now() + expires_in,
        };
        std::fs::write(&self.token_file, t.render()).unwrap();
    }

    /// `pepsi-helper-token-refresh once`: (exit code, stdout, stderr).
    fn helper_once(&self) -> (i32, String, String) {
        let out = Command::new(HELPER)
            .arg("-c")
            .arg(&self.config)
            .arg("once")
            .env_remove("PEPSI_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// A message running at stage `smarthost`.
async fn message(db: &TestDb, rcpt: &[&str]) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let (headers, body) = pepsi_contract::message::split(RAW);
    let id: i64 =
        sqlx::query_scalar("SELECT pepsi.workqueue_add('sender@example.test', $1, $2, $3, $4)")
            .bind(&rcpt)
            .bind(headers)
            .bind(body)
            .bind(json!({}))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    support::claim(&db.pool, id, "smarthost").await;
    id
}

/// The one row left, paused at the smarthost with every recipient (nothing bounced); its
/// `last_error`.
async fn paused(db: &TestDb, id: i64, rcpt: usize) -> String {
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "nothing bounced, nothing cloned: {rows:?}");
    let (row, stage, status, left, state) = &rows[0];
    assert_eq!(*row, id);
    assert_eq!((stage.as_str(), status.as_str()), ("smarthost", "paused"));
    assert_eq!(left.len(), rcpt, "every recipient waits");
    state["last_error"].as_str().unwrap().to_owned()
}

/// An access token as Microsoft 365 issues them: a JWT of well over a kilobyte, so the
/// AUTH command cannot carry it as an initial response.
fn long_token() -> String {
    format!(
        "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.{}.c2lnbmF0dXJl",
        "eyJhdWQiOiJodHRwczovL291dGxvb2sub2ZmaWNlLmNvbSJ9".repeat(30)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smarthost_that_takes_only_a_valid_bearer_token_receives_the_mail() {
    let db = TestDb::new().await;
    // OAUTHBEARER is preferred when offered, with a token too long for the AUTH line; a
    // smarthost offering XOAUTH2 alone gets XOAUTH2, with its initial response.
    for (offered, token, mechanism, initial_response) in [
        ("XOAUTH2 OAUTHBEARER", long_token(), "OAUTHBEARER", false),
        (
            "PLAIN XOAUTH2",
            "ya29.a0AfH6SMB-short".to_owned(),
            "XOAUTH2",
            true,
        ),
    ] {
        let setup = Setup::new();
        let smarthost = Peer::smarthost(setup.dir.path(), &setup.ca, &token, offered);
        setup.configure(&db, smarthost.port, support::free_port());
        setup.write_token(&token, chrono::Duration::hours(1));
        let id = message(&db, &["a@x.example", "b@y.example"]).await;

        assert_eq!(
            support::run_ids(SMARTHOST, &setup.config, &[id]).await,
            vec![r#"0 {"finished":true}"#],
            "{offered}"
        );
        assert!(support::rows(&db.pool).await.is_empty(), "delivered");
        let auth = smarthost.of("auth");
        assert_eq!(auth.len(), 1, "{auth:?}");
        assert_eq!(auth[0]["mechanism"], mechanism, "{offered}");
        assert_eq!(auth[0]["ok"], true);
        assert_eq!(auth[0]["user"], USER);
        assert_eq!(auth[0]["initial_response"], initial_response);
        if mechanism == "OAUTHBEARER" {
            // RFC 7628's host and port of the connection
            assert_eq!(auth[0]["host"], "127.0.0.1");
            assert_eq!(auth[0]["port"], smarthost.port.to_string());
        }
        let got = smarthost.of("message");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["mail_from"], "sender@example.test");
        assert_eq!(got[0]["rcpt"], json!(["a@x.example", "b@y.example"]));
        assert_eq!(got[0]["data"].as_str().unwrap().as_bytes(), RAW);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_defers_until_the_helper_refreshes_it_from_the_token_endpoint() {
    let db = TestDb::new().await;
    let setup = Setup::new();
    let fresh = long_token();
    let smarthost = Peer::smarthost(setup.dir.path(), &setup.ca, &fresh, "OAUTHBEARER XOAUTH2");
    let endpoint = Peer::token_endpoint(setup.dir.path(), &setup.ca, "rt-1", &fresh);
    setup.configure(&db, smarthost.port, endpoint.port);
    setup.write_token("expired-token", chrono::Duration::minutes(-5));
    std::fs::write(&setup.refresh_token_file, "rt-1\n").unwrap();
    std::fs::set_permissions(
        &setup.refresh_token_file,
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let id = message(&db, &["a@x.example"]).await;

    // The expired token is not even offered: the message waits, the file named.
    assert_eq!(
        support::run_ids(SMARTHOST, &setup.config, &[id]).await,
        vec!["0"]
    );
    let last = paused(&db, id, 1).await;
    assert!(
        last.starts_with("4.7.0 access token file ")
            && last.contains(&setup.token_file.display().to_string())
            && last.contains("expired at"),
        "{last}"
    );
    assert!(smarthost.events().is_empty(), "no connection was opened");

    // The helper refreshes it with the refresh grant, and stores the rotated refresh token.
    let (code, out, err) = setup.helper_once();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("m365: refreshed (it expired at ")
            && out.contains("the provider rotated the refresh token"),
        "{out}"
    );
    let requests: Vec<Value> = std::fs::read_to_string(&endpoint.log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0]["content_type"],
        "application/x-www-form-urlencoded"
    );
    assert_eq!(
        requests[0]["form"],
        json!({
            "grant_type": "refresh_token",
            "refresh_token": "rt-1",
            "scope": "https://outlook.office.com/SMTP.Send offline_access",
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
        })
    );
    let token = pepsi_helper_token_refresh::token_file::read_now(&setup.token_file).unwrap();
    assert_eq!(token.access_token, fresh);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&setup.token_file), 0o640);
    assert_eq!(
        std::fs::read_to_string(&setup.refresh_token_file).unwrap(),
        "rt-1-rotated\n"
    );
    assert_eq!(mode(&setup.refresh_token_file), 0o600);
    // Fresh now: a second run asks nothing.
    let (code, out, _) = setup.helper_once();
    assert_eq!((code, out.as_str()), (0, ""));

    // The retry logs in with the new token and delivers.
    support::claim(&db.pool, id, "smarthost").await;
    assert_eq!(
        support::run_ids(SMARTHOST, &setup.config, &[id]).await,
        vec![r#"0 {"finished":true}"#]
    );
    assert!(support::rows(&db.pool).await.is_empty());
    let auth = smarthost.of("auth");
    assert_eq!(auth.len(), 1, "{auth:?}");
    assert_eq!(
        (&auth[0]["mechanism"], &auth[0]["ok"]),
        (&json!("OAUTHBEARER"), &json!(true))
    );
    assert_eq!(smarthost.of("message").len(), 1);
    assert_eq!(
        std::fs::read_to_string(&endpoint.log)
            .unwrap()
            .lines()
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_refresh_fails_the_helper_and_the_stale_token_defers_the_mail() {
    let db = TestDb::new().await;
    let setup = Setup::new();
    let smarthost = Peer::smarthost(
        setup.dir.path(),
        &setup.ca,
        "the-valid-token",
        "OAUTHBEARER XOAUTH2",
    );
    let endpoint = Peer::token_endpoint(setup.dir.path(), &setup.ca, "rt-1", "the-valid-token");
    setup.configure(&db, smarthost.port, endpoint.port);
    // A token due for renewal (within REFRESH_BEFORE, 10m) that the provider has revoked,
    // and a refresh token that expired with it.
    setup.write_token("revoked-token", chrono::Duration::minutes(3));
    std::fs::write(&setup.refresh_token_file, "rt-revoked\n").unwrap();
    let before = std::fs::read(&setup.token_file).unwrap();

    let (code, out, err) = setup.helper_once();
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("account m365")
            && err.contains(&format!(
                "token endpoint https://127.0.0.1:{}/token",
                endpoint.port
            ))
            && err.contains("refused the refresh (HTTP 400): invalid_grant: AADSTS70008"),
        "{err}"
    );
    assert!(!err.contains("rt-revoked"), "no token in the error: {err}");
    assert_eq!(
        std::fs::read(&setup.token_file).unwrap(),
        before,
        "the token file is left as it was"
    );
    assert_eq!(
        std::fs::read_to_string(&setup.refresh_token_file).unwrap(),
        "rt-revoked\n"
    );

    // The stage logs in with the stale token; the smarthost's error challenge is answered
    // with ^A and its 535 defers every recipient, quoting the JSON status and the file.
    let id = message(&db, &["a@x.example", "b@y.example"]).await;
    assert_eq!(
        support::run_ids(SMARTHOST, &setup.config, &[id]).await,
        vec!["0"]
    );
    let last = paused(&db, id, 2).await;
    for want in [
        "535 5.7.8 Authentication credentials invalid",
        r#""status": "invalid_token""#,
        "OAUTHBEARER",
        &format!("the access token in {}", setup.token_file.display()),
    ] {
        assert!(last.contains(want), "{want}: {last}");
    }
    let auth = smarthost.of("auth");
    assert_eq!(auth.len(), 1, "{auth:?}");
    assert_eq!(auth[0]["ok"], false);
    assert_eq!(auth[0]["token_matches"], false);
    assert_eq!(
        auth[0]["answer"], "AQ==",
        "RFC 7628's ^A to the error challenge"
    );
    assert!(smarthost.of("message").is_empty());

    // A smarthost offering XOAUTH2 alone: its error challenge is answered with an empty
    // line, and the message waits again.
    let xoauth2 = Peer::smarthost(setup.dir.path(), &setup.ca, "the-valid-token", "XOAUTH2");
    setup.configure(&db, xoauth2.port, endpoint.port);
    support::claim(&db.pool, id, "smarthost").await;
    assert_eq!(
        support::run_ids(SMARTHOST, &setup.config, &[id]).await,
        vec!["0"]
    );
    let last = paused(&db, id, 2).await;
    assert!(
        last.contains("(XOAUTH2) with 535 5.7.8") && last.contains("invalid_token"),
        "{last}"
    );
    let auth = xoauth2.of("auth");
    assert_eq!(auth.len(), 1, "{auth:?}");
    assert_eq!(
        (&auth[0]["ok"], &auth[0]["answer"]),
        (&json!(false), &json!(""))
    );
    assert!(xoauth2.of("message").is_empty());
}
