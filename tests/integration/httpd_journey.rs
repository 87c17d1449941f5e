//! A message's journey and the stages' pass times in pepsi-httpd, against a real PostgreSQL
//! with pepsi-httpd connected as its own role: spans written into `pepsi.telemetry_span` as
//! pepsi-telemetry stores them (the table is the contract between the two), then `GET
//! /api/journey` by queue row, Message-ID (with and without angle brackets) and trace id,
//! its refusals, the `/journey` page in headless Chromium (every span in order, the retries
//! and the interrupted pass marked, the links from the pipeline page's rows and mail log),
//! hostile span text escaped, and the pipeline's pass-time percentiles for known durations.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use crate::support::browser::Browser;
use crate::support::httpd::{AsRole, Auth, Httpd, Session};

/// A small graph: the stages the spans name, so that the pipeline's latencies list them.
const CONFIG: &str = "[pepsi]\nLOCAL_DOMAINS = example.test\n\n\
    [stage-init]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = route\n\
    [stage-route]\nPROGRAM = pepsi-stage-route\nROUTE_LOCAL = local\nROUTE_REMOTE = dkim\n\
    [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = relay\n\
    [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\n\
    [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\n";

const TRACE_A: [u8; 16] = [0xa1; 16];
const TRACE_B: [u8; 16] = [0xb2; 16];
const MESSAGE_ID: &str = "<journey-1@example.org>";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every byte outside `A-Za-z0-9` as `%XX`, for a query-string value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

struct Fixture {
    site: AsRole,
    httpd: Httpd,
    password: String,
    session: Session,
    /// The trace's first span starts here.
    t0: DateTime<Utc>,
}

/// One span as pepsi-telemetry stores it: the pepsi.* attributes lifted into columns and
/// kept in `attributes` with the resource's.
struct Span<'a> {
    trace: [u8; 16],
    id: u8,
    parent: Option<u8>,
    name: &'a str,
    host: &'a str,
    program: &'a str,
    stage: Option<&'a str>,
    queue: Option<i64>,
    message_id: Option<&'a str>,
    outcome: &'a str,
    /// Milliseconds from the fixture's t0.
    start: i64,
    end: i64,
    extra: Value,
}

impl Fixture {
    async fn new(extra_config: &str) -> Fixture {
        // `extra_config` lands in the [pepsi-httpd] section the configuration starts with.
        let site = AsRole::new(&format!("{extra_config}\n{CONFIG}")).await;
        let (httpd, password, session) =
            crate::support::httpd::started_as_root(site.config.clone(), site.port).await;
        let now = Utc::now() - Duration::minutes(10);
        let t0 = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap();
        Fixture {
            site,
            httpd,
            password,
            session,
            t0,
        }
    }

    fn auth(&self) -> Auth {
        Auth::Session(self.session.clone())
    }

    async fn insert(&self, s: Span<'_>) {
        let mut attributes = json!({
            "service.name": "pepsi",
            "host.name": s.host,
            "pepsi.program": s.program,
            "pepsi.outcome": s.outcome,
        });
        if let Some(stage) = s.stage {
            attributes["pepsi.stage"] = json!(stage);
        }
        if let Some(q) = s.queue {
            attributes["pepsi.queue_id"] = json!(q);
        }
        if let Some(m) = s.message_id {
            attributes["pepsi.message_id"] = json!(m);
        }
        if let Value::Object(extra) = s.extra {
            for (k, v) in extra {
                attributes[k] = v;
            }
        }
        let error = matches!(s.outcome, "failed" | "deferred" | "interrupted");
        let span_id = |id: u8| vec![s.trace[0], 0, 0, 0, 0, 0, 0, id];
        sqlx::query(
            "INSERT INTO pepsi.telemetry_span (trace_id, span_id, parent_span_id, name, service, \
             host, stage, queue_id, message_id, outcome, start_time, end_time, attributes, \
             status_code, status_message) \
             VALUES ($1, $2, $3, $4, 'pepsi', $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(s.trace.to_vec())
        .bind(span_id(s.id))
        .bind(s.parent.map(span_id))
        .bind(s.name)
        .bind(s.host)
        .bind(s.stage)
        .bind(s.queue)
        .bind(s.message_id)
        .bind(s.outcome)
        .bind(self.t0 + Duration::milliseconds(s.start))
        .bind(self.t0 + Duration::milliseconds(s.end))
        .bind(attributes)
        .bind(if error { 2i16 } else { 0 })
        .bind(error.then(|| format!("{} pass", s.outcome)))
        .execute(&self.site.db.pool)
        .await
        .unwrap();
    }

    /// A queue row at stage relay, failed (the pipeline page lists it), with a mail log
    /// entry; its id.
    async fn queue_row(&self) -> i64 {
        let id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add('bob@example.org', ARRAY['alice@example.net'], \
             'Message-ID: <journey-1@example.org>\r\n'::bytea, 'hi\r\n'::bytea, '{}'::jsonb)",
        )
        .fetch_one(&self.site.db.pool)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE pepsi.workqueue SET stage = 'relay', status = 'failed' WHERE workqueue_id = $1",
        )
        .bind(id)
        .execute(&self.site.db.pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO pepsi.mail_log (workqueue_id, stage, event, mail_from, rcpt_to) \
             VALUES ($1, 'relay', 'bounced', 'bob@example.org', ARRAY['alice@example.net'])",
        )
        .bind(id)
        .execute(&self.site.db.pool)
        .await
        .unwrap();
        id
    }

    /// Trace A of queue row `q` (and its split-off row `q + 1000`): the ingress, init,
    /// route with dkim fused into it, the child row's local delivery, and relay three times
    /// (interrupted by a killed worker, deferred, finished). Given out of order. And trace
    /// B, older, of the same Message-ID under another row.
    async fn traces(&self, q: i64) {
        let base = |id: u8,
                    parent: Option<u8>,
                    stage: Option<&'static str>,
                    outcome: &'static str,
                    start: i64,
                    end: i64| Span {
            trace: TRACE_A,
            id,
            parent,
            name: "pass",
            host: "mx1.example.org",
            program: "pepsi-stage-x",
            stage,
            queue: Some(q),
            message_id: Some(MESSAGE_ID),
            outcome,
            start,
            end,
            extra: json!({}),
        };
        self.insert(Span {
            extra: json!({"pepsi.dispatch_wait_ms": 250}),
            program: "pepsi-stage-relay-to-internet",
            ..base(8, Some(1), Some("relay"), "finished", 5000, 5200)
        })
        .await;
        self.insert(Span {
            name: "smtp",
            program: "pepsi-ingress",
            host: "mx0.example.org",
            ..base(1, None, None, "accepted", 0, 40)
        })
        .await;
        self.insert(Span {
            extra: json!({"pepsi.dispatch_wait_ms": 3}),
            program: "pepsi-stage-srs",
            ..base(2, Some(1), Some("init"), "advanced", 50, 60)
        })
        .await;
        self.insert(Span {
            program: "pepsi-stage-route",
            ..base(3, Some(1), Some("route"), "advanced", 70, 90)
        })
        .await;
        self.insert(Span {
            extra: json!({"pepsi.fused_into": "route"}),
            program: "pepsi-stage-dkim-sign",
            ..base(4, Some(3), Some("dkim"), "advanced", 75, 85)
        })
        .await;
        self.insert(Span {
            queue: Some(q + 1000),
            program: "pepsi-stage-relay-to-maildir",
            ..base(5, Some(1), Some("local"), "finished", 95, 99)
        })
        .await;
        self.insert(Span {
            program: "pepsi-stage-relay-to-internet",
            ..base(6, Some(1), Some("relay"), "interrupted", 100, 1100)
        })
        .await;
        self.insert(Span {
            program: "pepsi-stage-relay-to-internet",
            ..base(7, Some(1), Some("relay"), "deferred", 1500, 1700)
        })
        .await;
        // Trace B, a day older: the same Message-ID sent before, stored without brackets.
        for (id, stage, outcome, start, end) in [
            (1, None, "accepted", -86_400_000, -86_399_990),
            (2, Some("local"), "finished", -86_399_900, -86_399_800),
        ] {
            self.insert(Span {
                trace: TRACE_B,
                id,
                parent: (id == 2).then_some(1),
                name: "pass",
                host: "mx1.example.org",
                program: "pepsi-x",
                stage,
                queue: Some(q + 2000),
                message_id: Some("journey-1@example.org"),
                outcome,
                start,
                end,
                extra: json!({}),
            })
            .await;
        }
    }
}

fn stages(doc: &Value) -> Vec<String> {
    doc["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap_or("ingress").to_owned())
        .collect()
}

fn error_of(a: &crate::support::httpd::Answer) -> String {
    a.json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no JSON error in {a:?}"))
        .to_owned()
}

// ----- the JSON API ----------------------------------------------------------------------

#[tokio::test]
async fn the_journey_api_finds_a_trace_by_queue_row_message_id_and_trace_id() {
    let f = Fixture::new("").await;
    let q = f.queue_row().await;
    f.traces(q).await;

    let a = f
        .httpd
        .get(&format!("/api/journey?queue={q}"), &f.auth())
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    let doc = &a.json;
    assert_eq!(doc["trace_id"], hex(&TRACE_A));
    assert_eq!(doc["traces"], json!([]), "row {q} is in trace A alone");
    assert_eq!(doc["truncated"], false);
    // In the order they began, whatever the order they were stored in.
    assert_eq!(
        stages(doc),
        [
            "ingress", "init", "route", "dkim", "local", "relay", "relay", "relay"
        ]
    );
    let spans = doc["spans"].as_array().unwrap();
    // (queue wait, dispatch wait, duration, offset, attempt) per span: the wait is the
    // start minus the end of the row's previous span, 0 inside the pass it was fused into,
    // none for a row's first span (the ingress, the split-off row).
    let got: Vec<Value> = spans
        .iter()
        .map(|s| {
            json!([
                s["wait_ms"],
                s["dispatch_wait_ms"],
                s["duration_ms"],
                s["offset_ms"],
                s["attempt"]
            ])
        })
        .collect();
    assert_eq!(
        got,
        [
            json!([null, null, 40.0, 0.0, 1]),
            json!([10.0, 3.0, 10.0, 50.0, 1]),
            json!([10.0, null, 20.0, 70.0, 1]),
            json!([0.0, null, 10.0, 75.0, 1]),
            json!([null, null, 4.0, 95.0, 1]),
            json!([10.0, null, 1000.0, 100.0, 1]),
            json!([400.0, null, 200.0, 1500.0, 2]),
            json!([3300.0, 250.0, 200.0, 5000.0, 3]),
        ]
    );
    let ingress = &spans[0];
    assert_eq!(ingress["span_id"], "a100000000000001");
    assert_eq!(ingress["parent_span_id"], Value::Null);
    assert_eq!(ingress["name"], "smtp");
    assert_eq!(ingress["host"], "mx0.example.org");
    assert_eq!(ingress["service"], "pepsi");
    assert_eq!(ingress["program"], "pepsi-ingress");
    assert_eq!(ingress["outcome"], "accepted");
    assert_eq!(ingress["queue_id"], q);
    assert_eq!(ingress["message_id"], MESSAGE_ID);
    assert_eq!(ingress["attributes"]["host.name"], "mx0.example.org");
    let start: DateTime<Utc> = serde_json::from_value(ingress["start"].clone()).unwrap();
    let end: DateTime<Utc> = serde_json::from_value(ingress["end"].clone()).unwrap();
    assert_eq!((start, end - start), (f.t0, Duration::milliseconds(40)));
    assert_eq!(spans[3]["fused_into"], "route");
    assert_eq!(spans[3]["parent_span_id"], "a100000000000003");
    assert_eq!(spans[4]["queue_id"], q + 1000, "the split-off row");
    assert_eq!(spans[5]["outcome"], "interrupted");
    assert_eq!(spans[5]["interrupted"], true);
    assert_eq!(spans[5]["status_message"], "interrupted pass");
    assert_eq!(spans[6]["interrupted"], false);
    assert_eq!(doc["duration_ms"], 5200.0);

    // The split-off row finds the same trace.
    let a = f
        .httpd
        .get(&format!("/api/journey?queue={}", q + 1000), &f.auth())
        .await;
    assert_eq!(a.json["trace_id"], hex(&TRACE_A), "{a:?}");

    // The Message-ID with or without its brackets, stored with them (trace A) and without
    // (trace B): the newest trace, the other listed.
    for typed in [
        MESSAGE_ID,
        "journey-1@example.org",
        " <journey-1@example.org> ",
    ] {
        let a = f
            .httpd
            .get(
                &format!("/api/journey?message_id={}", encode(typed)),
                &f.auth(),
            )
            .await;
        assert_eq!(a.status, 200, "{typed:?}: {a:?}");
        assert_eq!(a.json["trace_id"], hex(&TRACE_A), "{typed:?}");
        assert_eq!(a.json["traces"], json!([hex(&TRACE_B)]), "{typed:?}");
    }

    // By trace id, in either case: that trace, no others.
    let a = f
        .httpd
        .get(
            &format!("/api/journey?trace={}", hex(&TRACE_B).to_uppercase()),
            &f.auth(),
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json["trace_id"], hex(&TRACE_B));
    assert_eq!(a.json["traces"], json!([]));
    assert_eq!(stages(&a.json), ["ingress", "local"]);
    assert_eq!(a.json["spans"][1]["wait_ms"], 90.0);

    // A bearer token reads it too.
    let token = f.httpd.token_add("root", &[]);
    let a = f
        .httpd
        .get(&format!("/api/journey?queue={q}"), &Auth::Bearer(token))
        .await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test]
async fn the_journey_api_refuses_bad_lookups_by_name_and_says_what_to_check_when_nothing_is_found()
{
    let f = Fixture::new("").await;
    let q = f.queue_row().await;
    f.traces(q).await;
    let cases = [
        (
            "/api/journey",
            "no lookup: give one of queue, message_id, trace",
        ),
        (
            "/api/journey?queue=abc",
            "queue: \"abc\" is not a queue row id",
        ),
        (
            "/api/journey?queue=-4",
            "queue: \"-4\" is not a queue row id",
        ),
        ("/api/journey?trace=xyz", "trace: \"xyz\" is not a trace id"),
        (
            "/api/journey?trace=00000000000000000000000000000000",
            "is all zeros",
        ),
        (
            "/api/journey?message_id=%3C%3E",
            "message_id: \"<>\" holds no Message-ID",
        ),
        ("/api/journey?queue=", "queue: \"\" is not a queue row id"),
        (
            "/api/journey?queue=1&trace=a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1",
            "give one of queue, message_id, trace at a time",
        ),
        ("/api/journey?row=1", "unknown parameter \"row\""),
    ];
    for (path, want) in cases {
        let a = f.httpd.get(path, &f.auth()).await;
        assert_eq!(a.status, 400, "{path}: {a:?}");
        assert!(error_of(&a).contains(want), "{path}: {a:?}");
    }
    for (path, want) in [
        ("/api/journey?queue=999999", "no spans for queue row 999999"),
        (
            "/api/journey?message_id=nobody%40example.org",
            "no spans for Message-ID <nobody@example.org>",
        ),
        (
            "/api/journey?trace=c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3",
            "no spans for trace c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3",
        ),
    ] {
        let a = f.httpd.get(path, &f.auth()).await;
        assert_eq!(a.status, 404, "{path}: {a:?}");
        let e = error_of(&a);
        assert!(e.contains(want), "{path}: {e}");
        assert!(
            e.contains("pepsi-telemetry") && e.contains("telemetry client"),
            "it says what to check: {e}"
        );
    }

    // Without a credential: 401, and the page is the login form with nothing of the trace.
    let a = f
        .httpd
        .get(&format!("/api/journey?queue={q}"), &Auth::None)
        .await;
    assert_eq!(a.status, 401, "{a:?}");
    assert!(error_of(&a).contains("authentication required"));
    let page = f
        .httpd
        .get(&format!("/journey?queue={q}"), &Auth::None)
        .await;
    assert_eq!(page.status, 401);
    assert!(page.text.contains("id=\"login-form\""), "{}", page.text);
    assert!(
        !page.text.contains("journey-1@example.org"),
        "{}",
        page.text
    );
    let forged = f
        .httpd
        .get(
            &format!("/journey?queue={q}"),
            &Auth::RawCookie(format!("pepsi_session={}", "c".repeat(64))),
        )
        .await;
    assert_eq!(forged.status, 401);

    // The page says the same as the API, as HTML.
    let page = f.httpd.get("/journey", &f.auth()).await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("name=\"message_id\""), "{}", page.text);
    let page = f.httpd.get("/journey?queue=abc", &f.auth()).await;
    assert_eq!(page.status, 400);
    assert!(
        page.text
            .contains("queue: &quot;abc&quot; is not a queue row id"),
        "{}",
        page.text
    );
    let page = f.httpd.get("/journey?queue=999999", &f.auth()).await;
    assert_eq!(page.status, 404);
    assert!(
        page.text.contains("no spans for queue row 999999")
            && page.text.contains("pepsi-telemetry"),
        "{}",
        page.text
    );
    // Empty fields of the search forms are no lookup.
    let page = f.httpd.get("/journey?trace=", &f.auth()).await;
    assert_eq!(page.status, 200);
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
}

// ----- hostile span text -------------------------------------------------------------------

#[tokio::test]
async fn hostile_message_ids_and_stage_names_in_spans_are_escaped_on_the_journey_page() {
    let f = Fixture::new("").await;
    let trace = [0xe7; 16];
    let evil_id = "<x\"><script>alert('mid')</script>@evil.example>";
    let evil_stage = "<img src=x onerror=alert(1)>";
    let evil_host = "<b onmouseover=alert(2)>mx</b>";
    for (id, stage, outcome, start) in [
        (1, None, "accepted", 0),
        (2, Some(evil_stage), "interrupted", 10),
        (3, Some(evil_stage), "finished", 30),
    ] {
        f.insert(Span {
            trace,
            id,
            parent: None,
            name: "</td><script>alert(3)</script>",
            host: evil_host,
            program: "\"><svg onload=alert(4)>",
            stage,
            queue: Some(77),
            message_id: Some(evil_id),
            outcome,
            start,
            end: start + 5,
            extra: json!({"pepsi.fused_into": "<i>x</i>"}),
        })
        .await;
    }
    // Found by the hostile Message-ID itself, with its brackets.
    let page = f
        .httpd
        .get(
            &format!("/journey?message_id={}", encode(evil_id)),
            &f.auth(),
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.text);
    let html = &page.text;
    for raw in [
        "<script>alert",
        "<img src=x",
        "<b onmouseover",
        "<svg onload",
        "<i>x</i>",
        "</td><script>",
    ] {
        assert!(!html.contains(raw), "{raw} unescaped in {html}");
    }
    for escaped in [
        "&lt;img src=x onerror=alert(1)&gt;",
        "&lt;script&gt;alert('mid')&lt;/script&gt;",
        "&lt;b onmouseover=alert(2)&gt;mx&lt;/b&gt;",
    ] {
        assert!(html.contains(escaped), "{escaped} not in {html}");
    }
    // The same through the API, as plain JSON strings.
    let a = f
        .httpd
        .get(&format!("/api/journey?trace={}", hex(&trace)), &f.auth())
        .await;
    assert_eq!(a.json["spans"][1]["stage"], evil_stage);
    assert_eq!(a.json["spans"][1]["message_id"], evil_id);

    // In a browser the text shows as text: no element of it exists, our one script runs.
    let b = login(&f, &format!("/journey?trace={}", hex(&trace))).await;
    b.until(
        "the timeline",
        "return document.querySelectorAll('#journey-spans tbody tr').length === 3",
    )
    .await;
    assert_eq!(
        b.js("return document.querySelectorAll('[onerror], [onmouseover], [onload], main img, main i, main script, td svg:not(.bar)').length")
            .await,
        0
    );
    assert_eq!(b.js("return document.scripts.length").await, 1);
    assert_eq!(
        b.js("return document.querySelector('#journey-spans tbody tr:nth-child(2) .stage-name').textContent")
            .await,
        evil_stage
    );
}

/// A browser logged in as root at `path` (the login form stands in for the page, then
/// reloads it).
async fn login(f: &Fixture, path: &str) -> Browser {
    let b = Browser::start().await;
    b.go(&f.httpd.url(path)).await;
    b.until(
        "the login form",
        "return document.getElementById('login-form') !== null",
    )
    .await;
    b.type_into("#login-name", "root").await;
    b.type_into("#login-password", &f.password).await;
    b.click("#login-submit").await;
    b.until(
        "the journey page",
        "return document.getElementById('journey') !== null",
    )
    .await;
    b
}

// ----- the page in Chromium ----------------------------------------------------------------

#[tokio::test]
async fn the_journey_page_draws_every_span_in_order_marks_the_retries_and_the_interrupted_pass_in_chromium()
 {
    let f = Fixture::new("").await;
    let q = f.queue_row().await;
    f.traces(q).await;
    let b = login(&f, &format!("/journey?queue={q}")).await;

    let shown = b
        .until(
            "the timeline",
            "const rows = document.querySelectorAll('#journey-spans tbody tr'); \
             return rows.length ? Array.from(rows).map(tr => tr.querySelector('.stage-name').textContent) : null;",
        )
        .await;
    assert_eq!(
        shown,
        json!([
            "ingress", "init", "route", "dkim", "local", "relay", "relay", "relay"
        ])
    );
    assert_eq!(
        b.js("return document.getElementById('trace-id').textContent")
            .await,
        hex(&TRACE_A)
    );
    // The interrupted pass: its row marked and its outcome a badge.
    let interrupted = b
        .js("return Array.from(document.querySelectorAll('#journey-spans tr.interrupted')).map(tr => [tr.dataset.stage, tr.querySelector('td.outcome .badge.interrupted').textContent])")
        .await;
    assert_eq!(interrupted, json!([["relay", "interrupted"]]));
    // The two later passes of relay are retries 1 and 2; the others are not.
    let retries = b
        .js("return Array.from(document.querySelectorAll('#journey-spans tr.retry')).map(tr => tr.querySelector('.badge.retry').textContent)")
        .await;
    assert_eq!(retries, json!(["retry 1", "retry 2"]));
    assert_eq!(
        b.js("return document.querySelector('#journey-spans tbody tr:nth-child(4) td.stage').innerText")
            .await,
        "dkim fused into route"
    );
    // Every span has its bar on the axis, the last one ending at its right end.
    let bars = b
        .js("return Array.from(document.querySelectorAll('#journey-spans svg.bar rect.pass')).map(r => [Number(r.getAttribute('x')), Number(r.getAttribute('width'))])")
        .await;
    let bars = bars.as_array().unwrap();
    assert_eq!(bars.len(), 8);
    let last = &bars[7];
    assert!(
        (last[0].as_f64().unwrap() + last[1].as_f64().unwrap() - 1000.0).abs() < 0.1,
        "{bars:?}"
    );
    assert_eq!(
        b.js("return document.querySelectorAll('#journey-spans tr.interrupted rect.pass.interrupted').length")
            .await,
        1
    );
    // The waits as the page writes them: relay's retry waited 400 ms after the interrupted
    // pass, the last one 3.30 s, 250 ms of it after the dispatcher's claim.
    let waited = b
        .js("return document.querySelector('#journey-spans tbody tr:nth-child(8) td:nth-child(9)').innerText")
        .await;
    let waited = waited.as_str().unwrap();
    assert!(
        waited.contains("3.30 s") && waited.contains("dispatch 250 ms"),
        "{waited}"
    );

    // The picture, kept beside the docs when asked (PEPSI_UPDATE_DOCS=1).
    let png = b.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("journey.png"),
        &png,
    )
    .unwrap();
    if std::env::var_os("PEPSI_UPDATE_DOCS").is_some() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/docs/journey.png"),
            &png,
        )
        .unwrap();
    }

    // By Message-ID: the newest trace, and a link to the older one, which opens it.
    b.go(&f.httpd.url(&format!(
        "/journey?message_id={}",
        encode("journey-1@example.org")
    )))
    .await;
    b.until(
        "the other trace",
        &format!(
            "return document.querySelector('#other-traces a[href=\"/journey?trace={}\"]') !== null",
            hex(&TRACE_B)
        ),
    )
    .await;
    assert_eq!(
        b.js("return document.getElementById('search-message-id').value")
            .await,
        "journey-1@example.org"
    );
    b.click("#other-traces a").await;
    b.until(
        "trace B",
        &format!(
            "const t = document.getElementById('trace-id'); return t && t.textContent === '{}';",
            hex(&TRACE_B)
        ),
    )
    .await;

    // The pipeline page links the row, its detail and its mail log entry to the journey.
    b.go(&f.httpd.url("/pipeline")).await;
    b.until(
        "the graph",
        "return document.getElementById('pipeline-graph') !== null",
    )
    .await;
    b.click("#stage-relay").await;
    let href = format!("/journey?queue={q}");
    b.until(
        "the row's journey link",
        &format!(
            "return document.querySelector('#rows-table tr.row[data-id=\"{q}\"] a.journey[href=\"{href}\"]') !== null"
        ),
    )
    .await;
    b.click(&format!(
        "#rows-table tr.row[data-id=\"{q}\"] td:first-child"
    ))
    .await;
    b.until(
        "the mail log's journey link",
        &format!(
            "return document.querySelector('#detail-mail-log a.journey[href=\"{href}\"]') !== null"
        ),
    )
    .await;
    assert_eq!(
        b.js("return document.getElementById('detail-journey').getAttribute('href')")
            .await,
        href
    );
    b.click("#detail-journey").await;
    b.until(
        "trace A again",
        &format!(
            "const t = document.getElementById('trace-id'); return t && t.textContent === '{}';",
            hex(&TRACE_A)
        ),
    )
    .await;
}

// ----- the pipeline's pass times -------------------------------------------------------------

#[tokio::test]
async fn the_pipeline_reports_pass_time_percentiles_per_stage_over_latency_window() {
    let f = Fixture::new("LATENCY_WINDOW = 30m").await;
    let trace = |n: u8| [n; 16];
    // local: ten passes of 10, 20, ... 100 ms, ended in the window.
    for i in 1..=10u8 {
        let start = i64::from(i) * 1000;
        f.insert(Span {
            trace: trace(i),
            id: 1,
            parent: None,
            name: "pass",
            host: "mx1",
            program: "pepsi-stage-relay-to-maildir",
            stage: Some("local"),
            queue: Some(i64::from(i)),
            message_id: None,
            outcome: if i % 2 == 0 { "finished" } else { "deferred" },
            start,
            end: start + i64::from(i) * 10,
            extra: json!({}),
        })
        .await;
    }
    let more: [(u8, &str, &str, i64, i64); 5] = [
        // An interrupted local pass: counted apart, not in the percentiles.
        (11, "local", "interrupted", 0, 50_000),
        // A local pass that ended before the window (30 minutes; t0 is 10 minutes ago).
        (12, "local", "finished", -3_600_000, -1_800_000),
        // route: one pass of 7 ms; relay: only an interrupted one.
        (13, "route", "advanced", 0, 7),
        (14, "relay", "interrupted", 0, 900),
        // A stage the graph does not have.
        (15, "ghost", "finished", 0, 5),
    ];
    for (n, stage, outcome, start, end) in more {
        f.insert(Span {
            trace: trace(n),
            id: 1,
            parent: None,
            name: "pass",
            host: "mx1",
            program: "pepsi-x",
            stage: Some(stage),
            queue: Some(i64::from(n)),
            message_id: None,
            outcome,
            start,
            end,
            extra: json!({}),
        })
        .await;
    }
    // The ingress's span has no stage and counts nowhere.
    f.insert(Span {
        trace: trace(16),
        id: 1,
        parent: None,
        name: "smtp",
        host: "mx1",
        program: "pepsi-ingress",
        stage: None,
        queue: Some(16),
        message_id: None,
        outcome: "accepted",
        start: 0,
        end: 60_000,
        extra: json!({}),
    })
    .await;

    let a = f.httpd.get("/api/pipeline", &f.auth()).await;
    assert_eq!(a.status, 200, "{a:?}");
    let latency = &a.json["latency"];
    assert_eq!(latency["window_seconds"], 1800);
    assert_eq!(latency["error"], Value::Null);
    let by_stage: Vec<Value> = latency["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let round = |v: &Value| v.as_f64().map(|x| (x * 1000.0).round() / 1000.0);
            json!([
                s["stage"],
                s["passes"],
                s["interrupted"],
                round(&s["p50_ms"]),
                round(&s["p90_ms"]),
                round(&s["p99_ms"])
            ])
        })
        .collect();
    // In the graph's order; percentile_cont interpolates: p50 of 10..100 is 55, p90 91,
    // p99 99.1.
    assert_eq!(
        by_stage,
        [
            json!(["route", 1, 0, 7.0, 7.0, 7.0]),
            json!(["local", 10, 1, 55.0, 91.0, 99.1]),
            json!(["relay", 0, 1, null, null, null]),
        ],
        "{latency:#}"
    );

    // The page shows the same table.
    let page = f.httpd.get("/pipeline", &f.auth()).await;
    assert_eq!(page.status, 200);
    let html = &page.text;
    for want in [
        "id=\"latency-table\"",
        "<span id=\"latency-window\">30m</span>",
        "<tr data-stage=\"local\"><td>local</td><td>10</td><td>55.0 ms</td><td>91.0 ms</td><td>99.1 ms</td><td>1</td></tr>",
        "<tr data-stage=\"route\"><td>route</td><td>1</td><td>7.00 ms</td><td>7.00 ms</td><td>7.00 ms</td><td>0</td></tr>",
    ] {
        assert!(html.contains(want), "{want} not in {html}");
    }
    assert!(!html.contains("data-stage=\"ghost\""), "{html}");
}

#[tokio::test]
async fn the_pass_time_query_reads_only_the_window_through_an_index() {
    let f = Fixture::new("").await;
    // 20000 passes: the newest 400 within the last seven minutes (route and local by
    // turns, 5 ms each), the others two hours old and more.
    sqlx::query(
        "INSERT INTO pepsi.telemetry_span (trace_id, span_id, name, stage, outcome, start_time, end_time) \
         SELECT decode(lpad(to_hex(n), 32, '0'), 'hex'), decode('0000000000000001', 'hex'), 'pass', \
                CASE WHEN n <= 400 THEN (ARRAY['route', 'local'])[1 + n % 2] \
                     ELSE (ARRAY['init', 'route', 'local', 'relay'])[1 + n % 4] END, \
                'advanced', t, t + interval '5 ms' \
         FROM generate_series(1, 20000) AS n, \
              LATERAL (SELECT now() - CASE WHEN n <= 400 THEN n * interval '1 second' \
                                          ELSE interval '2 hours' + n * interval '1 second' END AS t) AS at",
    )
    .execute(&f.site.db.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE pepsi.telemetry_span")
        .execute(&f.site.db.pool)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {}",
        pepsi_httpd::latency::PASS_TIMES_SQL
    )))
    .bind(vec!["init", "route", "dkim", "relay", "local"])
    .bind(3600.0f64)
    .fetch_all(&f.site.db.pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    // Bounded by the window on an index: one range of telemetry_span_stage_idx per stage,
    // or telemetry_span_end_idx when the planner finds the window alone narrow enough;
    // never the whole table.
    assert!(
        !plan.contains("Seq Scan")
            && plan
                .lines()
                .any(|l| l.contains("Index Cond") && l.contains("end_time >")),
        "{plan}"
    );
    // The figures come from that query: 200 passes of route and local each in the window.
    let a = f.httpd.get("/api/pipeline", &f.auth()).await;
    let figures: Vec<Value> = a.json["latency"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!([s["stage"], s["passes"], s["p50_ms"], s["p99_ms"]]))
        .collect();
    assert_eq!(
        figures,
        [
            json!(["route", 200, 5.0, 5.0]),
            json!(["local", 200, 5.0, 5.0])
        ],
        "{:#}",
        a.json["latency"]
    );
}
