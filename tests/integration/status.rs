//! pepsi-status as a process against a real PostgreSQL and real services: the queue counted
//! per stage and status in the table and the JSON, a failed row's error, the mail log's
//! rates and bounces, services that do not answer named with exit status 1, a real ingress
//! (plain and implicit TLS), dispatcher and pepsi-httpd shown answering, the roles it may
//! run as, usage errors, and — through the whole system — a delivered message found with
//! `pepsi-status log`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::Run;
use crate::support::system::System;

const WAIT: Duration = Duration::from_secs(30);

fn status_bin() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-status", env!("CARGO_BIN_EXE_pepsi-status"))
}

impl Run {
    /// The screen's line that starts with `first` (a service, a stage, an event).
    fn line(&self, first: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no line for {first:?}:\n{}", self.stdout))
    }

    /// The cells of that line.
    fn cells(&self, first: &str) -> Vec<&str> {
        self.line(first).split_whitespace().collect()
    }
}

/// `pepsi-status -c config ARGS` with `env` set.
fn run(config: &Path, args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = Command::new(status_bin());
    cmd.arg("-c").arg(config).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    Run::of(out)
}

/// The environment the whole system's programs run with (`System::command`).
fn system_env(sys: &System) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("DATABASE_URL", PathBuf::from(&sys.db.url)),
        ("PEPSI_HOME", sys.home.clone()),
        ("PEPSI_KEY_DIR", sys.dir.path().join("keys")),
        ("PEPSI_SECRETS_DIR", sys.dir.path().join("secrets.d")),
    ]
}

fn run_in(sys: &System, args: &[&str]) -> Run {
    let env = system_env(sys);
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    run(&sys.config, args, &env)
}

fn service<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no service {name}: {doc:#}"))
}

fn stage<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["queue"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == name)
        .unwrap_or_else(|| panic!("no stage {name}: {doc:#}"))
}

/// A configuration with only `[database]`, then `extra`.
fn config(dir: &Path, url: &str, extra: &str) -> PathBuf {
    let path = dir.join("pepsi.conf");
    std::fs::write(&path, format!("[database]\nURL = {url}\n\n{extra}\n")).unwrap();
    path
}

/// A queue row at `stage`/`status` with `state`, received `age_secs` ago.
async fn add(
    db: &TestDb,
    stage: &str,
    status: &str,
    rcpt: &str,
    state: Value,
    age_secs: f64,
) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('sender@example.test', ARRAY[$1], \
         'Subject: hello\r\n'::bytea, 'body\r\n'::bytea, $2)",
    )
    .bind(rcpt)
    .bind(&state)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET stage = $2, status = $3::pepsi.workqueue_status, \
         timeout = CASE WHEN $3 = 'paused' THEN now() + interval '1 hour' END, \
         received_at = now() - make_interval(secs => $4) WHERE workqueue_id = $1",
    )
    .bind(id)
    .bind(stage)
    .bind(status)
    .bind(age_secs)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

/// A mail log row `ago_secs` old.
async fn log_row(db: &TestDb, event: &str, rcpt: &str, detail: Value, ago_secs: f64) {
    sqlx::query(
        "INSERT INTO pepsi.mail_log (at, workqueue_id, stage, event, mail_from, rcpt_to, detail) \
         VALUES (now() - make_interval(secs => $1), 7, 'local', $2, 'sender@example.test', ARRAY[$3], $4)",
    )
    .bind(ago_secs)
    .bind(event)
    .bind(rcpt)
    .bind(detail)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_queue_is_counted_per_stage_and_status_with_failures_and_bounces() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &db.url, "");
    add(&db, "init", "pending", "a@example.test", json!({}), 5.0).await;
    add(&db, "init", "pending", "b@example.test", json!({}), 5.0).await;
    add(&db, "init", "running", "c@example.test", json!({}), 5.0).await;
    add(
        &db,
        "relay",
        "paused",
        "d@example.org",
        json!({"attempts": 2}),
        3.0 * 3600.0,
    )
    .await;
    add(
        &db,
        "relay",
        "paused",
        "e@example.org",
        json!({"held": {"reason": "abuse"}}),
        60.0,
    )
    .await;
    let crashed = add(
        &db,
        "relay",
        "failed",
        "f@example.org",
        json!({"dispatch_error": "the worker exited with status 3"}),
        60.0,
    )
    .await;
    let slow = add(
        &db,
        "bounce",
        "timeout",
        "g@example.test",
        json!({"dispatch_error": "killed after MAX_RUNTIME (60s)"}),
        60.0,
    )
    .await;
    let full = add(
        &db,
        "local",
        "failed",
        "h@example.test",
        json!({"last_error": "452 4.2.2 mailbox full"}),
        60.0,
    )
    .await;
    for ago in [10.0, 20.0] {
        log_row(
            &db,
            "delivered",
            "x@example.test",
            json!({"mailbox": "/m/x"}),
            ago,
        )
        .await;
    }
    log_row(
        &db,
        "delivered",
        "x@example.test",
        json!({"mailbox": "/m/x"}),
        1800.0,
    )
    .await;
    log_row(&db, "delivered", "x@example.test", json!({}), 2.0 * 3600.0).await;
    log_row(
        &db,
        "bounced",
        "nobody@example.test",
        json!({"status": "5.1.1", "diagnostic": "no such user here"}),
        30.0,
    )
    .await;

    // No listener and no [pepsi-httpd]: only the database is probed.
    let r = run(&cfg, &["--json", "--skip", "dispatcher"], &[]);
    assert_eq!(r.code, 0, "{r:?}");
    let doc = r.json();
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["services"].as_array().unwrap().len(), 1, "{doc:#}");
    assert_eq!(service(&doc, "database")["ok"], true);
    assert_eq!(doc["queue"]["total"], 8);
    let cells = |s: &Value| -> Vec<i64> {
        [
            "pending", "running", "paused", "held", "failed", "timeout", "total",
        ]
        .iter()
        .map(|k| s[*k].as_i64().unwrap())
        .collect()
    };
    assert_eq!(cells(stage(&doc, "init")), [2, 1, 0, 0, 0, 0, 3]);
    assert_eq!(cells(stage(&doc, "relay")), [0, 0, 1, 1, 1, 0, 3]);
    assert_eq!(cells(stage(&doc, "bounce")), [0, 0, 0, 0, 0, 1, 1]);
    assert_eq!(cells(stage(&doc, "local")), [0, 0, 0, 0, 1, 0, 1]);
    assert_eq!(doc["queue"]["oldest"]["stage"], "relay");
    let age = doc["queue"]["oldest"]["age_seconds"].as_f64().unwrap();
    assert!((3.0 * 3600.0..3.0 * 3600.0 + 600.0).contains(&age), "{age}");
    assert!(stage(&doc, "init")["oldest_age_seconds"].as_f64().unwrap() < 600.0);

    assert_eq!(doc["failures"]["total"], 3);
    let failures = doc["failures"]["rows"].as_array().unwrap();
    let failure = |id: i64| {
        failures
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("{id}: {failures:#?}"))
    };
    assert_eq!(
        failure(crashed)["dispatch_error"],
        "the worker exited with status 3"
    );
    assert_eq!(failure(crashed)["status"], "failed");
    assert_eq!(failure(slow)["status"], "timeout");
    assert_eq!(failure(full)["last_error"], "452 4.2.2 mailbox full");

    let windows = doc["rates"]["windows"].as_array().unwrap();
    assert_eq!(doc["rates"]["source"], "mail_log");
    assert_eq!(
        (
            windows[0]["seconds"].as_i64(),
            windows[0]["delivered"].as_i64()
        ),
        (Some(300), Some(2))
    );
    assert_eq!(
        (windows[0]["bounced"].as_i64(), windows[0]["total"].as_i64()),
        (Some(1), Some(3))
    );
    assert_eq!(
        (
            windows[1]["seconds"].as_i64(),
            windows[1]["delivered"].as_i64()
        ),
        (Some(3600), Some(3))
    );
    let bounces = doc["bounces"].as_array().unwrap();
    assert_eq!(bounces.len(), 1, "{bounces:#?}");
    assert_eq!(bounces[0]["detail"]["status"], "5.1.1");
    assert_eq!(doc["notes"], json!([]));

    // The same on the screen.
    let r = run(&cfg, &["--skip", "dispatcher"], &[]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains("QUEUE: 8 rows, the oldest received 3h00m ago (stage relay)"),
        "{}",
        r.stdout
    );
    assert_eq!(
        &r.cells("init")[..8],
        ["init", "2", "1", "0", "0", "0", "0", "3"]
    );
    assert_eq!(
        &r.cells("relay")[..9],
        ["relay", "0", "0", "1", "1", "1", "0", "3", "3h00m"]
    );
    assert_eq!(
        &r.cells("total")[..8],
        ["total", "2", "1", "1", "1", "2", "1", "8"]
    );
    assert!(r.line("database").contains("up"), "{}", r.stdout);
    assert_eq!(&r.cells("delivered")[..3], ["delivered", "2", "3"]);
    assert!(
        r.stdout
            .contains("RECENT FAILURES: 3 failed or timed-out rows"),
        "{}",
        r.stdout
    );
    let crashed_line = r.line(&crashed.to_string());
    assert!(
        crashed_line.contains("relay") && crashed_line.contains("the worker exited with status 3"),
        "{crashed_line}"
    );
    assert!(
        r.line(&full.to_string()).contains("452 4.2.2 mailbox full"),
        "{}",
        r.stdout
    );
    assert!(
        r.line(&slow.to_string()).contains("timeout"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("5.1.1") && r.stdout.contains("no such user here"),
        "{}",
        r.stdout
    );

    // --limit bounds the lists, not the totals.
    let doc = run(
        &cfg,
        &["--json", "--skip", "dispatcher", "--limit", "1"],
        &[],
    )
    .json();
    assert_eq!(doc["failures"]["total"], 3);
    assert_eq!(doc["failures"]["rows"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn services_that_do_not_answer_are_named_and_the_exit_status_is_1() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let closed = support::free_port();
    // Accepts connections (the kernel completes them) but never greets.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let cfg = config(
        dir.path(),
        &db.url,
        &format!(
            "[listener-mx]\nROLE = mx\nADDRESS = 127.0.0.1:{closed}\n\n\
             [listener-silent]\nROLE = mx\nADDRESS = 127.0.0.1:{silent_port}\n\n\
             [pepsi-httpd]\nADDRESS = 127.0.0.1:{closed}\n"
        ),
    );
    let started = Instant::now();
    let r = run(&cfg, &["--json", "--timeout", "1s"], &[]);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the probes are bounded: {r:?}"
    );
    assert_eq!(r.code, 1, "{r:?}");
    let doc = r.json();
    assert_eq!(doc["ok"], false);
    assert_eq!(service(&doc, "database")["ok"], true);
    for name in [
        "dispatcher",
        "listener-mx",
        "listener-silent",
        "pepsi-httpd",
    ] {
        assert_eq!(service(&doc, name)["ok"], false, "{name}: {doc:#}");
    }
    let detail = |name: &str| service(&doc, name)["detail"].as_str().unwrap().to_owned();
    assert!(detail("dispatcher").contains("not running"), "{doc:#}");
    assert!(detail("listener-mx").contains("cannot connect"), "{doc:#}");
    assert!(
        detail("listener-silent").contains("no greeting within 1s"),
        "{doc:#}"
    );
    assert!(detail("pepsi-httpd").contains("cannot connect"), "{doc:#}");
    assert_eq!(
        service(&doc, "pepsi-httpd")["address"],
        format!("http://127.0.0.1:{closed}")
    );

    let r = run(&cfg, &["--timeout", "1s"], &[]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.line("dispatcher").contains("NOT RUNNING"), "{}", r.stdout);
    for name in ["listener-mx", "listener-silent", "pepsi-httpd"] {
        assert!(r.line(name).contains("DOWN"), "{name}:\n{}", r.stdout);
    }
    // Skipped services are neither shown nor counted.
    let r = run(
        &cfg,
        &[
            "--skip",
            "dispatcher",
            "--skip",
            "ingress",
            "--skip",
            "httpd",
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stdout.contains("listener-mx"), "{}", r.stdout);

    // A database that does not answer: named, and nothing else from it.
    let cfg = config(
        dir.path(),
        &format!("postgres://127.0.0.1:{closed}/nothing"),
        "",
    );
    let r = run(&cfg, &["--json", "--timeout", "1s"], &[]);
    assert_eq!(r.code, 1, "{r:?}");
    let doc = r.json();
    assert_eq!(service(&doc, "database")["ok"], false);
    assert!(
        service(&doc, "database")["detail"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{doc:#}"
    );
    assert!(
        service(&doc, "dispatcher")["detail"]
            .as_str()
            .unwrap()
            .contains("unknown"),
        "{doc:#}"
    );
    assert_eq!(doc["queue"], Value::Null);
    let r = run(&cfg, &["--timeout", "1s"], &[]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.line("database").contains("DOWN"), "{}", r.stdout);
    drop(silent);
}

#[tokio::test]
async fn a_running_ingress_answers_on_plain_and_implicit_tls_listeners_and_a_stopped_one_does_not()
{
    let ingress = support::ingress::Ingress::start(
        "",
        &[
            ("mx", "ROLE = mx\n"),
            (
                "subs",
                "ROLE = submissions\nTLS_CERT = {cert}\nTLS_KEY = {key}\n",
            ),
        ],
    )
    .await;
    let r = run(&ingress.config, &["--json", "--skip", "dispatcher"], &[]);
    assert_eq!(r.code, 0, "{r:?}\n{}", ingress.log());
    let doc = r.json();
    for name in ["listener-mx", "listener-subs"] {
        let s = service(&doc, name);
        assert_eq!(s["ok"], true, "{name}: {doc:#}");
        assert_eq!(s["kind"], "smtp");
        assert!(
            s["detail"]
                .as_str()
                .unwrap()
                .starts_with("220 mx.example.test"),
            "{name}: {s:#}"
        );
    }
    assert_eq!(
        service(&doc, "listener-subs")["address"],
        format!("127.0.0.1:{} (TLS)", ingress.port("subs"))
    );
    let r = run(&ingress.config, &["--skip", "dispatcher"], &[]);
    assert!(r.line("listener-mx").contains(" up "), "{}", r.stdout);

    let config = ingress.config.clone();
    let keep = tempfile::tempdir().unwrap();
    let copy = keep.path().join("pepsi.conf");
    std::fs::copy(&config, &copy).unwrap();
    drop(ingress);
    // The database went with the ingress's test: only the listeners are asked now.
    let r = run(
        &copy,
        &["--json", "--skip", "dispatcher", "--timeout", "1s"],
        &[],
    );
    assert_eq!(r.code, 1, "{r:?}");
    let doc = r.json();
    for name in ["listener-mx", "listener-subs"] {
        assert_eq!(service(&doc, name)["ok"], false, "{name}: {doc:#}");
    }
}

#[tokio::test]
async fn the_whole_system_answers_dispatcher_ingress_and_httpd_with_exit_status_0() {
    let port = support::free_port();
    let mut sys = System::new(
        &format!("[pepsi-httpd]\nADDRESS = 127.0.0.1:{port}\nALLOW_ROOT = yes\n"),
        &["alice"],
    )
    .await;
    // pepsi-httpd runs without the system's environment: name the database in the file.
    let mut text = std::fs::read_to_string(&sys.config).unwrap();
    text.push_str(&format!("\n[database]\nURL = {}\n", sys.db.url));
    std::fs::write(&sys.config, text).unwrap();
    sys.start().await;
    let mut httpd = support::httpd::Httpd::new(sys.config.clone(), port);
    httpd.start().await;

    // The dispatcher takes its lock just after it starts.
    let until = Instant::now() + WAIT;
    let doc = loop {
        let r = run_in(&sys, &["--json"]);
        if r.code == 0 || Instant::now() > until {
            assert_eq!(r.code, 0, "{r:?}\n{}", sys.logs());
            break r.json();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let dispatcher = service(&doc, "dispatcher");
    let pid = format!("pid {}", sys.dispatcher_pid());
    assert!(
        dispatcher["detail"]
            .as_str()
            .unwrap()
            .contains("pepsi-dispatch")
            && dispatcher["holder"]["application_name"]
                .as_str()
                .unwrap()
                .ends_with(&pid),
        "{dispatcher:#}"
    );
    assert!(
        service(&doc, "listener-mx")["detail"]
            .as_str()
            .unwrap()
            .starts_with("220 "),
        "{doc:#}"
    );
    let h = service(&doc, "pepsi-httpd");
    assert_eq!(
        (h["ok"].as_bool(), h["kind"].as_str()),
        (Some(true), Some("http")),
        "{h:#}"
    );
    assert!(h["detail"].as_str().unwrap().contains("HTTP 200"), "{h:#}");

    let r = run_in(&sys, &[]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.line("dispatcher").contains("running"), "{}", r.stdout);
    assert!(r.line("pepsi-httpd").contains(" up "), "{}", r.stdout);

    // The dispatcher stopped: named, exit status 1.
    sys.stop_dispatcher();
    let r = run_in(&sys, &["--json"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(service(&r.json(), "dispatcher")["ok"], false);
    httpd.stop();
}

#[tokio::test]
async fn a_message_through_the_whole_system_leaves_a_mail_log_row_that_pepsi_status_finds() {
    let mut sys = System::new("", &["alice", "bob"]).await;
    sys.start().await;
    let msg = b"From: bob@example.test\r\nTo: alice@example.test\r\nSubject: find me\r\n\
                Message-ID: <status-1@example.test>\r\n\r\nWhere did it go?\r\n";
    let reply = sys
        .send("bob@example.test", &["alice@example.test"], msg)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 1, WAIT).await;
    sys.wait_empty(WAIT).await;

    let r = run_in(
        &sys,
        &["log", "--recipient", "alice@example.test", "--json"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let doc = r.json();
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{doc:#}");
    let row = &rows[0];
    assert_eq!(row["event"], "delivered");
    assert_eq!(row["mail_from"], "bob@example.test");
    assert_eq!(row["rcpt_to"], json!(["alice@example.test"]));
    assert_eq!(row["stage"], "local");
    let mailbox = row["detail"]["mailbox"].as_str().unwrap();
    assert!(mailbox.contains("alice"), "{row:#}");
    assert_eq!(doc["truncated"], false);
    let id = row["workqueue_id"].as_i64().unwrap();

    // The same row by sender and time, by its queue row, and on the table.
    let r = run_in(
        &sys,
        &[
            "log",
            "--sender",
            "BOB@example",
            "--since",
            "10m",
            "--event",
            "delivered",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.starts_with("AT "), "{}", r.stdout);
    let line = r.stdout.lines().nth(1).unwrap_or_default();
    assert!(
        line.contains("delivered")
            && line.contains("alice@example.test")
            && line.contains(&id.to_string()),
        "{}",
        r.stdout
    );
    assert!(line.contains(&format!("mailbox {mailbox}")), "{}", r.stdout);
    let by_id = run_in(&sys, &["log", "--id", &id.to_string(), "--json"]).json();
    assert_eq!(by_id["rows"].as_array().unwrap().len(), 1, "{by_id:#}");
    let none = run_in(&sys, &["log", "--recipient", "nobody@example.test"]);
    assert_eq!(
        (none.code, none.stdout.trim()),
        (0, "no mail log rows match"),
        "{none:?}"
    );
    let later = run_in(
        &sys,
        &[
            "log",
            "--recipient",
            "alice@",
            "--until",
            "2000-01-01",
            "--json",
        ],
    )
    .json();
    assert_eq!(later["rows"], json!([]));

    // The screen counts it among what left the pipeline (no pepsi-httpd runs here).
    let r = run_in(&sys, &["--json", "--skip", "httpd"]);
    let doc = r.json();
    assert!(
        doc["rates"]["windows"][0]["delivered"].as_i64().unwrap() >= 1,
        "{doc:#}"
    );
    assert_eq!(doc["queue"]["total"], 0);
}

/// `url` with its user replaced by `user`.
fn url_as(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let host_start = match rest.find('@') {
        Some(at) if at < rest.find('/').unwrap_or(rest.len()) => at + 1,
        _ => 0,
    };
    format!("{scheme}://{user}@{}", &rest[host_start..])
}

#[tokio::test]
async fn the_httpd_role_sees_everything_the_pipeline_role_all_but_the_mail_log() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    add(
        &db,
        "relay",
        "failed",
        "a@example.org",
        json!({"dispatch_error": "boom"}),
        10.0,
    )
    .await;
    log_row(&db, "delivered", "x@example.test", json!({}), 10.0).await;
    let as_role = |role: &str| {
        let sub = dir.path().join(role);
        std::fs::create_dir_all(&sub).unwrap();
        config(&sub, &url_as(&db.url, role), "")
    };

    let r = run(
        &as_role("pepsi-httpd"),
        &["--json", "--skip", "dispatcher"],
        &[],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let doc = r.json();
    assert_eq!(doc["queue"]["total"], 1);
    assert_eq!(doc["rates"]["windows"][0]["delivered"], 1);
    assert_eq!(doc["notes"], json!([]));
    assert!(
        service(&doc, "database")["detail"]
            .as_str()
            .unwrap()
            .contains("pepsi-httpd"),
        "{doc:#}"
    );

    let r = run(&as_role("pepsi"), &["--json", "--skip", "dispatcher"], &[]);
    assert_eq!(r.code, 0, "{r:?}");
    let doc = r.json();
    assert_eq!(doc["failures"]["rows"][0]["dispatch_error"], "boom");
    assert_eq!(doc["rates"], Value::Null);
    assert!(
        doc["notes"][0]
            .as_str()
            .unwrap()
            .contains("may not read pepsi.mail_log"),
        "{doc:#}"
    );
    let r = run(&as_role("pepsi"), &["log"], &[]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("may not read pepsi.mail_log"), "{r:?}");

    let r = run(
        &as_role("pepsi-ingress"),
        &["--json", "--skip", "dispatcher"],
        &[],
    );
    assert_eq!(r.code, 1, "{r:?}");
    let doc = r.json();
    assert_eq!(service(&doc, "database")["ok"], false);
    assert!(
        service(&doc, "database")["detail"]
            .as_str()
            .unwrap()
            .contains("pepsi-httpd role"),
        "{doc:#}"
    );
}

#[tokio::test]
async fn bad_input_is_a_usage_error_with_exit_status_2() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &db.url, "");
    for (args, want) in [
        (vec!["log", "--since", "yesterdayish"], "yesterdayish"),
        (vec!["log", "--until", "2026-13-45"], "2026-13-45"),
        (vec!["--frobnicate"], "--frobnicate"),
        (vec!["--timeout", "0"], "--timeout"),
        (vec!["--skip", "everything"], "everything"),
        (vec!["--watch", "0"], "--watch"),
        (vec!["log", "--event", "vanished"], "vanished"),
        (vec!["log", "--id", "0"], "--id"),
        (vec!["--json", "log"], "--json belongs to the screen"),
        (vec!["log", "--since", "1h", "--until", "2h"], "--since"),
    ] {
        let r = run(&cfg, &args, &[]);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(
            r.stderr.contains(want),
            "{args:?}: {want:?} not in {:?}",
            r.stderr
        );
        assert!(r.stdout.is_empty(), "{args:?}: {r:?}");
    }
}

#[test]
fn help_is_a_manual_page_with_examples_and_exit_codes() {
    let out = Command::new(status_bin()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "Exit status: 0 when every probed service answers, 1",
        "2 on a usage error",
        "advisory lock",
        "the last hour",
        "GET /healthz",
        "Examples:",
        "pepsi-status log --recipient",
        "--watch",
        "--timeout",
    ] {
        assert!(text.contains(want), "{want:?} missing from --help:\n{text}");
    }
    let out = Command::new(status_bin())
        .args(["log", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("--recipient") && text.contains("Message-ID"),
        "{text}"
    );
}
