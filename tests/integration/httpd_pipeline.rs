//! The live pipeline of pepsi-httpd against a real PostgreSQL: `GET /api/pipeline` over
//! HTTP (the graph of a configuration with `if` and `route` branches and a database
//! override, the queue by status, failures and throughput per stage), the pages and their
//! refusal without a session, and the page itself in headless Chromium driven over
//! WebDriver (chromedriver): log in, read the graph, watch a depth change without a
//! reload, open a stage's rows and a row's history, and keep a screenshot.

use std::path::Path;
use std::time::Duration;

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::free_port;
use crate::support::httpd::{Auth, Httpd, Session, write_config};

/// A graph with every kind of edge: an `if-headers` branch, a route with a per-domain
/// route, BOUNCE_STAGE from the delivery stages and a bounce stage leading back to init.
/// The database overrides dkim's NEXT_STAGE to arc.
const STAGES: &str = "[pepsi]\nLOCAL_DOMAINS = example.test\n\n\
    [stage-init]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = spam\nBOUNCE_STAGE = bounce\n\
    [stage-spam]\nPROGRAM = pepsi-stage-if-headers\nCONDITION = header:X-Spam-Flag == \"YES\"\n\
    THEN = quarantine\nELSE = route\n\
    [stage-quarantine]\nPROGRAM = pepsi-stage-relay-to-maildir\nBOUNCE_STAGE = bounce\n\
    [stage-route]\nPROGRAM = pepsi-stage-route\nROUTE_LOCAL = local\nROUTE_REMOTE = dkim\n\
    ROUTES = partner.example:smarthost\n\
    [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\nBOUNCE_STAGE = bounce\n\
    [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
    [stage-arc]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = relay\n\
    [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\nBOUNCE_STAGE = bounce\n\
    [stage-smarthost]\nPROGRAM = pepsi-stage-relay-to-smarthost\nBOUNCE_STAGE = bounce\n\
    [stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = init\n";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    password: String,
    session: Session,
}

async fn fixture() -> Fixture {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO pepsi.config_override (scope, section, option, value) \
         VALUES ('global', 'stage-dkim', 'NEXT_STAGE', 'arc')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), &db.url, port, STAGES);
    let (httpd, password, session) = support::httpd::started_as_root(config, port).await;
    Fixture {
        db,
        _dir: dir,
        httpd,
        password,
        session,
    }
}

impl Fixture {
    fn auth(&self) -> Auth {
        Auth::Session(self.session.clone())
    }

    /// `n` queue rows at `stage` in `status` (`held`: paused with state.held); their ids.
    async fn add(&self, stage: &str, status: &str, n: usize) -> Vec<i64> {
        let mut ids = Vec::new();
        for i in 0..n {
            let id: i64 = sqlx::query_scalar(
                "SELECT pepsi.workqueue_add($1, $2, 'Subject: hello\r\n'::bytea, 'body\r\n'::bytea, '{}'::jsonb)",
            )
            .bind(format!("sender{i}@example.org"))
            .bind(vec![format!("rcpt{i}@example.test")])
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
            let (column, held) = match status {
                "held" => ("paused", true),
                s => (s, false),
            };
            sqlx::query(
                "UPDATE pepsi.workqueue SET stage = $2, status = $3::pepsi.workqueue_status, \
                 state = CASE WHEN $4 THEN '{\"held\": {\"reason\": \"test\"}}'::jsonb ELSE state END \
                 WHERE workqueue_id = $1",
            )
            .bind(id)
            .bind(stage)
            .bind(column)
            .bind(held)
            .execute(&self.db.pool)
            .await
            .unwrap();
            ids.push(id);
        }
        ids
    }

    async fn stage_stats(&self, stage: &str, messages: i64, kills: i64, crashes: i64) {
        sqlx::query(
            "INSERT INTO pepsi.stage_stats (stage, messages, kills, crashes) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (stage) DO UPDATE SET messages = $2, kills = $3, crashes = $4",
        )
        .bind(stage)
        .bind(messages)
        .bind(kills)
        .bind(crashes)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }
}

fn stage<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {doc:#}"))
}

fn edges(doc: &Value) -> Vec<String> {
    doc["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| match e["label"].as_str() {
            Some(l) => format!(
                "{} -{}[{l}]-> {}",
                e["from"].as_str().unwrap(),
                e["kind"].as_str().unwrap(),
                e["to"].as_str().unwrap()
            ),
            None => format!(
                "{} -{}-> {}",
                e["from"].as_str().unwrap(),
                e["kind"].as_str().unwrap(),
                e["to"].as_str().unwrap()
            ),
        })
        .collect()
}

// ----- the JSON endpoint ---------------------------------------------------------------

#[tokio::test]
async fn the_pipeline_document_draws_the_configured_graph_with_its_queue_and_counters() {
    let f = fixture().await;
    f.add("init", "pending", 2).await;
    f.add("relay", "failed", 1).await;
    f.add("relay", "timeout", 1).await;
    f.add("relay", "held", 1).await;
    f.add("relay", "paused", 2).await;
    f.add("local", "running", 1).await;
    f.add("retired", "pending", 1).await;
    f.stage_stats("relay", 10, 1, 2).await;

    let a = f.httpd.get("/api/pipeline", &f.auth()).await;
    assert_eq!(a.status, 200, "{a:?}");
    let doc = a.json;
    assert_eq!(doc["first_stage"], "init");
    // Columns by distance from init; bounce, reached only through BOUNCE_STAGE, right of
    // the furthest stage that bounces; a stage that only rows name, apart at column 0.
    let places: Vec<String> = doc["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}@{}.{}",
                s["name"].as_str().unwrap(),
                s["column"],
                s["row"]
            )
        })
        .collect();
    assert_eq!(
        places.join(" "),
        "init@0.0 retired@0.1 spam@1.0 quarantine@2.0 route@2.1 dkim@3.0 local@3.1 \
         smarthost@3.2 arc@4.0 relay@5.0 bounce@6.0"
    );
    assert_eq!(
        edges(&doc),
        [
            "arc -next-> relay",
            "bounce -next-> init",
            "dkim -next-> arc",
            "init -next-> spam",
            "init -bounce-> bounce",
            "local -bounce-> bounce",
            "quarantine -bounce-> bounce",
            "relay -bounce-> bounce",
            "route -branch[remote]-> dkim",
            "route -branch[local]-> local",
            "route -branch[partner.example]-> smarthost",
            "smarthost -bounce-> bounce",
            "spam -branch[then]-> quarantine",
            "spam -branch[else]-> route",
        ],
        "dkim -next-> arc comes from the database override"
    );
    assert_eq!(
        stage(&doc, "spam")["condition"],
        "header:X-Spam-Flag == \"YES\""
    );
    assert_eq!(stage(&doc, "spam")["program"], "pepsi-stage-if-headers");

    let relay = stage(&doc, "relay");
    assert_eq!(
        relay["queue"],
        json!({"pending": 0, "running": 0, "paused": 2, "held": 1, "failed": 1, "timeout": 1, "total": 5})
    );
    assert_eq!(
        relay["failures"],
        json!({"rows": 2, "kills": 1, "crashes": 2})
    );
    assert_eq!(relay["counters"]["messages"], 10);
    assert_eq!(stage(&doc, "init")["queue"]["pending"], 2);
    assert_eq!(stage(&doc, "local")["queue"]["running"], 1);
    assert_eq!(stage(&doc, "bounce")["queue"]["total"], 0);
    let retired = stage(&doc, "retired");
    assert_eq!(retired["configured"], false);
    assert_eq!(retired["queue"]["pending"], 1);
    let problems = doc["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .as_str()
            .unwrap()
            .contains("rows wait at stage retired, which has no [stage-retired] section")
    );
    assert_eq!(doc["totals"], json!({"rows": 9, "failed_rows": 2}));
    assert_eq!(
        relay["throughput"]["messages"], 0,
        "nothing to compare with yet"
    );

    // Throughput: the change of the counters since the earlier reading.
    f.stage_stats("relay", 17, 1, 3).await;
    let doc = f.httpd.get("/api/pipeline", &f.auth()).await.json;
    let relay = stage(&doc, "relay");
    assert_eq!(
        relay["throughput"],
        json!({"messages": 7, "kills": 0, "crashes": 1})
    );
    assert_eq!(relay["failures"]["crashes"], 3);
    assert!(doc["throughput_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(doc["window_seconds"], 60);

    // A bearer token reads it too; a parameter is refused by name.
    let token = f.httpd.token_add("root", &[]);
    let a = f.httpd.get("/api/pipeline", &Auth::Bearer(token)).await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = f.httpd.get("/api/pipeline?stage=relay", &f.auth()).await;
    assert_eq!(a.status, 400);
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("unknown parameter \"stage\""),
        "{a:?}"
    );
}

#[tokio::test]
async fn without_a_session_the_pipeline_answers_401_and_its_page_the_login_form() {
    let f = fixture().await;
    for path in ["/api/pipeline", "/pipeline/graph"] {
        let a = f.httpd.get(path, &Auth::None).await;
        assert_eq!(a.status, 401, "{path}: {a:?}");
        assert!(
            a.json["error"]
                .as_str()
                .unwrap()
                .contains("authentication required"),
            "{path}: {a:?}"
        );
        let a = f
            .httpd
            .get(
                path,
                &Auth::RawCookie(format!("pepsi_session={}", "a".repeat(64))),
            )
            .await;
        assert_eq!(a.status, 401, "{path} with a forged cookie: {a:?}");
    }
    let page = f.httpd.get("/pipeline", &Auth::None).await;
    assert_eq!(page.status, 401);
    assert!(
        page.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(page.text.contains("id=\"login-form\""), "{}", page.text);
    assert!(
        !page.text.contains("stage-init"),
        "no graph without a session"
    );
    let forged = f
        .httpd
        .get(
            "/pipeline",
            &Auth::RawCookie(format!("pepsi_session={}", "b".repeat(64))),
        )
        .await;
    assert_eq!(forged.status, 401);
    assert!(
        forged
            .text
            .contains("the session has expired or is unknown"),
        "{}",
        forged.text
    );

    let login = f.httpd.get("/login", &Auth::None).await;
    assert_eq!(login.status, 200);
    assert!(login.text.contains("src=\"/ui/login.js\""));
    let csp = login.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = no_redirects.get(f.httpd.url("/")).send().await.unwrap();
    assert_eq!(root.status(), 303);
    assert_eq!(root.headers()["location"], "/pipeline");
    for (file, kind) in [
        ("pipeline.js", "text/javascript"),
        ("login.js", "text/javascript"),
        ("pepsi.css", "text/css"),
    ] {
        let a = f.httpd.get(&format!("/ui/{file}"), &Auth::None).await;
        assert_eq!(a.status, 200, "{file}");
        assert!(
            a.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind),
            "{file}"
        );
    }
    let a = f.httpd.get("/ui/secret.txt", &Auth::None).await;
    assert_eq!(a.status, 404);
    assert!(a.json["error"].as_str().unwrap().contains("secret.txt"));

    // With the session: the page with its graph, and the graph alone.
    let page = f.httpd.get("/pipeline", &f.auth()).await;
    assert_eq!(page.status, 200, "{}", page.text);
    for name in ["init", "spam", "route", "relay", "bounce"] {
        assert!(
            page.text.contains(&format!("id=\"stage-{name}\"")),
            "{name}"
        );
    }
    assert!(
        page.text
            .contains(&format!("data-csrf=\"{}\"", f.session.csrf))
    );
    let graph = f.httpd.get("/pipeline/graph", &f.auth()).await;
    assert_eq!(graph.status, 200);
    assert!(graph.text.starts_with("<svg"), "{}", graph.text);
}

#[tokio::test]
async fn the_event_log_lists_one_rows_history() {
    let f = fixture().await;
    let ids = f.add("relay", "failed", 2).await;
    for id in &ids {
        let a = f
            .httpd
            .post(
                &format!("/api/queue/{id}/hold"),
                &f.auth(),
                &json!({"reason": "look"}),
            )
            .await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    let a = f
        .httpd
        .get(&format!("/api/events?workqueue_id={}", ids[1]), &f.auth())
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    let events = a.json["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["workqueue_id"], ids[1]);
    assert_eq!(events[0]["action"], "queue.hold");
    let a = f.httpd.get("/api/events?workqueue_id=0", &f.auth()).await;
    assert_eq!(a.status, 400);
    assert!(
        a.json["error"]
            .as_str()
            .unwrap()
            .contains("workqueue_id: \"0\"")
    );
}

// ----- the page in Chromium ------------------------------------------------------------

use crate::support::browser::Browser;

fn depth_of(stage: &str) -> String {
    format!(
        "const el = document.querySelector('#stage-{stage} [data-field=\"queue.total\"]'); \
         return el ? el.textContent : null;"
    )
}

#[tokio::test]
async fn the_pipeline_page_logs_in_updates_live_and_opens_rows_in_chromium() {
    let f = fixture().await;
    f.add("init", "pending", 2).await;
    let relay = f.add("relay", "failed", 2).await;
    f.add("relay", "paused", 1).await;
    f.add("local", "running", 1).await;
    f.add("dkim", "pending", 3).await;
    f.stage_stats("relay", 120, 0, 1).await;
    let a = f
        .httpd
        .post(
            &format!("/api/queue/{}/hold", relay[0]),
            &f.auth(),
            &json!({"reason": "checking the peer"}),
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");

    let b = Browser::start().await;
    // No session: the login form stands in for the page.
    b.go(&f.httpd.url("/pipeline")).await;
    b.until(
        "the login form",
        "return document.getElementById('login-form') !== null",
    )
    .await;
    b.type_into("#login-name", "root").await;
    b.type_into("#login-password", "not the password").await;
    b.click("#login-submit").await;
    let refused = b
        .until(
            "the refusal",
            "const m = document.getElementById('login-message'); return m && m.textContent || null;",
        )
        .await;
    assert_eq!(refused, "wrong name or password");
    b.js("document.getElementById('login-password').value = ''; return true")
        .await;
    b.type_into("#login-password", &f.password).await;
    b.click("#login-submit").await;
    b.until(
        "the graph",
        "return document.getElementById('pipeline-graph') !== null",
    )
    .await;

    // Every configured stage is a node; the depths are the rows.
    let names = b
        .js("return Array.from(document.querySelectorAll('g.stage')).map(g => g.dataset.stage).sort()")
        .await;
    assert_eq!(
        names,
        json!([
            "arc",
            "bounce",
            "dkim",
            "init",
            "local",
            "quarantine",
            "relay",
            "route",
            "smarthost",
            "spam"
        ])
    );
    assert_eq!(b.js(&depth_of("relay")).await, "3");
    assert_eq!(b.js(&depth_of("dkim")).await, "3");
    assert_eq!(b.js(&depth_of("init")).await, "2");
    assert_eq!(
        b.js("return document.querySelector('#stage-relay [data-field=\"queue.failed\"]').textContent").await,
        "1",
        "one failed row, one held"
    );
    assert_eq!(
        b.js("return document.querySelector('#stage-relay').classList.contains('failing')")
            .await,
        true
    );
    let edges = b
        .js("return document.querySelectorAll('#pipeline-graph g.edge').length")
        .await;
    assert_eq!(edges, 14);

    // New rows show without a reload: a mark left in the page survives the change.
    b.js("window.pepsiTestMark = 'still here'; return true")
        .await;
    f.add("relay", "pending", 4).await;
    b.until(
        "relay's depth 7",
        &format!("return (function () {{ {} }})() === '7'", depth_of("relay")),
    )
    .await;
    assert_eq!(
        b.js("return window.pepsiTestMark || null").await,
        "still here"
    );
    assert_eq!(
        b.js("return document.getElementById('total-rows').textContent")
            .await,
        "13"
    );

    // A stage opens its rows.
    b.click("#stage-relay").await;
    b.until(
        "relay's rows",
        "return document.querySelectorAll('#rows-table tbody tr.row').length === 7",
    )
    .await;
    assert_eq!(
        b.js("return document.getElementById('rows-stage').textContent")
            .await,
        "relay"
    );
    let listed = b
        .js("return Array.from(document.querySelectorAll('#rows-table tbody tr.row')).map(tr => Number(tr.dataset.id))")
        .await;
    for id in &relay {
        assert!(
            listed.as_array().unwrap().contains(&json!(id)),
            "{id} in {listed}"
        );
    }

    // A row opens its state and its event history.
    b.click(&format!("#rows-table tr.row[data-id=\"{}\"]", relay[0]))
        .await;
    let history = b
        .until(
            "the row's events",
            "const t = document.querySelector('#detail-events tbody'); \
             return t && t.rows.length > 0 ? t.innerText : null;",
        )
        .await;
    assert!(
        history.as_str().unwrap().contains("queue.hold"),
        "{history}"
    );
    let state = b
        .js("return document.getElementById('detail-state').textContent")
        .await;
    assert!(
        state.as_str().unwrap().contains("checking the peer"),
        "{state}"
    );
    let facts = b
        .js("return document.getElementById('detail-facts').innerText")
        .await;
    assert!(facts.as_str().unwrap().contains("held"), "{facts}");

    // The picture, kept beside the docs when asked (PEPSI_UPDATE_DOCS=1).
    b.js("window.scrollTo(0, 0); return true").await;
    let png = b.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        png.len() > 10_000,
        "a screenshot of something ({} bytes)",
        png.len()
    );
    std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipeline.png"),
        &png,
    )
    .unwrap();
    if std::env::var_os("PEPSI_UPDATE_DOCS").is_some() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/pipeline.png"),
            &png,
        )
        .unwrap();
    }

    // Logging out ends the session: the page is the login form again.
    b.click("#logout").await;
    b.until(
        "the login page",
        "return document.getElementById('login-form') !== null",
    )
    .await;
    b.go(&f.httpd.url("/pipeline")).await;
    b.until(
        "the login form",
        "return document.getElementById('login-form') !== null",
    )
    .await;
}

// ----- the counters of real traffic ------------------------------------------------------

/// The figure `field` (`counters.messages`, `throughput.messages`, `failures.kills`,
/// `failures.crashes`) of stage `stage` as the page shows it.
fn shown(stage: &str, field: &str) -> String {
    format!(
        "const el = document.querySelector('#stage-{stage} [data-field=\"{field}\"]'); \
         return el ? Number(el.textContent) : null;"
    )
}

/// Waits until the page shows `field` of `stage` at `want` or more; returns what it shows.
async fn until_shown(b: &Browser, stage: &str, field: &str, want: i64) -> i64 {
    let v = b
        .until(
            &format!("{stage}'s {field} at {want} or more"),
            &format!(
                "const v = (function () {{ {} }})(); return v !== null && v >= {want} ? v : null;",
                shown(stage, field)
            ),
        )
        .await;
    v.as_i64().unwrap()
}

/// Issue 34 item 5: after mail went through the real ingress and dispatcher and workers were
/// killed, every box of the pipeline page said `done 0 kills 0 crashes 0`: "done" was the
/// last minute's growth only, and a stage worker killed between two messages counted
/// nowhere. The page now shows what the dispatcher counted (`pepsi.stage_stats`): the
/// figures move under load, a kill -9 of a stage worker is a crash, a worker over MAX_RUNTIME
/// a kill, they stay across a restart of the dispatcher, and /metrics says the same.
#[tokio::test]
async fn the_pipeline_page_counts_real_traffic_crashes_and_kills_across_a_dispatcher_restart() {
    // The shipped graph, plus a stage whose worker hangs on the rows marked for it.
    let extra = format!(
        "[stage-slow]\nPROGRAM = {}\nACTION = hang\nONLY_IF_STATE = hang\nMAX_RUNTIME = 1s\n\
         NEXT_STAGE = local\n\n[pepsi-dispatch]\nSTATS_IDLE_INTERVAL = 1s\n",
        support::test_stage().display()
    );
    let mut sys = support::system::System::new(&extra, &["alice"]).await;
    sys.start().await;
    let port = free_port();
    let config = sys.dir.path().join("pepsi-httpd.conf");
    std::fs::write(
        &config,
        format!(
            "@inline@ {}\n\n[database]\nURL = {}\nMAX_CONNECTIONS = 4\n\n\
             [pepsi-httpd]\nADDRESS = 127.0.0.1:{port}\nALLOW_ROOT = yes\n",
            sys.config.display(),
            sys.db.url
        ),
    )
    .unwrap();
    let (httpd, password, session) = support::httpd::started_as_root(config, port).await;

    let b = Browser::start().await;
    b.go(&httpd.url("/pipeline")).await;
    b.until(
        "the login form",
        "return document.getElementById('login-form') !== null",
    )
    .await;
    b.type_into("#login-name", "root").await;
    b.type_into("#login-password", &password).await;
    b.click("#login-submit").await;
    b.until(
        "the graph",
        "return document.getElementById('pipeline-graph') !== null",
    )
    .await;
    assert_eq!(b.js(&shown("local", "counters.messages")).await, 0);

    // Under load: 20 messages through the ingress, every stage on their path counts them.
    let message =
        b"From: bob@example.test\r\nTo: alice@example.test\r\nSubject: count me\r\n\r\nhello\r\n";
    for _ in 0..20 {
        let reply = sys
            .send("bob@example.test", &["alice@example.test"], message)
            .await;
        assert!(reply.starts_with("250"), "{reply}");
    }
    sys.wait_messages("alice", 20, Duration::from_secs(60))
        .await;
    for stage in ["init", "aliases", "route", "local"] {
        assert_eq!(
            until_shown(&b, stage, "counters.messages", 20).await,
            20,
            "{stage} handled each message once"
        );
    }
    assert_eq!(
        until_shown(&b, "local", "throughput.messages", 20).await,
        20,
        "all of them within the last minute"
    );

    // A kill -9 of a stage worker between two messages is a crash.
    let local = support::system::children(sys.dispatcher_pid())
        .into_iter()
        .find(|&pid| support::system::cmdline(pid).contains("pepsi-stage-relay-to-maildir"))
        .expect("a worker of the local stage still runs (WORKER_IDLE_TIMEOUT 60s)");
    support::system::signal(local, "KILL");
    assert_eq!(until_shown(&b, "local", "failures.crashes", 1).await, 1);

    // A row that hangs its worker past MAX_RUNTIME: the worker is killed, the row times out.
    let mut tx = sys.db.pool.begin().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('bob@example.test', ARRAY['alice@example.test'], \
         'Subject: hang\r\n'::bytea, 'x\r\n'::bytea, '{\"hang\": true}'::jsonb)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    sqlx::query("UPDATE pepsi.workqueue SET stage = 'slow' WHERE workqueue_id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(until_shown(&b, "slow", "failures.kills", 1).await, 1);
    assert_eq!(b.js(&shown("slow", "failures.crashes")).await, 0);

    // The figures are the dispatcher's, kept in the database: a restart changes none, and
    // what the new dispatcher counts adds to them.
    sys.stop_dispatcher();
    sys.start_dispatcher();
    b.go(&httpd.url("/pipeline")).await;
    b.until(
        "the graph again",
        "return document.getElementById('pipeline-graph') !== null",
    )
    .await;
    assert_eq!(b.js(&shown("local", "counters.messages")).await, 20);
    assert_eq!(b.js(&shown("local", "failures.crashes")).await, 1);
    assert_eq!(b.js(&shown("slow", "failures.kills")).await, 1);
    for _ in 0..5 {
        let reply = sys
            .send("bob@example.test", &["alice@example.test"], message)
            .await;
        assert!(reply.starts_with("250"), "{reply}");
    }
    sys.wait_messages("alice", 25, Duration::from_secs(60))
        .await;
    assert_eq!(until_shown(&b, "local", "counters.messages", 25).await, 25);
    assert_eq!(b.js(&shown("local", "failures.crashes")).await, 1);

    // /metrics agrees with the page.
    let text = httpd
        .get("/metrics", &Auth::Session(session.clone()))
        .await
        .text;
    let m = support::httpd::prometheus_parse(&text);
    let family = |f: &str, stage: &str| {
        support::httpd::sample(&m, f, &format!("{f}_total"), json!({ "stage": stage }))
            .unwrap_or_else(|| panic!("no {f} of {stage} in\n{text}"))
    };
    for stage in ["init", "route", "local", "slow"] {
        let on_page = |field: &str| {
            let b = &b;
            let script = shown(stage, field);
            async move { b.js(&script).await.as_f64().unwrap() }
        };
        assert_eq!(
            family("pepsi_stage_messages", stage),
            on_page("counters.messages").await,
            "{stage}"
        );
        assert_eq!(
            family("pepsi_stage_crashes", stage),
            on_page("failures.crashes").await,
            "{stage}"
        );
        assert_eq!(
            family("pepsi_stage_kills", stage),
            on_page("failures.kills").await,
            "{stage}"
        );
    }
}
