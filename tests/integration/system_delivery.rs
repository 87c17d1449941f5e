//! The whole system on the shipped default graph: real `pepsi-ingress`, `pepsi-dispatch` and
//! the stage programs it starts, a real PostgreSQL, real Maildirs. Mail in over SMTP, files
//! out in Maildir; what cannot be delivered comes back to the sender as a DSN.

use std::time::Duration;

use crate::support;
use crate::support::system::{System, send_smtp, split};

const WAIT: Duration = Duration::from_secs(30);

fn dsn_text(msg: &[u8]) -> String {
    String::from_utf8_lossy(msg).into_owned()
}

#[tokio::test]
async fn smtp_in_lands_in_maildir_with_the_body_byte_identical() {
    let mut sys = System::new("", &["alice", "bob"]).await;
    sys.start().await;
    // dot-stuffing, 8-bit text, a long line, a trailing space and no final blank line
    let headers = "From: bob@example.test\r\nTo: alice@example.test\r\nSubject: byte for byte\r\n\
                   Message-ID: <e2e-1@example.test>\r\n";
    let body = ".a line that starts with a dot\r\n..two dots\r\n\
                Gr\u{fc}\u{df}e aus K\u{f6}ln \r\n\r\n"
        .to_string()
        + &"x".repeat(900)
        + "\r\nlast line\r\n";
    let sent = format!("{headers}\r\n{body}");
    let reply = sys
        .send("bob@example.test", &["alice@example.test"], sent.as_bytes())
        .await;
    assert!(reply.starts_with("250"), "{reply}");

    let got = sys.wait_messages("alice", 1, WAIT).await;
    let (stored_headers, stored_body) = split(&got[0]);
    assert_eq!(
        stored_body,
        body.as_bytes(),
        "the body must be byte-identical"
    );
    let stored_headers = String::from_utf8(stored_headers.to_vec()).unwrap();
    // the prepended trace: Return-Path and Delivered-To from delivery, Received from the ingress
    let lines: Vec<&str> = stored_headers.split("\r\n").collect();
    assert_eq!(lines[0], "Return-Path: <bob@example.test>");
    assert_eq!(lines[1], "Delivered-To: alice@example.test");
    assert!(
        stored_headers.contains("\r\nReceived: from client.example.test"),
        "{stored_headers}"
    );
    assert!(
        stored_headers.ends_with(headers),
        "the sent headers must follow the prepended ones unchanged:\n{stored_headers}"
    );
    assert!(sys.messages("bob").is_empty());
    sys.wait_empty(WAIT).await;
}

#[tokio::test]
async fn mail_to_an_unknown_local_user_comes_back_to_the_sender_as_a_dsn() {
    // With the MX's recipient check off (with it on, nobody@ is refused at RCPT, as
    // ingress_local tests), the unknown user is found at delivery: no Maildir.
    let mut sys = System::new(
        "[pepsi-ingress]\nCHECK_RECIPIENTS = no\n",
        &["alice", "bob"],
    )
    .await;
    sys.start().await;
    let msg = b"From: bob@example.test\r\nTo: nobody@example.test\r\nSubject: to nobody\r\n\
                Message-ID: <e2e-2@example.test>\r\n\r\nIs anybody there?\r\n";
    let reply = sys
        .send(
            "bob@example.test",
            &["nobody@example.test", "alice@example.test"],
            msg,
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    // alice gets the message, bob gets the DSN for nobody
    sys.wait_messages("alice", 1, WAIT).await;
    let dsn = sys.wait_messages("bob", 1, WAIT).await;
    let text = dsn_text(&dsn[0]);
    assert!(text.starts_with("Return-Path: <>\r\n"), "{text}");
    assert!(
        text.contains("multipart/report") && text.contains("report-type=\"delivery-status\""),
        "{text}"
    );
    assert!(
        text.contains("Final-Recipient: rfc822; nobody@example.test"),
        "{text}"
    );
    assert!(text.contains("Action: failed"), "{text}");
    assert!(text.contains("Status: 5.1.1"), "{text}");
    assert!(
        !text.contains("Final-Recipient: rfc822; alice@example.test"),
        "{text}"
    );
    assert!(
        text.contains("Subject: to nobody"),
        "the DSN returns the headers: {text}"
    );
    sys.wait_empty(WAIT).await;
    assert_eq!(sys.messages("bob").len(), 1, "exactly one DSN");
}

#[tokio::test]
async fn notify_success_gets_a_success_dsn_never_and_the_null_sender_get_none() {
    // The unknown user must reach delivery (its DSN is what NOTIFY decides): the MX's
    // recipient check is off.
    let mut sys = System::new(
        "[pepsi]\nORIGINATE_SUCCESS_DSN = yes\n\n[pepsi-ingress]\nCHECK_RECIPIENTS = no\n",
        &["alice", "bob"],
    )
    .await;
    sys.start().await;
    let msg = |subject: &str| {
        format!("From: bob@example.test\r\nSubject: {subject}\r\n\r\nbody\r\n").into_bytes()
    };
    // NOTIFY=SUCCESS to alice: delivered, and bob hears of it
    let r = send_smtp(
        sys.port,
        "bob@example.test",
        &["alice@example.test NOTIFY=SUCCESS ORCPT=rfc822;alice@example.test"],
        &msg("success please"),
        " ENVID=env-42",
    )
    .await;
    assert!(r.starts_with("250"), "{r}");
    let dsn = sys.wait_messages("bob", 1, WAIT).await;
    let text = dsn_text(&dsn[0]);
    assert!(text.contains("Action: delivered"), "{text}");
    assert!(text.contains("Status: 2."), "{text}");
    assert!(text.contains("Original-Envelope-Id: env-42"), "{text}");
    assert!(
        text.contains("Original-Recipient: rfc822; alice@example.test"),
        "{text}"
    );
    sys.wait_empty(WAIT).await;

    // NOTIFY=NEVER to an unknown user: nothing comes back
    let r = send_smtp(
        sys.port,
        "bob@example.test",
        &["nobody@example.test NOTIFY=NEVER", "alice@example.test"],
        &msg("never tell me"),
        "",
    )
    .await;
    assert!(r.starts_with("250"), "{r}");
    // the null sender to an unknown user: nothing comes back either (and nothing loops)
    let r = send_smtp(
        sys.port,
        "",
        &["nobody@example.test", "alice@example.test"],
        &msg("from nobody"),
        "",
    )
    .await;
    assert!(r.starts_with("250"), "{r}");
    sys.wait_messages("alice", 3, WAIT).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(sys.messages("bob").len(), 1, "only the success DSN");
}

/// `X-Seq` values of the messages in `user`'s Maildir.
fn seqs(sys: &System, user: &str) -> Vec<u32> {
    sys.messages(user)
        .iter()
        .map(|m| {
            let text = String::from_utf8_lossy(m);
            let at = text.find("X-Seq: ").expect("an X-Seq header") + 7;
            text[at..].split("\r\n").next().unwrap().parse().unwrap()
        })
        .collect()
}

#[tokio::test]
async fn kill_9_of_a_delivery_worker_loses_nothing_and_pepsi_queue_retry_finishes_the_rest() {
    const N: u32 = 150;
    let mut sys = System::new(
        "[stage-local]\nPARALLELISM = 1\nQUEUE_LIMIT = 4\n",
        &["alice", "bob"],
    )
    .await;
    sys.start().await;
    // 5 clients at once, so the ingress keeps the queue fed while the worker is killed
    let mut tasks = Vec::new();
    for client in 0..5u32 {
        let port = sys.port;
        tasks.push(tokio::spawn(async move {
            for n in (client..N).step_by(5) {
                let msg = format!(
                    "From: bob@example.test\r\nX-Seq: {n}\r\nSubject: kill test\r\n\r\nmessage {n}\r\n"
                );
                let r = send_smtp(port, "bob@example.test", &["alice@example.test"], msg.as_bytes(), "").await;
                assert!(r.starts_with("250"), "{r}");
            }
        }));
    }
    // once delivery is under way, kill -9 the Maildir worker
    let until = std::time::Instant::now() + WAIT;
    let victim = loop {
        let delivered = sys.messages("alice").len();
        let worker = support::system::children(sys.dispatcher_pid())
            .into_iter()
            .find(|&pid| support::system::cmdline(pid).contains("pepsi-stage-relay-to-maildir"));
        if let (true, Some(pid)) = (delivered >= 10, worker) {
            break pid;
        }
        assert!(
            std::time::Instant::now() < until,
            "no delivery under way\n{}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    support::system::signal(victim, "KILL");
    for t in tasks {
        t.await.unwrap();
    }
    // everything is delivered, or failed with its reason and waiting for the operator
    let until = std::time::Instant::now() + WAIT;
    let failed = loop {
        let q = sys.queue().await;
        if q.iter().all(|(_, _, status, _, _)| status == "failed") {
            break q;
        }
        assert!(
            std::time::Instant::now() < until,
            "queue still moving: {q:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (id, _, _, _, state) in &failed {
        let reason = state["dispatch_error"].as_str().unwrap_or_default();
        assert!(
            !reason.is_empty(),
            "row {id} failed without a reason: {state}"
        );
    }
    if !failed.is_empty() {
        let out = std::process::Command::new(support::system::queue_tool())
            .arg("-c")
            .arg(&sys.config)
            .args(["retry", "--all-failed"])
            .env("PEPSI_HOME", &sys.home)
            .env("DATABASE_URL", &sys.db.url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    sys.wait_empty(WAIT).await;
    let got = seqs(&sys, "alice");
    let mut distinct = got.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct,
        (0..N).collect::<Vec<_>>(),
        "every message delivered"
    );
    // a duplicate is only possible for what the killed worker held: at most QUEUE_LIMIT
    assert!(
        got.len() - distinct.len() <= 4,
        "{} duplicates",
        got.len() - distinct.len()
    );
}

#[tokio::test]
async fn a_deferred_message_sends_one_delay_dsn_then_a_failure_dsn_when_it_expires() {
    // later.test is ours but delivered over LMTP to a server that is down, so every
    // attempt is a transient failure
    let dead = support::free_port();
    let mut sys = System::new(
        &format!(
            "[pepsi]\nLOCAL_DOMAINS = example.test later.test\n\n\
             [pepsi-ingress]\nCHECK_RECIPIENTS = no\n\n\
             [stage-route]\nROUTES = later.test:lmtp\n\n\
             [stage-lmtp]\nPROGRAM = pepsi-stage-relay-to-lmtp\nLMTP = 127.0.0.1:{dead}\n\
             BOUNCE_STAGE = bounce\nCONNECT_TIMEOUT = 2s\nRETRY_INITIAL = 1s\nRETRY_FACTOR = 1\n\
             DELAY_WARNING = 2s\nMAX_LIFETIME = 6s\n"
        ),
        &["alice", "bob"],
    )
    .await;
    sys.start().await;
    let msg = b"From: bob@example.test\r\nSubject: will be late\r\n\r\nslow mail\r\n";
    let r = sys
        .send("bob@example.test", &["carol@later.test"], msg)
        .await;
    assert!(r.starts_with("250"), "{r}");

    // first the delay notice, while the message is still being retried
    let first = sys.wait_messages("bob", 1, WAIT).await;
    let text = dsn_text(&first[0]);
    assert!(text.contains("Action: delayed"), "{text}");
    assert!(
        text.contains("Final-Recipient: rfc822; carol@later.test"),
        "{text}"
    );
    assert!(text.contains("Will-Retry-Until:"), "{text}");
    let queued = sys.queue().await;
    assert!(
        queued
            .iter()
            .any(|(_, stage, status, _, state)| stage == "lmtp"
                // paused between attempts, or in the middle of one (RETRY_INITIAL is 1s)
                && (status == "paused" || status == "running")
                && state["delay_sent"] == true),
        "the message is still retried after its delay notice: {queued:#?}"
    );

    // then, past MAX_LIFETIME, the failure notice; no second delay notice
    let both = sys.wait_messages("bob", 2, WAIT).await;
    sys.wait_empty(WAIT).await;
    let all = sys.messages("bob");
    assert_eq!(
        all.len(),
        2,
        "one delay and one failure notice: {}",
        all.len()
    );
    let failure = both
        .iter()
        .map(|m| dsn_text(m))
        .find(|t| t.contains("Action: failed"))
        .expect("a failure notice");
    assert!(failure.contains("Status: 5.4.7"), "{failure}");
    assert!(
        failure.contains("Final-Recipient: rfc822; carol@later.test"),
        "{failure}"
    );
    assert!(failure.contains("delivery time expired"), "{failure}");
}

#[tokio::test]
async fn an_lmtp_server_rejecting_one_of_two_recipients_gets_one_delivered_and_one_dsn() {
    let lmtp = support::lmtp::TestLmtp::tcp(
        &[(
            "dave@lmtp.test",
            "550 5.1.1 <dave@lmtp.test> no such user here",
        )],
        &[],
    )
    .await;
    let mut sys = System::new(
        &format!(
            "[pepsi]\nLOCAL_DOMAINS = example.test lmtp.test\n\n\
             [pepsi-ingress]\nCHECK_RECIPIENTS = no\n\n\
             [stage-route]\nROUTES = lmtp.test:lmtp\n\n\
             [stage-lmtp]\nPROGRAM = pepsi-stage-relay-to-lmtp\nLMTP = {}\nBOUNCE_STAGE = bounce\n",
            lmtp.target
        ),
        &["alice", "bob"],
    )
    .await;
    sys.start().await;
    let msg = b"From: bob@example.test\r\nSubject: two at the LMTP server\r\n\r\nhello\r\n";
    let r = sys
        .send(
            "bob@example.test",
            &["carol@lmtp.test", "dave@lmtp.test"],
            msg,
        )
        .await;
    assert!(r.starts_with("250"), "{r}");
    let dsn = sys.wait_messages("bob", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    let delivered = lmtp.messages();
    assert_eq!(delivered.len(), 1, "one LMTP transaction");
    assert_eq!(delivered[0].rcpt, vec!["carol@lmtp.test"]);
    assert!(delivered[0].data.ends_with(b"\r\n\r\nhello\r\n"));
    let text = dsn_text(&dsn[0]);
    assert!(
        text.contains("Final-Recipient: rfc822; dave@lmtp.test"),
        "{text}"
    );
    assert!(
        !text.contains("Final-Recipient: rfc822; carol@lmtp.test"),
        "{text}"
    );
    assert!(text.contains("Action: failed"), "{text}");
    assert!(text.contains("Status: 5.1.1"), "{text}");
    assert!(
        text.contains("Diagnostic-Code: smtp; 550") && text.contains("no such user here"),
        "the server's reply is quoted: {text}"
    );
    assert_eq!(sys.messages("bob").len(), 1);
}

/// An automatic reply set with `pepsi-settings` goes to the sender of mail addressed to the
/// owner, once per sender per period, with RFC 3834's fields; mail a reply must never answer
/// (bulk, the owner only in Bcc, the reply itself coming back) gets none.
#[tokio::test]
async fn a_vacation_reply_answers_each_sender_once_and_never_bulk_mail() {
    let mut sys = System::new("", &["alice", "bob", "carol"]).await;
    let settings =
        pepsi_testkit::programs::program("pepsi-settings", env!("CARGO_BIN_EXE_pepsi-settings"));
    let set = sys
        .command(&settings)
        .args([
            "set",
            "alice@example.test",
            "vacation",
            r#"{"text": "I am away until Monday.\nUrgent: bob.", "subject": "Out of office"}"#,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    // A setting the stage could not read is refused where it enters.
    let bad = sys
        .command(&settings)
        .args([
            "set",
            "alice@example.test",
            "vacation",
            r#"{"subject": "no text"}"#,
        ])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("missing field `text`"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    sys.start().await;

    let mail = |from: &str, to: &str, id: &str, extra: &str| {
        format!(
            "From: {from}\r\nTo: {to}\r\nSubject: lunch?\r\nMessage-ID: <{id}@example.test>\r\n\
             {extra}\r\nAre you free?\r\n"
        )
        .into_bytes()
    };
    let rcpt = ["alice@example.test"];
    // bob twice (one reply), carol in bulk and with alice in Bcc only (no reply), then as a
    // person (a reply).
    for (from, to, id, extra) in [
        ("bob@example.test", "alice@example.test", "v1", ""),
        ("bob@example.test", "Alice <alice@example.test>", "v2", ""),
        (
            "carol@example.test",
            "alice@example.test",
            "v3",
            "Precedence: bulk\r\n",
        ),
        ("carol@example.test", "team@example.test", "v4", ""),
        ("carol@example.test", "alice@example.test", "v5", ""),
    ] {
        let reply = sys.send(from, &rcpt, &mail(from, to, id, extra)).await;
        assert!(reply.starts_with("250"), "{id}: {reply}");
    }
    sys.wait_messages("alice", 5, WAIT).await;
    let to_bob = sys.wait_messages("bob", 1, WAIT).await;
    let to_carol = sys.wait_messages("carol", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(sys.messages("bob").len(), 1, "bob is answered once");
    assert_eq!(sys.messages("carol").len(), 1, "carol only for v5");
    let text = String::from_utf8_lossy(&to_bob[0]).into_owned();
    for wanted in [
        "Return-Path: <>\r\n",
        "From: <alice@example.test>\r\n",
        "To: <bob@example.test>\r\n",
        "Subject: Out of office\r\n",
        "In-Reply-To: <v1@example.test>\r\n",
        "References: <v1@example.test>\r\n",
        "Auto-Submitted: auto-replied\r\n",
        "I am away until Monday.",
    ] {
        assert!(text.contains(wanted), "{wanted:?} in\n{text}");
    }
    let carol = String::from_utf8_lossy(&to_carol[0]).into_owned();
    assert!(carol.contains("In-Reply-To: <v5@example.test>"), "{carol}");
    // The durable record: one row per sender answered.
    let sent: Vec<(String, String)> =
        sqlx::query_as("SELECT owner, sender FROM pepsi.autoreply_sent ORDER BY sender")
            .fetch_all(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(
        sent,
        [
            (
                "alice@example.test".to_owned(),
                "bob@example.test".to_owned()
            ),
            (
                "alice@example.test".to_owned(),
                "carol@example.test".to_owned()
            )
        ]
    );
}

/// The reply to `RCPT TO:<rcpt>` in a fresh session from bob.
async fn rcpt_reply(port: u16, rcpt: &str) -> String {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (r, mut w) = stream.into_split();
    let mut r = tokio::io::BufReader::new(r);
    let mut last = String::new();
    for line in [
        "",
        "EHLO client.example.test",
        "MAIL FROM:<bob@example.test>",
        &format!("RCPT TO:<{rcpt}>"),
    ] {
        if !line.is_empty() {
            w.write_all(format!("{line}\r\n").as_bytes()).await.unwrap();
        }
        loop {
            last.clear();
            assert!(
                r.read_line(&mut last).await.unwrap() > 0,
                "connection closed"
            );
            if last.as_bytes().get(3) != Some(&b'-') {
                break;
            }
        }
    }
    w.write_all(b"QUIT\r\n").await.unwrap();
    last.trim_end().to_owned()
}

/// Quotas through the whole system: limits set with the real pepsi-quota; a message that
/// does not fit is deferred (4.2.2) and, past QUOTA_GRACE, returned to its sender (5.2.2);
/// once the mailbox is full by its record, RCPT is refused with 452 4.2.2; a recount from
/// disk after mail was removed opens it again; a domain limit counts all its mailboxes.
#[tokio::test]
async fn a_mailbox_over_quota_defers_then_bounces_and_a_full_one_is_refused_at_rcpt() {
    let mut sys = System::new(
        "[stage-local]\nQUOTA_GRACE = 3s\nRETRY_INITIAL = 1s\nRETRY_MAX_INTERVAL = 1s\n\
         QUOTA_LOOKUP_TTL = 0\n\n[pepsi-ingress]\nQUOTA_CACHE_TTL = 0\n",
        &["alice", "bob"],
    )
    .await;
    let tool = pepsi_testkit::programs::program("pepsi-quota", env!("CARGO_BIN_EXE_pepsi-quota"));
    let quota_in = |sys: &System, args: &[&str]| {
        let out = sys
            .command(&tool)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let quota = |args: &[&str]| quota_in(&sys, args);
    let (code, out, err) = quota(&[
        "set",
        "Alice@example.test",
        "--storage",
        "10k",
        "--messages",
        "2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("alice@example.test: 10.0 KiB (10240 bytes), 2 messages"),
        "{out}"
    );
    for (args, want) in [
        (
            &["set", "alice", "--storage", "1G"][..],
            "is neither an address",
        ),
        (
            &["set", "alice@example.test", "--storage", "big"][..],
            "--storage \"big\"",
        ),
        (
            &["set", "alice@example.test"][..],
            "give --storage, --messages or both",
        ),
    ] {
        let (code, _, err) = quota(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    sys.start().await;
    let quota = |args: &[&str]| quota_in(&sys, args);
    let mail = |subject: &str, size: usize| {
        format!(
            "From: bob@example.test\r\nTo: alice@example.test\r\nSubject: {subject}\r\n\r\n{}",
            format!("{}\r\n", "q".repeat(99)).repeat(size.div_ceil(100))
        )
    };
    let reply = sys
        .send(
            "bob@example.test",
            &["alice@example.test"],
            mail("first", 3000).as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 1, WAIT).await;

    // 3 KB held of 10 KiB: the RCPT is taken, the 8 KB message does not fit.
    let reply = sys
        .send(
            "bob@example.test",
            &["alice@example.test"],
            mail("too big", 8000).as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let until = std::time::Instant::now() + WAIT;
    loop {
        let q = sys.queue().await;
        if q.iter().any(|(_, stage, status, _, state)| {
            stage == "local"
                && status == "paused"
                && state["last_error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("4.2.2 mailbox full"))
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "no deferral: {q:#?}\n{}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past the grace period the next attempt returns it to bob.
    let dsn = sys.wait_messages("bob", 1, WAIT).await;
    let text = dsn_text(&dsn[0]);
    assert!(
        text.contains("5.2.2") && text.contains("mailbox full"),
        "{text}"
    );
    assert!(
        text.contains("Subject: too big"),
        "the DSN returns the message: {text}"
    );
    assert_eq!(sys.messages("alice").len(), 1);

    // A small one fits: two messages now, which the count allows and no more.
    let reply = sys
        .send(
            "bob@example.test",
            &["alice@example.test"],
            mail("small", 100).as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", 2, WAIT).await;
    sys.wait_empty(WAIT).await;
    let refused = rcpt_reply(sys.port, "alice@example.test").await;
    assert!(refused.starts_with("452 4.2.2"), "{refused}");
    assert!(refused.contains("is full"), "{refused}");
    assert!(
        rcpt_reply(sys.port, "alice+tag@example.test")
            .await
            .starts_with("452 4.2.2"),
        "an extension is the same mailbox"
    );
    assert!(
        rcpt_reply(sys.port, "bob@example.test")
            .await
            .starts_with("250"),
        "bob has no limit"
    );

    let (code, out, err) = quota(&["show", "alice@example.test"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("in 2 messages"), "{out}");
    let (_, json, _) = quota(&["show", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(shown[0]["scope"], "alice@example.test", "{json}");
    assert_eq!(shown[0]["recorded"]["usage"]["messages"], 2, "{json}");
    assert_eq!(shown[0]["limits"]["bytes"], 10240, "{json}");

    // Mail removed from disk (not through an IMAP server): a recount opens the mailbox.
    let first = std::fs::read_dir(sys.maildir("alice").join("new"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(first).unwrap();
    let (code, out, err) = quota(&["recalc", "alice@example.test"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("alice@example.test: ") && out.contains(" in 1 messages"),
        "{out}"
    );
    assert!(
        rcpt_reply(sys.port, "alice@example.test")
            .await
            .starts_with("250")
    );

    // A domain limit of 3 messages: alice's 1, and bob's DSN plus one more message (bob has
    // no limits of his own, so his mailbox is counted under the domain's) fill it for both.
    let (code, _, err) = quota(&["set", "@example.test", "--messages", "3"]);
    assert_eq!(code, Some(0), "{err}");
    let reply = sys
        .send(
            "alice@example.test",
            &["bob@example.test"],
            mail("to bob", 10).as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("bob", 2, WAIT).await;
    sys.wait_empty(WAIT).await;
    for rcpt in ["alice@example.test", "bob@example.test"] {
        let refused = rcpt_reply(sys.port, rcpt).await;
        assert!(refused.starts_with("452 4.2.2"), "{rcpt}: {refused}");
    }
    let (code, out, _) = quota(&["show", "@example.test"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("in 3 messages"), "{out}");
    let (code, _, err) = quota(&["unset", "@example.test"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        rcpt_reply(sys.port, "bob@example.test")
            .await
            .starts_with("250")
    );
    let (code, _, err) = quota(&["unset", "@example.test"]);
    assert_eq!(code, Some(1), "nothing to remove: {err}");
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.event_log WHERE action IN ('quota.set', 'quota.unset')",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(events, 3, "each change audited");
}

/// The default graph's whitelist stage (between aliases and route) followed by an `if` on
/// its verdict: mail from a sender alice's list trusts (its domain) lands in her inbox; a
/// stranger's goes to her Junk folder; nothing is lost or left queued.
#[tokio::test]
async fn a_trusted_sender_reaches_the_inbox_and_a_stranger_the_junk_folder() {
    let extra = "[stage-whitelist]\nNEXT_STAGE = trusted\n\n\
                 [stage-trusted]\nPROGRAM = pepsi-stage-if\nCONDITION = state.whitelist.all\nTHEN = route\nELSE = junk\n\n\
                 [stage-junk]\nPROGRAM = pepsi-stage-relay-to-maildir\nBOUNCE_STAGE = bounce\n\
                 MAILDIR_ROOT = $MAIL_ROOT\nMAILDIR = %u/Maildir/.Junk\nCREATE_MAILDIR = no\n\
                 ALLOW_ROOT_OWNER = yes\nNONLOCAL_STAGE = remote\n";
    let mut sys = System::new(extra, &["alice"]).await;
    support::system::make_maildir(&sys.maildir("alice").join(".Junk"));
    sqlx::query(
        "INSERT INTO pepsi.whitelist (mailbox, sender, origin) \
         VALUES ('alice@example.test', '@friends.test', 'owner')",
    )
    .execute(&sys.db.pool)
    .await
    .unwrap();
    sys.start().await;
    for (from, subject) in [
        ("bob@friends.test", "trusted"),
        ("eve@strangers.test", "stranger"),
    ] {
        let message = format!(
            "From: {from}\r\nTo: alice@example.test\r\nSubject: {subject}\r\n\r\nhello\r\n"
        );
        let reply = sys
            .send(from, &["alice@example.test"], message.as_bytes())
            .await;
        assert!(reply.starts_with("250"), "{reply}");
    }
    let inbox = sys.wait_messages("alice", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(inbox.len(), 1);
    assert!(String::from_utf8_lossy(&inbox[0]).contains("Subject: trusted"));
    let junk: Vec<Vec<u8>> = std::fs::read_dir(sys.maildir("alice").join(".Junk/new"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(junk.len(), 1);
    assert!(String::from_utf8_lossy(&junk[0]).contains("Subject: stranger"));
}

/// The language block through the whole system: mail in Russian to alice (who refuses it),
/// dave (who files it as junk) and erin (no block). A sender alice's whitelist trusts
/// passes; a stranger's copy to alice is returned with a 5.7.1 DSN, dave's lands in his Junk
/// folder and erin's in her inbox; German mail passes; nothing is left queued.
#[tokio::test]
async fn a_whitelisted_sender_passes_a_language_block_that_refuses_a_stranger() {
    use crate::stage_language::{GERMAN, RUSSIAN};
    let extra = "[stage-route]\nROUTE_LOCAL = language\n\n\
                 [stage-language]\nPROGRAM = pepsi-stage-detect-language\nNEXT_STAGE = block\n\
                 LANGUAGES = de, en, fr, ru\n\n\
                 [stage-block]\nPROGRAM = pepsi-stage-block-language\nNEXT_STAGE = vacation\n\
                 BOUNCE_STAGE = bounce\nJUNK_STAGE = junk\n\n\
                 [stage-junk]\nPROGRAM = pepsi-stage-relay-to-maildir\nBOUNCE_STAGE = bounce\n\
                 MAILDIR_ROOT = $MAIL_ROOT\nMAILDIR = %u/Maildir/.Junk\nCREATE_MAILDIR = no\n\
                 ALLOW_ROOT_OWNER = yes\nNONLOCAL_STAGE = remote\n";
    let mut sys = System::new(extra, &["alice", "bob", "carol", "dave", "erin"]).await;
    support::system::make_maildir(&sys.maildir("dave").join(".Junk"));
    let settings =
        pepsi_testkit::programs::program("pepsi-settings", env!("CARGO_BIN_EXE_pepsi-settings"));
    let set = |address: &str, value: &str| {
        sys.command(&settings)
            .args(["set", address, "block_languages", value])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    };
    for (address, value) in [
        ("alice@example.test", r#"{"languages": ["ru"]}"#),
        (
            "dave@example.test",
            r#"{"languages": ["RU", "zh"], "action": "junk"}"#,
        ),
    ] {
        let out = set(address, value);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A value the stage could not use is refused where it enters.
    let bad = set("erin@example.test", r#"{"languages": ["russian"]}"#);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not an ISO 639-1 code"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    sqlx::query(
        "INSERT INTO pepsi.whitelist (mailbox, sender, origin) \
         VALUES ('alice@example.test', 'bob@example.test', 'owner')",
    )
    .execute(&sys.db.pool)
    .await
    .unwrap();
    sys.start().await;

    let mail = |from: &str, subject: &str, text: &str| {
        format!(
            "From: {from}\r\nTo: alice@example.test\r\nSubject: {subject}\r\n\
             MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}\r\n"
        )
        .into_bytes()
    };
    let everyone = [
        "alice@example.test",
        "dave@example.test",
        "erin@example.test",
    ];
    for (from, rcpts, subject, text) in [
        ("bob@example.test", &everyone[..1], "trusted", RUSSIAN),
        ("carol@example.test", &everyone[..], "stranger", RUSSIAN),
        ("carol@example.test", &everyone[..1], "german", GERMAN),
    ] {
        let reply = sys.send(from, rcpts, &mail(from, subject, text)).await;
        assert!(reply.starts_with("250"), "{subject}: {reply}");
    }
    sys.wait_messages("alice", 2, WAIT).await;
    sys.wait_messages("erin", 1, WAIT).await;
    sys.wait_messages("carol", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    // Read once nothing is queued, so a copy delivered late would be counted.
    let (alice, erin, carol) = (
        sys.messages("alice"),
        sys.messages("erin"),
        sys.messages("carol"),
    );
    let subjects = |msgs: &[Vec<u8>]| {
        let mut s: Vec<String> = msgs
            .iter()
            .map(|m| {
                let text = String::from_utf8_lossy(m);
                text.lines()
                    .find_map(|l| l.strip_prefix("Subject: ").map(str::to_owned))
                    .unwrap_or_default()
            })
            .collect();
        s.sort();
        s
    };
    assert_eq!(subjects(&alice), ["german", "trusted"], "{}", sys.logs());
    assert_eq!(subjects(&erin), ["stranger"]);
    assert!(sys.messages("dave").is_empty(), "dave's copy is junk");
    let junk: Vec<Vec<u8>> = std::fs::read_dir(sys.maildir("dave").join(".Junk/new"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(subjects(&junk), ["stranger"]);
    // The DSN to the stranger names alice alone, with 5.7.1.
    assert_eq!(carol.len(), 1);
    let dsn = String::from_utf8_lossy(&carol[0]);
    assert!(
        dsn.contains("Final-Recipient: rfc822; alice@example.test")
            && dsn.contains("Status: 5.7.1")
            && !dsn.contains("Final-Recipient: rfc822; dave@")
            && !dsn.contains("Final-Recipient: rfc822; erin@"),
        "{dsn}"
    );
}
