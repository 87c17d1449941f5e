//! A message's journey through the whole system with telemetry on: the real ingress,
//! dispatcher and stage programs hand their spans to a real `pepsi-telemetry-client`, which
//! exports them over OTLP/HTTP with TLS and a token to a real `pepsi-telemetry`, which stores
//! them; `pepsi-httpd`'s journey page, opened in Chromium, shows every pass in order. The
//! delivery worker is killed with SIGKILL in the middle of its pass: the pass cut short is a
//! span of the message's trace, and the pass that runs it again is a second span of the same
//! stage in the same trace.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::support::browser::Browser;
use crate::support::system::{self, Proc, System, children, cmdline};
use crate::support::{free_port, httpd::Httpd};

/// The receiver, which no unified layout holds (it ships alone).
const RECEIVER: &str = env!("CARGO_BIN_EXE_pepsi-telemetry");

fn client_program() -> PathBuf {
    pepsi_testkit::programs::program(
        "pepsi-telemetry-client",
        env!("CARGO_BIN_EXE_pepsi-telemetry-client"),
    )
}

/// The mail store the forwarded message is delivered to over SMTP: while `stall` is set it
/// takes connections and never greets (a delivery pass waits in the middle), else it takes
/// every message.
struct MailStore {
    port: u16,
    stall: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    delivered: Arc<AtomicUsize>,
}

impl MailStore {
    async fn start() -> MailStore {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stall = Arc::new(AtomicBool::new(true));
        let connections = Arc::new(AtomicUsize::new(0));
        let delivered = Arc::new(AtomicUsize::new(0));
        let (s, c, d) = (stall.clone(), connections.clone(), delivered.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (stall, delivered) = (s.load(Ordering::SeqCst), d.clone());
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    if stall {
                        // Hold the connection, silent, until the client goes.
                        let mut sink = Vec::new();
                        let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut sink).await;
                        return;
                    }
                    let _ = stream.get_mut().write_all(b"220 store ESMTP\r\n").await;
                    let mut in_data = false;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let reply: &[u8] = if in_data {
                            if line != ".\r\n" {
                                continue;
                            }
                            in_data = false;
                            delivered.fetch_add(1, Ordering::SeqCst);
                            b"250 2.0.0 stored\r\n"
                        } else {
                            let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                            match verb.as_str() {
                                "EHLO" => {
                                    b"250-store\r\n250-8BITMIME\r\n250 ENHANCEDSTATUSCODES\r\n"
                                }
                                "DATA" => {
                                    in_data = true;
                                    b"354 go on\r\n"
                                }
                                "QUIT" => {
                                    let _ = stream.get_mut().write_all(b"221 2.0.0 bye\r\n").await;
                                    return;
                                }
                                _ => b"250 2.0.0 ok\r\n",
                            }
                        };
                        if stream.get_mut().write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        MailStore {
            port,
            stall,
            connections,
            delivered,
        }
    }
}

/// One stored span, as the journey needs it.
#[derive(Debug, Clone)]
struct Stored {
    trace: String,
    stage: Option<String>,
    name: String,
    outcome: Option<String>,
    host: Option<String>,
    start: f64,
    end: f64,
    attributes: Value,
}

/// The spans of the trace of queue row `id`, oldest first.
async fn trace_of(db: &sqlx::PgPool, id: i64) -> Vec<Stored> {
    type Columns = (
        String,
        Option<String>,
        String,
        Option<String>,
        Option<String>,
        f64,
        f64,
        Value,
    );
    let rows: Vec<Columns> = sqlx::query_as(
        "SELECT encode(trace_id, 'hex'), stage, name, outcome, host, \
                    extract(epoch FROM start_time)::float8, extract(epoch FROM end_time)::float8, \
                    attributes \
             FROM pepsi.telemetry_span \
             WHERE trace_id IN (SELECT trace_id FROM pepsi.telemetry_span WHERE queue_id = $1) \
             ORDER BY start_time, end_time",
    )
    .bind(id)
    .fetch_all(db)
    .await
    .unwrap();
    rows.into_iter()
        .map(
            |(trace, stage, name, outcome, host, start, end, attributes)| Stored {
                trace,
                stage,
                name,
                outcome,
                host,
                start,
                end,
                attributes,
            },
        )
        .collect()
}

/// Waits up to 60 s until the trace of row `id` satisfies `done`.
async fn wait_trace(
    sys: &System,
    id: i64,
    what: &str,
    done: impl Fn(&[Stored]) -> bool,
) -> Vec<Stored> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let spans = trace_of(&sys.db.pool, id).await;
        if done(&spans) {
            return spans;
        }
        assert!(
            Instant::now() < until,
            "{what}: the trace of row {id} is {spans:#?}\n--- client\n{}\n--- receiver\n{}\n{}",
            sys.log("client.log"),
            sys.log("receiver.log"),
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts `program` on the system's configuration, its stderr in `log`.
fn start(sys: &mut System, program: &Path, log: &str, name: &'static str) {
    let out = std::fs::File::create(sys.dir.path().join(log)).unwrap();
    let child = sys.command(program).stderr(out).spawn().unwrap();
    sys.procs.push(Proc { child, name });
}

/// The pid of the dispatcher's worker running `program`, once there is one.
async fn worker_of(sys: &System, program: &str) -> u32 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(pid) = children(sys.dispatcher_pid())
            .into_iter()
            .find(|&pid| cmdline(pid).contains(program))
        {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "no {program} worker: {}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_messages_journey_shows_every_pass_and_a_killed_pass_again_in_its_trace() {
    let store = MailStore::start().await;
    let receiver_port = free_port();
    let tls = tempfile::tempdir().unwrap();
    pepsi_testkit::pki::issue(
        tls.path(),
        "receiver",
        "/CN=telemetry.example.test",
        "subjectAltName = IP:127.0.0.1, DNS:telemetry.example.test\n\
         extendedKeyUsage = serverAuth\n",
    );
    let token = "6f1d0c2e9b7a4c3d8e5f1a2b3c4d5e6f";
    std::fs::write(tls.path().join("token"), format!("{token}\n")).unwrap();
    std::fs::write(
        tls.path().join("tokens"),
        format!("# the mx hosts\n{token}\n"),
    )
    .unwrap();
    let aliases = tls.path().join("aliases");
    std::fs::write(&aliases, "fwd@example.test: dest@store.test\n").unwrap();
    let socket = tls.path().join("telemetry.sock");
    let t = tls.path().display();
    let extra = format!(
        "[stage-aliases]\nALIAS_FILE = {aliases}\n\n\
         [stage-relay]\nPROGRAM = pepsi-stage-relay-to-smarthost\nHOST = 127.0.0.1\n\
         PORT = {store}\nTLS = none\nPARALLELISM = 1\nQUEUE_LIMIT = 1\n\n\
         [pepsi-telemetry-client]\nSOCKET = {socket}\nENDPOINT = https://127.0.0.1:{receiver_port}\n\
         TOKEN_FILE = {t}/token\nCA_FILE = {t}/ca.pem\nHOSTNAME = mx1.example.test\n\
         EXPORT_INTERVAL = 200ms\nMETRICS_INTERVAL = 1s\n\n\
         [pepsi-ingress]\nSTATS_INTERVAL = 1s\n\n[pepsi-dispatch]\nSTATS_INTERVAL = 1s\n\n\
         [pepsi-telemetry]\nLISTEN = 127.0.0.1:{receiver_port}\nTLS_CERT = {t}/receiver.pem\n\
         TLS_KEY = {t}/receiver.key\nTOKEN_FILE = {t}/tokens\nALLOW_ROOT = yes\n",
        aliases = aliases.display(),
        store = store.port,
        socket = socket.display(),
    );
    let mut sys = System::new(&extra, &["alice"]).await;
    // The receiver's database: the system's (its own role is the installation's business,
    // pinned by telemetry_receiver).
    let receiver_config = sys.dir.path().join("receiver.conf");
    std::fs::write(
        &receiver_config,
        format!(
            "@inline@ {}\n\n[pepsi-telemetry]\nDATABASE_URL = {}\n",
            sys.config.display(),
            sys.db.url
        ),
    )
    .unwrap();
    let out = std::fs::File::create(sys.dir.path().join("receiver.log")).unwrap();
    let receiver = Command::new(RECEIVER)
        .arg("-c")
        .arg(&receiver_config)
        .args(["-L", "debug"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .unwrap();
    sys.procs.push(Proc {
        child: receiver,
        name: "receiver",
    });
    start(&mut sys, &client_program(), "client.log", "client");
    let until = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            Instant::now() < until,
            "the client made no socket: {}",
            sys.log("client.log")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sys.start().await;

    let message = b"From: sender@origin.test\r\nTo: fwd@example.test\r\n\
        Message-ID: <journey-1@origin.test>\r\nSubject: a journey\r\n\r\nhello\r\n";
    let reply = sys
        .send("sender@origin.test", &["fwd@example.test"], message)
        .await;
    let id: i64 = reply
        .rsplit(' ')
        .next()
        .and_then(|w| w.trim().parse().ok())
        .unwrap_or_else(|| panic!("no queue id in {reply:?}"));

    // The delivery pass waits on the silent store: kill its worker in the middle.
    let until = Instant::now() + Duration::from_secs(60);
    while store.connections.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "the relay never connected: {}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let worker = worker_of(&sys, "pepsi-stage-relay-to-smarthost").await;
    system::signal(worker, "KILL");
    // A worker that dies alone with a message fails it, for an operator: retry it so.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
                .bind(id)
                .fetch_optional(&sys.db.pool)
                .await
                .unwrap();
        if status.as_deref() == Some("failed") {
            break;
        }
        assert!(
            Instant::now() < until,
            "row {id} is {status:?}: {}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.stall.store(false, Ordering::SeqCst);
    let retried = sys
        .command(&system::queue_tool())
        .args(["retry", &id.to_string()])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(retried.status.success(), "pepsi-queue retry: {retried:?}");
    let until = Instant::now() + Duration::from_secs(60);
    while store.delivered.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < until,
            "the store got nothing: {}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let spans = wait_trace(&sys, id, "the cut pass and the retried one", |spans| {
        let relay: Vec<_> = spans
            .iter()
            .filter(|s| s.stage.as_deref() == Some("relay"))
            .collect();
        spans.iter().any(|s| s.name == "ingress")
            && relay
                .iter()
                .any(|s| s.outcome.as_deref() == Some("interrupted"))
            && relay
                .iter()
                .any(|s| s.outcome.as_deref() == Some("finished"))
    })
    .await;
    // One trace, rooted at the ingress's transaction on this host.
    assert!(
        spans.iter().all(|s| s.trace == spans[0].trace),
        "{spans:#?}"
    );
    let ingress = &spans[0];
    assert_eq!(ingress.name, "ingress", "{spans:#?}");
    assert_eq!(ingress.outcome.as_deref(), Some("accepted"));
    assert!(
        spans
            .iter()
            .all(|s| s.host.as_deref() == Some("mx1.example.test")),
        "{spans:#?}"
    );
    assert_eq!(
        ingress.attributes["pepsi.message_id"], "<journey-1@origin.test>",
        "{:#?}",
        ingress.attributes
    );
    // No address leaves the host unless the client is told to let them: not in any column
    // of any stored span of the trace.
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT row_to_json(s)::text FROM pepsi.telemetry_span s \
         WHERE trace_id = decode($1, 'hex')",
    )
    .bind(&spans[0].trace)
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), spans.len());
    for text in &rows {
        for address in ["fwd@example.test", "sender@origin.test", "dest@store.test"] {
            assert!(!text.contains(address), "{address} left the host: {text}");
        }
    }
    // Every pass in the graph's order: the ingress, init first, the route before the
    // forwarded copy's way out, and the relay twice at the end: cut short, then done.
    let stages: Vec<(String, String)> = spans[1..]
        .iter()
        .map(|s| {
            (
                s.stage.clone().unwrap_or_default(),
                s.outcome.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(stages[0].0, "init", "{stages:?}");
    let at = |stage: &str| stages.iter().position(|(s, _)| s == stage);
    assert!(
        at("aliases") < at("route") && at("route") < at("relay"),
        "{stages:?}"
    );
    let tail: Vec<&(String, String)> = stages.iter().rev().take(2).collect();
    assert_eq!(
        tail,
        [
            &("relay".to_owned(), "finished".to_owned()),
            &("relay".to_owned(), "interrupted".to_owned())
        ],
        "{stages:?}"
    );
    // Plausible times: each span ends after it starts, within the test's minutes, none
    // before the transaction began, and the retry after the cut.
    for s in &spans {
        assert!(s.end >= s.start && s.end - s.start < 120.0, "{s:?}");
        assert!(s.start >= ingress.start, "{s:?} before {ingress:?}");
    }
    let cut = &spans[spans.len() - 2];
    let again = &spans[spans.len() - 1];
    assert!(again.start >= cut.end - 0.001, "{cut:?} {again:?}");
    assert!(cut.end - cut.start > 0.0, "{cut:?}");

    // The host's metrics: the ingress's and the dispatcher's counters as they write their
    // statistics, the stages' pass times from the spans, the crash the kill was.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT name FROM pepsi.telemetry_metric \
             WHERE host = 'mx1.example.test' AND (value > 0 OR count > 0) ORDER BY 1",
        )
        .fetch_all(&sys.db.pool)
        .await
        .unwrap();
        let want = [
            "pepsi.dispatch.crashes",
            "pepsi.dispatch.passes",
            "pepsi.ingress.messages",
            "pepsi.stage.pass_duration",
        ];
        if want.iter().all(|w| names.iter().any(|n| n == w)) {
            break;
        }
        assert!(
            Instant::now() < until,
            "metrics stored: {names:?}, wanted {want:?}\n{}",
            sys.log("client.log")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The journey page in a browser: every pass in the same order, the cut one marked.
    let http_port = free_port();
    let httpd_config = sys.dir.path().join("httpd.conf");
    std::fs::write(
        &httpd_config,
        format!(
            "@inline@ {}\n\n[database]\nURL = {}\n\n[pepsi-httpd]\nADDRESS = 127.0.0.1:{http_port}\n\
             ALLOW_ROOT = yes\n",
            sys.config.display(),
            sys.db.url
        ),
    )
    .unwrap();
    let mut httpd = Httpd::new(httpd_config, http_port);
    let password = httpd.admin_add("root");
    httpd.start().await;
    let b = Browser::start().await;
    b.go(&httpd.url(&format!("/journey?queue={id}"))).await;
    b.until(
        "the login form",
        "return document.getElementById('login-form') !== null",
    )
    .await;
    b.type_into("#login-name", "root").await;
    b.type_into("#login-password", &password).await;
    b.click("#login-submit").await;
    let shown = b
        .until(
            "the journey's passes",
            "const rows = Array.from(document.querySelectorAll('tr.span')); \
             return rows.length > 0 ? rows.map(r => [r.dataset.stage, r.dataset.outcome]) : null;",
        )
        .await;
    let shown: Vec<(String, String)> = serde_json::from_value(shown).unwrap();
    let want: Vec<(String, String)> = spans
        .iter()
        .map(|s| {
            (
                s.stage.clone().unwrap_or_else(|| "ingress".into()),
                s.outcome.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(shown, want, "the page shows the stored trace in order");
    let marked = b
        .js("return document.querySelectorAll('tr.span.interrupted').length")
        .await;
    assert_eq!(marked, 1);
}
