//! `pepsi-setup apply` carrying out a `relay_smarthost` task with an OAuth 2.0 credential,
//! with the real `pepsi-helper-token-refresh` against a loopback token endpoint: the
//! stand-in of `relay_smarthost_oauth/token_endpoint.py` (HTTPS with a test CA's
//! certificate, the refresh grant for one client, rotating its refresh token). The client
//! secret goes to a secrets fragment, the refresh token to `TOKEN_DIR` (0600, `TOKEN_USER`'s),
//! and the first access token is asked for with the checked candidate before it replaces
//! `pepsi.conf`: a refused refresh fails the task and leaves the file, the fragment and the
//! refresh token as they were.
//!
//! apply runs as root, and so do these tests (as CI does); the helper runs as `nobody`,
//! which every Debian system has, so apply's switch to `TOKEN_USER` is the one exercised.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_conf::config::Config;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::setup_apply::{apply, config_dir};
use crate::support;
use crate::support::ingress::TestCa;
use crate::support::system::Proc;

/// The account the helper runs as (`TOKEN_USER`).
const TOKEN_USER: &str = "nobody";

const CLIENT_ID: &str = "9e5f94bc-e8a4-4e73-b8be-63364c29d753";
const CLIENT_SECRET: &str = "client-s3cret";
const ACCESS_TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.first-access.c2ln";

/// The token endpoint stand-in on a free loopback port, killed when dropped: `rt-1` buys
/// [`ACCESS_TOKEN`] for the client [`CLIENT_ID`] with [`CLIENT_SECRET`].
struct Endpoint {
    _proc: Proc,
    url: String,
    log: PathBuf,
}

impl Endpoint {
    fn start(dir: &Path, ca: &TestCa) -> Endpoint {
        let port = support::free_port();
        let log = dir.join("token-endpoint.log");
        let err = dir.join("token-endpoint.err");
        let child = Command::new("/usr/bin/python3")
            .arg(support::root().join("tests/integration/relay_smarthost_oauth/token_endpoint.py"))
            .arg(port.to_string())
            .args([&ca.cert, &ca.key])
            .args([CLIENT_ID, CLIENT_SECRET, "rt-1", ACCESS_TOKEN])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("/usr/bin/python3");
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < until,
                "the token endpoint did not listen: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Endpoint {
            _proc: Proc {
                child,
                name: "token_endpoint.py",
            },
            url: format!("https://127.0.0.1:{port}/token"),
            log,
        }
    }

    /// The forms it was sent, in order.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["form"].clone())
            .collect()
    }
}

/// The test's files: the configuration directory of [`config_dir`] whose `[pepsi-setup]`
/// runs the helper as [`TOKEN_USER`] with the tokens in `tokens/` (not made yet), the
/// fragments for that account's group, and whose `[token-setup]` trusts the test CA; the
/// token endpoint. Every directory on the way is open to `nobody`, as `/etc/pepsi` is.
struct Setup {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    dir: PathBuf,
    conf: PathBuf,
    tokens: PathBuf,
    endpoint: Endpoint,
}

impl Setup {
    fn new(db: &TestDb) -> Setup {
        let outside = tempfile::tempdir().unwrap();
        open_to_all(outside.path());
        let ca = TestCa::new(outside.path());
        let endpoint = Endpoint::start(outside.path(), &ca);
        let tokens = outside.path().join("tokens");
        let group = Command::new("id")
            .args(["-gn", TOKEN_USER])
            .output()
            .unwrap();
        let group = String::from_utf8(group.stdout).unwrap();
        let (dir, conf) = config_dir(
            db,
            &format!(
                "[pepsi-setup]\nSECRETS_GROUP = {group}\nTOKEN_USER = {TOKEN_USER}\n\
                 TOKEN_DIR = {tokens}\n\
                 [token-setup]\nTLS_CA_FILE = {ca}\nTIMEOUT = 20s\n",
                group = group.trim(),
                tokens = tokens.display(),
                ca = ca.ca.display(),
            ),
        );
        open_to_all(dir.path());
        Setup {
            dir: dir.path().to_owned(),
            _dirs: (outside, dir),
            conf,
            tokens,
            endpoint,
        }
    }

    fn secrets(&self) -> PathBuf {
        self.dir.join("secrets.d")
    }

    /// A `relay_smarthost` task with an OAuth 2.0 credential at the test's endpoint.
    fn oauth2(&self, client_secret: &str, refresh_token: &str) -> Value {
        json!({"server": "smtp.office365.com:587", "tls": "verify",
               "username": "relay@example.org",
               "credential": {"method": "oauth2", "token_endpoint": self.endpoint.url,
                              "client_id": CLIENT_ID, "client_secret": client_secret,
                              "refresh_token": refresh_token}})
    }
}

fn open_to_all(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Adds a task as the configuration role; its id.
async fn add_task(db: &TestDb, kind: &str, params: Value) -> i64 {
    crate::setup_apply::add_task(db, "pepsi-config", kind, params).await
}

/// status, outcome, params of a task, and its log (`stream: line` each).
async fn task(db: &TestDb, id: i64) -> (String, String, Value, String) {
    let (status, outcome, params) = crate::setup_apply::task(db, id).await;
    (
        status,
        outcome,
        params,
        crate::setup_apply::log_of(db, id).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth2_smarthost_gets_its_first_token_before_the_configuration_names_it() {
    let db = TestDb::new().await;
    let setup = Setup::new(&db);
    let nobody = pepsi_conf::privilege::account(TOKEN_USER).unwrap().unwrap();

    // A smarthost with a password first: its fragment must go, the stage takes one secret.
    let password = add_task(
        &db,
        "relay_smarthost",
        json!({"server": "smtp.example.com:587", "tls": "verify", "username": "relay",
               "credential": {"method": "password", "password": "old pass"}}),
    )
    .await;
    let id = add_task(&db, "relay_smarthost", setup.oauth2(CLIENT_SECRET, "rt-1")).await;
    let run = apply(&setup.conf);
    let (status, outcome, params, log) = task(&db, id).await;
    assert_eq!(status, "done", "{outcome}\n{log}\n{run:?}");
    assert_eq!(task(&db, password).await.0, "done");
    assert_eq!(run.code, 0, "{run:?}");

    // The helper ran as TOKEN_USER against the candidate: one refresh grant with the
    // task's credential, the rotated refresh token stored where the section says.
    assert_eq!(
        setup.endpoint.requests(),
        [
            json!({"grant_type": "refresh_token", "refresh_token": "rt-1",
                "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET})
        ]
    );
    let refresh = setup.tokens.join("setup.refresh");
    let token = setup.tokens.join("setup.json");
    assert_eq!(std::fs::read_to_string(&refresh).unwrap(), "rt-1-rotated\n");
    assert_eq!(mode(&refresh), 0o600);
    let got = pepsi_helper_token_refresh::token_file::read_now(&token).unwrap();
    assert_eq!(got.access_token, ACCESS_TOKEN);
    assert_eq!(mode(&token), 0o640);
    for path in [&setup.tokens, &refresh, &token] {
        assert_eq!(
            std::fs::metadata(path).unwrap().uid(),
            nobody.uid,
            "{}",
            path.display()
        );
    }
    assert_eq!(mode(&setup.tokens), 0o750);
    assert!(
        log.contains("wrote the refresh token to") && log.contains("(0600, nobody)"),
        "{log}"
    );
    assert!(
        log.contains("once --force setup, as nobody")
            && log.contains("output: setup: refreshed")
            && log.contains("the provider rotated the refresh token"),
        "{log}"
    );

    // pepsi.conf: the stage logs in with the token file, the helper's section refreshes it.
    let text = std::fs::read_to_string(&setup.conf).unwrap();
    let cfg = Config::load(&setup.conf).unwrap();
    let value = |section: &str, option: &str| cfg.section(section).string(option).unwrap();
    for (option, want) in [
        ("PROGRAM", "pepsi-stage-relay-to-smarthost"),
        ("HOST", "smtp.office365.com"),
        ("PORT", "587"),
        ("TLS", "verify"),
        ("AUTH_USERNAME", "relay@example.org"),
        ("AUTH_TOKEN_FILE", &token.display().to_string()),
    ] {
        assert_eq!(value("stage-relay", option), want, "{option}");
    }
    assert!(!cfg.section("stage-relay").has("AUTH_PASSWORD"), "{text}");
    for (option, want) in [
        ("TOKEN_ENDPOINT", setup.endpoint.url.as_str()),
        ("CLIENT_ID", CLIENT_ID),
        ("REFRESH_TOKEN_FILE", &refresh.display().to_string()),
        ("TOKEN_FILE", &token.display().to_string()),
        ("CLIENT_SECRET", CLIENT_SECRET),
    ] {
        assert_eq!(value("token-setup", option), want, "{option}");
    }
    // The secret from its fragment alone, the password's fragment gone, nothing left over.
    assert!(cfg.is_secret("token-setup", "CLIENT_SECRET"));
    assert_eq!(names(&setup.secrets()), ["50-setup-token.conf"]);
    assert_eq!(mode(&setup.secrets().join("50-setup-token.conf")), 0o640);
    for secret in [CLIENT_SECRET, "rt-1", ACCESS_TOKEN] {
        assert!(!text.contains(secret), "{secret} in pepsi.conf:\n{text}");
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    assert_eq!(params["credential"]["client_secret"], "(redacted)");
    assert_eq!(params["credential"]["refresh_token"], "(redacted)");
    assert_eq!(params["credential"]["token_endpoint"], setup.endpoint.url);

    // Another client secret and a stale refresh token: the endpoint refuses the client, and
    // the credential in force stays as it was, fragment and refresh token included.
    let fragment = std::fs::read(setup.secrets().join("50-setup-token.conf")).unwrap();
    let again = add_task(&db, "relay_smarthost", setup.oauth2("wrong", "rt-stale")).await;
    assert_eq!(apply(&setup.conf).code, 1);
    let (status, outcome, _, log) = task(&db, again).await;
    assert_eq!(status, "failed", "{log}");
    assert!(
        outcome.contains("no first access token")
            && outcome.contains("account setup")
            && outcome.contains("invalid_client"),
        "{outcome}"
    );
    assert!(log.contains("already says so"), "{log}");
    assert_eq!(std::fs::read_to_string(&setup.conf).unwrap(), text);
    assert_eq!(
        std::fs::read(setup.secrets().join("50-setup-token.conf")).unwrap(),
        fragment
    );
    assert_eq!(names(&setup.secrets()), ["50-setup-token.conf"]);
    assert_eq!(std::fs::read_to_string(&refresh).unwrap(), "rt-1-rotated\n");
    assert_eq!(std::fs::metadata(&refresh).unwrap().uid(), nobody.uid);
    assert!(log.contains("back as it was"), "{log}");

    // Back to direct delivery: the helper's section and the secret's fragment go.
    let direct = add_task(&db, "relay_direct", json!({})).await;
    assert_eq!(apply(&setup.conf).code, 0);
    assert_eq!(task(&db, direct).await.0, "done");
    let cfg = Config::load(&setup.conf).unwrap();
    for option in [
        "TOKEN_ENDPOINT",
        "CLIENT_ID",
        "CLIENT_SECRET",
        "TOKEN_FILE",
        "TLS_CA_FILE",
    ] {
        assert!(!cfg.section("token-setup").has(option), "{option}");
    }
    assert!(!cfg.section("stage-relay").has("AUTH_TOKEN_FILE"));
    assert!(names(&setup.secrets()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_refresh_fails_the_task_and_changes_nothing() {
    let db = TestDb::new().await;
    let setup = Setup::new(&db);
    let before = std::fs::read(&setup.conf).unwrap();
    let id = add_task(
        &db,
        "relay_smarthost",
        setup.oauth2(CLIENT_SECRET, "rt-revoked"),
    )
    .await;
    let run = apply(&setup.conf);
    assert_eq!(run.code, 1, "{run:?}");
    let (status, outcome, params, log) = task(&db, id).await;
    assert_eq!(status, "failed", "{log}");
    assert!(
        outcome.contains(&format!(
            "account setup: token endpoint {}: refused the refresh (HTTP 400): invalid_grant: \
             AADSTS70008",
            setup.endpoint.url
        )),
        "{outcome}"
    );
    assert_eq!(setup.endpoint.requests().len(), 1);
    // The file byte for byte, no candidate left, and the task's secrets taken away again.
    assert_eq!(std::fs::read(&setup.conf).unwrap(), before);
    assert_eq!(names(&setup.dir), ["pepsi.conf", "secrets.d"]);
    assert!(names(&setup.secrets()).is_empty());
    assert!(!setup.tokens.join("setup.refresh").exists());
    assert!(!setup.tokens.join("setup.json").exists());
    assert!(log.contains("which the task wrote"), "{log}");
    for secret in [CLIENT_SECRET, "rt-revoked"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
        assert!(
            !outcome.contains(secret),
            "{secret} in the outcome: {outcome}"
        );
    }
    // A failed task keeps its row's secrets (it may be looked at, not run again by itself).
    assert_eq!(params["credential"]["refresh_token"], "rt-revoked");

    // A TOKEN_USER that does not exist fails the task naming it, before a file is written.
    let text = String::from_utf8(before)
        .unwrap()
        .replace("TOKEN_USER = nobody", "TOKEN_USER = pepsi-no-such-account");
    std::fs::write(&setup.conf, &text).unwrap();
    let id = add_task(&db, "relay_smarthost", setup.oauth2(CLIENT_SECRET, "rt-1")).await;
    assert_eq!(apply(&setup.conf).code, 1);
    let (status, outcome, _, _) = task(&db, id).await;
    assert_eq!(status, "failed");
    assert!(
        outcome.contains("the account pepsi-no-such-account (TOKEN_USER) does not exist"),
        "{outcome}"
    );
    assert_eq!(std::fs::read_to_string(&setup.conf).unwrap(), text);
    assert!(names(&setup.secrets()).is_empty());
    assert!(!log_of_any_put_back(&db, id).await);
    assert_eq!(setup.endpoint.requests().len(), 1, "nothing asked");
}

/// Whether the task's log says a file was put back or removed: a step wrote one.
async fn log_of_any_put_back(db: &TestDb, id: i64) -> bool {
    let (_, _, _, log) = task(db, id).await;
    log.contains("back as it was") || log.contains("which the task wrote")
}
