//! The secretary's pages and admin API through the real pepsi-httpd, as its own database
//! role (`pepsi-httpd`, which may only read the secretary's tables and call
//! `secretary_confirm` and `secretary_decide`), over rows as the secretary stage leaves
//! them: a queue row paused at the `secretary` stage with `state.secretary`, its
//! `secretary_held` row, the `secretary_challenge` of a token made by `Token::new`.
//! The sender's page: a GET shows the question and confirms nothing; a wrong answer is 422
//! and changes nothing; the right one whitelists the sender (origin `confirmed`), releases
//! that sender's held mail for that mailbox and wakes its queue rows, and says so; then
//! "already confirmed"; 410 expired, 404 unknown; a cross-site form 403; wrong answers
//! limited. The owner's page: held mail and payments listed, release and discard wake the
//! row, another mailbox's message 404. The admin API: list, release, discard (409 again),
//! payments, its event_log rows, 401 without a credential.

use pepsi_secretary::token::{HumanCheck, Token};
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::httpd_lists::form_body;
use crate::support::httpd::{AsRole, Auth, Httpd};

const BOSS: &str = "boss@example.test";
const OTHER_BOX: &str = "clerk@example.test";
const FRIEND: &str = "friend@example.net";
const STRANGER: &str = "stranger@example.org";

const CONFIG: &str = "[pepsi]\nLOCAL_DOMAINS = example.test\nHOSTNAME = mx.example.test\n\
                      SECRETARY_URL = https://mail.example.test\n";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    auth: Auth,
    /// A browser that does not follow redirects, so a 303 is seen.
    client: reqwest::Client,
}

/// A page's answer: status, text, headers.
struct Page {
    status: u16,
    text: String,
    headers: reqwest::header::HeaderMap,
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.text)
    }
}

async fn fixture() -> Fixture {
    let site = AsRole::new(CONFIG).await;
    let (httpd, session) = site.start().await;
    let _ = crate::support::httpd::client();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .unwrap();
    Fixture {
        db: site.db,
        _dir: site.dir,
        httpd,
        auth: Auth::Session(session),
        client,
    }
}

/// The sum the page asks for `token`, and a wrong one.
fn answers(token: &Token) -> (String, String) {
    let c = HumanCheck::for_token(token);
    let sum = u32::from(c.a) + u32::from(c.b);
    (sum.to_string(), (sum + 1).to_string())
}

impl Fixture {
    async fn page(&self, path: &str) -> Page {
        let r = self.client.get(self.httpd.url(path)).send().await.unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        Page {
            status,
            headers,
            text: r.text().await.unwrap(),
        }
    }

    async fn post_form(&self, path: &str, pairs: &[(&str, &str)], extra: &[(&str, &str)]) -> Page {
        let mut req = self
            .client
            .post(self.httpd.url(path))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(form_body(pairs));
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        Page {
            status,
            headers,
            text: r.text().await.unwrap(),
        }
    }

    /// A challenge from `mailbox` to `sender`, expiring in `hours` (negative: expired).
    async fn challenge(&self, mailbox: &str, sender: &str, hours: i32, pay: bool) -> Token {
        let token = Token::new().unwrap();
        sqlx::query(
            "INSERT INTO pepsi.secretary_challenge \
               (mailbox, sender, token_hash, expires_at, order_id, pay_uri, amount) \
             VALUES ($1, $2, $3, now() + make_interval(hours => $4), $5, $6, $7)",
        )
        .bind(mailbox)
        .bind(sender)
        .bind(token.digest())
        .bind(hours)
        .bind(pay.then_some("order-1"))
        .bind(pay.then_some("taler://pay/backend.example.test/orders/order-1/"))
        .bind(pay.then_some("KUDOS:0.5"))
        .execute(&self.db.pool)
        .await
        .unwrap();
        token
    }

    /// A message held for `mailbox` from `sender`: its queue row, paused at the secretary
    /// stage as the stage leaves it, and its held row. (queue id, held id)
    async fn held(&self, mailbox: &str, sender: &str, subject: &str) -> (i64, i64) {
        let state = json!({"secretary": {"held": "challenged", "mailbox": mailbox}});
        let queue_id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add($1, ARRAY[$2], $3::bytea, 'Hello.\r\n'::bytea, $4)",
        )
        .bind(sender)
        .bind(mailbox)
        .bind(format!("From: {sender}\r\nSubject: {subject}\r\n").into_bytes())
        .bind(&state)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE pepsi.workqueue SET stage = 'secretary', status = 'paused', \
                    timeout = now() + interval '1 day' WHERE workqueue_id = $1",
        )
        .bind(queue_id)
        .execute(&self.db.pool)
        .await
        .unwrap();
        let held_id: i64 = sqlx::query_scalar(
            "INSERT INTO pepsi.secretary_held \
               (queue_id, mailbox, sender, mail_from, subject, size, reason, challenge_id, expires_at) \
             VALUES ($1, $2, $3, $3, $4, 100, 'challenged', \
                     (SELECT max(challenge_id) FROM pepsi.secretary_challenge \
                       WHERE mailbox = $2 AND sender = $3), \
                     now() + interval '14 days') \
             RETURNING held_id",
        )
        .bind(queue_id)
        .bind(mailbox)
        .bind(sender)
        .bind(subject)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        (queue_id, held_id)
    }

    /// The owner's link of `mailbox`, expiring in `hours`.
    async fn owner_link(&self, mailbox: &str, hours: i32) -> Token {
        let token = Token::new().unwrap();
        sqlx::query(
            "INSERT INTO pepsi.secretary_owner_link (mailbox, token_hash, expires_at) \
             VALUES ($1, $2, now() + make_interval(hours => $3))",
        )
        .bind(mailbox)
        .bind(token.digest())
        .bind(hours)
        .execute(&self.db.pool)
        .await
        .unwrap();
        token
    }

    /// A held message's status and who decided it, and its queue row's status.
    async fn standing(&self, held_id: i64) -> (String, Option<String>, String) {
        sqlx::query_as(
            "SELECT h.status, h.decided_by, q.status::text FROM pepsi.secretary_held h \
               JOIN pepsi.workqueue q ON q.workqueue_id = h.queue_id WHERE h.held_id = $1",
        )
        .bind(held_id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// The whitelist: (mailbox, sender, origin).
    async fn whitelist(&self) -> Vec<(String, String, String)> {
        sqlx::query_as("SELECT mailbox, sender, origin FROM pepsi.whitelist ORDER BY 1, 2")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn confirmed_by(&self, token: &Token) -> Option<String> {
        sqlx::query_scalar(
            "SELECT confirmed_by FROM pepsi.secretary_challenge WHERE token_hash = $1",
        )
        .bind(token.digest())
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    async fn api(&self, method: reqwest::Method, path: &str, auth: &Auth) -> (u16, Value) {
        let a = self.httpd.call(method, path, auth, None).await;
        (a.status, a.json)
    }
}

fn held(s: &str, by: Option<&str>, q: &str) -> (String, Option<String>, String) {
    (s.to_owned(), by.map(str::to_owned), q.to_owned())
}

/// The frame every page of a mailed link goes out in: no script, not cached, no Referer.
fn private_page(p: &Page) {
    let h = |name: &str| {
        p.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(h("referrer-policy"), "no-referrer", "{p:?}");
    assert_eq!(h("cache-control"), "no-store", "{p:?}");
    let csp = h("content-security-policy");
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    assert!(!p.text.contains("<script"), "{p:?}");
}

#[tokio::test]
async fn a_sender_confirms_with_the_right_answer_and_a_get_confirms_nothing() {
    let f = fixture().await;
    let t = f.challenge(BOSS, FRIEND, 24, false).await;
    let (_, a) = f.held(BOSS, FRIEND, "Lunch?").await;
    let (_, b) = f.held(BOSS, FRIEND, "Lunch, again").await;
    // Another sender to the same mailbox, the same sender to another mailbox: untouched.
    let (_, c) = f.held(BOSS, STRANGER, "Offer").await;
    let (_, d) = f.held(OTHER_BOX, FRIEND, "Hi clerk").await;
    let path = format!("/secretary/{}", t.as_str());
    let (right, wrong) = answers(&t);
    let unchanged = || async {
        for id in [a, b, c, d] {
            assert_eq!(f.standing(id).await, held("held", None, "paused"), "{id}");
        }
        assert!(f.whitelist().await.is_empty());
        assert_eq!(f.confirmed_by(&t).await, None);
    };

    // The page: to whom, how many wait, the question; twice, and nothing changes.
    for _ in 0..2 {
        let p = f.page(&path).await;
        assert_eq!(p.status, 200, "{p:?}");
        private_page(&p);
        assert!(p.text.contains(BOSS), "{p:?}");
        assert!(p.text.contains("2 messages from you wait"), "{p:?}");
        assert!(
            p.text.contains(&HumanCheck::for_token(&t).question()),
            "{p:?}"
        );
        assert!(p.text.contains("name=\"answer\""), "{p:?}");
        assert!(p.text.contains(&format!("action=\"{path}\"")), "{p:?}");
        assert!(!p.text.contains("postage"), "{p:?}");
    }
    unchanged().await;

    // A wrong answer, an empty one, and a form of another site change nothing.
    let p = f.post_form(&path, &[("answer", &wrong)], &[]).await;
    assert_eq!(p.status, 422, "{p:?}");
    assert!(p.text.contains("not the right answer"), "{p:?}");
    assert!(
        p.text.contains(&HumanCheck::for_token(&t).question()),
        "{p:?}"
    );
    let p = f.post_form(&path, &[("answer", " ")], &[]).await;
    assert_eq!(p.status, 422, "{p:?}");
    assert!(p.text.contains("Type the answer"), "{p:?}");
    for extra in [
        [("Sec-Fetch-Site", "cross-site")],
        [("Origin", "https://evil.example.net")],
    ] {
        let p = f.post_form(&path, &[("answer", &right)], &extra).await;
        assert_eq!(p.status, 403, "{extra:?}: {p:?}");
    }
    unchanged().await;

    // The right answer, from this site (the public base's origin).
    let p = f
        .post_form(
            &path,
            &[("answer", &format!(" {right} "))],
            &[("Origin", "https://mail.example.test")],
        )
        .await;
    assert_eq!(p.status, 200, "{p:?}");
    private_page(&p);
    assert!(
        p.text
            .contains(&format!("Confirmed: 2 messages delivered to {BOSS}")),
        "{p:?}"
    );
    assert_eq!(
        f.whitelist().await,
        [(BOSS.to_owned(), FRIEND.to_owned(), "confirmed".to_owned())]
    );
    for id in [a, b] {
        assert_eq!(
            f.standing(id).await,
            held("released", Some("link"), "pending")
        );
    }
    for id in [c, d] {
        assert_eq!(f.standing(id).await, held("held", None, "paused"), "{id}");
    }
    assert_eq!(f.confirmed_by(&t).await.as_deref(), Some("link"));

    // Again: already confirmed, and nothing more happens.
    let p = f.post_form(&path, &[("answer", &right)], &[]).await;
    assert_eq!(p.status, 200, "{p:?}");
    assert!(p.text.contains("Already confirmed"), "{p:?}");
    let p = f.page(&path).await;
    assert_eq!(p.status, 200, "{p:?}");
    assert!(p.text.contains("Already confirmed"), "{p:?}");
    assert!(p.text.contains("confirmed on this page"), "{p:?}");
    assert_eq!(f.whitelist().await.len(), 1);
}

#[tokio::test]
async fn expired_unknown_and_paid_challenges_have_their_own_pages() {
    let f = fixture().await;

    // Expired: 410 in plain words, and the right answer confirms nothing.
    let t = f.challenge(BOSS, FRIEND, -1, false).await;
    let (_, a) = f.held(BOSS, FRIEND, "Late").await;
    let path = format!("/secretary/{}", t.as_str());
    let p = f.page(&path).await;
    assert_eq!(p.status, 410, "{p:?}");
    private_page(&p);
    assert!(p.text.contains("This link has expired"), "{p:?}");
    let (right, _) = answers(&t);
    let p = f.post_form(&path, &[("answer", &right)], &[]).await;
    assert_eq!(p.status, 410, "{p:?}");
    assert_eq!(f.standing(a).await, held("held", None, "paused"));
    assert!(f.whitelist().await.is_empty());

    // Unknown, or not a token at all: 404, GET and POST.
    let unknown = Token::new().unwrap();
    for path in [
        format!("/secretary/{}", unknown.as_str()),
        "/secretary/short".to_owned(),
        format!("/secretary/{}x", unknown.as_str()),
    ] {
        let p = f.page(&path).await;
        assert_eq!(p.status, 404, "{path}: {p:?}");
        assert!(p.text.contains("not known here"), "{p:?}");
        let p = f.post_form(&path, &[("answer", "4")], &[]).await;
        assert_eq!(p.status, 404, "{path}: {p:?}");
    }

    // Postage offered: the amount and the taler link beside the question; every text
    // escaped.
    let evil = "<script>alert(1)</script>@example.net";
    let t = f.challenge(BOSS, evil, 24, true).await;
    let p = f.page(&format!("/secretary/{}", t.as_str())).await;
    assert_eq!(p.status, 200, "{p:?}");
    private_page(&p);
    assert!(
        p.text.contains("Or pay postage instead (KUDOS:0.5)"),
        "{p:?}"
    );
    assert!(
        p.text
            .contains("href=\"taler://pay/backend.example.test/orders/order-1/\""),
        "{p:?}"
    );
    assert!(
        p.text.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{p:?}"
    );
    assert!(
        p.text.contains("No message from you waits any longer"),
        "{p:?}"
    );
}

#[tokio::test]
async fn wrong_answers_are_limited_per_challenge() {
    let f = fixture().await;
    let t = f.challenge(BOSS, FRIEND, 24, false).await;
    let (_, a) = f.held(BOSS, FRIEND, "Guess").await;
    let path = format!("/secretary/{}", t.as_str());
    let (right, wrong) = answers(&t);
    for _ in 0..6 {
        let p = f.post_form(&path, &[("answer", &wrong)], &[]).await;
        assert_eq!(p.status, 422, "{p:?}");
    }
    // Past the limit even the right answer waits.
    let p = f.post_form(&path, &[("answer", &right)], &[]).await;
    assert_eq!(p.status, 429, "{p:?}");
    assert!(p.text.contains("Too many wrong answers"), "{p:?}");
    let wait: u64 = p.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=600).contains(&wait), "{wait}");
    assert_eq!(f.standing(a).await, held("held", None, "paused"));
    // The page itself still shows.
    assert_eq!(f.page(&path).await.status, 200);
}

#[tokio::test]
async fn the_owner_releases_and_discards_held_mail_on_the_digests_page() {
    let f = fixture().await;
    let (_, a) = f.held(BOSS, FRIEND, "Quarterly <figures>").await;
    let (_, b) = f.held(BOSS, STRANGER, "Cheap pills").await;
    let (_, other) = f.held(OTHER_BOX, FRIEND, "For the clerk").await;
    sqlx::query(
        "INSERT INTO pepsi.auto_pay_payment \
           (login, payee, merchant, order_id, currency, value, status) \
         VALUES ($1, 'ceo@elsewhere.example', 'https://backend.example.test/', 'o-1', 'KUDOS', 0.5, 'paid')",
    )
    .bind(BOSS)
    .execute(&f.db.pool)
    .await
    .unwrap();
    let t = f.owner_link(BOSS, 24).await;
    let path = format!("/secretary/held/{}", t.as_str());

    let p = f.page(&path).await;
    assert_eq!(p.status, 200, "{p:?}");
    private_page(&p);
    assert!(p.text.contains(&format!("Held mail for {BOSS}")), "{p:?}");
    assert!(p.text.contains("Quarterly &lt;figures&gt;"), "{p:?}");
    assert!(
        p.text.contains("Cheap pills") && p.text.contains(STRANGER),
        "{p:?}"
    );
    assert!(!p.text.contains("For the clerk"), "{p:?}");
    assert!(
        p.text.contains("KUDOS:0.5") && p.text.contains("ceo@elsewhere.example"),
        "{p:?}"
    );
    assert!(
        p.text.contains(&format!("action=\"{path}/{a}/release\"")),
        "{p:?}"
    );
    assert!(
        p.text.contains(&format!("action=\"{path}/{b}/discard\"")),
        "{p:?}"
    );

    // Release and discard: back to the page (303), the rows decided and woken.
    let p = f.post_form(&format!("{path}/{a}/release"), &[], &[]).await;
    assert_eq!(p.status, 303, "{p:?}");
    assert_eq!(p.headers["location"].to_str().unwrap(), path);
    let by = format!("owner:{BOSS}");
    assert_eq!(f.standing(a).await, held("released", Some(&by), "pending"));
    let p = f.post_form(&format!("{path}/{b}/discard"), &[], &[]).await;
    assert_eq!(p.status, 303, "{p:?}");
    assert_eq!(f.standing(b).await, held("discarded", Some(&by), "pending"));
    // Releasing is not whitelisting.
    assert!(f.whitelist().await.is_empty());

    // Another mailbox's message, a held id that is none, a form of another site.
    for id in [other.to_string(), "0".into(), "x".into(), "999999".into()] {
        let p = f.post_form(&format!("{path}/{id}/release"), &[], &[]).await;
        assert_eq!(p.status, 404, "{id}: {p:?}");
    }
    assert_eq!(f.standing(other).await, held("held", None, "paused"));
    let p = f
        .post_form(
            &format!("{path}/{other}/discard"),
            &[],
            &[("Sec-Fetch-Site", "cross-site")],
        )
        .await;
    assert_eq!(p.status, 403, "{p:?}");

    let p = f.page(&path).await;
    assert_eq!(p.status, 200, "{p:?}");
    assert!(p.text.contains("No mail is held."), "{p:?}");

    // An expired link, an unknown one, a challenge's token: 404, and no decision.
    let old = f.owner_link(BOSS, -1).await;
    let challenge = f.challenge(OTHER_BOX, FRIEND, 24, false).await;
    for token in [old, Token::new().unwrap(), challenge] {
        let p = f.page(&format!("/secretary/held/{}", token.as_str())).await;
        assert_eq!(p.status, 404, "{p:?}");
        let p = f
            .post_form(
                &format!("/secretary/held/{}/{other}/release", token.as_str()),
                &[],
                &[],
            )
            .await;
        assert_eq!(p.status, 404, "{p:?}");
    }
    assert_eq!(f.standing(other).await, held("held", None, "paused"));
}

#[tokio::test]
async fn the_admin_api_lists_and_decides_held_mail_and_lists_payments() {
    let f = fixture().await;
    let (_, a) = f.held(BOSS, FRIEND, "One").await;
    let (_, b) = f.held(BOSS, STRANGER, "Two").await;
    let (_, c) = f.held(OTHER_BOX, FRIEND, "Three").await;
    for (login, order, status) in [(BOSS, "o-1", "paid"), (OTHER_BOX, "o-2", "refused")] {
        sqlx::query(
            "INSERT INTO pepsi.auto_pay_payment \
               (login, payee, merchant, order_id, currency, value, status, reason) \
             VALUES ($1, 'x@elsewhere.example', 'https://backend.example.test/', $2, 'KUDOS', 1.25, $3, \
                     CASE WHEN $3 = 'refused' THEN 'over per_payment' END)",
        )
        .bind(login)
        .bind(order)
        .bind(status)
        .execute(&f.db.pool)
        .await
        .unwrap();
    }
    let ids = |v: &Value| -> Vec<i64> {
        v["held"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|h| h["held_id"].as_i64().unwrap())
            .collect()
    };
    let fx = &f;
    let get = |path: &'static str| fx.api(reqwest::Method::GET, path, &fx.auth);
    let post = |path: String| async move { fx.api(reqwest::Method::POST, &path, &fx.auth).await };

    let (status, v) = get("/api/secretary/held").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(ids(&v), [c, b, a]);
    assert_eq!(v["limit"], 100);
    assert_eq!(v["held"][2]["sender"], FRIEND);
    assert_eq!(v["held"][2]["subject"], "One");
    assert_eq!(v["held"][2]["reason"], "challenged");
    let (_, v) = get("/api/secretary/held?mailbox=Boss@Example.test&limit=1").await;
    assert_eq!(ids(&v), [b]);
    for (path, says) in [
        ("/api/secretary/held?mailbox=nobody", "is not an address"),
        ("/api/secretary/held?all=maybe", "is not true or false"),
        ("/api/secretary/held?page=2", "unknown parameter \"page\""),
        ("/api/auto-pay/payments?limit=0", "limit \"0\""),
    ] {
        let (status, v) = get(path).await;
        assert_eq!(status, 400, "{path}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{path}: {v}");
    }

    // Release and discard; decided_by names the administrator; again 409.
    let (status, v) = post(format!("/api/secretary/held/{a}/release")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["changed"], true);
    assert_eq!(v["status"], "released");
    assert_eq!(v["mailbox"], BOSS);
    assert_eq!(
        f.standing(a).await,
        held("released", Some("admin:root"), "pending")
    );
    let (status, v) = post(format!("/api/secretary/held/{c}/discard")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        f.standing(c).await,
        held("discarded", Some("admin:root"), "pending")
    );
    let (status, v) = post(format!("/api/secretary/held/{a}/discard")).await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("is released already"),
        "{v}"
    );
    assert_eq!(f.standing(a).await.0, "released");
    let (status, v) = post("/api/secretary/held/999999/release".into()).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = post(format!("/api/secretary/held/{b}/retry")).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("not release or discard"),
        "{v}"
    );
    assert_eq!(f.standing(b).await, held("held", None, "paused"));

    // Held only, unless all.
    let (_, v) = get("/api/secretary/held").await;
    assert_eq!(ids(&v), [b]);
    let (_, v) = get("/api/secretary/held?all=true").await;
    assert_eq!(ids(&v), [c, b, a]);
    assert_eq!(v["held"][2]["decided_by"], "admin:root");

    // Each decision is one event_log row with the administrator as actor.
    let rows: Vec<(String, String, Value)> = sqlx::query_as(
        "SELECT actor, action, detail FROM pepsi.event_log \
          WHERE action LIKE 'secretary.%' ORDER BY event_id",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    let actions: Vec<(&str, &str)> = rows
        .iter()
        .map(|(actor, action, _)| (actor.as_str(), action.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("root", "secretary.released"),
            ("root", "secretary.discarded")
        ]
    );
    assert_eq!(rows[0].2["held_id"], a);
    assert_eq!(rows[0].2["sender"], FRIEND);
    assert_eq!(rows[0].2["tool"], "pepsi-httpd");

    // Payments, everyone's or one login's.
    let (status, v) = get("/api/auto-pay/payments").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["payments"].as_array().unwrap().len(), 2, "{v}");
    let (_, v) = get("/api/auto-pay/payments?login=clerk@example.test").await;
    let p = &v["payments"].as_array().unwrap();
    assert_eq!(p.len(), 1, "{v}");
    assert_eq!(p[0]["amount"], "KUDOS:1.25");
    assert_eq!(p[0]["status"], "refused");
    assert_eq!(p[0]["reason"], "over per_payment");

    // Without a credential, nothing.
    for (method, path) in [
        (reqwest::Method::GET, "/api/secretary/held".to_owned()),
        (
            reqwest::Method::POST,
            format!("/api/secretary/held/{b}/release"),
        ),
        (reqwest::Method::GET, "/api/auto-pay/payments".to_owned()),
    ] {
        let (status, v) = f.api(method, &path, &Auth::None).await;
        assert_eq!(status, 401, "{path}: {v}");
    }
    assert_eq!(f.standing(b).await, held("held", None, "paused"));
}
