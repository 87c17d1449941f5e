//! List bounces through the whole system on the shipped graph: the list copies of members
//! at `remote.test` leave through the real relay to a scripted SMTP peer (its MX, found
//! through a dnsmasq the test starts) that refuses them; the bounce stage's DSNs come back
//! to the members' VERP addresses, the list stage reads them, and a member refused as
//! unknown (5.1.1) is disabled at the list's threshold while one refused by a spam filter
//! (5.7.1) is never counted.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::ingress::Dns;
use crate::support::smtp_peer::Peer;
use crate::support::system::System;

const WAIT: Duration = Duration::from_secs(60);

struct World {
    dns: Dns,
    smtp_port: u16,
    remote: Peer,
}

impl World {
    /// The MX of remote.test: refuses carol as unknown and dan's mail as spam.
    async fn start() -> World {
        let (smtp_port, mut peers) =
            support::smtp_peer::start(&[("127.0.0.46", "mx.remote.test")]).await;
        let remote = peers.pop().unwrap();
        remote.script(|s| {
            s.rcpt.insert(
                "carol@remote.test".into(),
                "550 5.1.1 <carol@remote.test>: no such user here".into(),
            );
            s.rcpt.insert(
                "dan@remote.test".into(),
                "550 5.7.1 message refused as spam".into(),
            );
        });
        let dns = Dns::start(
            &[
                "--mx-host=remote.test,mx.remote.test,10",
                "--host-record=mx.remote.test,127.0.0.46",
            ]
            .map(String::from),
        );
        World {
            dns,
            smtp_port,
            remote,
        }
    }

    fn extra(&self) -> String {
        format!(
            "[pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
             [stage-relay]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\
             SMTP_PORT = {port}\nTLS = none\nIPV6 = no\nALLOW_INTERNAL_ADDRESSES = yes\n",
            dns = self.dns.port,
            port = self.smtp_port,
        )
    }
}

fn pepsi_list_ok(sys: &System, args: &[&str]) {
    let tool = pepsi_testkit::programs::program("pepsi-list", env!("CARGO_BIN_EXE_pepsi-list"));
    let out = sys.command(&tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "pepsi-list {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The bounce events recorded so far: (address, kind, status), in order.
async fn events(sys: &System) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT address, kind, status FROM pepsi.list_bounce_event ORDER BY event_id")
        .fetch_all(&sys.db.pool)
        .await
        .unwrap()
}

/// Waits until `n` bounce events are recorded; returns them.
async fn wait_events(sys: &System, n: usize) -> Vec<(String, String, String)> {
    let until = Instant::now() + WAIT;
    loop {
        let got = events(sys).await;
        if got.len() >= n {
            return got;
        }
        if Instant::now() > until {
            panic!(
                "{} bounce events, wanted {n}: {got:?}\nqueue: {:#?}\n{}",
                got.len(),
                sys.queue().await,
                sys.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn delivery(sys: &System, address: &str) -> (String, Option<f64>) {
    sqlx::query_as(
        "SELECT m.delivery_status, s.score::float8 FROM pepsi.list_member m \
         LEFT JOIN pepsi.list_bounce_score s USING (list_id, address) \
         WHERE m.address = $1 AND m.role = 'member'",
    )
    .bind(address)
    .fetch_one(&sys.db.pool)
    .await
    .unwrap()
}

/// The RCPT commands the peer saw for `address`.
fn rcpts_for(peer: &Peer, address: &str) -> usize {
    let want = format!("RCPT TO:<{address}>");
    peer.log
        .lock()
        .unwrap()
        .commands
        .iter()
        .filter(|c| c.starts_with(&want))
        .count()
}

/// Two posts: the peer refuses carol twice (5.1.1) and dan twice (5.7.1); the DSNs come
/// back through the list stage; at the threshold of 2 carol's delivery is disabled, dan's
/// refusals are recorded as policy and never counted. A third post goes to dan again and
/// no more to carol.
#[tokio::test]
async fn hard_refusals_from_a_real_peer_disable_a_member_and_spam_refusals_do_not_count() {
    let world = World::start().await;
    let mut sys = System::new(&world.extra(), &["alice", "olga"]).await;
    pepsi_list_ok(
        &sys,
        &[
            "create",
            "team@example.test",
            "--owner",
            "olga@example.test",
        ],
    );
    pepsi_list_ok(
        &sys,
        &[
            "add",
            "team@example.test",
            "alice@example.test",
            "carol@remote.test",
            "dan@remote.test",
        ],
    );
    pepsi_list_ok(
        &sys,
        &["configure", "team@example.test", "bounce_score_threshold=2"],
    );
    sys.start().await;

    let post = |n: u32| {
        format!(
            "From: alice@example.test\r\nTo: team@example.test\r\nSubject: news {n}\r\n\
             Message-ID: <news-{n}@example.test>\r\n\r\nNews number {n}.\r\n"
        )
    };
    for n in 1..=2 {
        let reply = sys
            .send(
                "alice@example.test",
                &["team@example.test"],
                post(n).as_bytes(),
            )
            .await;
        assert!(reply.starts_with("250"), "{reply}");
        // One post's refusals at a time, so the second counts on the first.
        wait_events(&sys, 2 * n as usize).await;
    }
    let got = events(&sys).await;
    let mut kinds: Vec<(String, String, String)> = got.clone();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            ("carol@remote.test".into(), "hard".into(), "5.1.1".into()),
            ("carol@remote.test".into(), "hard".into(), "5.1.1".into()),
            ("dan@remote.test".into(), "policy".into(), "5.7.1".into()),
            ("dan@remote.test".into(), "policy".into(), "5.7.1".into()),
        ],
        "{}",
        sys.logs()
    );
    assert_eq!(
        delivery(&sys, "carol@remote.test").await,
        ("by_bounces".into(), Some(2.0))
    );
    assert_eq!(
        delivery(&sys, "dan@remote.test").await,
        ("enabled".into(), None)
    );
    let disabled: Vec<String> = sqlx::query_scalar(
        "SELECT address FROM pepsi.list_event_log WHERE event = 'member.disable'",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(disabled, vec!["carol@remote.test".to_owned()]);

    // A third post: dan is tried (and refused) again, carol no more.
    let reply = sys
        .send(
            "alice@example.test",
            &["team@example.test"],
            post(3).as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    wait_events(&sys, 5).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(rcpts_for(&world.remote, "carol@remote.test"), 2);
    assert_eq!(rcpts_for(&world.remote, "dan@remote.test"), 3);
    assert_eq!(sys.messages("alice").len(), 3, "alice has every post");
}
