//! A list's archive through the real pepsi-httpd's admin API, as its own database role
//! (`pepsi-httpd`), over posts archived by `pepsi_archive::store::archive_post`: the summary
//! with the imports, search (a word, `from:` on a part of an address, a bad query 400), one
//! post with its parts and text, the mbox export by month, thread and whole (gunzipped by the
//! system's gzip and read back), purge by url id and by author in that list alone (gone from
//! search, with their archive_event_log and event_log rows, the administrator as actor), a
//! list without an archive, 400 naming bad input, 404 for what is not there, 401 without a
//! credential.

use std::io::Write as _;
use std::process::{Command, Stdio};

use chrono::Utc;
use pepsi_archive::mbox::{self, Format, Item};
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::httpd::{AsRole, Auth, Httpd};

const TEAM: &str = "team@example.test";
const OTHER: &str = "other@example.test";
const OFF: &str = "off@example.test";
const NO_POST: &str = "0123456789abcdef0123456789abcdef";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    auth: Auth,
    cookie: String,
}

async fn fixture() -> Fixture {
    let site =
        AsRole::new("[pepsi]\nLOCAL_DOMAINS = example.test\nHOSTNAME = mx.example.test\n").await;
    for (address, policy) in [(TEAM, "private"), (OTHER, "public"), (OFF, "none")] {
        sqlx::query(
            "INSERT INTO pepsi.mailing_list (address, archive_policy, confirm_window) \
             VALUES ($1, $2, '7 days')",
        )
        .bind(address)
        .bind(policy)
        .execute(&site.db.pool)
        .await
        .unwrap();
    }
    let (httpd, session) = site.start().await;
    Fixture {
        db: site.db,
        _dir: site.dir,
        httpd,
        cookie: session.cookie.clone(),
        auth: Auth::Session(session),
    }
}

impl Fixture {
    async fn list_id(&self, list: &str) -> i64 {
        sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list WHERE address = $1")
            .bind(list)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// Archives a post (`headers` without the blank line) in `list`; its url id.
    async fn archive(&self, list: &str, headers: &str, body: &str) -> String {
        let list_id = self.list_id(list).await;
        let mut tx = self.db.pool.begin().await.unwrap();
        let got = pepsi_archive::store::archive_post(
            &mut tx,
            list_id,
            headers.as_bytes(),
            body.as_bytes(),
            Utc::now(),
        )
        .await
        .unwrap()
        .expect("archived");
        tx.commit().await.unwrap();
        got.url_id
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let a = self.httpd.get(path, &self.auth).await;
        (a.status, a.json)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let a = self.httpd.post(path, &self.auth, &body).await;
        (a.status, a.json)
    }

    /// The url ids a search of TEAM finds, best first.
    async fn hits(&self, q: &str) -> Vec<String> {
        self.hits_in(TEAM, q).await
    }

    async fn hits_in(&self, list: &str, q: &str) -> Vec<String> {
        let path = format!("/api/lists/{list}/archive/search?q={}", encode(q));
        let (status, v) = self.get(&path).await;
        assert_eq!(status, 200, "{q}: {v}");
        v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["url_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// An export's answer: status, headers and the body's bytes.
    async fn download(&self, query: &str) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let r = support::httpd::client()
            .get(
                self.httpd
                    .url(&format!("/api/lists/{TEAM}/archive/export{query}")),
            )
            .header("Cookie", format!("pepsi_session={}", self.cookie))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        (status, headers, r.bytes().await.unwrap().to_vec())
    }

    /// The Message-IDs of an export, in its order, gunzipped by the system's gzip.
    async fn exported(&self, query: &str) -> Vec<String> {
        let (status, headers, body) = self.download(query).await;
        assert_eq!(status, 200, "{query}: {}", String::from_utf8_lossy(&body));
        assert_eq!(headers["content-type"], "application/gzip", "{query}");
        let mut gzip = Command::new("gzip")
            .arg("-dc")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        gzip.stdin.take().unwrap().write_all(&body).unwrap();
        let out = gzip.wait_with_output().unwrap();
        assert!(out.status.success(), "{query}: gzip refused the download");
        mbox::Reader::new(&out.stdout[..], Format::Mboxrd, 1 << 30)
            .map(|i| match i.unwrap() {
                Item::Message { raw, .. } => message_id_of(&raw),
                other => panic!("{other:?}"),
            })
            .collect()
    }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn message_id_of(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .lines()
        .find_map(|l| l.strip_prefix("Message-ID: "))
        .expect("a Message-ID")
        .trim()
        .to_owned()
}

/// A 400 or 404 answer whose error names `says`.
fn refused(got: (u16, Value), status: u16, says: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    let e = got.1["error"].as_str().unwrap_or_default();
    assert!(e.contains(says), "should say {says:?}: {}", got.1);
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn the_api_shows_searches_exports_and_purges_a_lists_archive() {
    let f = fixture().await;
    let budget = f
        .archive(
            TEAM,
            "From: Alice Smith <alice@example.net>\r\nSubject: Budget 2026\r\n\
             Message-ID: <budget@example.net>\r\nDate: Mon, 2 Mar 2026 10:00:00 +0000\r\n",
            "The budget is ready for review.\r\n",
        )
        .await;
    let reply = f
        .archive(
            TEAM,
            "From: Bob <bob@example.org>\r\nSubject: Re: Budget 2026\r\n\
             Message-ID: <reply@example.org>\r\nIn-Reply-To: <budget@example.net>\r\n\
             Date: Tue, 3 Mar 2026 09:00:00 +0000\r\n",
            "Thanks, the figures look fine.\r\n",
        )
        .await;
    let picnic = f
        .archive(
            TEAM,
            "From: Alice Smith <alice@example.net>\r\nSubject: Picnic\r\n\
             Message-ID: <picnic@example.net>\r\nDate: Wed, 1 Apr 2026 12:00:00 +0000\r\n\
             MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n",
            "--b\r\nContent-Type: text/plain\r\n\r\nBring sandwiches.\r\n--b\r\n\
             Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\
             Content-Disposition: attachment; filename=map.pdf\r\n\r\naGVsbG8=\r\n--b--\r\n",
        )
        .await;
    let minutes = f
        .archive(
            TEAM,
            "From: Carol <carol@example.com>\r\nSubject: Minutes\r\n\
             Message-ID: <minutes@example.com>\r\nDate: Sun, 5 Apr 2026 08:00:00 +0000\r\n",
            "The minutes of the meeting.\r\n",
        )
        .await;
    // Alice in another list: a purge of her posts in TEAM leaves it.
    let elsewhere = f
        .archive(
            OTHER,
            "From: alice@example.net\r\nSubject: Hello other\r\n\
             Message-ID: <other@example.net>\r\nDate: Thu, 2 Apr 2026 12:00:00 +0000\r\n",
            "Alice elsewhere.\r\n",
        )
        .await;
    sqlx::query(
        "INSERT INTO pepsi.archive_import \
         (list_id, file_name, started_by, finished_at, read, archived, duplicates, too_long) \
         VALUES ($1, 'old.mbox', 'olga', now(), 12, 10, 1, 1)",
    )
    .bind(f.list_id(TEAM).await)
    .execute(&f.db.pool)
    .await
    .unwrap();

    // The summary: counts, dates, the policy and the imports.
    let (status, v) = f.get(&format!("/api/lists/{TEAM}/archive")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["list"], TEAM);
    assert_eq!(v["archive_policy"], "private");
    assert_eq!(
        (&v["posts"], &v["threads"], &v["months"]),
        (&json!(4), &json!(3), &json!(2)),
        "{v}"
    );
    assert!(v["bytes"].as_i64().unwrap() > 300, "{v}");
    assert_eq!(v["first_post"], "2026-03-02T10:00:00Z");
    assert_eq!(v["last_post"], "2026-04-05T08:00:00Z");
    assert_eq!(v["imports"][0]["file_name"], "old.mbox");
    assert_eq!(v["imports"][0]["started_by"], "olga");
    assert_eq!(
        (&v["imports"][0]["read"], &v["imports"][0]["archived"]),
        (&json!(12), &json!(10))
    );
    assert_eq!(v["imports"][0]["too_long"], 1);
    // A list without an archive says so; reading its posts is 404.
    let (status, v) = f.get(&format!("/api/lists/{OFF}/archive")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["archive_policy"], &v["posts"]),
        (&json!("none"), &json!(0))
    );
    refused(
        f.get(&format!("/api/lists/{OFF}/archive/search?q=x")).await,
        404,
        "keeps no archive",
    );
    refused(
        f.get(&format!("/api/lists/{OFF}/archive/messages/{NO_POST}"))
            .await,
        404,
        "keeps no archive",
    );
    refused(
        f.get("/api/lists/nobody@example.test/archive").await,
        404,
        "there is no list nobody@example.test",
    );
    refused(
        f.get("/api/lists/no-at-sign/archive").await,
        400,
        "is not an address",
    );

    // Search: words, from: on any part of an address (the administrator sees them), limits.
    assert_eq!(
        sorted(f.hits("budget").await),
        sorted(vec![budget.clone(), reply.clone()])
    );
    assert_eq!(f.hits("from:example.org").await, [reply.as_str()]);
    assert_eq!(f.hits("sandwiches from:alice").await, [picnic.as_str()]);
    assert_eq!(f.hits("after:2026-04-03").await, [minutes.as_str()]);
    let (_, v) = f
        .get(&format!(
            "/api/lists/{TEAM}/archive/search?q=budget&limit=1"
        ))
        .await;
    assert_eq!(
        (&v["limit"], v["hits"].as_array().unwrap().len()),
        (&json!(1), 1)
    );
    let hit = &v["hits"][0];
    assert!(
        [&budget, &reply].contains(&&hit["url_id"].as_str().unwrap().to_owned()),
        "{v}"
    );
    assert!(hit["from_address"].as_str().unwrap().contains('@'), "{v}");
    assert!(hit["rank"].as_f64().unwrap() > 0.0, "{v}");
    let (_, v) = f
        .get(&format!("/api/lists/{TEAM}/archive/search?q=figures"))
        .await;
    assert_eq!(v["hits"][0]["from_address"], "bob@example.org", "{v}");
    assert_eq!(v["hits"][0]["subject"], "Re: Budget 2026");
    assert_eq!(v["hits"][0]["date"], "2026-03-03T09:00:00Z");
    for (query, says) in [
        ("?q=from%3A", "from: has no value"),
        ("?q=after%3Amarch", "is not a date"),
        ("?q=%22open", "a quotation mark is not closed"),
        ("?q=x&limit=0", "limit \"0\" is not valid: 1 to 200"),
        ("?q=x&limit=201", "limit \"201\""),
        ("?q=x&page=2", "unknown parameter \"page\""),
        ("", "q is required"),
    ] {
        refused(
            f.get(&format!("/api/lists/{TEAM}/archive/search{query}"))
                .await,
            400,
            says,
        );
    }

    // One post: its metadata, parts and text.
    let (status, v) = f
        .get(&format!("/api/lists/{TEAM}/archive/messages/{picnic}"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["url_id"], picnic.as_str());
    assert_eq!(v["message_id"], "picnic@example.net");
    assert_eq!(
        (&v["from_address"], &v["from_name"]),
        (&json!("alice@example.net"), &json!("Alice Smith"))
    );
    assert_eq!(v["subject"], "Picnic");
    assert!(
        v["text"].as_str().unwrap().starts_with("Bring sandwiches."),
        "{v}"
    );
    assert!(v.get("archive_id").is_none(), "{v}");
    let parts: Vec<(&str, Option<&str>)> = v["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["content_type"].as_str().unwrap(), p["file_name"].as_str()))
        .collect();
    assert_eq!(
        parts,
        [("text/plain", None), ("application/pdf", Some("map.pdf"))]
    );
    assert_eq!(v["parts"][1]["size"], 5, "the attachment's decoded size");
    let (_, v) = f
        .get(&format!("/api/lists/{TEAM}/archive/messages/{reply}"))
        .await;
    assert_eq!(v["parent_url_id"], budget.as_str(), "{v}");
    refused(
        f.get(&format!("/api/lists/{TEAM}/archive/messages/{NO_POST}"))
            .await,
        404,
        &format!("the archive of {TEAM} has no post {NO_POST}"),
    );
    refused(
        f.get(&format!("/api/lists/{TEAM}/archive/messages/nope"))
            .await,
        400,
        "\"nope\" is not a url id",
    );

    // The export: a month, a thread, everything, as gzip'ed mboxrd oldest first.
    let all = [
        "<budget@example.net>",
        "<reply@example.org>",
        "<picnic@example.net>",
        "<minutes@example.com>",
    ];
    assert_eq!(f.exported("?month=2026-03").await, all[..2]);
    assert_eq!(f.exported("?month=2026-04").await, all[2..]);
    assert_eq!(f.exported(&format!("?thread={reply}")).await, all[..2]);
    assert_eq!(f.exported("").await, all);
    assert!(f.exported("?month=2025-01").await.is_empty());
    let (_, headers, _) = f.download("?month=2026-03").await;
    assert_eq!(
        headers["content-disposition"],
        format!("attachment; filename=\"{TEAM}-2026-03.mbox.gz\"")
    );
    assert_eq!(headers["cache-control"], "private, no-store");
    for (query, status, says) in [
        ("?month=2026-13", 400, "month \"2026-13\" is not a month"),
        ("?month=2026-03&thread=x", 400, "not both"),
        ("?thread=nope", 400, "\"nope\" is not a url id"),
        ("?day=1", 400, "unknown parameter \"day\""),
        (&*format!("?thread={NO_POST}"), 404, "has no post"),
    ] {
        let (got, _, body) = f.download(query).await;
        let v: Value = serde_json::from_slice(&body).unwrap();
        refused((got, v), status, says);
    }

    // Purge one post: gone from search and export; a second time 404.
    let (status, v) = f
        .post(
            &format!("/api/lists/{TEAM}/archive/purge"),
            json!({"url_id": reply}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["purged"], json!([reply]));
    assert!(f.hits("figures").await.is_empty());
    assert_eq!(
        f.exported("").await,
        [all[0], all[2], all[3]],
        "the purged post is not exported"
    );
    refused(
        f.post(
            &format!("/api/lists/{TEAM}/archive/purge"),
            json!({"url_id": reply}),
        )
        .await,
        404,
        &format!("has no post {reply}"),
    );
    for (body, says) in [
        (json!({}), "give the url_id of a post, or the address"),
        (
            json!({"url_id": budget, "address": "a@example.net"}),
            "not both",
        ),
        (json!({"url_id": "nope"}), "\"nope\" is not a url id"),
        (
            json!({"address": "nobody"}),
            "address \"nobody\" is not an address",
        ),
        (json!({"id": budget}), "unknown field"),
    ] {
        refused(
            f.post(&format!("/api/lists/{TEAM}/archive/purge"), body)
                .await,
            400,
            says,
        );
    }

    // Purge by author, in this list alone.
    let (status, v) = f
        .post(
            &format!("/api/lists/{TEAM}/archive/purge"),
            json!({"address": "Alice@Example.net"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["purged"], 2, "{v}");
    assert_eq!(v["lists"], json!({TEAM: 2}));
    assert!(f.hits("from:alice").await.is_empty());
    assert!(f.hits("budget").await.is_empty());
    assert_eq!(f.hits_in(OTHER, "from:alice").await, [elsewhere]);
    refused(
        f.post(
            &format!("/api/lists/{TEAM}/archive/purge"),
            json!({"address": "alice@example.net"}),
        )
        .await,
        404,
        &format!("the archive of {TEAM} has no post by alice@example.net"),
    );
    let (_, v) = f.get(&format!("/api/lists/{TEAM}/archive")).await;
    assert_eq!(
        (&v["posts"], &v["threads"], &v["months"]),
        (&json!(1), &json!(1), &json!(1)),
        "{v}"
    );
    assert_eq!(f.exported("").await, [all[3]]);

    // Each purge is logged as the tool logs it, the administrator as actor, never the
    // address.
    let events: Vec<(String, String, Value)> = sqlx::query_as(
        "SELECT actor, event, detail FROM pepsi.archive_event_log ORDER BY event_id",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(
        events,
        [
            (
                "root".to_owned(),
                "purge.message".to_owned(),
                json!({"url_id": reply})
            ),
            (
                "root".to_owned(),
                "purge.address".to_owned(),
                json!({"posts": 2})
            ),
        ]
    );
    let audit: Vec<(String, Value)> = sqlx::query_as(
        "SELECT actor, detail FROM pepsi.event_log WHERE action = 'archive.purge' \
          ORDER BY event_id",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(
        audit
            .iter()
            .all(|(actor, d)| actor == "root" && d["tool"] == "pepsi-httpd")
    );
    assert_eq!(audit[0].1["url_ids"], json!([reply]));
    assert_eq!(
        (
            &audit[1].1["by_address"],
            &audit[1].1["posts"],
            &audit[1].1["list"]
        ),
        (&json!(true), &json!(2), &json!(TEAM))
    );
    assert!(!audit[1].1.to_string().contains("alice"), "{audit:?}");

    // A list that keeps no archive any more can still have what it kept purged.
    let kept = f
        .archive(
            OFF,
            "From: dave@example.net\r\nSubject: Old\r\nMessage-ID: <old@example.net>\r\n",
            "From before archive_policy none.\r\n",
        )
        .await;
    let (status, v) = f
        .post(
            &format!("/api/lists/{OFF}/archive/purge"),
            json!({"url_id": kept}),
        )
        .await;
    assert_eq!((status, &v["purged"]), (200, &json!([kept])), "{v}");

    // An API token reads it too; without a credential, nothing.
    let token = f.httpd.token_add("root", &[]);
    let a = f
        .httpd
        .get(&format!("/api/lists/{TEAM}/archive"), &Auth::Bearer(token))
        .await;
    assert_eq!((a.status, &a.json["posts"]), (200, &json!(1)), "{a:?}");
    for path in [
        "",
        "/search?q=x",
        "/export",
        &*format!("/messages/{minutes}"),
    ] {
        let a = f
            .httpd
            .get(&format!("/api/lists/{TEAM}/archive{path}"), &Auth::None)
            .await;
        assert_eq!(a.status, 401, "{path}: {a:?}");
    }
    let a = f
        .httpd
        .post(
            &format!("/api/lists/{TEAM}/archive/purge"),
            &Auth::None,
            &json!({"url_id": minutes}),
        )
        .await;
    assert_eq!(a.status, 401, "{a:?}");
    assert_eq!(f.hits("minutes").await, [minutes]);
}

/// The export is sent a batch of posts at a time (`pepsi_archive::export::BATCH`, 200): an
/// archive of several batches arrives whole and in order.
#[tokio::test]
async fn an_export_of_several_batches_arrives_whole() {
    let f = fixture().await;
    let list_id = f.list_id(TEAM).await;
    let mut tx = f.db.pool.begin().await.unwrap();
    let mut want = Vec::new();
    for i in 0..450 {
        let headers = format!(
            "From: user{}@example.net\r\nSubject: post {i}\r\nMessage-ID: <m{i}@example.net>\r\n\
             Date: Mon, 2 Mar 2026 {:02}:{:02}:00 +0000\r\n",
            i % 7,
            i / 60,
            i % 60
        );
        pepsi_archive::store::archive_post(
            &mut tx,
            list_id,
            headers.as_bytes(),
            format!("Text of post {i}, {}\r\n", "words ".repeat(50)).as_bytes(),
            Utc::now(),
        )
        .await
        .unwrap()
        .expect("archived");
        want.push(format!("<m{i}@example.net>"));
    }
    tx.commit().await.unwrap();
    assert_eq!(f.exported("").await, want);
    assert_eq!(f.exported("?month=2026-03").await, want);
}
