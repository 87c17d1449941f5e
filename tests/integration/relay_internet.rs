//! pepsi-stage-relay-to-internet as a worker process against a real PostgreSQL, a real DNS
//! server the test starts (dnsmasq on a free loopback port, answering only from the records
//! each test gives it) and SMTP peers on loopback addresses (tests/integration/support/smtp_peer.rs): MX
//! order and fallback, the implicit MX, null MX and NXDOMAIN, deferrals and retries, a
//! split message with one refused recipient, a connection lost mid-message, the
//! `pepsi.dns_address` cache, bad DNS answers and bad peers, the 7-bit conversion, a
//! private Postfix as the MX taking the message over verified STARTTLS, and MTA-STS
//! policies served over HTTPS by a loopback stand-in (`relay_internet/policy_host.py`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::free_udp_tcp_port;
use crate::support::smtp_peer::Peer;

const RELAY: &str = env!("CARGO_BIN_EXE_pepsi-stage-relay-to-internet");
const TLSRPT: &str = env!("CARGO_BIN_EXE_pepsi-tlsrpt");

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
        // mxta.dane.test too: the DANE-TA test's MX host, whose chain must name it.
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=DNS:mx.tls.test,DNS:mxta.dane.test\n",
        )
        .unwrap();
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

        // The chain Postfix presents ends with the CA, as DANE-TA (RFC 7672 §3.1.2) needs.
        let chain = [
            std::fs::read(d.join("mx.pem")).unwrap(),
            std::fs::read(d.join("ca.pem")).unwrap(),
        ]
        .concat();
        std::fs::write(d.join("chain.pem"), chain).unwrap();
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
                 relay_domains = tls.test, good.test, outside.test, wrongcert.test, testing.test, missing.test, ok.dane.test, bad.dane.test, ta.dane.test, plain.test\ninet_interfaces = 127.0.0.1\ninet_protocols = ipv4\n\
                 smtpd_tls_cert_file = {p}/chain.pem\nsmtpd_tls_key_file = {p}/mx.key\n\
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

    /// Issues `<name>.pem` and `<name>.key` from this MX's CA for `sans` (a subjectAltName
    /// value: `DNS:a.test,IP:127.0.0.1`), for the other TLS servers of a test.
    fn issue(&self, name: &str, sans: &str) {
        let d = self.dir.path();
        std::fs::write(
            d.join(format!("{name}.ext")),
            format!("subjectAltName={sans}\n"),
        )
        .unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .unwrap();
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
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

/// The MTA-STS policy hosts of a test: one HTTPS server (`relay_internet/policy_host.py`)
/// on 127.0.0.52 with a certificate from the Postfix MX's CA naming every `mta-sts.<domain>`,
/// serving what `policies.json` says.
struct PolicyHost {
    child: Child,
    port: u16,
    policies: PathBuf,
    log: PathBuf,
}

impl PolicyHost {
    const ADDRESS: &str = "127.0.0.52";

    fn start(postfix: &Postfix, domains: &[&str]) -> PolicyHost {
        let d = postfix.dir.path();
        let sans: Vec<String> = domains.iter().map(|x| format!("DNS:mta-sts.{x}")).collect();
        postfix.issue("sts", &sans.join(","));
        let port = std::net::TcpListener::bind((Self::ADDRESS, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let policies = d.join("policies.json");
        let log = d.join("policy-requests.log");
        std::fs::write(&policies, "{}").unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/integration/relay_internet/policy_host.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args([Self::ADDRESS, &port.to_string()])
            .args([
                d.join("sts.pem"),
                d.join("sts.key"),
                policies.clone(),
                log.clone(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready.trim(), "ready");
        PolicyHost {
            child,
            port,
            policies,
            log,
        }
    }

    /// Serves `policy` for `domain` from now on.
    fn serve(&self, domain: &str, policy: &str) {
        let mut all: Value =
            serde_json::from_str(&std::fs::read_to_string(&self.policies).unwrap()).unwrap();
        all[format!("mta-sts.{domain}")] =
            json!({"status": 200, "type": "text/plain", "body": policy});
        std::fs::write(&self.policies, all.to_string()).unwrap();
    }

    /// How many times `domain`'s policy was asked for.
    fn fetches(&self, domain: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(&format!("mta-sts.{domain} ")))
            .count()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PolicyHost {
    fn drop(&mut self) {
        self.stop();
    }
}

fn sts_policy(mode: &str, mx: &[&str]) -> String {
    let mut text = format!("version: STSv1\r\nmode: {mode}\r\n");
    for m in mx {
        text.push_str(&format!("mx: {m}\r\n"));
    }
    text + "max_age: 86400\r\n"
}

/// (domain, policy type, mx host, result, sessions) counted for the TLS reports.
async fn tls_results(db: &TestDb) -> Vec<(String, String, String, String, i64)> {
    sqlx::query_as(
        "SELECT domain, policy_type, mx_host, result_type, sessions \
         FROM pepsi.tls_report_result ORDER BY 1, 3, 4",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn mta_sts_enforce_refuses_an_mx_outside_the_policy_and_a_wrong_certificate_while_testing_delivers_and_counts()
 {
    let postfix = Postfix::start();
    // missing.test announces a policy its host does not serve (404).
    let domains = [
        "good.test",
        "outside.test",
        "wrongcert.test",
        "testing.test",
        "missing.test",
    ];
    let mut host = PolicyHost::start(&postfix, &domains);
    host.serve("good.test", &sts_policy("enforce", &["mx.tls.test"]));
    host.serve("outside.test", &sts_policy("enforce", &["mx.other.test"]));
    host.serve("wrongcert.test", &sts_policy("enforce", &["*.alias.test"]));
    host.serve(
        "testing.test",
        &sts_policy("testing", &["mx.other.test", "*.alias.test"]),
    );
    let mut records = vec![
        "--host-record=mx.tls.test,127.0.0.51".to_owned(),
        // The Postfix MX under a name its certificate does not carry.
        "--host-record=mx.alias.test,127.0.0.51".to_owned(),
    ];
    for (domain, mx) in [
        ("good.test", "mx.tls.test"),
        ("outside.test", "mx.tls.test"),
        ("wrongcert.test", "mx.alias.test"),
        ("testing.test", "mx.alias.test"),
        ("missing.test", "mx.tls.test"),
    ] {
        records.push(format!("--mx-host={domain},{mx},10"));
        records.push(format!(
            "--txt-record=_mta-sts.{domain},v=STSv1; id=first1;"
        ));
        records.push(format!(
            "--host-record=mta-sts.{domain},{}",
            PolicyHost::ADDRESS
        ));
    }
    // testing.test wants TLS reports by mail (RFC 8460 §3), good.test by HTTPS POST to a
    // pepsi-httpd of its own.
    records.push(
        "--txt-record=_smtp._tls.testing.test,v=TLSRPTv1; rua=mailto:tls@testing.test".into(),
    );
    let reports_port = support::free_port();
    records.push(format!(
        "--txt-record=_smtp._tls.good.test,v=TLSRPTv1; rua=https://reports.good.test:{reports_port}/tlsrpt"
    ));
    records.push("--host-record=reports.good.test,127.0.0.1".into());
    let records: Vec<&str> = records.iter().map(String::as_str).collect();
    let dns = Dns::start(&records);
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = postfix.ca().display().to_string();
    let cfg = config(
        &db,
        dir.path(),
        &dns,
        postfix.port,
        &format!(
            "TLS_CA_FILE = {ca}\nMTA_STS_CA_FILE = {ca}\nMTA_STS_PORT = {}\n",
            host.port
        ),
    );
    let good = message(&db, &["kim@good.test"]).await;
    let outside = message(&db, &["lou@outside.test"]).await;
    let wrong = message(&db, &["max@wrongcert.test"]).await;
    let testing = message(&db, &["ned@testing.test"]).await;
    let missing = [
        message(&db, &["oz@missing.test"]).await,
        message(&db, &["pia@missing.test"]).await,
    ];
    assert_eq!(
        relay(
            &cfg,
            &[good, outside, wrong, testing, missing[0], missing[1]]
        )
        .await,
        vec![
            r#"0 {"finished":true}"#,
            "0",
            "0",
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#
        ]
    );

    // enforce: delivered over verified TLS to the MX the policy names …
    let held = postfix.held(4);
    assert_eq!(held.len(), 4, "{}", postfix.maillog());
    // … a policy announced but not served: delivered as without one …
    assert!(
        held.iter().any(|m| m.contains("oz@missing.test")),
        "{held:?}"
    );
    assert!(
        held.iter()
            .any(|m| m.contains("kim@good.test") && m.contains("(using TLSv1."))
    );
    // … testing: delivered although the certificate does not name the MX …
    assert!(
        held.iter().any(|m| m.contains("ned@testing.test")),
        "{held:?}"
    );
    // … and nothing for the two enforce domains whose MX fails the policy, not even in clear.
    assert!(
        !held
            .iter()
            .any(|m| m.contains("lou@") || m.contains("max@")),
        "{held:?}"
    );
    let last = paused_with(&row(&db, outside).await.unwrap());
    assert!(
        last.starts_with("4.7.5 mx.tls.test: not tried: mx.tls.test is not an MX host the MTA-STS policy of outside.test names"),
        "{last}"
    );
    let last = paused_with(&row(&db, wrong).await.unwrap());
    assert!(
        last.starts_with("4.7.5 mx.alias.test [127.0.0.51]: ")
            && last.contains("not trusted for mx.alias.test"),
        "a certificate for mx.tls.test does not do for mx.alias.test: {last}"
    );

    // Every policy was fetched once and is cached with its id and mode.
    // (missing.test's failed fetch stood for its second message: MTA_STS_FETCH_BACKOFF)
    for d in domains {
        assert_eq!(host.fetches(d), 1, "{d}");
    }
    let cached: Vec<(String, String, String, bool)> = sqlx::query_as(
        "SELECT domain, policy_id, mode, expires_at > now() + interval '23 hours' \
         FROM pepsi.mta_sts_policy ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        cached,
        [
            ("good.test", "enforce"),
            ("outside.test", "enforce"),
            ("testing.test", "testing"),
            ("wrongcert.test", "enforce")
        ]
        .map(|(d, m)| (d.to_owned(), "first1".to_owned(), m.to_owned(), true))
    );

    // The TLS results, as the daily report will count them.
    let results = tls_results(&db).await;
    let has = |domain: &str, mx: &str, result: &str| {
        results
            .iter()
            .any(|r| r.0 == domain && r.1 == "sts" && r.2 == mx && r.3 == result && r.4 >= 1)
    };
    assert!(has("good.test", "mx.tls.test", "success"), "{results:?}");
    assert!(
        has("outside.test", "mx.tls.test", "validation-failure"),
        "{results:?}"
    );
    assert!(
        has(
            "wrongcert.test",
            "mx.alias.test",
            "certificate-host-mismatch"
        ),
        "{results:?}"
    );
    assert!(
        has("testing.test", "mx.alias.test", "certificate-host-mismatch"),
        "{results:?}"
    );
    assert!(
        !has("testing.test", "mx.alias.test", "success"),
        "{results:?}"
    );
    assert!(
        results.iter().any(|r| r.0 == "missing.test"
            && r.1 == "sts"
            && r.3 == "sts-policy-fetch-error"
            && r.4 == 2),
        "{results:?}"
    );

    // The same id within MTA_STS_REFRESH: the cached policy, no fetch.
    let again = message(&db, &["kim@good.test"]).await;
    assert_eq!(relay(&cfg, &[again]).await, vec![r#"0 {"finished":true}"#]);
    assert_eq!(host.fetches("good.test"), 1);
    // Older than MTA_STS_REFRESH: fetched again (now testing) and stored anew.
    host.serve("good.test", &sts_policy("testing", &["mx.tls.test"]));
    sqlx::query(
        "UPDATE pepsi.mta_sts_policy SET fetched_at = now() - interval '2 days' \
         WHERE domain = 'good.test'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let refreshed = message(&db, &["kim@good.test"]).await;
    assert_eq!(
        relay(&cfg, &[refreshed]).await,
        vec![r#"0 {"finished":true}"#]
    );
    assert_eq!(host.fetches("good.test"), 2);
    let mode: String =
        sqlx::query_scalar("SELECT mode FROM pepsi.mta_sts_policy WHERE domain = 'good.test'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(mode, "testing");

    // With the policy host gone, the cached enforce policy still holds until its max_age.
    host.stop();
    let blocked = message(&db, &["lou@outside.test"]).await;
    assert_eq!(relay(&cfg, &[blocked]).await, vec!["0"]);
    let last = paused_with(&row(&db, blocked).await.unwrap());
    assert!(
        last.contains("is not an MX host the MTA-STS policy of outside.test names"),
        "{last}"
    );
    let error: Option<String> = sqlx::query_scalar(
        "SELECT refresh_error FROM pepsi.mta_sts_policy WHERE domain = 'outside.test'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(error, None, "within MTA_STS_REFRESH no fetch was tried");
    sqlx::query("UPDATE pepsi.mta_sts_policy SET fetched_at = now() - interval '2 days'")
        .execute(&db.pool)
        .await
        .unwrap();
    let blocked = message(&db, &["lou@outside.test"]).await;
    assert_eq!(relay(&cfg, &[blocked]).await, vec!["0"]);
    assert!(
        paused_with(&row(&db, blocked).await.unwrap()).contains("MTA-STS policy of outside.test")
    );
    let error: Option<String> = sqlx::query_scalar(
        "SELECT refresh_error FROM pepsi.mta_sts_policy WHERE domain = 'outside.test'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        error.is_some_and(|e| e.contains("mta-sts.outside.test")),
        "the failed refresh is noted"
    );

    // The day's TLS report goes to the one domain that asks for it, as a queued mail that
    // an independent reader takes for RFC 8460's, and pepsi-tlsrpt reads it back.
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "\n[pepsi-tlsrpt]\nDNS_SERVERS = 127.0.0.1:{}\nORGANIZATION = Relay Test\n\
         CONTACT = postmaster@relay.example.test\nHOSTNAME = relay.example.test\n\
         HTTPS_CA_FILE = {}\nALLOW_INTERNAL_ADDRESSES = yes\n",
        dns.port,
        postfix.ca().display()
    ));
    std::fs::write(&cfg, text).unwrap();
    // good.test's report host: a real pepsi-httpd over HTTPS taking reports at /tlsrpt.
    postfix.issue("reports", "DNS:reports.good.test,IP:127.0.0.1");
    let p = postfix.dir.path();
    let httpd_config = support::httpd::write_config(
        dir.path(),
        &db.url,
        reports_port,
        &format!(
            "CERT_FILE = {}\nKEY_FILE = {}\nTLSRPT_UPLOAD = yes\n",
            p.join("reports.pem").display(),
            p.join("reports.key").display()
        ),
    );
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let trusting = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(postfix.ca()).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let mut reports =
        support::httpd::Httpd::new(httpd_config, reports_port).with_client(trusting, "https");
    reports.start().await;
    let today = chrono::Utc::now().date_naive().to_string();
    let tlsrpt = |args: &[&str], stdin: &[u8]| {
        let mut child = Command::new(TLSRPT)
            .arg("-c")
            .arg(&cfg)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = tlsrpt(&["send", "--day", &today, "--json"], b"");
    assert_eq!(code, Some(0), "{out}{err}");
    let sent: Value = serde_json::from_str(&out).unwrap();
    let sent = sent.as_array().unwrap();
    assert_eq!(
        sent.len(),
        2,
        "only good.test and testing.test publish _smtp._tls: {out}"
    );
    assert_eq!(sent[0]["domain"], "good.test");
    assert_eq!(
        sent[0]["rua"],
        format!("https://reports.good.test:{reports_port}/tlsrpt")
    );
    assert_eq!(sent[0]["outcome"], "sent", "{out}");
    // The POSTed report is in the report host's table, as its pepsi-httpd read it.
    let posted: Vec<(String, String)> =
        sqlx::query_as("SELECT report_id, source FROM pepsi.tls_report_received")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert!(
        posted[0].0.contains("good.test@relay.example.test"),
        "{posted:?}"
    );
    assert!(
        posted[0].1.starts_with("https from 127.0.0.1"),
        "{posted:?}"
    );
    assert_eq!(sent[1]["domain"], "testing.test");
    assert_eq!(sent[1]["rua"], "mailto:tls@testing.test");
    assert_eq!(sent[1]["outcome"], "sent");
    let queued = sent[1]["queue_id"].as_i64().unwrap();
    let (rcpt, headers, body): (Vec<String>, Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT q.rcpt_to, q.headers, b.body FROM pepsi.workqueue q \
         JOIN pepsi.workqueue_body b USING (body_id) WHERE q.workqueue_id = $1",
    )
    .bind(queued)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rcpt, ["tls@testing.test"]);
    let raw = [headers, body].concat();
    let check = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/integration/relay_internet/tlsrpt_check.py");
    let mut child = Command::new("python3")
        .arg(check)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &raw).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["organization-name"], "Relay Test");
    let policy = &report["policies"][0];
    assert_eq!(policy["policy"]["policy-type"], "sts");
    assert_eq!(policy["policy"]["policy-domain"], "testing.test");
    assert!(
        policy["policy"]["policy-string"]
            .as_array()
            .unwrap()
            .contains(&json!("mode: testing")),
        "{report}"
    );
    let details = policy["failure-details"].as_array().unwrap();
    assert!(
        details
            .iter()
            .any(|d| d["result-type"] == "certificate-host-mismatch"
                && d["receiving-mx-hostname"] == "mx.alias.test"),
        "{report}"
    );

    // A second run sends nothing twice.
    let (code, out, _) = tlsrpt(&["send", "--day", &today, "--json"], b"");
    assert_eq!(code, Some(0));
    assert!(out.contains("already sent"), "{out}");

    // The mail read back from the report mailbox's Maildir: imported once (and moved to
    // cur/), known the second time, summarised per organisation and failure.
    let maildir = dir.path().join("Maildir");
    for sub in ["new", "cur", "tmp"] {
        std::fs::create_dir_all(maildir.join(sub)).unwrap();
    }
    std::fs::write(maildir.join("new/1.report"), &raw).unwrap();
    let (code, out, err) = tlsrpt(&["import", "--maildir", maildir.to_str().unwrap()], b"");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 report(s) imported"), "{out}");
    assert!(
        maildir.join("cur/1.report:2,S").exists(),
        "moved to cur/, seen"
    );
    let (_, out, _) = tlsrpt(&["import", "-"], &raw);
    assert!(
        out.contains("0 report(s) imported, 1 already known"),
        "{out}"
    );
    let (code, out, _) = tlsrpt(&["summary", "--json"], b"");
    assert_eq!(code, Some(0));
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary[0]["organization"], "Relay Test");
    assert_eq!(summary[0]["domain"], "testing.test");
    assert_eq!(summary[0]["result"], "certificate-host-mismatch");
    // Not a report: refused, exit 2, nothing kept.
    let (code, _, err) = tlsrpt(&["import", "-"], b"From: a@b\r\n\r\nhello\r\n");
    assert_eq!(code, Some(2));
    assert!(err.contains("no application/tlsrpt"), "{err}");
}

/// A DNSSEC-signed zone `dane.test` and an unsigned zone `plain.test`, served by a real
/// authoritative server (nsd) and looked up through a real validating resolver (unbound)
/// that holds `dane.test`'s DS as its trust anchor; both on free loopback ports. The
/// resolver stands in the `Dns` a relay configuration points at.
fn dnssec_zones(dir: &Path, dane_zone: &str, plain_zone: &str) -> (Dns, Child) {
    let run = |cmd: &mut Command| {
        let out = cmd.current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    std::fs::write(dir.join("dane.test.zone"), dane_zone).unwrap();
    std::fs::write(dir.join("plain.test.zone"), plain_zone).unwrap();
    let key = run(Command::new("ldns-keygen").args(["-a", "ECDSAP256SHA256", "-k", "dane.test"]));
    let key = key.trim();
    run(Command::new("ldns-signzone").args(["dane.test.zone", key]));
    let nsd_port = free_udp_tcp_port();
    let d = dir.display();
    std::fs::write(
        dir.join("nsd.conf"),
        format!(
            "server:\n  ip-address: 127.0.0.1@{nsd_port}\n  port: {nsd_port}\n  username: \"\"\n\
             chroot: \"\"\n  zonesdir: \"{d}\"\n  database: \"\"\n  pidfile: \"{d}/nsd.pid\"\n\
             logfile: \"{d}/nsd.log\"\n  xfrdfile: \"{d}/xfrd.state\"\n  zonelistfile: \"{d}/zone.list\"\n\
             xfrdir: \"{d}\"\n  do-ip6: no\nremote-control:\n  control-enable: no\n\
             zone:\n  name: dane.test\n  zonefile: dane.test.zone.signed\n\
             zone:\n  name: plain.test\n  zonefile: plain.test.zone\n"
        ),
    )
    .unwrap();
    let nsd = Command::new("nsd")
        .args(["-d", "-c"])
        .arg(dir.join("nsd.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nsd is installed (nsd in scripts/apt-packages.txt)");
    let port = free_udp_tcp_port();
    std::fs::write(
        dir.join("unbound.conf"),
        format!(
            "server:\n  interface: 127.0.0.1@{port}\n  port: {port}\n  do-daemonize: no\n\
             username: \"\"\n  chroot: \"\"\n  directory: \"{d}\"\n  pidfile: \"\"\n\
             logfile: \"{d}/unbound.log\"\n  use-syslog: no\n  do-not-query-localhost: no\n\
             access-control: 127.0.0.0/8 allow\n  trust-anchor-file: \"{d}/{key}.ds\"\n\
             module-config: \"validator iterator\"\n  qname-minimisation: no\n  do-ip6: no\n\
             local-zone: \"test.\" nodefault\n\
             stub-zone:\n  name: \"dane.test\"\n  stub-addr: 127.0.0.1@{nsd_port}\n\
             stub-zone:\n  name: \"plain.test\"\n  stub-addr: 127.0.0.1@{nsd_port}\n"
        ),
    )
    .unwrap();
    let unbound = Command::new("unbound")
        .args(["-d", "-c"])
        .arg(dir.join("unbound.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("unbound is installed (unbound in scripts/apt-packages.txt)");
    for p in [nsd_port, port] {
        let mut up = false;
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", p)).is_ok() {
                up = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        assert!(up, "nsd or unbound did not listen on {p}");
    }
    (
        Dns {
            child: unbound,
            port,
        },
        nsd,
    )
}

#[tokio::test]
async fn dane_needs_a_certificate_matching_a_secure_tlsa_record_wins_over_mta_sts_and_an_unsigned_zone_stays_opportunistic()
 {
    let postfix = Postfix::start();
    let dir = tempfile::tempdir().unwrap();
    // SHA-256 in hex of what a shell pipeline over the Postfix MX's files prints, by openssl.
    let sha256 = |pipeline: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{pipeline} | openssl dgst -sha256 -r"))
            .current_dir(postfix.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_whitespace().next().unwrap().to_owned()
    };
    // Its key as a DANE-EE record names it (3 1 1), its CA as a DANE-TA one (2 0 1).
    let hash = sha256("openssl x509 -in mx.pem -noout -pubkey | openssl pkey -pubin -outform DER");
    let ca_hash = sha256("openssl x509 -in ca.pem -outform DER");
    let wrong = "00".repeat(32);
    let policy_host = PolicyHost::ADDRESS;
    let soa = |zone: &str| {
        format!(
            "$ORIGIN {zone}.\n$TTL 600\n@ IN SOA ns.{zone}. hostmaster.{zone}. 1 3600 600 86400 600\n\
             @ IN NS ns.{zone}.\nns IN A 127.0.0.1\n"
        )
    };
    let dane_zone = format!(
        "{}ok IN MX 10 mx.dane.test.\nbad IN MX 10 mxbad.dane.test.\n\
         ta IN MX 10 mxta.dane.test.\n\
         mx IN A 127.0.0.51\nmxbad IN A 127.0.0.51\nmxta IN A 127.0.0.51\n\
         _25._tcp.mx IN TLSA 3 1 1 {hash}\n_25._tcp.mxbad IN TLSA 3 1 1 {wrong}\n\
         _25._tcp.mxta IN TLSA 2 0 1 {ca_hash}\n\
         _mta-sts.ok IN TXT \"v=STSv1; id=d1;\"\nmta-sts.ok IN A {policy_host}\n",
        soa("dane.test")
    );
    // Unsigned: its TLSA record (which would not match) is not to be trusted, so ignored.
    let plain_zone = format!(
        "{}@ IN MX 10 mx.plain.test.\nmx IN A 127.0.0.51\n_25._tcp.mx IN TLSA 3 1 1 {wrong}\n",
        soa("plain.test")
    );
    let (dns, mut nsd) = dnssec_zones(dir.path(), &dane_zone, &plain_zone);
    // ok.dane.test also publishes an MTA-STS policy that names another MX: DANE wins.
    let host = PolicyHost::start(&postfix, &["ok.dane.test"]);
    host.serve(
        "ok.dane.test",
        &sts_policy("enforce", &["mx.elsewhere.test"]),
    );
    let db = TestDb::new().await;
    let cfg = config(
        &db,
        dir.path(),
        &dns,
        postfix.port,
        &format!(
            "DANE = yes\nMTA_STS_CA_FILE = {}\nMTA_STS_PORT = {}\n",
            postfix.ca().display(),
            host.port
        ),
    );
    let ok = message(&db, &["kim@ok.dane.test"]).await;
    let bad = message(&db, &["lou@bad.dane.test"]).await;
    let plain = message(&db, &["max@plain.test"]).await;
    let ta = message(&db, &["ned@ta.dane.test"]).await;
    let answers = relay(&cfg, &[ok, bad, plain, ta]).await;
    let _ = nsd.kill();
    let _ = nsd.wait();
    assert_eq!(
        answers,
        vec![
            r#"0 {"finished":true}"#,
            "0",
            r#"0 {"finished":true}"#,
            r#"0 {"finished":true}"#
        ]
    );
    let held = postfix.held(3);
    assert_eq!(held.len(), 3, "{}", postfix.maillog());
    assert!(
        held.iter().any(|m| m.contains("ned@ta.dane.test")),
        "DANE-TA: the chain verifies to the CA its TLSA record names: {held:?}"
    );
    assert!(
        held.iter()
            .any(|m| m.contains("kim@ok.dane.test") && m.contains("(using TLSv1.")),
        "{held:?}"
    );
    assert!(
        held.iter().any(|m| m.contains("max@plain.test")),
        "{held:?}"
    );
    assert!(
        !held.iter().any(|m| m.contains("lou@")),
        "never in clear: {held:?}"
    );
    let last = paused_with(&row(&db, bad).await.unwrap());
    assert!(
        last.starts_with("4.7.5 mxbad.dane.test [127.0.0.51]: ") && last.contains("TLSA"),
        "a certificate matching no TLSA record defers: {last}"
    );
    let results = tls_results(&db).await;
    let has = |domain: &str, policy: &str, result: &str| {
        results
            .iter()
            .any(|r| r.0 == domain && r.1 == policy && r.3 == result)
    };
    assert!(has("ok.dane.test", "tlsa", "success"), "{results:?}");
    // The enforce policy was in force, and did not keep mail from the DANE host.
    let mode: String =
        sqlx::query_scalar("SELECT mode FROM pepsi.mta_sts_policy WHERE domain = 'ok.dane.test'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(mode, "enforce");
    assert!(has("ta.dane.test", "tlsa", "success"), "{results:?}");
    assert!(has("bad.dane.test", "tlsa", "tlsa-invalid"), "{results:?}");
    assert!(
        has("plain.test", "no-policy-found", "success"),
        "{results:?}"
    );
}
