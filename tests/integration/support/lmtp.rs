//! A small real LMTP (RFC 2033) or SMTP (RFC 5321) server for tests: TCP or unix socket,
//! scripted per-recipient replies, recording what it received.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// What the test server got in one transaction.
#[derive(Debug, Clone, Default)]
pub struct Received {
    pub mail_from: String,
    pub rcpt: Vec<String>,
    pub data: Vec<u8>,
}

#[derive(Default)]
pub struct Log {
    pub connections: usize,
    pub commands: Vec<String>,
    pub messages: Vec<Received>,
}

/// A real LMTP server (RFC 2033) with scripted replies: `rcpt` maps an address to its RCPT
/// reply, `after_dot` to its reply after the final dot; others get 250. In SMTP mode
/// ([`TestLmtp::smtp`]) it greets as `smtp.test`, answers EHLO, and gives one reply after the
/// dot: the `after_dot` reply of the first accepted recipient that has one, else 250.
pub struct TestLmtp {
    pub log: Arc<Mutex<Log>>,
    pub target: String,
    script: Script,
    _dir: Option<tempfile::TempDir>,
}

/// RCPT replies and replies after the dot, by address; the test may change them between
/// passes.
type Script = Arc<Mutex<(HashMap<String, String>, HashMap<String, String>)>>;

impl TestLmtp {
    pub async fn tcp(rcpt: &[(&str, &str)], after_dot: &[(&str, &str)]) -> TestLmtp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let log = Arc::new(Mutex::new(Log::default()));
        let script = Self::script(rcpt, after_dot);
        let (sc, l) = (script.clone(), log.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, sc.clone(), l.clone(), false));
            }
        });
        TestLmtp {
            log,
            target,
            script,
            _dir: None,
        }
    }

    /// An SMTP server on a loopback TCP port.
    pub async fn smtp(rcpt: &[(&str, &str)], after_dot: &[(&str, &str)]) -> TestLmtp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let log = Arc::new(Mutex::new(Log::default()));
        let script = Self::script(rcpt, after_dot);
        let (sc, l) = (script.clone(), log.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, sc.clone(), l.clone(), true));
            }
        });
        TestLmtp {
            log,
            target,
            script,
            _dir: None,
        }
    }

    /// The port of a TCP server.
    pub fn port(&self) -> u16 {
        self.target.rsplit_once(':').unwrap().1.parse().unwrap()
    }

    /// Replaces the scripted replies.
    pub fn rescript(&self, rcpt: &[(&str, &str)], after_dot: &[(&str, &str)]) {
        let new = Self::script(rcpt, after_dot);
        let new = std::mem::take(&mut *new.lock().unwrap());
        *self.script.lock().unwrap() = new;
    }

    pub async fn unix(rcpt: &[(&str, &str)], after_dot: &[(&str, &str)]) -> TestLmtp {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lmtp.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let log = Arc::new(Mutex::new(Log::default()));
        let script = Self::script(rcpt, after_dot);
        let (sc, l) = (script.clone(), log.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, sc.clone(), l.clone(), false));
            }
        });
        TestLmtp {
            log,
            target: format!("unix:{}", path.display()),
            script,
            _dir: Some(dir),
        }
    }

    fn script(rcpt: &[(&str, &str)], after_dot: &[(&str, &str)]) -> Script {
        let map = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(a, r)| (a.to_string(), r.to_string()))
                .collect()
        };
        Arc::new(Mutex::new((map(rcpt), map(after_dot))))
    }

    pub fn messages(&self) -> Vec<Received> {
        self.log.lock().unwrap().messages.clone()
    }
}

/// One LMTP or SMTP session.
async fn serve<S>(stream: S, script: Script, log: Arc<Mutex<Log>>, smtp: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    log.lock().unwrap().connections += 1;
    let mut s = BufReader::new(stream);
    let mut tx = Received::default();
    let mut mail = false;
    let greeting: &[u8] = if smtp {
        b"220 smtp.test ESMTP ready\r\n"
    } else {
        b"220 lmtp.test LMTP ready\r\n"
    };
    s.get_mut().write_all(greeting).await.unwrap();
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
        let reply = if upper.starts_with("LHLO ") && !smtp {
            "250-lmtp.test\r\n250-PIPELINING\r\n250-ENHANCEDSTATUSCODES\r\n250-8BITMIME\r\n250 SIZE\r\n"
                .to_owned()
        } else if upper.starts_with("EHLO ") && smtp {
            "250-smtp.test\r\n250-PIPELINING\r\n250-ENHANCEDSTATUSCODES\r\n250-8BITMIME\r\n250-DSN\r\n250 SIZE 10240000\r\n"
                .to_owned()
        } else if upper.starts_with("MAIL FROM:") {
            tx = Received {
                mail_from: addr(),
                ..Received::default()
            };
            mail = true;
            "250 2.1.0 OK\r\n".to_owned()
        } else if upper.starts_with("RCPT TO:") && mail {
            let a = addr();
            let r = script
                .lock()
                .unwrap()
                .0
                .get(&a)
                .cloned()
                .unwrap_or_else(|| "250 2.1.5 OK".into());
            if r.starts_with('2') {
                tx.rcpt.push(a);
            }
            format!("{r}\r\n")
        } else if upper == "DATA" && !tx.rcpt.is_empty() {
            s.get_mut()
                .write_all(b"354 2.0.0 end with .\r\n")
                .await
                .unwrap();
            let mut data = Vec::new();
            loop {
                let mut l = Vec::new();
                if s.read_until(b'\n', &mut l).await.unwrap_or(0) == 0 {
                    return;
                }
                if l == b".\r\n" {
                    break;
                }
                let l = if l.starts_with(b".") { &l[1..] } else { &l[..] };
                data.extend_from_slice(l);
            }
            tx.data = data;
            let after_dot = script.lock().unwrap().1.clone();
            let replies: String = if smtp {
                let r = tx
                    .rcpt
                    .iter()
                    .find_map(|a| after_dot.get(a).cloned())
                    .unwrap_or_else(|| "250 2.0.0 queued".into());
                format!("{r}\r\n")
            } else {
                // A recipient scripted `HANG` gets no reply: the server sends the replies
                // before it and then falls silent (a mailbox server stuck on one delivery).
                tx.rcpt
                    .iter()
                    .map(|a| {
                        after_dot
                            .get(a)
                            .cloned()
                            .unwrap_or_else(|| format!("250 2.0.0 <{a}> saved"))
                    })
                    .take_while(|r| r != "HANG")
                    .map(|r| format!("{r}\r\n"))
                    .collect()
            };
            let hang = !smtp
                && tx
                    .rcpt
                    .iter()
                    .any(|a| after_dot.get(a).is_some_and(|r| r == "HANG"));
            // Recorded only when the server took it (LMTP: for some recipient).
            if replies.lines().any(|l| l.starts_with('2')) {
                log.lock().unwrap().messages.push(tx.clone());
            }
            mail = false;
            if hang {
                let _ = s.get_mut().write_all(replies.as_bytes()).await;
                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                return;
            }
            replies
        } else if upper == "DATA" {
            "503 5.5.1 no valid recipients\r\n".to_owned()
        } else if upper == "RSET" {
            mail = false;
            tx = Received::default();
            "250 2.0.0 OK\r\n".to_owned()
        } else if upper == "NOOP" {
            "250 2.0.0 OK\r\n".to_owned()
        } else if upper == "QUIT" {
            let _ = s.get_mut().write_all(b"221 2.0.0 bye\r\n").await;
            return;
        } else {
            "500 5.5.2 unknown command\r\n".to_owned()
        };
        if s.get_mut().write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}
