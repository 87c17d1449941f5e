//! Small real SMTP servers for tests: several on one port at different loopback addresses
//! (127.0.0.x and ::1, as the MX hosts of a test domain would be), each with a script the
//! test may change between deliveries (greeting, per-recipient replies, the reply after the
//! message, dropping the connection in the middle of the message), recording what they
//! received.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// What a peer got in one accepted transaction.
#[derive(Debug, Clone, Default)]
pub struct Received {
    pub mail_from: String,
    pub rcpt: Vec<String>,
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct Log {
    pub connections: usize,
    pub commands: Vec<String>,
    pub messages: Vec<Received>,
}

/// How a peer answers. Replies are written as sent, without the final CRLF; a multi-line
/// reply has CRLF between its lines.
#[derive(Debug, Clone)]
pub struct Script {
    pub greeting: String,
    pub ehlo: String,
    /// Reply to RCPT TO per address; others get `250 2.1.5 ok`.
    pub rcpt: HashMap<String, String>,
    /// Reply after the final dot.
    pub data_end: String,
    /// Close the connection after the first line of the message, this many more times.
    pub drop_in_data: usize,
}

impl Script {
    pub fn named(name: &str) -> Script {
        Script {
            greeting: format!("220 {name} ESMTP test peer"),
            ehlo: format!(
                "250-{name}\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-ENHANCEDSTATUSCODES\r\n250 SIZE 10485760"
            ),
            rcpt: HashMap::new(),
            data_end: "250 2.0.0 queued".into(),
            drop_in_data: 0,
        }
    }
}

/// One SMTP server at one address.
pub struct Peer {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Log>>,
    script: Arc<Mutex<Script>>,
}

impl Peer {
    /// Changes the script for the connections that follow.
    pub fn script(&self, change: impl FnOnce(&mut Script)) {
        change(&mut self.script.lock().unwrap());
    }

    pub fn messages(&self) -> Vec<Received> {
        self.log.lock().unwrap().messages.clone()
    }

    pub fn connections(&self) -> usize {
        self.log.lock().unwrap().connections
    }
}

/// Starts one peer per `(address, greeting name)` on a port free on all of them; returns
/// the port and the peers in order. Addresses that should refuse connections are simply
/// not given.
pub async fn start(hosts: &[(&str, &str)]) -> (u16, Vec<Peer>) {
    'port: for _ in 0..50 {
        let first: IpAddr = hosts[0].0.parse().unwrap();
        let l0 = TcpListener::bind((first, 0)).await.unwrap();
        let port = l0.local_addr().unwrap().port();
        let mut listeners = vec![l0];
        for (ip, _) in &hosts[1..] {
            let ip: IpAddr = ip.parse().unwrap();
            match TcpListener::bind((ip, port)).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'port,
            }
        }
        let peers = listeners
            .into_iter()
            .zip(hosts)
            .map(|(listener, (_, name))| serve_on(listener, Script::named(name)))
            .collect();
        return (port, peers);
    }
    panic!("no port free on all of {hosts:?}");
}

fn serve_on(listener: TcpListener, script: Script) -> Peer {
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Log::default()));
    let script = Arc::new(Mutex::new(script));
    let (l, s) = (log.clone(), script.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(session(stream, s.clone(), l.clone()));
        }
    });
    Peer { addr, log, script }
}

async fn write(stream: &mut BufReader<tokio::net::TcpStream>, reply: &str) -> bool {
    stream
        .get_mut()
        .write_all(format!("{reply}\r\n").as_bytes())
        .await
        .is_ok()
}

/// One SMTP session under the script as it is when the session starts.
async fn session(stream: tokio::net::TcpStream, script: Arc<Mutex<Script>>, log: Arc<Mutex<Log>>) {
    log.lock().unwrap().connections += 1;
    let now = script.lock().unwrap().clone();
    let mut s = BufReader::new(stream);
    if !write(&mut s, &now.greeting).await || !now.greeting.starts_with("220") {
        return;
    }
    let mut tx: Option<Received> = None;
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end().to_owned();
        log.lock().unwrap().commands.push(line.clone());
        let upper = line.to_ascii_uppercase();
        let addr = || {
            line.split_once('<')
                .and_then(|(_, r)| r.split_once('>'))
                .map(|(a, _)| a.to_owned())
                .unwrap_or_default()
        };
        let reply = if upper.starts_with("EHLO ") {
            now.ehlo.clone()
        } else if upper.starts_with("HELO ") {
            "250 test peer".to_owned()
        } else if upper.starts_with("MAIL FROM:") {
            tx = Some(Received {
                mail_from: addr(),
                ..Received::default()
            });
            "250 2.1.0 ok".to_owned()
        } else if upper.starts_with("RCPT TO:") && tx.is_some() {
            let a = addr();
            let r = now
                .rcpt
                .get(&a)
                .cloned()
                .unwrap_or_else(|| "250 2.1.5 ok".into());
            if r.starts_with('2') {
                tx.as_mut().unwrap().rcpt.push(a);
            }
            r
        } else if upper == "DATA" && tx.as_ref().is_some_and(|t| !t.rcpt.is_empty()) {
            if !write(&mut s, "354 end with <CRLF>.<CRLF>").await {
                return;
            }
            let mut data = Vec::new();
            loop {
                let mut l = Vec::new();
                if s.read_until(b'\n', &mut l).await.unwrap_or(0) == 0 {
                    return;
                }
                if l == b".\r\n" {
                    break;
                }
                let dropping = {
                    let mut shared = script.lock().unwrap();
                    let drop = shared.drop_in_data > 0;
                    if drop {
                        shared.drop_in_data -= 1;
                    }
                    drop
                };
                if dropping {
                    return;
                }
                let l = if l.starts_with(b".") { &l[1..] } else { &l[..] };
                data.extend_from_slice(l);
            }
            let mut t = tx.take().unwrap();
            t.data = data;
            if now.data_end.starts_with('2') {
                log.lock().unwrap().messages.push(t);
            }
            now.data_end.clone()
        } else if upper == "DATA" {
            "503 5.5.1 no valid recipients".to_owned()
        } else if upper == "RSET" {
            tx = None;
            "250 2.0.0 ok".to_owned()
        } else if upper == "QUIT" {
            let _ = write(&mut s, "221 2.0.0 bye").await;
            return;
        } else {
            "500 5.5.2 unknown command".to_owned()
        };
        if !write(&mut s, &reply).await {
            return;
        }
    }
}
