//! pepsi-httpd as a process against a real PostgreSQL, over HTTP with reqwest: logins,
//! sessions (rows that survive a restart, idle and absolute expiry, forged cookies), CSRF,
//! API tokens stored as digests only, login throttling, TLS, privilege dropping, every API
//! route with its errors, a bulk retry by filter, /metrics read by Prometheus's own parser,
//! and a message through the whole system whose mail log row the API finds.

use pepsi_testkit::TestDb;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::support;
use crate::support::free_port;
use crate::support::httpd::{Auth, Httpd, prometheus_parse, sample, write_config};

/// The stage graph the queue tests act on: init has no BOUNCE_STAGE, relay bounces to bounce.
const STAGES: &str = "[pepsi]\nLOCAL_DOMAINS = example.test\n\n\
                      [stage-init]\nPROGRAM = x\nNEXT_STAGE = relay\n\
                      [stage-relay]\nPROGRAM = x\nBOUNCE_STAGE = bounce\n\
                      [stage-bounce]\nPROGRAM = x\n";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    session: support::httpd::Session,
}

/// A database, pepsi-httpd on it with `extra` configuration, administrator `root` logged in.
async fn fixture(extra: &str) -> Fixture {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), &db.url, port, &format!("{extra}\n{STAGES}"));
    let (httpd, _, session) = support::httpd::started_as_root(config, port).await;
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
    async fn add(
        &self,
        stage: &str,
        status: &str,
        from: &str,
        rcpt: &[&str],
        age_secs: f64,
    ) -> i64 {
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
        sqlx::query_as(
            "SELECT action, actor, workqueue_id, detail FROM pepsi.event_log ORDER BY event_id",
        )
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
        assert!(
            a.json["error"]
                .as_str()
                .unwrap()
                .contains("authentication required")
                || path == "/metrics",
            "{method} {path}: {a:?}"
        );
    }
    assert_eq!(
        f.httpd.get("/healthz", &Auth::None).await.json["status"],
        "ok"
    );
}

#[tokio::test]
async fn our_mta_sts_policy_is_served_without_a_credential_as_configured() {
    let f = fixture("MTA_STS_MODE = enforce\nMTA_STS_MX = mx1.example.test, *.mx.example.test\nMTA_STS_MAX_AGE = 2d\n").await;
    let a = f.httpd.get("/.well-known/mta-sts.txt", &Auth::None).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain"),
        "{a:?}"
    );
    // What a sender reads back (RFC 8461 §3.2), by the parser the relay stage uses.
    let policy = pepsi_smtp::sts::Policy::parse(a.text.as_bytes()).unwrap();
    assert_eq!(policy.mode, pepsi_smtp::sts::Mode::Enforce);
    assert_eq!(policy.max_age, 2 * 86400);
    assert!(policy.allows("mx1.example.test") && policy.allows("b.mx.example.test"));
    assert!(!policy.allows("mx2.example.test"));

    let none = fixture("").await;
    let a = none
        .httpd
        .get("/.well-known/mta-sts.txt", &Auth::None)
        .await;
    assert_eq!(a.status, 404, "{a:?}");
    assert!(a.text.contains("MTA_STS_MODE"), "{a:?}");
}

/// TLS reports POSTed to /tlsrpt (RFC 8460 §5.4), through the real pepsi-httpd connected as
/// its own role: kept once, refused when they are not RFC 8460's or not labelled as a
/// report, bounded per day, and counted on /metrics.
#[tokio::test]
async fn tls_reports_posted_to_tlsrpt_are_kept_once_checked_bounded_and_counted_on_metrics() {
    use pepsi_tlsrpt::report::{Counted, Submitter, build, gzip};
    let r = support::httpd::AsRole::new(
        "TLSRPT_UPLOAD = yes\nTLSRPT_MAX_PER_DAY = 2\nMETRICS_PUBLIC = yes\nMETRICS_CACHE = 0s\n",
    )
    .await;
    let (httpd, _session) = r.start().await;
    let report = |org: &str| {
        build(
            &Submitter {
                organization: org.into(),
                contact: "tls@sender.example".into(),
                hostname: "sender.example".into(),
            },
            "example.test",
            chrono::Utc::now().date_naive(),
            &[
                Counted {
                    policy_type: "sts".into(),
                    policy_string: vec!["version: STSv1".into(), "mode: enforce".into()],
                    mx_host: "mx.example.test".into(),
                    receiving_ip: "192.0.2.7".into(),
                    result_type: "certificate-expired".into(),
                    sessions: 4,
                    detail: "Expired".into(),
                },
                Counted {
                    policy_type: "sts".into(),
                    policy_string: vec!["version: STSv1".into(), "mode: enforce".into()],
                    mx_host: "mx.example.test".into(),
                    receiving_ip: "192.0.2.7".into(),
                    result_type: "success".into(),
                    sessions: 96,
                    detail: String::new(),
                },
            ],
        )
    };
    let client = reqwest::Client::new();
    let post = |kind: &'static str, body: Vec<u8>| {
        client
            .post(httpd.url("/tlsrpt"))
            .header("content-type", kind)
            .body(body)
            .send()
    };
    let gz = gzip(&report("Big Sender"));
    let a = post("application/tlsrpt+gzip", gz.clone()).await.unwrap();
    assert_eq!(a.status(), 201);
    let json: serde_json::Value = serde_json::from_str(&a.text().await.unwrap()).unwrap();
    assert_eq!(json["new"], true);
    let a = post("application/tlsrpt+gzip", gz).await.unwrap();
    assert_eq!(a.status(), 200, "the same report again is kept once");

    let a = post("text/plain", b"{}".to_vec()).await.unwrap();
    assert_eq!(a.status(), 415);
    assert!(a.text().await.unwrap().contains("application/tlsrpt+gzip"));
    let mut bad = serde_json::to_value(report("Bad Sender")).unwrap();
    bad["policies"][0]["failure-details"][0]["result-type"] = "made-up".into();
    let a = post("application/tlsrpt+json", bad.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(a.status(), 400);
    let text = a.text().await.unwrap();
    assert!(
        text.contains("\"error\"") && text.contains("made-up"),
        "{text}"
    );

    let a = post(
        "application/tlsrpt+json",
        serde_json::to_vec(&report("Second Sender")).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(a.status(), 201);
    let a = post("application/tlsrpt+gzip", gzip(&report("Third Sender")))
        .await
        .unwrap();
    assert_eq!(a.status(), 429, "TLSRPT_MAX_PER_DAY = 2");

    let kept: Vec<(String, String)> = sqlx::query_as(
        "SELECT organization, source FROM pepsi.tls_report_received ORDER BY received_id",
    )
    .fetch_all(&r.db.pool)
    .await
    .unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(kept[0].0, "Big Sender");
    assert!(kept[0].1.starts_with("https from 127.0.0.1"), "{kept:?}");

    let m = httpd.get("/metrics", &Auth::None).await;
    assert_eq!(m.status, 200);
    for line in [
        "pepsi_tls_report_sessions_last_week{result=\"certificate-expired\"} 8",
        "pepsi_tls_report_sessions_last_week{result=\"success\"} 192",
    ] {
        assert!(
            m.text.lines().any(|l| l == line),
            "{line} missing: {}",
            m.text
        );
    }

    // Without TLSRPT_UPLOAD the route takes nothing.
    let none = fixture("").await;
    let a = none
        .httpd
        .call(Method::POST, "/tlsrpt", &Auth::None, None)
        .await;
    assert_eq!(a.status, 404, "{a:?}");
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
    let dump: String =
        sqlx::query_scalar("SELECT string_agg(s::text, ' ') FROM pepsi.admin_session s")
            .fetch_one(&f.db.pool)
            .await
            .unwrap();
    assert!(
        !dump.contains(&f.session.cookie),
        "the cookie itself is stored: {dump}"
    );
    // A mutating call with the cookie but without the CSRF token: 403, nothing done.
    let domain = f
        .httpd
        .call(
            Method::PUT,
            "/api/domains/example.org",
            &Auth::CookieOnly(f.session.clone()),
            None,
        )
        .await;
    assert_eq!(domain.status, 403, "{domain:?}");
    assert!(
        domain.json["error"]
            .as_str()
            .unwrap()
            .contains("X-CSRF-Token")
    );
    let wrong = support::httpd::Session {
        cookie: f.session.cookie.clone(),
        csrf: "0".repeat(64),
    };
    let a = f
        .httpd
        .call(
            Method::PUT,
            "/api/domains/example.org",
            &Auth::Session(wrong),
            None,
        )
        .await;
    assert_eq!(a.status, 403);
    let a = f
        .httpd
        .call(Method::PUT, "/api/domains/example.org", &f.auth(), None)
        .await;
    assert_eq!(a.status, 201, "{a:?}");
    // The wrong password: 401 and an audit row; a login row for the right one.
    let bad = f
        .httpd
        .post(
            "/api/login",
            &Auth::None,
            &json!({"name": "root", "password": "nope"}),
        )
        .await;
    assert_eq!(bad.status, 401);
    assert_eq!(bad.json["error"], "wrong name or password");
    let unknown = f
        .httpd
        .post(
            "/api/login",
            &Auth::None,
            &json!({"name": "nobody", "password": "x"}),
        )
        .await;
    assert_eq!(unknown.status, 401);
    assert_eq!(
        unknown.json, bad.json,
        "an unknown name looks like a wrong password"
    );
    let events = f.events().await;
    let actions: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        actions,
        [
            "admin.create",
            "admin.login",
            "settings.set",
            "admin.login_failed",
            "admin.login_failed"
        ]
    );
    assert_eq!(events[1].1, "root");
    assert_eq!(events[1].3["tool"], "pepsi-httpd");
    // Logout ends the session; the cookie no longer works and its row is gone.
    let out = f
        .httpd
        .call(Method::POST, "/api/logout", &f.auth(), None)
        .await;
    assert_eq!(out.status, 204, "{out:?}");
    assert!(
        out.headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
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
    let forged = support::httpd::Session {
        cookie: "ab".repeat(32),
        csrf: String::new(),
    };
    let a = f.httpd.get("/api/queue", &Auth::Session(forged)).await;
    assert_eq!(a.status, 401);
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("expired or is unknown"),
        "{a:?}"
    );
    let a = f
        .httpd
        .get(
            "/api/queue",
            &Auth::RawCookie("pepsi_session=not-a-secret".into()),
        )
        .await;
    assert_eq!(a.status, 401);
    assert!(
        a.json["error"].as_str().unwrap().contains("malformed"),
        "{a:?}"
    );
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
    assert_eq!(
        f.httpd.get("/api/queue", &f.auth()).await.status,
        200,
        "the same row, live again"
    );
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
    let a = f
        .httpd
        .call(Method::PUT, "/api/domains/example.org", &f.auth(), None)
        .await;
    assert_eq!(a.status, 201, "the CSRF token is still good: {a:?}");
}

#[tokio::test]
async fn a_revoked_token_is_refused_and_token_list_shows_no_secret() {
    let f = fixture("").await;
    let token = f.httpd.token_add("root", &["--label", "backup script"]);
    let id = token
        .strip_prefix("pepsi_")
        .and_then(|t| t.split_once('_'))
        .map(|(id, _)| id.to_owned())
        .expect("pepsi_<id>_<secret>");
    let bearer = Auth::Bearer(token.clone());
    assert_eq!(f.httpd.get("/api/session", &bearer).await.status, 200);
    let (code, out, err) = f.httpd.cli(&["token-list", "--json"]);
    assert_eq!(code, 0, "{out} {err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["tokens"][0]["token_id"], id.as_str());
    assert_eq!(listed["tokens"][0]["label"], "backup script");
    assert!(listed["tokens"][0]["last_used_at"].is_string(), "{listed}");
    assert!(
        !out.contains(token.rsplit('_').next().unwrap()),
        "a secret is listed"
    );
    let (code, table, _) = f.httpd.cli(&["token-list"]);
    assert_eq!(code, 0);
    assert!(table.starts_with("ID") && table.contains(&id), "{table}");

    // Revoked by the whole token (or its id): refused from the next request on.
    let (code, out, err) = f.httpd.cli(&["token-revoke", &token]);
    assert_eq!(
        (code, out.trim()),
        (0, format!("API token {id} revoked").as_str()),
        "{err}"
    );
    assert_eq!(f.httpd.get("/api/session", &bearer).await.status, 401);
    let (code, _, err) = f.httpd.cli(&["token-revoke", &id]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("there is no API token {id}")),
        "{err}"
    );
    let (code, _, err) = f.httpd.cli(&["token-revoke", "xyz"]);
    assert_eq!(code, 2);
    assert!(err.contains("is not a token id"), "{err}");
    let revoked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.event_log WHERE action = 'token.revoke'")
            .fetch_one(&f.db.pool)
            .await
            .unwrap();
    assert_eq!(revoked, 1);
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
    assert_eq!(
        rows,
        vec![(id.to_owned(), sha256(secret), "root".into(), "ci".into())]
    );
    let dump: String = sqlx::query_scalar("SELECT string_agg(t::text, ' ') FROM pepsi.api_token t")
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
    assert!(!dump.contains(secret), "the secret is stored: {dump}");
    let bearer = Auth::Bearer(token.clone());
    let me = f.httpd.get("/api/session", &bearer).await;
    assert_eq!(me.json["via"], "token");
    let a = f
        .httpd
        .call(Method::PUT, "/api/domains/example.org", &bearer, None)
        .await;
    assert_eq!(a.status, 201, "no CSRF token needed: {a:?}");
    for bad in [
        format!("pepsi_{id}_{}", "0".repeat(64)),
        "pepsi_short".to_owned(),
        token.to_uppercase(),
    ] {
        assert_eq!(
            f.httpd
                .get("/api/queue", &Auth::Bearer(bad.clone()))
                .await
                .status,
            401,
            "{bad}"
        );
    }
    let a = f
        .httpd
        .get("/api/queue", &Auth::RawCookie(String::new()))
        .await;
    assert_eq!(a.status, 401);
    sqlx::query("UPDATE pepsi.api_token SET expires_at = now() - interval '1 second'")
        .execute(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(
        f.httpd.get("/api/queue", &bearer).await.status,
        401,
        "expired"
    );
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
    let f = fixture(
        "[pepsi-httpd]\nLOGIN_MAX_FAILURES_PER_ACCOUNT = 2\nLOGIN_MAX_FAILURES_PER_ADDRESS = 4\n",
    )
    .await;
    let password = f.httpd.admin_add("ops");
    let login = |name: &'static str, pw: String| {
        let h = &f.httpd;
        async move {
            h.post(
                "/api/login",
                &Auth::None,
                &json!({"name": name, "password": pw}),
            )
            .await
        }
    };
    assert_eq!(login("ops", "wrong".into()).await.status, 401);
    assert_eq!(login("ops", "wrong".into()).await.status, 401);
    let a = login("ops", password.clone()).await;
    assert_eq!(a.status, 429, "even the right password waits: {a:?}");
    assert!(a.headers.contains_key("retry-after"));
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("too many failed logins")
    );
    // Another account from the same address still logs in, until the address's limit.
    assert_eq!(login("ghost", "x".into()).await.status, 401);
    assert_eq!(login("ghost2", "x".into()).await.status, 401);
    assert_eq!(
        login("ghost3", "x".into()).await.status,
        429,
        "the address reached 4"
    );
}

/// `n` logins posted at once, each on a connection of its own: their statuses, in order.
async fn logins_at_once(httpd: &Httpd, bodies: Vec<Value>) -> Vec<u16> {
    let mut set = tokio::task::JoinSet::new();
    let url = httpd.url("/api/login");
    for (i, body) in bodies.into_iter().enumerate() {
        // A client each: no connection is shared, so every login is in flight at once.
        let client = support::httpd::client();
        let url = url.clone();
        set.spawn(async move {
            let r = client
                .post(url)
                .header("Content-Type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            if matches!(status, 429 | 503) {
                assert!(
                    r.headers().contains_key("retry-after"),
                    "{status} says when to come back"
                );
            }
            let text = r.text().await.unwrap();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            assert!(
                v["error"].is_string(),
                "every refusal is the documented JSON error: {status} {text}"
            );
            (i, status)
        });
    }
    let mut out = vec![0; set.len()];
    while let Some(r) = set.join_next().await {
        let (i, status) = r.unwrap();
        out[i] = status;
    }
    out
}

/// Security review #7 (login throttle race): wrong-password logins sent at once for one
/// account are counted before their passwords are checked, so no more of them are verified
/// than LOGIN_MAX_FAILURES_PER_ACCOUNT; the rest are 429 without hashing, and the right
/// password is refused while the account is locked.
#[tokio::test]
async fn login_throttle_race_verifies_no_more_concurrent_logins_than_the_limit() {
    let f = fixture(
        "[pepsi-httpd]\nLOGIN_MAX_FAILURES_PER_ACCOUNT = 3\nLOGIN_MAX_FAILURES_PER_ADDRESS = 1000\n\
         LOGIN_QUEUE_TIMEOUT = 20s\nMAX_CONNECTIONS_PER_CLIENT = 64\n",
    )
    .await;
    let password = f.httpd.admin_add("ops");
    let bodies = (0..24)
        .map(|i| json!({"name": "ops", "password": format!("wrong {i}")}))
        .collect();
    let statuses = logins_at_once(&f.httpd, bodies).await;
    let verified = statuses.iter().filter(|&&s| s == 401).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(
        (verified, refused),
        (3, 21),
        "3 checked (401), the rest refused unchecked (429): {statuses:?}"
    );
    let failures: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.event_log \
         WHERE action = 'admin.login_failed' AND detail->>'name' = 'ops'",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(failures, 3, "one admin.login_failed row per verified guess");
    let a = f
        .httpd
        .post(
            "/api/login",
            &Auth::None,
            &json!({"name": "ops", "password": password}),
        )
        .await;
    assert_eq!(
        a.status, 429,
        "the right password waits while locked: {a:?}"
    );
}

/// Security review #7 (unbounded Argon2id): at most LOGIN_CONCURRENCY password checks run
/// at once; a login that finds no turn within LOGIN_QUEUE_TIMEOUT is answered 503 with
/// Retry-After and the JSON error, unchecked and uncounted, and logins go on afterwards.
#[tokio::test]
async fn unbounded_argon2id_work_waits_for_login_concurrency_or_gets_503() {
    let f = fixture(
        "[pepsi-httpd]\nLOGIN_CONCURRENCY = 1\nLOGIN_QUEUE_TIMEOUT = 0s\n\
         LOGIN_MAX_FAILURES_PER_ADDRESS = 1000\nMAX_CONNECTIONS_PER_CLIENT = 64\n",
    )
    .await;
    let before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.event_log WHERE action = 'admin.login_failed'",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    // Unknown names: each costs the dummy Argon2id check.
    let bodies = (0..16)
        .map(|i| json!({"name": format!("nobody{i}"), "password": "x"}))
        .collect();
    let statuses = logins_at_once(&f.httpd, bodies).await;
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    let busy = statuses.iter().filter(|&&s| s == 503).count();
    assert_eq!(checked + busy, 16, "only 401 or 503: {statuses:?}");
    assert!(
        checked >= 1,
        "one turn at a time is still served: {statuses:?}"
    );
    assert!(
        busy >= 1,
        "the others found the one turn taken: {statuses:?}"
    );
    let after: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.event_log WHERE action = 'admin.login_failed'",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (after - before) as usize,
        checked,
        "a 503 was not checked, so it logged no failure"
    );
    let a = f
        .httpd
        .post(
            "/api/login",
            &Auth::None,
            &json!({"name": "nobody", "password": "x"}),
        )
        .await;
    assert_eq!(a.status, 401, "alone, a login gets its turn: {a:?}");
}

/// A connection to pepsi-httpd on `port` from the loopback address `source` (127.0.0.2...:
/// another client, as the server sees it).
async fn connect_from(source: &str, port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap()
}

/// Sends `request` on `stream` (nothing when empty) and reads the answer until the server
/// closes, for at most 5 s: what came.
async fn exchange(stream: &mut tokio::net::TcpStream, request: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if !request.is_empty() {
        stream.write_all(request.as_bytes()).await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut out),
    )
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: pepsi\r\nConnection: close\r\n\r\n";

/// Security review #13 (connection slots): one client address holds at most
/// MAX_CONNECTIONS_PER_CLIENT connections, the next is answered 503 with the JSON error at
/// once, and other clients are served meanwhile; a closed connection frees its place.
#[tokio::test]
async fn connection_slots_one_client_holds_at_most_max_connections_per_client() {
    let f = fixture(
        "[pepsi-httpd]\nMAX_CONNECTIONS = 6\nMAX_CONNECTIONS_PER_CLIENT = 3\nHEADER_TIMEOUT = 30s\n",
    )
    .await;
    let port = f.httpd.port;
    // Three connections that send nothing, as a slow client holds them.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.2", port).await);
    }
    let mut fourth = connect_from("127.0.0.2", port).await;
    let answer = exchange(&mut fourth, HEALTHZ).await;
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "the fourth connection of one client is refused at once: {answer:?}"
    );
    assert!(
        answer.contains("\"error\"") && answer.contains("MAX_CONNECTIONS_PER_CLIENT = 3"),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    // Another client is served while the first holds its three.
    let mut other = connect_from("127.0.0.3", port).await;
    let answer = exchange(&mut other, HEALTHZ).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // One closed: the client may open one again.
    drop(held.pop());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut again = connect_from("127.0.0.2", port).await;
        let answer = exchange(&mut again, HEALTHZ).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "a freed place is not given again: {answer:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    drop(held);
}

/// `POST /api/login` as `name` / `password` on `client` (from its own source address), with
/// `X-Forwarded-For: forwarded` when given: the status.
async fn login_via(
    client: &reqwest::Client,
    httpd: &Httpd,
    forwarded: Option<&str>,
    name: &str,
    password: &str,
) -> u16 {
    let mut req = client
        .post(httpd.url("/api/login"))
        .header("Content-Type", "application/json")
        .body(json!({"name": name, "password": password}).to_string());
    if let Some(f) = forwarded {
        req = req.header("X-Forwarded-For", f);
    }
    req.send().await.unwrap().status().as_u16()
}

/// Security review #13 (reverse proxy): behind a TRUSTED_PROXIES proxy the login throttle
/// keys on the client the proxy forwards (the last X-Forwarded-For hop), so one client's
/// failures do not lock every login out, a hop the client wrote itself changes nothing,
/// and a peer that is not a trusted proxy is keyed by its own address whatever it sends.
#[tokio::test]
async fn reverse_proxy_logins_are_throttled_per_forwarded_client() {
    let f =
        fixture("[pepsi-httpd]\nTRUSTED_PROXIES = 127.0.0.1\nLOGIN_MAX_FAILURES_PER_ADDRESS = 3\n")
            .await;
    let password = f.httpd.admin_add("ops");
    let proxy = support::httpd::client();
    let attacker = Some("203.0.113.7");
    for i in 0..3 {
        let s = login_via(&proxy, &f.httpd, attacker, &format!("ghost{i}"), "x").await;
        assert_eq!(s, 401, "failure {i}");
    }
    assert_eq!(
        login_via(&proxy, &f.httpd, attacker, "ghost9", "x").await,
        429,
        "the forwarded client reached its limit"
    );
    assert_eq!(
        login_via(
            &proxy,
            &f.httpd,
            Some("198.51.100.9, 203.0.113.7"),
            "ghost9",
            "x"
        )
        .await,
        429,
        "a hop the client put before the proxy's is not read"
    );
    assert_eq!(
        login_via(&proxy, &f.httpd, Some("198.51.100.9"), "ops", &password).await,
        200,
        "another client behind the same proxy still logs in"
    );
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'client_addr' FROM pepsi.event_log \
         WHERE action IN ('admin.login_failed', 'admin.login') ORDER BY event_id",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(
        logged[logged.len() - 4..],
        ["203.0.113.7", "203.0.113.7", "203.0.113.7", "198.51.100.9"],
        "the event log names the forwarded client: {logged:?}"
    );
    // Not a trusted proxy: its X-Forwarded-For is ignored.
    let direct = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    for i in 0..3 {
        let s = login_via(
            &direct,
            &f.httpd,
            Some(&format!("192.0.2.{i}")),
            "ghost",
            "x",
        )
        .await;
        assert_eq!(s, 401, "failure {i} from 127.0.0.2");
    }
    assert_eq!(
        login_via(&direct, &f.httpd, Some("192.0.2.200"), "ghost", "x").await,
        429,
        "counted under 127.0.0.2, whatever it forwards"
    );
}

/// Security review #13 (account lockout): failed logins lock an administrator name out only
/// for the client network they came from (IPv4 /24, IPv6 /48), so an anonymous client cannot
/// keep an administrator out everywhere; its own network stays locked, right password or not.
#[tokio::test]
async fn account_lockout_holds_only_for_the_client_network_it_came_from() {
    let f = fixture("[pepsi-httpd]\nLOGIN_MAX_FAILURES_PER_ACCOUNT = 2\n").await;
    let password = f.httpd.admin_add("ops");
    let from = |source: &str| {
        reqwest::Client::builder()
            .local_address(source.parse::<std::net::IpAddr>().unwrap())
            .build()
            .unwrap()
    };
    let (attacker, neighbour, elsewhere) =
        (from("127.0.0.2"), from("127.0.0.3"), from("127.1.0.1"));
    assert_eq!(
        login_via(&attacker, &f.httpd, None, "ops", "wrong").await,
        401
    );
    assert_eq!(
        login_via(&attacker, &f.httpd, None, "ops", "wrong").await,
        401
    );
    assert_eq!(
        login_via(&attacker, &f.httpd, None, "ops", &password).await,
        429,
        "locked for the network the failures came from"
    );
    assert_eq!(
        login_via(&neighbour, &f.httpd, None, "ops", &password).await,
        429,
        "the same /24"
    );
    assert_eq!(
        login_via(&elsewhere, &f.httpd, None, "ops", &password).await,
        200,
        "another network logs in"
    );
}

// ----- errors of every kind are JSON ------------------------------------------------------

#[tokio::test]
async fn errors_are_json_with_the_right_status() {
    let f = fixture("[pepsi-httpd]\nMAX_BODY_SIZE = 2k\n").await;
    let a = f.httpd.get("/api/nothing", &f.auth()).await;
    assert_eq!(
        (a.status, a.json["error"].is_string()),
        (404, true),
        "{a:?}"
    );
    let a = f
        .httpd
        .call(Method::DELETE, "/api/queue", &f.auth(), None)
        .await;
    assert_eq!(
        (a.status, a.json["error"].is_string()),
        (405, true),
        "{a:?}"
    );
    let big = json!({"address": "a@example.test", "password": "x".repeat(4000)});
    let a = f.httpd.post("/api/accounts", &f.auth(), &big).await;
    assert_eq!(a.status, 413, "{a:?}");
    assert!(a.json["error"].as_str().unwrap().contains("MAX_BODY_SIZE"));
    let a = f
        .httpd
        .post(
            "/api/accounts",
            &f.auth(),
            &json!({"address": "a@example.test", "colour": 1}),
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `colour`"),
        "{a:?}"
    );
    let a = f
        .httpd
        .post("/api/accounts", &f.auth(), &json!({"password": "12345678"}))
        .await;
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("missing field `address`"),
        "{a:?}"
    );
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
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .starts_with("status: \"lost\""),
        "{a:?}"
    );
    let a = f.httpd.get("/api/queue?limit=1&limit=2", &f.auth()).await;
    assert_eq!(a.status, 400);
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("\"limit\" is given more than once")
    );
}

// ----- the queue --------------------------------------------------------------------------

#[tokio::test]
async fn queue_listing_filters_show_and_their_errors() {
    let f = fixture("").await;
    let a = f
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["x@example.org", "y@Other.NET"],
            7200.0,
        )
        .await;
    let b = f
        .add(
            "relay",
            "paused",
            "b@example.test",
            &["z@example.org"],
            60.0,
        )
        .await;
    let c = f
        .add(
            "init",
            "pending",
            "c@elsewhere.test",
            &["q@example.test"],
            10.0,
        )
        .await;
    let ids = |doc: &Value| -> Vec<i64> {
        doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect()
    };
    let cases: [(&str, Vec<i64>); 8] = [
        ("", vec![a, b, c]),
        ("?stage=relay", vec![a, b]),
        ("?status=failed", vec![a]),
        ("?sender=ELSEWHERE", vec![c]),
        ("?recipient=@example.org", vec![a, b]),
        ("?domain=other.net", vec![a]),
        ("?min_age=1h", vec![a]),
        ("?stage=relay&limit=1", vec![a]),
    ];
    for (q, want) in cases {
        let r = f.httpd.get(&format!("/api/queue{q}"), &f.auth()).await;
        assert_eq!(r.status, 200, "{q}: {r:?}");
        assert_eq!(ids(&r.json), want, "{q}");
    }
    let r = f
        .httpd
        .get("/api/queue?stage=relay&limit=1", &f.auth())
        .await;
    assert_eq!(r.json["summary"]["total"], 2);
    assert_eq!(r.json["summary"]["stages"]["relay"]["paused"], 1);
    assert_eq!(r.json["truncated"], true);
    for (q, field) in [
        ("?domain=x", "domain"),
        ("?min_age=soon", "min_age"),
        ("?limit=0", "limit"),
        ("?stage=a%20b", "stage"),
        ("?size=3", "unknown parameter \"size\""),
    ] {
        let r = f.httpd.get(&format!("/api/queue{q}"), &f.auth()).await;
        assert_eq!(r.status, 400, "{q}");
        assert!(
            r.json["error"].as_str().unwrap().contains(field),
            "{q}: {r:?}"
        );
    }
    let show = f
        .httpd
        .get(&format!("/api/queue/{a}?body=yes"), &f.auth())
        .await;
    assert_eq!(show.status, 200);
    assert_eq!(show.json["id"], a);
    assert_eq!(show.json["headers"], "Subject: hello\r\n");
    assert_eq!(show.json["body"], "body\r\n");
    assert_eq!(
        show.json["rcpt_to"],
        json!(["x@example.org", "y@Other.NET"])
    );
    assert_eq!(
        f.httpd.get("/api/queue/999999", &f.auth()).await.status,
        404
    );
    let r = f.httpd.get("/api/queue/abc", &f.auth()).await;
    assert_eq!(r.status, 400);
    assert!(r.json["error"].as_str().unwrap().starts_with("id:"));
    assert_eq!(
        f.httpd
            .get(&format!("/api/queue/{a}?body=maybe"), &f.auth())
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn each_queue_action_acts_like_pepsi_queue_and_writes_its_event() {
    let f = fixture("").await;
    let failed = f
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["x@example.org"],
            60.0,
        )
        .await;
    let running = f
        .add(
            "relay",
            "running",
            "a@example.test",
            &["x@example.org"],
            60.0,
        )
        .await;
    let held = f
        .add(
            "relay",
            "pending",
            "a@example.test",
            &["x@example.org"],
            60.0,
        )
        .await;
    let to_bounce = f
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["x@example.org"],
            60.0,
        )
        .await;
    let null_sender = f.add("relay", "failed", "", &["x@example.org"], 60.0).await;
    let at_init = f
        .add("init", "failed", "a@example.test", &["x@example.org"], 60.0)
        .await;
    let act = |id: i64, action: &str, body: Value| {
        let h = &f.httpd;
        let auth = f.auth();
        let path = format!("/api/queue/{id}/{action}");
        async move { h.post(&path, &auth, &body).await }
    };
    let r = act(failed, "retry", json!({})).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json["action"], "queue.retry");
    assert_eq!(r.json["results"][0]["outcome"], "changed");
    assert_eq!(r.json["results"][0]["detail"]["from_status"], "failed");
    assert_eq!(
        f.status_of(failed).await,
        Some(("relay".into(), "pending".into()))
    );
    let again = act(failed, "retry", json!({})).await;
    assert_eq!(
        again.json["results"][0]["outcome"], "unchanged",
        "{again:?}"
    );
    let r = act(running, "hold", json!({})).await;
    assert_eq!(r.status, 409, "a running row is refused: {r:?}");
    assert_eq!(r.json["results"][0]["outcome"], "running");
    assert!(r.json["error"].as_str().unwrap().contains("is running"));
    let r = act(running, "hold", json!({"force": true, "reason": "abuse"})).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = act(held, "hold", json!({"reason": "look first"})).await;
    assert_eq!(r.json["results"][0]["detail"]["reason"], "look first");
    let listed = f.httpd.get("/api/queue?status=held", &f.auth()).await;
    assert_eq!(listed.json["rows"].as_array().unwrap().len(), 2);
    let r = act(held, "retry", json!({})).await;
    assert_eq!(r.status, 409, "a held row is released, not retried: {r:?}");
    let r = act(held, "release", json!({})).await;
    assert_eq!(r.json["results"][0]["detail"]["to_status"], "pending");
    let r = act(to_bounce, "bounce", json!({"reason": "mailbox retired"})).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        f.status_of(to_bounce).await,
        Some(("bounce".into(), "pending".into()))
    );
    let r = act(null_sender, "bounce", json!({})).await;
    assert_eq!(r.status, 409);
    assert!(
        r.json["error"].as_str().unwrap().contains("null sender"),
        "{r:?}"
    );
    let r = act(at_init, "bounce", json!({})).await;
    assert_eq!(r.status, 409);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("has no BOUNCE_STAGE"),
        "{r:?}"
    );
    let r = act(null_sender, "delete", json!({})).await;
    assert_eq!(r.status, 200);
    assert_eq!(f.status_of(null_sender).await, None);
    assert_eq!(act(null_sender, "delete", json!({})).await.status, 404);
    let r = act(failed, "explode", json!({})).await;
    assert_eq!(r.status, 404);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("no queue action \"explode\"")
    );
    let r = act(failed, "hold", json!({"reason": "x".repeat(600)})).await;
    assert_eq!(r.status, 400);
    let r = act(failed, "retry", json!({"forcefully": true})).await;
    assert_eq!(r.status, 400);
    // One event per change, by the administrator through pepsi-httpd, as pepsi-queue writes.
    let events: Vec<_> = f
        .events()
        .await
        .into_iter()
        .filter(|e| e.0.starts_with("queue."))
        .collect();
    let got: Vec<(&str, Option<i64>)> = events.iter().map(|e| (e.0.as_str(), e.2)).collect();
    assert_eq!(
        got,
        [
            ("queue.retry", Some(failed)),
            ("queue.hold", Some(running)),
            ("queue.hold", Some(held)),
            ("queue.release", Some(held)),
            ("queue.bounce", Some(to_bounce)),
            ("queue.delete", Some(null_sender)),
        ]
    );
    for e in &events {
        assert_eq!(e.1, "root");
        assert_eq!(e.3["tool"], "pepsi-httpd");
    }
    assert_eq!(events[1].3["force"], true);
}

#[tokio::test]
async fn a_bulk_retry_by_filter_takes_exactly_the_matching_rows() {
    let f = fixture("[pepsi-httpd]\nBULK_LIMIT = 50\n").await;
    let mut mine = Vec::new();
    for i in 0..3 {
        mine.push(
            f.add(
                "relay",
                "failed",
                "a@example.test",
                &[&format!("u{i}@example.org")],
                100.0,
            )
            .await,
        );
    }
    let other_domain = f
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["u@example.net"],
            100.0,
        )
        .await;
    let paused = f
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["v@example.org"],
            100.0,
        )
        .await;
    let body = json!({"filter": {"domain": "example.org", "status": "failed"}});
    let r = f
        .httpd
        .post("/api/queue/bulk/retry", &f.auth(), &body)
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json["matched"], 3);
    assert_eq!(r.json["changed"], 3);
    assert_eq!(r.json["truncated"], false);
    for id in &mine {
        assert_eq!(f.status_of(*id).await.unwrap().1, "pending");
    }
    assert_eq!(f.status_of(other_domain).await.unwrap().1, "failed");
    assert_eq!(f.status_of(paused).await.unwrap().1, "paused");
    let events = f.events().await;
    assert_eq!(events.iter().filter(|e| e.0 == "queue.retry").count(), 3);
    // A bulk hold with a limit takes the oldest rows only, and says so.
    let r = f
        .httpd
        .post(
            "/api/queue/bulk/hold",
            &f.auth(),
            &json!({"filter": {"stage": "relay"}, "limit": 2, "reason": "maintenance"}),
        )
        .await;
    assert_eq!(r.json["selected"], 2);
    assert_eq!(r.json["matched"], 5);
    assert_eq!(r.json["truncated"], true);
    for (body, want) in [
        (json!({"filter": {}}), "at least one condition"),
        (
            json!({"filter": {"colour": "red"}}),
            "filter.unknown parameter \"colour\"",
        ),
        (json!({"filter": {"status": "gone"}}), "filter.status"),
        (
            json!({"filter": {"stage": "relay"}, "limit": 51}),
            "BULK_LIMIT",
        ),
        (json!({"stage": "relay"}), "unknown field `stage`"),
    ] {
        let r = f
            .httpd
            .post("/api/queue/bulk/retry", &f.auth(), &body)
            .await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert!(
            r.json["error"].as_str().unwrap().contains(want),
            "{body}: {r:?}"
        );
    }
}

// ----- accounts, aliases, domains, logs -------------------------------------------------

#[tokio::test]
async fn mailbox_accounts_are_created_listed_given_passwords_and_deleted() {
    let f = fixture("").await;
    let r = f
        .httpd
        .post(
            "/api/accounts",
            &f.auth(),
            &json!({"address": "Alice@Example.TEST", "password": "correct horse"}),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.json["address"], "alice@example.test");
    let hash: String = sqlx::query_scalar(
        "SELECT password_hash FROM pepsi.mailbox_password WHERE address = 'alice@example.test'",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert!(pepsi_admin::password::check_hash(&hash, b"correct horse"));
    let r = f
        .httpd
        .post(
            "/api/accounts",
            &f.auth(),
            &json!({"address": "alice@example.test"}),
        )
        .await;
    assert_eq!(r.status, 409, "{r:?}");
    for (body, want) in [
        (
            json!({"address": "alice"}),
            "address \"alice\" is not an address",
        ),
        (
            json!({"address": "b@example.test", "password": "short"}),
            "password: 8 to 1024 bytes",
        ),
    ] {
        let r = f.httpd.post("/api/accounts", &f.auth(), &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert!(r.json["error"].as_str().unwrap().contains(want), "{r:?}");
    }
    let r = f
        .httpd
        .post(
            "/api/accounts",
            &f.auth(),
            &json!({"address": "bob@example.test", "enabled": false}),
        )
        .await;
    assert_eq!(r.status, 201);
    let list = f.httpd.get("/api/accounts?search=ALI", &f.auth()).await;
    assert_eq!(list.json["accounts"].as_array().unwrap().len(), 1);
    assert_eq!(list.json["accounts"][0]["has_password"], true);
    let all = f.httpd.get("/api/accounts", &f.auth()).await;
    assert_eq!(all.json["accounts"][1]["address"], "bob@example.test");
    assert_eq!(all.json["accounts"][1]["enabled"], false);
    let r = f
        .httpd
        .call(
            Method::PUT,
            "/api/accounts/bob@example.test/password",
            &f.auth(),
            Some(&json!({"password": "another secret"})),
        )
        .await;
    assert_eq!(r.status, 204, "{r:?}");
    let r = f
        .httpd
        .call(
            Method::PUT,
            "/api/accounts/carol@example.test/password",
            &f.auth(),
            Some(&json!({"password": "another secret"})),
        )
        .await;
    assert_eq!(r.status, 404);
    let r = f
        .httpd
        .call(
            Method::DELETE,
            "/api/accounts/alice@example.test",
            &f.auth(),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        f.httpd
            .call(
                Method::DELETE,
                "/api/accounts/alice@example.test",
                &f.auth(),
                None
            )
            .await
            .status,
        404
    );
    let actions: Vec<String> = f
        .events()
        .await
        .into_iter()
        .map(|e| e.0)
        .filter(|a| a.starts_with("account."))
        .collect();
    assert_eq!(
        actions,
        [
            "account.create",
            "account.create",
            "account.password",
            "account.delete"
        ]
    );
    let dump: String =
        sqlx::query_scalar("SELECT string_agg(detail::text, ' ') FROM pepsi.event_log")
            .fetch_one(&f.db.pool)
            .await
            .unwrap();
    assert!(
        !dump.contains("another secret") && !dump.contains("$argon2id$"),
        "{dump}"
    );
}

#[tokio::test]
async fn aliases_catch_alls_and_local_domains_are_settings_rows() {
    let f = fixture("").await;
    let put = |path: &str, body: Option<Value>| {
        let h = &f.httpd;
        let auth = f.auth();
        let path = path.to_owned();
        async move { h.call(Method::PUT, &path, &auth, body.as_ref()).await }
    };
    let r = put(
        "/api/aliases/Sales@example.test",
        Some(json!({"targets": ["dave@example.net", "Erin@Example.test"]})),
    )
    .await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = put(
        "/api/aliases/sales@example.test",
        Some(json!({"targets": ["dave@example.net"]})),
    )
    .await;
    assert_eq!(r.status, 200, "replaced");
    let r = put(
        "/api/aliases/@example.test",
        Some(json!({"targets": ["postmaster@example.test"]})),
    )
    .await;
    assert_eq!((r.status, r.json["kind"].as_str()), (201, Some("catchall")));
    let stored: Vec<(String, String, Value)> =
        sqlx::query_as("SELECT address, name, value FROM pepsi.settings ORDER BY 1")
            .fetch_all(&f.db.pool)
            .await
            .unwrap();
    assert_eq!(
        stored,
        vec![
            (
                "@example.test".into(),
                "catchall".into(),
                json!(["postmaster@example.test"])
            ),
            (
                "sales@example.test".into(),
                "alias".into(),
                json!(["dave@example.net"])
            ),
        ]
    );
    let list = f.httpd.get("/api/aliases", &f.auth()).await;
    assert_eq!(list.json["aliases"].as_array().unwrap().len(), 2);
    for (body, want) in [
        (json!({"targets": []}), "targets: 1 to"),
        (json!({"targets": ["not an address"]}), "targets[0]"),
    ] {
        let r = put("/api/aliases/x@example.test", Some(body.clone())).await;
        assert_eq!(r.status, 400, "{body}");
        assert!(r.json["error"].as_str().unwrap().contains(want), "{r:?}");
    }
    let r = f
        .httpd
        .call(
            Method::DELETE,
            "/api/aliases/sales@example.test",
            &f.auth(),
            None,
        )
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(
        f.httpd
            .call(
                Method::DELETE,
                "/api/aliases/sales@example.test",
                &f.auth(),
                None
            )
            .await
            .status,
        404
    );
    // Local domains: the file's and the settings layer's.
    let r = put("/api/domains/Bücher.example", None).await;
    assert_eq!(
        (r.status, r.json["domain"].as_str()),
        (201, Some("xn--bcher-kva.example"))
    );
    assert_eq!(
        put("/api/domains/xn--bcher-kva.example", None).await.status,
        200
    );
    let list = f.httpd.get("/api/domains", &f.auth()).await;
    assert_eq!(
        list.json["domains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| (d["domain"].as_str().unwrap(), d["source"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [
            ("example.test", "config"),
            ("xn--bcher-kva.example", "settings")
        ]
    );
    let local = pepsi_contract::local::LocalRecipients::new(Vec::<String>::new(), "");
    assert!(
        local
            .is_local_domain(&f.db.pool, "xn--bcher-kva.example")
            .await
            .unwrap(),
        "the stages see it"
    );
    let r = f
        .httpd
        .call(Method::DELETE, "/api/domains/example.test", &f.auth(), None)
        .await;
    assert_eq!(r.status, 409);
    assert!(r.json["error"].as_str().unwrap().contains("LOCAL_DOMAINS"));
    assert_eq!(
        f.httpd
            .call(
                Method::DELETE,
                "/api/domains/xn--bcher-kva.example",
                &f.auth(),
                None
            )
            .await
            .status,
        204
    );
    assert_eq!(
        f.httpd
            .call(
                Method::DELETE,
                "/api/domains/nowhere.example",
                &f.auth(),
                None
            )
            .await
            .status,
        404
    );
    assert_eq!(put("/api/domains/no_such", None).await.status, 400);
    let actions: Vec<String> = f
        .events()
        .await
        .into_iter()
        .map(|e| e.0)
        .filter(|a| a.starts_with("settings."))
        .collect();
    assert_eq!(actions.iter().filter(|a| *a == "settings.set").count(), 5);
    assert_eq!(
        actions.iter().filter(|a| *a == "settings.delete").count(),
        2
    );
}

#[tokio::test]
async fn the_logs_are_searchable_and_their_filters_checked() {
    let f = fixture("").await;
    sqlx::raw_sql(
        "INSERT INTO pepsi.mail_log (at, workqueue_id, stage, event, mail_from, rcpt_to, detail) VALUES \
         (now() - interval '2 hours', 7, 'local', 'delivered', 'a@example.test', ARRAY['bob@example.test'], '{\"mailbox\": \"bob\"}'), \
         (now() - interval '1 hour', 8, 'bounce', 'bounced', 'a@example.test', ARRAY['nobody@example.test'], '{\"status\": \"5.1.1\"}'), \
         (now(), 9, 'local', 'delivered', 'c@example.net', ARRAY['carol@example.test'], '{}')",
    )
    .execute(&f.db.pool)
    .await
    .unwrap();
    let ids = |doc: &Value| -> Vec<i64> {
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["workqueue_id"].as_i64().unwrap())
            .collect()
    };
    let since = (chrono::Utc::now() - chrono::Duration::minutes(90))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let cases = [
        (String::new(), vec![9, 8, 7]),
        ("?sender=example.test".into(), vec![8, 7]),
        ("?recipient=BOB".into(), vec![7]),
        ("?event=bounced".into(), vec![8]),
        ("?workqueue_id=9".into(), vec![9]),
        (format!("?since={since}"), vec![9, 8]),
        ("?limit=1".into(), vec![9]),
    ];
    for (q, want) in cases {
        let r = f.httpd.get(&format!("/api/mail-log{q}"), &f.auth()).await;
        assert_eq!(r.status, 200, "{q}: {r:?}");
        assert_eq!(ids(&r.json), want, "{q}");
    }
    let r = f.httpd.get("/api/mail-log?event=bounced", &f.auth()).await;
    assert_eq!(r.json["entries"][0]["detail"]["status"], "5.1.1");
    for (q, field) in [
        ("?event=lost", "event"),
        ("?since=yesterday", "since"),
        ("?who=x", "who"),
    ] {
        let r = f.httpd.get(&format!("/api/mail-log{q}"), &f.auth()).await;
        assert_eq!(r.status, 400, "{q}");
        assert!(
            r.json["error"].as_str().unwrap().contains(field),
            "{q}: {r:?}"
        );
    }
    let ev = f
        .httpd
        .get("/api/events?action=admin.login", &f.auth())
        .await;
    assert_eq!(ev.json["events"].as_array().unwrap().len(), 1);
    assert_eq!(ev.json["events"][0]["actor"], "root");
    assert_eq!(
        f.httpd.get("/api/events?limit=x", &f.auth()).await.status,
        400
    );
}

// ----- TLS and privileges -----------------------------------------------------------------

#[tokio::test]
async fn with_a_certificate_it_serves_https_and_marks_the_cookie_secure() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "openssl req");
    let port = free_port();
    let config = write_config(
        dir.path(),
        &db.url,
        port,
        &format!(
            "[pepsi-httpd]\nCERT_FILE = {}\nKEY_FILE = {}\n",
            cert.display(),
            key.display()
        ),
    );
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let pem = std::fs::read(&cert).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let mut httpd = Httpd::new(config, port).with_client(client, "https");
    let password = httpd.admin_add("root");
    httpd.start().await;
    let a = httpd
        .post(
            "/api/login",
            &Auth::None,
            &json!({"name": "root", "password": password}),
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("; Secure")
    );
    // Plain HTTP on the TLS port gets no answer.
    let plain = support::httpd::client()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);
}

#[tokio::test]
async fn it_drops_to_user_before_serving_and_refuses_root_without_one() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), &db.url, port, "[pepsi-httpd]\nUSER = nobody\n");
    // SAFETY: a plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let mut httpd = Httpd::new(config.clone(), port);
    if root {
        httpd.start().await;
        let status = std::fs::read_to_string(format!("/proc/{}/status", httpd.pid())).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        let uids: Vec<&str> = uid_line.split_whitespace().skip(1).collect();
        assert!(uids.iter().all(|u| *u != "0"), "still root: {uid_line}");
        assert_eq!(httpd.get("/healthz", &Auth::None).await.status, 200);
        httpd.stop();
        // As root without USER and without ALLOW_ROOT it will not serve.
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n[pepsi-httpd]\nADDRESS = 127.0.0.1:{port}\n",
                db.url
            ),
        )
        .unwrap();
        let (code, _, err) = httpd.cli(&["serve"]);
        assert_eq!(code, 1);
        assert!(err.contains("will not serve as root"), "{err}");
    } else {
        let (code, _, err) = httpd.cli(&["serve"]);
        assert_eq!(code, 1);
        assert!(
            err.contains("USER = nobody: switching to it needs root"),
            "{err}"
        );
    }
}

// ----- /metrics -----------------------------------------------------------------------------

#[tokio::test]
async fn metrics_parse_with_prometheus_and_need_a_credential_unless_allowed() {
    let f = fixture("").await;
    sqlx::raw_sql(
        "INSERT INTO pepsi.stage_stats (stage, messages, processing_ms, kills, crashes) VALUES ('relay', 12, 3500, 1, 2); \
         UPDATE pepsi.dispatch_stats SET stages_total = 30, messages_total = 11, messages_failed = 1; \
         INSERT INTO pepsi.mail_log (stage, event) VALUES ('local', 'delivered'), ('local', 'delivered'), ('bounce', 'bounced'); \
         INSERT INTO pepsi.mail_log (at, stage, event) VALUES (now() - interval '2 hours', 'local', 'delivered')",
    )
    .execute(&f.db.pool)
    .await
    .unwrap();
    f.add(
        "relay",
        "failed",
        "a@example.test",
        &["x@example.org"],
        600.0,
    )
    .await;
    f.add(
        "relay",
        "pending",
        "a@example.test",
        &["x@example.org"],
        30.0,
    )
    .await;
    let held = f
        .add("init", "pending", "a@example.test", &["x@example.org"], 5.0)
        .await;
    f.httpd
        .post(&format!("/api/queue/{held}/hold"), &f.auth(), &json!({}))
        .await;
    let denied = f.httpd.get("/metrics", &Auth::None).await;
    assert_eq!(denied.status, 401, "{denied:?}");
    let r = f.httpd.get("/metrics", &f.auth()).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let doc = prometheus_parse(&r.text);
    // The parser names a counter family without its _total suffix.
    assert_eq!(doc["pepsi_stage_messages"]["type"], "counter");
    assert_eq!(
        sample(
            &doc,
            "pepsi_stage_messages",
            "pepsi_stage_messages_total",
            json!({"stage": "relay"})
        ),
        Some(12.0)
    );
    assert_eq!(
        sample(
            &doc,
            "pepsi_stage_processing_seconds",
            "pepsi_stage_processing_seconds_total",
            json!({"stage": "relay"})
        ),
        Some(3.5)
    );
    assert_eq!(
        sample(
            &doc,
            "pepsi_stage_crashes",
            "pepsi_stage_crashes_total",
            json!({"stage": "relay"})
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &doc,
            "pepsi_dispatch_messages",
            "pepsi_dispatch_messages_total",
            json!({})
        ),
        Some(11.0)
    );
    assert_eq!(
        sample(
            &doc,
            "pepsi_dispatch_messages_failed",
            "pepsi_dispatch_messages_failed_total",
            json!({})
        ),
        Some(1.0)
    );
    assert_eq!(doc["pepsi_queue_messages"]["type"], "gauge");
    let q = |stage: &str, status: &str| {
        sample(
            &doc,
            "pepsi_queue_messages",
            "pepsi_queue_messages",
            json!({"stage": stage, "status": status}),
        )
    };
    assert_eq!(q("relay", "failed"), Some(1.0));
    assert_eq!(q("relay", "pending"), Some(1.0));
    assert_eq!(q("relay", "held"), Some(0.0));
    assert_eq!(q("init", "held"), Some(1.0));
    assert_eq!(
        q("init", "paused"),
        Some(0.0),
        "a held row is not counted as paused"
    );
    let oldest = sample(
        &doc,
        "pepsi_queue_oldest_message_age_seconds",
        "pepsi_queue_oldest_message_age_seconds",
        json!({"stage": "relay"}),
    )
    .unwrap();
    assert!((600.0..3600.0).contains(&oldest), "{oldest}");
    let o = |stage: &str, event: &str| {
        sample(
            &doc,
            "pepsi_mail_outcomes_last_hour",
            "pepsi_mail_outcomes_last_hour",
            json!({"stage": stage, "event": event}),
        )
    };
    assert_eq!(
        o("local", "delivered"),
        Some(2.0),
        "the row two hours old is not counted"
    );
    assert_eq!(o("bounce", "bounced"), Some(1.0));
    // A token reads it too; with METRICS_ALLOW covering the client, nothing is needed.
    let token = f.httpd.token_add("root", &[]);
    assert_eq!(
        f.httpd.get("/metrics", &Auth::Bearer(token)).await.status,
        200
    );
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        &f.db.url,
        port,
        "[pepsi-httpd]\nMETRICS_ALLOW = 10.0.0.0/8, 127.0.0.0/8\n",
    );
    let mut open = Httpd::new(config, port);
    open.start().await;
    let r = open.get("/metrics", &Auth::None).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(prometheus_parse(&r.text)["pepsi_queue_messages"].is_object());
    assert_eq!(
        open.get("/api/queue", &Auth::None).await.status,
        401,
        "only /metrics is open"
    );
}

/// Security review #13 (public metrics): with METRICS_PUBLIC an open scrape is answered
/// from the last open scrape's rendering while it is younger than METRICS_CACHE, so anyone
/// scraping cannot make the database run the aggregates at will; with METRICS_CACHE = 0s
/// every open scrape reads the database.
#[tokio::test]
async fn public_metrics_are_answered_from_metrics_cache() {
    let f = fixture("[pepsi-httpd]\nMETRICS_PUBLIC = yes\nMETRICS_CACHE = 1h\n").await;
    let relay = |text: &str| {
        sample(
            &prometheus_parse(text),
            "pepsi_stage_messages",
            "pepsi_stage_messages_total",
            json!({"stage": "relay"}),
        )
    };
    let first = f.httpd.get("/metrics", &Auth::None).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(relay(&first.text), None);
    sqlx::query("INSERT INTO pepsi.stage_stats (stage, messages) VALUES ('relay', 12)")
        .execute(&f.db.pool)
        .await
        .unwrap();
    for _ in 0..5 {
        let again = f.httpd.get("/metrics", &Auth::None).await;
        assert_eq!(again.status, 200);
        assert_eq!(
            again.text, first.text,
            "open scrapes within METRICS_CACHE are one"
        );
    }
    let token = f.httpd.token_add("root", &[]);
    let fresh = f.httpd.get("/metrics", &Auth::Bearer(token)).await;
    assert_eq!(fresh.status, 200);
    assert_eq!(
        relay(&fresh.text),
        None,
        "a credential on an open /metrics is not looked at: still the cached figures"
    );
    // Without the cache every open scrape reads the database.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        &f.db.url,
        port,
        "[pepsi-httpd]\nMETRICS_PUBLIC = yes\nMETRICS_CACHE = 0s\n",
    );
    let mut uncached = Httpd::new(config, port);
    uncached.start().await;
    let r = uncached.get("/metrics", &Auth::None).await;
    assert_eq!(relay(&r.text), Some(12.0));
}

// ----- the mail log, end to end -------------------------------------------------------------

/// A message through the whole shipped graph (ingress, dispatcher, stages): one recipient
/// delivered to its Maildir, one a mailbox without a Maildir (5.1.1, returned to the
/// sender), and the DSN delivered to the sender — each final outcome is a mail_log row
/// found through the API.
#[tokio::test]
async fn a_message_through_the_system_leaves_mail_log_rows_the_api_finds() {
    let mut sys = support::system::System::new("", &["alice", "bob"]).await;
    sqlx::query("INSERT INTO pepsi.mailbox_account (address) VALUES ('ghost@example.test')")
        .execute(&sys.db.pool)
        .await
        .unwrap();
    sys.start().await;
    let port = free_port();
    let config = write_config(sys.dir.path(), &sys.db.url, port, STAGES);
    let (httpd, _, session) = support::httpd::started_as_root(config, port).await;
    let auth = Auth::Session(session);
    let message = b"From: bob@example.test\r\nTo: alice@example.test, ghost@example.test\r\n\
                    Subject: logged\r\nMessage-ID: <log-1@example.test>\r\n\r\nhello\r\n";
    let reply = sys
        .send(
            "bob@example.test",
            &["alice@example.test", "ghost@example.test"],
            message,
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 1, std::time::Duration::from_secs(30))
        .await;
    sys.wait_messages("bob", 1, std::time::Duration::from_secs(30))
        .await;
    sys.wait_empty(std::time::Duration::from_secs(30)).await;
    let delivered = httpd
        .get("/api/mail-log?recipient=alice@example.test", &auth)
        .await;
    assert_eq!(delivered.status, 200, "{delivered:?}");
    let entries = delivered.json["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["event"], "delivered");
    assert_eq!(entries[0]["stage"], "local");
    assert_eq!(entries[0]["mail_from"], "bob@example.test");
    assert!(
        entries[0]["detail"]["mailbox"]
            .as_str()
            .unwrap()
            .ends_with("alice/Maildir"),
        "{entries:?}"
    );
    let bounced = httpd.get("/api/mail-log?event=bounced", &auth).await;
    let entries = bounced.json["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{bounced:?}");
    assert_eq!(entries[0]["rcpt_to"], json!(["ghost@example.test"]));
    assert_eq!(entries[0]["mail_from"], "bob@example.test");
    assert_eq!(entries[0]["detail"]["status"], "5.1.1");
    assert_eq!(entries[0]["detail"]["failed_at"], "local");
    // The DSN itself, from the null sender, delivered to bob.
    let dsn = httpd
        .get("/api/mail-log?recipient=bob@example.test", &auth)
        .await;
    let entries = dsn.json["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{dsn:?}");
    assert_eq!(
        (
            entries[0]["event"].as_str(),
            entries[0]["mail_from"].as_str()
        ),
        (Some("delivered"), Some(""))
    );
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.mail_log")
        .fetch_one(&sys.db.pool)
        .await
        .unwrap();
    assert_eq!(all, 3, "one row per final outcome");
}

// ----- the OpenAPI document against the router ------------------------------------------

const OPERATIONS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

/// (path, METHOD) of every operation under `paths:` in docs/api.openapi.yaml (two-space
/// indented paths, four-space indented operations, as the document is written).
fn documented_routes(yaml: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    let (mut in_paths, mut path) = (false, None::<String>);
    for line in yaml.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if !line.starts_with(' ') {
            in_paths = line.trim_end() == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  ").filter(|l| !l.starts_with(' ')) {
            let p = p
                .trim_end()
                .strip_suffix(':')
                .expect("a path line ends with ':'");
            path = Some(p.trim_matches(['\'', '"']).to_string());
        } else if let Some(key) = line.strip_prefix("    ").filter(|l| !l.starts_with(' ')) {
            let key = key.split(':').next().unwrap_or_default().trim();
            if OPERATIONS.contains(&key) {
                let path = path.clone().expect("an operation below a path");
                out.insert((path, key.to_uppercase()));
            }
        }
    }
    out
}

/// (path, METHOD) of every `.route(...)` in pepsi-httpd's `app::router`, read from its source
/// (`src` is app.rs; `crate_src` the crate's `src/` directory), and of the routers it merges,
/// each a module's `routes` function (`.merge(api::lists::routes())` reads
/// `src/api/lists.rs`): axum cannot list a router's routes, and the probes of the test below
/// check this reading against the running server.
fn routed(src: &str, crate_src: &std::path::Path) -> std::collections::BTreeSet<(String, String)> {
    let body = src
        .split("pub fn router(")
        .nth(1)
        .expect("app.rs defines pub fn router(")
        .split(".fallback(")
        .next()
        .unwrap();
    for other in [".nest(", ".route_service(", ".nest_service("] {
        assert!(
            !body.contains(other),
            "app::router uses {other}: teach this test to read it"
        );
    }
    let mut out = routes_in(body);
    for merged in body.split(".merge(").skip(1) {
        let module = merged
            .split_once("::routes(")
            .map(|(m, _)| m.trim().trim_start_matches("crate::"))
            .expect("a merged router is a module's routes(...)");
        let path = module.replace("::", "/");
        let file = [format!("{path}.rs"), format!("{path}/mod.rs")]
            .into_iter()
            .map(|f| crate_src.join(f))
            .find(|f| f.exists())
            .unwrap_or_else(|| panic!("no source file for module {module}"));
        let text = std::fs::read_to_string(&file).unwrap();
        let routes_fn = text
            .split("pub fn routes(")
            .nth(1)
            .unwrap_or_else(|| panic!("{} defines no pub fn routes(", file.display()))
            .split("\n}\n")
            .next()
            .unwrap();
        out.extend(routes_in(routes_fn));
    }
    out
}

/// (path, METHOD) of each `.route("path", get(..).post(..))` in `body`.
fn routes_in(body: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for chunk in body.split(".route(").skip(1) {
        let (path, rest) = chunk
            .trim_start()
            .strip_prefix('"')
            .and_then(|r| r.split_once('"'))
            .expect("a route's path is a string literal");
        let rest = rest.split(".route(").next().unwrap_or_default();
        for op in OPERATIONS {
            let call = format!("{op}(");
            let called = rest.match_indices(&call).any(|(at, _)| {
                at == 0 || {
                    let before = rest.as_bytes()[at - 1];
                    !(before.is_ascii_alphanumeric() || before == b'_')
                }
            });
            if called {
                out.insert((path.to_string(), op.to_uppercase()));
            }
        }
    }
    out
}

/// A concrete path for a route template, with a plausible value for each parameter.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| match seg {
            "{id}" => "1",
            "{action}" => "retry",
            "{address}" | "{key}" => "a@example.test",
            "{domain}" => "example.org",
            "{name}" => "pepsi.css",
            s if s.starts_with('{') => "x",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_routes_pepsi_httpd_serves() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let yaml = std::fs::read_to_string(root.join("docs/api.openapi.yaml")).unwrap();
    let src = std::fs::read_to_string(root.join("crates/pepsi-httpd/src/app.rs")).unwrap();
    let documented = documented_routes(&yaml);
    let served = routed(&src, &root.join("crates/pepsi-httpd/src"));
    assert!(
        served.len() > 20,
        "too few routes read from app.rs: {served:?}"
    );
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "routes missing from docs/api.openapi.yaml: {undocumented:?}; \
         documented but not in app::router: {unserved:?}"
    );

    // The running server agrees with that reading: each documented operation reaches a
    // handler (no fallback 404, no 405), each other method on its path gets 405.
    let f = fixture("").await;
    let fallback_404 = |a: &support::httpd::Answer| {
        a.status == 404
            && a.json["error"]
                .as_str()
                .is_some_and(|e| e.contains("no such route"))
    };
    let nope = f.httpd.get("/api/no-such-route", &Auth::None).await;
    assert!(
        fallback_404(&nope),
        "the fallback's answer changed: {nope:?}"
    );
    let paths: std::collections::BTreeSet<&String> = documented.iter().map(|(p, _)| p).collect();
    for path in paths {
        let url = concrete(path);
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ] {
            let a = f.httpd.call(method.clone(), &url, &Auth::None, None).await;
            if documented.contains(&(path.clone(), method.to_string())) {
                assert!(
                    a.status != 405 && !fallback_404(&a),
                    "{method} {url} is documented but not served: {a:?}"
                );
            } else {
                assert_eq!(
                    a.status, 405,
                    "{method} {url} is served but not documented: {a:?}"
                );
            }
        }
    }
}
