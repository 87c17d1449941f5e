//! pepsi-stage-milter through the whole system (SMTP in → the filter stage → Maildir, DSN
//! or queue) against real filters: a libmilter filter (Sendmail's own library, through
//! Debian's python3-milter: tests/integration/milter/actions.py) that takes every action
//! of the protocol, rspamd in milter mode, and OpenDKIM signing and verifying.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;
use crate::support::system::{Proc, System};

const WAIT: Duration = Duration::from_secs(30);

/// Waits until something accepts connections on `port`, or panics with `log`'s text.
async fn wait_listening(port: u16, what: &str, log: &Path) {
    let until = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < until,
            "{what} did not listen on {port}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The libmilter filter of actions.py on a free port; its JSON log of what it was told.
struct Actions {
    _proc: Proc,
    port: u16,
    log: PathBuf,
}

impl Actions {
    async fn start(dir: &Path) -> Actions {
        let port = support::free_port();
        let log = dir.join("actions.jsonl");
        let stderr = dir.join("actions.stderr");
        let child = Command::new("/usr/bin/python3")
            .arg(support::root().join("tests/integration/milter/actions.py"))
            .arg(port.to_string())
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("/usr/bin/python3 with python3-milter (scripts/apt-packages.txt)");
        wait_listening(port, "actions.py", &stderr).await;
        Actions {
            _proc: Proc {
                child,
                name: "actions.py",
            },
            port,
            log,
        }
    }

    /// One JSON object per message the filter saw (to its end, or accepted at MAIL).
    fn seen(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn seen_subject(&self, subject: &str) -> Value {
        self.seen()
            .into_iter()
            .find(|s| {
                s["headers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|h| h[0].as_str() == Some("Subject") && h[1].as_str() == Some(subject))
            })
            .unwrap_or_else(|| panic!("the filter saw no message {subject:?}: {:?}", self.seen()))
    }
}

/// The filter stage spliced in front of alias expansion, so every message (DSNs too)
/// passes through it.
fn splice(milter: &str, options: &str) -> String {
    format!(
        "[stage-init]\nNEXT_STAGE = filter\n\n\
         [stage-filter]\nPROGRAM = pepsi-stage-milter\nMILTER = {milter}\nNEXT_STAGE = aliases\n\
         BOUNCE_STAGE = bounce\n{options}\n"
    )
}

fn mail(from: &str, to: &str, subject: &str, extra: &str) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\n{extra}Message-ID: <{subject}.{}@example.test>\r\n\r\n\
         original body\r\n",
        std::process::id()
    )
    .into_bytes()
}

fn text(m: &[u8]) -> String {
    String::from_utf8_lossy(m).into_owned()
}

/// The queued rows at stage `filter`, by status (`held`: paused with `state.held`, which
/// `paused` leaves out).
async fn at_filter(sys: &System, status: &str) -> Vec<(i64, Vec<String>, Value)> {
    sys.queue()
        .await
        .into_iter()
        .filter(|(_, stage, st, _, state)| {
            let st = if st == "paused" && state.get("held").is_some() {
                "held"
            } else {
                st.as_str()
            };
            stage == "filter" && st == status
        })
        .map(|(id, _, _, rcpt, state)| (id, rcpt, state))
        .collect()
}

async fn wait_rows(sys: &System, status: &str, n: usize) -> Vec<(i64, Vec<String>, Value)> {
    let until = Instant::now() + WAIT;
    loop {
        let rows = at_filter(sys, status).await;
        if rows.len() >= n {
            return rows;
        }
        assert!(
            Instant::now() < until,
            "{n} rows {status} at filter: {:#?}\n{}",
            sys.queue().await,
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_milter_action_is_carried_out_through_the_whole_system() {
    let users = ["alice", "bob", "carol", "dave", "refuse", "defer", "accept"];
    let dir = tempfile::tempdir().unwrap();
    let actions = Actions::start(dir.path()).await;
    let extra = splice(
        &format!("inet:{}@127.0.0.1", actions.port),
        "RETRY_INITIAL = 1h\nCOMMAND_TIMEOUT = 3s\nCONTENT_TIMEOUT = 3s\n",
    );
    let mut sys = System::new(&extra, &users).await;
    sys.start().await;

    // Every header, body and envelope change, with progress packets on the way.
    let reply = sys
        .send(
            "dave@example.test",
            &["alice@example.test", "carol@example.test"],
            &mail(
                "dave@example.test",
                "alice@example.test",
                "edit",
                "X-Remove: this\r\n",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let edit_id = support::ingress::queued_id(reply.trim_end());
    let alice = sys.wait_messages("alice", 1, WAIT).await;
    let bob = sys.wait_messages("bob", 1, WAIT).await;
    let got = text(&alice[0]);
    let (headers, body) = support::system::split(&alice[0]);
    let headers = text(headers);
    assert!(
        headers.starts_with(
            "Return-Path: <changed@example.test>\r\nDelivered-To: alice@example.test\r\n\
             X-Top: first\r\nReceived: "
        ),
        "the sender changed, a field inserted at the top of the stored message: {got}"
    );
    assert!(headers.contains("\r\nX-Filter: added\r\n"), "{got}");
    assert!(
        headers.contains("Subject: edited by the filter\r\n"),
        "{got}"
    );
    assert!(!headers.contains("Subject: edit\r\n"), "{got}");
    assert!(!headers.contains("X-Remove"), "deleted: {got}");
    assert_eq!(body, b"replaced by the filter\r\n", "{got}");
    assert_eq!(
        text(&bob[0]).split_once("X-Top:").unwrap().1,
        got.split_once("X-Top:").unwrap().1,
        "the added recipient gets the same copy"
    );
    let delivered: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT mail_from, rcpt_to FROM pepsi.mail_log \
         WHERE event = 'delivered' ORDER BY log_id",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    assert!(
        delivered
            .iter()
            .all(|(from, _)| from == "changed@example.test"),
        "the sender was changed: {delivered:?}"
    );
    let told = actions.seen_subject("edit");
    assert_eq!(told["queue_id"], Value::String(edit_id.to_string()));
    assert_eq!(told["client"]["client_addr"], "127.0.0.1");
    assert_eq!(told["from"], "<dave@example.test>");
    assert_eq!(
        told["rcpt"],
        serde_json::json!(["<alice@example.test>", "<carol@example.test>"])
    );
    assert!(
        told["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "X-Remove" && h[1] == "this"),
        "header values without their leading space: {told}"
    );
    assert_eq!(told["body"], "original body\r\n");

    // Recipients part ways: one passes, one is refused (a DSN with the filter's reply),
    // one waits at the stage as a Retry group of its own, keeping the message's age.
    let reply = sys
        .send(
            "dave@example.test",
            &[
                "alice@example.test",
                "refuse@example.test",
                "defer@example.test",
            ],
            &mail("dave@example.test", "alice@example.test", "parting", ""),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 2, WAIT).await;
    let dsn = sys.wait_messages("dave", 1, WAIT).await;
    let dsn = text(&dsn[0]);
    assert!(dsn.contains("refuse@example.test"), "{dsn}");
    assert!(dsn.contains("5.1.1"), "{dsn}");
    assert!(dsn.contains("no such user here"), "{dsn}");
    assert!(!dsn.contains("defer@example.test"), "{dsn}");
    let paused = wait_rows(&sys, "paused", 1).await;
    assert_eq!(paused[0].1, vec!["defer@example.test"]);
    assert_eq!(paused[0].2["milter"]["filter"]["attempts"], 1);
    assert!(
        paused[0].2["milter"]["filter"]["reason"]
            .as_str()
            .unwrap()
            .contains("451 4.7.1 try this one later"),
        "{:?}",
        paused[0].2
    );

    // The message as a whole: rejected (a DSN), tempfailed (waits), quarantined (held for
    // an operator), discarded (gone, in the mail log), accepted at MAIL (unfiltered).
    for subject in ["reject", "tempfail", "quarantine", "discard"] {
        let reply = sys
            .send(
                "dave@example.test",
                &["carol@example.test"],
                &mail("dave@example.test", "carol@example.test", subject, ""),
            )
            .await;
        assert!(reply.starts_with("250"), "{subject}: {reply}");
    }
    // A discard of the message leaves a recipient deferred at RCPT waiting, alone.
    let reply = sys
        .send(
            "dave@example.test",
            &["carol@example.test", "defer@example.test"],
            &mail("dave@example.test", "carol@example.test", "discard", ""),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let reply = sys
        .send(
            "accept@example.test",
            &["carol@example.test"],
            &mail(
                "accept@example.test",
                "carol@example.test",
                "unfiltered",
                "",
            ),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let dsns = sys.wait_messages("dave", 2, WAIT).await;
    let reject = dsns
        .iter()
        .map(|m| text(m))
        .find(|m| m.contains("rejected as spam"))
        .expect("a DSN for the rejected message");
    assert!(reject.contains("5.7.1"), "{reject}");
    let carol = sys.wait_messages("carol", 1, WAIT).await;
    assert!(
        text(&carol[0]).contains("Subject: unfiltered"),
        "{}",
        text(&carol[0])
    );
    let held = wait_rows(&sys, "held", 1).await;
    assert_eq!(
        held[0].2["milter"]["filter"]["quarantine"],
        "held for review"
    );
    assert_eq!(
        held[0].2["held"]["reason"],
        "quarantined by the content filter: held for review"
    );
    assert!(at_filter(&sys, "failed").await.is_empty());
    let seen_before = actions.seen().len();
    let paused = wait_rows(&sys, "paused", 3).await;
    assert!(
        paused.iter().any(
            |(_, rcpt, state)| rcpt == &vec!["carol@example.test".to_owned()]
                && state["milter"]["filter"]["attempts"] == 1
        ),
        "{paused:?}"
    );
    assert_eq!(
        paused
            .iter()
            .filter(|(_, rcpt, _)| rcpt == &vec!["defer@example.test".to_owned()])
            .count(),
        2,
        "the discarded recipient left the deferred one's row: {paused:?}"
    );
    let dropped: Vec<(Vec<String>, Value)> =
        sqlx::query_as("SELECT rcpt_to, detail FROM pepsi.mail_log WHERE event = 'dropped'")
            .fetch_all(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    assert!(
        dropped
            .iter()
            .all(|(r, _)| r == &vec!["carol@example.test"]),
        "{dropped:?}"
    );
    let unfiltered = actions
        .seen()
        .into_iter()
        .find(|s| s["from"] == "<accept@example.test>")
        .expect("the filter saw MAIL FROM:<accept@…>");
    assert_eq!(
        unfiltered["headers"],
        serde_json::json!([]),
        "accepted at MAIL: nothing more was sent"
    );
    // Carol got only the unfiltered message; alice two; nothing else was delivered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sys.messages("carol").len(), 1);
    assert_eq!(sys.messages("alice").len(), 2);

    // An operator releases the held message: it goes on without the filter asked again.
    let out = sys
        .command(&support::system::queue_tool())
        .args(["release", &held[0].0.to_string()])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let carol = sys.wait_messages("carol", 2, WAIT).await;
    assert!(
        carol
            .iter()
            .any(|m| text(m).contains("Subject: quarantine\r\n")),
        "the released message was delivered"
    );
    assert_eq!(
        actions.seen().len(),
        seen_before,
        "the filter was not asked again"
    );
    drop(actions);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_filter_that_is_down_or_too_slow_defers_or_passes_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let actions = Actions::start(dir.path()).await;
    let dead = support::free_port();
    // Two filter stages in a row: the first asks a port nobody listens on and lets mail
    // pass; the second times out on a slow answer and defers.
    let extra = format!(
        "[stage-init]\nNEXT_STAGE = open\n\n\
         [stage-open]\nPROGRAM = pepsi-stage-milter\nMILTER = inet:127.0.0.1:{dead}\n\
         NEXT_STAGE = filter\nBOUNCE_STAGE = bounce\nDOWN_ACTION = pass\nCONNECT_TIMEOUT = 2s\n\n\
         [stage-filter]\nPROGRAM = pepsi-stage-milter\nMILTER = inet:127.0.0.1:{port}\n\
         NEXT_STAGE = aliases\nBOUNCE_STAGE = bounce\nDOWN_ACTION = tempfail\n\
         CONTENT_TIMEOUT = 1s\nRETRY_INITIAL = 1h\n",
        port = actions.port
    );
    let mut sys = System::new(&extra, &["alice"]).await;
    sys.start().await;
    for subject in ["fast", "slow"] {
        let reply = sys
            .send(
                "dave@example.test",
                &["alice@example.test"],
                &mail("dave@example.test", "alice@example.test", subject, ""),
            )
            .await;
        assert!(reply.starts_with("250"), "{reply}");
    }
    let alice = sys.wait_messages("alice", 1, WAIT).await;
    assert!(text(&alice[0]).contains("Subject: fast"));
    let paused = wait_rows(&sys, "paused", 1).await;
    let reason = paused[0].2["milter"]["filter"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.starts_with("451 4.7.1 the content filter") && reason.contains("within 1s"),
        "{reason}"
    );
    assert!(
        paused[0].2["milter"].get("open").is_none(),
        "the open stage passed it: {:?}",
        paused[0].2
    );
    assert!(
        sys.logs().contains("milter unavailable"),
        "the refused connection is logged"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sys.messages("alice").len(), 1, "the slow one waits");
    drop(actions);
}

/// Security review #14: the header and recipient changes of one conversation have a byte
/// budget (MAX_EDIT_SIZE); a filter that asks for more is unavailable (DOWN_ACTION), and
/// its changes are never written into the message.
#[tokio::test(flavor = "multi_thread")]
async fn milter_byte_budget_a_filter_adding_too_many_header_bytes_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let actions = Actions::start(dir.path()).await;
    let extra = splice(
        &format!("inet:127.0.0.1:{}", actions.port),
        "DOWN_ACTION = tempfail\nRETRY_INITIAL = 1h\nMAX_EDIT_SIZE = 64k\n",
    );
    let mut sys = System::new(&extra, &["alice"]).await;
    sys.start().await;
    for subject in ["flood", "fine"] {
        let reply = sys
            .send(
                "dave@example.test",
                &["alice@example.test"],
                &mail("dave@example.test", "alice@example.test", subject, ""),
            )
            .await;
        assert!(reply.starts_with("250"), "{reply}");
    }
    let alice = sys.wait_messages("alice", 1, WAIT).await;
    assert!(
        text(&alice[0]).contains("Subject: fine"),
        "{}",
        text(&alice[0])
    );
    let paused = wait_rows(&sys, "paused", 1).await;
    let reason = paused[0].2["milter"]["filter"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.starts_with("451 4.7.1") && reason.contains("MAX_EDIT_SIZE"),
        "{reason}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alice = sys.messages("alice");
    assert_eq!(alice.len(), 1, "the flooded one waits");
    assert!(!text(&alice[0]).contains("X-Flood"));
    drop(actions);
}

/// A filter from Debian started by one of the scripts beside actions.py, on a free port,
/// in a process group of its own: killed with all its workers when dropped (rspamd's
/// would outlive their parent).
struct Peer {
    _proc: Proc,
    port: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let group = format!("-{}", self._proc.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
    }
}

impl Peer {
    async fn start(script: &str, args: &[&str], dir: &Path) -> Peer {
        let port = support::free_port();
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join(format!("{script}.stderr"));
        let child = Command::new(
            support::root()
                .join("tests/integration/milter")
                .join(script),
        )
        .args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
        .arg(dir)
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
        wait_listening(port, script, &log).await;
        Peer {
            _proc: Proc {
                child,
                name: "filter",
            },
            port,
        }
    }
}

/// A plain-text message from dave to alice, as a scanner sees most mail.
fn plain(subject: &str, body: &str) -> Vec<u8> {
    format!(
        "From: dave@example.test\r\nTo: alice@example.test\r\nSubject: {subject}\r\n\
         Date: Thu, 03 Dec 2026 10:00:00 +0000\r\nMessage-ID: <{subject}@example.test>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n{body}\r\n"
    )
    .into_bytes()
}

const GTUBE: &str = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X";

#[tokio::test(flavor = "multi_thread")]
async fn rspamd_rejects_spam_and_marks_what_it_lets_through() {
    let dir = tempfile::tempdir().unwrap();
    let rspamd = Peer::start("rspamd.sh", &["{port}"], &dir.path().join("rspamd")).await;
    let extra = splice(&format!("inet:127.0.0.1:{}", rspamd.port), "");
    let mut sys = System::new(&extra, &["alice", "dave"]).await;
    sys.start().await;
    let message = plain;
    let mut ids = Vec::new();
    for (subject, body) in [
        (
            "hello",
            "Hello Alice,\r\n\r\nsee you on Monday.\r\n\r\nDave".to_owned(),
        ),
        ("spam", format!("Buy now\r\n{GTUBE}")),
        ("suspect", format!("Maybe\r\nY{}", &GTUBE[1..])),
    ] {
        let reply = sys
            .send(
                "dave@example.test",
                &["alice@example.test"],
                &message(subject, &body),
            )
            .await;
        assert!(reply.starts_with("250"), "{subject}: {reply}");
        ids.push(support::ingress::queued_id(reply.trim_end()));
    }
    let alice = sys.wait_messages("alice", 2, WAIT).await;
    let dsn = sys.wait_messages("dave", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    let dsn = text(&dsn[0]);
    assert!(dsn.contains("554 5.7.1 Gtube pattern"), "{dsn}");
    assert!(dsn.contains("Status: 5.7.1"), "{dsn}");
    let find = |subject: &str| {
        alice
            .iter()
            .map(|m| text(m))
            .find(|m| m.contains(&format!("Subject: {subject}\r\n")))
            .unwrap_or_else(|| panic!("no {subject} for alice"))
    };
    let hello = find("hello");
    assert!(
        hello.contains("\r\nX-Spamd-Result: default: False ["),
        "{hello}"
    );
    assert!(
        hello.contains(&format!("\r\nX-Rspamd-Queue-Id: {}\r\n", ids[0])),
        "the queue id macro reached rspamd: {hello}"
    );
    assert!(hello.contains("\r\nX-Spam-Status: No, score="), "{hello}");
    assert!(!hello.contains("X-Spam: Yes"), "{hello}");
    // Folded fields rspamd sends with LF are stored with CRLF.
    assert!(
        !hello.replace("\r\n", "").contains('\n'),
        "bare LF: {hello:?}"
    );
    let suspect = find("suspect");
    assert!(suspect.contains("\r\nX-Spam: Yes\r\n"), "{suspect}");
    assert_eq!(sys.messages("alice").len(), 2, "the spam was not delivered");
}

#[tokio::test(flavor = "multi_thread")]
async fn opendkim_signs_through_one_stage_and_verifies_through_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("dkim");
    let sign = Peer::start("opendkim.sh", &["sign", "{port}"], &keys).await;
    let verify = Peer::start("opendkim.sh", &["verify", "{port}"], &keys).await;
    let extra = format!(
        "[stage-init]\nNEXT_STAGE = sign\n\n\
         [stage-sign]\nPROGRAM = pepsi-stage-milter\nMILTER = inet:{}@127.0.0.1\n\
         NEXT_STAGE = verify\nBOUNCE_STAGE = bounce\n\n\
         [stage-verify]\nPROGRAM = pepsi-stage-milter\nMILTER = inet:{}@127.0.0.1\n\
         NEXT_STAGE = aliases\nBOUNCE_STAGE = bounce\n",
        sign.port, verify.port
    );
    let mut sys = System::new(&extra, &["alice", "bob"]).await;
    sys.start().await;
    // Folded fields and a body over one 64 KiB chunk: what simple/simple signs byte for
    // byte.
    let long: String = (0..2000)
        .map(|i| format!("line {i} of a long message body\r\n"))
        .collect();
    let message = format!(
        "From: Alice <alice@example.test>\r\nTo: bob@example.test\r\n\
         Subject: a signed message\r\n  with a folded subject\r\n\
         Date: Thu, 03 Dec 2026 10:00:00 +0000\r\nMessage-ID: <signed@example.test>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n{long}"
    );
    let reply = sys
        .send(
            "alice@example.test",
            &["bob@example.test"],
            message.as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bob = sys.wait_messages("bob", 1, WAIT).await;
    let got = text(&bob[0]);
    let (headers, body) = support::system::split(&bob[0]);
    let headers = text(headers);
    assert!(
        headers.contains("\r\nDKIM-Signature: v=1; a=rsa-sha256; c=simple/simple; d=example.test;"),
        "{headers}"
    );
    assert!(
        headers.contains("Authentication-Results: mx.example.test;")
            && headers.contains("dkim=pass")
            && headers.contains("header.d=example.test"),
        "the verifier passed the signature the signer made: {headers}"
    );
    assert_eq!(body, long.as_bytes(), "{got:.300}");
    // The stored message verifies on its own too (dkimpy, the signer's public key): the
    // fields were written back byte for byte.
    let der = keys.join("pepsi.pub.der");
    let made = Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(keys.join("pepsi.private"))
        .arg("-out")
        .arg(&der)
        .status()
        .unwrap();
    assert!(made.success());
    let keyset = serde_json::json!({ "pepsi._domainkey.example.test": ["rsa", der] });
    // The Delivered-To and Return-Path fields the Maildir delivery adds are above the
    // signature and not signed.
    let verified = support::dkimpy(
        "print(json.dumps(dkim.verify(msg, dnsfunc=dnsfunc)))",
        &keyset,
        &bob[0],
    );
    assert_eq!(verified, Value::Bool(true), "{got:.2000}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spamass_milter_rejects_rewrites_and_marks() {
    let dir = tempfile::tempdir().unwrap();
    // spamd runs as nobody, under this directory.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let spamass = Peer::start("spamass.sh", &["{port}"], &dir.path().join("spamass")).await;
    let extra = splice(&format!("inet:{}@127.0.0.1", spamass.port), "");
    let mut sys = System::new(&extra, &["alice", "dave"]).await;
    sys.start().await;
    let message = plain;
    for (subject, body) in [
        (
            "notes",
            "Hi Alice,\r\n\r\nthe notes from the meeting follow on Monday.\r\n",
        ),
        ("spam", &format!("Buy now\r\n{GTUBE}")[..]),
        ("offer", "pepsi-test-spam-marker"),
    ] {
        let reply = sys
            .send(
                "dave@example.test",
                &["alice@example.test"],
                &message(subject, body),
            )
            .await;
        assert!(reply.starts_with("250"), "{subject}: {reply}");
    }
    let alice = sys.wait_messages("alice", 2, WAIT).await;
    let dsn = sys.wait_messages("dave", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    let dsn = text(&dsn[0]);
    assert!(dsn.contains("550 5.7.1 Blocked by SpamAssassin"), "{dsn}");
    let find = |needle: &str| {
        alice
            .iter()
            .map(|m| text(m))
            .find(|m| m.contains(needle))
            .unwrap_or_else(|| panic!("no message with {needle:?} for alice"))
    };
    let notes = find("Subject: notes\r\n");
    assert!(notes.contains("\r\nX-Spam-Status: No, score="), "{notes}");
    assert!(!notes.contains("X-Spam-Flag"), "{notes}");
    // Spam under the reject score: fields added and changed, the body replaced by
    // SpamAssassin's report with the original attached.
    let offer = find("Subject: *****SPAM***** offer\r\n");
    let (headers, body) = support::system::split(offer.as_bytes());
    let (headers, body) = (text(headers), text(body));
    assert!(headers.contains("\r\nX-Spam-Flag: YES\r\n"), "{offer}");
    assert!(
        headers.contains("Content-Type: multipart/mixed;"),
        "{offer}"
    );
    assert!(!headers.contains("Content-Type: text/plain"), "{offer}");
    assert!(body.contains("Spam: "), "{offer}");
    assert!(body.contains("message/rfc822"), "{offer}");
    assert!(body.contains("pepsi-test-spam-marker"), "{offer}");
    assert!(
        !body.replace("\r\n", "").contains('\n'),
        "bare LF in {body:?}"
    );
    assert_eq!(
        sys.messages("alice").len(),
        2,
        "the GTUBE message was not delivered"
    );
}
