//! The acceptance of auto-pay between two whole systems on loopback. Instance A (a.test) has
//! a user who is a useradd account, consents to pay postage (`auto_pay`: KUDOS:1 a payment
//! and a month) and has pepsi-stage-auto-pay on the local branch, its helper the real
//! pepsi-helper-auto-pay (run as root, as its bit makes it) paying with the test wallet;
//! instance B (example.test) has bob's and carol's secretaries offering postage (KUDOS:0.5
//! and KUDOS:5) at the loopback merchant stand-in (support::taler). Each relays to the
//! other's MX through one dnsmasq, whose SPF record for a.test lets B's ingress see the
//! user's domain vouch for their mail. The user's submitted message to bob is held at B and
//! draws one challenge; A pays it as the user (the wallet's uid is the account's), records
//! it and files the challenge away; B sees the order paid and delivers the message, bob's
//! whitelist now holding the user as `paid`. A message to carol draws a challenge above the
//! user's limit: not paid, recorded as refused, the user told in a notice and given the
//! challenge itself, and the message stays held at B.

use std::future::Future;
use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::ingress::Dns;
use crate::support::system::{System, send_smtp_auth, split};
use crate::support::taler::{Account, Merchant, TOKEN, wallet_program};

const WAIT: Duration = Duration::from_secs(90);
const HELPER: &str = env!("CARGO_BIN_EXE_pepsi-helper-auto-pay");
const A_DOMAIN: &str = "a.test";
const BOB: &str = "bob@example.test";
const CAROL: &str = "carol@example.test";

/// Polls `probe` until it gives a value; fails after WAIT naming `what`, with both
/// systems' queues and logs.
async fn until<T, F, Fut>(what: &str, a: &System, b: &System, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not after {WAIT:?}\n=== A queue: {:#?}\n{}\n=== B queue: {:#?}\n{}",
            a.queue().await,
            a.logs(),
            b.queue().await,
            b.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `pepsi-settings set ADDRESS NAME VALUE` on `sys`'s configuration.
fn set(sys: &System, address: &str, name: &str, value: &str) {
    let settings =
        pepsi_testkit::programs::program("pepsi-settings", env!("CARGO_BIN_EXE_pepsi-settings"));
    let out = sys
        .command(&settings)
        .args(["set", address, name, value])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pepsi-settings set {address} {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The message the user submits to `to`, its text holding `marker`.
fn message(login: &str, to: &str, id: &str, marker: &str) -> String {
    format!(
        "From: {login}\r\nTo: {to}\r\nSubject: Note {id}\r\n\
         Message-ID: <{id}@{A_DOMAIN}>\r\n\r\nThe text of {id}: {marker}.\r\n"
    )
}

/// B's secretary's view of `mailbox`'s held mail, in one snapshot with the queue:
/// (held status, reason, decided_by, queue stage and status when the row is still queued,
/// the ingress's SPF verdict on it).
type HeldRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

async fn held(b: &System, mailbox: &str) -> Vec<HeldRow> {
    sqlx::query_as(
        // A held row wakes every POSTAGE_POLL to ask about its order: caught paused, pending
        // or running at the secretary, it is waiting there all the same.
        "SELECT h.status, h.reason, h.decided_by, q.stage, \
                CASE WHEN q.status::text IN ('paused', 'pending', 'running') THEN 'waiting' \
                     ELSE q.status::text END, \
                q.state #>> '{auth,spf,result}' \
           FROM pepsi.secretary_held h \
           LEFT JOIN pepsi.workqueue q ON q.workqueue_id = h.queue_id \
          WHERE h.mailbox = $1 ORDER BY h.held_id",
    )
    .bind(mailbox)
    .fetch_all(&b.db.pool)
    .await
    .unwrap()
}

/// B's challenges to `sender`: (mailbox, order_id, pay_uri, amount, confirmed_by).
type ChallengeRow = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

async fn challenges(b: &System, sender: &str) -> Vec<ChallengeRow> {
    sqlx::query_as(
        "SELECT mailbox, order_id, pay_uri, amount, confirmed_by \
           FROM pepsi.secretary_challenge WHERE sender = $1 ORDER BY challenge_id",
    )
    .bind(sender)
    .fetch_all(&b.db.pool)
    .await
    .unwrap()
}

/// A's payments: (login, payee, order, amount, status, reason).
type Payment = (String, String, String, String, String, Option<String>);

async fn payments(a: &System) -> Vec<Payment> {
    sqlx::query_as(
        "SELECT login, payee, order_id, currency || ':' || trim_scale(value)::text, status, \
                reason \
           FROM pepsi.auto_pay_payment ORDER BY payment_id",
    )
    .fetch_all(&a.db.pool)
    .await
    .unwrap()
}

/// `mailbox`'s whitelist on `sys`: (sender, origin).
async fn whitelist(sys: &System, mailbox: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT sender, origin FROM pepsi.whitelist WHERE mailbox = $1 ORDER BY 1")
        .bind(mailbox)
        .fetch_all(&sys.db.pool)
        .await
        .unwrap()
}

fn texts(sys: &System, user: &str) -> Vec<String> {
    sys.messages(user)
        .iter()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn postage_is_paid_between_two_systems_within_the_limits_and_refused_above_them() {
    let user = Account::create("w");
    assert_ne!(user.uid, 0);
    let login = format!("{}@{A_DOMAIN}", user.name);
    let tools = tempfile::tempdir().unwrap();
    let merchant = Merchant::start(tools.path());
    // Both domains' MX is this host; a.test's SPF names it, so B sees the user's domain
    // vouch for the mail A relays, and so does mail.example.test's for B's challenges at A.
    let dns = Dns::start(&[
        format!("--mx-host={A_DOMAIN},mx.{A_DOMAIN},10"),
        format!("--host-record=mx.{A_DOMAIN},127.0.0.1"),
        "--mx-host=example.test,mx.example.test,10".into(),
        "--host-record=mx.example.test,127.0.0.1".into(),
        format!("--txt-record={A_DOMAIN},v=spf1 ip4:127.0.0.1 -all"),
        // B's challenges go out with a null sender from mail.example.test: the SPF record of
        // that HELO name vouches for example.test at A, which pays nothing unvouched.
        "--txt-record=mail.example.test,v=spf1 ip4:127.0.0.1 -all".into(),
    ]);
    let relay = |port: Option<u16>| {
        format!(
            "[stage-relay]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n{}\
             TLS = none\nIPV6 = no\nALLOW_INTERNAL_ADDRESSES = yes\n",
            port.map(|p| format!("SMTP_PORT = {p}\n"))
                .unwrap_or_default(),
            dns = dns.port
        )
    };

    // B: the shipped example.test with the secretary after the lists, as docs/secretary.md
    // says, offering postage at the merchant stand-in; its relay port is A's, known below.
    let b_extra = format!(
        "[pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
         [listener-mx]\nVERIFY = yes\n\n\
         [stage-lists]\nNEXT_STAGE = secretary\n\n\
         [stage-secretary]\nPROGRAM = pepsi-stage-secretary\nNEXT_STAGE = vacation\n\
         CHALLENGE_STAGE = init\nTALER_MERCHANT_URL = http://127.0.0.1:{merchant}/\n\
         POSTAGE_POLL = 1s\n\n{relay}",
        dns = dns.port,
        merchant = merchant.port,
        relay = relay(None),
    );
    let mut b = System::new(&b_extra, &["bob", "carol"]).await;
    let token = b.dir.path().join("secrets.d/30-taler.conf");
    std::fs::write(
        &token,
        format!("[stage-secretary]\nTALER_MERCHANT_TOKEN = {TOKEN}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    set(&b, BOB, "secretary", r#"{"postage": "KUDOS:0.5"}"#);
    set(&b, CAROL, "secretary", r#"{"postage": "KUDOS:5"}"#);

    // A: a.test, authenticated submission, and auto-pay after the lists as docs/auto-pay.md
    // says; the helper is handed A's configuration by a wrapper (the installed one reads
    // /etc/pepsi/pepsi.conf through its bit).
    let wrapper = tools.path().join("helper");
    let sub_port = support::free_port();
    let a_extra = format!(
        "[pepsi]\nHOSTNAME = mail.{A_DOMAIN}\nLOCAL_DOMAINS = {A_DOMAIN}\n\n\
         [pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
         [listener-mx]\nVERIFY = yes\n\n\
         [listener-sub]\nROLE = submission\nADDRESS = 127.0.0.1:{sub_port}\n\
         ALLOW_PLAINTEXT_AUTH = yes\n\n\
         [stage-init]\nSRS_DOMAIN = {A_DOMAIN}\n\n\
         [stage-remote]\nSRS_DOMAIN = {A_DOMAIN}\n\n\
         [stage-lists]\nNEXT_STAGE = autopay\n\n\
         [stage-autopay]\nPROGRAM = pepsi-stage-auto-pay\nNEXT_STAGE = vacation\n\
         HELPER = {wrapper}\nHELPER_TIMEOUT = 30s\n\n\
         [pepsi-helper-auto-pay]\nWALLET = /usr/bin/python3 {wallet}\nTIMEOUT = 20s\n\n\
         {relay}",
        dns = dns.port,
        wrapper = wrapper.display(),
        wallet = wallet_program().display(),
        relay = relay(Some(b.port)),
    );
    let mut a = System::new(&a_extra, &[user.name.as_str()]).await;
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {HELPER} -c {} \"$@\"\n",
            a.config.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    sqlx::query("INSERT INTO pepsi.mailbox_account (address) VALUES ($1)")
        .bind(&login)
        .execute(&a.db.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2)")
        .bind(&login)
        .bind(pepsi_ingress::accounts::hash_password(b"pw").unwrap())
        .execute(&a.db.pool)
        .await
        .unwrap();
    set(
        &a,
        &login,
        "auto_pay",
        r#"{"per_payment": "KUDOS:1", "per_month": "KUDOS:1"}"#,
    );
    // B relays to A's MX listener.
    let mut b_config = std::fs::OpenOptions::new()
        .append(true)
        .open(&b.config)
        .unwrap();
    std::io::Write::write_all(
        &mut b_config,
        format!("\n[stage-relay]\nSMTP_PORT = {}\n", a.port).as_bytes(),
    )
    .unwrap();
    drop(b_config);
    b.start().await;
    a.start().await;

    // 1. The user writes to bob: A learns bob, relays to B, where the mail waits and one
    // challenge offering KUDOS:0.5 goes back to the user.
    let first = "quince-first-4711";
    let reply = send_smtp_auth(
        sub_port,
        (&login, "pw"),
        &login,
        &[BOB],
        message(&login, BOB, "first", first).as_bytes(),
    )
    .await;
    assert!(reply.starts_with("250"), "{reply}");
    let waiting = until("bob's mail held at B", &a, &b, || async {
        held(&b, BOB).await.into_iter().next()
    })
    .await;
    assert_eq!(
        waiting,
        (
            "held".to_owned(),
            "challenged".to_owned(),
            None,
            Some("secretary".to_owned()),
            Some("waiting".to_owned()),
            Some("pass".to_owned()),
        ),
        "held, paused at the secretary, the user's domain having passed SPF"
    );
    assert_eq!(
        whitelist(&a, &login).await,
        [(BOB.to_owned(), "sent".to_owned())],
        "A learnt bob from the user's authenticated mail"
    );

    // 2. A pays it as the user and files the challenge away.
    let paid = until("A's payment of bob's postage", &a, &b, || async {
        let p = payments(&a).await;
        (!p.is_empty()).then_some(p)
    })
    .await;
    let asked = challenges(&b, &login).await;
    assert_eq!(asked.len(), 1, "one challenge: {asked:#?}");
    let (mailbox, order, uri, amount, _) = asked[0].clone();
    let (order, uri) = (order.expect("an order"), uri.expect("a pay URI"));
    assert_eq!(
        (mailbox.as_str(), amount.as_deref()),
        (BOB, Some("KUDOS:0.5"))
    );
    assert!(
        uri.starts_with(&format!("taler://pay/127.0.0.1:{}/", merchant.port)),
        "{uri}"
    );
    assert_eq!(
        paid,
        [(
            login.clone(),
            BOB.to_owned(),
            order.clone(),
            "KUDOS:0.5".to_owned(),
            "paid".to_owned(),
            None
        )]
    );
    assert_eq!(
        user.wallet_log(),
        [(user.uid, uri.clone())],
        "the wallet ran once, as the user"
    );
    assert!(merchant.paid(&order), "order {order} not paid");

    // 3. B sees the order paid: the mail reaches bob, who now trusts the user.
    b.mail_with("bob", first).await;
    let released = until("bob's held mail released", &a, &b, || async {
        let h = held(&b, BOB).await;
        (h.len() == 1 && h[0].0 != "held").then_some(h)
    })
    .await;
    assert_eq!(
        (released[0].0.as_str(), released[0].2.as_deref()),
        ("released", Some("postage"))
    );
    assert_eq!(
        challenges(&b, &login).await[0].4.as_deref(),
        Some("postage")
    );
    assert_eq!(
        whitelist(&b, BOB).await,
        [(login.clone(), "paid".to_owned())]
    );
    a.wait_empty(WAIT).await;
    assert!(
        a.messages(&user.name).is_empty(),
        "the paid challenge is filed away, not delivered: {:#?}",
        texts(&a, &user.name)
    );

    // 4. To carol, whose secretary asks KUDOS:5, above the user's KUDOS:1 a payment.
    let second = "quince-second-4711";
    let reply = send_smtp_auth(
        sub_port,
        (&login, "pw"),
        &login,
        &[CAROL],
        message(&login, CAROL, "second", second).as_bytes(),
    )
    .await;
    assert!(reply.starts_with("250"), "{reply}");
    let notice = a.mail_with(&user.name, "Postage not paid").await;
    let challenge = a
        .mail_with(&user.name, "X-Pepsi-Postage-Amount: KUDOS:5")
        .await;
    let asked = challenges(&b, &login).await;
    assert_eq!(asked.len(), 2, "{asked:#?}");
    let (mailbox, order2, uri2, amount, confirmed) = asked[1].clone();
    let (order2, uri2) = (order2.expect("an order"), uri2.expect("a pay URI"));
    assert_eq!(
        (mailbox.as_str(), amount.as_deref(), confirmed),
        (CAROL, Some("KUDOS:5"), None)
    );
    let refused = payments(&a).await;
    assert_eq!(refused.len(), 2, "{refused:#?}");
    let (l, payee, o, amount, status, reason) = refused[1].clone();
    assert_eq!(
        (l.as_str(), payee.as_str(), o.as_str(), amount.as_str()),
        (login.as_str(), CAROL, order2.as_str(), "KUDOS:5")
    );
    assert_eq!(status, "refused");
    let reason = reason.expect("a reason");
    assert!(
        reason.contains("above your limit of KUDOS:1 a payment"),
        "{reason}"
    );
    assert_eq!(user.wallet_log().len(), 1, "the wallet did not run again");
    assert!(!merchant.paid(&order2));

    let (headers, _) = split(notice.as_bytes());
    let headers = String::from_utf8_lossy(headers);
    assert!(
        headers.contains(&format!("From: <postmaster@{A_DOMAIN}>"))
            && headers.contains(&format!("Subject: Postage not paid: {CAROL} asks KUDOS:5")),
        "{notice}"
    );
    assert!(notice.contains(&reason), "{notice}");
    let (headers, _) = split(challenge.as_bytes());
    let headers = String::from_utf8_lossy(headers);
    for want in [
        format!("X-Pepsi-Postage: {uri2}"),
        "Auto-Submitted: auto-replied".to_owned(),
        format!("In-Reply-To: <second@{A_DOMAIN}>"),
    ] {
        assert!(headers.contains(&want), "{want}:\n{challenge}");
    }
    assert!(
        headers.contains(&format!("From: {CAROL}"))
            || headers.contains(&format!("From: <{CAROL}>")),
        "{challenge}"
    );
    assert!(!challenge.contains(second), "{challenge}");
    assert_eq!(
        texts(&a, &user.name).len(),
        2,
        "the notice and the challenge, nothing else"
    );

    // The message stays held at B: carol has nothing, trusts nobody, and the first
    // message's release did not touch hers.
    assert_eq!(
        held(&b, CAROL).await,
        [(
            "held".to_owned(),
            "challenged".to_owned(),
            None,
            Some("secretary".to_owned()),
            Some("waiting".to_owned()),
            Some("pass".to_owned()),
        )]
    );
    assert!(b.messages("carol").is_empty(), "{:#?}", texts(&b, "carol"));
    assert!(whitelist(&b, CAROL).await.is_empty());
    assert_eq!(
        whitelist(&a, &login).await,
        [
            (BOB.to_owned(), "sent".to_owned()),
            (CAROL.to_owned(), "sent".to_owned())
        ]
    );
    assert_eq!(texts(&b, "bob").len(), 1, "{:#?}", texts(&b, "bob"));
}
