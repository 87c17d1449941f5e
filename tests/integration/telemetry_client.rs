//! pepsi-telemetry-client as a process between real senders and the real receiver: spans
//! handed to its socket with `pepsi_contract::telemetry::Emitter` (as every Pepsi process
//! sends them) reach pepsi-telemetry over HTTPS (gzip, the test CA, a bearer token) and land
//! in `pepsi.telemetry_span` of a test database with their host and lifted columns; the
//! envelope's addresses leave the host only with the client's ADDRESSES = yes, whatever the
//! sender's; a program's counters become metric points with their labels; the drops a
//! sender reports are counted once; a refused token is logged once while the client goes
//! on; a batch the receiver will never take is dropped rather than blocking the spans after
//! it; with the receiver away the client keeps taking spans within MAX_QUEUE, its memory
//! bounded, and once the receiver is back the new spans arrive and
//! `pepsi.telemetry.dropped_spans` reports what was dropped; the process metrics from /proc
//! arrive too. Everything is polled with deadlines; nothing asserts on time.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_contract::telemetry::{
    CounterDelta, CountersRecord, Emitter, SpanId, SpanKind, SpanOutcome, SpanRecord, TraceId, wire,
};
use pepsi_testkit::TestDb;
use sqlx::Row as _;

use crate::support::httpd::url_as;
use crate::support::ingress::TestCa;
use crate::support::{Running, free_port};

/// The token the receiver accepts.
const TOKEN: &str = "pepsi-test-client-token-0123456789";

fn client_program() -> PathBuf {
    pepsi_testkit::programs::program(
        "pepsi-telemetry-client",
        env!("CARGO_BIN_EXE_pepsi-telemetry-client"),
    )
}

fn receiver_program() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-telemetry", env!("CARGO_BIN_EXE_pepsi-telemetry"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A real pepsi-telemetry over its own test database, HTTPS with the test CA.
struct Receiver {
    db: TestDb,
    dir: tempfile::TempDir,
    port: u16,
    config: PathBuf,
    /// The section without the options a test adds.
    base: String,
    child: Option<Running>,
}

impl Receiver {
    async fn start() -> Receiver {
        Receiver::start_with("").await
    }

    /// A receiver with `extra` options in its section.
    async fn start_with(extra: &str) -> Receiver {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path());
        let port = free_port();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, format!("# the test clients\n{TOKEN}\n")).unwrap();
        let config = dir.path().join("pepsi-telemetry.conf");
        let base = format!(
            "[pepsi-telemetry]\nLISTEN = 127.0.0.1:{port}\nTLS_CERT = {}\nTLS_KEY = {}\n\
             TOKEN_FILE = {}\nDATABASE_URL = {}\nALLOW_ROOT = yes\n",
            ca.cert.display(),
            ca.key.display(),
            tokens.display(),
            url_as(&db.url, "pepsi-telemetry"),
        );
        let mut receiver = Receiver {
            db,
            dir,
            port,
            config,
            base,
            child: None,
        };
        receiver.configure(extra);
        receiver.run().await;
        receiver
    }

    /// Its configuration from the next start on: the base and `extra`.
    fn configure(&self, extra: &str) {
        std::fs::write(&self.config, format!("{}{extra}\n", self.base)).unwrap();
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("receiver.log")
    }

    fn log(&self) -> String {
        read(&self.log_path())
    }

    /// Starts the process (again) and waits until it listens.
    async fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = Command::new(receiver_program())
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pepsi-telemetry");
        let mut child = Running(child);
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("pepsi-telemetry exited with {status}:\n{}", self.log());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                Instant::now() < until,
                "pepsi-telemetry does not listen:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = Some(child);
    }

    fn stop(&mut self) {
        self.child = None;
    }
}

/// A running pepsi-telemetry-client.
struct Client {
    dir: tempfile::TempDir,
    config: PathBuf,
    socket: PathBuf,
    child: Running,
}

impl Client {
    /// A client of `receiver` sending `token`, with `extra` options.
    async fn start(receiver: &Receiver, token: &str, extra: &str) -> Client {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("spans.sock");
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let config = dir.path().join("pepsi.conf");
        std::fs::write(
            &config,
            format!(
                "[pepsi-telemetry-client]\nSOCKET = {}\nENDPOINT = https://127.0.0.1:{}\n\
                 TOKEN_FILE = {}\nCA_FILE = {}\nEXPORT_INTERVAL = 100ms\nMETRICS_INTERVAL = 300ms\n{extra}\n",
                socket.display(),
                receiver.port,
                token_file.display(),
                receiver.ca().display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("client.log")).unwrap();
        let child = Command::new(client_program())
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pepsi-telemetry-client");
        let mut client = Client {
            dir,
            config,
            socket,
            child: Running(child),
        };
        let until = Instant::now() + Duration::from_secs(30);
        while !client.socket.exists() {
            client.assert_running();
            assert!(
                Instant::now() < until,
                "no socket from pepsi-telemetry-client:\n{}",
                client.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        client
    }

    fn log(&self) -> String {
        read(&self.dir.path().join("client.log"))
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "pepsi-telemetry-client exited with {status}:\n{}",
                self.log()
            );
        }
    }

    /// A sender whose own ADDRESSES is on: what leaves the host is the client's decision.
    fn emitter(&self) -> Emitter {
        Emitter::to(&self.socket).with_addresses(true)
    }

    /// Its resident set, from /proc/PID/status.
    fn rss(&self) -> u64 {
        let status = read(Path::new(&format!("/proc/{}/status", self.child.id())));
        pepsi_telemetry_client::procfs::rss_bytes(&status)
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }
}

/// A span of `trace`, as a Pepsi process reports it.
fn span(trace: TraceId, kind: SpanKind, stage: Option<&str>, outcome: SpanOutcome) -> SpanRecord {
    let now = wire::unix_ns(std::time::SystemTime::now());
    SpanRecord {
        trace_id: trace,
        span_id: SpanId::random(),
        parent: None,
        kind,
        program: match kind {
            SpanKind::Ingress => "pepsi-ingress",
            SpanKind::Pass => "pepsi-stage-route",
            SpanKind::Interrupted => "pepsi-dispatch",
        }
        .into(),
        pid: 4242,
        stage: stage.map(str::to_owned),
        queue_id: Some(42),
        message_id: Some("<t1.4242@mid.test>".into()),
        start_ns: now - 2_000_000,
        end_ns: now,
        outcome,
        next_stage: None,
        fused_into: None,
        dispatch_wait_ms: None,
        error: None,
        rcpt_count: Some(1),
        size: None,
        mail_from: None,
        rcpt_to: Vec::new(),
        sender_dropped: 0,
    }
}

/// The three spans of one message: the ingress's transaction (with its envelope), a
/// failed pass whose error names a recipient, and a pass cut short.
fn message(trace: TraceId) -> Vec<SpanRecord> {
    let mut ingress = span(trace, SpanKind::Ingress, None, SpanOutcome::Accepted);
    ingress.mail_from = Some("alice@sender.test".into());
    ingress.rcpt_to = vec!["bob@rcpt.test".into()];
    ingress.size = Some(2048);
    let mut pass = span(trace, SpanKind::Pass, Some("route"), SpanOutcome::Failed);
    pass.parent = Some(ingress.span_id);
    pass.error = Some("550 5.1.1 <bob@rcpt.test>: unknown user".into());
    pass.dispatch_wait_ms = Some(1.5);
    pass.mail_from = Some("alice@sender.test".into());
    pass.rcpt_to = vec!["bob@rcpt.test".into()];
    let mut cut = span(
        trace,
        SpanKind::Interrupted,
        Some("local"),
        SpanOutcome::Interrupted,
    );
    cut.parent = Some(ingress.span_id);
    vec![ingress, pass, cut]
}

/// Polls `sql` (one bigint or double, bound to `bind`) until it is at least `want`.
async fn wait_for(
    db: &TestDb,
    sql: &str,
    bind: &str,
    want: f64,
    limit: Duration,
    logs: impl Fn() -> String,
) -> f64 {
    let until = Instant::now() + limit;
    loop {
        let got: Option<f64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .bind(bind)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        let got = got.unwrap_or(0.0);
        if got >= want {
            return got;
        }
        assert!(
            Instant::now() < until,
            "{sql} ({bind}): {got} after {limit:?}, wanted {want}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const SPANS_OF_TRACE: &str =
    "SELECT count(*)::float8 FROM pepsi.telemetry_span WHERE trace_id = decode($1, 'hex')";

/// The rows of `trace` as JSON text each: everything a reader of the table could see.
async fn row_texts(db: &TestDb, trace: TraceId) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT row_to_json(s)::text FROM pepsi.telemetry_span s \
         WHERE trace_id = decode($1, 'hex') ORDER BY start_time, name",
    )
    .bind(trace.to_string())
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_arrive_with_their_host_and_the_addresses_only_where_allowed() {
    let receiver = Receiver::start().await;
    let mut private = Client::start(&receiver, TOKEN, "HOSTNAME = private.test\n").await;
    let mut open = Client::start(&receiver, TOKEN, "HOSTNAME = open.test\nADDRESSES = yes\n").await;
    let (private_trace, open_trace) = (TraceId::random(), TraceId::random());
    let sent = message(private_trace);
    for (client, spans) in [(&private, sent.clone()), (&open, message(open_trace))] {
        let emitter = client.emitter();
        for s in &spans {
            emitter.emit(s);
        }
        assert_eq!((emitter.sent(), emitter.dropped()), (3, 0));
    }
    let logs = || format!("{}\n{}\n{}", private.log(), open.log(), receiver.log());
    for trace in [private_trace, open_trace] {
        wait_for(
            &receiver.db,
            SPANS_OF_TRACE,
            &trace.to_string(),
            3.0,
            Duration::from_secs(60),
            logs,
        )
        .await;
    }

    // The lifted columns, the ids and the status of the private host's spans.
    let rows = sqlx::query(
        "SELECT encode(span_id, 'hex') AS span, encode(parent_span_id, 'hex') AS parent, name, \
         service, host, stage, queue_id, message_id, outcome, status_code, status_message, \
         attributes FROM pepsi.telemetry_span WHERE trace_id = decode($1, 'hex') ORDER BY name",
    )
    .bind(private_trace.to_string())
    .fetch_all(&receiver.db.pool)
    .await
    .unwrap();
    let shown: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {}",
                r.get::<String, _>("name"),
                r.get::<Option<String>, _>("service"),
                r.get::<Option<String>, _>("host"),
                r.get::<Option<String>, _>("stage"),
                r.get::<Option<i64>, _>("queue_id"),
                r.get::<Option<String>, _>("message_id"),
                r.get::<Option<String>, _>("outcome"),
                r.get::<Option<String>, _>("status_message"),
                r.get::<i16, _>("status_code"),
            )
        })
        .collect();
    let some = |s: &str| format!("{:?}", Some(s));
    assert_eq!(
        shown,
        [
            format!(
                "ingress {} {} None Some(42) {} {} None 0",
                some("pepsi"),
                some("private.test"),
                some("<t1.4242@mid.test>"),
                some("accepted")
            ),
            format!(
                "interrupted local {} {} {} Some(42) {} {} {} 2",
                some("pepsi"),
                some("private.test"),
                some("local"),
                some("<t1.4242@mid.test>"),
                some("interrupted"),
                some("interrupted")
            ),
            format!(
                "route {} {} {} Some(42) {} {} {} 2",
                some("pepsi"),
                some("private.test"),
                some("route"),
                some("<t1.4242@mid.test>"),
                some("failed"),
                some("550 5.1.1 <[address]>: unknown user")
            ),
        ]
    );
    let ingress_id = sent[0].span_id.to_string();
    for r in &rows {
        let name: String = r.get("name");
        let (span, parent): (String, Option<String>) = (r.get("span"), r.get("parent"));
        if name == "ingress" {
            assert_eq!((span, parent), (ingress_id.clone(), None));
        } else {
            assert_eq!(parent.as_deref(), Some(ingress_id.as_str()), "{name}");
        }
    }
    let route: serde_json::Value = rows
        .iter()
        .find(|r| r.get::<String, _>("name") == "route")
        .unwrap()
        .get("attributes");
    assert_eq!(route["pepsi.program"], "pepsi-stage-route");
    assert_eq!(route["process.pid"], 4242);
    assert_eq!(route["pepsi.dispatch_wait_ms"], 1.5);
    assert_eq!(route["host.name"], "private.test");
    assert_eq!(route["service.name"], "pepsi");

    // No address anywhere in a stored row of the private host; the open host's keep theirs.
    for text in row_texts(&receiver.db, private_trace).await {
        for address in [
            "alice@sender.test",
            "bob@rcpt.test",
            "sender.test",
            "rcpt.test",
        ] {
            assert!(!text.contains(address), "{address} left the host: {text}");
        }
    }
    let open_rows = row_texts(&receiver.db, open_trace).await.join("\n");
    for want in [
        r#""pepsi.mail_from": "alice@sender.test""#,
        r#""pepsi.rcpt_to": ["bob@rcpt.test"]"#,
        "550 5.1.1 <bob@rcpt.test>: unknown user",
    ] {
        assert!(open_rows.contains(want), "{want} missing: {open_rows}");
    }

    // The metrics: from the spans, and the processes /proc shows (the client itself).
    let metric = |name: &str, attr: &str| {
        format!(
            "SELECT max(coalesce(value, count::float8)) FROM pepsi.telemetry_metric \
             WHERE name = '{name}' AND host = $1 AND {attr}"
        )
    };
    for (sql, what) in [
        (
            metric(
                "pepsi.stage.pass_duration",
                "attributes->>'pepsi.stage' = 'route' AND attributes->>'pepsi.outcome' = 'failed'",
            ),
            "the route pass",
        ),
        (
            metric(
                "pepsi.stage.dispatch_wait",
                "attributes->>'pepsi.stage' = 'route'",
            ),
            "the route pass's wait",
        ),
        (
            metric(
                "pepsi.ingress.transactions",
                "attributes->>'pepsi.outcome' = 'accepted'",
            ),
            "the transaction",
        ),
        (
            metric("pepsi.ingress.duration", "true"),
            "the transaction's time",
        ),
        (
            metric(
                "pepsi.stage.interrupted",
                "attributes->>'pepsi.stage' = 'local'",
            ),
            "the pass cut short",
        ),
        (
            metric("pepsi.telemetry.exported_spans", "true"),
            "the exported spans",
        ),
        (
            metric(
                "pepsi.process.count",
                "attributes->>'pepsi.program' = 'pepsi-telemetry-client'",
            ),
            "the client's own process",
        ),
        (
            metric(
                "pepsi.process.memory",
                "attributes->>'pepsi.program' = 'pepsi-telemetry-client'",
            ),
            "the client's resident memory",
        ),
    ] {
        let got = wait_for(
            &receiver.db,
            &sql,
            "private.test",
            1.0,
            Duration::from_secs(60),
            logs,
        )
        .await;
        assert!(got >= 1.0, "{what}: {got}");
    }
    let histogram: (String, Option<String>) = sqlx::query_as(
        "SELECT kind, unit FROM pepsi.telemetry_metric WHERE name = 'pepsi.stage.pass_duration' LIMIT 1",
    )
    .fetch_one(&receiver.db.pool)
    .await
    .unwrap();
    assert_eq!(histogram, ("histogram".to_owned(), Some("s".to_owned())));
    private.assert_running();
    open.assert_running();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_token_is_logged_once_and_the_client_goes_on() {
    let receiver = Receiver::start().await;
    let mut client = Client::start(
        &receiver,
        "not-the-token-the-receiver-knows",
        "HOSTNAME = refused.test\n",
    )
    .await;
    let trace = TraceId::random();
    let emitter = client.emitter();
    for s in message(trace) {
        emitter.emit(&s);
    }
    // Several refusals at the receiver (the first try and its retries) ...
    let until = Instant::now() + Duration::from_secs(90);
    while receiver.log().matches("/v1/traces refused").count() < 3 {
        client.assert_running();
        assert!(
            Instant::now() < until,
            "the receiver refused too few exports:\n{}\n{}",
            receiver.log(),
            client.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... said once by the client, which goes on taking spans.
    client.assert_running();
    let log = client.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("span export to"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("WARN") && warnings[0].contains("401"),
        "{log}"
    );
    emitter.emit(&span(
        trace,
        SpanKind::Pass,
        Some("route"),
        SpanOutcome::Advanced,
    ));
    assert_eq!(emitter.dropped(), 0);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.telemetry_span")
        .fetch_one(&receiver.db.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);

    // `check` says the same before a client runs, and what works once the token is right.
    let check = |config: &Path| {
        crate::support::Run::of(
            Command::new(client_program())
                .args(["check", "-c"])
                .arg(config)
                .output()
                .unwrap(),
        )
    };
    let refused = check(&client.config);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("401"), "{refused:?}");
    assert!(refused.stdout.contains("token "), "{refused:?}");
    std::fs::write(client.dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let taken = check(&client.config);
    assert_eq!(taken.code, 0, "{taken:?}");
    assert!(
        taken
            .stdout
            .contains("took an empty export with this token"),
        "{taken:?}"
    );
    client.assert_running();
}

/// A span of the flood: its error text makes each held span weigh about a kilobyte, so a
/// queue without its bound would hold hundreds of megabytes.
fn heavy(trace: TraceId) -> SpanRecord {
    let mut s = span(trace, SpanKind::Pass, Some("route"), SpanOutcome::Deferred);
    s.error = Some("x".repeat(900));
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_receiver_away_the_queue_stays_bounded_and_its_drops_are_reported() {
    const FLOOD: u64 = 200_000;
    const MAX_QUEUE: u64 = 1000;
    const BATCH: u64 = 100;
    let mut receiver = Receiver::start().await;
    let mut client = Client::start(
        &receiver,
        TOKEN,
        &format!("HOSTNAME = flooded.test\nMAX_QUEUE = {MAX_QUEUE}\nBATCH_SIZE = {BATCH}\n"),
    )
    .await;
    let emitter = client.emitter();
    let first = TraceId::random();
    emitter.emit(&span(
        first,
        SpanKind::Pass,
        Some("route"),
        SpanOutcome::Advanced,
    ));
    wait_for(
        &receiver.db,
        SPANS_OF_TRACE,
        &first.to_string(),
        1.0,
        Duration::from_secs(60),
        || client.log(),
    )
    .await;

    let failures_before = client.log().matches("span export to").count();
    receiver.stop();
    let before = client.rss();
    // Every span of the flood is handed over: a full buffer is waited out rather than
    // dropped at the sender, so the client itself must take all of them.
    let flood = TraceId::random();
    let until = Instant::now() + Duration::from_secs(600);
    for _ in 0..FLOOD {
        let s = heavy(flood);
        loop {
            let dropped = emitter.dropped();
            emitter.emit(&s);
            if emitter.dropped() == dropped {
                break;
            }
            assert!(Instant::now() < until, "the client stopped taking spans");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    client.assert_running();
    let after = client.rss();
    assert!(
        after < before + 64 * 1024 * 1024,
        "the client grew from {before} to {after} bytes with MAX_QUEUE = {MAX_QUEUE}"
    );
    let log = client.log();
    assert!(log.contains("the span queue is full"), "{log}");
    // The failures since the receiver went: said once.
    assert_eq!(
        log.matches("span export to").count(),
        failures_before + 1,
        "{log}"
    );

    receiver.run().await;
    let later = TraceId::random();
    emitter.emit(&span(
        later,
        SpanKind::Pass,
        Some("route"),
        SpanOutcome::Finished,
    ));
    let logs = || format!("{}\n{}", client.log(), receiver.log());
    wait_for(
        &receiver.db,
        SPANS_OF_TRACE,
        &later.to_string(),
        1.0,
        Duration::from_secs(120),
        logs,
    )
    .await;
    // All but what the queue and one batch in flight held were dropped, and counted (the
    // bound leaves room for what the socket still held when the receiver came back).
    let dropped = wait_for(
        &receiver.db,
        "SELECT max(value) FROM pepsi.telemetry_metric WHERE name = 'pepsi.telemetry.dropped_spans' \
         AND host = 'flooded.test' AND attributes->>'pepsi.reason' = $1",
        "queue_full",
        (FLOOD * 9 / 10) as f64,
        Duration::from_secs(120),
        logs,
    )
    .await;
    assert!(dropped <= FLOOD as f64, "{dropped}");
    // Of the flood, only what the queue, a batch in flight and the socket held is stored.
    let kept: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.telemetry_span WHERE trace_id = decode($1, 'hex')",
    )
    .bind(flood.to_string())
    .fetch_one(&receiver.db.pool)
    .await
    .unwrap();
    assert!(kept as u64 <= FLOOD / 10, "{kept}");
    let until = Instant::now() + Duration::from_secs(60);
    while !client.log().contains("spans reach") {
        assert!(
            Instant::now() < until,
            "no recovery logged:\n{}",
            client.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.assert_running();
}

/// The largest value of metric `name` on `host` whose attributes satisfy `attr` (SQL over
/// `attributes`), polled until it is at least `want`: a cumulative sum's latest total.
async fn wait_for_metric(
    receiver: &Receiver,
    client: &Client,
    name: &str,
    host: &str,
    attr: &str,
    want: f64,
) -> f64 {
    let sql = format!(
        "SELECT max(value) FROM pepsi.telemetry_metric WHERE name = $1 AND host = '{host}' AND {attr}"
    );
    wait_for(
        &receiver.db,
        &sql,
        name,
        want,
        Duration::from_secs(60),
        || format!("{}\n{}", client.log(), receiver.log()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_programs_counters_arrive_as_sums_with_their_labels() {
    let receiver = Receiver::start().await;
    let mut client = Client::start(&receiver, TOKEN, "HOSTNAME = counters.test\n").await;
    let emitter = client.emitter();
    let delta = |name: &str, label: Option<(&str, &str)>, value: f64| CounterDelta {
        name: name.into(),
        label: label.map(|(k, v)| (k.into(), v.into())),
        value,
    };
    let ingress = |refused: f64| CountersRecord {
        program: "pepsi-ingress".into(),
        pid: 4242,
        counters: vec![
            delta("pepsi.ingress.refused", Some(("reason", "5.7.1")), refused),
            delta("pepsi.ingress.sessions", None, 1.0),
            // Not Pepsi's: left out.
            delta("other.counter", None, 1.0),
        ],
    };
    // Two reports of one program add up.
    emitter.emit_counters(&ingress(3.0));
    emitter.emit_counters(&ingress(2.0));
    emitter.emit_counters(&CountersRecord {
        program: "pepsi-dispatch".into(),
        pid: 4343,
        counters: vec![delta(
            "pepsi.dispatch.processing_ms",
            Some(("stage", "route")),
            12.5,
        )],
    });
    assert_eq!((emitter.sent(), emitter.dropped()), (3, 0));

    let ingress_attr = "attributes->>'pepsi.program' = 'pepsi-ingress'";
    let refused = wait_for_metric(
        &receiver,
        &client,
        "pepsi.ingress.refused",
        "counters.test",
        &format!("{ingress_attr} AND attributes->>'pepsi.reason' = '5.7.1'"),
        5.0,
    )
    .await;
    assert_eq!(refused, 5.0);
    let sessions = wait_for_metric(
        &receiver,
        &client,
        "pepsi.ingress.sessions",
        "counters.test",
        &format!("{ingress_attr} AND NOT attributes ? 'pepsi.reason'"),
        2.0,
    )
    .await;
    assert_eq!(sessions, 2.0);
    let processing = wait_for_metric(
        &receiver,
        &client,
        "pepsi.dispatch.processing_ms",
        "counters.test",
        "attributes->>'pepsi.program' = 'pepsi-dispatch' AND attributes->>'pepsi.stage' = 'route'",
        12.5,
    )
    .await;
    assert_eq!(processing, 12.5);

    // Monotonic sums, cumulative, with their unit where the name tells it.
    let (kind, unit, monotonic, temporality): (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    ) = sqlx::query_as(
        "SELECT kind, unit, attributes->>'otel.metric.monotonic', \
             attributes->>'otel.metric.temporality' FROM pepsi.telemetry_metric \
             WHERE name = 'pepsi.dispatch.processing_ms' AND host = 'counters.test' LIMIT 1",
    )
    .fetch_one(&receiver.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (
            kind.as_str(),
            unit.as_deref(),
            monotonic.as_deref(),
            temporality.as_deref()
        ),
        ("sum", Some("ms"), Some("true"), Some("cumulative"))
    );
    // The foreign name came in the same reports as the counters above, so it would be there
    // by now: it is not, and the log says why.
    let foreign: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.telemetry_metric WHERE name = 'other.counter'",
    )
    .fetch_one(&receiver.db.pool)
    .await
    .unwrap();
    assert_eq!(foreign, 0);
    assert!(
        client
            .log()
            .contains(r#"counter "other.counter" not exported"#),
        "{}",
        client.log()
    );
    client.assert_running();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_drops_a_sender_reports_are_counted_once() {
    let receiver = Receiver::start().await;
    let mut client = Client::start(&receiver, TOKEN, "HOSTNAME = drops.test\n").await;
    // The counts as a process's spans carry them (an Emitter sets its own): one process
    // reports 5, then 9, then a span overtaken by the one with 9 (7), which adds nothing;
    // another process reports none.
    let mut socket = std::os::unix::net::UnixStream::connect(&client.socket).unwrap();
    let trace = TraceId::random();
    for (pid, dropped) in [(4242, 5), (4242, 9), (4242, 7), (4343, 0)] {
        let mut s = span(trace, SpanKind::Pass, Some("route"), SpanOutcome::Advanced);
        s.pid = pid;
        s.sender_dropped = dropped;
        socket.write_all(&wire::frame(&s.encode())).unwrap();
    }
    let logs = || format!("{}\n{}", client.log(), receiver.log());
    wait_for(
        &receiver.db,
        SPANS_OF_TRACE,
        &trace.to_string(),
        4.0,
        Duration::from_secs(60),
        logs,
    )
    .await;
    // A metric export that counts the four spans exported was collected after the four
    // were read, so it holds every drop they told.
    wait_for_metric(
        &receiver,
        &client,
        "pepsi.telemetry.exported_spans",
        "drops.test",
        "true",
        4.0,
    )
    .await;
    let dropped: Option<f64> = sqlx::query_scalar(
        "SELECT max(value) FROM pepsi.telemetry_metric WHERE name = 'pepsi.telemetry.dropped_spans' \
         AND host = 'drops.test' AND attributes->>'pepsi.reason' = 'sender'",
    )
    .fetch_one(&receiver.db.pool)
    .await
    .unwrap();
    assert_eq!(dropped, Some(9.0), "{}", logs());
    client.assert_running();
}

/// How many spans of `trace` are stored.
async fn stored(db: &TestDb, trace: TraceId) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.telemetry_span WHERE trace_id = decode($1, 'hex')",
    )
    .bind(trace.to_string())
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A span too large for a receiver whose MAX_BODY is 1 KiB: its error text and Message-ID
/// alone are twice that.
fn poison(trace: TraceId) -> SpanRecord {
    let mut s = span(trace, SpanKind::Pass, Some("relay"), SpanOutcome::Deferred);
    s.error = Some("451 4.4.1 no answer from the next hop ".repeat(25));
    s.message_id = Some(format!("<{}@mid.test>", "m".repeat(900)));
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_the_receiver_will_never_take_does_not_hold_up_the_spans_after_it() {
    let mut receiver = Receiver::start_with("MAX_BODY = 1k").await;
    // Batches of two, sent only when full: the poison and the span after it go together.
    let mut client = Client::start(
        &receiver,
        TOKEN,
        "HOSTNAME = poison.test\nBATCH_SIZE = 2\nEXPORT_INTERVAL = 10m\n",
    )
    .await;
    let emitter = client.emitter();
    let (bad, good) = (TraceId::random(), TraceId::random());
    emitter.emit(&poison(bad));
    emitter.emit(&span(
        good,
        SpanKind::Pass,
        Some("route"),
        SpanOutcome::Advanced,
    ));
    // The span after the poison arrives under the small limit: its batch (413) was sent
    // again in halves, and the poison's half dropped rather than kept in front of it.
    wait_for(
        &receiver.db,
        SPANS_OF_TRACE,
        &good.to_string(),
        1.0,
        Duration::from_secs(60),
        || format!("{}\n{}", client.log(), receiver.log()),
    )
    .await;
    assert_eq!(stored(&receiver.db, bad).await, 0);
    assert!(
        receiver.log().matches("/v1/traces refused").count() >= 2,
        "the pair, then the poison alone:\n{}",
        receiver.log()
    );
    let log = client.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("that sending again would not help"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains("413") && said[0].contains("dropped 1 span"),
        "{log}"
    );

    // With the limit raised, later spans arrive; the poison was not kept to arrive with
    // them, and its drop is reported.
    receiver.stop();
    receiver.configure("");
    receiver.run().await;
    let later = TraceId::random();
    for _ in 0..2 {
        emitter.emit(&span(
            later,
            SpanKind::Pass,
            Some("route"),
            SpanOutcome::Finished,
        ));
    }
    wait_for(
        &receiver.db,
        SPANS_OF_TRACE,
        &later.to_string(),
        2.0,
        Duration::from_secs(60),
        || format!("{}\n{}", client.log(), receiver.log()),
    )
    .await;
    let rejected = wait_for_metric(
        &receiver,
        &client,
        "pepsi.telemetry.dropped_spans",
        "poison.test",
        "attributes->>'pepsi.reason' = 'rejected'",
        1.0,
    )
    .await;
    assert_eq!(rejected, 1.0);
    assert_eq!(stored(&receiver.db, bad).await, 0);
    client.assert_running();
}

/// Reads `stream` until the client closes it, failing if it does not within 30 seconds.
fn closed_by_the_client(stream: &mut std::os::unix::net::UnixStream) {
    use std::io::Read as _;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        stream
            .read(&mut buf)
            .expect("the client closes the connection"),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sender_that_breaks_the_framing_or_comes_one_too_many_is_closed_and_the_rest_go_on() {
    use std::os::unix::net::UnixStream;
    let receiver = Receiver::start().await;
    let mut client = Client::start(&receiver, TOKEN, "MAX_CONNECTIONS = 2\n").await;
    // A frame announcing more than a datagram may hold: nothing after it can be read.
    let mut liar = UnixStream::connect(&client.socket).unwrap();
    let over = u32::try_from(wire::MAX_DATAGRAM + 1).unwrap();
    liar.write_all(&over.to_be_bytes()).unwrap();
    closed_by_the_client(&mut liar);
    // Its seat is free again: two senders fit, a third is closed at once.
    let mut first = UnixStream::connect(&client.socket).unwrap();
    let mut second = UnixStream::connect(&client.socket).unwrap();
    let mut third = UnixStream::connect(&client.socket).unwrap();
    closed_by_the_client(&mut third);
    // The two seated ones go on, a frame split across writes included.
    let trace = TraceId::random();
    let framed =
        wire::frame(&span(trace, SpanKind::Pass, Some("route"), SpanOutcome::Advanced).encode());
    first.write_all(&framed[..3]).unwrap();
    second
        .write_all(&wire::frame(
            &span(trace, SpanKind::Pass, Some("local"), SpanOutcome::Finished).encode(),
        ))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.write_all(&framed[3..]).unwrap();
    wait_for(
        &receiver.db,
        SPANS_OF_TRACE,
        &trace.to_string(),
        2.0,
        Duration::from_secs(60),
        || format!("{}\n{}", client.log(), receiver.log()),
    )
    .await;
    let log = client.log();
    assert!(
        log.contains(&format!(
            "over the limit of {}; closed the sender's connection",
            wire::MAX_DATAGRAM
        )),
        "{log}"
    );
    assert!(log.contains("MAX_CONNECTIONS = 2 are open"), "{log}");
    client.assert_running();
}
