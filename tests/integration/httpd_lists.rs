//! The mailing lists through the real pepsi-httpd: the admin API under /api/lists (status
//! codes, JSON errors naming the bad input, and the rows each change leaves: the list
//! tables, `list_event_log` with the administrator as actor, `event_log`, the queue rows of
//! approved and rejected posts and of a welcome), and moderation on the web: a link mailed
//! only to an owner or moderator (the same answer for anyone, at most three an hour), the
//! page it opens with every text of a post escaped, forms that need their CSRF token and
//! refuse a cross-site POST, the owner's settings, and an administrator's session reaching
//! the same page. A real PostgreSQL with the real schema; the mail is read from the queue.

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::httpd::{AsRole, Auth, Httpd};

const LIST: &str = "team@example.test";

/// A configuration with a list stage (DELIVER_STAGE aliases, BOUNCE_STAGE bounce) and the
/// public base of the list pages.
const CONFIG: &str = "[pepsi]\nLOCAL_DOMAINS = example.test\nHOSTNAME = mx.example.test\n\
                      LIST_WEB_URL = https://lists.example.test\n\n\
                      [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = aliases\n\
                      BOUNCE_STAGE = bounce\n\
                      [stage-aliases]\nPROGRAM = x\n[stage-bounce]\nPROGRAM = x\n";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    auth: Auth,
    client: reqwest::Client,
}

async fn fixture() -> Fixture {
    // As the pepsi-httpd role: the list API and the moderation pages with its privileges.
    let site = AsRole::new(CONFIG).await;
    let (httpd, session) = site.start().await;
    Fixture {
        db: site.db,
        _dir: site.dir,
        httpd,
        auth: Auth::Session(session),
        client: support::httpd::client(),
    }
}

/// `application/x-www-form-urlencoded` of `pairs`.
pub fn form_body(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A queued row: (stage, recipients, the whole message, state).
type Queued = (String, Vec<String>, String, Value);

/// A queue row as read: (stage, recipients, header block, body, state).
type QueueRow = (String, Vec<String>, Vec<u8>, Vec<u8>, Value);

impl Fixture {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let a = self
            .httpd
            .call(method, path, &self.auth, body.as_ref())
            .await;
        (a.status, a.json)
    }

    /// A form POST (no session cookie unless `cookie`): (status, page).
    async fn post_form(
        &self,
        path: &str,
        pairs: &[(&str, &str)],
        extra: &[(&str, &str)],
    ) -> (u16, String) {
        let mut req = self
            .client
            .post(self.httpd.url(path))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(form_body(pairs));
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn get_page(&self, path: &str, extra: &[(&str, &str)]) -> (u16, String) {
        let mut req = self.client.get(self.httpd.url(path));
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn scalar<T>(&self, sql: &'static str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn queued(&self) -> Vec<Queued> {
        let rows: Vec<QueueRow> = sqlx::query_as(
            "SELECT w.stage, w.rcpt_to, w.headers, b.body, w.state FROM pepsi.workqueue w \
             JOIN pepsi.workqueue_body b USING (body_id) ORDER BY w.workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(s, r, h, b, st)| {
                let mut raw = h;
                raw.extend_from_slice(b"\r\n");
                raw.extend_from_slice(&b);
                (s, r, String::from_utf8_lossy(&raw).into_owned(), st)
            })
            .collect()
    }

    /// A post of `sender` held on the list; its id.
    async fn hold(&self, sender: &str, subject: &str, body: &str) -> i64 {
        let headers = format!(
            "From: {sender}\r\nTo: {LIST}\r\nSubject: {subject}\r\nMessage-ID: <{}@example.net>\r\n",
            subject.len()
        );
        sqlx::query_scalar(
            "INSERT INTO pepsi.list_held_message (list_id, sender, mail_from, subject, \
             message_id, reason, headers, body, expires_at) \
             SELECT list_id, $2, $2, $3, '<m@example.net>', 'nonmember', $4, $5, \
                    now() + interval '1 day' \
               FROM pepsi.mailing_list WHERE address = $1 RETURNING held_id",
        )
        .bind(LIST)
        .bind(sender)
        .bind(subject)
        .bind(headers.as_bytes())
        .bind(body.as_bytes())
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// A subscription of `address` waiting for a moderator; its id.
    async fn waiting(&self, address: &str, token: &str) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO pepsi.list_pending (list_id, address, display_name, kind, waiting_for, \
             token_hash, requested_via, expires_at) \
             SELECT list_id, $2, 'New One', 'subscribe', 'approve', sha256($3::bytea), 'web', \
                    now() + interval '1 day' \
               FROM pepsi.mailing_list WHERE address = $1 RETURNING pending_id",
        )
        .bind(LIST)
        .bind(address)
        .bind(token.as_bytes())
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// The events of the list log: (event, address, actor), in order.
    async fn events(&self) -> Vec<(String, String, String)> {
        sqlx::query_as("SELECT event, address, actor FROM pepsi.list_event_log ORDER BY event_id")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn create_team(&self) {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/api/lists",
                Some(json!({
                    "address": "Team@Example.test",
                    "display_name": "The Team",
                    "owners": ["olga@example.test"],
                })),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["list"], LIST);
    }
}

use reqwest::Method;

#[tokio::test]
async fn the_list_api_makes_the_changes_pepsi_list_makes() {
    let f = fixture().await;

    // Without a credential, nothing; a cookie without its CSRF token changes nothing.
    let a = f.httpd.get("/api/lists", &Auth::None).await;
    assert_eq!(a.status, 401, "{a:?}");
    let Auth::Session(s) = &f.auth else {
        unreachable!()
    };
    let a = f
        .httpd
        .post(
            "/api/lists",
            &Auth::CookieOnly(s.clone()),
            &json!({"address": LIST}),
        )
        .await;
    assert_eq!(a.status, 403, "{a:?}");

    // Create: checked as pepsi-list checks, 409 the second time.
    f.create_team().await;
    let cases: [(Value, u16, &str); 5] = [
        (json!({"address": LIST}), 409, "exists already"),
        (json!({"address": "team-join@example.test"}), 400, "-join"),
        (
            json!({"address": "news@elsewhere.example"}),
            400,
            "not a local domain",
        ),
        (
            json!({"address": "x@example.test", "colour": "red"}),
            400,
            "colour",
        ),
        (
            json!({"address": "y@example.test", "owners": ["not an address"]}),
            400,
            "owners",
        ),
    ];
    for (body, status, part) in cases {
        let (got, answer) = f.call(Method::POST, "/api/lists", Some(body.clone())).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap_or_default().contains(part),
            "{body}: {answer}"
        );
    }
    let (_, all) = f.call(Method::GET, "/api/lists", None).await;
    assert_eq!(all["lists"].as_array().unwrap().len(), 1, "{all}");
    assert_eq!(all["lists"][0]["address"], LIST);
    let (status, shown) = f
        .call(Method::GET, "/api/lists/team@example.test", None)
        .await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["options"]["display_name"], "The Team");
    assert_eq!(shown["roles"]["owner"], 1);
    let (status, e) = f
        .call(Method::GET, "/api/lists/none@example.test", None)
        .await;
    assert_eq!((status, e["error"].is_string()), (404, true), "{e}");

    // Configure: the options of `pepsi-list configure`, each value checked.
    let (status, changed) = f
        .call(
            Method::PATCH,
            "/api/lists/team@example.test",
            Some(json!({"options": {"subject_prefix": "[team] ", "emergency": true, "held_lifetime": "3d"}})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["changed"].as_array().unwrap().len(), 3, "{changed}");
    let row: (String, bool, f64) = sqlx::query_as(
        "SELECT subject_prefix, emergency, extract(epoch FROM held_lifetime)::float8 \
         FROM pepsi.mailing_list WHERE address = $1",
    )
    .bind(LIST)
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(row, ("[team] ".to_owned(), true, 3.0 * 86400.0));
    for (options, part) in [
        (json!({"max_message_size": "huge"}), "max_message_size"),
        (json!({"colour": "red"}), "unknown option"),
        (json!({"reply_goes_to": "explicit"}), "reply_to_address"),
        (json!({}), "NAME=VALUE"),
    ] {
        let (status, e) = f
            .call(
                Method::PATCH,
                "/api/lists/team@example.test",
                Some(json!({ "options": options })),
            )
            .await;
        assert_eq!(status, 400, "{options}: {e}");
        assert!(
            e["error"].as_str().unwrap().contains(part),
            "{options}: {e}"
        );
    }

    // Members: added as `api`, removed one by one, 404 for one that is not there.
    let (status, added) = f
        .call(
            Method::POST,
            "/api/lists/team@example.test/members",
            Some(json!({"addresses": ["Alice@Example.test", "bob@example.test", "alice@example.test"]})),
        )
        .await;
    assert_eq!(status, 200, "{added}");
    assert_eq!(
        added["added"],
        json!(["alice@example.test", "bob@example.test"])
    );
    let (status, again) = f
        .call(
            Method::POST,
            "/api/lists/team@example.test/members",
            Some(json!({"addresses": ["bob@example.test"], "role": "moderator"})),
        )
        .await;
    assert_eq!(
        (status, &again["added"]),
        (200, &json!(["bob@example.test"])),
        "{again}"
    );
    for (body, part) in [
        (json!({"addresses": []}), "1 to 1000"),
        (json!({"addresses": ["bad"]}), "addresses"),
        (
            json!({"addresses": ["c@example.test"], "role": "king"}),
            "role",
        ),
        (
            json!({"addresses": ["c@example.test"], "action": "explode"}),
            "action",
        ),
    ] {
        let (status, e) = f
            .call(
                Method::POST,
                "/api/lists/team@example.test/members",
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, 400, "{body}: {e}");
        assert!(e["error"].as_str().unwrap().contains(part), "{body}: {e}");
    }
    let via: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT subscribed_via FROM pepsi.list_member WHERE role <> 'owner'",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(via, ["api"]);
    let (_, members) = f
        .call(
            Method::GET,
            "/api/lists/team@example.test/members?role=member",
            None,
        )
        .await;
    assert_eq!(members["members"].as_array().unwrap().len(), 2, "{members}");
    let (status, _) = f
        .call(
            Method::DELETE,
            "/api/lists/team@example.test/members/bob@example.test",
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, e) = f
        .call(
            Method::DELETE,
            "/api/lists/team@example.test/members/bob@example.test",
            None,
        )
        .await;
    assert_eq!(status, 404, "{e}");
    let (status, _) = f
        .call(
            Method::DELETE,
            "/api/lists/team@example.test/members/bob@example.test?role=moderator",
            None,
        )
        .await;
    assert_eq!(status, 200);

    // Held posts: approved to the list stage, rejected to the bounce stage, discarded.
    let approve = f.hold("nina@example.net", "hello", "hi all\r\n").await;
    let reject = f.hold("otto@example.net", "buy", "cheap\r\n").await;
    let discard = f.hold("paul@example.net", "noise", "x\r\n").await;
    let (_, held) = f
        .call(Method::GET, "/api/lists/team@example.test/held", None)
        .await;
    assert_eq!(held["held"].as_array().unwrap().len(), 3, "{held}");
    let path = |id: i64, action: &str| format!("/api/lists/team@example.test/held/{id}/{action}");
    let (status, d) = f.call(Method::POST, &path(approve, "approve"), None).await;
    assert_eq!(status, 200, "{d}");
    let (status, e) = f.call(Method::POST, &path(approve, "approve"), None).await;
    assert_eq!(status, 404, "decided already: {e}");
    let (status, e) = f
        .call(
            Method::POST,
            &path(reject, "approve"),
            Some(json!({"reason": "no"})),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = f.call(Method::POST, &path(reject, "explode"), None).await;
    assert_eq!(status, 404, "{e}");
    let (status, e) = f
        .call(
            Method::POST,
            "/api/lists/team@example.test/held/x/approve",
            None,
        )
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, d) = f
        .call(
            Method::POST,
            &path(reject, "reject"),
            Some(json!({"reason": "off topic"})),
        )
        .await;
    assert_eq!(status, 200, "{d}");
    let (status, _) = f.call(Method::POST, &path(discard, "discard"), None).await;
    assert_eq!(status, 200);
    let queued = f.queued().await;
    assert_eq!(queued.len(), 2, "{queued:?}");
    assert_eq!(queued[0].0, "lists");
    assert_eq!(queued[0].1, [LIST]);
    assert_eq!(
        queued[0].3["list_approval"]["moderator"], "root",
        "{:?}",
        queued[0].3
    );
    assert!(queued[0].2.contains("Subject: hello"), "{}", queued[0].2);
    assert_eq!(queued[1].0, "bounce");
    assert!(
        queued[1]
            .3
            .to_string()
            .contains("rejected by the list's moderator: off topic"),
        "{:?}",
        queued[1].3
    );
    let decisions: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, moderator FROM pepsi.list_moderation_decision ORDER BY decision_id",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(
        decisions,
        [("approve", "root"), ("reject", "root"), ("discard", "root")]
            .map(|(a, m)| (a.to_owned(), m.to_owned()))
    );

    // Bans: 201 when added, 200 when there already, 400 for a pattern PostgreSQL refuses,
    // 404 for one that is not there; the same for every list under /api/lists/bans.
    let bans = "/api/lists/team@example.test/bans";
    let (status, b) = f
        .call(
            Method::POST,
            bans,
            Some(json!({"pattern": "Spam@Example.net"})),
        )
        .await;
    assert_eq!(
        (status, &b["pattern"]),
        (201, &json!("spam@example.net")),
        "{b}"
    );
    let (status, b) = f
        .call(
            Method::POST,
            bans,
            Some(json!({"pattern": "spam@example.net"})),
        )
        .await;
    assert_eq!((status, &b["changed"]), (200, &json!(false)), "{b}");
    let (status, e) = f
        .call(Method::POST, bans, Some(json!({"pattern": "^(unclosed"})))
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, b) = f
        .call(
            Method::POST,
            "/api/lists/bans",
            Some(json!({"pattern": "^.*@spam\\.example$"})),
        )
        .await;
    assert_eq!(status, 201, "{b}");
    let (_, listed) = f.call(Method::GET, bans, None).await;
    assert_eq!(listed["bans"].as_array().unwrap().len(), 2, "{listed}");
    let (status, _) = f
        .call(
            Method::DELETE,
            bans,
            Some(json!({"pattern": "spam@example.net"})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, e) = f
        .call(
            Method::DELETE,
            bans,
            Some(json!({"pattern": "spam@example.net"})),
        )
        .await;
    assert_eq!(status, 404, "{e}");

    // Subscriptions waiting for a moderator: approved (a member, a welcome at
    // DELIVER_STAGE) or rejected (a notice).
    let yes = f.waiting("newbie@example.net", "t1").await;
    let no = f.waiting("troll@example.net", "t2").await;
    let (_, pending) = f
        .call(Method::GET, "/api/lists/team@example.test/pending", None)
        .await;
    assert_eq!(pending["pending"].as_array().unwrap().len(), 2, "{pending}");
    assert_eq!(pending["pending"][0]["waiting_for"], "approve");
    let ppath =
        |id: i64, action: &str| format!("/api/lists/team@example.test/pending/{id}/{action}");
    let (status, d) = f.call(Method::POST, &ppath(yes, "approve"), None).await;
    assert_eq!(status, 200, "{d}");
    let (status, _) = f.call(Method::POST, &ppath(yes, "approve"), None).await;
    assert_eq!(status, 404);
    let (status, d) = f
        .call(
            Method::POST,
            &ppath(no, "reject"),
            Some(json!({"reason": "troll"})),
        )
        .await;
    assert_eq!(status, 200, "{d}");
    let member: (String, String) = sqlx::query_as(
        "SELECT display_name, subscribed_via FROM pepsi.list_member \
         WHERE address = 'newbie@example.net' AND role = 'member'",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(member, ("New One".to_owned(), "web".to_owned()));
    let queued = f.queued().await;
    let welcome = &queued[queued.len() - 2];
    assert_eq!(
        (welcome.0.as_str(), welcome.1.as_slice()),
        ("aliases", &["newbie@example.net".to_owned()][..])
    );
    // The rejected subscriber, who confirmed the address, is told, with the reason.
    let refused = queued.last().unwrap();
    assert_eq!(refused.1, ["troll@example.net".to_owned()]);
    assert!(
        refused
            .2
            .contains("Subject: Your subscription to team@example.test")
            && refused
                .2
                .contains("did not approve your subscription.\r\n\r\nThe reason given: troll"),
        "{}",
        refused.2
    );
    assert!(
        welcome.2.contains("Subject: Welcome to team@example.test"),
        "{}",
        welcome.2
    );
    assert!(
        welcome.2.contains("From: <team-request@example.test>"),
        "{}",
        welcome.2
    );
    let left: i64 = f.scalar("SELECT count(*) FROM pepsi.list_pending").await;
    assert_eq!(left, 0);

    // Forget a person: every row of theirs on every list.
    let (status, gone) = f
        .call(Method::DELETE, "/api/lists/people/alice@example.test", None)
        .await;
    assert_eq!(status, 200, "{gone}");
    assert_eq!(gone["memberships"][0]["list"], LIST, "{gone}");
    let (status, _) = f
        .call(Method::DELETE, "/api/lists/people/not-an-address", None)
        .await;
    assert_eq!(status, 400);

    // The log: every change with the administrator as actor; the audit log the same.
    let events = f.events().await;
    let names: Vec<&str> = events.iter().map(|(e, _, _)| e.as_str()).collect();
    for want in [
        "list.create",
        "list.configure",
        "member.add",
        "member.remove",
        "post.approve",
        "post.reject",
        "post.discard",
        "ban.add",
        "ban.remove",
        "subscription.approve",
        "subscription.reject",
        "member.forget",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    assert!(
        events.iter().all(|(_, _, actor)| actor == "root"),
        "{events:?}"
    );
    let audit: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM pepsi.event_log WHERE action LIKE 'list.%' AND actor = 'root' \
         ORDER BY 1",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    for want in [
        "list.create",
        "list.approve",
        "list.subscription_approve",
        "list.forget",
    ] {
        assert!(audit.iter().any(|a| a == want), "{want} in {audit:?}");
    }

    // Delete: gone, and 404 after.
    let (status, d) = f
        .call(Method::DELETE, "/api/lists/team@example.test", None)
        .await;
    assert_eq!(status, 200, "{d}");
    let (status, _) = f
        .call(Method::GET, "/api/lists/team@example.test", None)
        .await;
    assert_eq!(status, 404);
}

/// The link in a moderator's mail: the token after `/moderate/link/`.
fn link_token(message: &str) -> String {
    let at = message
        .find("https://lists.example.test/moderate/link/")
        .unwrap_or_else(|| panic!("a link in {message}"));
    message[at + "https://lists.example.test/moderate/link/".len()..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}

/// The value of the first hidden `csrf` field of a page.
fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field");
    page[at + 19..].chars().take_while(|c| *c != '"').collect()
}

#[tokio::test]
async fn a_moderator_gets_a_link_by_mail_and_decides_on_the_page() {
    let f = fixture().await;
    f.create_team().await;
    let (status, _) = f
        .call(
            Method::POST,
            "/api/lists/team@example.test/members",
            Some(json!({"addresses": ["mod@example.test"], "role": "moderator"})),
        )
        .await;
    assert_eq!(status, 200);
    let evil = f
        .hold(
            "mallory@example.net",
            "<script>alert(1)</script>",
            "<img src=x onerror=alert(2)>\r\nplain words\r\n",
        )
        .await;
    let other = f.hold("nina@example.net", "hello", "hi\r\n").await;
    let before = f.queued().await.len();

    // The request form, and the same answer for anyone; mail only to the moderator.
    let (status, page) = f.get_page("/moderate/team@example.test", &[]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("name=\"address\""), "{page}");
    let (status, stranger) = f
        .post_form(
            "/moderate/team@example.test",
            &[("address", "stranger@example.net")],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{stranger}");
    assert_eq!(
        f.queued().await.len(),
        before,
        "nothing mailed to a stranger"
    );
    let (status, asked) = f
        .post_form(
            "/moderate/team@example.test",
            &[("address", "MOD@example.test")],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{asked}");
    let neutral = |p: &str| {
        p.replace("stranger@example.net", "X")
            .replace("mod@example.test", "X")
    };
    assert_eq!(
        neutral(&stranger),
        neutral(&asked),
        "the answer does not tell"
    );
    let queued = f.queued().await;
    assert_eq!(queued.len(), before + 1);
    let mail = &queued[before];
    assert_eq!(
        (mail.0.as_str(), mail.1.as_slice()),
        ("aliases", &["mod@example.test".to_owned()][..])
    );
    assert!(
        mail.2.contains("From: <team-request@example.test>"),
        "{}",
        mail.2
    );
    let token = link_token(&mail.2);
    assert_eq!(token.len(), 64, "{}", mail.2);
    let links: (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_and(list_id IS NOT NULL AND expires_at <= now() + interval '1 hour') \
         FROM pepsi.list_member_link WHERE address = 'mod@example.test'",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(links, (1, true));
    // At most three an hour: the fourth request stores and sends nothing.
    for _ in 0..3 {
        f.post_form(
            "/moderate/team@example.test",
            &[("address", "mod@example.test")],
            &[],
        )
        .await;
    }
    let n: i64 = f
        .scalar("SELECT count(*) FROM pepsi.list_member_link")
        .await;
    assert_eq!(n, 3);
    let (status, _) = f.get_page("/moderate/none@example.test", &[]).await;
    assert_eq!(status, 404);

    // The page: the posts, escaped; no settings for a moderator who is no owner.
    let link = format!("/moderate/link/{token}");
    let (status, page) = f.get_page(&link, &[]).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        page.contains("&lt;img src=x onerror=alert(2)&gt;"),
        "{page}"
    );
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("<img src=x"), "{page}");
    assert!(page.contains("plain words"), "{page}");
    assert!(page.contains(&format!("id=\"approve-{evil}\"")), "{page}");
    assert!(!page.contains("id=\"settings\""), "{page}");
    let (status, _) = f
        .get_page(&format!("/moderate/link/{}", "0".repeat(64)), &[])
        .await;
    assert_eq!(status, 404);

    // The forms need their CSRF token, and a cross-site POST is refused.
    let csrf = csrf_of(&page);
    let id = other.to_string();
    let (status, _) = f
        .post_form(&link, &[("do", "approve"), ("id", &id)], &[])
        .await;
    assert_eq!(status, 403);
    let (status, _) = f
        .post_form(
            &link,
            &[("csrf", &csrf), ("do", "approve"), ("id", &id)],
            &[("Sec-Fetch-Site", "cross-site")],
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = f
        .post_form(
            &link,
            &[
                ("csrf", &csrf),
                ("do", "configure"),
                ("opt_emergency", "yes"),
            ],
            &[],
        )
        .await;
    assert_eq!(status, 403, "a moderator changes no option");
    let (status, done) = f
        .post_form(
            &link,
            &[("csrf", &csrf), ("do", "approve"), ("id", &id)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains(&format!("Post {id} approved")), "{done}");
    let queued = f.queued().await;
    let approved = queued.last().unwrap();
    assert_eq!(approved.0, "lists");
    assert_eq!(approved.3["list_approval"]["moderator"], "mod@example.test");
    let (status, again) = f
        .post_form(
            &link,
            &[("csrf", &csrf), ("do", "approve"), ("id", &id)],
            &[],
        )
        .await;
    assert_eq!(status, 404, "{again}");
    // Ban: the sender banned from the list, the post discarded.
    let evil_id = evil.to_string();
    let (status, done) = f
        .post_form(
            &link,
            &[("csrf", &csrf), ("do", "ban"), ("id", &evil_id)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let banned: i64 = f
        .scalar("SELECT count(*) FROM pepsi.list_ban WHERE pattern = 'mallory@example.net'")
        .await;
    let held: i64 = f
        .scalar("SELECT count(*) FROM pepsi.list_held_message")
        .await;
    assert_eq!((banned, held), (1, 0));
    // A subscription waiting for approval, approved on the page.
    let waiting = f.waiting("newbie@example.net", "t3").await.to_string();
    let (_, page) = f.get_page(&link, &[]).await;
    assert!(
        page.contains(&format!("id=\"accept-request-{waiting}\"")),
        "{page}"
    );
    let (status, done) = f
        .post_form(
            &link,
            &[("csrf", &csrf), ("do", "accept-request"), ("id", &waiting)],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let actors: Vec<(String, String, String)> = f
        .events()
        .await
        .into_iter()
        .filter(|(_, _, actor)| actor == "mod@example.test")
        .collect();
    let names: Vec<&str> = actors
        .iter()
        .map(|(e, _, _)| e.as_str())
        .filter(|e| *e != "moderator.link")
        .collect();
    assert_eq!(
        names,
        [
            "post.approve",
            "ban.add",
            "post.discard",
            "subscription.approve"
        ],
        "{actors:?}"
    );
    let links = actors
        .iter()
        .filter(|(e, _, _)| e == "moderator.link")
        .count();
    assert_eq!(links, 3, "one event per link sent");

    // An owner's page has the settings, which change the list as `configure` does.
    f.post_form(
        "/moderate/team@example.test",
        &[("address", "olga@example.test")],
        &[],
    )
    .await;
    let owner_mail = f
        .queued()
        .await
        .into_iter()
        .rfind(|q| q.1 == ["olga@example.test"])
        .unwrap();
    let owner_link = format!("/moderate/link/{}", link_token(&owner_mail.2));
    let (_, page) = f.get_page(&owner_link, &[]).await;
    assert!(page.contains("id=\"settings\""), "{page}");
    let owner_csrf = csrf_of(&page);
    assert_ne!(owner_csrf, csrf, "each link has its own token");
    let (status, bad) = f
        .post_form(
            &owner_link,
            &[
                ("csrf", &owner_csrf),
                ("do", "configure"),
                ("opt_max_message_size", "huge"),
            ],
            &[],
        )
        .await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad.contains("max_message_size"), "{bad}");
    let (status, done) = f
        .post_form(
            &owner_link,
            &[
                ("csrf", &owner_csrf),
                ("do", "configure"),
                ("opt_emergency", "yes"),
                ("opt_display_name", "The Team"),
            ],
            &[],
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("Changed: emergency."), "{done}");
    let emergency: bool = f
        .scalar("SELECT emergency FROM pepsi.mailing_list WHERE address = 'team@example.test'")
        .await;
    assert!(emergency);

    // An address that no longer runs the list: its link stops working.
    let (status, _) = f
        .call(
            Method::DELETE,
            "/api/lists/team@example.test/members/mod@example.test?role=moderator",
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = f.get_page(&link, &[]).await;
    assert_eq!(status, 403);

    // An administrator's session reaches the page of any list without a link.
    let Auth::Session(s) = &f.auth else {
        unreachable!()
    };
    let cookie = format!("pepsi_session={}", s.cookie);
    let (status, page) = f
        .get_page("/moderate/team@example.test", &[("Cookie", &cookie)])
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"settings\""), "{page}");
    assert!(
        page.contains("action=\"/moderate/team@example.test/act\""),
        "{page}"
    );
    let (status, _) = f
        .post_form(
            "/moderate/team@example.test/act",
            &[
                ("csrf", "wrong"),
                ("do", "configure"),
                ("opt_emergency", "no"),
            ],
            &[("Cookie", &cookie)],
        )
        .await;
    assert_eq!(status, 403);
    let (status, done) = f
        .post_form(
            "/moderate/team@example.test/act",
            &[
                ("csrf", &s.csrf),
                ("do", "configure"),
                ("opt_emergency", "no"),
            ],
            &[("Cookie", &cookie)],
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let actor: String = f
        .scalar("SELECT actor FROM pepsi.list_event_log ORDER BY event_id DESC LIMIT 1")
        .await;
    assert_eq!(actor, "root");
}

/// The httpd role queues what the list pages send through pepsi.list_queue_mail (a list's
/// own mail, from its -bounces address, to one person), and cannot queue with
/// pepsi.workqueue_inject, as `privilege_matrix` and `FUNCTION_GRANTS` decide.
#[tokio::test]
async fn the_httpd_role_queues_the_lists_mail_through_the_list_function_alone() {
    let db = TestDb::new().await;
    sqlx::query("INSERT INTO pepsi.mailing_list (address) VALUES ('team@example.test')")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE \"pepsi-httpd\"")
        .execute(&mut *tx)
        .await
        .unwrap();
    let id: Option<i64> = sqlx::query_scalar(
        "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', \
         'team-bounces@example.test', ARRAY['mod@example.test'], 'Subject: x\r\n'::bytea, \
         'y\r\n'::bytea)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(id.is_some());
    tx.commit().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE \"pepsi-httpd\"")
        .execute(&mut *tx)
        .await
        .unwrap();
    let refused = sqlx::query_scalar::<_, Option<i64>>(
        "SELECT pepsi.workqueue_inject('aliases', 'team-bounces@example.test', \
         ARRAY['mod@example.test'], 'Subject: x\r\n'::bytea, 'y\r\n'::bytea, '{}')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("42501"),
        "{refused}"
    );
}
