//! Message authentication at the ingress against a real DNS server the test starts
//! (dnsmasq on a free loopback port): SPF, DKIM and DMARC verdicts pass, fail and none, and
//! iprev, each in `Authentication-Results` and `state.auth` / `state.origin`; and an ARC chain
//! sealed by a forwarder, intact and tampered with.

use mail_auth::common::crypto::Ed25519Key;
use mail_auth::common::headers::HeaderWriter as _;
use mail_auth::dkim::DkimSigner;
use pepsi_smtp::encoding::base64_encode;

use crate::support::ingress::{Client, Dns, Ingress, row};

fn sign(key_der: &[u8], domain: &str, message: &str) -> String {
    let key = Ed25519Key::from_pkcs8_der(key_der).unwrap();
    let signature = DkimSigner::from_key(key)
        .domain(domain)
        .selector("sel")
        .headers(["From", "To", "Subject"])
        .sign(message.as_bytes())
        .unwrap();
    format!("{}{message}", signature.to_header())
}

fn dkim_record(key_der: &[u8]) -> String {
    let key = Ed25519Key::from_pkcs8_der(key_der).unwrap();
    format!("v=DKIM1; k=ed25519; p={}", base64_encode(&key.public_key()))
}

#[tokio::test]
async fn spf_dkim_and_dmarc_verdicts_from_a_local_dns_server() {
    let pass_key = Ed25519Key::generate_pkcs8().unwrap();
    let fail_key = Ed25519Key::generate_pkcs8().unwrap();
    let published_for_fail = Ed25519Key::generate_pkcs8().unwrap();
    let dns = Dns::start(&[
        "--txt-record=pass.test,v=spf1 ip4:127.0.0.1 -all".into(),
        format!(
            "--txt-record=sel._domainkey.pass.test,{}",
            dkim_record(&pass_key)
        ),
        "--txt-record=_dmarc.pass.test,v=DMARC1; p=reject".into(),
        "--txt-record=fail.test,v=spf1 ip4:192.0.2.1 -all".into(),
        format!(
            "--txt-record=sel._domainkey.fail.test,{}",
            dkim_record(&published_for_fail)
        ),
        "--txt-record=_dmarc.fail.test,v=DMARC1; p=quarantine".into(),
        "--txt-record=mail.pass.test,v=spf1 a -all".into(),
        "--host-record=mail.pass.test,127.0.0.1".into(),
        "--ptr-record=1.0.0.127.in-addr.arpa,mail.pass.test".into(),
    ]);
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 5s\nAUTHSERV_ID = auth.example.test\n",
            dns.port
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mail.pass.test", 250).await;

    let text = |from: &str| {
        format!("From: {from}\r\nTo: alice@example.test\r\nSubject: verdicts\r\n\r\nbody\r\n")
    };
    // A forged result under our authserv-id must not survive into the stored headers.
    let pass_msg = format!(
        "Authentication-Results: auth.example.test; dkim=pass header.d=evil.test\r\n{}",
        sign(&pass_key, "pass.test", &text("a@pass.test"))
    );
    let fail_msg = sign(&fail_key, "fail.test", &text("a@fail.test"));
    let none_msg = text("a@none.test");
    let cases = [
        ("a@pass.test", pass_msg, "pass", "pass", "pass"),
        ("a@fail.test", fail_msg, "fail", "fail", "fail"),
        ("a@none.test", none_msg, "none", "none", "none"),
    ];
    for (from, message, spf, dkim, dmarc) in cases {
        let id = c
            .deliver(from, &["alice@example.test"], message.as_bytes())
            .await;
        let r = row(&ingress.db, id).await;
        let headers = String::from_utf8(r.headers.clone()).unwrap();
        let at = headers
            .find("Authentication-Results: ")
            .unwrap_or_else(|| panic!("{from}: no Authentication-Results in {headers}"));
        let field: String = headers[at + "Authentication-Results: ".len()..]
            .split("\r\n")
            .enumerate()
            .take_while(|(i, l)| *i == 0 || l.starts_with('\t'))
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(field.starts_with("auth.example.test;"), "{from}: {field}");
        assert!(field.contains("iprev=pass"), "{from}: {field}");
        assert!(
            field.contains("spf=pass") && field.contains("smtp.helo=mail.pass.test"),
            "{from}: HELO SPF: {field}"
        );
        assert!(
            field.contains(&format!("spf={spf}"))
                && field.contains(&format!("smtp.mailfrom={from}")),
            "{from}: {field}"
        );
        assert!(field.contains(&format!("dmarc={dmarc}")), "{from}: {field}");
        if dkim != "none" {
            assert!(field.contains(&format!("dkim={dkim}")), "{from}: {field}");
        }
        assert_eq!(
            headers
                .matches("Authentication-Results: auth.example.test")
                .count(),
            1,
            "{from}: the forged field must be gone: {headers}"
        );

        let auth = &r.state["auth"];
        assert_eq!(auth["spf"]["result"], spf, "{from}: {auth}");
        assert_eq!(auth["spf"]["helo"]["result"], "pass", "{from}: {auth}");
        assert_eq!(auth["dmarc"]["result"], dmarc, "{from}: {auth}");
        match dkim {
            "none" => assert_eq!(auth["dkim"], serde_json::json!([]), "{from}: {auth}"),
            _ => {
                assert_eq!(auth["dkim"][0]["result"], dkim, "{from}: {auth}");
                assert_eq!(auth["dkim"][0]["selector"], "sel", "{from}: {auth}");
            }
        }
        assert_eq!(auth["arc"]["result"], "none");
        // dnsmasq also names 127.0.0.1 "localhost" on its own; either name passes iprev
        // because each resolves back to the address.
        let iprev = &r.state["origin"]["iprev"];
        assert_eq!(iprev["result"], "pass", "{from}: {iprev}");
        let name = iprev["name"].as_str().expect("a verified name");
        assert!(["mail.pass.test", "localhost"].contains(&name), "{iprev}");
        assert_eq!(r.state["origin"]["authserv_id"], "auth.example.test");
        assert!(
            headers.starts_with(&format!(
                "Received: from mail.pass.test ({name} [127.0.0.1])"
            )),
            "{headers}"
        );
    }
    let pass = row(&ingress.db, 1).await;
    assert_eq!(pass.state["auth"]["dmarc"]["policy"], "reject");
    assert_eq!(pass.state["auth"]["dkim"][0]["domain"], "pass.test");
}

/// `message` sealed as the first ARC hop by `fwd.test` (selector `arc`), the way a
/// forwarder that verified it would.
fn arc_seal(key_der: &[u8], message: &str) -> String {
    use mail_auth::arc::ArcSealer;
    use mail_auth::{ArcOutput, AuthenticatedMessage, AuthenticationResults};
    let parsed = AuthenticatedMessage::parse(message.as_bytes()).unwrap();
    let results = AuthenticationResults::new("fwd.test");
    let key = Ed25519Key::from_pkcs8_der(key_der).unwrap();
    let set = ArcSealer::from_key(key)
        .domain("fwd.test")
        .selector("arc")
        .headers(["From", "To", "Subject"])
        .seal(&parsed, &results, &ArcOutput::default())
        .unwrap();
    format!("{}{}{message}", set.to_header(), results.to_header())
}

#[tokio::test]
async fn an_arc_chain_is_verified_pass_when_intact_and_fail_when_a_signed_header_changed() {
    let arc_key = Ed25519Key::generate_pkcs8().unwrap();
    let dns = Dns::start(&[format!(
        "--txt-record=arc._domainkey.fwd.test,{}",
        dkim_record(&arc_key)
    )]);
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 5s\nAUTHSERV_ID = auth.example.test\n",
            dns.port
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO fwd.test", 250).await;
    let original = "From: a@list.test\r\nTo: alice@example.test\r\nSubject: forwarded\r\n\r\nthe forwarded body\r\n";
    let sealed = arc_seal(&arc_key, original);
    // a signed header changed after sealing breaks the message signature of the set
    let tampered = sealed.replace("Subject: forwarded", "Subject: altered");
    for (message, want) in [(sealed, "pass"), (tampered, "fail")] {
        let id = c
            .deliver("a@list.test", &["alice@example.test"], message.as_bytes())
            .await;
        let r = row(&ingress.db, id).await;
        assert_eq!(r.state["auth"]["arc"]["result"], want, "{}", r.state);
        let headers = String::from_utf8(r.headers.clone()).unwrap();
        assert!(headers.contains(&format!("arc={want}")), "{headers}");
        assert!(
            headers.contains("ARC-Seal: i=1;"),
            "the chain is kept: {headers}"
        );
    }
}

/// No client text extends or impersonates the `Authentication-Results` this server writes: a
/// message whose first line is a continuation (it would continue our field and add
/// `dkim=pass` under our authserv-id) is refused with 554 5.6.0, by DATA and by BDAT, and
/// stores nothing; a forged field in the obsolete form (`Authentication-Results :`) is
/// removed like any other; the session goes on.
#[tokio::test]
async fn a_client_can_neither_extend_nor_forge_our_authentication_results() {
    let dns = Dns::start(&[]);
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 5s\nAUTHSERV_ID = auth.example.test\n",
            dns.port
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO client.example", 250).await;
    let extend = "\t; dkim=pass header.d=paypal.com; dmarc=pass header.from=paypal.com\r\n\
                  From: service@paypal.com\r\nTo: alice@example.test\r\nSubject: x\r\n\r\nbody\r\n";

    c.ok("MAIL FROM:<a@client.example>", 250).await;
    c.ok("RCPT TO:<alice@example.test>", 250).await;
    c.ok("DATA", 354).await;
    c.send(extend.as_bytes()).await;
    c.send(b".\r\n").await;
    let (code, text) = c.read().await;
    assert_eq!(code, 554, "DATA: {text}");
    assert!(
        text.starts_with("5.6.0 ") && text.contains("space or tab"),
        "{text}"
    );

    c.ok("MAIL FROM:<a@client.example>", 250).await;
    c.ok("RCPT TO:<alice@example.test>", 250).await;
    let mut bdat = format!("BDAT {} LAST\r\n", extend.len()).into_bytes();
    bdat.extend_from_slice(extend.as_bytes());
    c.send(&bdat).await;
    let (code, text) = c.read().await;
    assert_eq!(code, 554, "BDAT: {text}");
    assert!(text.starts_with("5.6.0 "), "{text}");
    assert_eq!(ingress.rows().await, 0, "nothing stored");

    let forged = "Authentication-Results : auth.example.test; dkim=pass header.d=paypal.com\r\n\
                  From: service@paypal.com\r\nTo: alice@example.test\r\nSubject: y\r\n\r\nbody\r\n";
    let id = c
        .deliver(
            "a@client.example",
            &["alice@example.test"],
            forged.as_bytes(),
        )
        .await;
    let headers = String::from_utf8(row(&ingress.db, id).await.headers).unwrap();
    assert!(
        !headers.contains("paypal.com;") && !headers.contains("header.d=paypal.com"),
        "{headers}"
    );
    assert_eq!(
        headers.matches("Authentication-Results").count(),
        1,
        "only our own field remains: {headers}"
    );
    assert!(!headers.contains("dkim=pass"), "{headers}");
    assert!(
        headers.contains("Authentication-Results: auth.example.test;"),
        "{headers}"
    );
    assert!(
        headers.contains("From: service@paypal.com\r\n"),
        "{headers}"
    );
}

#[tokio::test]
async fn a_resolver_that_never_answers_costs_a_message_dns_budget_and_gives_temperror() {
    // A DNS server that takes every query and answers none.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = udp.local_addr().unwrap().port();
    let _tcp = std::net::TcpListener::bind(("127.0.0.1", port)).ok();
    let ingress = Ingress::start(
        &format!("DNS_SERVERS = 127.0.0.1:{port}\nDNS_TIMEOUT = 30s\nDNS_BUDGET = 1s\n"),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mail.slow.test", 250).await;
    let id = c
        .deliver(
            "a@slow.test",
            &["alice@example.test"],
            b"From: a@slow.test\r\nTo: alice@example.test\r\nSubject: s\r\n\r\nbody\r\n",
        )
        .await;
    let r = row(&ingress.db, id).await;
    let auth = &r.state["auth"];
    assert_eq!(auth["spf"]["result"], "temperror", "{auth}");
    assert_eq!(auth["dmarc"]["result"], "temperror", "{auth}");
    let headers = String::from_utf8(r.headers).unwrap();
    assert!(
        headers.contains("spf=temperror") && headers.contains("dmarc=temperror"),
        "{headers}"
    );
    let log = ingress.log();
    // (iprev of the loopback address is answered by the resolver itself, not the DNS.)
    assert!(
        log.contains("DNS_BUDGET spent: the unfinished checks are temperror")
            && log.contains("DNS_BUDGET spent on DMARC: temperror"),
        "{log}"
    );
    drop(udp);
}

/// A name server that answers every query after `delay` with one TXT record,
/// `v=spf1 include:<n>.tarpit.example -all` (a fresh `n` each time): each lookup succeeds
/// within DNS_TIMEOUT, and SPF follows the chain until its ten-lookup limit. Runs until the
/// test ends; returns its UDP port.
fn tarpit(delay: std::time::Duration) -> u16 {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = udp.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut n = 0u32;
        let mut buf = [0u8; 1500];
        while let Ok((len, peer)) = udp.recv_from(&mut buf) {
            // The question: its name's labels from offset 12, then type and class.
            let mut end = 12;
            while end < len && buf[end] != 0 {
                end += 1 + usize::from(buf[end]);
            }
            end += 5;
            if end > len {
                continue;
            }
            n += 1;
            let text = format!("v=spf1 include:{n}.tarpit.example -all");
            let mut answer = buf[..2].to_vec();
            // QR AA RD RA, NOERROR; one question, one answer.
            answer.extend_from_slice(&[0x85, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
            answer.extend_from_slice(&buf[12..end]);
            // The question's name (a pointer), TXT, IN, TTL 60, the text as one string.
            answer.extend_from_slice(&[0xc0, 0x0c, 0, 16, 0, 1, 0, 0, 0, 60]);
            answer.extend_from_slice(&u16::try_from(text.len() + 1).unwrap().to_be_bytes());
            answer.push(u8::try_from(text.len()).unwrap());
            answer.extend_from_slice(text.as_bytes());
            let udp = udp.try_clone().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let _ = udp.send_to(&answer, peer);
            });
        }
    });
    port
}

/// Security review #5: the sender's own HELO and MAIL FROM domains answering slowly (a
/// tarpit name server, each answer in time but the SPF chain longer than DNS_BUDGET) no
/// longer turn the verdict on a spoofed From of a `p=reject` domain into
/// `dmarc=temperror`: the unaligned checks that did not finish cannot make DMARC pass, so
/// it is `fail`.
#[tokio::test]
async fn a_tarpit_for_the_senders_spf_domains_cannot_turn_a_spoofed_from_dmarc_fail_into_temperror()
{
    let tarpit = tarpit(std::time::Duration::from_millis(600));
    let dns = Dns::start(&[
        "--txt-record=_dmarc.bank.test,v=DMARC1; p=reject".into(),
        format!("--server=/tarpit.example/127.0.0.1#{tarpit}"),
    ]);
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 5s\nDNS_BUDGET = 2s\n\
             AUTHSERV_ID = auth.example.test\n",
            dns.port
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mail.tarpit.example", 250).await;
    let started = std::time::Instant::now();
    let id = c
        .deliver(
            "a@tarpit.example",
            &["alice@example.test"],
            b"From: ceo@bank.test\r\nTo: alice@example.test\r\nSubject: wire\r\n\r\nbody\r\n",
        )
        .await;
    let took = started.elapsed();
    let r = row(&ingress.db, id).await;
    let auth = &r.state["auth"];
    assert_eq!(
        auth["spf"]["result"], "temperror",
        "the chain outlasted the budget: {auth}"
    );
    assert_eq!(auth["spf"]["helo"]["result"], "temperror", "{auth}");
    assert_eq!(auth["dmarc"]["result"], "fail", "{auth}");
    assert_eq!(auth["dmarc"]["domain"], "bank.test", "{auth}");
    assert_eq!(auth["dmarc"]["policy"], "reject", "{auth}");
    let headers = String::from_utf8(r.headers).unwrap();
    assert!(
        headers
            .contains("dmarc=fail (policy not aligned) header.from=bank.test policy.dmarc=reject"),
        "{headers}"
    );
    assert!(!headers.contains("dmarc=temperror"), "{headers}");
    assert!(
        took < std::time::Duration::from_secs(4),
        "DNS_BUDGET bounds the unaligned checks: {took:?}"
    );
    let log = ingress.log();
    assert!(
        log.contains("DNS_BUDGET spent: the unfinished checks are temperror"),
        "{log}"
    );
}

/// Lookups that failed (here: a DNS server that never answers) are remembered for
/// DNS_FAILURE_TTL: the next message about the same domains gets `temperror` at once and
/// asks the DNS nothing.
#[tokio::test]
async fn failed_lookups_are_not_asked_again_within_dns_failure_ttl() {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let port = udp.local_addr().unwrap().port();
    let _tcp = std::net::TcpListener::bind(("127.0.0.1", port)).ok();
    // Queries about dead.test received so far (the name's labels, as a query carries them).
    let queries = || {
        let mut n = 0;
        let mut buf = [0u8; 512];
        while let Ok(len) = udp.recv(&mut buf) {
            if buf[..len].windows(10).any(|w| w == b"\x04dead\x04test") {
                n += 1;
            }
        }
        n
    };
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{port}\nDNS_TIMEOUT = 300ms\nDNS_BUDGET = 20s\n\
             DNS_FAILURE_TTL = 10m\n"
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let message = b"From: a@dead.test\r\nTo: alice@example.test\r\nSubject: s\r\n\r\nbody\r\n";
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mail.dead.test", 250).await;
    let mut asked = Vec::new();
    for _ in 0..2 {
        let id = c
            .deliver("a@dead.test", &["alice@example.test"], message)
            .await;
        let auth = row(&ingress.db, id).await.state["auth"].clone();
        assert_eq!(auth["spf"]["result"], "temperror", "{auth}");
        assert_eq!(auth["spf"]["helo"]["result"], "temperror", "{auth}");
        assert_eq!(auth["dmarc"]["result"], "temperror", "{auth}");
        asked.push(queries());
    }
    assert!(asked[0] > 0, "the first message asked: {asked:?}");
    assert_eq!(asked[1], 0, "the second asked nothing: {asked:?}");
    assert!(
        !ingress.log().contains("DNS_BUDGET spent"),
        "the failures, not the budget"
    );
}

/// A domain without a DMARC record: with DNS_NEGATIVE_TTL the "no such name" answer is
/// remembered, so a second message asks nothing; with 0 (dnsmasq's answer carries no TTL)
/// each message asks again.
#[tokio::test]
async fn negative_answers_are_remembered_for_dns_negative_ttl() {
    for (ttl, expected) in [("60s", 1), ("0", 2)] {
        let dns = Dns::start_logged(&["--txt-record=plain.test,v=spf1 ip4:127.0.0.1 -all".into()]);
        let ingress = Ingress::start(
            &format!(
                "DNS_SERVERS = 127.0.0.1:{}\nDNS_NEGATIVE_TTL = {ttl}\n",
                dns.port
            ),
            &[("mx", "ROLE = mx\n")],
        )
        .await;
        let message = "From: a@plain.test\r\nTo: alice@example.test\r\nSubject: x\r\n\r\nbody\r\n";
        let mut c = Client::connect(ingress.port("mx")).await;
        c.ok("EHLO mail.plain.test", 250).await;
        for _ in 0..2 {
            let id = c
                .deliver("a@plain.test", &["alice@example.test"], message.as_bytes())
                .await;
            let r = row(&ingress.db, id).await;
            assert_eq!(
                r.state["auth"]["dmarc"]["result"], "none",
                "{}",
                r.state["auth"]
            );
        }
        assert_eq!(
            dns.queries("_dmarc.plain.test"),
            expected,
            "DNS_NEGATIVE_TTL = {ttl}"
        );
    }
}

#[tokio::test]
async fn only_the_first_max_dkim_signatures_are_verified() {
    let key = Ed25519Key::generate_pkcs8().unwrap();
    let dns = Dns::start(&[format!(
        "--txt-record=sel._domainkey.pass.test,{}",
        dkim_record(&key)
    )]);
    let ingress = Ingress::start(
        &format!(
            "DNS_SERVERS = 127.0.0.1:{}\nMAX_DKIM_SIGNATURES = 2\n",
            dns.port
        ),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let mut message =
        "From: a@pass.test\r\nTo: alice@example.test\r\nSubject: many\r\n\r\nbody\r\n".to_owned();
    for _ in 0..8 {
        message = sign(&key, "pass.test", &message);
    }
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mail.pass.test", 250).await;
    let id = c
        .deliver("a@pass.test", &["alice@example.test"], message.as_bytes())
        .await;
    let r = row(&ingress.db, id).await;
    let dkim = r.state["auth"]["dkim"].as_array().unwrap();
    assert_eq!(dkim.len(), 2, "{}", r.state["auth"]);
    assert!(ingress.log().contains("only the first MAX_DKIM_SIGNATURES"));
}

/// `pepsi-setup dns` makes a key and prints the records; published exactly as printed (by
/// a dnsmasq serving them), mail signed with that key from the MX host passes SPF, DKIM and
/// DMARC at the ingress, and the MTA-STS and TLS-RPT records resolve as printed.
#[tokio::test]
async fn the_records_pepsi_setup_dns_prints_make_mail_pass_spf_dkim_and_dmarc() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("dkim.pem");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pepsi-setup"))
        .args(["dns", "example.test", "--mx", "mx.example.test", "--json"])
        .arg("--key-file")
        .arg(&key_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let records = printed["records"].as_array().unwrap();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["MX", "TXT", "TXT", "TXT", "TXT", "TXT"]);
    assert!(
        printed["mta_sts_policy"]
            .as_str()
            .unwrap()
            .contains("mx: mx.example.test")
    );
    let mode = std::fs::metadata(&key_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // Publish exactly what was printed (TXT values in strings of at most 255 octets).
    let mut args = vec!["--host-record=mx.example.test,127.0.0.1".to_owned()];
    let mut selector = String::new();
    for r in records {
        let (name, value) = (r["name"].as_str().unwrap(), r["value"].as_str().unwrap());
        if r["type"] == "MX" {
            let (pref, host) = value.split_once(' ').unwrap();
            args.push(format!("--mx-host={name},{host},{pref}"));
        } else {
            let strings: Vec<String> = value
                .as_bytes()
                .chunks(255)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            args.push(format!("--txt-record={name},{}", strings.join(",")));
            if let Some(s) = name.strip_suffix("._domainkey.example.test") {
                selector = s.to_owned();
            }
        }
    }
    let dns = Dns::start(&args);
    let ingress = Ingress::start(
        &format!("DNS_SERVERS = 127.0.0.1:{}\n", dns.port),
        &[("mx", "ROLE = mx\n")],
    )
    .await;
    let key = pepsi_outbound::keys::load_key(&key_file).unwrap();
    let message =
        "From: a@example.test\r\nTo: alice@example.test\r\nSubject: records\r\n\r\nbody\r\n";
    let signature = DkimSigner::from_key(key)
        .domain("example.test")
        .selector(&selector)
        .headers(["From", "To", "Subject"])
        .sign(message.as_bytes())
        .unwrap();
    let signed = format!("{}{message}", signature.to_header());
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO mx.example.test", 250).await;
    let id = c
        .deliver("a@example.test", &["alice@example.test"], signed.as_bytes())
        .await;
    let auth = row(&ingress.db, id).await.state["auth"].clone();
    assert_eq!(auth["spf"]["result"], "pass", "{auth}");
    assert_eq!(auth["dkim"][0]["result"], "pass", "{auth}");
    assert_eq!(auth["dmarc"]["result"], "pass", "{auth}");

    // The MTA-STS and TLS-RPT records resolve as printed.
    let resolver = mail_auth::MessageAuthenticator::new(
        mail_auth::hickory_resolver::config::ResolverConfig::from_name_servers(vec![{
            let mut ns = mail_auth::hickory_resolver::config::NameServerConfig::udp_and_tcp(
                "127.0.0.1".parse().unwrap(),
            );
            for c in &mut ns.connections {
                c.port = dns.port;
            }
            ns
        }]),
        mail_auth::hickory_resolver::config::ResolverOpts::default(),
    )
    .unwrap();
    for r in &records[4..] {
        let name = r["name"].as_str().unwrap();
        let got = resolver.txt_raw_lookup(format!("{name}.")).await.unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            r["value"].as_str().unwrap()
        );
    }
}
