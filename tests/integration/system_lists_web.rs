//! The acceptance of moderation on the web, through the whole system and a real browser: a
//! nonmember's post arrives over SMTP at the shipped graph and is held by the list stage; a
//! moderator asks for a link on the list's page in headless Chromium (Debian's `chromium`,
//! driven through Debian's `chromedriver` over the W3C WebDriver protocol), the link arrives
//! in the moderator's Maildir, the browser opens it and clicks Approve, and the post reaches
//! every member's Maildir as the list copy. Without chromium or chromedriver the test fails
//! and says which package to install (scripts/apt-packages.txt lists both).

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::browser::Browser;
use crate::support::free_port;
use crate::support::system::System;

const WAIT: Duration = Duration::from_secs(30);

/// alice, bob and carol are the list's members, dave its moderator, olga its owner; erin
/// is on no list.
const USERS: &[&str] = &["alice", "bob", "carol", "dave", "erin", "olga"];

/// The text of the element `css` selects, once the page shows it.
async fn text(browser: &Browser, css: &str) -> String {
    let css = serde_json::to_string(css).unwrap();
    let v = browser
        .until(
            &format!("the element {css}"),
            &format!(
                "const el = document.querySelector({css}); return el ? el.textContent : null;"
            ),
        )
        .await;
    v.as_str().unwrap_or_default().to_owned()
}

/// Runs pepsi-list with the system's configuration; it must succeed.
fn pepsi_list(sys: &System, args: &[&str]) {
    let tool = pepsi_testkit::programs::program("pepsi-list", env!("CARGO_BIN_EXE_pepsi-list"));
    let out = sys
        .command(&tool)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pepsi-list {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_nonmembers_post_held_and_approved_by_a_moderator_in_chromium_is_delivered() {
    let http_port = free_port();
    let extra = format!(
        "[pepsi]\nLIST_WEB_URL = https://lists.example.test\n\n\
         [pepsi-httpd]\nADDRESS = 127.0.0.1:{http_port}\nALLOW_ROOT = yes\n"
    );
    let mut sys = System::new(&extra, USERS).await;
    pepsi_list(
        &sys,
        &[
            "create",
            "team@example.test",
            "--display-name",
            "The Team",
            "--owner",
            "olga@example.test",
        ],
    );
    pepsi_list(
        &sys,
        &[
            "add",
            "team@example.test",
            "alice@example.test",
            "bob@example.test",
            "carol@example.test",
        ],
    );
    pepsi_list(
        &sys,
        &[
            "add",
            "team@example.test",
            "dave@example.test",
            "--role",
            "moderator",
        ],
    );
    sys.start().await;
    sys.start_httpd(http_port).await;

    // erin is on no list: her post is held (nonmember_action = hold).
    let post = "From: erin@example.test\r\nTo: team@example.test\r\nSubject: may I?\r\n\
                Message-ID: <erin-1@example.test>\r\n\r\nA question from outside.\r\n";
    let reply = sys
        .send("erin@example.test", &["team@example.test"], post.as_bytes())
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let until = Instant::now() + WAIT;
    let held: i64 = loop {
        let id: Option<i64> =
            sqlx::query_scalar("SELECT held_id FROM pepsi.list_held_message LIMIT 1")
                .fetch_optional(&sys.db.pool)
                .await
                .unwrap();
        if let Some(id) = id {
            break id;
        }
        assert!(
            Instant::now() < until,
            "the post was not held:\n{}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for member in ["alice", "bob", "carol"] {
        assert!(
            sys.messages(member).is_empty(),
            "{member} got the held post"
        );
    }

    // dave asks for a link in the browser; it arrives in his Maildir.
    let browser = Browser::start().await;
    let site = format!("http://127.0.0.1:{http_port}");
    browser
        .go(&format!("{site}/moderate/team@example.test"))
        .await;
    browser.type_into("#address", "dave@example.test").await;
    browser.click("#send").await;
    let answer = text(&browser, "#message").await;
    assert!(answer.contains("a link"), "{answer}");
    let mail = sys.wait_messages("dave", 1, WAIT).await;
    let link_mail = String::from_utf8_lossy(&mail[0]).into_owned();
    let prefix = "https://lists.example.test/moderate/link/";
    let at = link_mail
        .find(prefix)
        .unwrap_or_else(|| panic!("a link in dave's mail:\n{link_mail}"));
    let token: String = link_mail[at + prefix.len()..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();

    // The link (LIST_WEB_URL is the public name of this pepsi-httpd): the held post, and
    // Approve clicked.
    browser.go(&format!("{site}/moderate/link/{token}")).await;
    let sender = text(&browser, &format!("#held-{held} .sender")).await;
    assert_eq!(sender, "erin@example.test");
    let subject = text(&browser, &format!("#held-{held} .subject")).await;
    assert_eq!(subject, "may I?");
    browser.click(&format!("#approve-{held}")).await;
    let notice = text(&browser, "#notice").await;
    assert!(notice.contains("approved"), "{notice}");
    assert_eq!(
        text(&browser, "#no-held").await,
        "No post waits for a moderator."
    );

    // Delivered to every member after the approval, as the list copy.
    for member in ["alice", "bob", "carol"] {
        let got = sys.wait_messages(member, 1, WAIT).await;
        let text = String::from_utf8_lossy(&got[0]).into_owned();
        assert!(text.contains("Subject: may I?"), "{member}:\n{text}");
        assert!(
            text.contains("A question from outside."),
            "{member}:\n{text}"
        );
        assert!(
            text.contains("List-Id: \"The Team\" <team.example.test>"),
            "{member}:\n{text}"
        );
    }
    sys.wait_empty(WAIT).await;
    for member in ["alice", "bob", "carol"] {
        assert_eq!(sys.messages(member).len(), 1, "{member}: one copy");
    }
    let actor: String =
        sqlx::query_scalar("SELECT actor FROM pepsi.list_event_log WHERE event = 'post.approve'")
            .fetch_one(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(actor, "dave@example.test");
    drop(browser);
}
