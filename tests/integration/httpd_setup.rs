//! The online setup through pepsi-httpd, the real `pepsi-setup apply` and Debian's Chromium:
//! the first administrator made from the browser once and never again, the interview's
//! answers refused field by field or written as tasks through the configuration role (no
//! typed password in them), and the tasks' progress on the page as apply carries them out
//! into a real configuration file and database.

use std::process::Command;

use pepsi_conf::config::Config;
use reqwest::Method;
use serde_json::json;

use crate::setup_apply::{apply, config_dir};
use crate::support::browser::Browser;
use crate::support::free_port;
use crate::support::httpd::{Auth, Httpd, Session, url_as, write_config};

const PASSWORD: &str = "correct horse battery";

/// A test database, pepsi-httpd over it as its role with the configuration role's
/// connection for the tasks (or without, `writable` false), started; no administrator.
async fn started(writable: bool) -> (pepsi_testkit::TestDb, tempfile::TempDir, Httpd) {
    let db = pepsi_testkit::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let extra = if writable {
        format!(
            "CONFIG_DATABASE_URL = {}\n",
            url_as(&db.url, "pepsi-config")
        )
    } else {
        String::new()
    };
    let config = write_config(dir.path(), &url_as(&db.url, "pepsi-httpd"), port, &extra);
    let mut httpd = Httpd::new(config, port);
    httpd.start().await;
    (db, dir, httpd)
}

/// The session `POST /api/setup/admin` (or a login) answered with: its cookie's secret
/// and its CSRF token.
fn session_of(made: &crate::support::httpd::Answer) -> Session {
    let cookie = made.headers["set-cookie"].to_str().unwrap();
    let secret = cookie
        .strip_prefix("pepsi_session=")
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_owned();
    Session {
        cookie: secret,
        csrf: made.json["csrf_token"].as_str().unwrap().to_owned(),
    }
}

/// A self-signed certificate and its key, PEM, made by openssl.
fn certificate(dir: &std::path::Path) -> (String, String) {
    let cert = dir.join("mx.pem");
    let key = dir.join("mx.key");
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args([
            "-nodes",
            "-days",
            "30",
            "-subj",
            "/CN=mx.example.org",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl: {out:?}");
    (cert.display().to_string(), key.display().to_string())
}

/// Opens the setup page at `url` in `b` while the server has no administrator, makes the
/// first one (`root`, `password`) and waits for the interview it reloads into.
pub(crate) async fn first_administrator(b: &Browser, url: &str, password: &str) {
    b.go(url).await;
    b.until(
        "the first administrator's form",
        "return document.getElementById('admin-form') !== null",
    )
    .await;
    b.type_into("#admin-name", "root").await;
    b.type_into("#admin-password", password).await;
    b.click("#admin-submit").await;
    b.until(
        "the interview",
        "return document.getElementById('setup-form') !== null",
    )
    .await;
}

#[tokio::test]
async fn the_first_administrator_is_made_once_and_tasks_need_a_session() {
    let (db, _dir, httpd) = started(true).await;
    let status = httpd
        .call(Method::GET, "/api/setup", &Auth::None, None)
        .await;
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(status.json["administrator_exists"], false);
    assert_eq!(status.json["tasks_writable"], true);
    let page = httpd.call(Method::GET, "/setup", &Auth::None, None).await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("admin-form"), "{}", page.text);
    // Refused answers name what was wrong; nothing is made.
    let short = httpd
        .call(
            Method::POST,
            "/api/setup/admin",
            &Auth::None,
            Some(&json!({"name": "root", "password": "short"})),
        )
        .await;
    assert_eq!(short.status, 400);
    assert!(
        short.json["error"].as_str().unwrap().contains("12 to"),
        "{short:?}"
    );
    let bad_name = httpd
        .call(
            Method::POST,
            "/api/setup/admin",
            &Auth::None,
            Some(&json!({"name": "Root Admin", "password": PASSWORD})),
        )
        .await;
    assert_eq!(bad_name.status, 400);
    // The first one is made and logged in.
    let made = httpd
        .call(
            Method::POST,
            "/api/setup/admin",
            &Auth::None,
            Some(&json!({"name": "root", "password": PASSWORD})),
        )
        .await;
    assert_eq!(made.status, 201, "{made:?}");
    let session = session_of(&made);
    // Never a second time, with or without a session.
    let again = httpd
        .call(
            Method::POST,
            "/api/setup/admin",
            &Auth::None,
            Some(&json!({"name": "mallory", "password": PASSWORD})),
        )
        .await;
    assert_eq!(again.status, 409, "{again:?}");
    let admins: Vec<String> = sqlx::query_scalar("SELECT name FROM pepsi.admin_account")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(admins, ["root"]);
    // Now the page needs a login, and the tasks a session with its CSRF token.
    let page = httpd.call(Method::GET, "/setup", &Auth::None, None).await;
    assert_eq!(page.status, 401);
    assert!(page.text.contains("login-form"));
    let page = httpd
        .call(Method::GET, "/setup", &Auth::Session(session.clone()), None)
        .await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("setup-form"));
    let answers = json!({
        "hostname": "mx.example.org",
        "domains": ["example.org"],
        "certificate": {"source": "files", "certificate": "/etc/c.pem", "key": "/etc/k.pem"},
        "dkim": {"selector": "s1", "algorithm": "ed25519"},
        "relay": {"mode": "direct"},
        "delivery": {"method": "lmtp", "server": "127.0.0.1:24"},
        "mailboxes": [{"address": "alice@example.org", "password": "alice's password"}]
    });
    let anonymous = httpd
        .call(
            Method::POST,
            "/api/setup/tasks",
            &Auth::None,
            Some(&answers),
        )
        .await;
    assert_eq!(anonymous.status, 401);
    let forged = httpd
        .call(
            Method::POST,
            "/api/setup/tasks",
            &Auth::CookieOnly(session.clone()),
            Some(&answers),
        )
        .await;
    assert_eq!(forged.status, 403, "{forged:?}");
    // Every refused answer, each with its field.
    let mut wrong = answers.clone();
    wrong["hostname"] = json!("mx");
    wrong["mailboxes"][0]["address"] = json!("bob@elsewhere.example");
    let refused = httpd
        .call(
            Method::POST,
            "/api/setup/tasks",
            &Auth::Session(session.clone()),
            Some(&wrong),
        )
        .await;
    assert_eq!(refused.status, 422, "{refused:?}");
    let fields: Vec<&str> = refused.json["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["hostname", "mailboxes[0].address"], "{refused:?}");
    let unknown = httpd
        .call(
            Method::POST,
            "/api/setup/tasks",
            &Auth::Session(session.clone()),
            Some(&json!({"hostname": "mx.example.org", "shell": "id"})),
        )
        .await;
    assert_eq!(unknown.status, 400, "{unknown:?}");
    let written = httpd
        .call(
            Method::POST,
            "/api/setup/tasks",
            &Auth::Session(session.clone()),
            Some(&answers),
        )
        .await;
    assert_eq!(written.status, 201, "{written:?}");
    assert_eq!(written.json["tasks"].as_array().unwrap().len(), 8);
    let rows: Vec<(String, String, serde_json::Value)> = sqlx::query_as(
        "SELECT kind, written_by::text, params FROM pepsi.setup_task ORDER BY task_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        rows.iter().all(|(_, by, _)| by == "pepsi-config"),
        "{rows:?}"
    );
    let (_, _, mailbox) = rows.iter().find(|(k, _, _)| k == "mailbox").unwrap();
    let hash = mailbox["password_hash"].as_str().unwrap();
    assert!(pepsi_admin::password::check_hash(hash, b"alice's password"));
    assert!(
        !serde_json::to_string(&rows)
            .unwrap()
            .contains("alice's password")
    );
    let listed = httpd
        .call(
            Method::GET,
            "/api/setup/tasks",
            &Auth::Session(session),
            None,
        )
        .await;
    assert_eq!(listed.status, 200);
    let tasks = listed.json["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 8);
    assert!(
        tasks
            .iter()
            .all(|t| t["status"] == "pending" && t.get("params").is_none())
    );
}

#[tokio::test]
async fn without_the_configuration_connection_no_task_is_written() {
    let (_db, _dir, httpd) = started(false).await;
    let made = httpd
        .call(
            Method::POST,
            "/api/setup/admin",
            &Auth::None,
            Some(&json!({"name": "root", "password": PASSWORD})),
        )
        .await;
    assert_eq!(made.status, 201);
    let session = session_of(&made);
    let answer = httpd
        .call(
            Method::POST,
            "/api/setup/tasks",
            &Auth::Session(session),
            Some(&json!({
                "hostname": "mx.example.org", "domains": ["example.org"],
                "certificate": {"source": "files", "certificate": "/c", "key": "/k"},
                "dkim": {"selector": "s1", "algorithm": "rsa"},
                "relay": {"mode": "direct"},
                "delivery": {"method": "lmtp", "server": "127.0.0.1:24"}
            })),
        )
        .await;
    assert_eq!(answer.status, 409, "{answer:?}");
    assert!(
        answer.json["error"]
            .as_str()
            .unwrap()
            .contains("CONFIG_DATABASE_URL")
    );
}

#[tokio::test]
async fn the_wizard_in_chromium_writes_the_tasks_and_shows_apply_carrying_them_out() {
    let (db, dir, httpd) = started(true).await;
    let (cert, key) = certificate(dir.path());
    let (_conf_dir, conf) = config_dir(&db, "");
    let b = Browser::start().await;
    first_administrator(&b, &httpd.url("/setup"), PASSWORD).await;
    // A host name that is not one: refused beside its field, nothing written.
    b.type_into("#hostname", "mx").await;
    b.type_into("#domains", "example.org").await;
    b.click("input[name=certificate][value=files]").await;
    b.type_into("#tls-certificate", &cert).await;
    b.type_into("#tls-key", &key).await;
    b.click("input[name=delivery][value=lmtp]").await;
    b.type_into("#mailbox-address", "alice@example.org").await;
    b.type_into("#mailbox-password", "alice's password").await;
    b.click("#setup-submit").await;
    let shown = b
        .until(
            "the refusal beside the host name",
            "const e = document.querySelector('[data-field=hostname]'); return e && e.textContent || null;",
        )
        .await;
    assert!(
        shown.as_str().unwrap().contains("is not a domain name"),
        "{shown}"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.setup_task")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
    b.js("document.getElementById('hostname').value = ''; return true")
        .await;
    b.type_into("#hostname", "mx.example.org").await;
    // This configuration has no vacation or whitelist stage: both features off.
    b.click("#feature-vacation").await;
    b.click("#feature-whitelist").await;
    b.click("#setup-submit").await;
    b.until(
        "the pending tasks",
        "return document.querySelectorAll('#tasks tbody tr.pending').length === 9",
    )
    .await;
    let features: serde_json::Value =
        sqlx::query_scalar("SELECT params FROM pepsi.setup_task WHERE kind = 'features'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        features,
        json!({"vacation": false, "whitelist": false, "language": false, "milter": null,
               "encryption": false})
    );
    // apply, as root, carries them out; the page follows.
    let run = apply(&conf);
    assert_eq!(run.code, 0, "{run:?}");
    b.until(
        "every task done",
        "const rows = document.querySelectorAll('#tasks tbody tr'); \
         return rows.length === 9 && Array.from(rows).every(r => r.className === 'done');",
    )
    .await;
    let log = b
        .js("return document.getElementById('task-logs').textContent")
        .await;
    assert!(log.as_str().unwrap().contains("replaced"), "{log}");
    let cfg = Config::load(&conf).unwrap();
    assert_eq!(
        cfg.section("pepsi").string("HOSTNAME").unwrap(),
        "mx.example.org"
    );
    assert_eq!(cfg.section("listener-mx").string("TLS_CERT").unwrap(), cert);
    assert_eq!(
        cfg.section("stage-local").string("PROGRAM").unwrap(),
        "pepsi-stage-relay-to-lmtp"
    );
    let hash: String = sqlx::query_scalar(
        "SELECT password_hash FROM pepsi.mailbox_password WHERE address = 'alice@example.org'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(pepsi_admin::password::check_hash(
        &hash,
        b"alice's password"
    ));
}

#[tokio::test]
async fn the_dns_check_on_the_page_names_the_wrong_record_and_the_record_to_publish() {
    use crate::setup_check_dns::{Nsd, line};
    let db = pepsi_testkit::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    // The domain's key, and the records `pepsi-setup dns` says to publish for it.
    let out = Command::new(env!("CARGO_BIN_EXE_pepsi-setup"))
        .args([
            "dns",
            "example.test",
            "--mx",
            "mx.example.test",
            "--selector",
            "s1",
        ])
        .args(["--database-url", &db.url, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every record as printed but SPF, which does not let the MX send.
    let mut zone = String::from("ns IN A 127.0.0.1\nmx IN A 192.0.2.25\n");
    let mut spf_line = String::new();
    for r in printed["records"].as_array().unwrap() {
        let (name, kind, value) = (
            r["name"].as_str().unwrap(),
            r["type"].as_str().unwrap(),
            r["value"].as_str().unwrap(),
        );
        if value.starts_with("v=spf1") {
            spf_line = line(name, kind, value);
            zone.push_str(&line(name, kind, "v=spf1 ip4:198.51.100.7 -all"));
        } else {
            zone.push_str(&line(name, kind, value));
        }
        zone.push('\n');
    }
    assert!(!spf_line.is_empty(), "{printed}");
    let nsd = Nsd::start(
        &dir.path().join("nsd"),
        &[
            ("example.test", zone),
            (
                "2.0.192.in-addr.arpa",
                "25 IN PTR mx.example.test.\n".into(),
            ),
        ],
    );
    let port = free_port();
    let extra = format!(
        "CONFIG_DATABASE_URL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
         DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 2s\n",
        url_as(&db.url, "pepsi-config"),
        nsd.port
    );
    let config = write_config(dir.path(), &url_as(&db.url, "pepsi-httpd"), port, &extra);
    let mut httpd = Httpd::new(config, port);
    httpd.start().await;
    let made = httpd
        .call(
            Method::POST,
            "/api/setup/admin",
            &Auth::None,
            Some(&json!({"name": "root", "password": PASSWORD})),
        )
        .await;
    assert_eq!(made.status, 201);
    let session = session_of(&made);
    let anonymous = httpd
        .call(
            Method::GET,
            "/api/setup/dns-check?domain=example.test",
            &Auth::None,
            None,
        )
        .await;
    assert_eq!(anonymous.status, 401);
    let bad = httpd
        .call(
            Method::GET,
            "/api/setup/dns-check?domain=not%20a%20domain",
            &Auth::Session(session.clone()),
            None,
        )
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    let report = httpd
        .call(
            Method::GET,
            "/api/setup/dns-check?domain=example.test",
            &Auth::Session(session),
            None,
        )
        .await;
    assert_eq!(report.status, 200, "{report:?}");
    let statuses: Vec<(String, String)> = report.json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        statuses
            .iter()
            .all(|(kind, status)| (kind == "spf") == (status == "wrong")
                && (status == "ok" || status == "wrong")),
        "{statuses:?}"
    );
    let spf = report.json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "spf")
        .unwrap();
    let publish = spf["publish"].as_str().unwrap();
    assert!(
        publish.starts_with("example.test. 3600 IN TXT \"v=spf1 mx"),
        "{publish} vs {spf_line}"
    );

    // The same in the page, for a logged-in administrator.
    let b = Browser::start().await;
    b.go(&httpd.url("/setup")).await;
    b.until(
        "the login form",
        "return document.getElementById('login-form') !== null",
    )
    .await;
    b.type_into("#login-name", "root").await;
    b.type_into("#login-password", PASSWORD).await;
    b.click("#login-submit").await;
    b.until(
        "the check form",
        "return document.getElementById('check-form') !== null",
    )
    .await;
    b.type_into("#check-domain", "example.test").await;
    b.click("#check-submit").await;
    let rows = b
        .until(
            "the checked records",
            "const rows = document.querySelectorAll('#dns-checks tbody tr'); \
             return rows.length > 0 ? Array.from(rows).map(r => [r.dataset.kind, r.className, r.cells[4].textContent]) : null;",
        )
        .await;
    let rows = rows.as_array().unwrap();
    let wrong: Vec<&serde_json::Value> = rows.iter().filter(|r| r[1] != "ok").collect();
    assert_eq!(wrong.len(), 1, "{rows:?}");
    assert_eq!(wrong[0][0], "spf");
    assert!(wrong[0][2].as_str().unwrap().contains(publish), "{rows:?}");
    let message = b
        .js("return document.getElementById('check-message').textContent")
        .await;
    assert_eq!(message, "1 record(s) of example.test to fix");
}

#[tokio::test]
async fn the_wizard_writes_a_smarthost_with_oauth2_as_the_task_apply_takes() {
    let (db, dir, httpd) = started(true).await;
    let (cert, key) = certificate(dir.path());
    let b = Browser::start().await;
    first_administrator(&b, &httpd.url("/setup"), PASSWORD).await;
    b.type_into("#hostname", "mx.example.org").await;
    b.type_into("#domains", "example.org").await;
    b.click("input[name=certificate][value=files]").await;
    b.type_into("#tls-certificate", &cert).await;
    b.type_into("#tls-key", &key).await;
    // The OAuth 2.0 fields show only with their choice; the password's do not.
    let hidden = b
        .js("return document.getElementById('oauth-refresh-token').closest('[data-when]').hidden")
        .await;
    assert_eq!(hidden, true);
    b.click("input[name=relay][value=oauth2]").await;
    let shown = b
        .js(
            "return [document.getElementById('oauth-refresh-token').closest('[data-when]').hidden, \
                     document.getElementById('smarthost-password').closest('[data-when]').hidden, \
                     document.getElementById('smarthost-server').closest('[data-when]').hidden]",
        )
        .await;
    assert_eq!(shown, json!([false, true, false]));
    b.type_into("#smarthost-server", "smtp.office365.example:587")
        .await;
    b.type_into("#smarthost-username", "relay@example.org")
        .await;
    b.type_into("#oauth-token-endpoint", "https://login.example/token")
        .await;
    b.type_into("#oauth-client-id", "client-1").await;
    b.type_into("#oauth-refresh-token", "refresh-secret").await;
    b.click("#setup-submit").await;
    b.until(
        "the pending tasks",
        "return document.querySelectorAll('#tasks tbody tr.pending').length >= 7",
    )
    .await;
    let params: serde_json::Value =
        sqlx::query_scalar("SELECT params FROM pepsi.setup_task WHERE kind = 'relay_smarthost'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        params,
        json!({"server": "smtp.office365.example:587", "tls": "verify",
               "username": "relay@example.org",
               "credential": {"method": "oauth2", "token_endpoint": "https://login.example/token",
                              "client_id": "client-1", "client_secret": "",
                              "refresh_token": "refresh-secret"}})
    );
    // The page never shows a task's parameters.
    let page = b.js("return document.body.innerText").await;
    assert!(!page.as_str().unwrap().contains("refresh-secret"));
}
