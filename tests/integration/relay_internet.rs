//! pepsi-stage-relay-to-internet as a worker process against a real PostgreSQL, a real DNS
//! server the test starts (dnsmasq on a free loopback port, answering only from the records
//! each test gives it) and SMTP peers on loopback addresses (tests/integration/support/smtp_peer.rs): MX
//! order and fallback, the implicit MX, null MX and NXDOMAIN, deferrals and retries, a
//! split message with one refused recipient, a connection lost mid-message, the
//! `pepsi.dns_address` cache, bad DNS answers and bad peers, the 7-bit conversion, and a
//! private Postfix as the MX taking the message over verified STARTTLS.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::smtp_peer::Peer;

const RELAY: &str = env!("CARGO_BIN_EXE_pepsi-stage-relay-to-internet");

const RAW: &[u8] = b"From: sender@example.test\r\nTo: someone\r\nSubject: out\r\n\r\n\
.a line with a dot\r\nGr\xc3\xbc\xc3\x9fe\r\n";

/// A dnsmasq that knows only the records it is given, authoritative for `.test` (other
/// names there are NXDOMAIN), TTL 600 s.
struct Dns {
    child: Child,
    port: u16,
}

impl Dns {
    fn start(records: &[&str]) -> Dns {
        let port = free_udp_tcp_port();
        let child = Command::new("dnsmasq")
            .args(["-k", "-C", "/dev/null", "--no-resolv", "--no-hosts"])
            .args(["--bind-interfaces", "--listen-address=127.0.0.1"])
            .args(["--pid-file=", "--user=root", "--log-facility=-"])
            .args(["--local=/test/", "--local-ttl=600"])
            // A zone whose server never answers: lookups there time out.
            .arg("--server=/broken.example/127.0.0.1#9")
            .arg(format!("--port={port}"))
            .args(records)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq is installed (dnsmasq-base in scripts/apt-packages.txt)");
        let dns = Dns { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return dns;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("dnsmasq did not start on port {port}");
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_udp_tcp_port() -> u16 {
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A configuration with the stage `out` (and `extra` lines in it) and a bounce stage.
/// Every peer here is on the loopback, so internal destinations are allowed unless `extra`
/// says otherwise.
fn config(db: &TestDb, dir: &Path, dns: &Dns, smtp_port: u16, extra: &str) -> PathBuf {
    let path = dir.join("pepsi.conf");
    let extra = if extra.contains("ALLOW_INTERNAL_ADDRESSES") {
        extra.to_owned()
    } else {
        format!("ALLOW_INTERNAL_ADDRESSES = yes\n{extra}")
    };
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n\n[stage-out]\nPROGRAM = pepsi-stage-relay-to-internet\n\
             DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 2s\nSMTP_PORT = {smtp_port}\n\
             HELO_NAME = relay.example.test\nBOUNCE_STAGE = bounce\nCONNECT_TIMEOUT = 5s\n\
             GREETING_TIMEOUT = 20s\nCOMMAND_TIMEOUT = 20s\nDATA_TIMEOUT = 20s\n\
             RETRY_INITIAL = 1m\n{extra}\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-bounce\n",
            db.url, dns.port
        ),
    )
    .unwrap();
    path
}

/// A message running at stage `out`, every recipient asking NOTIFY=FAILURE.
async fn message(db: &TestDb, rcpt: &[&str]) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let dsn: Vec<Value> = rcpt
        .iter()
        .map(|r| json!({"notify": ["FAILURE"], "orcpt": format!("rfc822;{r}")}))
        .collect();
    let state = json!({"dsn": {"ret": null, "envid": null, "rcpt": dsn}});
    let (headers, body) = pepsi_contract::message::split(RAW);
    let id: i64 =
        sqlx::query_scalar("SELECT pepsi.workqueue_add('sender@example.test', $1, $2, $3, $4)")
            .bind(&rcpt)
            .bind(headers)
            .bind(body)
            .bind(&state)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    support::claim(&db.pool, id, "out").await;
    id
}

async fn relay(cfg: &Path, ids: &[i64]) -> Vec<String> {
    support::run_ids(RELAY, cfg, ids).await
}

/// The row of `id`, or None when it is gone.
async fn row(db: &TestDb, id: i64) -> Option<support::QueueRow> {
    support::rows(&db.pool)
        .await
        .into_iter()
        .find(|r| r.0 == id)
}

/// (host, address, failures, has succeeded, has failed, expires in more than 500 s).
async fn cache(db: &TestDb) -> Vec<(String, String, i32, bool, bool, bool)> {
    sqlx::query_as(
        "SELECT host, host(address), failures, last_success IS NOT NULL, \
         last_failure IS NOT NULL, expires_at > now() + interval '500 seconds' \
         FROM pepsi.dns_address ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

fn received(peer: &Peer) -> Vec<(String, Vec<String>)> {
    peer.messages()
        .into_iter()
        .map(|m| (m.mail_from, m.rcpt))
        .collect()
}

/// A paused row of stage `out` with its last error.
fn paused_with(row: &support::QueueRow) -> String {
    let (_, stage, status, _, state) = row;
    assert_eq!(
        (stage.as_str(), status.as_str()),
        ("out", "paused"),
        "{row:?}"
    );
    assert_eq!(state["attempts"], 1, "{row:?}");
    state["last_error"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn mx_hosts_are_tried_in_preference_order_and_a_refusing_one_is_skipped() {
    // mx1 (best) refuses connections: nothing listens at 127.0.0.11.
    let (port, peers) = support::smtp_peer::start(&[
        ("127.0.0.12", "mx2.pref.test"),
        ("127.0.0.13", "mx3.pref.test"),
    ])
    .await;
    let dns = Dns::start(&[
        "--mx-host=pref.test,mx3.pref.test,30",
        "--mx-host=pref.test,mx1.pref.test,10",
        "--mx-host=pref.test,mx2.pref.test,20",
        "--host-record=mx1.pref.test,127.0.0.11",
        "--host-record=mx2.pref.test,127.0.0.12",
        "--host-record=mx3.pref.test,127.0.0.13",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let id = message(&db, &["alice@pref.test"]).await;

    assert_eq!(relay(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    let got = peers[0].messages();
    assert_eq!(got.len(), 1, "mx2 took the message");
    assert_eq!(got[0].mail_from, "sender@example.test");
    assert_eq!(got[0].rcpt, vec!["alice@pref.test"]);
    assert_eq!(got[0].data, RAW, "byte for byte, dot-unstuffed");
    assert_eq!(peers[1].connections(), 0, "mx3 is not needed");
    assert!(row(&db, id).await.is_none());
    let helo = peers[0].log.lock().unwrap().commands[0].clone();
    assert_eq!(helo, "EHLO relay.example.test");

    let cache = cache(&db).await;
    assert_eq!(
        cache,
        vec![
            (
                "mx1.pref.test".into(),
                "127.0.0.11".into(),
                1,
                false,
                true,
                true
            ),
            (
                "mx2.pref.test".into(),
                "127.0.0.12".into(),
                0,
                true,
                false,
                true
            ),
        ],
        "mx1's refusal and mx2's success are recorded; mx3 was never resolved"
    );
}

#[tokio::test]
async fn a_domain_without_mx_gets_its_own_addresses_ipv6_first_unless_turned_off() {
    let (port, peers) =
        support::smtp_peer::start(&[("127.0.0.21", "v4.plain.test"), ("::1", "v6.plain.test")])
            .await;
    let dns = Dns::start(&["--host-record=plain.test,127.0.0.21,::1"]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let first = message(&db, &["bob@plain.test"]).await;
    assert_eq!(relay(&cfg, &[first]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(received(&peers[1]).len(), 1, "IPv6 first: ::1");
    assert_eq!(peers[0].connections(), 0);

    let cfg = config(&db, dir.path(), &dns, port, "IPV6 = no\n");
    let second = message(&db, &["bob@plain.test"]).await;
    assert_eq!(relay(&cfg, &[second]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(
        received(&peers[0]),
        vec![("sender@example.test".into(), vec!["bob@plain.test".into()])],
        "IPV6 = no: the A record"
    );
    assert_eq!(received(&peers[1]).len(), 1);
    let hosts: Vec<(String, String)> = cache(&db)
        .await
        .into_iter()
        .map(|(h, a, ..)| (h, a))
        .collect();
    assert_eq!(
        hosts,
        vec![
            ("plain.test".into(), "127.0.0.21".into()),
            ("plain.test".into(), "::1".into())
        ]
    );

    // An IPv4-only re-resolution (its one address marked failed) keeps the IPv6 address.
    sqlx::query("UPDATE pepsi.dns_address SET last_failure = now() WHERE address = '127.0.0.21'")
        .execute(&db.pool)
        .await
        .unwrap();
    let third = message(&db, &["bob@plain.test"]).await;
    assert_eq!(relay(&cfg, &[third]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(received(&peers[0]).len(), 2);
    let after = cache(&db).await;
    assert_eq!(after.len(), 2, "::1 is still known: {after:?}");
    assert!(
        after[0].3 && after[0].2 == 0,
        "127.0.0.21 works again: {after:?}"
    );
}

#[tokio::test]
async fn a_null_mx_a_domain_that_does_not_exist_one_without_addresses_and_a_loop_are_bounced() {
    let dns = Dns::start(&[
        "--mx-host=null.test,.,0",
        // This host (HELO_NAME) is the best MX of loop.test.
        "--mx-host=loop.test,relay.example.test,10",
        "--mx-host=loop.test,backup.loop.test,20",
        // Exists (a TXT record), but has neither MX nor address records.
        "--txt-record=bare.test,nothing here",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, 25, "");
    let null = message(&db, &["carol@null.test"]).await;
    let nx = message(&db, &["dave@nx.test"]).await;
    let looping = message(&db, &["eve@loop.test"]).await;
    let bare = message(&db, &["fay@bare.test"]).await;

    assert_eq!(
        relay(&cfg, &[null, nx, looping, bare]).await,
        vec![r#"0 {"finished":true}"#; 4]
    );
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 4, "one bounce each: {rows:?}");
    let by_rcpt = |r: &str| {
        rows.iter()
            .find(|row| row.3 == vec![r.to_owned()])
            .unwrap_or_else(|| panic!("no bounce for {r}: {rows:?}"))
            .clone()
    };
    let (_, stage, status, _, state) = by_rcpt("carol@null.test");
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    let bounce = &state["bounce"];
    assert_eq!(bounce["kind"], "permanent");
    assert_eq!(bounce["enhanced_status"], "5.1.10");
    assert_eq!(bounce["phase"], "routing");
    let diag = bounce["diagnostic"].as_str().unwrap();
    assert!(
        diag.contains("null.test does not accept mail (null MX"),
        "{diag}"
    );
    assert_eq!(state["dsn"]["rcpt"][0]["orcpt"], "rfc822;carol@null.test");

    let (_, stage, _, _, state) = by_rcpt("dave@nx.test");
    assert_eq!(stage, "bounce");
    assert_eq!(state["bounce"]["enhanced_status"], "5.1.2");
    let diag = state["bounce"]["diagnostic"].as_str().unwrap();
    assert!(diag.contains("nx.test does not exist"), "{diag}");

    let (_, _, _, _, state) = by_rcpt("eve@loop.test");
    assert_eq!(state["bounce"]["enhanced_status"], "5.4.6");
    let diag = state["bounce"]["diagnostic"].as_str().unwrap();
    assert!(
        diag.contains("loops back to this host: relay.example.test is its best MX"),
        "{diag}"
    );

    // No MX and no address: nowhere to deliver, bounced at once (RFC 5321 §5.1).
    let (_, stage, _, _, state) = by_rcpt("fay@bare.test");
    assert_eq!(stage, "bounce");
    assert_eq!(state["bounce"]["enhanced_status"], "5.1.2");
    let diag = state["bounce"]["diagnostic"].as_str().unwrap();
    assert!(
        diag.contains("bare.test has no MX and no address record"),
        "{diag}"
    );
}

#[tokio::test]
async fn an_address_literal_goes_to_that_address_without_dns_or_cache() {
    let (port, peers) = support::smtp_peer::start(&[("127.0.0.27", "literal.peer")]).await;
    let dns = Dns::start(&[]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let ok = message(&db, &["postmaster@[127.0.0.27]"]).await;
    let bad = message(&db, &["postmaster@[not.an.address]"]).await;

    assert_eq!(
        relay(&cfg, &[ok, bad]).await,
        vec![r#"0 {"finished":true}"#; 2]
    );
    assert_eq!(
        received(&peers[0]),
        vec![(
            "sender@example.test".into(),
            vec!["postmaster@[127.0.0.27]".into()]
        )]
    );
    assert!(cache(&db).await.is_empty(), "a literal is not cached");
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "bounce");
    assert_eq!(rows[0].4["bounce"]["enhanced_status"], "5.1.3");
}

#[tokio::test]
async fn mx_hosts_and_literals_in_internal_ranges_are_refused_unless_allowed() {
    let (port, peers) = support::smtp_peer::start(&[("127.0.0.28", "mx.internal.test")]).await;
    let dns = Dns::start(&[
        "--mx-host=internal.test,mx.internal.test,10",
        "--host-record=mx.internal.test,127.0.0.28",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        &dns,
        port,
        "ALLOW_INTERNAL_ADDRESSES = no\n",
    );
    let by_mx = message(&db, &["user@internal.test"]).await;
    let literal = message(&db, &["postmaster@[127.0.0.28]"]).await;
    assert_eq!(
        relay(&cfg, &[by_mx, literal]).await,
        vec![r#"0 {"finished":true}"#; 2]
    );
    assert!(
        received(&peers[0]).is_empty(),
        "nothing connected to the internal host"
    );
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r.1, "bounce", "{r:?}");
        assert_eq!(r.4["bounce"]["enhanced_status"], "5.4.4", "{r:?}");
    }
}

#[tokio::test]
async fn a_peer_slower_than_attempt_timeout_pauses_the_message_and_a_timeout_over_max_runtime_stops_the_worker()
 {
    // A server that takes the connection and never greets.
    let tarpit = std::net::TcpListener::bind("127.0.0.29:0").unwrap();
    let port = tarpit.local_addr().unwrap().port();
    let dns = Dns::start(&[
        "--mx-host=slow.test,mx.slow.test,10",
        "--host-record=mx.slow.test,127.0.0.29",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "ATTEMPT_TIMEOUT = 2s\n");
    let id = message(&db, &["user@slow.test"]).await;
    // GREETING_TIMEOUT is 20 s: the attempt ends at 2 s instead, paused for its retry.
    assert_eq!(relay(&cfg, &[id]).await, vec!["0"]);
    let r = row(&db, id).await.unwrap();
    let last = paused_with(&r);
    assert!(last.contains("ATTEMPT_TIMEOUT (2s)"), "{last}");

    // An ATTEMPT_TIMEOUT the MAX_RUNTIME of its pass cannot hold: the worker does not start.
    let cfg = config(
        &db,
        dir.path(),
        &dns,
        port,
        "ATTEMPT_TIMEOUT = 10m\nMAX_RUNTIME = 5m\n",
    );
    let err = support::worker_start_error(RELAY, &cfg);
    assert!(
        err.contains(
            "ATTEMPT_TIMEOUT = 600s does not end 10s before MAX_RUNTIME = 300s of [stage-out]"
        ),
        "{err}"
    );
    drop(tarpit);
}

#[tokio::test]
async fn a_deferring_peer_pauses_the_message_and_the_retry_delivers_it() {
    let (port, peers) = support::smtp_peer::start(&[("127.0.0.22", "mx.later.test")]).await;
    let dns = Dns::start(&[
        "--mx-host=later.test,mx.later.test,10",
        "--host-record=mx.later.test,127.0.0.22",
    ]);
    peers[0].script(|s| {
        s.rcpt.insert(
            "erin@later.test".into(),
            "451 4.3.0 greylisted, come back later".into(),
        );
    });
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let id = message(&db, &["erin@later.test"]).await;

    assert_eq!(relay(&cfg, &[id]).await, vec!["0"]);
    let r = row(&db, id).await.unwrap();
    let last = paused_with(&r);
    assert_eq!(
        last,
        "451 4.3.0 greylisted, come back later (in reply to RCPT TO command) (from mx.later.test)"
    );
    let timeout: bool = sqlx::query_scalar(
        "SELECT timeout > now() + interval '50 seconds' FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(timeout, "paused for RETRY_INITIAL");
    assert!(peers[0].messages().is_empty());

    // The retry, as the dispatcher would claim it when due.
    peers[0].script(|s| s.rcpt.clear());
    support::claim(&db.pool, id, "out").await;
    assert_eq!(relay(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(
        received(&peers[0]),
        vec![("sender@example.test".into(), vec!["erin@later.test".into()])]
    );
    assert!(support::rows(&db.pool).await.is_empty());
}

#[tokio::test]
async fn three_recipients_are_split_and_the_one_refused_is_bounced_alone() {
    let (port, peers) = support::smtp_peer::start(&[("127.0.0.23", "mx.three.test")]).await;
    let dns = Dns::start(&[
        "--mx-host=three.test,mx.three.test,10",
        "--host-record=mx.three.test,127.0.0.23",
    ]);
    peers[0].script(|s| {
        s.rcpt.insert(
            "nobody@three.test".into(),
            "550 5.1.1 <nobody@three.test>: user unknown".into(),
        );
    });
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let id = message(&db, &["a@three.test", "nobody@three.test", "c@three.test"]).await;

    assert_eq!(relay(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    let siblings = support::rows(&db.pool).await;
    assert_eq!(siblings.len(), 2, "{siblings:?}");
    for (sid, stage, status, rcpt, state) in &siblings {
        assert_eq!((stage.as_str(), status.as_str()), ("out", "pending"));
        assert_eq!(rcpt.len(), 1);
        assert_eq!(
            state["dsn"]["rcpt"],
            json!([{"notify": ["FAILURE"], "orcpt": format!("rfc822;{}", rcpt[0])}])
        );
        support::claim(&db.pool, *sid, "out").await;
    }
    let ids: Vec<i64> = siblings.iter().map(|r| r.0).collect();
    assert_eq!(
        relay(&cfg, &ids).await,
        vec![r#"0 {"finished":true}"#, r#"0 {"finished":true}"#]
    );

    let mut delivered: Vec<String> = peers[0]
        .messages()
        .into_iter()
        .flat_map(|m| m.rcpt)
        .collect();
    delivered.sort();
    assert_eq!(delivered, vec!["a@three.test", "c@three.test"]);
    {
        let log = peers[0].log.lock().unwrap();
        assert_eq!(
            log.connections, 2,
            "one session per worker run: the second sibling reuses the first's"
        );
        assert!(
            log.commands.iter().any(|c| c == "RSET"),
            "{:?}",
            log.commands
        );
    }
    let rows = support::rows(&db.pool).await;
    assert_eq!(rows.len(), 1, "only the bounce is left: {rows:?}");
    let (_, stage, status, rcpt, state) = &rows[0];
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    assert_eq!(rcpt, &vec!["nobody@three.test".to_owned()]);
    let bounce = &state["bounce"];
    assert_eq!(bounce["smtp_code"], 550);
    assert_eq!(bounce["enhanced_status"], "5.1.1");
    assert_eq!(bounce["phase"], "RCPT");
    assert_eq!(bounce["remote_mta"], "mx.three.test");
    assert_eq!(
        bounce["reply_text"],
        "550 5.1.1 <nobody@three.test>: user unknown"
    );
}

#[tokio::test]
async fn a_connection_lost_in_the_middle_of_the_message_is_retried_and_delivered_once() {
    let (port, peers) = support::smtp_peer::start(&[
        ("127.0.0.24", "mx1.drop.test"),
        ("127.0.0.25", "mx2.drop.test"),
    ])
    .await;
    let dns = Dns::start(&[
        "--mx-host=drop.test,mx1.drop.test,10",
        "--mx-host=drop.test,mx2.drop.test,20",
        "--host-record=mx1.drop.test,127.0.0.24",
        "--host-record=mx2.drop.test,127.0.0.25",
    ]);
    peers[0].script(|s| s.drop_in_data = 1);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let id = message(&db, &["frank@drop.test"]).await;

    assert_eq!(relay(&cfg, &[id]).await, vec!["0"]);
    let last = paused_with(&row(&db, id).await.unwrap());
    assert!(
        last.starts_with("4.4.2 ") && last.contains("end of DATA command"),
        "{last}"
    );
    assert_eq!(
        peers[1].connections(),
        0,
        "a server that took the message is not second-guessed by the next MX"
    );

    support::claim(&db.pool, id, "out").await;
    assert_eq!(relay(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(peers[0].messages().len(), 1, "delivered once");
    assert_eq!(peers[0].messages()[0].data, RAW);
    assert!(peers[1].messages().is_empty());
}

#[tokio::test]
async fn after_an_address_refuses_the_next_delivery_uses_another_at_once() {
    // mx.cache.test has two addresses; nothing listens at the first.
    let (port, peers) = support::smtp_peer::start(&[("127.0.0.32", "mx.cache.test")]).await;
    let dns = Dns::start(&[
        "--mx-host=cache.test,mx.cache.test,10",
        "--host-record=mx.cache.test,127.0.0.31",
        "--host-record=mx.cache.test,127.0.0.32",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    // A session per message, so every delivery chooses its address afresh.
    let cfg = config(&db, dir.path(), &dns, port, "CONNECTION_IDLE = 0\n");

    let first = message(&db, &["gina@cache.test"]).await;
    assert_eq!(relay(&cfg, &[first]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(
        cache(&db).await,
        vec![
            (
                "mx.cache.test".into(),
                "127.0.0.31".into(),
                1,
                false,
                true,
                true
            ),
            (
                "mx.cache.test".into(),
                "127.0.0.32".into(),
                0,
                true,
                false,
                true
            ),
        ],
        "untried addresses go in address order: .31 refused, .32 took the message"
    );

    // Within the TTL: the working address first; the refusing one is not tried again.
    let second = message(&db, &["gina@cache.test"]).await;
    let third = message(&db, &["hank@cache.test"]).await;
    assert_eq!(
        relay(&cfg, &[second, third]).await,
        vec![r#"0 {"finished":true}"#, r#"0 {"finished":true}"#]
    );
    assert_eq!(peers[0].messages().len(), 3);
    assert_eq!(peers[0].connections(), 3);
    let after = cache(&db).await;
    assert_eq!(after[0].2, 1, ".31 was not tried again: {after:?}");
    assert_eq!(after[1].2, 0);

    // Once every address has failed, the host is resolved again and all are retried.
    sqlx::query(
        "UPDATE pepsi.dns_address SET last_failure = now(), failures = failures + 1 \
         WHERE address = '127.0.0.32'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let fourth = message(&db, &["ivy@cache.test"]).await;
    assert_eq!(relay(&cfg, &[fourth]).await, vec![r#"0 {"finished":true}"#]);
    let after = cache(&db).await;
    assert_eq!(
        (after[0].2, after[1].2),
        (2, 0),
        "the older failure first: .31 refused again, then .32 worked: {after:?}"
    );
}

#[tokio::test]
async fn bad_dns_answers_and_bad_peers_pause_the_message_with_a_clear_reason() {
    let (port, peers) = support::smtp_peer::start(&[
        ("127.0.0.41", "literal-target"),
        ("127.0.0.42", "mx.long.test"),
        ("127.0.0.43", "mx.garbage.test"),
    ])
    .await;
    peers[1].script(|s| s.greeting = format!("220 {}", "x".repeat(5000)));
    peers[2].script(|s| s.ehlo = "hello, this is not SMTP".into());
    let dns = Dns::start(&[
        "--mx-host=dangling.test,nowhere.dangling.test,10",
        "--mx-host=literal.test,127.0.0.41,10",
        "--mx-host=long.test,mx.long.test,10",
        "--host-record=mx.long.test,127.0.0.42",
        "--mx-host=garbage.test,mx.garbage.test,10",
        "--host-record=mx.garbage.test,127.0.0.43",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "DNS_TIMEOUT = 1s\n");
    let cases = [
        (
            "a@dangling.test",
            "4.4.3 nowhere.dangling.test: no address: the name does not exist (NXDOMAIN)",
        ),
        (
            "b@literal.test",
            "4.4.3 127.0.0.41: the MX record names 127.0.0.41, an IP address, where RFC 5321 §5.1 requires a host name",
        ),
        (
            "c@long.test",
            "4.5.0 mx.long.test [127.0.0.42]: malformed reply to the greeting: reply line over 2000 octets from 127.0.0.42",
        ),
        (
            "d@garbage.test",
            "4.5.0 mx.garbage.test [127.0.0.43]: malformed reply to the EHLO command: expected a reply code from 200 to 599 at the start of \"hello, this is not SMTP\" from mx.garbage.test",
        ),
        (
            "e@broken.example",
            "4.4.3 MX lookup for broken.example: DNS lookup failed: no answer in time",
        ),
    ];
    let mut ids = Vec::new();
    for (rcpt, _) in &cases {
        ids.push(message(&db, &[rcpt]).await);
    }
    assert_eq!(relay(&cfg, &ids).await, vec!["0"; cases.len()]);
    for ((rcpt, want), id) in cases.iter().zip(&ids) {
        let r = row(&db, *id).await.unwrap();
        assert_eq!(r.3, vec![rcpt.to_string()]);
        assert_eq!(paused_with(&r), *want, "{rcpt}");
    }
    assert_eq!(
        peers[0].connections(),
        0,
        "an MX naming an IP address is not connected to"
    );
}

#[tokio::test]
async fn an_eight_bit_message_is_converted_to_seven_bits_for_a_peer_without_8bitmime() {
    let (port, peers) = support::smtp_peer::start(&[("127.0.0.26", "mx.seven.test")]).await;
    peers[0].script(|s| s.ehlo = "250-mx.seven.test\r\n250 PIPELINING".into());
    let dns = Dns::start(&[
        "--mx-host=seven.test,mx.seven.test,10",
        "--host-record=mx.seven.test,127.0.0.26",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), &dns, port, "");
    let id = message(&db, &["jill@seven.test"]).await;

    assert_eq!(relay(&cfg, &[id]).await, vec![r#"0 {"finished":true}"#]);
    let got = peers[0].messages();
    assert_eq!(got.len(), 1);
    let data = &got[0].data;
    assert!(data.is_ascii(), "{}", String::from_utf8_lossy(data));
    let text = String::from_utf8_lossy(data);
    assert!(
        text.contains("Content-Transfer-Encoding: quoted-printable\r\n")
            && text.contains("Gr=C3=BC=C3=9Fe")
            && text.contains("Subject: out\r\n"),
        "{text}"
    );
    let mail = peers[0].log.lock().unwrap().commands[1].clone();
    assert_eq!(mail, "MAIL FROM:<sender@example.test>", "no BODY=8BITMIME");
}

/// A private Postfix (Debian's `postfix`) as the MX of `tls.test`: its smtpd on one
/// loopback address with a certificate for `mx.tls.test` from a CA made here, STARTTLS
/// offered, every accepted message put on hold so it stays in the queue to be read.
struct Postfix {
    dir: tempfile::TempDir,
    port: u16,
}

impl Postfix {
    const ADDRESS: &str = "127.0.0.51";

    fn start() -> Postfix {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Postfix's daemons run as the postfix user and must reach the queue.
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .expect("run openssl");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem"],
            &["-days", "2", "-subj", "/CN=Relay Test CA"],
        ]
        .concat());
        run(&[
            &["req"][..],
            &ec,
            &["-keyout", "mx.key", "-out", "mx.csr"],
            &["-subj", "/CN=mx.tls.test"],
        ]
        .concat());
        std::fs::write(d.join("san.ext"), "subjectAltName=DNS:mx.tls.test\n").unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "mx.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "mx.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);

        let port = std::net::TcpListener::bind((Self::ADDRESS, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let etc = d.join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(d.join("spool")).unwrap();
        std::fs::create_dir_all(d.join("data")).unwrap();
        let chown = Command::new("chown")
            .arg("postfix")
            .arg(d.join("data"))
            .status()
            .expect("chown");
        assert!(
            chown.success(),
            "the postfix user exists (Debian package postfix)"
        );
        let p = d.display();
        std::fs::write(
            etc.join("main.cf"),
            format!(
                "compatibility_level = 3.6\nqueue_directory = {p}/spool\ndata_directory = {p}/data\n\
                 mail_owner = postfix\nmyhostname = mx.tls.test\nmydestination =\n\
                 relay_domains = tls.test\ninet_interfaces = 127.0.0.1\ninet_protocols = ipv4\n\
                 smtpd_tls_cert_file = {p}/mx.pem\nsmtpd_tls_key_file = {p}/mx.key\n\
                 smtpd_tls_security_level = may\nsmtpd_tls_received_header = yes\n\
                 smtpd_recipient_restrictions = check_recipient_access static:HOLD, \
                 permit_auth_destination, reject\n\
                 maillog_file_prefixes = {p}\nmaillog_file = {p}/maillog\n"
            ),
        )
        .unwrap();
        // Only what an smtpd receiving mail needs, none chrooted.
        std::fs::write(
            etc.join("master.cf"),
            format!(
                "{}:{port} inet n - n - - smtpd\ncleanup unix n - n - 0 cleanup\n\
                 qmgr unix n - n 300 1 qmgr\ntlsmgr unix - - n 1000? 1 tlsmgr\n\
                 rewrite unix - - n - - trivial-rewrite\nbounce unix - - n - 0 bounce\n\
                 defer unix - - n - 0 bounce\ntrace unix - - n - 0 bounce\n\
                 proxymap unix - - n - - proxymap\nanvil unix - - n - 1 anvil\n\
                 postlog unix-dgram n - n - 1 postlogd\n",
                Self::ADDRESS
            ),
        )
        .unwrap();
        let pf = Postfix { dir, port };
        let out = Command::new("postfix")
            .arg("-c")
            .arg(&etc)
            .arg("start")
            .output()
            .expect("postfix is installed (postfix in scripts/apt-packages.txt)");
        assert!(
            out.status.success(),
            "postfix start: {out:?} {}",
            pf.maillog()
        );
        for _ in 0..200 {
            if std::net::TcpStream::connect((Self::ADDRESS, port)).is_ok() {
                return pf;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!(
            "postfix did not listen on {}:{port}: {}",
            Self::ADDRESS,
            pf.maillog()
        );
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn maillog(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("maillog")).unwrap_or_default()
    }

    /// The queue files on hold, once `n` are there.
    fn held(&self, n: usize) -> Vec<String> {
        for _ in 0..400 {
            let files: Vec<String> = walk(&self.dir.path().join("spool/hold"))
                .iter()
                .map(|f| String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned())
                .collect();
            if files.len() >= n {
                return files;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("fewer than {n} messages on hold: {}", self.maillog());
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() { walk(&p) } else { vec![p] }
        })
        .collect()
}

impl Drop for Postfix {
    fn drop(&mut self) {
        let _ = Command::new("postfix")
            .arg("-c")
            .arg(self.dir.path().join("etc"))
            .arg("stop")
            .output();
    }
}

#[tokio::test]
async fn postfix_as_the_mx_takes_the_message_over_verified_starttls() {
    let postfix = Postfix::start();
    let dns = Dns::start(&[
        "--mx-host=tls.test,mx.tls.test,10",
        "--host-record=mx.tls.test,127.0.0.51",
        // The same server under a name its certificate does not carry.
        "--mx-host=alias.test,mx.alias.test,10",
        "--host-record=mx.alias.test,127.0.0.51",
    ]);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        &dns,
        postfix.port,
        &format!(
            "TLS_DOMAINS = tls.test:verify, alias.test:verify\nTLS_CA_FILE = {}\n",
            postfix.ca().display()
        ),
    );
    let good = message(&db, &["kim@tls.test"]).await;
    let wrong_name = message(&db, &["lou@alias.test"]).await;

    assert_eq!(
        relay(&cfg, &[good, wrong_name]).await,
        vec![r#"0 {"finished":true}"#, "0"]
    );
    let held = postfix.held(1);
    assert_eq!(held.len(), 1, "{}", postfix.maillog());
    assert!(held[0].contains("kim@tls.test"), "{}", held[0]);
    assert!(held[0].contains("Subject: out"), "{}", held[0]);
    assert!(
        held[0].contains("(using TLSv1."),
        "Postfix records the TLS session in its Received field: {}",
        held[0]
    );
    // smtpd logs the session's command counts when it ends, which is after the worker has
    // exited and its kept session closed: wait for the line.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut log = postfix.maillog();
    while !log.contains("ehlo=2 starttls=1 mail=1 rcpt=1") && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        log = postfix.maillog();
    }
    assert!(
        log.contains("ehlo=2 starttls=1 mail=1 rcpt=1"),
        "EHLO, STARTTLS, EHLO again, then the transaction: {log}"
    );

    let last = paused_with(&row(&db, wrong_name).await.unwrap());
    assert!(
        last.starts_with("4.7.5 mx.alias.test [127.0.0.51]: ") && last.contains("mx.alias.test"),
        "a certificate for mx.tls.test does not do for mx.alias.test: {last}"
    );
}
