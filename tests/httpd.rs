//! pepsi-httpd as a process against a real PostgreSQL, over HTTP with reqwest: logins,
//! sessions (rows that survive a restart, idle and absolute expiry, forged cookies), CSRF,
//! API tokens stored as digests only, login throttling, TLS, privilege dropping, every API
//! route with its errors, a bulk retry by filter, /metrics read by Prometheus's own parser,
//! and a message through the whole system whose mail log row the API finds.

mod httpd_common;

use httpd_common::{Auth, Httpd, free_port, write_config};
use pepsi_testkit::TestDb;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// The stage graph the queue tests act on: init has no BOUNCE_STAGE, relay bounces to bounce.
const STAGES: &str = "[pepsi]\nLOCAL_DOMAINS = example.test\n\n\
                      [stage-init]\nPROGRAM = x\nNEXT_STAGE = relay\n\
                      [stage-relay]\nPROGRAM = x\nBOUNCE_STAGE = bounce\n\
                      [stage-bounce]\nPROGRAM = x\n";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    session: httpd_common::Session,
}

/// A database, pepsi-httpd on it with `extra` configuration, administrator `root` logged in.
async fn fixture(extra: &str) -> Fixture {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), &db.url, port, &format!("{extra}\n{STAGES}"));
    let mut httpd = Httpd::new(config, port);
    let password = httpd.admin_add("root");
    httpd.start().await;
    let session = httpd.login("root", &password).await;
    Fixture {
        db,
        _dir: dir,
        httpd,
        session,
    }
}

impl Fixture {
    fn auth(&self) -> Auth {
        Auth::Session(self.session.clone())
    }

    /// A queue row at `stage` with `status`, `age_secs` old.
    async fn add(&self, stage: &str, status: &str, from: &str, rcpt: &[&str], age_secs: f64) -> i64 {
        let id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add($1, $2, 'Subject: hello\r\n'::bytea, 'body\r\n'::bytea, '{}'::jsonb)",
        )
        .bind(from)
        .bind(rcpt.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE pepsi.workqueue SET stage = $2, status = $3::pepsi.workqueue_status, \
             received_at = now() - make_interval(secs => $4) WHERE workqueue_id = $1",
        )
        .bind(id)
        .bind(stage)
        .bind(status)
        .bind(age_secs)
        .execute(&self.db.pool)
        .await
        .unwrap();
        id
    }

    async fn status_of(&self, id: i64) -> Option<(String, String)> {
        sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await
            .unwrap()
    }

    /// (action, actor, workqueue_id, detail) of every event_log row, oldest first.
    async fn events(&self) -> Vec<(String, String, Option<i64>, Value)> {
        sqlx::query_as("SELECT action, actor, workqueue_id, detail FROM pepsi.event_log ORDER BY event_id")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }
}

fn sha256(text: &str) -> Vec<u8> {
    Sha256::digest(text.as_bytes()).to_vec()
}

// ----- authentication -------------------------------------------------------------------

#[tokio::test]
async fn without_a_session_every_api_route_answers_401_in_json() {
    let f = fixture("").await;
    let routes = [
        (Method::GET, "/api/queue"),
        (Method::GET, "/api/queue/1"),
        (Method::POST, "/api/queue/1/retry"),
        (Method::POST, "/api/queue/bulk/retry"),
        (Method::GET, "/api/accounts"),
        (Method::POST, "/api/accounts"),
        (Method::DELETE, "/api/accounts/a@example.test"),
        (Method::PUT, "/api/accounts/a@example.test/password"),
        (Method::GET, "/api/aliases"),
        (Method::PUT, "/api/aliases/a@example.test"),
        (Method::DELETE, "/api/aliases/a@example.test"),
        (Method::GET, "/api/domains"),
        (Method::PUT, "/api/domains/example.org"),
        (Method::DELETE, "/api/domains/example.org"),
        (Method::GET, "/api/mail-log"),
        (Method::GET, "/api/events"),
        (Method::GET, "/api/session"),
        (Method::POST, "/api/logout"),
        (Method::GET, "/metrics"),
    ];
    for (method, path) in routes {
        let a = f.httpd.call(method.clone(), path, &Auth::None, None).await;
        assert_eq!(a.status, 401, "{method} {path}: {a:?}");
        assert!(a.json["error"].as_str().unwrap().contains("authentication required")
            || path == "/metrics", "{method} {path}: {a:?}");
    }
    assert_eq!(f.httpd.get("/healthz", &Auth::None).await.json["status"], "ok");
}

#[tokio::test]
async fn login_sets_a_session_whose_digest_alone_is_stored_and_csrf_guards_changes() {
    let f = fixture("").await;
    let me = f.httpd.get("/api/session", &f.auth()).await;
    assert_eq!(me.status, 200, "{me:?}");
    assert_eq!(me.json["name"], "root");
    assert_eq!(me.json["via"], "session");
    // Only the SHA-256 of the cookie is in the table.
    let digests: Vec<Vec<u8>> = sqlx::query_scalar("SELECT digest FROM pepsi.admin_session")
        .fetch_all(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(digests, vec![sha256(&f.session.cookie)]);
    let dump: String = sqlx::query_scalar("SELECT string_agg(s::text, ' ') FROM pepsi.admin_session s")
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
    assert!(!dump.contains(&f.session.cookie), "the cookie itself is stored: {dump}");
    // A mutating call with the cookie but without the CSRF token: 403, nothing done.
    let domain = f.httpd.call(Method::PUT, "/api/domains/example.org", &Auth::CookieOnly(f.session.clone()), None).await;
    assert_eq!(domain.status, 403, "{domain:?}");
    assert!(domain.json["error"].as_str().unwrap().contains("X-CSRF-Token"));
    let wrong = httpd_common::Session {
        cookie: f.session.cookie.clone(),
        csrf: "0".repeat(64),
    };
    let a = f.httpd.call(Method::PUT, "/api/domains/example.org", &Auth::Session(wrong), None).await;
    assert_eq!(a.status, 403);
    let a = f.httpd.call(Method::PUT, "/api/domains/example.org", &f.auth(), None).await;
    assert_eq!(a.status, 201, "{a:?}");
    // The wrong password: 401 and an audit row; a login row for the right one.
    let bad = f.httpd.post("/api/login", &Auth::None, &json!({"name": "root", "password": "nope"})).await;
    assert_eq!(bad.status, 401);
    assert_eq!(bad.json["error"], "wrong name or password");
    let unknown = f.httpd.post("/api/login", &Auth::None, &json!({"name": "nobody", "password": "x"})).await;
    assert_eq!(unknown.status, 401);
    assert_eq!(unknown.json, bad.json, "an unknown name looks like a wrong password");
    let events = f.events().await;
    let actions: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        actions,
        ["admin.create", "admin.login", "settings.set", "admin.login_failed", "admin.login_failed"]
    );
    assert_eq!(events[1].1, "root");
    assert_eq!(events[1].3["tool"], "pepsi-httpd");
    // Logout ends the session; the cookie no longer works and its row is gone.
    let out = f.httpd.call(Method::POST, "/api/logout", &f.auth(), None).await;
    assert_eq!(out.status, 204, "{out:?}");
    assert!(out.headers["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    assert_eq!(f.httpd.get("/api/session", &f.auth()).await.status, 401);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.admin_session")
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn forged_malformed_and_expired_cookies_are_refused() {
    let f = fixture("[pepsi-httpd]\nSESSION_IDLE_TIMEOUT = 10m\nSESSION_MAX_AGE = 1h\n").await;
    let forged = httpd_common::Session {
        cookie: "ab".repeat(32),
        csrf: String::new(),
    };
    let a = f.httpd.get("/api/queue", &Auth::Session(forged)).await;
    assert_eq!(a.status, 401);
    assert!(a.json["error"].as_str().unwrap().contains("expired or is unknown"), "{a:?}");
    let a = f.httpd.get("/api/queue", &Auth::RawCookie("pepsi_session=not-a-secret".into())).await;
    assert_eq!(a.status, 401);
    assert!(a.json["error"].as_str().unwrap().contains("malformed"), "{a:?}");
    assert_eq!(f.httpd.get("/api/queue", &f.auth()).await.status, 200);
    // Idle past SESSION_IDLE_TIMEOUT.
    sqlx::query("UPDATE pepsi.admin_session SET last_seen_at = now() - interval '11 minutes'")
        .execute(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(f.httpd.get("/api/queue", &f.auth()).await.status, 401);
    // Used a moment ago, but older than SESSION_MAX_AGE.
    sqlx::query("UPDATE pepsi.admin_session SET last_seen_at = now(), created_at = now() - interval '61 minutes'")
        .execute(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(f.httpd.get("/api/queue", &f.auth()).await.status, 401);
    sqlx::query("UPDATE pepsi.admin_session SET created_at = now()")
        .execute(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(f.httpd.get("/api/queue", &f.auth()).await.status, 200, "the same row, live again");
    // A disabled administrator's session is dead too.
    sqlx::query("UPDATE pepsi.admin_account SET enabled = false")
        .execute(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(f.httpd.get("/api/queue", &f.auth()).await.status, 401);
}

#[tokio::test]
async fn a_session_survives_a_restart_of_pepsi_httpd() {
    let mut f = fixture("").await;
    assert_eq!(f.httpd.get("/api/session", &f.auth()).await.status, 200);
    f.httpd.stop();
    f.httpd.start().await;
    let a = f.httpd.get("/api/session", &f.auth()).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json["name"], "root");
    let a = f.httpd.call(Method::PUT, "/api/domains/example.org", &f.auth(), None).await;
    assert_eq!(a.status, 201, "the CSRF token is still good: {a:?}");
}

#[tokio::test]
async fn api_tokens_work_without_csrf_and_only_their_digest_is_stored() {
    let f = fixture("").await;
    let token = f.httpd.token_add("root", &["--label", "ci"]);
    let (id, secret) = token
        .strip_prefix("pepsi_")
        .and_then(|t| t.split_once('_'))
        .expect("pepsi_<id>_<secret>");
    let rows: Vec<(String, Vec<u8>, String, String)> =
        sqlx::query_as("SELECT token_id, digest, admin, label FROM pepsi.api_token")
            .fetch_all(&f.db.pool)
            .await
            .unwrap();
    assert_eq!(rows, vec![(id.to_owned(), sha256(secret), "root".into(), "ci".into())]);
    let dump: String = sqlx::query_scalar("SELECT string_agg(t::text, ' ') FROM pepsi.api_token t")
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
    assert!(!dump.contains(secret), "the secret is stored: {dump}");
    let bearer = Auth::Bearer(token.clone());
    let me = f.httpd.get("/api/session", &bearer).await;
    assert_eq!(me.json["via"], "token");
    let a = f.httpd.call(Method::PUT, "/api/domains/example.org", &bearer, None).await;
    assert_eq!(a.status, 201, "no CSRF token needed: {a:?}");
    for bad in [
        format!("pepsi_{id}_{}", "0".repeat(64)),
        "pepsi_short".to_owned(),
        token.to_uppercase(),
    ] {
        assert_eq!(f.httpd.get("/api/queue", &Auth::Bearer(bad.clone())).await.status, 401, "{bad}");
    }
    let a = f.httpd.get("/api/queue", &Auth::RawCookie(String::new())).await;
    assert_eq!(a.status, 401);
    sqlx::query("UPDATE pepsi.api_token SET expires_at = now() - interval '1 second'")
        .execute(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(f.httpd.get("/api/queue", &bearer).await.status, 401, "expired");
    let (code, _, err) = f.httpd.cli(&["token-add", "nobody"]);
    assert_eq!(code, 1);
    assert!(err.contains("there is no administrator nobody"), "{err}");
    let (code, _, err) = f.httpd.cli(&["admin-add", "Bad Name"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = f.httpd.cli(&["admin-add", "root"]);
    assert_eq!(code, 1);
    assert!(err.contains("administrator root exists already"), "{err}");
    let (code, out, _) = f.httpd.cli(&["admin-add", "second", "--if-none"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing created"), "{out}");
}

#[tokio::test]
async fn failed_logins_are_throttled_per_account_and_per_address() {
    let f = fixture("[pepsi-httpd]\nLOGIN_MAX_FAILURES_PER_ACCOUNT = 2\nLOGIN_MAX_FAILURES_PER_ADDRESS = 4\n").await;
    let password = f.httpd.admin_add("ops");
    let login = |name: &'static str, pw: String| {
        let h = &f.httpd;
        async move { h.post("/api/login", &Auth::None, &json!({"name": name, "password": pw})).await }
    };
    assert_eq!(login("ops", "wrong".into()).await.status, 401);
    assert_eq!(login("ops", "wrong".into()).await.status, 401);
    let a = login("ops", password.clone()).await;
    assert_eq!(a.status, 429, "even the right password waits: {a:?}");
    assert!(a.headers.contains_key("retry-after"));
    assert!(a.json["error"].as_str().unwrap().contains("too many failed logins"));
    // Another account from the same address still logs in, until the address's limit.
    assert_eq!(login("ghost", "x".into()).await.status, 401);
    assert_eq!(login("ghost2", "x".into()).await.status, 401);
    assert_eq!(login("ghost3", "x".into()).await.status, 429, "the address reached 4");
}

// ----- errors of every kind are JSON ------------------------------------------------------

#[tokio::test]
async fn errors_are_json_with_the_right_status() {
    let f = fixture("[pepsi-httpd]\nMAX_BODY_SIZE = 2k\n").await;
    let a = f.httpd.get("/api/nothing", &f.auth()).await;
    assert_eq!((a.status, a.json["error"].is_string()), (404, true), "{a:?}");
    let a = f.httpd.call(Method::DELETE, "/api/queue", &f.auth(), None).await;
    assert_eq!((a.status, a.json["error"].is_string()), (405, true), "{a:?}");
    let big = json!({"address": "a@example.test", "password": "x".repeat(4000)});
    let a = f.httpd.post("/api/accounts", &f.auth(), &big).await;
    assert_eq!(a.status, 413, "{a:?}");
    assert!(a.json["error"].as_str().unwrap().contains("MAX_BODY_SIZE"));
    let a = f.httpd.post("/api/accounts", &f.auth(), &json!({"address": "a@example.test", "colour": 1})).await;
    assert_eq!(a.status, 400);
    assert!(a.json["error"].as_str().unwrap().contains("unknown field `colour`"), "{a:?}");
    let a = f.httpd.post("/api/accounts", &f.auth(), &json!({"password": "12345678"})).await;
    assert!(a.json["error"].as_str().unwrap().contains("missing field `address`"), "{a:?}");
    let r = reqwest::Client::new()
        .post(f.httpd.url("/api/accounts"))
        .header("Cookie", format!("pepsi_session={}", f.session.cookie))
        .header("X-CSRF-Token", &f.session.csrf)
        .header("Content-Type", "text/plain")
        .body("address=a@example.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let a = f.httpd.get("/api/queue?status=lost", &f.auth()).await;
    assert_eq!(a.status, 400);
    assert!(a.json["error"].as_str().unwrap().starts_with("status: \"lost\""), "{a:?}");
    let a = f.httpd.get("/api/queue?limit=1&limit=2", &f.auth()).await;
    assert_eq!(a.status, 400);
    assert!(a.json["error"].as_str().unwrap().contains("\"limit\" is given more than once"));
}
