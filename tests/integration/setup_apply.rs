//! The online setup's intent queue against a real PostgreSQL and the real `pepsi-setup
//! apply` and `pepsi-config` processes: who may write and read `pepsi.setup_task` (each
//! role connecting as itself), `written_by` taken from the connection, tasks carried out into
//! a real configuration file, secrets fragment and database, rows from another role or with
//! parameters outside their kind refused and logged, a configuration a program refuses
//! changing nothing, and apply killed at any moment leaving the old file or the new one
//! whole, its task run again.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pepsi_conf::config::Config;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};
use sqlx::{Connection as _, PgConnection};

use crate::support::Run;
use crate::support::httpd::url_as;

const SETUP: &str = env!("CARGO_BIN_EXE_pepsi-setup");
const HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$qh6p1m6ZbK5Xq3g0lJ0oJ4c1nY8z0m3uR3t3s9m2bX8";

/// A configuration directory for apply: `pepsi.conf` naming the test database, with the
/// signing, relay and local delivery stages, and `extra` at the end.
pub(crate) fn config_dir(db: &TestDb, extra: &str) -> (tempfile::TempDir, PathBuf) {
    config_dir_for(&db.url, extra)
}

/// The same, over the database at `url`.
fn config_dir_for(url: &str, extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pepsi.conf");
    let text = format!(
        "# the operator's comment stays\n[database]\nURL = {url}\n\
         [pepsi]\nHOSTNAME = old.example.test\nLOCAL_DOMAINS = example.test\n\
         [pepsi-setup]\nRELOAD_COMMAND =\nSECRETS_GROUP = root\n[listener-mx]\nROLE = mx\nADDRESS = 127.0.0.1:2525\n\
         [stage-init]\nPROGRAM = pepsi-stage-discard\n\
         [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nDATABASE_KEYS = yes\nNEXT_STAGE = relay\n\
         [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\n\
         [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = {mail}\n{extra}",
        mail = dir.path().join("mail").display(),
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, path)
}

pub(crate) fn apply(config: &Path) -> Run {
    Run::of(
        Command::new(SETUP)
            .arg("-c")
            .arg(config)
            .arg("apply")
            .output()
            .expect("run pepsi-setup apply"),
    )
}

async fn connect_as(db: &TestDb, role: &str) -> PgConnection {
    PgConnection::connect(&url_as(&db.url, role)).await.unwrap()
}

/// Adds a task as `role` (connecting as that role); its id.
pub(crate) async fn add_task(db: &TestDb, role: &str, kind: &str, params: Value) -> i64 {
    let mut c = connect_as(db, role).await;
    sqlx::query_scalar(
        "INSERT INTO pepsi.setup_task (kind, params) VALUES ($1, $2) RETURNING task_id",
    )
    .bind(kind)
    .bind(params)
    .fetch_one(&mut c)
    .await
    .unwrap()
}

/// status, outcome, params of a task.
pub(crate) async fn task(db: &TestDb, id: i64) -> (String, String, Value) {
    sqlx::query_as("SELECT status, outcome, params FROM pepsi.setup_task WHERE task_id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

pub(crate) async fn log_of(db: &TestDb, id: i64) -> String {
    let lines: Vec<(String, String)> = sqlx::query_as(
        "SELECT stream, line FROM pepsi.setup_task_log WHERE task_id = $1 ORDER BY line_no",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    lines
        .into_iter()
        .map(|(s, l)| format!("{s}: {l}\n"))
        .collect()
}

fn sqlstate(e: sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.code().unwrap_or_default().into_owned(),
        other => other.to_string(),
    }
}

#[tokio::test]
async fn only_the_configuration_role_adds_tasks_and_written_by_is_its_own() {
    let db = TestDb::new().await;
    // pepsi-httpd, connecting as its role, reads the tasks and cannot add one.
    let mut httpd = connect_as(&db, "pepsi-httpd").await;
    let refused =
        sqlx::query("INSERT INTO pepsi.setup_task (kind, params) VALUES ('database', '{}')")
            .execute(&mut httpd)
            .await
            .unwrap_err();
    assert_eq!(sqlstate(refused), "42501");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.setup_task")
        .fetch_one(&mut httpd)
        .await
        .unwrap();
    assert_eq!(count, 0);
    sqlx::query("SELECT count(*) FROM pepsi.setup_task_log")
        .execute(&mut httpd)
        .await
        .unwrap();
    // Nothing that processes mail may even read them.
    for role in ["pepsi", "pepsi-ingress", "pepsi-crypto", "pepsi-sendmail"] {
        let mut c = connect_as(&db, role).await;
        let e = sqlx::query("SELECT count(*) FROM pepsi.setup_task")
            .execute(&mut c)
            .await
            .unwrap_err();
        assert_eq!(sqlstate(e), "42501", "{role} read setup_task");
    }
    // The configuration role adds one, and cannot change or forge what the applier reads.
    let mut config = connect_as(&db, "pepsi-config").await;
    let (written_by, status, outcome): (String, String, String) = sqlx::query_as(
        "INSERT INTO pepsi.setup_task (kind, params, written_by, status, outcome) \
         VALUES ('hostname', '{\"hostname\": \"mx.example.org\"}', 'postgres', 'done', 'forged') \
         RETURNING written_by::text, status, outcome",
    )
    .fetch_one(&mut config)
    .await
    .unwrap();
    assert_eq!(
        (written_by.as_str(), status.as_str(), outcome.as_str()),
        ("pepsi-config", "pending", "")
    );
    let e = sqlx::query("UPDATE pepsi.setup_task SET written_by = 'postgres'")
        .execute(&mut config)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(e), "42501");
    let e = sqlx::query("INSERT INTO pepsi.setup_task_log (task_id, line_no, stream, line) VALUES (1, 1, 'step', 'x')")
        .execute(&mut config)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(e), "42501");
    // A kind outside the eleven never gets in.
    let e = sqlx::query("INSERT INTO pepsi.setup_task (kind, params) VALUES ('shell', '{}')")
        .execute(&mut config)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(e), "23514");
}

#[tokio::test]
async fn apply_carries_out_the_configuration_roles_tasks_and_refuses_the_rest() {
    let db = TestDb::new().await;
    let (dir, conf) = config_dir(&db, "");
    let before = std::fs::read_to_string(&conf).unwrap();
    let database = add_task(&db, "pepsi-config", "database", json!({})).await;
    let hostname = add_task(
        &db,
        "pepsi-config",
        "hostname",
        json!({"hostname": "MX.example.org"}),
    )
    .await;
    let domains = add_task(
        &db,
        "pepsi-config",
        "mail_domains",
        json!({"domains": ["example.org", "example.net"]}),
    )
    .await;
    let dkim = add_task(
        &db,
        "pepsi-config",
        "dkim_key",
        json!({"domain": "example.org", "selector": "s2026", "algorithm": "ed25519"}),
    )
    .await;
    let smarthost = add_task(
        &db,
        "pepsi-config",
        "relay_smarthost",
        json!({"server": "smtp.example.com:587", "tls": "verify", "username": "relay$user",
               "credential": {"method": "password", "password": "s3cret pass"}}),
    )
    .await;
    let lmtp = add_task(
        &db,
        "pepsi-config",
        "local_delivery",
        json!({"method": "lmtp", "server": "127.0.0.1:24"}),
    )
    .await;
    let mailbox = add_task(
        &db,
        "pepsi-config",
        "mailbox",
        json!({"address": "alice@example.org", "password_hash": HASH}),
    )
    .await;
    // Written by the superuser, not the configuration role: refused, however valid.
    let forged = add_task(
        &db,
        "postgres",
        "hostname",
        json!({"hostname": "evil.example"}),
    )
    .await;
    // Parameters outside the kind: refused.
    let bad = add_task(
        &db,
        "pepsi-config",
        "hostname",
        json!({"hostname": "mx.example.org", "then": "rm -rf /"}),
    )
    .await;
    let bad_value = add_task(
        &db,
        "pepsi-config",
        "hostname",
        json!({"hostname": "not a host"}),
    )
    .await;

    let run = apply(&conf);
    assert_eq!(run.code, 1, "refusals make the exit status 1: {run:?}");
    assert!(
        run.stdout.contains("7 done, 0 failed, 3 refused"),
        "{run:?}"
    );
    for id in [database, hostname, domains, dkim, smarthost, lmtp, mailbox] {
        let (status, outcome, _) = task(&db, id).await;
        assert_eq!(
            status,
            "done",
            "task {id}: {outcome}\n{}",
            log_of(&db, id).await
        );
    }
    let (status, outcome, _) = task(&db, forged).await;
    assert_eq!(status, "refused");
    assert!(
        outcome.contains(
            "written by the database role postgres, not the configuration role pepsi-config"
        ),
        "{outcome}"
    );
    assert!(
        log_of(&db, forged)
            .await
            .contains("error: refused: written by")
    );
    let (status, outcome, _) = task(&db, bad).await;
    assert_eq!(status, "refused");
    assert!(outcome.contains("unknown field `then`"), "{outcome}");
    let (status, outcome, _) = task(&db, bad_value).await;
    assert_eq!(status, "refused");
    assert!(
        outcome.contains("\"not a host\" is not a domain name"),
        "{outcome}"
    );

    // The configuration: edited in place, comments kept, the old file kept beside it.
    let after = std::fs::read_to_string(&conf).unwrap();
    assert!(
        after.starts_with("# the operator's comment stays\n"),
        "{after}"
    );
    let cfg = Config::load(&conf).unwrap();
    let value = |section: &str, option: &str| cfg.section(section).string(option).unwrap();
    assert_eq!(value("pepsi", "HOSTNAME"), "mx.example.org");
    assert_eq!(value("pepsi", "LOCAL_DOMAINS"), "example.org example.net");
    assert_eq!(value("stage-dkim", "DATABASE_KEYS"), "yes");
    assert!(
        log_of(&db, dkim)
            .await
            .contains("made a DKIM key for example.org, selector s2026")
    );
    assert_eq!(
        value("stage-relay", "PROGRAM"),
        "pepsi-stage-relay-to-smarthost"
    );
    assert_eq!(value("stage-relay", "HOST"), "smtp.example.com");
    assert_eq!(value("stage-relay", "AUTH_USERNAME"), "relay$user");
    assert_eq!(value("stage-local", "PROGRAM"), "pepsi-stage-relay-to-lmtp");
    assert_eq!(value("stage-local", "LMTP"), "127.0.0.1:24");
    assert!(!evil_in(&after), "{after}");
    // The password is in the secrets fragment alone, 0640, and in force.
    assert!(!after.contains("s3cret"), "{after}");
    let fragment = dir.path().join("secrets.d/50-setup-relay.conf");
    let mode = std::fs::metadata(&fragment).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    assert_eq!(value("stage-relay", "AUTH_PASSWORD"), "s3cret pass");
    assert!(cfg.is_secret("stage-relay", "AUTH_PASSWORD"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join(format!("pepsi.conf.bak-{hostname}"))).unwrap(),
        before
    );
    // The secrets left the rows once carried out.
    let (_, _, params) = task(&db, smarthost).await;
    assert_eq!(params["credential"]["password"], "(redacted)");
    assert_eq!(params["username"], "relay$user");
    let (_, _, params) = task(&db, mailbox).await;
    assert_eq!(params["password_hash"], "(redacted)");
    // The database side.
    let key: String = sqlx::query_scalar(
        "SELECT private_key FROM pepsi.signing_key WHERE domain = 'example.org' AND selector = 's2026'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    let stored: String = sqlx::query_scalar(
        "SELECT password_hash FROM pepsi.mailbox_password WHERE address = 'alice@example.org'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, HASH);
    // Each step is in the log, the program's check among them.
    let log = log_of(&db, smarthost).await;
    assert!(
        log.contains("wrote [stage-relay] AUTH_PASSWORD to"),
        "{log}"
    );
    assert!(log.contains("check"), "{log}");
    assert!(log.contains("replaced"), "{log}");
    assert!(!log.contains("s3cret"), "{log}");

    // Carried out again, the same tasks change nothing: the key is kept, the file says so.
    let again = add_task(
        &db,
        "pepsi-config",
        "dkim_key",
        json!({"domain": "example.org", "selector": "s2026", "algorithm": "ed25519"}),
    )
    .await;
    let run = apply(&conf);
    assert_eq!(run.code, 0, "{run:?}");
    let (status, outcome, _) = task(&db, again).await;
    assert_eq!(status, "done");
    assert!(outcome.contains("already said so"), "{outcome}");
    assert!(log_of(&db, again).await.contains("already holds the key"));
    let key_again: String = sqlx::query_scalar(
        "SELECT private_key FROM pepsi.signing_key WHERE domain = 'example.org' AND selector = 's2026'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(key_again, key);

    // Back to direct delivery: the smarthost's options and its secret go.
    let direct = add_task(&db, "pepsi-config", "relay_direct", json!({})).await;
    assert_eq!(apply(&conf).code, 0);
    assert_eq!(task(&db, direct).await.0, "done");
    let cfg = Config::load(&conf).unwrap();
    assert_eq!(
        cfg.section("stage-relay").string("PROGRAM").unwrap(),
        "pepsi-stage-relay-to-internet"
    );
    assert!(!cfg.section("stage-relay").has("HOST"));
    assert!(!fragment.exists());
}

fn evil_in(text: &str) -> bool {
    text.contains("evil.example")
}

#[tokio::test]
async fn a_configuration_a_program_refuses_changes_nothing() {
    let db = TestDb::new().await;
    // The ingress refuses this value: every candidate fails its check.
    let (dir, conf) = config_dir(&db, "[pepsi-ingress]\nMAX_RECIPIENTS = lots\n");
    let before = std::fs::read_to_string(&conf).unwrap();
    let id = add_task(
        &db,
        "pepsi-config",
        "hostname",
        json!({"hostname": "mx.example.org"}),
    )
    .await;
    let missing = add_task(
        &db,
        "pepsi-config",
        "tls_files",
        json!({"certificate": "/nonexistent/c.pem", "key": "/nonexistent/k.pem"}),
    )
    .await;
    let run = apply(&conf);
    assert_eq!(run.code, 1, "{run:?}");
    let (status, outcome, _) = task(&db, id).await;
    assert_eq!(status, "failed");
    assert!(
        outcome.contains("a program would refuse the edited configuration"),
        "{outcome}"
    );
    assert!(outcome.contains("MAX_RECIPIENTS"), "{outcome}");
    assert!(
        log_of(&db, id).await.contains("output: "),
        "{}",
        log_of(&db, id).await
    );
    let (status, outcome, _) = task(&db, missing).await;
    assert_eq!(status, "failed");
    assert!(
        outcome.contains("cannot read the certificate /nonexistent/c.pem"),
        "{outcome}"
    );
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), before);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "nothing but pepsi.conf: {names:?}");
}

#[tokio::test]
async fn apply_killed_at_any_moment_leaves_one_whole_configuration_and_runs_the_task_again() {
    let db = TestDb::new().await;
    let (_dir, conf) = config_dir(&db, "");
    let old = std::fs::read_to_string(&conf).unwrap();
    let mut interrupted = 0;
    for step in 0..12u64 {
        std::fs::write(&conf, &old).unwrap();
        sqlx::query("DELETE FROM pepsi.setup_task")
            .execute(&db.pool)
            .await
            .unwrap();
        let id = add_task(
            &db,
            "pepsi-config",
            "hostname",
            json!({"hostname": format!("mx{step}.example.org")}),
        )
        .await;
        let mut child = Command::new(SETUP)
            .arg("-c")
            .arg(&conf)
            .arg("apply")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(40 + step * 60)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let text = std::fs::read_to_string(&conf).unwrap();
        let new = old.replace("old.example.test", &format!("mx{step}.example.org"));
        assert!(
            text == old || text == new,
            "step {step}: a partial file:\n{text}"
        );
        let (status, _, _) = task(&db, id).await;
        if status == "running" {
            interrupted += 1;
            // The old file or the new one is in force; the next apply finishes the task.
            let run = apply(&conf);
            assert_eq!(run.code, 0, "{run:?}");
            let (status, outcome, _) = task(&db, id).await;
            assert_eq!(status, "done", "{outcome}");
            assert_eq!(std::fs::read_to_string(&conf).unwrap(), new);
            assert!(
                log_of(&db, id)
                    .await
                    .contains("the applier stopped while this task ran"),
                "{}",
                log_of(&db, id).await
            );
        }
    }
    assert!(interrupted > 0, "no kill landed while a task ran");
}

#[tokio::test]
async fn apply_following_carries_out_a_task_when_it_is_written() {
    let db = TestDb::new().await;
    let (_dir, conf) = config_dir(&db, "");
    let mut child = Command::new(SETUP)
        .arg("-c")
        .arg(&conf)
        .args(["apply", "--follow"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Written while it waits: the NOTIFY wakes it (its own look comes only each minute).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let id = add_task(
        &db,
        "pepsi-config",
        "hostname",
        json!({"hostname": "followed.example.org"}),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, outcome, _) = task(&db, id).await;
        if status == "done" {
            break;
        }
        assert!(
            status == "pending" || status == "running",
            "{status}: {outcome}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "apply --follow did not take the task: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        std::fs::read_to_string(&conf)
            .unwrap()
            .contains("HOSTNAME = followed.example.org")
    );
    // A second apply is refused while this one runs: one applier per database.
    let second = apply(&conf);
    assert_eq!(second.code, 1, "{second:?}");
    assert!(
        second
            .stderr
            .contains("another pepsi-setup apply is running"),
        "{second:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A PostgreSQL of the test's own whose Unix socket takes peer authentication only, as
/// Debian's does (TCP on loopback trusts, for the test's own connections); stopped on drop.
struct PeerPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl PeerPostgres {
    fn start() -> PeerPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is installed (/usr/lib/postgresql)")
            .map(|e| e.unwrap().path().join("bin"))
            .filter(|p| p.join("initdb").exists())
            .max()
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let port = crate::support::free_port();
        let run = |args: &[&str]| {
            let out = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
        };
        let data = dir.path().join("data");
        let sock = dir.path().join("sock");
        for d in [&data, &sock] {
            std::fs::create_dir(d).unwrap();
            Command::new("chown")
                .args(["postgres:postgres"])
                .arg(d)
                .status()
                .unwrap();
        }
        run(&[
            bin.join("initdb").to_str().unwrap(),
            "-D",
            data.to_str().unwrap(),
            "--auth-local=peer",
            "--auth-host=trust",
            "-U",
            "postgres",
        ]);
        run(&[
            bin.join("pg_ctl").to_str().unwrap(),
            "-D",
            data.to_str().unwrap(),
            "-w",
            "-l",
            data.join("pg.log").to_str().unwrap(),
            "-o",
            &format!(
                "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off",
                sock.display()
            ),
            "start",
        ]);
        PeerPostgres { dir, bin, port }
    }

    /// Over TCP, which trusts: `postgres://ROLE@127.0.0.1:PORT/DATABASE`.
    fn tcp(&self, role: &str, database: &str) -> String {
        format!("postgres://{role}@127.0.0.1:{}/{database}", self.port)
    }

    /// Over the socket, which takes peer authentication, naming no user.
    fn socket(&self, database: &str) -> String {
        format!(
            "postgres:///{database}?host={}&port={}",
            self.dir.path().join("sock").display(),
            self.port
        )
    }
}

impl Drop for PeerPostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

#[tokio::test]
async fn apply_as_root_reaches_a_peer_authenticated_database_as_its_database_account() {
    let pg = PeerPostgres::start();
    let mut admin = PgConnection::connect(&pg.tcp("postgres", "postgres"))
        .await
        .unwrap();
    sqlx::raw_sql("CREATE DATABASE pepsi")
        .execute(&mut admin)
        .await
        .unwrap();
    pepsi_setup::schema::setup_url(&pg.tcp("postgres", "pepsi"), &Default::default())
        .await
        .unwrap();
    let (dir, conf) = config_dir_for(&pg.socket("pepsi"), "");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut config = PgConnection::connect(&pg.tcp("pepsi-config", "pepsi"))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for (kind, params) in [
        ("database", json!({})),
        ("hostname", json!({"hostname": "peer.example.org"})),
    ] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO pepsi.setup_task (kind, params) VALUES ($1, $2) RETURNING task_id",
        )
        .bind(kind)
        .bind(params)
        .fetch_one(&mut config)
        .await
        .unwrap();
        ids.push(id);
    }
    // Connecting as root, as it is: the socket refuses.
    let as_root = conf.with_file_name("as-root.conf");
    std::fs::write(
        &as_root,
        std::fs::read_to_string(&conf).unwrap() + "[pepsi-setup]\nDATABASE_ACCOUNT =\n",
    )
    .unwrap();
    let refused = apply(&as_root);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("cannot connect to the database")
            && (refused.stderr.contains("role \"root\" does not exist")
                || refused
                    .stderr
                    .contains("Peer authentication failed for user \"root\"")),
        "{refused:?}"
    );
    // As its database account (postgres by default): both tasks, the schema through the
    // socket and the configuration checked by pepsi-config running as that account.
    let run = apply(&conf);
    assert_eq!(run.code, 0, "{run:?}");
    let statuses: Vec<(String, String)> = sqlx::query_as(
        "SELECT status, outcome FROM pepsi.setup_task WHERE task_id = ANY($1) ORDER BY task_id",
    )
    .bind(&ids)
    .fetch_all(&mut config)
    .await
    .unwrap();
    assert!(statuses.iter().all(|(s, _)| s == "done"), "{statuses:?}");
    assert!(
        std::fs::read_to_string(&conf)
            .unwrap()
            .contains("HOSTNAME = peer.example.org")
    );
}

/// Every optional feature switched on over the shipped configuration (the whole system's,
/// `support::system`): the language run added after the lists, the milter after the entry
/// stage and encryption in front of DKIM signing, each section as the setup writes it taken
/// by its program's parser and the graph whole (`pepsi-config check`); then all off again,
/// their stages out of the path.
#[tokio::test]
async fn every_optional_feature_switched_in_the_shipped_graph_is_taken_by_every_program() {
    let system =
        crate::support::system::System::new("[pepsi-setup]\nRELOAD_COMMAND =\n", &[]).await;
    let run = |system: &crate::support::system::System| {
        Run::of(
            system
                .command(Path::new(SETUP))
                .arg("apply")
                .output()
                .unwrap(),
        )
    };
    let on = add_task(
        &system.db,
        "pepsi-config",
        "features",
        json!({"vacation": true, "whitelist": true, "language": true,
               "milter": "inet:127.0.0.1:11332", "encryption": true}),
    )
    .await;
    let done = run(&system);
    let log = log_of(&system.db, on).await;
    assert_eq!(done.code, 0, "{done:?}\n{log}");
    let (status, outcome, _) = task(&system.db, on).await;
    assert_eq!(status, "done", "{outcome}\n{log}");
    assert!(log.contains("the stage graph is whole"), "{log}");
    let next = |stage: &str| {
        let cfg = Config::load(&system.config).unwrap();
        cfg.section(&format!("stage-{stage}"))
            .string("NEXT_STAGE")
            .unwrap()
    };
    assert_eq!(
        [
            next("init"),
            next("milter"),
            next("lists"),
            next("language"),
            next("language-block"),
            next("remote"),
            next("encrypt"),
        ],
        [
            "milter",
            "aliases",
            "language",
            "language-block",
            "vacation",
            "encrypt",
            "dkim"
        ]
    );

    let off = add_task(
        &system.db,
        "pepsi-config",
        "features",
        json!({"vacation": false, "whitelist": true, "language": false, "encryption": false}),
    )
    .await;
    let done = run(&system);
    let log = log_of(&system.db, off).await;
    assert_eq!(done.code, 0, "{done:?}\n{log}");
    assert_eq!(
        [
            next("init"),
            next("lists"),
            next("remote"),
            next("language-block")
        ],
        ["aliases", "local", "dkim", "local"]
    );
}
