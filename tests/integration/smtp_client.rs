//! The outbound SMTP client (`pepsi_smtp::client`) over real sockets: STARTTLS under each
//! TLS policy, AUTH, CHUNKING and malformed replies against a scripted server in this file,
//! and STARTTLS with a verified certificate plus CHUNKING against a private Postfix smtpd.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pepsi_outbound::delivery::{Failure, RcptResult};
use pepsi_smtp::client::Stream;
use pepsi_smtp::{
    ClientError, Connection, Credentials, Envelope, OpenOptions, Phase, Protocol, RcptOutcome,
    Recipient, Target, Timeouts, TlsOptions, TlsPolicy,
};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

use crate::support::free_port;
use crate::support::ingress::TestCa;

// ---------------------------------------------------------------------------------------
// A scripted SMTP server

/// How the scripted server behaves.
#[derive(Clone, Default)]
struct Script {
    /// EHLO keywords before TLS, and over TLS.
    ehlo: Vec<&'static str>,
    ehlo_tls: Vec<&'static str>,
    /// Certificate for STARTTLS (offered only when `ehlo` says so).
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Answer STARTTLS with 220 and then bytes that are no TLS handshake.
    broken_tls: bool,
    /// Send a second reply in the same packet as the 220 to STARTTLS.
    inject_after_starttls: bool,
    /// Answer STARTTLS with this instead of 220.
    starttls_reply: Option<&'static str>,
    /// The password AUTH accepts for user `relay`; `auth_reply` overrides the verdict.
    password: &'static str,
    auth_reply: Option<&'static str>,
}

#[derive(Debug, Default)]
struct Log {
    connections: usize,
    /// (command line, arrived over TLS)
    commands: Vec<(String, bool)>,
    /// Message payloads as received: DATA unstuffed, BDAT as sent.
    messages: Vec<Vec<u8>>,
    failed_handshakes: usize,
}

impl Log {
    fn verbs(&self) -> Vec<String> {
        self.commands
            .iter()
            .map(|(c, tls)| {
                let verb = c.split(' ').next().unwrap_or("").to_owned();
                if *tls { format!("{verb}/tls") } else { verb }
            })
            .collect()
    }
}

struct Server {
    target: Target,
    log: Arc<Mutex<Log>>,
}

impl Server {
    async fn start(script: Script) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = Target::parse(&listener.local_addr().unwrap().to_string()).unwrap();
        let log = Arc::new(Mutex::new(Log::default()));
        let (l, script) = (log.clone(), Arc::new(script));
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                l.lock().unwrap().connections += 1;
                tokio::spawn(serve(Box::new(s), script.clone(), l.clone()));
            }
        });
        Server { target, log }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap()
    }
}

fn b64decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|b| *b != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (u32::from(value(c)) << (18 - 6 * i)));
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

async fn serve(stream: Box<dyn Stream>, script: Arc<Script>, log: Arc<Mutex<Log>>) {
    let mut io = BufReader::new(stream);
    let mut tls = false;
    let _ = io.get_mut().write_all(b"220 scripted.test ESMTP\r\n").await;
    let mut line = String::new();
    loop {
        line.clear();
        match io.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let cmd = line.trim_end().to_owned();
        log.lock().unwrap().commands.push((cmd.clone(), tls));
        let upper = cmd.to_ascii_uppercase();
        let reply: String = if upper.starts_with("EHLO") {
            let keywords = if tls { &script.ehlo_tls } else { &script.ehlo };
            let mut lines = vec!["scripted.test".to_owned()];
            lines.extend(keywords.iter().map(|k| k.to_string()));
            let n = lines.len();
            lines
                .iter()
                .enumerate()
                .map(|(i, l)| format!("250{}{l}\r\n", if i + 1 == n { ' ' } else { '-' }))
                .collect()
        } else if upper == "STARTTLS" && script.starttls_reply.is_some() {
            format!("{}\r\n", script.starttls_reply.unwrap())
        } else if upper == "STARTTLS" {
            if script.broken_tls {
                let _ = io
                    .get_mut()
                    .write_all(b"220 2.0.0 go ahead\r\nthis is not TLS\r\n")
                    .await;
                log.lock().unwrap().failed_handshakes += 1;
                return;
            }
            let greeting: &[u8] = if script.inject_after_starttls {
                b"220 2.0.0 go ahead\r\n250 injected\r\n"
            } else {
                b"220 2.0.0 go ahead\r\n"
            };
            let _ = io.get_mut().write_all(greeting).await;
            let acceptor = script.tls.clone().expect("a certificate for STARTTLS");
            match acceptor.accept(io.into_inner()).await {
                Ok(s) => {
                    io = BufReader::new(Box::new(s));
                    tls = true;
                }
                Err(_) => {
                    log.lock().unwrap().failed_handshakes += 1;
                    return;
                }
            }
            continue;
        } else if upper.starts_with("AUTH PLAIN ") {
            let raw = b64decode(&cmd[11..]);
            auth_verdict(
                &script,
                raw == format!("\0relay\0{}", script.password).as_bytes(),
            )
        } else if upper == "AUTH LOGIN" {
            let mut answers = Vec::new();
            for prompt in ["334 VXNlcm5hbWU6\r\n", "334 UGFzc3dvcmQ6\r\n"] {
                let _ = io.get_mut().write_all(prompt.as_bytes()).await;
                let mut a = String::new();
                let _ = io.read_line(&mut a).await;
                log.lock()
                    .unwrap()
                    .commands
                    .push((a.trim_end().to_owned(), tls));
                answers.push(b64decode(a.trim_end()));
            }
            auth_verdict(
                &script,
                answers == [b"relay".to_vec(), script.password.as_bytes().to_vec()],
            )
        } else if upper.starts_with("BDAT ") {
            let mut words = cmd.split_ascii_whitespace().skip(1);
            let n: usize = words.next().unwrap().parse().unwrap();
            let mut chunk = vec![0; n];
            if io.read_exact(&mut chunk).await.is_err() {
                return;
            }
            log.lock().unwrap().messages.push(chunk);
            format!("250 2.0.0 {n} octets received\r\n")
        } else if upper == "DATA" {
            let _ = io.get_mut().write_all(b"354 go on\r\n").await;
            let mut message = Vec::new();
            loop {
                let mut l = Vec::new();
                if io.read_until(b'\n', &mut l).await.unwrap_or(0) == 0 {
                    return;
                }
                if l == b".\r\n" {
                    break;
                }
                message.extend_from_slice(l.strip_prefix(b".").unwrap_or(&l));
            }
            log.lock().unwrap().messages.push(message);
            "250 2.0.0 queued\r\n".to_owned()
        } else if upper == "QUIT" {
            let _ = io.get_mut().write_all(b"221 2.0.0 bye\r\n").await;
            return;
        } else {
            "250 2.0.0 ok\r\n".to_owned()
        };
        if io.get_mut().write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn auth_verdict(script: &Script, ok: bool) -> String {
    match script.auth_reply {
        Some(forced) => format!("{forced}\r\n"),
        None if ok => "235 2.7.0 authenticated\r\n".to_owned(),
        None => "535 5.7.8 authentication credentials invalid\r\n".to_owned(),
    }
}

/// A server certificate from `ca` as a rustls acceptor.
fn acceptor(ca: &TestCa) -> tokio_rustls::TlsAcceptor {
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::fs::read(&ca.cert).unwrap().as_slice())
        .map(Result::unwrap)
        .collect();
    let key = rustls_pemfile::private_key(&mut std::fs::read(&ca.key).unwrap().as_slice())
        .unwrap()
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A test CA in its own directory (kept alive with it).
struct Pki {
    _dir: tempfile::TempDir,
    ca: TestCa,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    Pki { _dir: dir, ca }
}

fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(10),
        greeting: Duration::from_secs(10),
        command: Duration::from_secs(10),
        data: Duration::from_secs(10),
    }
}

fn options(policy: TlsPolicy, ca: Option<&Path>, auth: Option<&str>) -> OpenOptions {
    OpenOptions {
        tls: TlsOptions {
            policy,
            ca_file: ca.map(Path::to_path_buf),
            server_name: None,
            audit: false,
            dane: Vec::new(),
        },
        auth: auth.map(|password| Credentials::Password {
            username: "relay".into(),
            password: password.into(),
        }),
    }
}

async fn open(server: &Server, options: &OpenOptions) -> Result<Connection, ClientError> {
    Connection::open_with(
        &server.target,
        Protocol::Smtp,
        "client.test",
        timeouts(),
        options,
    )
    .await
}

fn envelope(rcpts: &[&str]) -> Envelope {
    Envelope {
        mail_from: "sender@example.org".into(),
        recipients: rcpts
            .iter()
            .map(|r| Recipient {
                address: r.to_string(),
                ..Recipient::default()
            })
            .collect(),
        ..Envelope::default()
    }
}

const MESSAGE: &[u8] =
    b"From: sender@example.org\r\nSubject: client test\r\n\r\nline one\r\n.leading dot\r\n";

fn tls_script(ca: &TestCa) -> Script {
    Script {
        ehlo: vec!["PIPELINING", "STARTTLS"],
        ehlo_tls: vec!["PIPELINING", "CHUNKING", "AUTH PLAIN LOGIN"],
        tls: Some(acceptor(ca)),
        password: "s3cret",
        ..Script::default()
    }
}

// ---------------------------------------------------------------------------------------
// TLS policies

#[tokio::test]
async fn verify_policy_uses_starttls_then_auth_then_bdat() {
    let pki = pki();
    let server = Server::start(tls_script(&pki.ca)).await;
    let opts = options(TlsPolicy::Verify, Some(&pki.ca.ca), Some("s3cret"));
    let mut conn = open(&server, &opts).await.unwrap();
    let tls = conn.tls().expect("a TLS session");
    assert!(tls.verified);
    assert!(tls.version.starts_with("TLSv1."), "{tls}");
    assert!(conn.is_authenticated());
    // the capabilities are those offered over TLS
    assert!(conn.capabilities().chunking && !conn.capabilities().starttls);

    let outcomes = conn.send(&envelope(&["a@example.net"]), MESSAGE).await;
    assert!(
        matches!(&outcomes[..], [RcptOutcome::Accepted(_)]),
        "{outcomes:?}"
    );
    conn.quit().await;
    let log = server.log();
    assert_eq!(
        log.verbs(),
        [
            "EHLO", "STARTTLS", "EHLO/tls", "AUTH/tls", "MAIL/tls", "RCPT/tls", "BDAT/tls",
            "QUIT/tls"
        ]
    );
    let bdat = &log.commands[6].0;
    assert_eq!(bdat, &format!("BDAT {} LAST", MESSAGE.len()));
    // BDAT carries the message as it is: no dot-stuffing, no terminator
    assert_eq!(log.messages, [MESSAGE.to_vec()]);
}

#[tokio::test]
async fn verify_policy_refuses_a_certificate_from_another_ca() {
    let (trusted, other) = (pki(), pki());
    let server = Server::start(tls_script(&other.ca)).await;
    let err = open(
        &server,
        &options(TlsPolicy::Verify, Some(&trusted.ca.ca), None),
    )
    .await
    .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert_eq!(err.phase(), Phase::StartTls);
    let msg = err.to_string();
    assert!(
        msg.contains("TLS policy verify") && msg.contains("not trusted"),
        "{msg}"
    );
    let f = Failure::from_client(&err, "scripted.test");
    assert_eq!(f.enhanced_status.as_deref(), Some("4.7.5"));
    assert_eq!(f.phase.as_deref(), Some("STARTTLS"));
    // nothing was sent after the failed handshake, and no clear-text retry happened
    assert_eq!(server.log().connections, 1);
    assert_eq!(server.log().verbs(), ["EHLO", "STARTTLS"]);
}

#[tokio::test]
async fn verify_policy_checks_the_configured_name() {
    let pki = pki();
    let server = Server::start(tls_script(&pki.ca)).await;
    let mut opts = options(TlsPolicy::Verify, Some(&pki.ca.ca), None);
    opts.tls.server_name = Some("smtp.elsewhere.test".into());
    let err = open(&server, &opts).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("smtp.elsewhere.test") && msg.contains("not trusted"),
        "{msg}"
    );
    // and the name the certificate does carry passes
    opts.tls.server_name = Some("localhost".into());
    assert!(open(&server, &opts).await.unwrap().tls().unwrap().verified);
}

#[tokio::test]
async fn encrypt_and_may_accept_any_certificate_unverified() {
    let (trusted, other) = (pki(), pki());
    let server = Server::start(tls_script(&other.ca)).await;
    for policy in [TlsPolicy::Encrypt, TlsPolicy::May] {
        let conn = open(&server, &options(policy, Some(&trusted.ca.ca), None))
            .await
            .unwrap();
        let tls = conn.tls().unwrap_or_else(|| panic!("{policy}: TLS"));
        assert!(!tls.verified, "{policy}");
        conn.quit().await;
    }
}

#[tokio::test]
async fn policy_none_never_starts_tls_and_may_goes_on_in_clear_when_not_offered() {
    let pki = pki();
    let server = Server::start(tls_script(&pki.ca)).await;
    let conn = open(&server, &options(TlsPolicy::None, None, None))
        .await
        .unwrap();
    assert!(conn.tls().is_none() && conn.capabilities().starttls);
    conn.quit().await;
    assert_eq!(server.log().verbs(), ["EHLO", "QUIT"]);

    let plain = Server::start(Script {
        ehlo: vec!["PIPELINING"],
        ..Script::default()
    })
    .await;
    let mut conn = open(&plain, &options(TlsPolicy::May, None, None))
        .await
        .unwrap();
    assert!(conn.tls().is_none());
    let outcomes = conn.send(&envelope(&["a@example.net"]), MESSAGE).await;
    assert!(
        matches!(&outcomes[..], [RcptOutcome::Accepted(_)]),
        "{outcomes:?}"
    );
    // without CHUNKING the message goes with DATA, dot-stuffed and unstuffed again
    assert_eq!(plain.log().messages, [MESSAGE.to_vec()]);
    assert!(plain.log().verbs().contains(&"DATA".to_owned()));
}

#[tokio::test]
async fn may_policy_retries_in_clear_text_once_after_a_failed_handshake() {
    let server = Server::start(Script {
        ehlo: vec!["STARTTLS"],
        broken_tls: true,
        ..Script::default()
    })
    .await;
    let mut conn = open(&server, &options(TlsPolicy::May, None, None))
        .await
        .unwrap();
    assert!(conn.tls().is_none());
    let outcomes = conn.send(&envelope(&["a@example.net"]), MESSAGE).await;
    assert!(
        matches!(&outcomes[..], [RcptOutcome::Accepted(_)]),
        "{outcomes:?}"
    );
    let log = server.log();
    assert_eq!(log.connections, 2);
    assert_eq!(log.failed_handshakes, 1);
    assert_eq!(
        log.verbs(),
        ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "DATA"]
    );
}

#[tokio::test]
async fn a_refused_starttls_goes_on_in_clear_under_may_and_fails_under_encrypt() {
    let server = Server::start(Script {
        ehlo: vec!["STARTTLS"],
        starttls_reply: Some("454 4.7.0 TLS not available due to local problem"),
        ..Script::default()
    })
    .await;
    let mut conn = open(&server, &options(TlsPolicy::May, None, None))
        .await
        .unwrap();
    assert!(conn.tls().is_none());
    let outcomes = conn.send(&envelope(&["a@example.net"]), MESSAGE).await;
    assert!(
        matches!(&outcomes[..], [RcptOutcome::Accepted(_)]),
        "{outcomes:?}"
    );
    // the same connection went on: no second one
    assert_eq!(server.log().connections, 1);

    let err = open(&server, &options(TlsPolicy::Encrypt, None, None))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert_eq!(err.phase(), Phase::StartTls);
    let f = Failure::from_client(&err, "scripted.test");
    assert_eq!(
        (f.smtp_code, f.phase.as_deref()),
        (Some(454), Some("STARTTLS"))
    );
}

#[tokio::test]
async fn required_tls_not_offered_is_a_transient_failure_naming_the_policy() {
    let server = Server::start(Script::default()).await;
    for policy in [TlsPolicy::Encrypt, TlsPolicy::Verify] {
        let err = open(&server, &options(policy, None, None))
            .await
            .unwrap_err();
        assert!(err.is_temporary(), "{err}");
        assert_eq!(
            err.to_string(),
            format!("TLS policy {policy} requires STARTTLS, which scripted.test does not offer")
        );
        let f = Failure::from_client(&err, "scripted.test");
        assert_eq!(f.enhanced_status.as_deref(), Some("4.7.4"));
    }
    // no message was offered to the server
    assert!(!server.log().verbs().iter().any(|v| v == "MAIL"));
}

#[tokio::test]
async fn data_sent_with_the_starttls_reply_is_refused() {
    let pki = pki();
    let server = Server::start(Script {
        inject_after_starttls: true,
        ..tls_script(&pki.ca)
    })
    .await;
    let err = open(&server, &options(TlsPolicy::Encrypt, None, None))
        .await
        .unwrap_err();
    assert!(err.is_temporary());
    assert!(
        err.to_string()
            .contains("scripted.test sent data after its STARTTLS reply"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// AUTH

#[tokio::test]
async fn auth_failures_are_permanent_for_535_and_transient_for_454() {
    let pki = pki();
    let wrong = Server::start(tls_script(&pki.ca)).await;
    let err = open(&wrong, &options(TlsPolicy::Encrypt, None, Some("wrong")))
        .await
        .unwrap_err();
    assert!(!err.is_temporary(), "{err}");
    assert_eq!(err.phase(), Phase::Auth);
    let f = Failure::from_client(&err, "scripted.test");
    assert_eq!(
        (
            f.smtp_code,
            f.enhanced_status.as_deref(),
            f.phase.as_deref()
        ),
        (Some(535), Some("5.7.8"), Some("AUTH"))
    );
    // the connection was closed politely, after the refused AUTH
    assert_eq!(wrong.log().verbs().last().unwrap(), "QUIT/tls");

    let busy = Server::start(Script {
        auth_reply: Some("454 4.7.0 temporary authentication failure"),
        ..tls_script(&pki.ca)
    })
    .await;
    let err = open(&busy, &options(TlsPolicy::Encrypt, None, Some("s3cret")))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert_eq!(
        Failure::from_client(&err, "x").enhanced_status.as_deref(),
        Some("4.7.0")
    );
}

#[tokio::test]
async fn credentials_never_go_out_in_clear_text_unless_the_policy_is_none() {
    // a server offering AUTH (LOGIN only) and no STARTTLS
    let script = Script {
        ehlo: vec!["AUTH LOGIN"],
        password: "s3cret",
        ..Script::default()
    };
    let server = Server::start(script.clone()).await;
    let err = open(&server, &options(TlsPolicy::May, None, Some("s3cret")))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert_eq!(
        Failure::from_client(&err, "x").enhanced_status.as_deref(),
        Some("4.7.11")
    );
    assert!(
        err.to_string().contains("refusing to send the password")
            && err.to_string().contains("TLS policy may"),
        "{err}"
    );
    assert_eq!(server.log().verbs(), ["EHLO", "QUIT"]);

    // policy none: the operator chose clear text; LOGIN is used when PLAIN is not offered
    let server = Server::start(script).await;
    let conn = open(&server, &options(TlsPolicy::None, None, Some("s3cret")))
        .await
        .unwrap();
    assert!(conn.is_authenticated());
    let log = server.log();
    assert_eq!(log.commands[1].0, "AUTH LOGIN");
    assert_eq!(b64decode(&log.commands[3].0), b"s3cret");
}

#[tokio::test]
async fn a_peer_without_a_known_mechanism_is_named() {
    let pki = pki();
    let server = Server::start(Script {
        ehlo_tls: vec!["AUTH CRAM-MD5 XOAUTH2"],
        ..tls_script(&pki.ca)
    })
    .await;
    let err = open(&server, &options(TlsPolicy::Encrypt, None, Some("s3cret")))
        .await
        .unwrap_err();
    assert!(err.is_temporary());
    assert_eq!(
        err.to_string(),
        "scripted.test offers no AUTH mechanism this client speaks (PLAIN, LOGIN); it offers: CRAM-MD5 XOAUTH2"
    );
}

// ---------------------------------------------------------------------------------------
// Malformed replies

/// A server that greets with `greeting` and then answers every line with `reply`.
async fn raw_server(greeting: Vec<u8>, reply: Vec<u8>) -> Target {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = Target::parse(&listener.local_addr().unwrap().to_string()).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (greeting, reply) = (greeting.clone(), reply.clone());
            tokio::spawn(async move {
                let mut io = BufReader::new(s);
                let _ = io.get_mut().write_all(&greeting).await;
                let mut line = String::new();
                while io.read_line(&mut line).await.unwrap_or(0) > 0 {
                    let _ = io.get_mut().write_all(&reply).await;
                    line.clear();
                }
            });
        }
    });
    target
}

#[tokio::test]
async fn malformed_replies_are_transient_errors_naming_the_problem() {
    let ok = b"220 raw.test ESMTP\r\n".to_vec();
    let endless: Vec<u8> = b"250-raw.test\r\n".repeat(300);
    let cases: Vec<(Vec<u8>, Vec<u8>, &str)> = vec![
        (
            [b"220 ".to_vec(), vec![b'x'; 2500], b"\r\n".to_vec()].concat(),
            vec![],
            "malformed reply to the greeting: reply line over 2000 octets from 127.0.0.1",
        ),
        (
            ok.clone(),
            b"hello there\r\n".to_vec(),
            "malformed reply to the EHLO command: expected a reply code from 200 to 599 at the start of \"hello there\" from raw.test",
        ),
        (
            ok.clone(),
            endless,
            "malformed reply to the EHLO command: reply of more than 200 lines from raw.test",
        ),
        (
            ok.clone(),
            b"250-raw.test\r\n251 other\r\n".to_vec(),
            "malformed reply to the EHLO command: reply mixes codes 250 and 251 on different lines from raw.test",
        ),
    ];
    for (greeting, reply, want) in cases {
        let target = raw_server(greeting, reply).await;
        let err = Connection::open_with(
            &target,
            Protocol::Smtp,
            "client.test",
            timeouts(),
            &OpenOptions::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), want);
        assert!(err.is_temporary(), "{want}");
        let RcptResult::Transient(f) =
            RcptResult::from_outcome(&RcptOutcome::Failed(err), "raw.test")
        else {
            panic!("{want}: transient");
        };
        assert_eq!(f.enhanced_status.as_deref(), Some("4.5.0"));
    }

    // Reply text in another charset (Latin-1) is read leniently: only code and separator
    // count.
    let target = raw_server(
        b"220 caf\xe9.test ESMTP\r\n".to_vec(),
        b"250 caf\xe9\r\n".to_vec(),
    )
    .await;
    let conn = Connection::open_with(
        &target,
        Protocol::Smtp,
        "client.test",
        timeouts(),
        &OpenOptions::default(),
    )
    .await
    .expect("a Latin-1 greeting and EHLO reply are accepted");
    assert!(conn.is_usable());
}

// ---------------------------------------------------------------------------------------
// Postfix

/// A private Postfix smtpd on a free loopback port, with STARTTLS from `ca`, holding every
/// message it accepts in its hold queue.
struct Postfix {
    dir: tempfile::TempDir,
    port: u16,
}

impl Postfix {
    fn etc(&self) -> PathBuf {
        self.dir.path().join("etc")
    }

    fn start(ca: &TestCa) -> Postfix {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // Postfix daemons run as the postfix user
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (etc, queue, data) = (
            dir.path().join("etc"),
            dir.path().join("queue"),
            dir.path().join("data"),
        );
        for d in [&etc, &queue, &data] {
            std::fs::create_dir_all(d).unwrap();
        }
        let status = Command::new("chown")
            .args(["postfix"])
            .arg(&data)
            .status()
            .unwrap();
        assert!(status.success());
        let port = free_port();
        let master = std::fs::read_to_string("/etc/postfix/master.cf").unwrap();
        let master: String = master
            .lines()
            .map(|l| {
                if l.starts_with("smtp      inet") {
                    format!("{port}      inet  n       -       n       -       -       smtpd")
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(etc.join("master.cf"), master + "\n").unwrap();
        let main = format!(
            "compatibility_level = 3.6\n\
             queue_directory = {queue}\n\
             data_directory = {data}\n\
             mail_owner = postfix\n\
             inet_interfaces = 127.0.0.1\n\
             inet_protocols = ipv4\n\
             myhostname = postfix.example.test\n\
             mydestination = example.test\n\
             local_recipient_maps =\n\
             mynetworks = 127.0.0.0/8\n\
             smtpd_end_of_data_restrictions = check_client_access static:HOLD\n\
             smtpd_tls_security_level = may\n\
             smtpd_tls_cert_file = {cert}\n\
             smtpd_tls_key_file = {key}\n\
             smtpd_tls_loglevel = 1\n\
             smtpd_tls_received_header = yes\n\
             maillog_file_prefixes = {dir}\n\
             maillog_file = {log}\n",
            dir = dir.path().display(),
            queue = queue.display(),
            data = data.display(),
            cert = ca.cert.display(),
            key = ca.key.display(),
            log = dir.path().join("maillog").display(),
        );
        std::fs::write(etc.join("main.cf"), main).unwrap();
        let out = Command::new("postfix")
            .arg("-c")
            .arg(&etc)
            .arg("start")
            .output()
            .expect("run postfix (Debian package postfix)");
        assert!(
            out.status.success(),
            "postfix start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let pf = Postfix { dir, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return pf;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("postfix smtpd did not listen on {port}: {}", pf.maillog());
    }

    fn maillog(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("maillog")).unwrap_or_default()
    }

    /// The held messages, as `postcat -bh` prints them.
    fn held(&self) -> Vec<String> {
        let hold = self.dir.path().join("queue/hold");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(hold).into_iter().flatten() {
            let path = entry.unwrap().path();
            let shown = Command::new("postcat")
                .args(["-b", "-h"])
                .arg(&path)
                .output()
                .unwrap();
            out.push(String::from_utf8_lossy(&shown.stdout).into_owned());
        }
        out
    }

    /// Waits until `n` messages are held (cleanup writes them after smtpd's reply).
    fn wait_held(&self, n: usize) -> Vec<String> {
        for _ in 0..200 {
            let held = self.held();
            if held.len() >= n {
                return held;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("postfix held fewer than {n} messages: {}", self.maillog());
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        let _ = Command::new("postfix")
            .arg("-c")
            .arg(self.etc())
            .arg("stop")
            .output();
    }
}

#[tokio::test]
async fn postfix_takes_a_message_over_verified_starttls_with_chunking() {
    let pki = pki();
    let postfix = Postfix::start(&pki.ca);
    let target = Target::parse(&format!("127.0.0.1:{}", postfix.port)).unwrap();
    let opts = options(TlsPolicy::Verify, Some(&pki.ca.ca), None);
    let mut conn = Connection::open_with(&target, Protocol::Smtp, "client.test", timeouts(), &opts)
        .await
        .unwrap();
    let tls = conn.tls().expect("TLS with Postfix");
    assert!(tls.verified, "{tls}");
    assert!(
        conn.capabilities().chunking,
        "Postfix offers CHUNKING over TLS"
    );
    let outcomes = conn
        .send(
            &envelope(&["alice@example.test", "bob@example.test"]),
            MESSAGE,
        )
        .await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, RcptOutcome::Accepted(_))),
        "{outcomes:?}"
    );
    conn.quit().await;

    let held = postfix.wait_held(1);
    let message = &held[0];
    // Postfix recorded the TLS session in its Received field, and got the message intact:
    // the leading dot travelled unstuffed in BDAT
    assert!(
        message.contains(&format!("(using {}", tls.version)),
        "{message}"
    );
    assert!(message.contains("Subject: client test"), "{message}");
    assert!(message.contains("\n.leading dot\n"), "{message}");
    assert!(!message.contains("..leading dot"), "{message}");
    // Postfix's log daemon writes asynchronously, the session summary after the 221: wait
    // for it.
    let summary = |log: &str| {
        log.lines().any(|l| {
            l.contains("disconnect from")
                && l.contains("ehlo=2 starttls=1 mail=1 rcpt=2 bdat=1 quit=1")
        })
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut log = postfix.maillog();
    while !summary(&log) && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        log = postfix.maillog();
    }
    assert!(
        log.lines()
            .any(|l| l.contains("TLS connection established from") && l.contains("[127.0.0.1]")),
        "{log}"
    );
    // and counted the commands: STARTTLS, EHLO twice, BDAT instead of DATA
    assert!(summary(&log), "{log}");
}

/// A stored envelope whose ORCPT carries a line break (written by an older ingress, or
/// edited in the database) never reaches the peer as a second command: that recipient
/// fails alone, permanently (5.5.2), and the others are delivered in the same pipelined
/// transaction.
#[tokio::test]
async fn a_recipient_whose_rcpt_line_would_carry_a_line_break_fails_alone() {
    let server = Server::start(Script {
        ehlo: vec!["PIPELINING", "DSN"],
        ..Script::default()
    })
    .await;
    let mut conn = open(&server, &OpenOptions::default()).await.unwrap();
    let mut env = envelope(&["a@example.net", "b@example.net", "c@example.net"]);
    env.recipients[1].orcpt = Some("rfc822\r\nRSET;b@example.net".into());
    let outcomes = conn.send(&env, MESSAGE).await;
    assert!(
        matches!(
            &outcomes[..],
            [
                RcptOutcome::Accepted(_),
                RcptOutcome::Failed(_),
                RcptOutcome::Accepted(_)
            ]
        ),
        "{outcomes:?}"
    );
    let RcptResult::Permanent(f) = RcptResult::from_outcome(&outcomes[1], "scripted.test") else {
        panic!("an unsendable recipient is a permanent failure: {outcomes:?}");
    };
    assert_eq!(f.enhanced_status.as_deref(), Some("5.5.2"));
    assert!(
        f.diagnostic.contains("an LF") || f.diagnostic.contains("a CR"),
        "{}",
        f.diagnostic
    );
    conn.quit().await;
    let log = server.log();
    assert_eq!(
        log.verbs(),
        ["EHLO", "MAIL", "RCPT", "RCPT", "DATA", "QUIT"]
    );
    assert!(
        log.commands.iter().all(|(c, _)| !c.contains("RSET")),
        "{:?}",
        log.commands
    );
    assert_eq!(log.messages.len(), 1);
}
