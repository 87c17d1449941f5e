//! The lists' archive pages of pepsi-httpd as a process (as its own database role) against
//! a real PostgreSQL, over HTTP, with posts archived by `pepsi_archive::store::archive_post`:
//! a thread with a placeholder in order, addresses hidden from anonymous readers, an HTML
//! post without its script under a CSP without script, search by word and `from:`, raw and
//! attachment downloads with their headers, Atom feeds an XML parser reads, and a private
//! archive read only after the login link mailed to a member is posted.

use chrono::Utc;
use pepsi_testkit::TestDb;

use crate::support::free_port;
use crate::support::httpd::{Httpd, write_config};

const WEB: &str = "https://lists.example.test";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    client: reqwest::Client,
}

#[derive(Debug)]
struct Page {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
}

async fn fixture() -> Fixture {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        &crate::support::httpd::url_as(&db.url, "pepsi-httpd"),
        port,
        &format!(
            "[pepsi]\nHOSTNAME = mx.example.test\nLOCAL_DOMAINS = example.test\n\
             LIST_WEB_URL = {WEB}\n\n\
             [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\n\
             [stage-deliver]\nPROGRAM = pepsi-stage-discard\n"
        ),
    );
    for (address, policy) in [
        ("pub@example.test", "public"),
        ("priv@example.test", "private"),
        ("off@example.test", "none"),
    ] {
        sqlx::query(
            "INSERT INTO pepsi.mailing_list (address, archive_policy, confirm_window) \
             VALUES ($1, $2, '7 days')",
        )
        .bind(address)
        .bind(policy)
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

impl Fixture {
    async fn list_id(&self, list: &str) -> i64 {
        sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list WHERE address = $1")
            .bind(list)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// Archives a post (`headers` without the blank line) and returns its url id.
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

    async fn get_with(&self, path: &str, cookie: Option<&str>) -> Page {
        let mut req = self.client.get(self.httpd.url(path));
        if let Some(c) = cookie {
            req = req.header("Cookie", c);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        Page {
            status,
            headers,
            text: r.text().await.unwrap(),
        }
    }

    async fn get(&self, path: &str) -> Page {
        self.get_with(path, None).await
    }

    async fn post(&self, path: &str, body: &str) -> Page {
        let r = self
            .client
            .post(self.httpd.url(path))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        Page {
            status,
            headers,
            text: r.text().await.unwrap(),
        }
    }

    /// The mail queued at `deliver`: (recipients, body text).
    async fn mail(&self) -> Vec<(Vec<String>, String)> {
        let rows: Vec<(Vec<String>, Vec<u8>, Vec<u8>)> = sqlx::query_as(
            "SELECT q.rcpt_to, q.headers, b.body FROM pepsi.workqueue q \
               JOIN pepsi.workqueue_body b USING (body_id) \
              WHERE q.stage = 'deliver' ORDER BY q.workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(r, h, b)| {
                let raw = [h.as_slice(), b"\r\n", b.as_slice()].concat();
                let text = mail_parser::MessageParser::default()
                    .parse(&raw)
                    .and_then(|m| m.body_text(0).map(|t| t.into_owned()))
                    .unwrap_or_default();
                (r, text)
            })
            .collect()
    }
}

impl Fixture {
    /// Makes `address` a member of `list` and logs it in by the mailed link, as a browser
    /// does: the session cookie (`pepsi_archive=...`).
    async fn log_in(&self, list: &str, address: &str) -> String {
        sqlx::query(
            "INSERT INTO pepsi.list_member (list_id, address, role) VALUES ($1, $2, 'member')",
        )
        .bind(self.list_id(list).await)
        .bind(address)
        .execute(&self.db.pool)
        .await
        .unwrap();
        let asked = self
            .post(
                &format!("/archive/{list}/login"),
                &format!("address={}", address.replace('@', "%40")),
            )
            .await;
        assert_eq!(asked.status, 200, "{asked:?}");
        let mail = self.mail().await;
        let text = &mail.last().expect("a login link mailed").1;
        let marker = format!("{WEB}/archive/{list}/login/");
        let start = at(text, &marker) + marker.len();
        let token: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let logged = self
            .post(&format!("/archive/{list}/login/{token}"), "")
            .await;
        assert_eq!(logged.status, 200, "{logged:?}");
        header(&logged, "set-cookie")
            .split(';')
            .next()
            .unwrap()
            .to_owned()
    }
}

fn header<'a>(p: &'a Page, name: &str) -> &'a str {
    p.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The position of `needle` in `text`, which must hold it.
fn at(text: &str, needle: &str) -> usize {
    text.find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in {text}"))
}

/// A public list's thread: a root, a reply, a reply to a post the archive never got.
async fn public_thread(f: &Fixture) -> (String, String, String) {
    let list = "pub@example.test";
    let root = f
        .archive(
            list,
            "From: Alice Example <alice@example.org>\r\nSubject: lunch plans\r\n\
             Date: Sun, 1 Mar 2026 10:00:00 +0000\r\nMessage-ID: <root@x.test>\r\n",
            "Shall we meet at noon? Ask carol@example.net too.\r\n",
        )
        .await;
    let late = f
        .archive(
            list,
            "From: bob@example.org\r\nSubject: Re: lunch plans\r\n\
             Date: Tue, 3 Mar 2026 10:00:00 +0000\r\nMessage-ID: <late@x.test>\r\n\
             In-Reply-To: <missing@x.test>\r\nReferences: <root@x.test> <missing@x.test>\r\n",
            "A zebra crossing is near.\r\n",
        )
        .await;
    let reply = f
        .archive(
            list,
            "From: Dora <dora@example.org>\r\nSubject: Re: lunch plans\r\n\
             Date: Mon, 2 Mar 2026 10:00:00 +0000\r\nMessage-ID: <reply@x.test>\r\n\
             In-Reply-To: <root@x.test>\r\nReferences: <root@x.test>\r\n",
            "Sounds good to me.\r\n",
        )
        .await;
    (root, reply, late)
}

/// A thread with a placeholder renders in order, as a tree, under the CSP, addresses
/// hidden from an anonymous reader; the list and month pages list it.
#[tokio::test]
async fn a_public_thread_renders_in_order_with_its_placeholder_and_hidden_addresses() {
    let f = fixture().await;
    let (root, reply, late) = public_thread(&f).await;
    let page = f
        .get(&format!("/archive/pub@example.test/thread/{late}"))
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    let csp = header(&page, "content-security-policy");
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("frame-ancestors 'none'")
            && !csp.contains("script-src"),
        "{csp}"
    );
    let t = &page.text;
    let order = [
        at(t, "Shall we meet at noon?"),
        at(t, "Sounds good to me."),
        at(t, "A message not in the archive"),
        at(t, "A zebra crossing is near."),
    ];
    assert!(order.is_sorted(), "{order:?} in {t}");
    assert!(t.contains(&format!("id=\"{root}\"")) && t.contains(&format!("id=\"{reply}\"")));
    assert!(
        t.contains("alice@ex…") && t.contains("carol@ex…") && t.contains("bob@ex…"),
        "{t}"
    );
    assert!(
        !t.contains("alice@example.org")
            && !t.contains("carol@example.net")
            && !t.contains("bob@example.org"),
        "{t}"
    );

    let index = f.get("/archive/pub@example.test").await;
    assert_eq!(index.status, 200, "{index:?}");
    assert!(
        index.text.contains("lunch plans")
            && index
                .text
                .contains("href=\"/archive/pub@example.test/2026-03\"")
            && index.text.contains("2026-03</a> (3)"),
        "{}",
        index.text
    );
    let month = f.get("/archive/pub@example.test/2026-03").await;
    assert_eq!(month.status, 200);
    assert!(month.text.contains("3 posts"), "{}", month.text);
    assert_eq!(f.get("/archive/pub@example.test/2026-13").await.status, 404);
    assert_eq!(f.get("/archive/off@example.test").await.status, 404);
    assert_eq!(f.get("/archive/nosuch@example.test").await.status, 404);
    assert_eq!(
        f.get("/archive/pub@example.test/thread/0123456789abcdef0123456789abcdef")
            .await
            .status,
        404
    );
}

/// An HTML-only post is shown sanitised: no script element, no remote image, links
/// nofollow; the page's CSP allows no script.
#[tokio::test]
async fn an_html_post_shows_no_script_and_carries_the_csp() {
    let f = fixture().await;
    let id = f
        .archive(
            "pub@example.test",
            "From: eve@example.org\r\nSubject: rich\r\nMessage-ID: <html@x.test>\r\n\
             Content-Type: text/html; charset=utf-8\r\n",
            "<p>Hello <b>bold</b> <a href=\"https://example.net/\">link</a></p>\
             <script>alert(1)</script><img src=\"https://tracker.test/p.gif\">\
             <p onclick=\"steal()\">x</p>\r\n",
        )
        .await;
    let page = f.get(&format!("/archive/pub@example.test/m/{id}")).await;
    assert_eq!(page.status, 200, "{page:?}");
    let t = &page.text;
    assert!(t.contains("<b>bold</b>"), "{t}");
    assert!(
        !t.to_lowercase().contains("<script")
            && !t.contains("alert(1)")
            && !t.contains("tracker.test")
            && !t.contains("onclick"),
        "{t}"
    );
    assert!(t.contains("rel=\"nofollow noopener noreferrer\""), "{t}");
    let csp = header(&page, "content-security-policy");
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    assert_eq!(header(&page, "x-content-type-options"), "nosniff");
}

/// Search finds a word of a post's body and an author by `from:`, and explains a query it
/// cannot read.
#[tokio::test]
async fn search_finds_a_body_word_and_an_author() {
    let f = fixture().await;
    let (root, _reply, late) = public_thread(&f).await;
    let hits = f.get("/archive/pub@example.test/search?q=zebra").await;
    assert_eq!(hits.status, 200, "{hits:?}");
    assert!(hits.text.contains(&format!("/m/{late}")), "{}", hits.text);
    assert!(!hits.text.contains(&format!("/m/{root}")), "{}", hits.text);
    let by = f
        .get("/archive/pub@example.test/search?q=from%3Aalice")
        .await;
    assert!(
        by.text.contains(&format!("/m/{root}")) && !by.text.contains(&format!("/m/{late}")),
        "{}",
        by.text
    );
    assert!(by.text.contains("from:alice"), "the syntax is explained");
    let bad = f
        .get("/archive/pub@example.test/search?q=after%3A2026")
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(
        bad.text.contains("The query cannot be read"),
        "{}",
        bad.text
    );
    let none = f
        .get("/archive/pub@example.test/search?q=nothingmatches")
        .await;
    assert!(none.text.contains("Nothing found."), "{}", none.text);
}

/// The raw post is text/plain, nosniff, inline; an attachment is an octet-stream download
/// with a safe file name, whatever type the post claims.
#[tokio::test]
async fn raw_and_part_downloads_have_safe_headers() {
    let f = fixture().await;
    let id = f
        .archive(
            "pub@example.test",
            "From: frank@example.org\r\nSubject: a script\r\nMessage-ID: <att@x.test>\r\n\
             MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n",
            "--b\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--b\r\n\
             Content-Type: text/html\r\nContent-Transfer-Encoding: base64\r\n\
             Content-Disposition: attachment; filename=\"../evil name.html\"\r\n\r\n\
             PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==\r\n--b--\r\n",
        )
        .await;
    let session = f.log_in("pub@example.test", "mem@example.test").await;
    let raw = f
        .get_with(
            &format!("/archive/pub@example.test/m/{id}/raw"),
            Some(&session),
        )
        .await;
    assert_eq!(raw.status, 200, "{raw:?}");
    assert_eq!(header(&raw, "content-type"), "text/plain; charset=utf-8");
    assert_eq!(header(&raw, "x-content-type-options"), "nosniff");
    assert_eq!(header(&raw, "cache-control"), "private, no-store");
    assert!(header(&raw, "content-disposition").starts_with("inline"));
    assert!(
        raw.text.contains("Subject: a script") && raw.text.contains("frank@example.org"),
        "{}",
        raw.text
    );

    let page = f
        .get_with(&format!("/archive/pub@example.test/m/{id}"), Some(&session))
        .await;
    assert!(page.text.contains("evil_name.html"), "{}", page.text);
    let n: i32 =
        sqlx::query_scalar("SELECT part_index FROM pepsi.archive_part WHERE file_name IS NOT NULL")
            .fetch_one(&f.db.pool)
            .await
            .unwrap();
    let part = f
        .get_with(
            &format!("/archive/pub@example.test/m/{id}/part/{n}"),
            Some(&session),
        )
        .await;
    assert_eq!(part.status, 200, "{part:?}");
    assert_eq!(header(&part, "cache-control"), "private, no-store");
    assert_eq!(header(&part, "content-type"), "application/octet-stream");
    assert_eq!(
        header(&part, "content-disposition"),
        "attachment; filename=\"evil_name.html\""
    );
    assert_eq!(header(&part, "x-content-type-options"), "nosniff");
    assert_eq!(part.text, "<script>alert(1)</script>");
    assert_eq!(
        f.get_with(
            &format!("/archive/pub@example.test/m/{id}/part/99"),
            Some(&session)
        )
        .await
        .status,
        404
    );
}

/// A post whose addresses hide in an encoded word, a base64 body and a forwarded message:
/// an anonymous reader of a public archive gets neither its raw bytes (403, members only)
/// nor its text or message parts (404), only its other attachments, never cached; a
/// member gets them all.
#[tokio::test]
async fn anonymous_readers_get_no_raw_post_and_no_text_or_message_part() {
    let f = fixture().await;
    let list = "pub@example.test";
    let id = f
        .archive(
            list,
            "From: =?utf-8?b?R3JhY2UgPGdyYWNlQGhpZGRlbi5vcmc+?= <grace@hidden.org>\r\n\
             Subject: leaks\r\nMessage-ID: <leak@x.test>\r\n\
             MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n",
            // The body says "write to grace@hidden.org" in base64.
            "--b\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n\
             d3JpdGUgdG8gZ3JhY2VAaGlkZGVuLm9yZw==\r\n--b\r\n\
             Content-Type: message/rfc822\r\n\
             Content-Disposition: attachment; filename=fwd.eml\r\n\r\n\
             From: heidi@hidden.org\r\nSubject: inner\r\n\r\nhi\r\n--b\r\n\
             Content-Type: text/plain\r\nContent-Disposition: attachment; filename=notes.txt\r\n\r\n\
             ivan@hidden.org\r\n--b\r\n\
             Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\
             Content-Disposition: attachment; filename=a.pdf\r\n\r\naGVsbG8=\r\n--b--\r\n",
        )
        .await;
    let parts: Vec<(i32, String, Option<String>)> = sqlx::query_as(
        "SELECT part_index, content_type, file_name FROM pepsi.archive_part ORDER BY part_index",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    let index = |ct: &str, named: bool| {
        parts
            .iter()
            .find(|p| p.1 == ct && p.2.is_some() == named)
            .unwrap_or_else(|| panic!("{ct} in {parts:?}"))
            .0
    };
    let (body, fwd, notes, pdf) = (
        index("text/plain", false),
        index("message/rfc822", true),
        index("text/plain", true),
        index("application/pdf", true),
    );
    let m = format!("/archive/{list}/m/{id}");

    let raw = f.get(&format!("{m}/raw")).await;
    assert_eq!(raw.status, 403, "{raw:?}");
    assert!(raw.text.contains("Members only"), "{}", raw.text);
    assert!(!raw.text.contains("d3JpdGUgdG8"), "{}", raw.text);
    for n in [body, fwd, notes] {
        let p = f.get(&format!("{m}/part/{n}")).await;
        assert_eq!(p.status, 404, "part {n}: {p:?}");
        assert!(!p.text.contains("hidden.org"), "part {n}: {}", p.text);
    }
    let pdf_part = f.get(&format!("{m}/part/{pdf}")).await;
    assert_eq!(pdf_part.status, 200, "{pdf_part:?}");
    assert_eq!(pdf_part.text, "hello");
    assert_eq!(header(&pdf_part, "cache-control"), "private, no-store");
    let page = f.get(&m).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(!page.text.contains(&format!("{m}/raw")), "{}", page.text);
    assert!(
        !page.text.contains(&format!("{m}/part/{notes}"))
            && page.text.contains(&format!("{m}/part/{pdf}")),
        "{}",
        page.text
    );

    let session = f.log_in(list, "mem@example.test").await;
    let raw = f.get_with(&format!("{m}/raw"), Some(&session)).await;
    assert_eq!(raw.status, 200, "{raw:?}");
    assert!(raw.text.contains("d3JpdGUgdG8"), "{}", raw.text);
    assert_eq!(header(&raw, "cache-control"), "private, no-store");
    let notes_part = f
        .get_with(&format!("{m}/part/{notes}"), Some(&session))
        .await;
    assert_eq!(notes_part.status, 200, "{notes_part:?}");
    assert!(notes_part.text.contains("ivan@hidden.org"));
    let fwd_part = f.get_with(&format!("{m}/part/{fwd}"), Some(&session)).await;
    assert_eq!(fwd_part.status, 200, "{fwd_part:?}");
    assert!(fwd_part.text.contains("heidi@hidden.org"));
    // The text body is shown on the page, never a download.
    assert_eq!(
        f.get_with(&format!("{m}/part/{body}"), Some(&session))
            .await
            .status,
        404
    );
}

/// `from:` for an anonymous reader matches the author's name or whole address, never a
/// part of the address (which would spell a hidden domain out); a member's matches a part.
#[tokio::test]
async fn anonymous_from_search_matches_no_part_of_an_address() {
    let f = fixture().await;
    let list = "pub@example.test";
    let id = f
        .archive(
            list,
            "From: Judy Smith <judy@secretdomain.org>\r\nSubject: hi\r\n\
             Message-ID: <judy@x.test>\r\n",
            "hello\r\n",
        )
        .await;
    let hit = |p: &Page| p.text.contains(&format!("/m/{id}"));
    let search = |q: &str| format!("/archive/{list}/search?q=from%3A{q}");
    for q in ["secretd", "judy%40s", "%40secretdomain.or"] {
        let p = f.get(&search(q)).await;
        assert_eq!(p.status, 200, "{p:?}");
        assert!(!hit(&p), "from:{q} matched: {}", p.text);
    }
    for q in [
        "judy",
        "smith",
        "judy%40secretdomain.org",
        "JUDY%40SecretDomain.org",
    ] {
        let p = f.get(&search(q)).await;
        assert!(hit(&p), "from:{q} did not match: {}", p.text);
    }
    let session = f.log_in(list, "mem@example.test").await;
    let p = f.get_with(&search("secretd"), Some(&session)).await;
    assert!(hit(&p), "a member's from: matches a part: {}", p.text);
}

/// A long thread is shown 100 nodes a page with a link to the next; a very long post is
/// cut in the thread with a link to its own page, which shows it whole.
#[tokio::test]
async fn a_long_thread_is_paged_and_a_long_post_cut() {
    let f = fixture().await;
    let list = "pub@example.test";
    let long = format!("{}THE-END\r\n", "lorem ipsum dolor\r\n".repeat(5000));
    let root = f
        .archive(
            list,
            "From: a@example.org\r\nSubject: long\r\nMessage-ID: <r@long.test>\r\n\
             Date: Sun, 1 Mar 2026 10:00:00 +0000\r\n",
            &long,
        )
        .await;
    for i in 0..110 {
        f.archive(
            list,
            &format!(
                "From: b@example.org\r\nSubject: Re: long\r\nMessage-ID: <{i}@long.test>\r\n\
                 Date: Mon, 2 Mar 2026 10:{:02}:{:02} +0000\r\n\
                 In-Reply-To: <r@long.test>\r\nReferences: <r@long.test>\r\n",
                i / 60,
                i % 60
            ),
            &format!("reply number {i:03}\r\n"),
        )
        .await;
    }
    let t = format!("/archive/{list}/thread/{root}");
    let first = f.get(&t).await;
    assert_eq!(first.status, 200, "{first:?}");
    let articles = |p: &Page| p.text.matches("<article").count();
    assert_eq!(articles(&first), 100);
    assert!(first.text.contains("reply number 098") && !first.text.contains("reply number 099"));
    assert!(!first.text.contains("THE-END"), "the long post is cut");
    assert!(
        first
            .text
            .contains(&format!("href=\"/archive/{list}/m/{root}\">the whole post")),
        "{}",
        &first.text[first.text.len().saturating_sub(3000)..]
    );
    assert!(
        first.text.contains(&format!("{t}?page=2")),
        "a link to the next page"
    );
    let second = f.get(&format!("{t}?page=2")).await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(articles(&second), 11);
    assert!(second.text.contains("reply number 109") && !second.text.contains("reply number 098"));
    assert!(second.text.contains(&format!("{t}?page=1")));
    assert_eq!(f.get(&format!("{t}?page=0")).await.status, 400);
    assert_eq!(f.get(&format!("{t}?page=x")).await.status, 400);
    let whole = f.get(&format!("/archive/{list}/m/{root}")).await;
    assert!(
        whole.text.contains("THE-END"),
        "the post's page shows it whole"
    );
}

/// Reads an Atom document with Python's XML parser: the entries' titles, or the error.
fn atom_titles(xml: &str) -> Vec<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E\n\
             r = E.fromstring(sys.stdin.buffer.read())\n\
             a = '{http://www.w3.org/2005/Atom}'\n\
             assert r.tag == a + 'feed', r.tag\n\
             for e in r.findall(a + 'entry'): print(e.find(a + 'title').text)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(xml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{xml}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The feeds of a public archive parse as XML and list the posts; a private archive has
/// none.
#[tokio::test]
async fn atom_feeds_parse_and_list_the_posts() {
    let f = fixture().await;
    let (_root, _reply, late) = public_thread(&f).await;
    f.archive(
        "pub@example.test",
        "From: gina@example.org\r\nSubject: <tags> & \"quotes\"\r\n\
         Date: Wed, 4 Mar 2026 10:00:00 +0000\r\nMessage-ID: <other@x.test>\r\n",
        "text with \u{1} a control & <markup>\r\n",
    )
    .await;
    let feed = f.get("/archive/pub@example.test/atom").await;
    assert_eq!(feed.status, 200, "{feed:?}");
    assert_eq!(
        header(&feed, "content-type"),
        "application/atom+xml; charset=utf-8"
    );
    assert_eq!(
        atom_titles(&feed.text),
        [
            "<tags> & \"quotes\"",
            "Re: lunch plans",
            "Re: lunch plans",
            "lunch plans"
        ]
    );
    assert!(!feed.text.contains("gina@example.org"), "{}", feed.text);
    let thread = f
        .get(&format!("/archive/pub@example.test/thread/{late}/atom"))
        .await;
    assert_eq!(thread.status, 200);
    assert_eq!(atom_titles(&thread.text).len(), 3);
    assert_eq!(f.get("/archive/priv@example.test/atom").await.status, 404);
    assert_eq!(f.get("/archive/off@example.test/atom").await.status, 404);
}

/// A private archive answers 403 with the login form; a non-member's request sends
/// nothing, a member's mails a link whose GET only shows a button and whose POST sets the
/// cookie that reads the archive with addresses shown, once; a member who left reads no
/// more.
#[tokio::test]
async fn a_private_archive_is_read_by_a_member_logged_in_by_the_mailed_link() {
    let f = fixture().await;
    let list = "priv@example.test";
    let id = f
        .archive(
            list,
            "From: Hal <hal@example.org>\r\nSubject: members only\r\nMessage-ID: <p@x.test>\r\n",
            "secret plans\r\n",
        )
        .await;
    let list_id = f.list_id(list).await;
    sqlx::query("INSERT INTO pepsi.list_member (list_id, address, role) VALUES ($1, $2, 'member')")
        .bind(list_id)
        .bind("mem@example.test")
        .execute(&f.db.pool)
        .await
        .unwrap();

    for path in [
        format!("/archive/{list}"),
        format!("/archive/{list}/m/{id}"),
        format!("/archive/{list}/m/{id}/raw"),
        format!("/archive/{list}/thread/{id}"),
        format!("/archive/{list}/search?q=secret"),
    ] {
        let p = f.get(&path).await;
        assert_eq!(p.status, 403, "{path}: {p:?}");
        assert!(!p.text.contains("secret plans"), "{path}");
        assert!(
            p.text
                .contains(&format!("action=\"/archive/{list}/login\"")),
            "{path}: {}",
            p.text
        );
    }

    let stranger = f
        .post(
            &format!("/archive/{list}/login"),
            "address=stranger%40example.test",
        )
        .await;
    assert_eq!(stranger.status, 200, "{stranger:?}");
    assert!(
        stranger
            .text
            .contains("If stranger@example.test is a member")
    );
    assert!(f.mail().await.is_empty(), "a non-member is sent nothing");

    let asked = f
        .post(
            &format!("/archive/{list}/login"),
            "address=mem%40example.test",
        )
        .await;
    assert_eq!(asked.status, 200, "{asked:?}");
    assert!(asked.text.contains("If mem@example.test is a member"));
    let mail = f.mail().await;
    assert_eq!(mail.len(), 1, "{mail:?}");
    assert_eq!(mail[0].0, ["mem@example.test"]);
    let marker = format!("{WEB}/archive/{list}/login/");
    let start = at(&mail[0].1, &marker) + marker.len();
    let token: String = mail[0].1[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let link = format!("/archive/{list}/login/{token}");

    // A link scanner's GET logs nobody in.
    let shown = f.get(&link).await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert!(shown.headers.get("set-cookie").is_none());
    assert!(
        shown.text.contains(&format!("action=\"{link}\"")),
        "{}",
        shown.text
    );

    let logged = f.post(&link, "").await;
    assert_eq!(logged.status, 200, "{logged:?}");
    let cookie = header(&logged, "set-cookie").to_owned();
    for part in [
        "HttpOnly",
        "SameSite=Lax",
        "Secure",
        &format!("Path=/archive/{list}"),
    ] {
        assert!(cookie.contains(part), "{part} in {cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();
    assert!(session.starts_with("pepsi_archive="), "{session}");
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT token_hash FROM pepsi.archive_reader")
        .fetch_all(&f.db.pool)
        .await
        .unwrap();
    let secret = session.trim_start_matches("pepsi_archive=");
    assert_eq!(stored.len(), 1, "the used link is gone, the session stays");
    assert_ne!(stored[0], secret.as_bytes(), "only a digest is stored");

    let read = f
        .get_with(&format!("/archive/{list}/m/{id}"), Some(&session))
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert!(
        read.text.contains("secret plans") && read.text.contains("hal@example.org"),
        "a member sees the addresses: {}",
        read.text
    );
    assert_eq!(f.post(&link, "").await.status, 404, "a link works once");
    assert_eq!(
        f.get_with(&format!("/archive/{list}"), Some("pepsi_archive=0000"))
            .await
            .status,
        403
    );

    sqlx::query("DELETE FROM pepsi.list_member WHERE address = 'mem@example.test'")
        .execute(&f.db.pool)
        .await
        .unwrap();
    let after = f
        .get_with(&format!("/archive/{list}/m/{id}"), Some(&session))
        .await;
    assert_eq!(after.status, 403, "a member who left reads no more");
}
