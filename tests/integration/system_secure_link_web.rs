//! The acceptance of secure links, through the whole system and a real browser: alice
//! submits a message tagged `[secure]` after AUTH to bob at remote.test; the secure-link
//! stage keeps it sealed and bob's MX (a recording SMTP peer found through dnsmasq) gets a
//! notice without its subject or text; headless Chromium opens the notice's link, asks for
//! a code, reads it from the code mail at bob's MX, and only then sees the message and its
//! attachment; bob's reply from the portal reaches alice's Maildir; alice's receipt leads
//! to her page with the access log, where she sends bob a new link (the old one then shows
//! it was replaced) and withdraws it, after which the link shows a clear page and the
//! content is gone. A second message expires, with the same result.
//! The stored row alone does not decrypt.

use pepsi_secure_link::seal::{self, LinkHalf, Sealed};
use serde_json::Value;
use sqlx::Row as _;

use crate::support;
use crate::support::browser::Browser;
use crate::support::ingress::Dns;
use crate::support::system::System;

const WEB: &str = "https://mail.example.test";
const MARKER: &str = "The price is 4711 quinces";
const SUBJECT: &str = "Contract draft";

/// The first `{WEB}/secure/...` link in `text`, as a path.
fn link_in(text: &str, what: &str) -> String {
    let start = text
        .find(&format!("{WEB}/secure/"))
        .unwrap_or_else(|| panic!("no {what} link in:\n{text}"));
    let rest = &text[start + WEB.len()..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// The 8-digit code of a code mail.
fn code_in(text: &str) -> String {
    let body = &text[text.find("\r\n\r\n").expect("a body")..];
    body.split(|c: char| !c.is_ascii_digit())
        .find(|w| w.len() == 8)
        .unwrap_or_else(|| panic!("no code in:\n{text}"))
        .to_owned()
}

/// Opens `url` and waits until its page's text holds `needle`.
async fn open(browser: &Browser, url: &str, needle: &str) {
    browser.go(url).await;
    wait_text(browser, needle).await;
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

async fn page_text(browser: &Browser) -> String {
    browser
        .js("return document.body.innerText;")
        .await
        .as_str()
        .unwrap()
        .to_owned()
}

/// The sealed parts of the row of `link_id`.
async fn stored(sys: &System, link_id: &str) -> Option<Sealed> {
    let r = sqlx::query(
        "SELECT nonce, ciphertext, db_half FROM pepsi.secure_link_message WHERE link_id = $1",
    )
    .bind(link_id)
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    let part = |name: &str| r.get::<Option<Vec<u8>>, _>(name);
    Some(Sealed {
        nonce: part("nonce")?.try_into().unwrap(),
        ciphertext: part("ciphertext")?,
        db_half: part("db_half")?.try_into().unwrap(),
    })
}

/// Sends `subject` and `text` from alice (after AUTH) to bob@remote.test.
async fn submit(port: u16, subject: &str, text: &str) {
    let message = format!(
        "From: Alice <alice@example.test>\r\nTo: Bob <bob@remote.test>\r\n\
         Subject: {subject}\r\nMessage-ID: <{}@mua.example.test>\r\n\
         MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n\
         --b1\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}\r\n\
         --b1\r\nContent-Type: text/plain; name=\"terms.txt\"\r\n\
         Content-Disposition: attachment; filename=\"terms.txt\"\r\n\r\n\
         Delivery within 30 days.\r\n--b1--\r\n",
        subject.len() * 7 + text.len()
    );
    let reply = support::system::send_smtp_auth(
        port,
        ("alice@example.test", "pw"),
        "alice@example.test",
        &["bob@remote.test"],
        message.as_bytes(),
    )
    .await;
    assert!(reply.starts_with("250"), "{reply}");
}

#[tokio::test]
async fn a_secure_message_through_the_whole_system_in_chromium() {
    let (smtp_port, mut peers) =
        support::smtp_peer::start(&[("127.0.0.43", "mx.remote.test")]).await;
    let remote = peers.pop().unwrap();
    let dns = Dns::start(
        &[
            "--mx-host=remote.test,mx.remote.test,10",
            "--host-record=mx.remote.test,127.0.0.43",
        ]
        .map(String::from),
    );
    let http_port = support::free_port();
    let sub_port = support::free_port();
    // The configuration etc/pepsi.conf describes: remote mail passes the secure-link stage
    // before the remote branch; the portal's mail to bob starts there too (NEXT_STAGE), and
    // bob's reply to alice at init (RECEIPT_STAGE).
    let extra = format!(
        "[pepsi]\nSECURE_LINK_URL = {WEB}\n\n\
         [pepsi-httpd]\nADDRESS = 127.0.0.1:{http_port}\nALLOW_ROOT = yes\n\n\
         [pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
         [listener-sub]\nROLE = submission\nADDRESS = 127.0.0.1:{sub_port}\n\
         ALLOW_PLAINTEXT_AUTH = yes\n\n\
         [stage-route]\nROUTE_REMOTE = secure\n\n\
         [stage-secure]\nPROGRAM = pepsi-stage-secure-link\nNEXT_STAGE = remote\n\
         BOUNCE_STAGE = bounce\nRECEIPT_STAGE = init\n\n\
         [stage-relay]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\
         SMTP_PORT = {smtp_port}\nTLS = none\nIPV6 = no\nALLOW_INTERNAL_ADDRESSES = yes\n",
        dns = dns.port,
    );
    let mut sys = System::new(&extra, &["alice"]).await;
    sqlx::query("INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2)")
        .bind("alice@example.test")
        .bind(pepsi_ingress::accounts::hash_password(b"pw").unwrap())
        .execute(&sys.db.pool)
        .await
        .unwrap();
    sys.start().await;
    sys.start_httpd(http_port).await;
    let site = format!("http://127.0.0.1:{http_port}");

    // 1. The tagged message leaves as a notice: nothing of its subject or text in it.
    submit(sub_port, &format!("[secure] {SUBJECT}"), MARKER).await;
    let notice = sys.received(&remote, 1).await.remove(0);
    assert_eq!(notice.rcpt, ["bob@remote.test"]);
    let notice_text = String::from_utf8_lossy(&notice.data).into_owned();
    assert!(
        !notice_text.contains(MARKER) && !notice_text.contains(SUBJECT),
        "{notice_text}"
    );
    let path = link_in(&notice_text, "notice");
    let segments: Vec<&str> = path.trim_start_matches("/secure/").split('/').collect();
    let (link_id, half) = (segments[0].to_owned(), segments[2].to_owned());

    // 2. The stored row alone does not decrypt: no plaintext in it, and no half but the
    // link's opens it.
    let sealed = stored(&sys, &link_id).await.expect("a sealed row");
    let bytes = [&sealed.nonce[..], &sealed.ciphertext, &sealed.db_half].concat();
    assert!(!String::from_utf8_lossy(&bytes).contains("quinces"));
    for guess in [[0u8; 32], sealed.db_half] {
        assert!(seal::open(&link_id, &sealed, &LinkHalf::from_bytes(guess)).is_err());
    }
    let link_half =
        LinkHalf::parse(&half).unwrap_or_else(|e| panic!("{e}: {half:?} in {notice_text}"));
    let opened = seal::open(&link_id, &sealed, &link_half).unwrap();
    assert!(String::from_utf8_lossy(&opened).contains(MARKER));

    // 3. In the browser: nothing of the message before the code.
    let browser = Browser::start().await;
    open(&browser, &format!("{site}{path}"), "Mail me a code").await;
    assert!(!page_text(&browser).await.contains("quinces"));
    // A form of another site mails no code; a link with another half, a cut link and a
    // wrong sender's token are unknown.
    let client = support::httpd::client();
    let cross = client
        .post(format!("{site}{path}/code"))
        .header("Origin", "https://elsewhere.example")
        .header("Sec-Fetch-Site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    let other_half = LinkHalf::from_bytes([7; 32]).encode();
    for unknown in [
        format!("/secure/{link_id}/1/{other_half}"),
        format!("/secure/{link_id}/1/{}", &half[..20]),
        format!("/secure/manage/{link_id}/{}", "A".repeat(43)),
    ] {
        let r = client.get(format!("{site}{unknown}")).send().await.unwrap();
        assert_eq!(r.status(), 404, "{unknown}");
    }
    browser.click("#send-code").await;
    wait_text(&browser, "A code is on its way").await;
    let code_mail = sys.received(&remote, 2).await.remove(1);
    assert_eq!(code_mail.rcpt, ["bob@remote.test"]);
    assert_eq!(code_mail.mail_from, "", "a code comes from the null sender");
    let code = code_in(&String::from_utf8_lossy(&code_mail.data));

    // A wrong code first: refused, with the tries left.
    browser.type_into("#code", "00000000").await;
    browser.click("#verify").await;
    wait_text(&browser, "tries left").await;
    assert!(!page_text(&browser).await.contains("quinces"));
    browser.type_into("#code", &code).await;
    browser.click("#verify").await;
    wait_text(&browser, MARKER).await;
    let text = page_text(&browser).await;
    assert!(
        text.contains(SUBJECT) && text.contains("terms.txt"),
        "{text}"
    );

    // The attachment, with the browser's session cookie.
    let cookie: Value = browser
        .cmd(reqwest::Method::GET, "/cookie/pepsi_secure", Value::Null)
        .await;
    let href = browser
        .js("return document.querySelector('#attachments a').getAttribute('href');")
        .await;
    let download = support::httpd::client()
        .get(format!("{site}{}", href.as_str().unwrap()))
        .header(
            "Cookie",
            format!("pepsi_secure={}", cookie["value"].as_str().unwrap()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    assert!(
        download
            .headers()
            .get("content-disposition")
            .unwrap()
            .to_str()
            .unwrap()
            .contains("terms.txt")
    );
    assert_eq!(download.text().await.unwrap(), "Delivery within 30 days.");
    // Without the cookie, the code form and nothing else.
    let anonymous = support::httpd::client()
        .get(format!("{site}{}", href.as_str().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 403);
    assert!(!anonymous.text().await.unwrap().contains("Delivery"));

    // 4. Bob replies in the portal; alice gets it in her Maildir.
    browser
        .type_into("#reply", "Agreed, 4712 would be better though.")
        .await;
    browser.click("#send-reply").await;
    wait_text(&browser, "Your reply was sent to alice@example.test").await;
    let reply = sys.mail_with("alice", "4712 would be better").await;
    assert!(
        reply.contains(&format!("Subject: Re: {SUBJECT}")),
        "{reply}"
    );
    assert!(reply.contains("bob@remote.test"), "{reply}");

    // 5. Alice's receipt leads to her page: the access log, then the withdrawal.
    let receipt = sys.mail_with("alice", "/secure/manage/").await;
    assert!(!receipt.contains(&half), "the receipt carries no link half");
    let manage = link_in(&receipt, "manage");
    assert!(manage.contains(&link_id), "{manage}");
    open(&browser, &format!("{site}{manage}"), "Access log").await;
    let log = page_text(&browser).await;
    for event in [
        "created",
        "code_sent",
        "code_wrong",
        "session_opened",
        "opened",
        "attachment_downloaded",
        "reply_sent",
    ] {
        assert!(log.contains(event), "{event} missing from:\n{log}");
    }
    // A new link: mailed to bob; the old one shows it was replaced, the new one asks for
    // a code.
    browser.click("#resend").await;
    wait_text(&browser, "A new link is on its way to bob@remote.test").await;
    let renewed = sys.received(&remote, 3).await.remove(2);
    assert_eq!(renewed.rcpt, ["bob@remote.test"]);
    let renewed_text = String::from_utf8_lossy(&renewed.data).into_owned();
    assert!(!renewed_text.contains(MARKER), "{renewed_text}");
    let new_path = link_in(&renewed_text, "new");
    assert!(
        new_path.starts_with(&format!("/secure/{link_id}/2/")),
        "{new_path}"
    );
    open(
        &browser,
        &format!("{site}{path}"),
        "only the latest link works",
    )
    .await;
    assert!(!page_text(&browser).await.contains("quinces"));
    open(&browser, &format!("{site}{new_path}"), "Mail me a code").await;
    let path = new_path;

    open(&browser, &format!("{site}{manage}"), "Access log").await;
    browser.click("#revoke").await;
    wait_text(&browser, "The message is withdrawn").await;
    open(&browser, &format!("{site}{path}"), "withdrew this message").await;
    assert!(!page_text(&browser).await.contains("quinces"));
    let gone = support::httpd::client()
        .get(format!("{site}{path}"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 410);
    // The operator's purge of expired and revoked links deletes the content itself.
    let purge = sys
        .command(&pepsi_testkit::programs::program(
            "pepsi-secure-link",
            env!("CARGO_BIN_EXE_pepsi-secure-link"),
        ))
        .arg("purge")
        .output()
        .unwrap();
    assert!(purge.status.success(), "{purge:?}");
    assert!(
        stored(&sys, &link_id).await.is_none(),
        "the sealed parts are deleted"
    );

    // 6. A second message, expired: the same clear page, and its content unreadable.
    submit(sub_port, &format!("[secure] {SUBJECT} 2"), "second secret").await;
    let second = sys.received(&remote, 4).await.remove(3);
    let path2 = link_in(&String::from_utf8_lossy(&second.data), "second notice");
    let link2 = path2
        .trim_start_matches("/secure/")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    sqlx::query(
        "UPDATE pepsi.secure_link_message SET expires_at = now() - interval '1 second' \
          WHERE link_id = $1",
    )
    .bind(&link2)
    .execute(&sys.db.pool)
    .await
    .unwrap();
    open(&browser, &format!("{site}{path2}"), "This link has expired").await;
    assert!(!page_text(&browser).await.contains("second secret"));
}
