//! PostgreSQL failover (docs/ha.md, "PostgreSQL"): a private primary with a streaming
//! standby made by `pg_basebackup -R`, and in front of it a proxy port standing for HAProxy
//! on Patroni's `/primary` check. The real ingress, dispatcher and workers reach the
//! database only through the proxy; the test crashes the primary, promotes the standby and
//! repoints the proxy, as the deployment of docs/ha.md does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use pepsi_testkit::pg_cluster::{PgCluster, Replication};
use pepsi_testkit::proxy::Proxy;
use sqlx::{Connection as _, PgConnection};

use crate::support::ingress::{Client, queued_id};
use crate::support::system::System;

/// The ingress's ADMISSION_TIMEOUT in these tests.
const ADMISSION: Duration = Duration::from_secs(3);

/// What the transaction of one numbered message got.
#[derive(Clone, Debug)]
enum Outcome {
    /// 250 with this queue id.
    Queued(i64),
    /// Another reply (code, the command and its text) before or at the end of data.
    Refused(u16, String),
}

/// One transaction for message `n` (Subject: failover-<n>), to alice@example.test. The
/// ingress must answer every command, DATA's end included, within ADMISSION_TIMEOUT plus a
/// margin, whatever the database does.
async fn attempt(port: u16, n: u64) -> Outcome {
    let limit = ADMISSION + Duration::from_secs(10);
    let transaction = async {
        let (mut c, greeting) = Client::connect_raw(port).await;
        if greeting.0 != 220 {
            return Outcome::Refused(greeting.0, format!("greeting: {}", greeting.1));
        }
        for (cmd, want) in [
            ("EHLO client.example.org", 250),
            ("MAIL FROM:<sender@example.org>", 250),
            ("RCPT TO:<alice@example.test>", 250),
            ("DATA", 354),
        ] {
            let (code, text) = c.cmd(cmd).await;
            if code != want {
                return Outcome::Refused(code, format!("{cmd}: {text}"));
            }
        }
        c.send(
            format!(
                "From: sender@example.org\r\nTo: alice@example.test\r\n\
                 Subject: failover-{n}\r\n\r\nmessage {n}\r\n.\r\n"
            )
            .as_bytes(),
        )
        .await;
        match c.read().await {
            (250, text) => Outcome::Queued(queued_id(&text)),
            (code, text) => Outcome::Refused(code, format!("end of data: {text}")),
        }
    };
    tokio::time::timeout(limit, transaction)
        .await
        .unwrap_or_else(|_| panic!("message {n}: no answer within {limit:?}"))
}

/// The message numbers in `user`'s Maildir, with how often each is there.
fn delivered(sys: &System, user: &str) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    for message in sys.messages(user) {
        let text = String::from_utf8_lossy(&message);
        let n = text
            .lines()
            .find_map(|l| l.strip_prefix("Subject: failover-"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("a message that is not the test's: {text}"));
        *seen.entry(n).or_insert(0) += 1;
    }
    seen
}

/// The queue ids in `database` on the server at `port`, read directly (not through the proxy).
async fn queued_ids(cluster: &PgCluster, port: u16, database: &str) -> BTreeSet<i64> {
    let mut conn = PgConnection::connect(&cluster.url(port, database))
        .await
        .unwrap_or_else(|e| panic!("connect to {database} on port {port}: {e}"));
    let ids: Vec<i64> = sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    conn.close().await.ok();
    ids.into_iter().collect()
}

/// Clients sending numbered messages one after another until stopped; each outcome is kept
/// with the phase of the test its transaction began in.
struct Load {
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicU8>,
    outcomes: Arc<Mutex<Vec<(u8, u64, Outcome)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(AtomicU8::new(0));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let next = Arc::new(AtomicU64::new(1));
        let tasks = (0..clients)
            .map(|_| {
                let (stop, phase, outcomes, next) =
                    (stop.clone(), phase.clone(), outcomes.clone(), next.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Acquire) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let began = phase.load(Ordering::Acquire);
                        let outcome = attempt(port, n).await;
                        if matches!(outcome, Outcome::Refused(..)) {
                            // A refused client waits a little before its next try, as MTAs do.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        outcomes.lock().unwrap().push((began, n, outcome));
                    }
                })
            })
            .collect();
        Load {
            stop,
            phase,
            outcomes,
            tasks,
        }
    }

    fn enter(&self, phase: u8) {
        self.phase.store(phase, Ordering::Release);
    }

    /// The messages that got a 250: number → queue id.
    fn queued(&self) -> BTreeMap<u64, i64> {
        self.outcomes
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, n, o)| match o {
                Outcome::Queued(id) => Some((*n, *id)),
                Outcome::Refused(..) => None,
            })
            .collect()
    }

    /// How many transactions begun in `phase` got a 250.
    fn queued_in(&self, phase: u8) -> usize {
        self.outcomes
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, o)| *p == phase && matches!(o, Outcome::Queued(_)))
            .count()
    }

    async fn wait_queued_in(&self, phase: u8, n: usize, sys: &System) {
        let until = Instant::now() + Duration::from_secs(90);
        while self.queued_in(phase) < n {
            assert!(
                Instant::now() < until,
                "fewer than {n} messages queued in phase {phase} after 90 s: {:#?}\n{}",
                self.outcomes.lock().unwrap(),
                sys.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish(self) -> Vec<(u8, u64, Outcome)> {
        self.stop.store(true, Ordering::Release);
        for task in self.tasks {
            task.await.expect("a sending client failed");
        }
        Arc::try_unwrap(self.outcomes)
            .expect("the clients are done")
            .into_inner()
            .unwrap()
    }
}

/// The acceptance run: mail flows through the proxy to a primary with a synchronous standby;
/// the primary crashes (immediate stop) and the proxy refuses connections as HAProxy does
/// once its check fails; the standby is promoted. Every queue id that got a 250 is on the
/// new primary (or its message was delivered already). Once the proxy points at the new
/// primary, every program carries on without a restart: the ingress queues again, the
/// dispatcher has taken its lock again and LISTENs again, and every acknowledged message
/// reaches the Maildir (a message whose delivery was in flight at the crash may arrive
/// twice, never not at all). While no primary accepts writes, clients get 4xx, never 5xx,
/// and never wait past ADMISSION_TIMEOUT.
#[tokio::test(flavor = "multi_thread")]
async fn after_failover_to_the_synchronous_standby_every_acknowledged_message_is_delivered() {
    let cluster = PgCluster::start(Replication::Synchronous).await;
    let proxy = Proxy::start(Some(cluster.primary.port));
    let db = TestDb::on(&cluster.url(proxy.port, "postgres")).await;
    let name = db.name.clone();
    // A LOCK_SESSION_TIMEOUT longer than the outage: the dispatcher keeps its epoch and
    // takes its lock again on the new primary instead of exiting. A short ORPHAN_GRACE: a
    // row whose hand-back was lost with the old primary runs again soon.
    let mut sys = System::with_db(
        db,
        &format!(
            "[pepsi-ingress]\nADMISSION_TIMEOUT = {}s\n\n\
             [pepsi-dispatch]\nLOCK_SESSION_TIMEOUT = 60s\nORPHAN_GRACE = 3s\n",
            ADMISSION.as_secs()
        ),
        &["alice"],
    )
    .await;
    sys.start().await;
    let dispatcher = sys.dispatcher_pid();
    let load = Load::start(sys.port, 4);
    load.wait_queued_in(0, 40, &sys).await;

    // The primary crashes; the proxy's check fails and it refuses new connections.
    load.enter(1);
    cluster.stop_immediately(&cluster.primary).await;
    proxy.point(None);
    tokio::time::sleep(ADMISSION + Duration::from_secs(2)).await;
    cluster.promote().await;

    // Before any program reaches it: every 250 so far is on the new primary, or delivered.
    let acknowledged = load.queued();
    let on_new_primary = queued_ids(&cluster, cluster.standby.port, &name).await;
    let in_maildir = delivered(&sys, "alice");
    let lost: Vec<(&u64, &i64)> = acknowledged
        .iter()
        .filter(|(n, id)| !on_new_primary.contains(id) && !in_maildir.contains_key(n))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged (number, queue id) neither on the promoted standby nor delivered: \
         {lost:?}\n{}",
        cluster.log(&cluster.standby)
    );

    // The proxy follows the new primary; mail flows again without restarting anything.
    load.enter(2);
    proxy.point(Some(cluster.standby.port));
    load.wait_queued_in(2, 40, &sys).await;
    let outcomes = load.finish().await;

    let refused: Vec<&(u8, u64, Outcome)> = outcomes
        .iter()
        .filter(|(_, _, o)| matches!(o, Outcome::Refused(..)))
        .collect();
    assert!(
        refused
            .iter()
            .all(|(_, _, o)| matches!(o, Outcome::Refused(code, _) if (400..500).contains(code))),
        "a refusal that is not a 4xx: {refused:#?}"
    );
    assert!(
        refused.iter().any(|(phase, _, _)| *phase == 1),
        "no client was refused while no primary accepted writes: {outcomes:#?}"
    );

    let queued: BTreeSet<u64> = outcomes
        .iter()
        .filter_map(|(_, n, o)| matches!(o, Outcome::Queued(_)).then_some(*n))
        .collect();
    let until = Instant::now() + Duration::from_secs(120);
    let got = loop {
        let got = delivered(&sys, "alice");
        if queued.iter().all(|n| got.contains_key(n)) {
            break got;
        }
        assert!(
            Instant::now() < until,
            "acknowledged but not delivered after 120 s: {:?}\nqueue: {:#?}\n{}",
            queued
                .iter()
                .filter(|n| !got.contains_key(n))
                .collect::<Vec<_>>(),
            sys.queue().await,
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A message refused at the end of data may still have been stored: its commit reached
    // the primary (and the standby) but the reply was lost with the primary, or it completed
    // after ADMISSION_TIMEOUT. The client retries it, so it is delivered twice; what was
    // refused before the data was never stored.
    let refused_at_end: BTreeSet<u64> = refused
        .iter()
        .filter(
            |(_, _, o)| matches!(o, Outcome::Refused(_, text) if text.starts_with("end of data")),
        )
        .map(|(_, n, _)| *n)
        .collect();
    let unacknowledged: Vec<&u64> = got.keys().filter(|n| !queued.contains(n)).collect();
    assert!(
        unacknowledged.iter().all(|n| refused_at_end.contains(n)),
        "delivered though refused before the end of data: {unacknowledged:?}\n{refused:#?}"
    );
    let twice: Vec<(&u64, &usize)> = got.iter().filter(|(_, c)| **c > 1).collect();
    eprintln!(
        "{} acknowledged, {} refused ({} at the end of data), delivered though refused at the \
         end of data: {unacknowledged:?}, delivered more than once: {twice:?}",
        queued.len(),
        refused.len(),
        refused_at_end.len()
    );
    sys.wait_empty(Duration::from_secs(60)).await;

    // The same dispatcher process carried on: it took its lock again on the new primary,
    // and its LISTEN session is there.
    assert!(
        crate::ha::alive(dispatcher),
        "the dispatcher exited: {}",
        sys.log("dispatch.log")
    );
    assert!(
        sys.log("dispatch.log")
            .contains("dispatcher lock taken again"),
        "{}",
        sys.log("dispatch.log")
    );
    // The LISTEN task retries with a backoff that grew during the outage (at most
    // listen.rs's cap); until it is back the heartbeat (POLL_INTERVAL) claims.
    let mut conn = PgConnection::connect(&cluster.url(cluster.standby.port, &name))
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'",
        )
        .bind(&name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if listening >= 1 {
            break;
        }
        assert!(
            Instant::now() < until,
            "no session LISTENs on the new primary after 90 s: {}",
            sys.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Why synchronous replication is the documented default: with asynchronous replication a
/// primary acknowledges what its standby does not have yet (here a standby that fell behind,
/// stopped), and once the primary crashes and that standby is promoted, those messages are
/// gone though every client got a 250.
#[tokio::test(flavor = "multi_thread")]
async fn with_asynchronous_replication_a_failover_loses_acknowledged_messages() {
    let cluster = PgCluster::start(Replication::Asynchronous).await;
    let db = TestDb::on(&cluster.url(cluster.primary.port, "postgres")).await;
    let name = db.name.clone();
    let mut sys = System::with_db(db, "", &["alice"]).await;
    cluster.wait_replayed().await;
    cluster.stop_immediately(&cluster.standby).await;
    // The ingress alone: the messages stay queued.
    sys.start_ingress().await;
    let mut ids = BTreeSet::new();
    for n in 1..=10 {
        match attempt(sys.port, n).await {
            Outcome::Queued(id) => ids.insert(id),
            refused => panic!("message {n}: {refused:?}\n{}", sys.log("ingress.log")),
        };
    }
    assert_eq!(
        queued_ids(&cluster, cluster.primary.port, &name).await,
        ids,
        "the primary has every message it acknowledged"
    );
    cluster.stop_immediately(&cluster.primary).await;
    cluster.start_node(&cluster.standby).await;
    cluster.promote().await;

    let mut conn = PgConnection::connect(&cluster.url(cluster.standby.port, &name))
        .await
        .unwrap();
    let mailboxes: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.mailbox_account")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mailboxes, 1, "the promoted standby has what it replayed");
    let kept = queued_ids(&cluster, cluster.standby.port, &name).await;
    assert!(
        kept.is_empty(),
        "the promoted standby kept acknowledged messages it never received: {kept:?}"
    );
}

/// With its synchronous standby gone the primary commits nothing for good, so the ingress
/// acknowledges nothing: the client hears 451 4.3.0 after ADMISSION_TIMEOUT, never 250.
/// Once the standby is back, the commit that was waiting completes (the client's retry
/// would queue the message a second time: a duplicate, never a loss), and mail is
/// acknowledged again.
#[tokio::test(flavor = "multi_thread")]
async fn with_the_synchronous_standby_gone_the_ingress_answers_451_and_never_250() {
    let cluster = PgCluster::start(Replication::Synchronous).await;
    let db = TestDb::on(&cluster.url(cluster.primary.port, "postgres")).await;
    let name = db.name.clone();
    let mut sys = System::with_db(
        db,
        &format!(
            "[pepsi-ingress]\nADMISSION_TIMEOUT = {}s\n",
            ADMISSION.as_secs()
        ),
        &["alice"],
    )
    .await;
    cluster.stop_immediately(&cluster.standby).await;
    sys.start_ingress().await;
    match attempt(sys.port, 1).await {
        Outcome::Refused(451, text) if text.contains("4.3.0") => {}
        other => panic!("wanted 451 4.3.0 at the end of data, got {other:?}"),
    }
    assert!(
        sys.log("ingress.log")
            .contains("not stored within ADMISSION_TIMEOUT"),
        "{}",
        sys.log("ingress.log")
    );
    assert!(
        queued_ids(&cluster, cluster.primary.port, &name)
            .await
            .is_empty(),
        "a commit waiting for the standby is visible"
    );

    cluster.start_node(&cluster.standby).await;
    let until = Instant::now() + Duration::from_secs(60);
    while queued_ids(&cluster, cluster.primary.port, &name)
        .await
        .is_empty()
    {
        assert!(
            Instant::now() < until,
            "the waiting commit did not complete once the standby was back:\n{}",
            cluster.log(&cluster.primary)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match attempt(sys.port, 2).await {
        Outcome::Queued(_) => {}
        other => panic!("with the standby back, wanted 250, got {other:?}"),
    }
}
