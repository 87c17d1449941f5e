//! The whole system on the shipped default graph, remote branch: real `pepsi-ingress`,
//! `pepsi-dispatch` and its stage programs, a real PostgreSQL, a dnsmasq the test starts as
//! the DNS of the relay and of the ingress's checks, and scripted SMTP peers as the MX hosts
//! of `remote.test` (where an alias forwards) and `origin.test` (a foreign sender's domain).
//! Forwarded mail leaves with an SRS sender; local mail leaves with its own sender, ARC
//! sealed when the MX took it and DKIM signed only when submitted after AUTH (checked by
//! dkimpy); a bounce to the SRS address, or a refusal by
//! the remote MX, comes back to the original sender, and a forged SRS address goes nowhere.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support;
use crate::support::ingress::Dns;
use crate::support::smtp_peer::Peer;
use crate::support::system::{System, split};

const WAIT: Duration = Duration::from_secs(60);

/// The secret support::system writes into the SRS secrets fragment.
const SRS_SECRET: &str = "0123456789abcdef0123456789abcdef";

/// The outside world: a DNS and the two MX hosts, with an alias file forwarding
/// `fwd@example.test` and `alice-out@example.test` to `dest@remote.test`.
struct World {
    dns: Dns,
    smtp_port: u16,
    remote: Peer,
    origin: Peer,
    dir: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let (smtp_port, mut peers) = support::smtp_peer::start(&[
            ("127.0.0.41", "mx.remote.test"),
            ("127.0.0.42", "mx.origin.test"),
        ])
        .await;
        let origin = peers.pop().unwrap();
        let remote = peers.pop().unwrap();
        let dns = Dns::start(
            &[
                "--mx-host=remote.test,mx.remote.test,10",
                "--host-record=mx.remote.test,127.0.0.41",
                "--mx-host=origin.test,mx.origin.test,10",
                "--host-record=mx.origin.test,127.0.0.42",
                // remote.test wants TLS reports, at a mailbox on the other MX.
                "--txt-record=_smtp._tls.remote.test,v=TLSRPTv1; rua=mailto:tls@origin.test",
            ]
            .map(String::from),
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("aliases"),
            "fwd@example.test: dest@remote.test\nalice-out@example.test: dest@remote.test\n",
        )
        .unwrap();
        World {
            dns,
            smtp_port,
            remote,
            origin,
            dir,
        }
    }

    /// The options that point the shipped graph at this world.
    fn extra(&self) -> String {
        format!(
            "[pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\n\
             [stage-aliases]\nALIAS_FILE = {aliases}\n\n\
             [stage-relay]\nDNS_SERVERS = 127.0.0.1:{dns}\nDNS_TIMEOUT = 2s\n\
             SMTP_PORT = {port}\nTLS = none\nIPV6 = no\nALLOW_INTERNAL_ADDRESSES = yes\n",
            dns = self.dns.port,
            aliases = self.dir.path().join("aliases").display(),
            port = self.smtp_port,
        )
    }

    /// A running system in this world.
    async fn system(&self) -> System {
        let mut sys = System::new(&self.extra(), &["alice"]).await;
        sys.start().await;
        sys
    }
}

/// The parts of `SRS0=HHHH=TT=domain=local@example.test`: (HHHH, TT, domain, local).
fn srs0_parts(address: &str) -> (String, String, String, String) {
    let (local, domain) = address
        .rsplit_once('@')
        .unwrap_or_else(|| panic!("not an address: {address}"));
    assert_eq!(domain, "example.test", "the SRS domain: {address}");
    let parts: Vec<&str> = local.splitn(5, '=').collect();
    assert_eq!(parts.len(), 5, "SRS0=HHHH=TT=domain=local: {address}");
    assert_eq!(parts[0], "SRS0", "{address}");
    (
        parts[1].into(),
        parts[2].into(),
        parts[3].into(),
        parts[4].into(),
    )
}

/// The SRS hash computed by Python's hmac module (an implementation apart from Pepsi's):
/// the first four base64 characters of HMAC-SHA1(secret, lower-case(TT ‖ domain ‖ local)).
fn python_srs_hash(tt: &str, domain: &str, local: &str) -> String {
    let script = "import sys, hmac, hashlib, base64\n\
                  data = ''.join(sys.argv[2:]).lower().encode()\n\
                  mac = hmac.new(sys.argv[1].encode(), data, hashlib.sha1).digest()\n\
                  print(base64.b64encode(mac).decode()[:4])\n";
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script, SRS_SECRET, tt, domain, local])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The header block unfolded, one field per line.
fn unfolded(message: &[u8]) -> Vec<String> {
    let (headers, _) = split(message);
    String::from_utf8_lossy(headers)
        .replace("\r\n ", " ")
        .replace("\r\n\t", " ")
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The unfolded fields named `name`, top first.
fn named(message: &[u8], name: &str) -> Vec<String> {
    let prefix = format!("{}:", name.to_ascii_lowercase());
    unfolded(message)
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().starts_with(&prefix))
        .collect()
}

/// A DSN as a remote MTA would send it for `rcpt` of a message.
fn remote_dsn(rcpt: &str, subject: &str) -> Vec<u8> {
    format!(
        "From: Mail Delivery Subsystem <MAILER-DAEMON@mx.remote.test>\r\n\
         To: {rcpt}\r\n\
         Subject: {subject}\r\n\
         Message-ID: <dsn-{subject}@mx.remote.test>\r\n\
         Auto-Submitted: auto-replied\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: multipart/report; report-type=delivery-status; boundary=\"b1\"\r\n\
         \r\n\
         --b1\r\n\
         Content-Type: text/plain\r\n\
         \r\n\
         Your message to dest@remote.test could not be delivered: mailbox full.\r\n\
         --b1\r\n\
         Content-Type: message/delivery-status\r\n\
         \r\n\
         Reporting-MTA: dns; mx.remote.test\r\n\
         \r\n\
         Final-Recipient: rfc822; dest@remote.test\r\n\
         Action: failed\r\n\
         Status: 5.2.2\r\n\
         \r\n\
         --b1--\r\n"
    )
    .into_bytes()
}

const FORWARDED: &[u8] = b"From: Sender <sender@origin.test>\r\nTo: fwd@example.test\r\n\
Subject: passing through\r\nMessage-ID: <fwd-1@origin.test>\r\n\r\n\
.a line that starts with a dot\r\nGr\xc3\xbc\xc3\x9fe, trailing space \r\n\r\nlast line\r\n";

#[tokio::test]
async fn forwarded_mail_gets_an_srs_sender_and_a_bounce_to_it_returns_to_the_sender() {
    let world = World::start().await;
    let sys = world.system().await;

    // 1. forwarding through an alias: the envelope sender becomes SRS0 at example.test
    let reply = sys
        .send("sender@origin.test", &["fwd@example.test"], FORWARDED)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let got = sys.received(&world.remote, 1).await;
    assert_eq!(got[0].rcpt, vec!["dest@remote.test"]);
    let srs = got[0].mail_from.clone();
    let (hash, tt, domain, local) = srs0_parts(&srs);
    assert_eq!((domain.as_str(), local.as_str()), ("origin.test", "sender"));
    assert!(
        tt.len() == 2
            && tt
                .bytes()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b)),
        "TT is two base32 characters: {srs}"
    );
    assert_eq!(
        hash,
        python_srs_hash(&tt, "origin.test", "sender"),
        "the hash is HMAC-SHA1 of the shared secret: {srs}"
    );
    let (_, sent_body) = split(FORWARDED);
    let (_, body) = split(&got[0].data);
    assert_eq!(body, sent_body, "the body arrives byte for byte");
    assert!(
        named(&got[0].data, "From") == ["From: Sender <sender@origin.test>"],
        "the header From is the author's: {:?}",
        unfolded(&got[0].data)
    );
    sys.wait_empty(WAIT).await;
    assert!(world.origin.messages().is_empty());

    // 3. the remote side bounces to the SRS address: reversed at init, relayed to origin.test
    let reply = sys.send("", &[&srs], &remote_dsn(&srs, "bounced")).await;
    assert!(reply.starts_with("250"), "{reply}");
    let back = sys.received(&world.origin, 1).await;
    assert_eq!(back[0].mail_from, "", "the bounce keeps the null sender");
    assert_eq!(back[0].rcpt, vec!["sender@origin.test"]);
    let text = String::from_utf8_lossy(&back[0].data);
    assert!(text.contains("Subject: bounced\r\n"), "{text}");
    assert!(text.contains("multipart/report"), "{text}");
    assert!(text.contains("Status: 5.2.2"), "{text}");
    sys.wait_empty(WAIT).await;

    // a forged SRS address (one hash character changed) is not relayed: it bounces, and a
    // bounce of a null-sender message is dropped
    let first = hash.chars().next().unwrap();
    let other = if first == 'A' { 'B' } else { 'A' };
    let forged = srs.replacen(
        &format!("SRS0={hash}="),
        &format!("SRS0={other}{}=", &hash[1..]),
        1,
    );
    assert_ne!(forged, srs);
    let reply = sys
        .send("", &[&forged], &remote_dsn(&forged, "forged"))
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    sys.wait_empty(WAIT).await;
    assert_eq!(
        world.origin.messages().len(),
        1,
        "nothing more reaches origin.test"
    );
    assert_eq!(world.remote.messages().len(), 1, "nor remote.test");
    let log = sys.log("dispatch.log");
    assert!(
        log.contains("hash does not verify"),
        "the forged address is logged as such:\n{log}"
    );
}

#[tokio::test]
async fn local_mail_leaves_dkim_signed_only_when_submitted_with_auth_and_arc_sealed_from_the_mx() {
    let world = World::start().await;
    let sub_port = support::free_port();
    let mut sys = System::new(
        &format!(
            "{}\n[listener-sub]\nROLE = submission\nADDRESS = 127.0.0.1:{sub_port}\n\
             ALLOW_PLAINTEXT_AUTH = yes\n",
            world.extra()
        ),
        &["alice"],
    )
    .await;
    sys.start().await;
    sqlx::query("INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2)")
        .bind("alice@example.test")
        .bind(pepsi_ingress::accounts::hash_password(b"pw").unwrap())
        .execute(&sys.db.pool)
        .await
        .unwrap();
    let msg = b"From: Alice <alice@example.test>\r\nTo: alice-out@example.test\r\n\
Subject: signed on the way out\r\nDate: Thu, 01 Jan 2026 10:00:00 +0000\r\n\
Message-ID: <local-1@example.test>\r\n\r\nHello,  world \r\n\r\nA second   paragraph.\r\n";

    // Through the MX, unauthenticated, a From of a hosted domain: anyone could have written
    // it, so the signing policy (SIGN = authenticated) leaves it unsigned; it is ARC sealed.
    let reply = sys
        .send("alice@example.test", &["alice-out@example.test"], msg)
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let got = sys.received(&world.remote, 1).await;
    assert_eq!(
        got[0].mail_from, "alice@example.test",
        "a local sender is not rewritten"
    );
    assert_eq!(got[0].rcpt, vec!["dest@remote.test"]);
    let data = &got[0].data;
    assert_eq!(
        named(data, "DKIM-Signature"),
        Vec::<String>::new(),
        "mail from an unauthenticated client is not signed"
    );
    let mx_data = data.clone();

    // The same message submitted by alice after AUTH: signed.
    let reply = support::system::send_smtp_auth(
        sub_port,
        ("alice@example.test", "pw"),
        "alice@example.test",
        &["alice-out@example.test"],
        msg,
    )
    .await;
    assert!(reply.starts_with("250"), "{reply}");
    let got = sys.received(&world.remote, 2).await;
    let data = &got[1].data;

    let dkim = named(data, "DKIM-Signature");
    assert_eq!(dkim.len(), 1, "{:?}", unfolded(data));
    assert!(
        dkim[0].contains("d=example.test;") && dkim[0].contains("s=pepsi;"),
        "{}",
        dkim[0]
    );
    assert!(dkim[0].contains("a=rsa-sha256;"), "{}", dkim[0]);

    // the public key of the shipped graph's key file, as it would be published
    let key = sys.dir.path().join("keys/example.test.pepsi.pem");
    let public: PathBuf = sys.dir.path().join("keys/example.test.pepsi.pub.der");
    let derived = Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public)
        .status()
        .unwrap();
    assert!(derived.success(), "openssl pkey -pubout");
    let keys = json!({"pepsi._domainkey.example.test": ["rsa", public]});

    const DKIM_VERIFY: &str = r#"
try:
    ok = bool(dkim.DKIM(msg).verify(dnsfunc=dnsfunc))
except dkim.ValidationError as e:
    print(e, file=sys.stderr)
    ok = False
print(json.dumps(ok))
"#;
    assert_eq!(
        support::dkimpy(DKIM_VERIFY, &keys, data),
        json!(true),
        "dkimpy verifies the signature:\n{}",
        String::from_utf8_lossy(data)
    );

    // the MX listener verifies (VERIFY = yes), so the message it took has state.auth and
    // is sealed
    let data = &mx_data;
    let seal = named(data, "ARC-Seal");
    assert_eq!(seal.len(), 1, "{:?}", unfolded(data));
    assert!(
        seal[0].contains("i=1;") && seal[0].contains("cv=none;"),
        "{}",
        seal[0]
    );
    assert!(seal[0].contains("d=example.test;") && seal[0].contains("s=pepsi;"));
    let aar = named(data, "ARC-Authentication-Results");
    assert_eq!(aar.len(), 1, "{:?}", unfolded(data));
    assert!(
        aar[0].starts_with("ARC-Authentication-Results: i=1; mail.example.test;")
            && aar[0].contains("iprev=pass"),
        "the ingress's verdicts under [pepsi] HOSTNAME as authserv-id: {}",
        aar[0]
    );
    const ARC_VERIFY: &str = r#"
cv, results, reason = dkim.arc_verify(msg, dnsfunc=dnsfunc)
print(json.dumps({"cv": cv.decode() if cv is not None else None, "reason": reason}))
"#;
    let arc = support::dkimpy(ARC_VERIFY, &keys, data);
    assert_eq!(
        arc["cv"],
        "pass",
        "dkimpy validates the chain: {arc}\n{}",
        String::from_utf8_lossy(data)
    );

    let (_, sent_body) = split(msg);
    assert_eq!(split(data).1, sent_body);
    sys.wait_empty(WAIT).await;
}

#[tokio::test]
async fn a_refusal_by_the_remote_mx_comes_back_to_the_original_sender() {
    let world = World::start().await;
    world.remote.script(|s| {
        s.rcpt.insert(
            "dest@remote.test".into(),
            "550 5.1.1 <dest@remote.test>: no such user here".into(),
        );
    });
    let sys = world.system().await;
    let reply = sys
        .send("sender@origin.test", &["fwd@example.test"], FORWARDED)
        .await;
    assert!(reply.starts_with("250"), "{reply}");

    let back = sys.received(&world.origin, 1).await;
    assert_eq!(back[0].mail_from, "", "a DSN has the null sender");
    assert_eq!(back[0].rcpt, vec!["sender@origin.test"]);
    let text = String::from_utf8_lossy(&back[0].data).into_owned();
    assert!(
        text.contains("report-type=\"delivery-status\""),
        "a delivery status report: {text}"
    );
    assert!(
        text.contains("Final-Recipient: rfc822; dest@remote.test"),
        "{text}"
    );
    assert!(text.contains("Action: failed"), "{text}");
    assert!(text.contains("Status: 5.1.1"), "{text}");
    assert!(text.contains("Remote-MTA: dns; mx.remote.test"), "{text}");
    assert!(
        text.contains("550 5.1.1 <dest@remote.test>: no such user here"),
        "the remote MTA's reply: {text}"
    );
    assert!(
        text.contains("Subject: passing through"),
        "the original's headers come back: {text}"
    );
    // The forwarded mail went out with an SRS sender; the DSN was made for that address and
    // reached the original sender only through its reversal at init.
    let mail_from: Vec<String> = world
        .remote
        .log
        .lock()
        .unwrap()
        .commands
        .iter()
        .filter_map(|c| c.strip_prefix("MAIL FROM:<"))
        .filter_map(|c| c.split_once('>').map(|(a, _)| a.to_owned()))
        .collect();
    assert_eq!(mail_from.len(), 1, "{mail_from:?}");
    let (_, _, domain, local) = srs0_parts(&mail_from[0]);
    assert_eq!((domain.as_str(), local.as_str()), ("origin.test", "sender"));
    assert!(
        named(&back[0].data, "To").concat().contains(&mail_from[0]),
        "the DSN is addressed to the SRS sender: {:?}",
        unfolded(&back[0].data)
    );
    assert!(world.remote.messages().is_empty());
    sys.wait_empty(WAIT).await;
    assert_eq!(world.origin.messages().len(), 1, "exactly one DSN");
}

/// System accounts made for one test (useradd, as root) with their home directories under
/// `dir`, removed again when dropped. Their names are this process's own, so two test runs
/// on one machine do not meet.
struct Accounts {
    names: Vec<String>,
    _dir: tempfile::TempDir,
    homes: Vec<PathBuf>,
}

impl Accounts {
    fn create(letters: &[&str]) -> Accounts {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut names = Vec::new();
        let mut homes = Vec::new();
        for letter in letters {
            let name = format!("pfw{}{letter}", std::process::id());
            let home = dir.path().join(&name);
            let _ = Command::new("userdel").arg(&name).output();
            let out = Command::new("useradd")
                .args([
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    "--home-dir",
                ])
                .arg(&home)
                .arg(&name)
                .output()
                .expect("useradd (the .forward test makes system accounts: run it as root)");
            assert!(
                out.status.success(),
                "useradd {name} (the .forward test makes system accounts: run it as root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::create_dir(&home).unwrap();
            let chown = Command::new("chown")
                .arg(format!("{name}:"))
                .arg(&home)
                .status()
                .unwrap();
            assert!(chown.success());
            names.push(name);
            homes.push(home);
        }
        Accounts {
            names,
            _dir: dir,
            homes,
        }
    }

    /// Writes account `i`'s `.forward`, owned by the account, with `mode`.
    fn forward(&self, i: usize, text: &str, mode: u32) {
        let path = self.homes[i].join(".forward");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .unwrap();
        let chown = Command::new("chown")
            .arg(format!("{}:", self.names[i]))
            .arg(&path)
            .status()
            .unwrap();
        assert!(chown.success());
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("userdel").arg(name).output();
        }
    }
}

/// ~/.forward through the whole system (pepsi-stage-dot-forward spliced in before the
/// Maildir delivery, its setuid reader run as root reading each file as its account): a
/// forward to a remote address leaves with an SRS sender and the loop guard while `\name`
/// (and the account's own address with an extension) keeps one local copy; two accounts
/// forwarding to each other are a loop, found through an extension too and returned to the
/// sender with 5.4.6; a kept copy forwarded back to its account is a loop, not a second
/// copy; a file others may write, or one the account cannot read, is ignored.
#[tokio::test]
async fn a_dot_forward_leaves_with_an_srs_sender_keeps_a_copy_and_refuses_a_loop() {
    let world = World::start().await;
    let acc = Accounts::create(&["a", "b", "c", "d", "e", "f", "g"]);
    let [a, b, c, d, e, f, g] = [0, 1, 2, 3, 4, 5, 6].map(|i| acc.names[i].clone());
    acc.forward(
        0,
        &format!("# keep one, send one on\n\\{a}, dest@remote.test\n{a}+copy\n\"|/bin/false\"\n"),
        0o644,
    );
    acc.forward(1, &format!("{c}\n"), 0o600);
    acc.forward(2, &format!("{b}+loop@example.test\n"), 0o644);
    acc.forward(3, "dest@remote.test\n", 0o664);
    // e's file is root's and only root may read it: the reader, reading as e, cannot.
    acc.forward(4, "dest@remote.test\n", 0o600);
    let chown = Command::new("chown")
        .arg("root:")
        .arg(acc.homes[4].join(".forward"))
        .status()
        .unwrap();
    assert!(chown.success());
    acc.forward(5, &format!("\\{f}, {g}\n"), 0o644);
    acc.forward(6, &format!("{f}\n"), 0o644);
    let extra = format!(
        "{}\n[stage-vacation]\nNEXT_STAGE = dot-forward\n\n\
         [stage-dot-forward]\nPROGRAM = pepsi-stage-dot-forward\nNEXT_STAGE = local\n\
         BOUNCE_STAGE = bounce\nFORWARD_STAGE = aliases\nDOMAINS = example.test\n",
        world.extra()
    );
    let mut users: Vec<&str> = acc.names.iter().map(String::as_str).collect();
    users.extend(["bob", "carol"]);
    let mut sys = System::new(&extra, &users).await;
    sys.start().await;
    let send = |from: &'static str, to: String, subject: &'static str| {
        let body = format!(
            "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\n\
             Message-ID: <{subject}@example.test>\r\n\r\nhello\r\n"
        );
        let sys = &sys;
        async move {
            let reply = sys.send(from, &[&to], body.as_bytes()).await;
            assert!(reply.starts_with("250"), "{subject}: {reply}");
        }
    };

    // a: one copy kept, one to remote.test with an SRS sender and a's loop guard.
    send("sender@origin.test", format!("{a}@example.test"), "for-a").await;
    let out = sys.received(&world.remote, 1).await;
    assert_eq!(out[0].rcpt, vec!["dest@remote.test"]);
    let (_, _, domain, local) = srs0_parts(&out[0].mail_from);
    assert_eq!((domain.as_str(), local.as_str()), ("origin.test", "sender"));
    assert_eq!(
        named(&out[0].data, "Delivered-To"),
        [format!("Delivered-To: {a}@example.test")],
        "the forwarded copy carries the loop guard"
    );
    sys.wait_messages(&a, 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(sys.messages(&a).len(), 1, "\\a and a+copy keep one copy");

    // b -> c -> b+loop: b's account is in a Delivered-To field; bob gets a DSN.
    send(
        "bob@example.test",
        format!("{b}@example.test"),
        "round-and-round",
    )
    .await;
    let dsn = sys.wait_messages("bob", 1, WAIT).await;
    let text = String::from_utf8_lossy(&dsn[0]).into_owned();
    assert!(text.contains("report-type=\"delivery-status\""), "{text}");
    assert!(text.contains("Status: 5.4.6"), "{text}");
    assert!(
        text.contains(&format!("mail forwarding loop for {b}+loop@example.test")),
        "{text}"
    );
    sys.wait_empty(WAIT).await;
    assert!(sys.messages(&b).is_empty() && sys.messages(&c).is_empty());
    assert_eq!(sys.messages("bob").len(), 1);

    // f keeps a copy and forwards to g, who forwards back to f: f's kept copy is delivered
    // once, and the copy coming back is a loop.
    send(
        "carol@example.test",
        format!("{f}@example.test"),
        "kept-then-back",
    )
    .await;
    let dsn = sys.wait_messages("carol", 1, WAIT).await;
    assert!(String::from_utf8_lossy(&dsn[0]).contains("Status: 5.4.6"));
    sys.wait_empty(WAIT).await;
    assert_eq!(sys.messages(&f).len(), 1, "one kept copy, no second");
    assert!(sys.messages(&g).is_empty());
    assert_eq!(sys.messages("carol").len(), 1);

    // d's .forward is group-writable, e's unreadable by e: both ignored, the mail stays.
    for user in [&d, &e] {
        send("sender@origin.test", format!("{user}@example.test"), "stay").await;
        sys.wait_messages(user, 1, WAIT).await;
    }
    sys.wait_empty(WAIT).await;
    assert_eq!(world.remote.messages().len(), 1, "only a's copy left");
    let logs = sys.logs();
    assert!(logs.contains("is writable by its group"), "{logs}");
    assert!(logs.contains("is not readable by its account"), "{logs}");
    assert!(
        logs.contains("program delivery (|command) is not supported"),
        "{logs}"
    );
}

/// A TLS report through the whole system (RFC 8460): mail forwarded to remote.test leaves
/// over SMTP without TLS (its MX offers no STARTTLS), the relay stage counts that session,
/// `pepsi-tlsrpt send` makes the day's report for remote.test and queues it for the rua its
/// `_smtp._tls` record names, the pipeline signs it with our DKIM key and delivers it to
/// that mailbox's MX, and `pepsi-tlsrpt import` reads what arrived there back.
#[tokio::test]
async fn the_days_tls_report_reaches_the_rua_mailbox_through_the_whole_system_and_is_read_back() {
    let world = World::start().await;
    let extra = format!(
        "{}TLS = may\n\n[pepsi-tlsrpt]\nDNS_SERVERS = 127.0.0.1:{}\nORGANIZATION = Pepsi Test\n\
         FROM = tls-reports@example.test\n",
        world.extra().replace("TLS = none\n", ""),
        world.dns.port
    );
    let mut sys = System::new(&extra, &["alice"]).await;
    sys.start().await;
    let raw = b"From: bob@origin.test\r\nTo: fwd@example.test\r\nSubject: onward\r\n\r\nhello\r\n";
    sys.send("bob@origin.test", &["fwd@example.test"], raw)
        .await;
    let until = std::time::Instant::now() + WAIT;
    while world.remote.messages().is_empty() && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(world.remote.messages().len(), 1, "{}", sys.logs());
    let counted: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT domain, policy_type, result_type, sessions FROM pepsi.tls_report_result",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(
        counted,
        [(
            "remote.test".to_owned(),
            "no-policy-found".to_owned(),
            "starttls-not-supported".to_owned(),
            1
        )]
    );

    let tlsrpt =
        pepsi_testkit::programs::program("pepsi-tlsrpt", env!("CARGO_BIN_EXE_pepsi-tlsrpt"));
    let today = chrono::Utc::now().date_naive().to_string();
    let out = sys
        .command(&tlsrpt)
        .args(["send", "--day", &today, "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sent: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sent[0]["rua"], "mailto:tls@origin.test", "{sent}");
    assert_eq!(sent[0]["outcome"], "sent", "{sent}");

    // It arrives signed with our domain's DKIM key (RFC 8460 §5.3), as mail generated here is.
    let until = std::time::Instant::now() + WAIT;
    let mut arrived = Vec::new();
    while arrived.is_empty() && std::time::Instant::now() < until {
        arrived = world
            .origin
            .messages()
            .into_iter()
            .filter(|m| m.rcpt.iter().any(|r| r.contains("tls@origin.test")))
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(arrived.len(), 1, "{}", sys.logs());
    let mail = &arrived[0].data;
    let signatures = named(mail, "DKIM-Signature");
    assert!(
        signatures.iter().any(|s| s.contains("d=example.test")),
        "{signatures:?}"
    );
    assert!(
        named(mail, "TLS-Report-Domain")
            .iter()
            .any(|f| f.contains("remote.test")),
        "{}",
        String::from_utf8_lossy(mail)
    );

    let mut import = sys
        .command(&tlsrpt)
        .args(["import", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut import.stdin.take().unwrap(), mail).unwrap();
    let out = import.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 report(s) imported"),
        "{out:?}"
    );
    let out = sys
        .command(&tlsrpt)
        .args(["summary", "--json"])
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary[0],
        json!({"organization": "Pepsi Test", "domain": "remote.test",
               "result": "starttls-not-supported", "sessions": 1}),
        "{summary}"
    );
}
