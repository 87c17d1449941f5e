//! The acceptance of the lists' archive, through the whole system and a real browser:
//! posts arrive over SMTP at the shipped graph, the list stage archives them, pepsi-httpd
//! serves the archive and headless Chromium (Debian's `chromium` through its
//! `chromedriver`, as in `system_lists_web`) reads it. A public list's thread shows its
//! posts in order with a placeholder for a parent never sent to the list; the browser's
//! search finds a post by a word of its body and by `from:`; an HTML-only post's script and
//! `onerror` image do not run; a private archive refuses an anonymous reader and opens for a
//! member after the login link mailed to the member's Maildir; a post purged is gone from
//! the thread page, the search and the Atom feed: purged by the operator tool
//! (`pepsi-archive purge LIST URL_ID --yes`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::browser::Browser;
use crate::support::free_port;
use crate::support::system::System;

const WAIT: Duration = Duration::from_secs(30);

/// alice, bob and carol are the members of the public list team@; dave is the member of
/// the private list inner@.
const USERS: &[&str] = &["alice", "bob", "carol", "dave"];

const PUBLIC: &str = "team@example.test";
const PRIVATE: &str = "inner@example.test";
const WEB: &str = "https://lists.example.test";

/// Runs the operator tool `name` (built as `built`) with the system's configuration; it
/// must succeed. Returns its standard output.
fn tool(sys: &System, name: &str, built: &str, args: &[&str]) -> String {
    let program = pepsi_testkit::programs::program(name, built);
    let out = sys
        .command(&program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pepsi_list(sys: &System, args: &[&str]) {
    tool(sys, "pepsi-list", env!("CARGO_BIN_EXE_pepsi-list"), args);
}

/// Sends `message` from `from` to `list` over SMTP and waits until the list stage has
/// archived it (its Message-ID `<mid>` in pepsi.archive_message); returns its url id.
async fn post(sys: &System, from: &str, list: &str, mid: &str, message: &str) -> String {
    let reply = sys.send(from, &[list], message.as_bytes()).await;
    assert!(reply.starts_with("250"), "{reply}");
    let url_id = pepsi_archive::url::url_id(mid).unwrap();
    let until = Instant::now() + WAIT;
    loop {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pepsi.archive_message WHERE url_id = $1")
                .bind(&url_id)
                .fetch_one(&sys.db.pool)
                .await
                .unwrap();
        if n == 1 {
            return url_id;
        }
        assert!(
            Instant::now() < until,
            "{mid} was not archived:\n{}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plain HTTP GET: status, Content-Security-Policy, body.
async fn get(url: &str) -> (u16, String, String) {
    let r = crate::support::httpd::client()
        .get(url)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let csp = r
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, csp, r.text().await.unwrap())
}

/// Opens `url` and waits until its page's text holds `needle` (the load finished).
async fn open(browser: &Browser, url: &str, needle: &str) {
    browser.go(url).await;
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

/// The thread page's articles in the DOM's order: (depth, text).
async fn articles(browser: &Browser) -> Vec<(u64, String)> {
    let v = browser
        .js(
            "return Array.from(document.querySelectorAll('article.post'))\
             .map(a => [Number(a.dataset.depth), a.innerText]);",
        )
        .await;
    v.as_array()
        .unwrap()
        .iter()
        .map(|a| (a[0].as_u64().unwrap(), a[1].as_str().unwrap().to_owned()))
        .collect()
}

/// The hrefs of the search page's hits, in order.
async fn hits(browser: &Browser) -> Vec<String> {
    let v = browser
        .js("return Array.from(document.querySelectorAll('ol.hits a'))\
             .map(a => a.getAttribute('href'));")
        .await;
    v.as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_owned())
        .collect()
}

/// Types `q` into the search form of the page shown and submits it; waits for the answer.
async fn search_in_form(browser: &Browser, q: &str) {
    browser.type_into("form.search input[name=q]", q).await;
    browser.click("form.search button[type=submit]").await;
    let q = serde_json::to_string(q).unwrap();
    browser
        .until(
            &format!("the hits of {q}"),
            &format!(
                "return document.readyState === 'complete' \
                 && new URLSearchParams(location.search).get('q') === {q} \
                 && (document.querySelector('ol.hits') !== null);"
            ),
        )
        .await;
}

#[tokio::test]
async fn the_archive_through_the_whole_system_in_chromium() {
    let http_port = free_port();
    let extra = format!(
        "[pepsi]\nLIST_WEB_URL = {WEB}\n\n\
         [pepsi-httpd]\nADDRESS = 127.0.0.1:{http_port}\nALLOW_ROOT = yes\n"
    );
    let mut sys = System::new(&extra, USERS).await;
    pepsi_list(&sys, &["create", PUBLIC, "--display-name", "The Team"]);
    pepsi_list(&sys, &["configure", PUBLIC, "archive_policy=public"]);
    pepsi_list(
        &sys,
        &[
            "add",
            PUBLIC,
            "alice@example.test",
            "bob@example.test",
            "carol@example.test",
        ],
    );
    pepsi_list(&sys, &["create", PRIVATE]);
    pepsi_list(&sys, &["configure", PRIVATE, "archive_policy=private"]);
    pepsi_list(&sys, &["add", PRIVATE, "dave@example.test"]);
    sys.start().await;
    sys.start_httpd(http_port).await;
    let site = format!("http://127.0.0.1:{http_port}");

    // 1. A thread over SMTP: a post, a reply, and a reply to a message the list never got.
    let root = post(
        &sys,
        "alice@example.test",
        PUBLIC,
        "<root@mua.example.test>",
        "From: Alice <alice@example.test>\r\nTo: team@example.test\r\n\
         Subject: lunch plans\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\n\
         Message-ID: <root@mua.example.test>\r\n\r\nShall we meet at noon?\r\n",
    )
    .await;
    let reply = post(
        &sys,
        "bob@example.test",
        PUBLIC,
        "<reply@mua.example.test>",
        "From: Bob <bob@example.test>\r\nTo: team@example.test\r\n\
         Subject: Re: lunch plans\r\nDate: Wed, 2 Dec 2026 10:00:00 +0000\r\n\
         Message-ID: <reply@mua.example.test>\r\nIn-Reply-To: <root@mua.example.test>\r\n\
         References: <root@mua.example.test>\r\n\r\nSounds good, I bring a quince tart.\r\n",
    )
    .await;
    let late = post(
        &sys,
        "carol@example.test",
        PUBLIC,
        "<late@mua.example.test>",
        "From: Carol <carol@example.test>\r\nTo: team@example.test\r\n\
         Subject: Re: lunch plans\r\nDate: Thu, 3 Dec 2026 10:00:00 +0000\r\n\
         Message-ID: <late@mua.example.test>\r\nIn-Reply-To: <aside@mua.example.test>\r\n\
         References: <root@mua.example.test> <aside@mua.example.test>\r\n\r\n\
         A zebra crossing is near the place.\r\n",
    )
    .await;

    let browser = Browser::start().await;
    open(
        &browser,
        &format!("{site}/archive/{PUBLIC}/thread/{late}"),
        "A zebra crossing",
    )
    .await;
    let shown = articles(&browser).await;
    assert_eq!(shown.len(), 4, "{shown:#?}");
    assert!(
        shown[0].0 == 0 && shown[0].1.contains("Shall we meet at noon?"),
        "{shown:#?}"
    );
    assert!(
        shown[1].0 == 1 && shown[1].1.contains("quince tart"),
        "{shown:#?}"
    );
    assert!(
        shown[2].0 == 1 && shown[2].1.trim() == "A message not in the archive",
        "{shown:#?}"
    );
    assert!(
        shown[3].0 == 2 && shown[3].1.contains("A zebra crossing"),
        "{shown:#?}"
    );
    // An anonymous reader sees the authors' addresses shortened.
    assert!(
        shown[0].1.contains("alice@ex…") && !shown[0].1.contains("alice@example.test"),
        "{shown:#?}"
    );

    // 2. The search form finds a word of a body, and an author by from:.
    open(&browser, &format!("{site}/archive/{PUBLIC}"), "lunch plans").await;
    browser.click("nav a[href$='/search']").await;
    browser
        .until(
            "the search form",
            "return document.querySelector('form.search input[name=q]') !== null;",
        )
        .await;
    search_in_form(&browser, "zebra").await;
    assert_eq!(
        hits(&browser).await,
        [format!("/archive/{PUBLIC}/m/{late}")]
    );
    open(
        &browser,
        &format!("{site}/archive/{PUBLIC}/search?q=from%3Aalice"),
        "Search the archive",
    )
    .await;
    assert_eq!(
        hits(&browser).await,
        [format!("/archive/{PUBLIC}/m/{root}")]
    );

    // 3. An HTML-only post whose script and onerror image would change the page.
    let rich = post(
        &sys,
        "bob@example.test",
        PUBLIC,
        "<rich@mua.example.test>",
        "From: Bob <bob@example.test>\r\nTo: team@example.test\r\nSubject: rich mail\r\n\
         Date: Fri, 4 Dec 2026 10:00:00 +0000\r\nMessage-ID: <rich@mua.example.test>\r\n\
         MIME-Version: 1.0\r\nContent-Type: text/html; charset=utf-8\r\n\r\n\
         <html><body><p>Hello from the <b>rich</b> side.</p>\r\n\
         <script>document.title='owned';var s=document.createElement('div');\
         s.id='owned-by-script';document.body.appendChild(s);</script>\r\n\
         <img src=\"/nothing-here.png\" onerror=\"document.title='owned';\
         var i=document.createElement('div');i.id='owned-by-image';\
         document.body.appendChild(i);\">\r\n</body></html>\r\n",
    )
    .await;
    let rich_page = format!("{site}/archive/{PUBLIC}/m/{rich}");
    open(&browser, &rich_page, "side.").await;
    let state = browser
        .js("return {title: document.title, \
             script: document.getElementById('owned-by-script') !== null, \
             image: document.getElementById('owned-by-image') !== null, \
             bold: (document.querySelector('div.html b') || {}).textContent || null, \
             scripts: document.querySelectorAll('script').length};")
        .await;
    assert_eq!(state["title"], "rich mail · Archive", "{state}");
    assert_eq!(state["script"], false, "{state}");
    assert_eq!(state["image"], false, "{state}");
    assert_eq!(state["scripts"], 0, "{state}");
    assert_eq!(
        state["bold"], "rich",
        "the post's own markup is shown: {state}"
    );
    let (status, csp, _) = get(&rich_page).await;
    assert_eq!(status, 200);
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp:?}"
    );

    // 4. A private archive: refused to an anonymous reader, opened by the mailed link.
    let secret = post(
        &sys,
        "dave@example.test",
        PRIVATE,
        "<secret@mua.example.test>",
        "From: Dave <dave@example.test>\r\nTo: inner@example.test\r\n\
         Subject: members only\r\nDate: Sat, 5 Dec 2026 10:00:00 +0000\r\n\
         Message-ID: <secret@mua.example.test>\r\n\r\nThe secret plans are ready.\r\n",
    )
    .await;
    let private_thread = format!("{site}/archive/{PRIVATE}/thread/{secret}");
    let (status, _, body) = get(&private_thread).await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("secret plans"), "{body}");
    open(&browser, &private_thread, "Mail me a link").await;
    let text = browser.js("return document.body.innerText;").await;
    assert!(!text.as_str().unwrap().contains("secret plans"), "{text}");
    browser
        .type_into("form.login input[name=address]", "dave@example.test")
        .await;
    browser.click("form.login button[type=submit]").await;
    browser
        .until(
            "the answer to the request for a link",
            "const m = document.getElementById('message'); \
             return m && m.textContent.includes('If dave@example.test is a member');",
        )
        .await;
    let prefix = format!("{WEB}/archive/{PRIVATE}/login/");
    let mail = sys.mail_with("dave", &prefix).await;
    let at = mail.find(&prefix).unwrap();
    let token: String = mail[at + prefix.len()..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    assert!(!token.is_empty(), "{mail}");
    // LIST_WEB_URL is the public name of this pepsi-httpd.
    open(
        &browser,
        &format!("{site}/archive/{PRIVATE}/login/{token}"),
        "Open the archive",
    )
    .await;
    browser.click("form.login button[type=submit]").await;
    browser
        .until(
            "the login",
            "const m = document.getElementById('message'); \
             return m && m.textContent.includes('as dave@example.test');",
        )
        .await;
    open(&browser, &private_thread, "The secret plans are ready.").await;
    let shown = articles(&browser).await;
    assert_eq!(shown.len(), 1, "{shown:#?}");
    assert!(
        shown[0].1.contains("dave@example.test"),
        "a member sees the addresses: {shown:#?}"
    );

    // 5. The reply purged: gone from the thread page, the search and the feed.
    let feed_url = format!("{site}/archive/{PUBLIC}/atom");
    let (status, _, feed) = get(&feed_url).await;
    assert_eq!(status, 200);
    assert!(feed.contains(&reply), "the feed lists the reply: {feed}");
    open(
        &browser,
        &format!("{site}/archive/{PUBLIC}/search?q=quince"),
        "Search the archive",
    )
    .await;
    assert_eq!(
        hits(&browser).await,
        [format!("/archive/{PUBLIC}/m/{reply}")]
    );
    let purged = tool(
        &sys,
        "pepsi-archive",
        env!("CARGO_BIN_EXE_pepsi-archive"),
        &["purge", PUBLIC, &reply, "--yes"],
    );
    assert!(
        purged.contains("purged 1 post from the archive of team@example.test"),
        "{purged}"
    );

    open(
        &browser,
        &format!("{site}/archive/{PUBLIC}/thread/{root}"),
        "A zebra crossing",
    )
    .await;
    let shown = articles(&browser).await;
    assert!(
        shown.iter().all(|(_, t)| !t.contains("quince")),
        "{shown:#?}"
    );
    // Between the root and the last reply only placeholders are left (the parent never
    // sent, and the purged post's if the thread kept its place).
    assert!(
        (3..=4).contains(&shown.len())
            && shown[1..shown.len() - 1]
                .iter()
                .all(|(_, t)| t.trim() == "A message not in the archive"),
        "{shown:#?}"
    );
    assert!(
        shown[0].1.contains("Shall we meet at noon?")
            && shown.last().unwrap().1.contains("A zebra crossing"),
        "{shown:#?}"
    );
    let reply_link = browser
        .js(&format!(
            "return document.querySelector('a[href$=\"/m/{reply}\"]') !== null;"
        ))
        .await;
    assert_eq!(reply_link, Value::Bool(false), "{shown:#?}");
    open(
        &browser,
        &format!("{site}/archive/{PUBLIC}/search?q=quince"),
        "Nothing found.",
    )
    .await;
    assert!(hits(&browser).await.is_empty());
    let (status, _, feed) = get(&feed_url).await;
    assert_eq!(status, 200);
    assert!(
        !feed.contains(&reply) && !feed.contains("quince") && feed.contains(&late),
        "{feed}"
    );
    drop(browser);
}
