//! STARTTLS, implicit TLS and AUTH against the account store with a test CA, and real
//! clients: Python's smtplib (STARTTLS + AUTH) and swaks each deliver into the queue.

use std::process::Command;

use crate::support;
use crate::support::ingress::{Client, Ingress, TestCa, row};

const SUBMISSION: &str = "ROLE = submission\nTLS_CERT = {cert}\nTLS_KEY = {key}\n";
const SUBMISSIONS: &str = "ROLE = submissions\nTLS_CERT = {cert}\nTLS_KEY = {key}\n";
const MX_TLS: &str = "ROLE = mx\nVERIFY = no\nTLS_CERT = {cert}\nTLS_KEY = {key}\n";

fn ca(ingress: &Ingress) -> TestCa {
    let dir = ingress.dir.path();
    TestCa {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    }
}

#[tokio::test]
async fn starttls_then_auth_plain_and_login_submit_to_any_domain() {
    let ingress = Ingress::start("", &[("submission", SUBMISSION)]).await;
    ingress.add_account("alice@example.test", "s3cret").await;
    let ca = ca(&ingress);
    let mut c = Client::connect(ingress.port("submission")).await;
    let ehlo = c.ok("EHLO laptop.example", 250).await;
    assert!(ehlo.lines().any(|l| l == "STARTTLS"), "{ehlo}");
    assert!(!ehlo.contains("AUTH"), "AUTH offered before TLS: {ehlo}");
    c.ok("STARTTLS", 220).await;
    let mut c = c.tls(&ca).await;
    let ehlo = c.ok("EHLO laptop.example", 250).await;
    assert!(ehlo.lines().any(|l| l == "AUTH PLAIN LOGIN"), "{ehlo}");
    assert!(!ehlo.contains("STARTTLS"), "{ehlo}");
    // LOGIN with the user name in mixed case: account names are matched without case.
    assert_eq!(c.cmd("AUTH LOGIN").await, (334, "VXNlcm5hbWU6".into()));
    assert_eq!(
        c.cmd("QWxpY2VARXhhbXBsZS5URVNU").await,
        (334, "UGFzc3dvcmQ6".into())
    );
    let (code, text) = c.cmd("czNjcmV0").await;
    assert_eq!(code, 235, "{text}");
    let id = c
        .deliver(
            "alice@example.test",
            &["friend@elsewhere.example"],
            b"From: alice@example.test\r\nSubject: out\r\n\r\nhi\r\n",
        )
        .await;
    let r = row(&ingress.db, id).await;
    assert_eq!(r.auth_user.as_deref(), Some("alice@example.test"));
    assert_eq!(r.rcpt_to, ["friend@elsewhere.example"]);
    let origin = &r.state["origin"];
    assert_eq!(origin["auth_user"], "alice@example.test");
    assert_eq!(origin["listener"], "submission");
    assert!(
        matches!(
            origin["tls"]["version"].as_str(),
            Some("TLSv1.3" | "TLSv1.2")
        ),
        "{origin}"
    );
    assert!(
        origin["tls"]["cipher"]
            .as_str()
            .is_some_and(|c| c.starts_with("TLS")),
        "{origin}"
    );
    let headers = String::from_utf8_lossy(&r.headers);
    assert!(
        headers.contains("with ESMTPSA\r\n\t(using TLSv1."),
        "{headers}"
    );

    // PLAIN with an initial response, on a second connection.
    let mut c = Client::connect(ingress.port("submission")).await;
    c.ok("EHLO laptop.example", 250).await;
    c.ok("STARTTLS", 220).await;
    let mut c = c.tls(&ca).await;
    c.ok("EHLO laptop.example", 250).await;
    c.ok("AUTH PLAIN AGFsaWNlQGV4YW1wbGUudGVzdABzM2NyZXQ=", 235)
        .await;
    c.ok("AUTH PLAIN AGFsaWNlQGV4YW1wbGUudGVzdABzM2NyZXQ=", 503)
        .await;
}

#[tokio::test]
async fn implicit_tls_and_an_mx_listener_offering_starttls() {
    let ingress = Ingress::start("", &[("submissions", SUBMISSIONS), ("mx", MX_TLS)]).await;
    ingress.add_account("alice@example.test", "pw").await;
    let ca = ca(&ingress);
    let mut c = Client::connect_tls(ingress.port("submissions"), &ca).await;
    let ehlo = c.ok("EHLO laptop.example", 250).await;
    assert!(
        ehlo.contains("AUTH PLAIN LOGIN") && !ehlo.contains("STARTTLS"),
        "{ehlo}"
    );
    c.ok("MAIL FROM:<alice@example.test>", 530).await;
    c.ok("AUTH PLAIN AGFsaWNlQGV4YW1wbGUudGVzdABwdw==", 235)
        .await;
    let id = c
        .deliver(
            "alice@example.test",
            &["bob@example.test"],
            b"From: alice@example.test\r\nSubject: 465\r\n\r\nx\r\n",
        )
        .await;
    assert_eq!(
        row(&ingress.db, id).await.state["origin"]["listener"],
        "submissions"
    );

    let mut m = Client::connect(ingress.port("mx")).await;
    m.ok("EHLO relay.example", 250).await;
    m.ok("STARTTLS", 220).await;
    let mut m = m.tls(&ca).await;
    let ehlo = m.ok("EHLO relay.example", 250).await;
    assert!(!ehlo.contains("AUTH"), "{ehlo}");
    m.ok("STARTTLS", 503).await;
    let id = m
        .deliver(
            "bob@example.org",
            &["alice@example.test"],
            b"Subject: 25\r\n\r\nx\r\n",
        )
        .await;
    let r = row(&ingress.db, id).await;
    assert!(String::from_utf8_lossy(&r.headers).contains("with ESMTPS\r\n"));
}

#[tokio::test]
async fn unknown_local_users_are_refused_when_recipients_are_checked() {
    let ingress = Ingress::start(
        "CHECK_RECIPIENTS = yes\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    ingress.add_account("alice@example.test", "pw").await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<bob@example.org>", 250).await;
    c.ok("RCPT TO:<Alice@example.test>", 250).await;
    let text = c.ok("RCPT TO:<nobody@example.test>", 550).await;
    assert!(text.starts_with("5.1.1"), "{text}");
    c.ok("RCPT TO:<postmaster>", 250).await;
}

#[tokio::test]
async fn sighup_swaps_in_a_renewed_certificate() {
    let ingress = Ingress::start("", &[("submissions", SUBMISSIONS)]).await;
    let ca = ca(&ingress);
    let port = ingress.port("submissions");
    let old_der = support::ingress::pem_certificate(&ca.cert);
    assert_eq!(Client::server_certificate(port, &ca).await, old_der);
    let old = std::fs::read(&ca.cert).unwrap();
    TestCa::issue(ingress.dir.path(), "server");
    assert_ne!(old, std::fs::read(&ca.cert).unwrap());
    ingress.signal("HUP");
    let log_has = |needle: &str| ingress.log().contains(needle);
    for _ in 0..200 {
        if log_has("certificate reloaded") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(log_has("certificate reloaded"), "{}", ingress.log());
    // new connections are shown the renewed certificate
    let new_der = support::ingress::pem_certificate(&ca.cert);
    assert_ne!(new_der, old_der);
    assert_eq!(Client::server_certificate(port, &ca).await, new_der);
    // A broken file is refused and the renewed certificate stays in service.
    std::fs::write(&ca.cert, "not a certificate").unwrap();
    ingress.signal("HUP");
    for _ in 0..200 {
        if log_has("certificate reload failed") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(log_has("certificate reload failed"), "{}", ingress.log());
    assert_eq!(
        Client::server_certificate(port, &ca).await,
        new_der,
        "a failed reload keeps the renewed certificate"
    );
    let mut c = Client::connect_tls(port, &ca).await;
    c.ok("NOOP", 250).await;
}

#[tokio::test]
async fn python_smtplib_delivers_with_starttls_and_auth() {
    let ingress = Ingress::start("", &[("submission", SUBMISSION)]).await;
    ingress
        .add_account("alice@example.test", "pw-from-python")
        .await;
    let ca = ca(&ingress);
    let script = r#"
import smtplib, ssl, sys
port, cafile = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=cafile)
with smtplib.SMTP("localhost", port, local_hostname="py.example") as s:
    s.starttls(context=ctx)
    s.login("alice@example.test", "pw-from-python")
    refused = s.sendmail("alice@example.test", ["bob@example.test", "carol@elsewhere.example"],
        "From: alice@example.test\r\nSubject: from smtplib\r\n\r\nsent by Python\r\n")
    assert refused == {}, refused
print("ok")
"#;
    let out = tokio::task::spawn_blocking({
        let port = ingress.port("submission").to_string();
        let cafile = ca.ca.clone();
        move || {
            Command::new("python3")
                .args(["-c", script, &port])
                .arg(cafile)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "smtplib: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id: i64 = sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue")
        .fetch_one(&ingress.db.pool)
        .await
        .unwrap();
    let r = row(&ingress.db, id).await;
    assert_eq!(r.rcpt_to, ["bob@example.test", "carol@elsewhere.example"]);
    assert_eq!(r.auth_user.as_deref(), Some("alice@example.test"));
    assert_eq!(r.body, b"sent by Python\r\n");
    assert_eq!(r.state["origin"]["helo"], "py.example");
}

#[tokio::test]
async fn swaks_delivers_over_starttls_with_auth_login() {
    let ingress = Ingress::start("", &[("submission", SUBMISSION)]).await;
    ingress
        .add_account("alice@example.test", "pw-from-swaks")
        .await;
    let port = ingress.port("submission").to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("swaks")
            .args([
                "--server",
                "127.0.0.1",
                "--port",
                &port,
                "--helo",
                "swaks.example",
            ])
            .args(["--from", "alice@example.test", "--to", "bob@example.test"])
            .args([
                "--tls",
                "--auth",
                "LOGIN",
                "--auth-user",
                "alice@example.test",
                "--auth-password",
                "pw-from-swaks",
            ])
            .args(["--header", "Subject: from swaks", "--body", "sent by swaks"])
            .output()
            .expect("swaks is installed (scripts/apt-packages.txt)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "swaks: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let id: i64 = sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue")
        .fetch_one(&ingress.db.pool)
        .await
        .unwrap();
    let r = row(&ingress.db, id).await;
    assert_eq!(r.rcpt_to, ["bob@example.test"]);
    assert_eq!(r.auth_user.as_deref(), Some("alice@example.test"));
    assert!(String::from_utf8_lossy(&r.headers).contains("Subject: from swaks\r\n"));
    assert!(String::from_utf8_lossy(&r.body).contains("sent by swaks"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("queued as {id}")), "{text}");
}
