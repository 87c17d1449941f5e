//! migadu_counters over real HTTP against a private redis-server: the middleware chain, the
//! counting rules, the key format, crossings and notifications, `/counters` and the counting log.

use std::time::Duration;

use migadu_counters_testkit::{
    Daemon, DaemonSetup, HttpTarget, RedisServer, Resp, TEST_TOKEN, http, wait_until,
};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_migadu_counters");
const ROWS: &[(&str, &str)] = &[
    (
        "example.com",
        "1234|A/i=500,A/o=3,D/i=1000,D/o=3,O/i=5000,O/o=3,alice@/o=7",
    ),
    ("other.org", "99|D/i=10"),
];

fn today() -> String {
    chrono::Utc::now()
        .date_naive()
        .format("%Y-%m-%d")
        .to_string()
}

fn key(level: &str, id: &str, flow: &str) -> String {
    format!("cnt/{level}/{id}/d/{}/{flow}", today())
}

fn start(redis: &RedisServer, top: &str, sections: &str) -> Daemon {
    Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: ROWS,
            top,
            sections,
            ..Default::default()
        },
    )
}

fn dbsize(r: &RedisServer) -> i64 {
    r.cmd(&["DBSIZE"]).int().unwrap()
}

/// Waits until a key holds `want` (counting runs after the 202).
fn wait_key(r: &RedisServer, key: &str, want: i64) {
    let ok = wait_until(Duration::from_secs(20), || r.get(key) == Some(want));
    assert!(ok, "{key} is {:?}, expected {want}", r.get(key));
}

fn wait_log(d: &Daemon, needle: &str) {
    let ok = wait_until(Duration::from_secs(20), || {
        d.counting_log().contains(needle)
    });
    assert!(ok, "counting log lacks {needle:?}:\n{}", d.counting_log());
}

#[test]
fn middleware_chain_answers_each_step_in_order_and_never_touches_redis() {
    let redis = RedisServer::start();
    let d = start(&redis, "allowed_cidrs = [\"127.0.0.0/8\"]", "");
    let auth = format!("Bearer {TEST_TOKEN}");
    let ok_body = br#"{"trace_id":"t1","auth_user":"x@example.com","recipient":"y@gmail.com"}"#;
    let big = vec![b' '; 65 * 1024];
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        &'a [u8],
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        // step 2, method, ahead of a bad token
        (
            "GET",
            "/out",
            "out",
            vec![],
            b"",
            405,
            "method GET not allowed",
        ),
        (
            "POST",
            "/counters",
            "counters",
            vec![],
            b"",
            405,
            "method POST not allowed",
        ),
        // step 3, body size, ahead of a bad token
        (
            "POST",
            "/out",
            "out",
            vec![("Content-Type", "application/json")],
            &big,
            413,
            "body larger than 65536 bytes",
        ),
        // step 4, bearer token
        (
            "POST",
            "/out",
            "out",
            vec![("Content-Type", "application/json")],
            ok_body,
            401,
            "missing bearer token",
        ),
        (
            "POST",
            "/out",
            "out",
            vec![
                ("Authorization", "Bearer nope"),
                ("Content-Type", "application/json"),
            ],
            ok_body,
            401,
            "wrong bearer token",
        ),
        (
            "POST",
            "/out",
            "out",
            vec![
                ("Authorization", "Basic dGVzdC10b2tlbg=="),
                ("Content-Type", "application/json"),
            ],
            ok_body,
            401,
            "missing bearer token",
        ),
        (
            "GET",
            "/counters?address=x@example.com",
            "counters",
            vec![],
            b"",
            401,
            "missing bearer token",
        ),
        // step 6, content type
        (
            "POST",
            "/out",
            "out",
            vec![("Authorization", &auth), ("Content-Type", "text/plain")],
            ok_body,
            415,
            "content type \"text/plain\" is not application/json",
        ),
        (
            "POST",
            "/out",
            "out",
            vec![("Authorization", &auth)],
            ok_body,
            415,
            "content type \"\" is not application/json",
        ),
        // step 7, one JSON object
        (
            "POST",
            "/out",
            "out",
            vec![
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            b"{\"a\":",
            400,
            "invalid JSON",
        ),
        (
            "POST",
            "/out",
            "out",
            vec![
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            b"{} {}",
            400,
            "invalid JSON",
        ),
        (
            "POST",
            "/out",
            "out",
            vec![
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            b"[1]",
            400,
            "invalid JSON: expected one object",
        ),
        // step 8, field validation naming the field
        (
            "POST",
            "/in",
            "in",
            vec![
                ("Authorization", &auth),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            br#"{"trace_id":"t\nforged"}"#,
            400,
            "recipient: missing",
        ),
        (
            "POST",
            "/out",
            "out",
            vec![
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            br#"{"recipient":"y@gmail.com","auth_user":"a b@c"}"#,
            400,
            "auth_user: invalid e-mail address",
        ),
        (
            "GET",
            "/counters?date=2026-01-01",
            "counters",
            vec![("Authorization", &auth)],
            b"",
            400,
            "address, domain: exactly one is required",
        ),
    ];
    for (method, path, route, headers, body, status, reason) in &cases {
        let before = d.metric(&format!(
            "migadu_counters_requests_total{{route=\"{route}\",status=\"{status}\"}}"
        ));
        let r = http(&d.api, method, path, headers, body).unwrap();
        assert_eq!(r.status, *status, "{method} {path}: {}", r.body);
        let error = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(error.starts_with(reason), "{method} {path}: {error}");
        match status {
            405 => assert_eq!(
                r.header("Allow"),
                Some(if *route == "counters" { "GET" } else { "POST" })
            ),
            401 => assert_eq!(r.header("WWW-Authenticate"), Some("Bearer")),
            _ => {}
        }
        let after = d.metric(&format!(
            "migadu_counters_requests_total{{route=\"{route}\",status=\"{status}\"}}"
        ));
        assert_eq!(after, before + 1.0, "{method} {path}: requests_total");
        assert_eq!(dbsize(&redis), 0, "{method} {path} touched redis");
    }
    // unknown fields are accepted, and that request is counted
    let r = d.post("/out", r#"{"trace_id":"t2","auth_user":"x@example.com","recipient":"y@gmail.com","future_field":{"a":1}}"#);
    assert_eq!((r.status, r.json()), (202, json!({"accepted": true})));
    wait_key(&redis, &key("A", "x@example.com", "o"), 1);
    // rejections are logged at warn with route, peer, status, reason and a sanitised trace id
    let log = d.app_log();
    let line = log
        .lines()
        .find(|l| l.contains("recipient: missing"))
        .expect("rejection logged");
    for part in [
        "WARN",
        "route=\"in\"",
        "peer=127.0.0.1:",
        "status=400",
        "trace_id=tforged",
    ] {
        assert!(line.contains(part), "{part} not in {line}");
    }
    assert!(
        !log.contains("\nforged"),
        "trace id reached the log unsanitised"
    );

    // step 5, source address: a peer outside allowed_cidrs, even with X-Forwarded-For
    let d2 = start(&redis, "allowed_cidrs = [\"10.0.0.0/8\"]", "");
    let r = http(
        &d2.api,
        "POST",
        "/out",
        &[
            ("Authorization", &auth),
            ("Content-Type", "text/plain"),
            ("X-Forwarded-For", "10.0.0.1"),
        ],
        ok_body,
    )
    .unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(
        d2.metric("migadu_counters_requests_total{route=\"out\",status=\"403\"}"),
        1.0
    );
}

#[test]
fn handler_timeout_answers_503_while_redis_is_blocked() {
    let redis = RedisServer::start();
    // redis stays silent for 3 s: longer than handler_timeout, shorter than the redis timeout
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: ROWS,
            top: "handler_timeout = 1",
            redis_extra: "timeout_ms = 10000",
            ..Default::default()
        },
    );
    assert_eq!(d.get_counters("address=x@example.com").status, 200);
    redis.cmd(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let r = d.get_counters("address=x@example.com");
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"], "handler timeout");
    assert_eq!(
        d.metric("migadu_counters_requests_total{route=\"counters\",status=\"503\"}"),
        1.0
    );
}

#[test]
fn out_example_counts_sender_and_hosted_recipient_in_db_0_with_ttl() {
    let redis = RedisServer::start();
    let d = start(&redis, "", "");
    for (i, rcpt) in ["y@example.com", "s@gmail.com"].iter().enumerate() {
        let body = json!({"trace_id": format!("ex{i}"), "auth_user": "x@example.com", "mail_from": "x@example.com", "recipient": rcpt});
        assert_eq!(d.post("/out", &body.to_string()).status, 202);
        // one at a time: the log block of ex0 below quotes the count its own
        // increment produced, which a concurrent ex1 could otherwise bump first
        wait_key(&redis, &key("A", "x@example.com", "o"), i as i64 + 1);
    }
    wait_key(&redis, &key("A", "x@example.com", "o"), 2);
    wait_key(&redis, &key("D", "example.com", "o"), 2);
    wait_key(&redis, &key("O", "1234", "o"), 2);
    wait_key(&redis, &key("A", "y@example.com", "i"), 1);
    wait_key(&redis, &key("D", "example.com", "i"), 1);
    wait_key(&redis, &key("O", "1234", "i"), 1);
    assert_eq!(dbsize(&redis), 6, "gmail.com must not be counted");
    let ttl = redis
        .cmd(&["TTL", &key("A", "x@example.com", "o")])
        .int()
        .unwrap();
    assert!(ttl > 2_678_000 && ttl <= 2_678_400, "ttl {ttl}");
    redis.cmd(&["SELECT", "1"]);
    assert_eq!(
        redis
            .cmd(&[
                "EVAL",
                "redis.call('SELECT', 1) return redis.call('DBSIZE')",
                "0"
            ])
            .int(),
        Some(0)
    );
    assert_eq!(
        d.metric("migadu_counters_increments_total{level=\"A\",flow=\"o\"}"),
        2.0
    );
    assert_eq!(
        d.metric("migadu_counters_increments_total{level=\"O\",flow=\"i\"}"),
        1.0
    );

    // /in: hosted recipient counted, unknown domain, junk and exempt skipped
    assert_eq!(
        d.post(
            "/in",
            r#"{"trace_id":"in1","mail_from":"s@gmail.com","recipient":"Y@Example.COM"}"#
        )
        .status,
        202
    );
    wait_key(&redis, &key("A", "y@example.com", "i"), 2);
    assert_eq!(
        d.post(
            "/in",
            r#"{"trace_id":"in2","mail_from":"s@gmail.com","recipient":"z@gmail.com"}"#
        )
        .status,
        202
    );
    wait_log(
        &d,
        "<in2> in; recipient domain not in domains db: gmail.com (not counted)",
    );
    assert_eq!(d.post("/in", r#"{"trace_id":"in3","mail_from":"s@gmail.com","recipient":"y@example.com","junk":true}"#).status, 202);
    wait_log(&d, "<in3> in; skipped: junk");
    assert_eq!(
        d.post(
            "/in",
            r#"{"trace_id":"in4","mail_from":"support@migadu.com","recipient":"y@example.com"}"#
        )
        .status,
        202
    );
    wait_log(&d, "<in4> in; skipped: exempt address support@migadu.com");
    assert_eq!(
        d.post(
            "/out",
            r#"{"trace_id":"o5","auth_user":"x@gmail.com","recipient":"y@other.org"}"#
        )
        .status,
        202
    );
    wait_log(
        &d,
        "<o5> out; sender domain not in domains db: gmail.com (not counted)",
    );
    wait_key(&redis, &key("D", "other.org", "i"), 1);
    // a login with a suffix counts under the base address
    assert_eq!(
        d.post(
            "/out",
            r#"{"trace_id":"o6","auth_user":"x@example.com@imap","recipient":"s@gmail.com"}"#
        )
        .status,
        202
    );
    wait_key(&redis, &key("A", "x@example.com", "o"), 3);
    assert_eq!(
        redis.get(&key("A", "y@example.com", "i")),
        Some(2),
        "junk and exempt were counted"
    );

    // the counting log: one block per request, tagged with the trace id
    let log = d.counting_log();
    let block: Vec<&str> = log.lines().filter(|l| l.contains("<ex0>")).collect();
    let msgs: Vec<&str> = block
        .iter()
        .map(|l| l.split_once("<ex0> ").unwrap().1)
        .collect();
    let t = today();
    assert_eq!(msgs, vec![
        "out; request auth_user=x@example.com recipient=y@example.com mail_from=x@example.com".to_string(),
        "out; local domain: example.com account_id=1234".into(),
        "out; domain: example.com limits_map={A/i=500, A/o=3, alice@/o=7, D/i=1000, D/o=3, O/i=5000, O/o=3}".into(),
        format!("out; determined limit (level=[A] flow=[o] key=[cnt/A/x@example.com/d/{t}/o]) => 3"),
        format!("out; determined limit (level=[D] flow=[o] key=[cnt/D/example.com/d/{t}/o]) => 3"),
        format!("out; determined limit (level=[O] flow=[o] key=[cnt/O/1234/d/{t}/o]) => 3"),
        "out; local domain: example.com account_id=1234".into(),
        "out; domain: example.com limits_map={A/i=500, A/o=3, alice@/o=7, D/i=1000, D/o=3, O/i=5000, O/o=3}".into(),
        format!("out; determined limit (level=[A] flow=[i] key=[cnt/A/y@example.com/d/{t}/i]) => 500"),
        format!("out; determined limit (level=[D] flow=[i] key=[cnt/D/example.com/d/{t}/i]) => 1000"),
        format!("out; determined limit (level=[O] flow=[i] key=[cnt/O/1234/d/{t}/i]) => 5000"),
        "out; tracked address counters for x@example.com => count=1 limit=3 reached=false".into(),
        "out; tracked domain counters for example.com => count=1 limit=3 reached=false".into(),
        "out; tracked account counters for 1234 => count=1 limit=3 reached=false".into(),
        "out; tracked address counters for y@example.com => count=1 limit=500 reached=false".into(),
        "out; tracked domain counters for example.com => count=1 limit=1000 reached=false".into(),
        "out; tracked account counters for 1234 => count=1 limit=5000 reached=false".into(),
    ]);
    let ts = block[0].get(..23).unwrap();
    assert!(
        chrono::NaiveDateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S%.3f").is_ok(),
        "{ts}"
    );
}

#[test]
fn crossing_notifies_once_per_level_and_again_after_a_reset() {
    let redis = RedisServer::start();
    let target = HttpTarget::start_blocking(200);
    let tpl = "level=$LEVEL&id=$ID&flow=$FLOW&period=$PERIOD&by=$ADDRESS&count=$COUNT";
    let sections = format!(
        "[notify]\norg_url = \"{b}/org?{tpl}\"\naddress_url = \"{b}/addr?{tpl}\"\ndomain_url = \"\"\nuser = \"web\"\npassword = \"pw\"\n",
        b = target.base()
    );
    let d = start(&redis, "", &sections);
    let send = |i: u32| {
        let body = json!({"trace_id": format!("c{i}"), "auth_user": "x@example.com", "recipient": "s@gmail.com"});
        assert_eq!(d.post("/out", &body.to_string()).status, 202);
        wait_key(&redis, &key("O", "1234", "o"), i64::from(i));
    };
    for i in 1..=4 {
        send(i);
    }
    assert!(wait_until(Duration::from_secs(20), || target
        .requests()
        .len()
        >= 2));
    wait_log(&d, "<c3> out; sent limit exceeded notification to url");
    let mut got: Vec<(String, Option<String>)> = target
        .requests()
        .into_iter()
        .map(|r| (r.path_and_query, r.authorization))
        .collect();
    got.sort();
    let auth = Some("Basic d2ViOnB3".to_string());
    assert_eq!(
        got,
        vec![
            (
                "/addr?level=A&id=x%40example.com&flow=o&period=d&by=x%40example.com&count=3"
                    .to_string(),
                auth.clone()
            ),
            (
                "/org?level=O&id=1234&flow=o&period=d&by=x%40example.com&count=3".to_string(),
                auth.clone()
            ),
        ]
    );
    // D crossed too: counted, not sent, since domain_url is empty
    assert_eq!(
        d.metric("migadu_counters_limit_reached_total{level=\"D\",flow=\"o\"}"),
        1.0
    );
    assert_eq!(
        d.metric("migadu_counters_notifications_total{level=\"A\",result=\"sent\"}"),
        1.0
    );
    let log = d.counting_log();
    assert!(
        log.contains("<c3> out; tracked account counters for 1234 => count=3 limit=3 reached=true")
    );
    assert!(log.contains("<c3> out; limit reached (level=[O] id=[1234] flow=[o] by=[x@example.com]) => notifying org_url"));
    assert!(log.contains("<c3> out; limit reached (level=[D] id=[example.com] flow=[o] by=[x@example.com]) => domain_url empty (not notified)"));
    assert!(
        log.contains(
            "<c4> out; tracked account counters for 1234 => count=4 limit=3 reached=false"
        )
    );

    // the web app resets the address: the next crossing notifies again
    redis.cmd(&["DEL", &key("A", "x@example.com", "o")]);
    for i in 5..=7 {
        send(i);
    }
    wait_log(&d, "<c7> out; sent limit exceeded notification to url");
    let again: Vec<String> = target
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    assert_eq!(again.len(), 3, "{again:?}");
    assert!(again.contains(
        &"/addr?level=A&id=x%40example.com&flow=o&period=d&by=x%40example.com&count=3".to_string()
    ));
}

/// Guards the service without a counting log (`counting_output = "off"`), which builds no log
/// events at all: every request is still counted, each level's crossing still notifies once
/// and is counted in the metrics, and no log file appears.
#[test]
fn with_the_counting_log_off_crossings_still_notify_once_and_count() {
    use migadu_counters_testkit::{TempDir, free_port, write_cdb};
    let redis = RedisServer::start();
    let target = HttpTarget::start_blocking(200);
    let dir = TempDir::new("log-off");
    write_cdb(&dir.path().join("domains.cdb"), ROWS);
    let (api, admin) = (free_port(), free_port());
    let tpl = "level=$LEVEL&id=$ID&flow=$FLOW&period=$PERIOD&by=$ADDRESS&count=$COUNT";
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "addr = \"127.0.0.1:{api}\"\nadmin_addr = \"127.0.0.1:{admin}\"\n\
             auth_token = \"{TEST_TOKEN}\"\ndomains_cdb = \"{cdb}\"\nworkers = 4\n\n\
             [logging]\noutput = \"{app}\"\ncounting_output = \"off\"\n\n\
             [redis]\nwrite_addr = \"{redis}\"\ntimeout_ms = 1000\n\n\
             [notify]\norg_url = \"{b}/org?{tpl}\"\naddress_url = \"{b}/addr?{tpl}\"\n",
            cdb = dir.path().join("domains.cdb").display(),
            app = dir.path().join("app.log").display(),
            redis = redis.addr(),
            b = target.base(),
        ),
    )
    .unwrap();
    let d = Daemon::start_with_config(
        env!("CARGO_BIN_EXE_migadu_counters"),
        dir,
        config,
        api,
        admin,
    );
    // x@example.com to y@example.com: out on A/D/O (limits 3) and in on A/D/O (500/1000/5000)
    for i in 1..=4 {
        let body = json!({"trace_id": format!("q{i}"), "auth_user": "x@example.com",
            "mail_from": "x@example.com", "recipient": "y@example.com"});
        assert_eq!(d.post("/out", &body.to_string()).status, 202);
    }
    wait_key(&redis, &key("O", "1234", "o"), 4);
    wait_key(&redis, &key("A", "y@example.com", "i"), 4);
    assert!(wait_until(Duration::from_secs(20), || target
        .requests()
        .len()
        >= 2));
    let mut got: Vec<String> = target
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "/addr?level=A&id=x%40example.com&flow=o&period=d&by=x%40example.com&count=3",
            "/org?level=O&id=1234&flow=o&period=d&by=x%40example.com&count=3",
        ]
    );
    for (sample, want) in [
        (
            "migadu_counters_increments_total{level=\"A\",flow=\"o\"}",
            4.0,
        ),
        (
            "migadu_counters_increments_total{level=\"O\",flow=\"i\"}",
            4.0,
        ),
        (
            "migadu_counters_limit_reached_total{level=\"D\",flow=\"o\"}",
            1.0,
        ),
        (
            "migadu_counters_limit_reached_total{level=\"O\",flow=\"o\"}",
            1.0,
        ),
        (
            "migadu_counters_requests_total{route=\"out\",status=\"202\"}",
            4.0,
        ),
    ] {
        assert_eq!(d.metric(sample), want, "{sample}");
    }
    assert!(wait_until(Duration::from_secs(20), || d.metric(
        "migadu_counters_notifications_total{level=\"O\",result=\"sent\"}"
    ) == 1.0));
    assert_eq!(d.counting_log(), "");
    assert_eq!(target.requests().len(), 2);
}

#[test]
fn eight_tasks_times_a_thousand_increments_cross_a_limit_exactly_once() {
    let redis = RedisServer::start();
    let target = HttpTarget::start_blocking(200);
    let rows = [("load.example", "7|A/o=5000")];
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &rows,
            top: "queue_size = 20000\nworkers = 16",
            sections: &format!(
                "[notify]\naddress_url = \"{}/a?count=$COUNT\"\n",
                target.base()
            ),
            ..Default::default()
        },
    );
    std::thread::scope(|s| {
        for t in 0..8 {
            let d = &d;
            s.spawn(move || {
                for i in 0..1000 {
                    let body = format!(r#"{{"trace_id":"l{t}-{i}","auth_user":"u@load.example","recipient":"r@gmail.com"}}"#);
                    let r = d.post("/out", &body);
                    assert_eq!(r.status, 202, "{}", r.body);
                }
            });
        }
    });
    let k = key("A", "u@load.example", "o");
    let ok = wait_until(Duration::from_secs(120), || {
        d.metric("migadu_counters_increments_total{level=\"A\",flow=\"o\"}") == 8000.0
    });
    assert!(ok, "not all counted: {:?}", redis.get(&k));
    assert_eq!(redis.get(&k), Some(8000));
    assert_eq!(
        d.metric("migadu_counters_limit_reached_total{level=\"A\",flow=\"o\"}"),
        1.0
    );
    assert!(wait_until(Duration::from_secs(20), || d.metric(
        "migadu_counters_notifications_total{level=\"A\",result=\"sent\"}"
    ) == 1.0));
    let got: Vec<String> = target
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    assert_eq!(got, vec!["/a?count=5000".to_string()]);
}

#[test]
fn counters_view_shapes() {
    let redis = RedisServer::start();
    let d = start(&redis, "", "");
    for _ in 0..2 {
        assert_eq!(
            d.post(
                "/out",
                r#"{"auth_user":"alice@example.com","recipient":"bob@example.com"}"#
            )
            .status,
            202
        );
    }
    wait_key(&redis, &key("A", "bob@example.com", "i"), 2);
    let r = d.get_counters("address=Alice@Example.com");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({
            "query": "alice@example.com", "mode": "address", "date": today(),
            "managed": true, "exempt": false, "domain": "example.com", "org_id": 1234,
            "levels": [
                {"level": "A", "id": "alice@example.com", "in": 0, "in_limit": 500, "out": 2, "out_limit": 7},
                {"level": "D", "id": "example.com", "in": 2, "in_limit": 1000, "out": 2, "out_limit": 3},
                {"level": "O", "id": "1234", "in": 2, "in_limit": 5000, "out": 2, "out_limit": 3},
            ]
        })
    );
    let explicit = d.get_counters(&format!("address=alice@example.com&date={}", today()));
    assert_eq!(explicit.json(), r.json());
    // domain mode: D and O rows only
    let dm = d.get_counters("domain=example.com").json();
    assert_eq!(dm["mode"], "domain");
    assert_eq!(
        dm["levels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["level"].clone())
            .collect::<Vec<_>>(),
        vec![json!("D"), json!("O")]
    );
    // an older day reads zeros
    let yesterday = (chrono::Utc::now().date_naive() - chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    let old = d
        .get_counters(&format!("address=alice@example.com&date={yesterday}"))
        .json();
    assert!(
        old["levels"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["in"] == 0 && l["out"] == 0),
        "{old}"
    );
    // future and malformed dates
    assert_eq!(
        d.get_counters("address=alice@example.com&date=2099-01-01")
            .status,
        400
    );
    let bad = d.get_counters("address=alice@example.com&date=01.02.2026");
    assert_eq!(
        (bad.status, bad.json()["error"].clone()),
        (400, json!("date: \"01.02.2026\" is not YYYY-MM-DD"))
    );
    // an unmanaged domain still shows Lua-era counters, with null limits
    redis.cmd(&["SET", &key("A", "old@legacy.example", "i"), "5"]);
    let um = d.get_counters("address=old@legacy.example").json();
    assert_eq!(
        um,
        json!({
            "query": "old@legacy.example", "mode": "address", "date": today(),
            "managed": false, "exempt": false, "domain": "legacy.example", "org_id": null,
            "levels": [
                {"level": "A", "id": "old@legacy.example", "in": 5, "in_limit": null, "out": 0, "out_limit": null},
                {"level": "D", "id": "legacy.example", "in": 0, "in_limit": null, "out": 0, "out_limit": null},
            ]
        })
    );
    assert_eq!(
        d.get_counters("address=support@migadu.com").json()["exempt"],
        true
    );
}

#[test]
fn counting_log_in_json() {
    let redis = RedisServer::start();
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: ROWS,
            logging: "counting_format = \"json\"",
            ..Default::default()
        },
    );
    assert_eq!(
        d.post(
            "/in",
            r#"{"trace_id":"j1","mail_from":"s@gmail.com","recipient":"y@example.com"}"#
        )
        .status,
        202
    );
    wait_log(&d, "\"event\":\"tracked\"");
    let lines: Vec<Value> = d
        .counting_log()
        .lines()
        .filter(|l| l.contains("\"j1\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(
        events,
        [
            "request",
            "local_domain",
            "limits_map",
            "determined_limit",
            "determined_limit",
            "determined_limit",
            "tracked",
            "tracked",
            "tracked"
        ]
    );
    let tracked = &lines[6];
    assert_eq!(
        (
            tracked["level"].clone(),
            tracked["flow"].clone(),
            tracked["count"].clone(),
            tracked["limit"].clone(),
            tracked["reached"].clone()
        ),
        (json!("A"), json!("i"), json!(1), json!(500), json!(false))
    );
    assert_eq!(tracked["route"], "in");
    assert_eq!(tracked["key"], key("A", "y@example.com", "i"));
}

#[test]
fn a_key_failing_inside_exec_is_skipped_alone() {
    let redis = RedisServer::start();
    let d = start(&redis, "", "");
    // a value INCR refuses: only this key fails, the others of the transaction count
    redis.cmd(&["SET", &key("A", "x@example.com", "o"), "not-a-number"]);
    assert_eq!(
        d.post(
            "/out",
            r#"{"trace_id":"kf","auth_user":"x@example.com","recipient":"s@gmail.com"}"#
        )
        .status,
        202
    );
    wait_key(&redis, &key("D", "example.com", "o"), 1);
    wait_key(&redis, &key("O", "1234", "o"), 1);
    wait_log(
        &d,
        &format!(
            "<kf> out; redis error on key {}: ",
            key("A", "x@example.com", "o")
        ),
    );
    assert_eq!(
        d.metric("migadu_counters_redis_errors_total{op=\"incr\"}"),
        1.0
    );
    assert_eq!(
        d.metric("migadu_counters_increments_total{level=\"A\",flow=\"o\"}"),
        0.0
    );
    assert_eq!(
        d.metric("migadu_counters_increments_total{level=\"O\",flow=\"o\"}"),
        1.0
    );
}

#[test]
fn a_lost_exec_reply_is_resolved_by_reading_the_master() {
    let redis = RedisServer::start();
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: ROWS,
            redis_extra: "timeout_ms = 300",
            ..Default::default()
        },
    );
    // warm the connection so the transaction, not the connect, meets the pause
    assert_eq!(
        d.post("/in", r#"{"trace_id":"warm","recipient":"y@example.com"}"#)
            .status,
        202
    );
    wait_key(&redis, &key("A", "y@example.com", "i"), 1);
    // writes stall past the client's timeout, reads still answer: the EXEC reply is lost
    redis.cmd(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    assert_eq!(
        d.post("/in", r#"{"trace_id":"lost","recipient":"y@example.com"}"#)
            .status,
        202
    );
    assert!(
        wait_until(Duration::from_secs(20), || d
            .metric("migadu_counters_redis_errors_total{op=\"exec\"}")
            == 1.0),
        "{}",
        d.logs()
    );
    assert!(
        d.app_log()
            .contains("lost EXEC reply, counts re-read from the master")
    );
    wait_log(&d, "<lost> in; ");
    // whether Redis ran the stalled EXEC or dropped it with the connection, it is never
    // sent again: after one more request the counter shows at most one increment per request
    redis.cmd(&["SET", "probe-waits-for-the-pause", "1"]);
    assert_eq!(
        d.post("/in", r#"{"trace_id":"after","recipient":"y@example.com"}"#)
            .status,
        202
    );
    wait_log(&d, "<after> in; tracked address counters");
    let v = redis.get(&key("A", "y@example.com", "i")).unwrap();
    assert!(
        v == 2 || v == 3,
        "counter {v} after three requests, one of them lost"
    );
}

fn blocked_clients(r: &RedisServer) -> i64 {
    let Resp::Bulk(Some(info)) = r.cmd(&["INFO", "clients"]) else {
        return -1;
    };
    info.split("blocked_clients:")
        .nth(1)
        .and_then(|t| {
            t.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .unwrap_or(-1)
}

fn assert_metrics(d: &Daemon, want: &[(&str, f64)]) {
    for (sample, value) in want {
        assert_eq!(d.metric(sample), *value, "{sample}");
    }
}

/// One counting worker, Redis replies awaited for long, batches logged at debug.
fn start_one_worker(redis: &RedisServer) -> Daemon {
    Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: ROWS,
            top: "workers = 1\nbatch_size = 8\nhandler_timeout = 60",
            logging: "level = \"debug\"",
            redis_extra: "timeout_ms = 30000",
            ..Default::default()
        },
    )
}

/// Holds the only worker inside a transaction (writes paused), so the requests posted next
/// wait in the queue and are taken together as one batch once writes resume.
fn hold_the_worker(redis: &RedisServer, d: &Daemon) {
    redis.cmd(&["CLIENT", "PAUSE", "60000", "WRITE"]);
    assert_eq!(
        d.post("/in", r#"{"trace_id":"hold","recipient":"h@example.com"}"#)
            .status,
        202
    );
    assert!(
        wait_until(Duration::from_secs(20), || blocked_clients(redis) == 1),
        "the worker's transaction is not waiting on the pause: {}",
        d.logs()
    );
}

#[test]
fn a_pipelined_batch_with_one_failing_key_counts_the_others_and_reports_that_one() {
    let redis = RedisServer::start();
    let d = start_one_worker(&redis);
    let bad = key("A", "x@example.com", "o");
    redis.cmd(&["SET", &bad, "not-a-number"]);
    hold_the_worker(&redis, &d);
    for body in [
        r#"{"trace_id":"b1","recipient":"y@example.com"}"#,
        r#"{"trace_id":"b2","auth_user":"x@example.com","recipient":"s@gmail.com"}"#,
        r#"{"trace_id":"b3","recipient":"z@other.org"}"#,
    ] {
        let route = if body.contains("auth_user") {
            "/out"
        } else {
            "/in"
        };
        assert_eq!(d.post(route, body).status, 202);
    }
    redis.cmd(&["CLIENT", "UNPAUSE"]);
    wait_log(&d, "<b3> in; tracked account counters for 99 => count=1");
    // the three queued requests went to Redis as one batch of three transactions
    assert!(
        d.app_log()
            .contains("counting batch requests=3 transactions=3"),
        "{}",
        d.app_log()
    );
    // the failing key is reported for its request alone, and nothing else of the batch fails
    wait_log(&d, &format!("<b2> out; redis error on key {bad}: "));
    assert_eq!(
        d.counting_log().matches("redis error").count(),
        1,
        "{}",
        d.counting_log()
    );
    assert!(matches!(redis.cmd(&["GET", &bad]), Resp::Bulk(Some(v)) if v == "not-a-number"));
    // the rest of the failing request counted, and so did the requests around it
    assert_eq!(redis.get(&key("D", "example.com", "o")), Some(1));
    assert_eq!(redis.get(&key("O", "1234", "o")), Some(1));
    assert_eq!(redis.get(&key("A", "y@example.com", "i")), Some(1));
    assert_eq!(redis.get(&key("D", "example.com", "i")), Some(2));
    assert_eq!(redis.get(&key("A", "z@other.org", "i")), Some(1));
    assert_metrics(
        &d,
        &[
            ("migadu_counters_redis_errors_total{op=\"incr\"}", 1.0),
            (
                "migadu_counters_increments_total{level=\"A\",flow=\"o\"}",
                0.0,
            ),
            (
                "migadu_counters_increments_total{level=\"O\",flow=\"o\"}",
                1.0,
            ),
            (
                "migadu_counters_increments_total{level=\"A\",flow=\"i\"}",
                3.0,
            ),
        ],
    );
}

/// The id of a client whose command waits on the pause, other than `not`.
fn blocked_client(r: &RedisServer, not: Option<&str>) -> Option<String> {
    let Resp::Bulk(Some(list)) = r.cmd(&["CLIENT", "LIST"]) else {
        return None;
    };
    list.lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.strip_prefix("flags=").is_some_and(|v| v.contains('b')))
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .find(|id| Some(*id) != not)
        .map(str::to_string)
}

#[test]
fn a_batch_whose_connection_dies_before_its_replies_is_re_read_and_never_sent_again() {
    let redis = RedisServer::start();
    let d = start_one_worker(&redis);
    let k = key("A", "y@example.com", "i");
    assert_eq!(
        d.post("/in", r#"{"trace_id":"warm","recipient":"y@example.com"}"#)
            .status,
        202
    );
    wait_key(&redis, &k, 1);
    hold_the_worker(&redis, &d);
    let held = blocked_client(&redis, None).expect("the held transaction");
    for t in ["b1", "b2", "b3"] {
        let body = format!(r#"{{"trace_id":"{t}","recipient":"y@example.com"}}"#);
        assert_eq!(d.post("/in", &body).status, 202);
    }
    // the held transaction loses its connection, then so does the batch behind it, before
    // Redis has run any of them
    redis.cmd(&["CLIENT", "KILL", "ID", &held]);
    let mut batch = None;
    assert!(
        wait_until(Duration::from_secs(20), || {
            batch = blocked_client(&redis, Some(&held));
            batch.is_some()
        }),
        "{}",
        d.logs()
    );
    redis.cmd(&["CLIENT", "KILL", "ID", &batch.unwrap()]);
    wait_log(
        &d,
        "<b3> in; tracked address counters for y@example.com => count=1",
    );
    redis.cmd(&["CLIENT", "UNPAUSE"]);
    assert!(
        d.app_log()
            .contains("counting batch requests=3 transactions=3"),
        "{}",
        d.app_log()
    );
    // each request of the batch is logged with the values re-read from the master, which
    // show that none of them was counted
    for t in ["b1", "b2", "b3"] {
        wait_log(
            &d,
            &format!("<{t}> in; tracked address counters for y@example.com => count=1"),
        );
    }
    assert_eq!(
        d.app_log()
            .matches("lost EXEC reply, counts re-read from the master")
            .count(),
        4
    );
    assert_metrics(
        &d,
        &[("migadu_counters_redis_errors_total{op=\"exec\"}", 4.0)],
    );
    // nothing is sent twice: the next request is the second one counted
    assert_eq!(
        d.post("/in", r#"{"trace_id":"after","recipient":"y@example.com"}"#)
            .status,
        202
    );
    wait_log(
        &d,
        "<after> in; tracked address counters for y@example.com => count=2",
    );
    assert_eq!(redis.get(&k), Some(2));
}

/// One raw exchange: `request` is written as is and the connection read to its end; the Date
/// header's value becomes `<date>` and today's date `<today>`, so the answer can be compared
/// byte for byte.
fn raw_exchange(addr: &str, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // A server may answer and close before reading a large body; the answer still counts.
    let _ = s.write_all(request);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).replace(&today(), "<today>");
    text.split("\r\n")
        .map(|l| match l.split_once(':') {
            Some((name, _)) if name.eq_ignore_ascii_case("date") => format!("{name}: <date>"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// The answers in `raw`, one after another, each as its status line, its header lines sorted
/// (RFC 9110 gives the order of differently named fields no meaning) and its body.
fn canonical(mut raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some((head, rest)) = raw.split_once("\r\n\r\n") {
        let mut lines: Vec<&str> = head.split("\r\n").collect();
        let status = lines.remove(0);
        lines.sort_unstable();
        let len = lines
            .iter()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(rest.len())
            .min(rest.len());
        out.push(format!(
            "{status}\n{}\n\n{}",
            lines.join("\n"),
            &rest[..len]
        ));
        raw = &rest[len..];
    }
    out
}

/// Guards the HTTP edges of both servers that the middleware-chain test leaves open, as the
/// hand-written hyper server answered them (the expected answers are its own): unknown paths,
/// HEAD and other methods, a chunked body over the limit, malformed JSON, every header of each
/// kind of answer, keep-alive, the admin routes, and the route and status each is counted as.
#[test]
fn http_edges_answer_as_before() {
    let redis = RedisServer::start();
    let d = start(&redis, "", "");
    let auth = format!("Authorization: Bearer {TEST_TOKEN}\r\n");
    let json_post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let mut chunked = format!(
        "POST /out HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..17 {
        chunked.extend_from_slice(b"1000\r\n");
        chunked.extend_from_slice(&[b' '; 0x1000]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let get = |path: &str, method: &str, with_auth: bool| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{}\r\n",
            if with_auth { auth.as_str() } else { "" }
        )
        .into_bytes()
    };
    let mut not_utf8 = json_post("/out", r#"{"recipient":"?"}"#);
    let at = not_utf8.iter().rposition(|b| *b == b'?').unwrap();
    not_utf8[at] = 0xff;
    let valid = r#"{"trace_id":"e1","auth_user":"x@example.com","recipient":"y@gmail.com"}"#;
    let keep_alive = [
        format!(
            "POST /in HTTP/1.1\r\nHost: t\r\n{auth}Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .into_bytes(),
        get("/nope", "GET", false),
    ]
    .concat();
    let api_cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "unknown path",
            get("/nope", "GET", false),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "unknown path below a route",
            json_post("/in/", valid),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "root",
            get("/", "POST", true),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "HEAD on /counters",
            get("/counters?address=x@example.com", "HEAD", true),
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\nallow: GET\r\nconnection: close\r\ncontent-length: 35\r\ndate: <date>\r\n\r\n",
        ),
        (
            "HEAD on /in",
            get("/in", "HEAD", true),
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\nallow: POST\r\nconnection: close\r\ncontent-length: 35\r\ndate: <date>\r\n\r\n",
        ),
        (
            "PUT on /out",
            get("/out", "PUT", true),
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\nallow: POST\r\nconnection: close\r\ncontent-length: 34\r\ndate: <date>\r\n\r\n{\"error\":\"method PUT not allowed\"}",
        ),
        (
            "OPTIONS on /counters",
            get("/counters", "OPTIONS", true),
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\nallow: GET\r\nconnection: close\r\ncontent-length: 38\r\ndate: <date>\r\n\r\n{\"error\":\"method OPTIONS not allowed\"}",
        ),
        (
            "chunked body over the limit",
            chunked,
            "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 40\r\ndate: <date>\r\n\r\n{\"error\":\"body larger than 65536 bytes\"}",
        ),
        (
            "malformed JSON",
            json_post("/out", r#"{"a":"#),
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 70\r\ndate: <date>\r\n\r\n{\"error\":\"invalid JSON: EOF while parsing a value at line 1 column 5\"}",
        ),
        (
            "not UTF-8",
            not_utf8,
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 72\r\ndate: <date>\r\n\r\n{\"error\":\"invalid JSON: invalid unicode code point at line 1 column 15\"}",
        ),
        (
            "a JSON string",
            json_post("/out", r#""str""#),
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 45\r\ndate: <date>\r\n\r\n{\"error\":\"invalid JSON: expected one object\"}",
        ),
        (
            "accepted",
            json_post("/out", valid),
            "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 17\r\ndate: <date>\r\n\r\n{\"accepted\":true}",
        ),
        (
            "accepted with a query",
            json_post("/out?x=1", valid),
            "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 17\r\ndate: <date>\r\n\r\n{\"accepted\":true}",
        ),
        (
            "unauthenticated",
            get("/counters?address=x@example.com", "GET", false),
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\nwww-authenticate: Bearer\r\nconnection: close\r\ncontent-length: 32\r\ndate: <date>\r\n\r\n{\"error\":\"missing bearer token\"}",
        ),
        (
            "counters view",
            get("/counters?address=x@example.com", "GET", true),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 368\r\ndate: <date>\r\n\r\n{\"date\":\"<today>\",\"domain\":\"example.com\",\"exempt\":false,\"levels\":[{\"id\":\"x@example.com\",\"in\":0,\"in_limit\":500,\"level\":\"A\",\"out\":2,\"out_limit\":3},{\"id\":\"example.com\",\"in\":0,\"in_limit\":1000,\"level\":\"D\",\"out\":2,\"out_limit\":3},{\"id\":\"1234\",\"in\":0,\"in_limit\":5000,\"level\":\"O\",\"out\":2,\"out_limit\":3}],\"managed\":true,\"mode\":\"address\",\"org_id\":1234,\"query\":\"x@example.com\"}",
        ),
        (
            "keep-alive: two requests on one connection",
            keep_alive,
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 30\r\ndate: <date>\r\n\r\n{\"error\":\"recipient: missing\"}HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "percent-encoded route",
            json_post("/%69n", valid),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "asterisk-form target",
            get("*", "OPTIONS", true),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "absolute-form target",
            json_post("http://t/out", valid),
            "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 17\r\ndate: <date>\r\n\r\n{\"accepted\":true}",
        ),
        (
            "CONNECT",
            format!("CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\nConnection: close\r\n{auth}\r\n")
                .into_bytes(),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
    ];
    let admin_cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "admin unknown path",
            get("/nope", "GET", false),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 21\r\ndate: <date>\r\n\r\n{\"error\":\"not found\"}",
        ),
        (
            "admin health",
            get("/health", "GET", false),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 15\r\ndate: <date>\r\n\r\n{\"status\":\"ok\"}",
        ),
        (
            "admin health by POST",
            get("/health", "POST", false),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 15\r\ndate: <date>\r\n\r\n{\"status\":\"ok\"}",
        ),
        (
            "admin HEAD health",
            get("/health", "HEAD", false),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 15\r\ndate: <date>\r\n\r\n",
        ),
    ];
    for (addr, cases) in [(&d.api, &api_cases), (&d.admin, &admin_cases)] {
        for (what, request, want) in cases {
            if *what == "counters view" {
                wait_key(&redis, &key("O", "1234", "o"), 2);
            }
            let got = raw_exchange(addr, request);
            assert_eq!(canonical(&got), canonical(want), "{what}: {got:?}");
        }
    }
    // /metrics answers any method, in the Prometheus text type
    for method in ["GET", "POST"] {
        let got = raw_exchange(&d.admin, &get("/metrics", method, false));
        let mut head: Vec<&str> = got
            .split("\r\n\r\n")
            .next()
            .unwrap_or_default()
            .split("\r\n")
            .filter(|l| !l.starts_with("content-length: "))
            .collect();
        head.sort_unstable();
        assert_eq!(
            head,
            [
                "HTTP/1.1 200 OK",
                "connection: close",
                "content-type: text/plain; version=0.0.4",
                "date: <date>"
            ],
            "{method} /metrics"
        );
    }
    // each answer above counted under its route and status; unknown paths as "other"
    let metrics = raw_exchange(&d.admin, &get("/metrics", "GET", false));
    let requests: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("migadu_counters_requests_total"))
        .collect();
    assert_eq!(
        requests,
        [
            "migadu_counters_requests_total{route=\"counters\",status=\"200\"} 1",
            "migadu_counters_requests_total{route=\"counters\",status=\"401\"} 1",
            "migadu_counters_requests_total{route=\"counters\",status=\"405\"} 2",
            "migadu_counters_requests_total{route=\"in\",status=\"400\"} 1",
            "migadu_counters_requests_total{route=\"in\",status=\"405\"} 1",
            "migadu_counters_requests_total{route=\"other\",status=\"404\"} 7",
            "migadu_counters_requests_total{route=\"out\",status=\"202\"} 3",
            "migadu_counters_requests_total{route=\"out\",status=\"400\"} 3",
            "migadu_counters_requests_total{route=\"out\",status=\"405\"} 1",
            "migadu_counters_requests_total{route=\"out\",status=\"413\"} 1",
        ]
    );
}

/// The counting connection authenticates with `[redis] password`; a wrong one counts nothing
/// and says why, and the daemon goes on serving.
#[test]
fn a_password_protected_redis_counts_with_the_password_and_a_wrong_one_counts_nothing() {
    let redis = RedisServer::start();
    redis.cmd(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let with = |password: &str| {
        Daemon::start(
            BIN,
            DaemonSetup {
                redis: &redis.addr(),
                rows: ROWS,
                redis_extra: &format!("password = \"{password}\""),
                ..Default::default()
            },
        )
    };
    let good = with("s3cret");
    for t in ["pw1", "pw2"] {
        let body = format!(r#"{{"trace_id":"{t}","recipient":"y@example.com"}}"#);
        assert_eq!(good.post("/in", &body).status, 202);
        wait_log(
            &good,
            &format!("<{t}> in; tracked address counters for y@example.com => count="),
        );
    }
    assert!(
        good.counting_log()
            .contains("<pw2> in; tracked address counters for y@example.com => count=2"),
        "{}",
        good.counting_log()
    );
    let bad = with("wrong");
    assert_eq!(
        bad.post("/in", r#"{"trace_id":"bad","recipient":"y@example.com"}"#)
            .status,
        202
    );
    wait_log(&bad, "<bad> in; redis error: AUTH: WRONGPASS");
    assert!(bad.counting_log().contains("(nothing counted)"));
    assert_eq!(
        bad.metric("migadu_counters_redis_errors_total{op=\"incr\"}"),
        1.0
    );
    // nothing reached the counter: the good daemon's next request is the third
    assert_eq!(
        good.post("/in", r#"{"trace_id":"pw3","recipient":"y@example.com"}"#)
            .status,
        202
    );
    wait_log(
        &good,
        "<pw3> in; tracked address counters for y@example.com => count=3",
    );
}
