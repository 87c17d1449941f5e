//! A member's life on a list through the whole system, on the shipped graph with real SMTP
//! (the issue's acceptance): bob subscribes by mail and confirms; alice posts; bob's copy
//! reaches his Maildir and dan's leaves through the real relay to his domain's MX (a scripted
//! SMTP peer found through dnsmasq) with the List-* fields, his own one-click link and a DKIM
//! signature dkimpy verifies over them; dan leaves with `curl`'s RFC 8058 POST to pepsi-httpd
//! and gets one goodbye at his MX, bob by mail (`-leave`, confirmed); the next post reaches
//! alice alone.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support;
use crate::support::ingress::Dns;
use crate::support::system::{System, split};

const WAIT: Duration = Duration::from_secs(60);
const WEB: &str = "https://lists.example.test";

fn pepsi_list(sys: &System, args: &[&str]) {
    let tool = pepsi_testkit::programs::program("pepsi-list", env!("CARGO_BIN_EXE_pepsi-list"));
    let out = sys.command(&tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "pepsi-list {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first `name:` field of a message's header block, unfolded and trimmed.
fn field(message: &[u8], name: &str) -> Option<String> {
    let headers = String::from_utf8_lossy(split(message).0).into_owned();
    let unfolded = headers.replace("\r\n ", " ").replace("\r\n\t", " ");
    unfolded.split("\r\n").find_map(|line| {
        let (n, value) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

async fn members(sys: &System) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT m.address FROM pepsi.list_member m WHERE m.role = 'member' ORDER BY m.address",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap()
}

/// Waits for one message more in `user`'s Maildir than `before` holds and returns it
/// (Maildir names need not sort by arrival).
async fn wait_new(sys: &System, user: &str, before: &[Vec<u8>]) -> Vec<u8> {
    let now = sys.wait_messages(user, before.len() + 1, WAIT).await;
    let mut new: Vec<Vec<u8>> = now.into_iter().filter(|m| !before.contains(m)).collect();
    assert_eq!(new.len(), 1, "one new message for {user}");
    new.pop().unwrap()
}

/// bob writes `subject` to `to`.
async fn from_bob(sys: &System, to: &str, subject: &str) {
    let message =
        format!("From: bob@example.test\r\nTo: {to}\r\nSubject: {subject}\r\n\r\n{subject}\r\n");
    let reply = sys
        .send("bob@example.test", &[to], message.as_bytes())
        .await;
    assert!(reply.starts_with("250"), "{to}: {reply}");
}

/// The token of a confirmation: its Reply-To is `team-confirm+<token>@example.test`.
fn confirm_address(confirmation: &[u8]) -> String {
    let reply_to = field(confirmation, "Reply-To").expect("a confirmation has a Reply-To");
    let address = reply_to.trim_start_matches('<').trim_end_matches('>');
    assert!(
        address.starts_with("team-confirm+") && address.ends_with("@example.test"),
        "{address}"
    );
    address.to_owned()
}

#[tokio::test]
async fn subscribe_post_and_leave_by_one_click_and_by_mail_through_the_whole_system() {
    let (smtp_port, mut peers) =
        support::smtp_peer::start(&[("127.0.0.47", "mx.remote.test")]).await;
    let remote = peers.pop().unwrap();
    let dns = Dns::start(
        &[
            "--mx-host=remote.test,mx.remote.test,10",
            "--host-record=mx.remote.test,127.0.0.47",
        ]
        .map(String::from),
    );
    let http_port = support::free_port();
    let extra = format!(
        "[pepsi]\nLIST_WEB_URL = {WEB}\n\n\
         [pepsi-httpd]\nADDRESS = 127.0.0.1:{http_port}\nALLOW_ROOT = yes\n\n\
         [pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
         [stage-lists]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
         [stage-relay]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\
         SMTP_PORT = {smtp_port}\nTLS = none\nIPV6 = no\nALLOW_INTERNAL_ADDRESSES = yes\n",
        dns = dns.port,
    );
    let mut sys = System::new(&extra, &["alice", "bob"]).await;
    pepsi_list(
        &sys,
        &["create", "team@example.test", "--display-name", "The Team"],
    );
    pepsi_list(
        &sys,
        &[
            "add",
            "team@example.test",
            "alice@example.test",
            "dan@remote.test",
        ],
    );
    sys.start().await;
    sys.start_httpd(http_port).await;

    // bob subscribes by mail: a confirmation, answered by a reply to its Reply-To.
    from_bob(&sys, "team-join@example.test", "subscribe").await;
    let confirmation = wait_new(&sys, "bob", &[]).await;
    let confirm = confirm_address(&confirmation);
    let before = sys.messages("bob");
    from_bob(&sys, &confirm, "Re: confirm").await;
    let welcome = wait_new(&sys, "bob", &before).await;
    assert_eq!(
        field(&welcome, "Subject").as_deref(),
        Some("Welcome to team@example.test")
    );
    assert_eq!(
        members(&sys).await,
        ["alice@example.test", "bob@example.test", "dan@remote.test"]
    );

    // alice posts: bob's copy in his Maildir, dan's at his MX, each with the list's fields.
    let post = "From: alice@example.test\r\nTo: team@example.test\r\nSubject: lunch\r\n\
                Message-ID: <lunch@example.test>\r\n\r\nNoon at the usual place.\r\n";
    let before = sys.messages("bob");
    let reply = sys
        .send(
            "alice@example.test",
            &["team@example.test"],
            post.as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let bobs = wait_new(&sys, "bob", &before).await;
    let dans = sys.received(&remote, 1).await.remove(0);
    assert_eq!(dans.rcpt, ["dan@remote.test"]);
    assert_eq!(
        dans.mail_from, "team+bounces-dan=remote.test@example.test",
        "dan's VERP return path"
    );
    for (who, copy) in [("bob", &bobs), ("dan", &dans.data)] {
        assert_eq!(
            field(copy, "List-Id").as_deref(),
            Some("\"The Team\" <team.example.test>"),
            "{who}"
        );
        assert_eq!(
            field(copy, "List-Post").as_deref(),
            Some("<mailto:team@example.test>"),
            "{who}"
        );
        assert_eq!(
            field(copy, "List-Unsubscribe-Post").as_deref(),
            Some("List-Unsubscribe=One-Click"),
            "{who}"
        );
        assert_eq!(field(copy, "Precedence").as_deref(), Some("list"), "{who}");
    }
    let link = |copy: &[u8]| -> String {
        let value = field(copy, "List-Unsubscribe").expect("List-Unsubscribe");
        let https = value
            .split(',')
            .map(|u| u.trim().trim_start_matches('<').trim_end_matches('>'))
            .find(|u| u.starts_with(&format!("{WEB}/lists/unsubscribe/")))
            .unwrap_or_else(|| panic!("a one-click link in {value}"))
            .to_owned();
        assert!(
            value.contains("<mailto:team-leave@example.test>"),
            "{value}"
        );
        https
    };
    let (bob_link, dan_link) = (link(&bobs), link(&dans.data));
    assert_ne!(bob_link, dan_link, "each member's own link");

    // dan's copy is signed by example.test over the one-click fields; dkimpy verifies it.
    let signature = field(&dans.data, "DKIM-Signature").expect("a DKIM signature");
    let h: Vec<String> = signature
        .split(';')
        .map(str::trim)
        .find_map(|t| t.strip_prefix("h="))
        .unwrap()
        .split(':')
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    for name in [
        "list-unsubscribe",
        "list-unsubscribe-post",
        "from",
        "subject",
    ] {
        assert!(h.contains(&name.to_owned()), "{name} in {h:?}");
    }
    let key = sys.dir.path().join("keys/example.test.pepsi.pem");
    let public = sys.dir.path().join("keys/example.test.pepsi.pub.der");
    let derived = Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public)
        .status()
        .unwrap();
    assert!(derived.success(), "openssl pkey -pubout");
    let keys = json!({"pepsi._domainkey.example.test": ["rsa", public]});
    const VERIFY: &str = r#"
try:
    ok = bool(dkim.DKIM(msg).verify(dnsfunc=dnsfunc))
except dkim.ValidationError as e:
    print(e, file=sys.stderr)
    ok = False
print(json.dumps(ok))
"#;
    assert_eq!(
        support::dkimpy(VERIFY, &keys, &dans.data),
        json!(true),
        "dkimpy verifies dan's copy:\n{}",
        String::from_utf8_lossy(&dans.data)
    );

    // dan leaves by one click: curl POSTs the RFC 8058 body to his link (this pepsi-httpd
    // answers for LIST_WEB_URL).
    let local = dan_link.replace(WEB, &format!("http://127.0.0.1:{http_port}"));
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-d", "List-Unsubscribe=One-Click", &local])
        .output()
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        sys.log("httpd.log")
    );
    assert_eq!(
        members(&sys).await,
        ["alice@example.test", "bob@example.test"]
    );
    let goodbye = sys.received(&remote, 2).await.remove(1);
    assert_eq!(goodbye.rcpt, ["dan@remote.test"]);
    assert_eq!(goodbye.mail_from, "team-bounces@example.test");
    assert_eq!(
        field(&goodbye.data, "Subject").as_deref(),
        Some("You have left team@example.test")
    );
    let text = String::from_utf8_lossy(split(&goodbye.data).1).into_owned();
    assert!(
        text.contains("team-join@example.test")
            && text.contains(&format!("{WEB}/lists/team@example.test")),
        "{text}"
    );

    // bob leaves by mail: -leave, then his reply to the confirmation.
    let before = sys.messages("bob");
    from_bob(&sys, "team-leave@example.test", "unsubscribe").await;
    let confirmation = wait_new(&sys, "bob", &before).await;
    let confirm = confirm_address(&confirmation);
    let before = sys.messages("bob");
    from_bob(&sys, &confirm, "Re: confirm").await;
    let goodbye = wait_new(&sys, "bob", &before).await;
    assert_eq!(
        field(&goodbye, "Subject").as_deref(),
        Some("You have left team@example.test")
    );
    assert_eq!(members(&sys).await, ["alice@example.test"]);

    // The next post reaches alice alone.
    let alices = sys.messages("alice").len();
    let post = post.replace("lunch", "dinner");
    let reply = sys
        .send(
            "alice@example.test",
            &["team@example.test"],
            post.as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_messages("alice", alices + 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(sys.messages("bob").len(), 5, "bob had nothing more");
    assert_eq!(
        remote.messages().len(),
        2,
        "dan had his goodbye, nothing more"
    );
}
