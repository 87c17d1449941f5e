//! The subscriber-facing list pages of pepsi-httpd as a process against a real PostgreSQL,
//! over HTTP (reqwest, and curl for RFC 8058's one-click POST): a subscription by form is
//! confirmed by mail with a link whose GET changes nothing and whose POST subscribes;
//! confirmations are bounded per address and per client and the page says the same either
//! way; one-click unsubscribes on POST only, twice alike, with one goodbye; a member's
//! emailed link opens a page whose form changes a preference and whose button leaves with
//! one goodbye; bad input gets its error page.

use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::free_port;
use crate::support::httpd::{Httpd, write_config};

const WEB: &str = "https://lists.example.test";

/// pepsi-httpd with the list stage `lists` (its mail starts at `deliver`), and the lists
/// team (advertised), club and hidden (not advertised).
struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    client: reqwest::Client,
}

async fn fixture(web_url: bool) -> Fixture {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let web = if web_url {
        format!("LIST_WEB_URL = {WEB}\n")
    } else {
        String::new()
    };
    // As the pepsi-httpd role: the subscriber pages with its privileges.
    let config = write_config(
        dir.path(),
        &crate::support::httpd::url_as(&db.url, "pepsi-httpd"),
        port,
        &format!(
            "[pepsi]\nHOSTNAME = mx.example.test\nLOCAL_DOMAINS = example.test\n{web}\n\
             [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\n\
             [stage-deliver]\nPROGRAM = pepsi-stage-discard\n"
        ),
    );
    for (address, advertised) in [
        ("team@example.test", true),
        ("club@example.test", true),
        ("hidden@example.test", false),
    ] {
        sqlx::query(
            "INSERT INTO pepsi.mailing_list (address, display_name, description, advertised, \
             confirm_window) VALUES ($1, initcap(split_part($1, '@', 1)), 'About ' || $1, $2, \
             '7 days')",
        )
        .bind(address)
        .bind(advertised)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let mut httpd = Httpd::new(config, port);
    httpd.start().await;
    Fixture {
        db,
        _dir: dir,
        httpd,
        client: crate::support::httpd::client(),
    }
}

/// An answer: status and text.
#[derive(Debug)]
struct Page {
    status: u16,
    text: String,
}

impl Fixture {
    async fn get(&self, path: &str) -> Page {
        let r = self.client.get(self.httpd.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        Page {
            status,
            text: r.text().await.unwrap(),
        }
    }

    /// A form POST as a browser or curl sends it, with `extra` header fields.
    async fn post(&self, path: &str, body: &str, extra: &[(&str, &str)]) -> Page {
        let mut req = self
            .client
            .post(self.httpd.url(path))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body.to_owned());
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        Page {
            status,
            text: r.text().await.unwrap(),
        }
    }

    /// The mail queued at `deliver`: (envelope sender, recipients, headers, the text of the
    /// body as a reader sees it).
    async fn mail(&self) -> Vec<(String, Vec<String>, String, String)> {
        type Row = (String, Vec<String>, Vec<u8>, Vec<u8>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT q.mail_from, q.rcpt_to, q.headers, b.body FROM pepsi.workqueue q \
               JOIN pepsi.workqueue_body b USING (body_id) \
              WHERE q.stage = 'deliver' ORDER BY q.workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(f, r, h, b)| {
                let raw = [h.as_slice(), b"\r\n", b.as_slice()].concat();
                let text = mail_parser::MessageParser::default()
                    .parse(&raw)
                    .and_then(|m| m.body_text(0).map(|t| t.into_owned()))
                    .unwrap_or_default();
                (f, r, String::from_utf8(h).unwrap(), text)
            })
            .collect()
    }

    async fn member(&self, list: &str, address: &str) -> Option<(i64, String, String)> {
        sqlx::query_as(
            "SELECT m.member_id, m.subscribed_via, m.display_name FROM pepsi.list_member m \
               JOIN pepsi.mailing_list l USING (list_id) \
              WHERE l.address = $1 AND m.address = $2 AND m.role = 'member'",
        )
        .bind(list)
        .bind(address)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap()
    }

    async fn add_member(&self, list: &str, address: &str) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO pepsi.list_member (list_id, address, role) \
             SELECT list_id, $2, 'member' FROM pepsi.mailing_list WHERE address = $1 \
             RETURNING member_id",
        )
        .bind(list)
        .bind(address)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// (event, detail) of the list event log, oldest first.
    async fn events(&self) -> Vec<(String, Value)> {
        sqlx::query_as("SELECT event, detail FROM pepsi.list_event_log ORDER BY event_id")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }
}

/// Checks that `mail` is the goodbye to `to` after leaving team@example.test on the web:
/// from the list's -bounces address, saying how to join again by mail and on the list's page.
fn assert_goodbye(mail: &(String, Vec<String>, String, String), to: &str) {
    let (from, rcpt, headers, text) = mail;
    assert_eq!(from, "team-bounces@example.test");
    assert_eq!(rcpt, &vec![to.to_owned()]);
    assert!(
        headers.contains("Subject: You have left team@example.test\r\n")
            && headers.contains("From: <team-request@example.test>\r\n"),
        "{headers}"
    );
    assert!(
        text.starts_with("You have left team@example.test.")
            && text.contains("write to team-join@example.test")
            && text.contains(&format!("{WEB}/lists/team@example.test\r\n")),
        "{text}"
    );
}

/// The token after `marker` in `text` (up to the first character that is not a letter or
/// digit).
fn token_after(text: &str, marker: &str) -> String {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("{marker:?} in {text}"))
        + marker.len();
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect()
}

#[tokio::test]
async fn a_web_subscription_is_confirmed_by_a_post_and_not_by_a_get() {
    let f = fixture(true).await;
    let index = f.get("/lists").await;
    assert_eq!(index.status, 200, "{index:?}");
    assert!(
        index.text.contains("team@example.test")
            && index.text.contains("About club@example.test")
            && !index.text.contains("hidden@example.test"),
        "{}",
        index.text
    );
    assert_eq!(f.get("/lists/hidden@example.test").await.status, 200);

    let asked = f
        .post(
            "/lists/team@example.test/subscribe",
            "address=Bob%40Remote.test&display_name=Bob+Smith",
            &[],
        )
        .await;
    assert_eq!(asked.status, 200, "{asked:?}");
    assert!(
        asked
            .text
            .contains("If bob@remote.test may subscribe to team@example.test"),
        "{}",
        asked.text
    );
    let pending: (String, String, String, String) = sqlx::query_as(
        "SELECT address, display_name, requested_via, client FROM pepsi.list_pending",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(
        pending,
        (
            "bob@remote.test".into(),
            "Bob Smith".into(),
            "web".into(),
            "127.0.0.1".into()
        )
    );
    let mail = f.mail().await;
    assert_eq!(mail.len(), 1, "{mail:?}");
    let (from, rcpt, headers, body) = &mail[0];
    assert_eq!(from, "team-bounces@example.test");
    assert_eq!(rcpt, &vec!["bob@remote.test".to_owned()]);
    let token = token_after(headers, "Subject: confirm ");
    assert_eq!(token.len(), 24, "{headers}");
    for want in [
        "Auto-Submitted: auto-replied\r\n".to_owned(),
        format!("Reply-To: <team-confirm+{token}@example.test>\r\n"),
        "From: <team-request@example.test>\r\n".to_owned(),
    ] {
        assert!(headers.contains(&want), "{want:?} in {headers}");
    }
    assert!(
        body.contains(&format!("{WEB}/lists/confirm/{token}\r\n")),
        "{body}"
    );

    // A link scanner's GET: a page, and nothing changes.
    let page = f.get(&format!("/lists/confirm/{token}")).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.text
            .contains("Subscribe bob@remote.test to team@example.test?")
            && page.text.contains("<form method=\"post\">"),
        "{}",
        page.text
    );
    assert_eq!(f.member("team@example.test", "bob@remote.test").await, None);
    assert_eq!(f.count("SELECT count(*) FROM pepsi.list_pending").await, 1);

    // The button: subscribed, by the web, with the name given; welcomed by mail.
    let done = f.post(&format!("/lists/confirm/{token}"), "", &[]).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert!(
        done.text
            .contains("bob@remote.test is now subscribed to team@example.test"),
        "{}",
        done.text
    );
    let (_, via, name) = f
        .member("team@example.test", "bob@remote.test")
        .await
        .unwrap();
    assert_eq!((via.as_str(), name.as_str()), ("web", "Bob Smith"));
    assert_eq!(f.count("SELECT count(*) FROM pepsi.list_pending").await, 0);
    let events = f.events().await;
    assert_eq!(
        events,
        vec![(
            "member.subscribe".to_owned(),
            serde_json::json!({"via": "web"})
        )]
    );
    let mail = f.mail().await;
    assert_eq!(mail.len(), 2, "a welcome: {mail:?}");
    assert!(
        mail[1].2.contains("Subject: Welcome to team@example.test"),
        "{mail:?}"
    );

    // Used: the link is gone, and a member asking again is sent nothing.
    assert_eq!(
        f.post(&format!("/lists/confirm/{token}"), "", &[])
            .await
            .status,
        404
    );
    assert_eq!(f.get(&format!("/lists/confirm/{token}")).await.status, 404);
    let again = f
        .post(
            "/lists/team@example.test/subscribe",
            "address=bob%40remote.test",
            &[],
        )
        .await;
    assert_eq!(again.status, 200);
    assert!(again.text.contains("If bob@remote.test may subscribe"));
    assert_eq!(f.mail().await.len(), 2, "nothing for a member");
    // Nor for an address of the list itself, nor a banned one.
    sqlx::query(
        "INSERT INTO pepsi.list_ban (list_id, pattern, created_by) \
         SELECT NULL, '^.*@spam\\.test$', 'test'",
    )
    .execute(&f.db.pool)
    .await
    .unwrap();
    for address in ["team-request%40example.test", "eve%40spam.test"] {
        let p = f
            .post(
                "/lists/team@example.test/subscribe",
                &format!("address={address}"),
                &[],
            )
            .await;
        assert_eq!(p.status, 200, "{p:?}");
        assert!(
            p.text.contains("may subscribe to team@example.test"),
            "{p:?}"
        );
    }
    assert_eq!(
        f.mail().await.len(),
        2,
        "nothing for the list or a banned address"
    );
}

#[tokio::test]
async fn web_confirmations_are_bounded_per_address_and_per_client() {
    let f = fixture(true).await;
    // team: 3 per address, clients unbounded; club: 5 per client.
    sqlx::query(
        "UPDATE pepsi.mailing_list SET confirm_limit_per_address = 3, \
         confirm_limit_per_client = CASE WHEN address = 'team@example.test' THEN 100000 ELSE 5 END",
    )
    .execute(&f.db.pool)
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let mut answers = std::collections::BTreeSet::new();
    for _ in 0..100 {
        let p = f
            .post(
                "/lists/team@example.test/subscribe",
                "address=victim%40remote.test",
                &[],
            )
            .await;
        assert_eq!(p.status, 200, "{p:?}");
        answers.insert(p.text);
    }
    let took = started.elapsed();
    eprintln!("100 web subscriptions for one address: {took:?}");
    assert!(
        took < std::time::Duration::from_secs(60),
        "100 requests within a minute"
    );
    assert_eq!(answers.len(), 1, "the same page sent or not");
    let to_victim = f.mail().await;
    assert_eq!(to_victim.len(), 3, "confirm_limit_per_address");
    assert_eq!(
        f.count("SELECT count(*) FROM pepsi.list_pending").await,
        3,
        "no pending row past the limit"
    );

    for i in 0..20 {
        let p = f
            .post(
                "/lists/club@example.test/subscribe",
                &format!("address=person{i}%40remote.test"),
                &[],
            )
            .await;
        assert_eq!(p.status, 200, "{p:?}");
        assert!(
            p.text
                .contains(&format!("If person{i}@remote.test may subscribe"))
        );
    }
    assert_eq!(f.mail().await.len(), 3 + 5, "confirm_limit_per_client");
    let counted: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT key_kind, key, count FROM pepsi.list_confirm_rate r \
           JOIN pepsi.mailing_list l USING (list_id) \
          WHERE l.address = 'club@example.test' AND key_kind = 'client'",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(counted, vec![("client".into(), "127.0.0.1".into(), 20)]);
}

/// curl's POST, as RFC 8058 describes a mail provider's: `-d` sends the body with
/// Content-Type application/x-www-form-urlencoded.
fn curl_post(url: &str, body: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "-d", body, url])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let (page, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap(), page.to_owned())
}

#[tokio::test]
async fn one_click_unsubscribes_on_post_only_and_again_alike() {
    let f = fixture(true).await;
    let carol = f.add_member("team@example.test", "carol@remote.test").await;
    let dave = f.add_member("team@example.test", "dave@remote.test").await;
    // The tokens as the lists' contract makes them: the first 16 bytes of
    // sha256(secret || member_id), in hex; stored as sha256 of that text.
    let mut tokens = Vec::new();
    for member in [carol, dave] {
        let token: String = sqlx::query_scalar(
            "WITH s AS (INSERT INTO pepsi.list_secret (list_id, secret) \
                        SELECT list_id, sha256('test secret') FROM pepsi.list_member \
                         WHERE member_id = $1 ON CONFLICT (list_id) DO UPDATE SET list_id = EXCLUDED.list_id \
                        RETURNING secret), \
                  t AS (SELECT encode(substring(sha256(s.secret || int8send($1::bigint)) FROM 1 FOR 16), 'hex') AS token FROM s), \
                  i AS (INSERT INTO pepsi.list_unsubscribe_token (member_id, token_hash) \
                        SELECT $1, sha256(convert_to(token, 'UTF8')) FROM t) \
             SELECT token FROM t",
        )
        .bind(member)
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
        tokens.push(token);
    }
    let url = f.httpd.url(&format!("/lists/unsubscribe/{}", tokens[0]));

    let page = f.get(&format!("/lists/unsubscribe/{}", tokens[0])).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.text
            .contains("Remove carol@remote.test from team@example.test?")
            && page
                .text
                .contains("name=\"List-Unsubscribe\" value=\"One-Click\""),
        "{}",
        page.text
    );
    assert!(
        f.member("team@example.test", "carol@remote.test")
            .await
            .is_some()
    );

    let (code, text) = curl_post(&url, "List-Unsubscribe=One-Click");
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("no longer subscribed to team@example.test"),
        "{text}"
    );
    assert_eq!(
        f.member("team@example.test", "carol@remote.test").await,
        None
    );
    let events = f.events().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "member.unsubscribe");
    assert_eq!(events[0].1["via"], "one-click");
    // One goodbye, queued with the removal at the list's deliver stage.
    let mail = f.mail().await;
    assert_eq!(mail.len(), 1, "{mail:?}");
    assert_goodbye(&mail[0], "carol@remote.test");

    // Again: the same answer, nothing more logged or sent; the page says so too.
    let (code, again) = curl_post(&url, "List-Unsubscribe=One-Click");
    assert_eq!((code, again), (200, text));
    assert_eq!(f.events().await.len(), 1);
    assert_eq!(f.mail().await.len(), 1, "no second goodbye");
    let page = f.get(&format!("/lists/unsubscribe/{}", tokens[0])).await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("no longer subscribed"), "{}", page.text);

    // Another body is no one-click; unknown and malformed tokens are 404.
    let dave_url = f.httpd.url(&format!("/lists/unsubscribe/{}", tokens[1]));
    let (code, text) = curl_post(&dave_url, "unsubscribe=yes");
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("List-Unsubscribe=One-Click"), "{text}");
    assert!(
        f.member("team@example.test", "dave@remote.test")
            .await
            .is_some()
    );
    let (code, _) = curl_post(
        &f.httpd
            .url(&format!("/lists/unsubscribe/{}", "0".repeat(32))),
        "List-Unsubscribe=One-Click",
    );
    assert_eq!(code, 404);
    assert_eq!(f.get("/lists/unsubscribe/nonsense").await.status, 404);
    assert_eq!(f.mail().await.len(), 1, "no goodbye without a removal");
}

#[tokio::test]
async fn a_member_link_opens_a_page_that_changes_a_preference() {
    let f = fixture(true).await;
    let carol = f.add_member("team@example.test", "carol@remote.test").await;
    let other = f.add_member("club@example.test", "erin@remote.test").await;

    let asked = f
        .post(
            "/lists/team@example.test/manage",
            "address=carol%40remote.test",
            &[],
        )
        .await;
    assert_eq!(asked.status, 200, "{asked:?}");
    let neutral = |who: &str| format!("If {who} is subscribed to team@example.test");
    assert!(
        asked.text.contains(&neutral("carol@remote.test")),
        "{}",
        asked.text
    );
    // A stranger gets the same answer and nothing is sent.
    let stranger = f
        .post(
            "/lists/team@example.test/manage",
            "address=mallory%40remote.test",
            &[],
        )
        .await;
    assert_eq!(stranger.status, 200);
    assert!(stranger.text.contains(&neutral("mallory@remote.test")));
    let mail = f.mail().await;
    assert_eq!(mail.len(), 1, "{mail:?}");
    assert_eq!(mail[0].1, vec!["carol@remote.test".to_owned()]);
    let token = token_after(&mail[0].3, &format!("{WEB}/lists/member/"));
    assert_eq!(token.len(), 24, "{}", mail[0].3);
    let (life,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM expires_at - created_at)::float8 FROM pepsi.list_member_link",
    )
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(life, 86_400.0);

    let page = f.get(&format!("/lists/member/{token}")).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.text.contains("team@example.test") && !page.text.contains("club@example.test"),
        "{}",
        page.text
    );
    let csrf = token_after(&page.text, "name=\"csrf\" value=\"");
    assert_eq!(csrf.len(), 32, "{}", page.text);
    let path = format!("/lists/member/{token}");

    // Without the page's token: refused, nothing stored.
    let forged = f
        .post(
            &path,
            &format!("member={carol}&do=save&delivery_mode=mime_digest"),
            &[],
        )
        .await;
    assert_eq!(forged.status, 403, "{forged:?}");
    let saved = f
        .post(
            &path,
            &format!(
                "csrf={csrf}&member={carol}&do=save&delivery_mode=mime_digest&hide_address=on"
            ),
            &[],
        )
        .await;
    assert_eq!(saved.status, 200, "{saved:?}");
    assert!(
        saved
            .text
            .contains("Your choices for team@example.test are saved")
    );
    let prefs: (String, bool, bool) = sqlx::query_as(
        "SELECT delivery_mode, receive_own_postings, hide_address \
           FROM pepsi.list_member_preference WHERE member_id = $1",
    )
    .bind(carol)
    .fetch_one(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(prefs, ("mime_digest".into(), false, true));
    assert!(
        f.get(&path)
            .await
            .text
            .contains("<option value=\"mime_digest\" selected>"),
        "the page shows the choice"
    );
    let events = f.events().await;
    assert_eq!(events.last().unwrap().0, "member.preferences");
    assert_eq!(events.last().unwrap().1["delivery_mode"], "mime_digest");

    // Another person's subscription is out of the link's reach.
    let theirs = f
        .post(
            &path,
            &format!("csrf={csrf}&member={other}&do=unsubscribe"),
            &[],
        )
        .await;
    assert_eq!(theirs.status, 404, "{theirs:?}");
    assert!(
        f.member("club@example.test", "erin@remote.test")
            .await
            .is_some()
    );

    // The unsubscribe button.
    let gone = f
        .post(
            &path,
            &format!("csrf={csrf}&member={carol}&do=unsubscribe"),
            &[],
        )
        .await;
    assert_eq!(gone.status, 200, "{gone:?}");
    assert!(
        gone.text
            .contains("no longer subscribed to team@example.test")
    );
    assert_eq!(
        f.member("team@example.test", "carol@remote.test").await,
        None
    );
    // The link's mail, then one goodbye; pressed again, the button finds no member and
    // sends nothing.
    let mail = f.mail().await;
    assert_eq!(mail.len(), 2, "{mail:?}");
    assert_goodbye(&mail[1], "carol@remote.test");
    let again = f
        .post(
            &path,
            &format!("csrf={csrf}&member={carol}&do=unsubscribe"),
            &[],
        )
        .await;
    assert_eq!(again.status, 404, "{again:?}");
    assert_eq!(f.mail().await.len(), 2, "no second goodbye");
    assert_eq!(
        f.get("/lists/member/abcdefghijklmnopqrstuvwx").await.status,
        404
    );
}

#[tokio::test]
async fn bad_input_gets_its_error_page() {
    let f = fixture(true).await;
    let sub = "/lists/team@example.test/subscribe";
    let long_address = format!("address={}%40remote.test", "a".repeat(300));
    let long_name = format!("address=b%40remote.test&display_name={}", "n".repeat(201));
    let many: String = (0..17).map(|i| format!("f{i}=x&")).collect();
    /// Path, body, header fields, the status and what the page says.
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "/lists/nosuch@example.test/subscribe",
            "address=b%40remote.test".into(),
            vec![],
            404,
            "there is no list nosuch@example.test",
        ),
        (
            "/lists/not%20a%20list/subscribe",
            "address=b%40remote.test".into(),
            vec![],
            404,
            "there is no such list",
        ),
        (sub, "address=not-an-address".into(), vec![], 400, "address"),
        (sub, "".into(), vec![], 400, "no address"),
        (sub, long_address, vec![], 400, "longer than 254 characters"),
        (sub, long_name, vec![], 400, "longer than 200 characters"),
        (sub, many, vec![], 400, "more than 16 fields"),
        (
            sub,
            "address=b%40remote.test".into(),
            vec![("Origin", "https://evil.example")],
            403,
            "another site",
        ),
        (
            sub,
            "address=b%40remote.test".into(),
            vec![("Sec-Fetch-Site", "cross-site")],
            403,
            "another site",
        ),
    ];
    for (path, body, headers, status, says) in cases {
        let p = f.post(path, &body, &headers).await;
        assert_eq!(p.status, status, "{path} {body:?}: {p:?}");
        assert!(
            p.text.contains(says) && p.text.contains("<html"),
            "{path} {body:?} should say {says:?}: {}",
            p.text
        );
    }
    // Not a form at all.
    let json = f
        .client
        .post(f.httpd.url(sub))
        .header("Content-Type", "application/json")
        .body("{\"address\":\"b@remote.test\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(json.status().as_u16(), 415);
    assert!(json.text().await.unwrap().contains("is not a form"));
    // A browser's own form (same origin) is taken.
    let own = f
        .post(
            sub,
            "address=b%40remote.test",
            &[
                ("Origin", &f.httpd.url("")),
                ("Sec-Fetch-Site", "same-origin"),
            ],
        )
        .await;
    assert_eq!(own.status, 200, "{own:?}");
    assert_eq!(f.get("/lists/nosuch@example.test").await.status, 404);
    assert_eq!(f.get("/lists/confirm/short").await.status, 404);
    assert_eq!(f.mail().await.len(), 1, "only the last one was sent");
    // A closed list says so and sends nothing.
    sqlx::query("UPDATE pepsi.mailing_list SET subscription_policy = 'closed'")
        .execute(&f.db.pool)
        .await
        .unwrap();
    let closed = f.post(sub, "address=c%40remote.test", &[]).await;
    assert_eq!(closed.status, 403, "{closed:?}");
    assert!(closed.text.contains("takes no subscriptions"));
    assert_eq!(f.mail().await.len(), 1);
}

#[tokio::test]
async fn without_a_public_base_the_confirmation_asks_for_a_reply() {
    let f = fixture(false).await;
    let p = f
        .post(
            "/lists/team@example.test/subscribe",
            "address=bob%40remote.test",
            &[],
        )
        .await;
    assert_eq!(p.status, 200, "{p:?}");
    let mail = f.mail().await;
    assert_eq!(mail.len(), 1);
    let token = token_after(&mail[0].2, "Subject: confirm ");
    let body = &mail[0].3;
    assert!(!body.contains("http"), "{body}");
    assert!(
        body.contains(&format!("team-confirm+{token}@example.test")),
        "{body}"
    );
    // The pages still work, with relative links; the confirmation page too.
    assert!(
        f.get("/lists")
            .await
            .text
            .contains("action=\"/lists/team@example.test/subscribe\"")
    );
    assert_eq!(f.get(&format!("/lists/confirm/{token}")).await.status, 200);
    // A member's link needs the base.
    let link = f
        .post(
            "/lists/team@example.test/manage",
            "address=bob%40remote.test",
            &[],
        )
        .await;
    assert_eq!(link.status, 503, "{link:?}");
    assert!(link.text.contains("LIST_WEB_URL"));
}

/// A digest member who chooses regular delivery on the member page keeps their share of
/// the list's open digest (the posts collected so far, in the digest they took), as with
/// `pepsi-list set-mode`: the page's role records it (`list_digest_switch`).
#[tokio::test]
async fn leaving_digests_on_the_member_page_keeps_the_open_digests_posts() {
    let f = fixture(true).await;
    let carol = f.add_member("team@example.test", "carol@remote.test").await;
    sqlx::query(
        "INSERT INTO pepsi.list_member_preference (member_id, delivery_mode) \
         VALUES ($1, 'plain_digest')",
    )
    .bind(carol)
    .execute(&f.db.pool)
    .await
    .unwrap();
    // The list's open digest, with two posts collected.
    sqlx::query(
        "WITH d AS (INSERT INTO pepsi.list_digest (list_id, number) \
                    SELECT list_id, 1 FROM pepsi.mailing_list \
                    WHERE address = 'team@example.test' RETURNING digest_id) \
         INSERT INTO pepsi.list_digest_message (digest_id, position, sender, headers, body) \
         SELECT digest_id, p, 'reg@example.test', 'Subject: x\r\n'::bytea, 'x\r\n'::bytea \
         FROM d, generate_series(1, 2) p",
    )
    .execute(&f.db.pool)
    .await
    .unwrap();
    f.post(
        "/lists/team@example.test/manage",
        "address=carol%40remote.test",
        &[],
    )
    .await;
    let token = token_after(&f.mail().await[0].3, &format!("{WEB}/lists/member/"));
    let path = format!("/lists/member/{token}");
    let csrf = token_after(&f.get(&path).await.text, "name=\"csrf\" value=\"");
    let saved = f
        .post(
            &path,
            &format!("csrf={csrf}&member={carol}&do=save&delivery_mode=regular"),
            &[],
        )
        .await;
    assert_eq!(saved.status, 200, "{saved:?}");
    let share: Vec<(String, String)> = sqlx::query_as(
        "SELECT mode, regular::text FROM pepsi.list_digest_switch WHERE member_id = $1",
    )
    .bind(carol)
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(
        share,
        [("plain_digest".to_owned(), "{[3,)}".to_owned())],
        "posts 1 and 2 in a plain digest; from 3 on as copies"
    );
}
