//! Connections kept between messages by the delivery stages that speak SMTP or LMTP: after a
//! delivery the session stays open, so the next message for the same key (the same peer; the
//! same MX host, address and TLS policy) skips the connect, greeting, EHLO/LHLO, STARTTLS and
//! AUTH.
//!
//! The rules every user shares:
//! - a connection is kept for the idle time it is put back with (`CONNECTION_IDLE`); zero
//!   keeps nothing, and a broken connection (an error, a peer's 421, a failed STARTTLS) is
//!   closed rather than kept;
//! - it is reused only for exactly the same key (the TLS policy and AUTH are part of it),
//!   while usable and idle less than its idle time, and only once it has answered RSET; one
//!   that fails RSET is closed and the caller connects anew;
//! - keeping one more than [`Rules::capacity`] closes the oldest.
//!
//! Where the users differ, [`Rules`] says: the relaying stages talk to one peer at a time
//! ([`Rules::ONE_PEER`]), the relay to the internet to many MX hosts ([`Rules::MX_HOSTS`]).

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pepsi_smtp::Connection;

/// What differs between the users of a [`Keeper`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The most connections kept at once; keeping one more closes the oldest.
    pub capacity: usize,
    /// A take closes every kept connection it does not hand out: the worker holds at most one
    /// connection, the one it is using or the one it keeps.
    pub close_unused_on_take: bool,
    /// A background task closes connections idle past their time (looking every second, or
    /// every idle time when shorter), so an idle worker holds no server's resources for long.
    /// Without it an expired connection is closed by the next take.
    pub close_idle_in_background: bool,
}

impl Rules {
    /// The relaying stages (LMTP, smarthost): one kept connection, for the one peer; a
    /// message for another peer, or one after the idle time, closes it first.
    pub const ONE_PEER: Rules = Rules {
        capacity: 1,
        close_unused_on_take: true,
        close_idle_in_background: false,
    };

    /// The relay to the internet: up to 8 sessions, one per MX host, address and TLS
    /// policy; those idle past `CONNECTION_IDLE` are closed in the background.
    pub const MX_HOSTS: Rules = Rules {
        capacity: 8,
        close_unused_on_take: false,
        close_idle_in_background: true,
    };
}

struct Kept<K> {
    key: K,
    conn: Connection,
    idle: Duration,
}

impl<K> Kept<K> {
    fn expired(&self) -> bool {
        self.conn.idle() >= self.idle
    }
}

/// The kept connections of one worker (or one stage section), by key.
pub struct Keeper<K> {
    rules: Rules,
    slots: Arc<Mutex<Vec<Kept<K>>>>,
    reaping: AtomicBool,
}

impl<K: PartialEq + Display + Send + 'static> Keeper<K> {
    pub fn new(rules: Rules) -> Keeper<K> {
        Keeper {
            rules,
            slots: Arc::new(Mutex::new(Vec::new())),
            reaping: AtomicBool::new(false),
        }
    }

    /// A kept connection for `key` that is still usable, within its idle time and answers
    /// RSET; None when there is none (the caller connects).
    pub async fn take(&self, key: &K) -> Option<Connection> {
        let (found, unused) = {
            let mut slots = self.slots.lock().unwrap();
            let found = slots
                .iter()
                .position(|k| &k.key == key && k.conn.is_usable() && !k.expired())
                .map(|at| slots.swap_remove(at).conn);
            let unused = if self.rules.close_unused_on_take {
                std::mem::take(&mut *slots)
            } else {
                Vec::new()
            };
            (found, unused)
        };
        for k in unused {
            k.conn.quit().await;
        }
        let mut conn = found?;
        match conn.rset().await {
            Ok(()) => Some(conn),
            Err(e) => {
                tracing::debug!(kept = %key, "kept connection gone ({e}); reconnecting");
                conn.quit().await;
                None
            }
        }
    }

    /// Keeps `conn` for the next message to `key` for up to `idle`, or closes it when it
    /// cannot be reused (`idle` zero, or the connection broken).
    pub async fn put(&self, key: K, conn: Connection, idle: Duration) {
        if idle.is_zero() || !conn.is_usable() {
            conn.quit().await;
            return;
        }
        let evicted = {
            let mut slots = self.slots.lock().unwrap();
            slots.push(Kept { key, conn, idle });
            (slots.len() > self.rules.capacity).then(|| slots.remove(0))
        };
        if let Some(old) = evicted {
            old.conn.quit().await;
        }
        if self.rules.close_idle_in_background && !self.reaping.swap(true, Ordering::Relaxed) {
            let slots = self.slots.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(idle.min(Duration::from_secs(1))).await;
                    let expired: Vec<Kept<K>> = {
                        let mut slots = slots.lock().unwrap();
                        let (gone, kept) = std::mem::take(&mut *slots)
                            .into_iter()
                            .partition(Kept::expired);
                        *slots = kept;
                        gone
                    };
                    for k in expired {
                        k.conn.quit().await;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use pepsi_smtp::{OpenOptions, Protocol, Target, Timeouts};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    const LONG: Duration = Duration::from_secs(3600);

    /// A real SMTP server on a loopback port: connection `n` greets as `c<n>`; RSET is
    /// answered 250, or 421 when `refuse_rset`. Every connect, RSET and QUIT is written down.
    struct Server {
        port: u16,
        events: Arc<Mutex<Vec<String>>>,
    }

    impl Server {
        async fn start(refuse_rset: bool) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let events = Arc::new(Mutex::new(Vec::new()));
            let log = events.clone();
            tokio::spawn(async move {
                for n in 1.. {
                    let (stream, _) = listener.accept().await.unwrap();
                    let log = log.clone();
                    tokio::spawn(async move {
                        let (read, mut write) = stream.into_split();
                        let mut lines = BufReader::new(read).lines();
                        let say = |e: String| log.lock().unwrap().push(e);
                        write
                            .write_all(format!("220 c{n} ESMTP\r\n").as_bytes())
                            .await?;
                        while let Some(line) = lines.next_line().await? {
                            let verb = line.to_ascii_uppercase();
                            let answer = if verb.starts_with("EHLO") {
                                say(format!("connect c{n}"));
                                "250 ok\r\n"
                            } else if verb == "RSET" {
                                say(format!("RSET c{n}"));
                                if refuse_rset {
                                    "421 closing\r\n"
                                } else {
                                    "250 ok\r\n"
                                }
                            } else if verb == "QUIT" {
                                say(format!("QUIT c{n}"));
                                "221 bye\r\n"
                            } else {
                                "502 no\r\n"
                            };
                            write.write_all(answer.as_bytes()).await?;
                            if verb == "QUIT" {
                                break;
                            }
                        }
                        Ok::<_, std::io::Error>(())
                    });
                }
            });
            Server { port, events }
        }

        async fn open(&self) -> Connection {
            let target = Target::Tcp {
                host: "127.0.0.1".into(),
                port: self.port,
            };
            let options = OpenOptions::default();
            Connection::open_with(&target, Protocol::Smtp, "t", Timeouts::default(), &options)
                .await
                .unwrap()
        }

        fn events(&self) -> Vec<String> {
            self.events.lock().unwrap().clone()
        }
    }

    /// One step of a scenario: open a connection and put it back under a key with an idle
    /// time; take under a key, expecting the greeting name of the connection handed out.
    enum Step {
        Put(&'static str, Duration),
        Take(&'static str, Option<&'static str>),
        Wait(Duration),
    }
    use Step::*;

    /// A scenario: what it shows, the rules, whether the server refuses RSET, the steps, and
    /// the connects, RSETs and QUITs the server sees.
    type Row = (
        &'static str,
        Rules,
        bool,
        Vec<Step>,
        &'static [&'static str],
    );

    async fn run(what: &str, rules: Rules, refuse_rset: bool, steps: &[Step]) -> Vec<String> {
        let server = Server::start(refuse_rset).await;
        let keeper = Keeper::<&'static str>::new(rules);
        let mut held = Vec::new();
        for step in steps {
            match step {
                Put(key, idle) => keeper.put(key, server.open().await, *idle).await,
                Take(key, want) => {
                    let got = keeper.take(key).await;
                    let name = got.as_ref().map(|c| c.remote_mta().to_owned());
                    assert_eq!(name.as_deref(), *want, "{what}: take {key}");
                    held.extend(got);
                }
                Wait(d) => tokio::time::sleep(*d).await,
            }
        }
        server.events()
    }

    #[tokio::test]
    async fn rules_table() {
        let short = Duration::from_millis(1);
        let past = Wait(Duration::from_millis(20));
        let one = Rules::ONE_PEER;
        let mx = Rules::MX_HOSTS;
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            ("reused after RSET", one, false,
             vec![Put("a", LONG), Take("a", Some("c1")), Take("a", None)],
             &["connect c1", "RSET c1"]),
            ("reused after RSET, keyed", mx, false,
             vec![Put("a", LONG), Take("a", Some("c1")), Take("a", None)],
             &["connect c1", "RSET c1"]),
            ("one peer: another key closes the kept one", one, false,
             vec![Put("a", LONG), Take("b", None), Take("a", None)],
             &["connect c1", "QUIT c1"]),
            ("keyed: another key leaves it kept", mx, false,
             vec![Put("a", LONG), Take("b", None), Take("a", Some("c1"))],
             &["connect c1", "RSET c1"]),
            ("keyed: each key its own", mx, false,
             vec![Put("a", LONG), Put("b", LONG), Take("b", Some("c2")), Take("a", Some("c1"))],
             &["connect c1", "connect c2", "RSET c2", "RSET c1"]),
            ("idle zero keeps nothing", one, false,
             vec![Put("a", Duration::ZERO), Take("a", None)],
             &["connect c1", "QUIT c1"]),
            ("idle zero keeps nothing, keyed", mx, false,
             vec![Put("a", Duration::ZERO), Take("a", None)],
             &["connect c1", "QUIT c1"]),
            ("one peer: past its idle time, closed by the take", one, false,
             vec![Put("a", short), past, Take("a", None)],
             &["connect c1", "QUIT c1"]),
            ("one peer: a second closes the first", one, false,
             vec![Put("a", LONG), Put("b", LONG), Take("b", Some("c2"))],
             &["connect c1", "connect c2", "QUIT c1", "RSET c2"]),
            ("keyed: a ninth closes the oldest", mx, false,
             vec![Put("a", LONG), Put("b", LONG), Put("c", LONG), Put("d", LONG), Put("e", LONG),
                  Put("f", LONG), Put("g", LONG), Put("h", LONG), Put("i", LONG),
                  Take("a", None), Take("i", Some("c9")), Take("b", Some("c2"))],
             &["connect c1", "connect c2", "connect c3", "connect c4", "connect c5",
               "connect c6", "connect c7", "connect c8", "connect c9", "QUIT c1",
               "RSET c9", "RSET c2"]),
            // The 421 breaks the connection: closed without QUIT, never kept again.
            ("a refused RSET discards it", one, true,
             vec![Put("a", LONG), Take("a", None), Take("a", None)],
             &["connect c1", "RSET c1"]),
            ("a refused RSET discards it, keyed", mx, true,
             vec![Put("a", LONG), Take("a", None), Take("a", None)],
             &["connect c1", "RSET c1"]),
        ];
        for (what, rules, refuse_rset, steps, want) in table {
            assert_eq!(run(what, rules, refuse_rset, &steps).await, want, "{what}");
        }
    }

    #[tokio::test]
    async fn keyed_sessions_past_their_idle_time_are_closed_in_the_background() {
        let server = Server::start(false).await;
        let keeper = Keeper::new(Rules::MX_HOSTS);
        keeper
            .put("a", server.open().await, Duration::from_millis(1))
            .await;
        while !server.events().contains(&"QUIT c1".to_owned()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(keeper.take(&"a").await.is_none());
    }

    #[tokio::test]
    async fn a_broken_connection_is_not_kept() {
        let server = Server::start(true).await;
        let keeper = Keeper::new(Rules::MX_HOSTS);
        let mut conn = server.open().await;
        assert!(conn.rset().await.is_err(), "the server's 421");
        assert!(!conn.is_usable());
        keeper.put("a", conn, LONG).await;
        assert!(keeper.take(&"a").await.is_none());
        assert_eq!(server.events(), ["connect c1", "RSET c1"]);
    }
}
