//! The acceptance of the confirm-to-send secretary, through the whole system and a real
//! browser: the shipped graph with the secretary after the lists (as etc/pepsi.conf's
//! commented section says), alice's `secretary` setting set with pepsi-settings, an ingress
//! that verifies SPF and DKIM against a dnsmasq the test starts, and remote.test's MX a
//! recording SMTP peer. Three messages from bob@remote.test, DKIM-signed by his domain, wait
//! and draw one challenge at his MX (null sender, `Auto-Submitted: auto-replied`, nothing of
//! their text); headless Chromium opens its link, where a GET releases nothing, answers
//! the question and is told the mail was confirmed; then all three reach alice's Maildir
//! and bob is on her whitelist as `confirmed`. A forged sender (SPF fail, no DKIM), an
//! `Auto-Submitted: auto-generated` message and a list's, both signed by an authenticated
//! domain, are held without a word and stay held after bob's confirmation.

use std::time::{Duration, Instant};

use mail_auth::common::crypto::Ed25519Key;
use mail_auth::common::headers::HeaderWriter as _;
use mail_auth::dkim::DkimSigner;
use pepsi_smtp::encoding::base64_encode;

use crate::support;
use crate::support::browser::Browser;
use crate::support::ingress::Dns;
use crate::support::system::{System, split};

const WAIT: Duration = Duration::from_secs(60);
/// `[pepsi] SECRETARY_URL`: the public origin of pepsi-httpd the challenge's link names; the
/// test opens the link's path on the loopback address pepsi-httpd listens on.
const WEB: &str = "https://mail.example.test";
const ALICE: &str = "alice@example.test";
const BOB: &str = "bob@remote.test";
const CAROL: &str = "carol@remote.test";
const FORGER: &str = "ceo@forged.test";

/// `message` with a DKIM signature of `domain` (selector `sel`) made with `key`.
fn signed(key: &[u8], domain: &str, message: &str) -> String {
    let signature = DkimSigner::from_key(Ed25519Key::from_pkcs8_der(key).unwrap())
        .domain(domain)
        .selector("sel")
        .headers(["From", "To", "Subject", "Message-ID"])
        .sign(message.as_bytes())
        .unwrap();
    format!("{}{message}", signature.to_header())
}

/// The DKIM key record of `key`.
fn dkim_record(key: &[u8]) -> String {
    let key = Ed25519Key::from_pkcs8_der(key).unwrap();
    format!("v=DKIM1; k=ed25519; p={}", base64_encode(&key.public_key()))
}

/// A message from `from` to alice, named `id` (its Message-ID's left part, its subject and
/// its text's marker), with `extra` header fields.
fn message(from: &str, id: &str, extra: &str) -> String {
    format!(
        "From: {from}\r\nTo: Alice <{ALICE}>\r\nSubject: Note {id}\r\n\
         Message-ID: <{id}@remote.test>\r\n{extra}\r\nThe text of {id}: {}.\r\n",
        marker(id)
    )
}

/// The marker in the text of message `id`, found nowhere else.
fn marker(id: &str) -> String {
    format!("quince-{id}-4711")
}

/// Sends `message` from `from` to alice over SMTP at the MX listener.
async fn send(sys: &System, from: &str, message: &str) {
    let reply = sys.send(from, &[ALICE], message.as_bytes()).await;
    assert!(reply.starts_with("250"), "{from}: {reply}");
}

/// Waits until the queue holds exactly `n` rows, all paused at the secretary stage: what
/// the system holds, with nothing else under way (no challenge, no delivery).
async fn wait_held(sys: &System, n: usize) {
    let until = Instant::now() + WAIT;
    loop {
        let q = sys.queue().await;
        if q.len() == n && q.iter().all(|r| r.1 == "secretary" && r.2 == "paused") {
            return;
        }
        assert!(
            Instant::now() < until,
            "the queue never held {n} rows paused at the secretary: {q:#?}\n{}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The held rows of alice's mailbox: (subject, reason, status, decided_by), in queue order.
async fn held(sys: &System) -> Vec<(String, String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT subject, reason, status, decided_by FROM pepsi.secretary_held \
          WHERE mailbox = $1 ORDER BY queue_id",
    )
    .bind(ALICE)
    .fetch_all(&sys.db.pool)
    .await
    .unwrap()
}

/// The ingress's verdicts on the held messages, in queue order: (DKIM, SPF of MAIL FROM),
/// DKIM `none` without a signature.
async fn verdicts(sys: &System) -> Vec<(Option<String>, Option<String>)> {
    sqlx::query_as(
        "SELECT coalesce(q.state #>> '{auth,dkim,0,result}', 'none'), \
                q.state #>> '{auth,spf,result}' \
           FROM pepsi.secretary_held h JOIN pepsi.workqueue q ON q.workqueue_id = h.queue_id \
          ORDER BY h.queue_id",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap()
}

/// Alice's whitelist: (sender, origin).
async fn whitelist(sys: &System) -> Vec<(String, String)> {
    sqlx::query_as("SELECT sender, origin FROM pepsi.whitelist WHERE mailbox = $1 ORDER BY 1")
        .bind(ALICE)
        .fetch_all(&sys.db.pool)
        .await
        .unwrap()
}

/// The subjects in alice's Maildir, sorted.
fn delivered(sys: &System) -> Vec<String> {
    let mut subjects: Vec<String> = sys
        .messages("alice")
        .iter()
        .map(|m| {
            let text = String::from_utf8_lossy(m);
            text.lines()
                .find_map(|l| l.strip_prefix("Subject: "))
                .unwrap_or_else(|| panic!("no Subject in {text}"))
                .trim()
                .to_owned()
        })
        .collect();
    subjects.sort();
    subjects
}

async fn wait_text(browser: &Browser, needle: &str) {
    let needle = serde_json::to_string(needle).unwrap();
    browser
        .until(
            &format!("{needle} with the page loaded"),
            &format!(
                "return document.readyState === 'complete' && document.body \
                 && document.body.innerText.includes({needle});"
            ),
        )
        .await;
}

/// The answer to the page's question, "How much is A plus B?".
fn sum_asked(question: &str) -> u32 {
    let numbers: Vec<u32> = question
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    assert!(
        question.starts_with("How much is") && numbers.len() == 2,
        "not the question of two numbers: {question:?}"
    );
    numbers.iter().sum()
}

#[tokio::test]
async fn a_stranger_confirms_in_chromium_and_forged_automatic_and_list_mail_draws_no_challenge() {
    let key = Ed25519Key::generate_pkcs8().unwrap();
    let (smtp_port, mut peers) =
        support::smtp_peer::start(&[("127.0.0.44", "mx.remote.test")]).await;
    let remote = peers.pop().unwrap();
    // remote.test vouches for its mail with DKIM alone (no SPF record); forged.test's SPF
    // names another address than the one every message here comes from.
    let dns = Dns::start(&[
        "--mx-host=remote.test,mx.remote.test,10".into(),
        "--host-record=mx.remote.test,127.0.0.44".into(),
        format!(
            "--txt-record=sel._domainkey.remote.test,{}",
            dkim_record(&key)
        ),
        "--txt-record=forged.test,v=spf1 ip4:192.0.2.1 -all".into(),
    ]);
    let http_port = support::free_port();
    // The secretary spliced in as etc/pepsi.conf's commented section says, the MX listener
    // verifying (its default), and remote mail relayed to the peer through the test's DNS.
    let extra = format!(
        "[pepsi]\nSECRETARY_URL = {WEB}\n\n\
         [pepsi-httpd]\nADDRESS = 127.0.0.1:{http_port}\nALLOW_ROOT = yes\n\n\
         [pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
         [listener-mx]\nVERIFY = yes\n\n\
         [stage-lists]\nNEXT_STAGE = secretary\n\n\
         [stage-secretary]\nPROGRAM = pepsi-stage-secretary\nNEXT_STAGE = vacation\n\
         CHALLENGE_STAGE = init\n\n\
         [stage-relay]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\
         SMTP_PORT = {smtp_port}\nTLS = none\nIPV6 = no\nALLOW_INTERNAL_ADDRESSES = yes\n",
        dns = dns.port,
    );
    let mut sys = System::new(&extra, &["alice"]).await;
    let settings =
        pepsi_testkit::programs::program("pepsi-settings", env!("CARGO_BIN_EXE_pepsi-settings"));
    let set = sys
        .command(&settings)
        .args(["set", ALICE, "secretary", "{}"])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    sys.start().await;
    sys.start_httpd(http_port).await;
    let site = format!("http://127.0.0.1:{http_port}");

    // 1. Three messages from bob, signed by remote.test; then a forged one (SPF fail, no
    // signature), an automatic one and a list's, the last two signed by remote.test.
    let bobs = ["bob-1", "bob-2", "bob-3"];
    for id in bobs {
        send(
            &sys,
            BOB,
            &signed(&key, "remote.test", &message(BOB, id, "")),
        )
        .await;
    }
    send(&sys, FORGER, &message(FORGER, "forged", "")).await;
    let automatic = message(CAROL, "automatic", "Auto-Submitted: auto-generated\r\n");
    send(&sys, CAROL, &signed(&key, "remote.test", &automatic)).await;
    let list = message(CAROL, "list", "List-Id: Team <team.remote.test>\r\n");
    send(&sys, CAROL, &signed(&key, "remote.test", &list)).await;

    // All six wait, and bob's domain vouched for his three alone: one challenge, to him.
    wait_held(&sys, 6).await;
    let want_held = |bob_status: &str, bob_by: Option<&str>| {
        let row = |subject: &str, reason: &str, status: &str, by: Option<&str>| {
            (
                format!("Note {subject}"),
                reason.to_owned(),
                status.to_owned(),
                by.map(str::to_owned),
            )
        };
        vec![
            row("bob-1", "challenged", bob_status, bob_by),
            row("bob-2", "challenged", bob_status, bob_by),
            row("bob-3", "challenged", bob_status, bob_by),
            row("forged", "unauthenticated", "held", None),
            row("automatic", "automated", "held", None),
            row("list", "automated", "held", None),
        ]
    };
    assert_eq!(held(&sys).await, want_held("held", None));
    assert_eq!(
        verdicts(&sys).await,
        [
            ("pass", "none"),
            ("pass", "none"),
            ("pass", "none"),
            ("none", "fail"),
            ("pass", "none"),
            ("pass", "none"),
        ]
        .map(|(dkim, spf)| (Some(dkim.to_owned()), Some(spf.to_owned()))),
        "the ingress's verdicts"
    );
    assert!(delivered(&sys).is_empty(), "{:?}", delivered(&sys));
    let got = remote.messages();
    assert_eq!(got.len(), 1, "one challenge for bob, none else: {got:#?}");
    let challenge = &got[0];
    assert_eq!(challenge.rcpt, [BOB]);
    assert_eq!(
        challenge.mail_from, "",
        "a challenge goes from the null sender"
    );
    let text = String::from_utf8_lossy(&challenge.data).into_owned();
    let (headers, body) = split(&challenge.data);
    let headers = String::from_utf8_lossy(headers);
    assert!(
        headers.contains("\r\nAuto-Submitted: auto-replied\r\n"),
        "{headers}"
    );
    assert!(headers.contains("In-Reply-To: <bob-"), "{headers}");
    for id in ["bob-1", "bob-2", "bob-3", "forged", "automatic", "list"] {
        assert!(
            !text.contains(&marker(id)),
            "{id}'s text in the challenge:\n{text}"
        );
    }
    let body = String::from_utf8_lossy(body);
    let start = body
        .find(&format!("{WEB}/secretary/"))
        .unwrap_or_else(|| panic!("no link in the challenge:\n{text}"));
    let link = &body[start..];
    let path = link[WEB.len()..link.find(char::is_whitespace).unwrap_or(link.len())].to_owned();

    // 2. The link's page asks its question; opening it released nothing.
    let browser = Browser::start().await;
    browser.go(&format!("{site}{path}")).await;
    wait_text(&browser, &format!("Confirm your mail to {ALICE}")).await;
    let question = browser
        .js("return document.querySelector('label[for=answer]').innerText;")
        .await;
    let answer = sum_asked(question.as_str().unwrap());
    let confirmed: Vec<Option<String>> =
        sqlx::query_scalar("SELECT confirmed_by FROM pepsi.secretary_challenge")
            .fetch_all(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(confirmed, [None], "a GET confirms nothing");
    assert!(whitelist(&sys).await.is_empty());
    wait_held(&sys, 6).await;
    assert_eq!(held(&sys).await, want_held("held", None));
    assert!(delivered(&sys).is_empty(), "{:?}", delivered(&sys));

    // 3. The answer, typed into the page: confirmed, and bob's three messages delivered.
    browser.type_into("#answer", &answer.to_string()).await;
    browser.click("#confirm").await;
    wait_text(
        &browser,
        &format!("Confirmed: 3 messages delivered to {ALICE}"),
    )
    .await;
    for id in bobs {
        sys.mail_with("alice", &marker(id)).await;
    }
    wait_held(&sys, 3).await;
    assert_eq!(
        delivered(&sys),
        ["Note bob-1", "Note bob-2", "Note bob-3"],
        "bob's mail and nothing else"
    );
    assert_eq!(
        whitelist(&sys).await,
        [(BOB.to_owned(), "confirmed".to_owned())]
    );
    assert_eq!(held(&sys).await, want_held("released", Some("link")));
    assert_eq!(
        remote.messages().len(),
        1,
        "nothing more went to remote.test"
    );
}
