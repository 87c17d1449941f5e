//! pepsi-ingress and the shared local-recipient resolver: a domain the settings layer marks
//! local takes unauthenticated mail like a configured one, recipient extensions are checked
//! against their mailbox, and every other domain is still refused.

use crate::support::ingress::{Client, Ingress};

#[tokio::test]
async fn settings_layer_local_domains_take_unauthenticated_mail() {
    let ingress = Ingress::start(
        "CHECK_RECIPIENTS = yes\nDOMAIN_CACHE_TTL = 1s\n\n[pepsi]\nRECIPIENT_DELIMITER = +\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    ingress.add_account("alice@hosted.test", "pw").await;
    ingress.add_account("bob@example.test", "pw").await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    // Not local yet: refused like any other domain.
    let text = c.ok("RCPT TO:<alice@hosted.test>", 554).await;
    assert!(text.starts_with("5.7.1"), "{text}");
    sqlx::query(
        "INSERT INTO pepsi.settings (address, name, value) VALUES ('@hosted.test', 'local_domain', 'true')",
    )
    .execute(&ingress.db.pool)
    .await
    .unwrap();
    // The answer about the domain is reused for DOMAIN_CACHE_TTL (a flood of RCPTs to an
    // unlisted domain costs one query per period), then asked again.
    let text = c.ok("RCPT TO:<alice@HOSTED.test>", 554).await;
    assert!(text.starts_with("5.7.1"), "still the kept answer: {text}");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    c.ok("RCPT TO:<alice@hosted.test>", 250).await;
    c.ok("RCPT TO:<Alice+news@HOSTED.test>", 250).await;
    c.ok("RCPT TO:<bob+x@example.test>", 250).await;
    let text = c.ok("RCPT TO:<nobody@hosted.test>", 550).await;
    assert!(text.starts_with("5.1.1"), "{text}");
    let text = c.ok("RCPT TO:<alice@other.test>", 554).await;
    assert!(text.starts_with("5.7.1"), "{text}");
}

#[tokio::test]
async fn the_mx_refuses_unknown_local_recipients_and_knows_every_real_one() {
    let dir = tempfile::tempdir().unwrap();
    let aliases = dir.path().join("aliases");
    std::fs::write(
        &aliases,
        "abuse: alice@example.test\nsales@example.test: bob@example.test\n@catch.test: alice@example.test\n",
    )
    .unwrap();
    let ingress = Ingress::start(
        &format!(
            "# CHECK_RECIPIENTS is left to the listener's default: on for an MX\n\
             LOCAL_DOMAINS = example.test hosted.test catch.test\n\n\
             [pepsi]\nRECIPIENT_DELIMITER = +\n\n\
             [stage-aliases]\nPROGRAM = pepsi-stage-aliases\nALIAS_FILE = {}\n",
            aliases.display()
        ),
        &[
            ("mx", "ROLE = mx\nVERIFY = no\n"),
            ("open", "ROLE = mx\nVERIFY = no\nCHECK_RECIPIENTS = no\n"),
        ],
    )
    .await;
    ingress.add_account("alice@example.test", "pw").await;
    sqlx::query(
        "INSERT INTO pepsi.settings (address, name, value) VALUES \
         ('team@example.test', 'alias', '\"alice@example.test\"'), \
         ('@hosted.test', 'catchall', '\"alice@example.test\"')",
    )
    .execute(&ingress.db.pool)
    .await
    .unwrap();
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    for known in [
        "alice@example.test",
        "Alice+news@example.test",
        "postmaster@example.test",
        "abuse@example.test",
        "sales@example.test",
        "team@example.test",
        "anyone@hosted.test",
        "anyone@catch.test",
        "SRS0=HHHH=TT=remote.test=dest@example.test",
    ] {
        c.ok(&format!("RCPT TO:<{known}>"), 250).await;
    }
    let text = c.ok("RCPT TO:<nobody@example.test>", 550).await;
    assert!(text.starts_with("5.1.1 no such mailbox"), "{text}");
    // A listener with the check off takes any local-part (and leaves the bounce to delivery).
    let mut c = Client::connect(ingress.port("open")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    c.ok("RCPT TO:<nobody@example.test>", 250).await;
}

#[tokio::test]
async fn a_recipient_found_is_reused_for_recipient_cache_ttl_and_a_new_one_is_seen_at_once() {
    let ingress = Ingress::start(
        "CHECK_RECIPIENTS = yes\nRECIPIENT_CACHE_TTL = 1h\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    // Unknown answers are never kept: a mailbox made a moment later is accepted at once.
    let text = c.ok("RCPT TO:<dora@example.test>", 550).await;
    assert!(text.starts_with("5.1.1"), "{text}");
    ingress.add_account("dora@example.test", "pw").await;
    c.ok("RCPT TO:<dora@example.test>", 250).await;
    // A found recipient is reused: with its account gone it is still accepted for the TTL
    // (its delivery would then fail), proving no lookup was made.
    sqlx::query("DELETE FROM pepsi.mailbox_account WHERE address = 'dora@example.test'")
        .execute(&ingress.db.pool)
        .await
        .unwrap();
    for _ in 0..3 {
        c.ok("RCPT TO:<Dora@example.test>", 250).await;
    }

    // With the cache off every RCPT asks, and the removed account is refused.
    let off = Ingress::start(
        "CHECK_RECIPIENTS = yes\nRECIPIENT_CACHE_TTL = 0s\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    off.add_account("dora@example.test", "pw").await;
    let mut c = Client::connect(off.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    c.ok("RCPT TO:<dora@example.test>", 250).await;
    sqlx::query("DELETE FROM pepsi.mailbox_account WHERE address = 'dora@example.test'")
        .execute(&off.db.pool)
        .await
        .unwrap();
    let text = c.ok("RCPT TO:<dora@example.test>", 550).await;
    assert!(text.starts_with("5.1.1"), "{text}");
}

/// A database that takes a connection but never answers (here: the tables the lookups read
/// locked by the test; in production a primary gone without closing its connections) holds
/// no RCPT past LOOKUP_TIMEOUT: the recipient check and the local-domain lookup each answer
/// 451 4.3.0 and say why in the log, and once the database answers again so does RCPT.
#[tokio::test]
async fn a_database_that_does_not_answer_gets_rcpt_451_after_lookup_timeout() {
    let ingress = Ingress::start(
        "CHECK_RECIPIENTS = yes\nLOOKUP_TIMEOUT = 1s\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    ingress.add_account("dora@example.test", "pw").await;
    let mut blocker = ingress.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE pepsi.mailbox_account, pepsi.settings IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    // A configured domain: the recipient check waits on the locked account table.
    let text = c.ok("RCPT TO:<dora@example.test>", 451).await;
    assert!(text.starts_with("4.3.0"), "{text}");
    // An unlisted domain: the settings layer is asked whether it is local.
    let text = c.ok("RCPT TO:<alice@hosted.test>", 451).await;
    assert!(text.starts_with("4.3.0"), "{text}");
    let log = ingress.log();
    assert_eq!(
        log.matches("did not answer within LOOKUP_TIMEOUT").count(),
        2,
        "{log}"
    );
    blocker.rollback().await.unwrap();
    c.ok("RCPT TO:<dora@example.test>", 250).await;
    c.ok("QUIT", 221).await;
}
