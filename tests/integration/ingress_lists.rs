//! pepsi-ingress and mailing lists: with CHECK_RECIPIENTS on, RCPT to an address of a list
//! that exists in `pepsi.mailing_list` (its post address and every command address) is
//! accepted and the message stored, the same forms for a list that does not exist are
//! refused with 550 5.1.1, and the RCPT quota check never refuses a list's address.

use crate::support::ingress::{Client, Ingress, row};

const LIST_ADDRESSES: &[&str] = &[
    "team@example.test",
    "Team@EXAMPLE.test",
    "team-join@example.test",
    "team-subscribe@example.test",
    "team-leave@example.test",
    "team-unsubscribe@example.test",
    "team-request@example.test",
    "team-owner@example.test",
    "team-bounces@example.test",
    "team-confirm+0a1b2c@example.test",
    "team+bounces-bob=example.net@example.test",
];

async fn add_list(ingress: &Ingress, address: &str) {
    sqlx::query("INSERT INTO pepsi.mailing_list (address) VALUES ($1)")
        .bind(address)
        .execute(&ingress.db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn rcpt_accepts_the_addresses_of_existing_lists_only() {
    let ingress = Ingress::start(
        // Every refusal below in one session: MAX_BAD_COMMANDS would close it at 10.
        "CHECK_RECIPIENTS = yes\nMAX_BAD_COMMANDS = 100\n\n[pepsi]\nRECIPIENT_DELIMITER = +\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    let mut c = Client::connect(ingress.port("mx")).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    // No list yet: its addresses are unknown like any other (and unknown is never cached,
    // so the list made next is seen at once).
    for address in LIST_ADDRESSES {
        let text = c.ok(&format!("RCPT TO:<{address}>"), 550).await;
        assert!(
            text.starts_with("5.1.1 no such mailbox"),
            "{address}: {text}"
        );
    }
    add_list(&ingress, "team@example.test").await;
    for address in LIST_ADDRESSES {
        c.ok(&format!("RCPT TO:<{address}>"), 250).await;
    }
    for unknown in [
        // No such list, with or without a command suffix.
        "nolist@example.test",
        "nolist-join@example.test",
        "nolist-confirm+0a1b2c@example.test",
        "nolist+bounces-bob=example.net@example.test",
        // A list's name with what is not one of its addresses: a token that is not letters
        // and digits, a VERP tail that is not an address, an extension on the post address,
        // a suffix the grammar does not have.
        "team-confirm+a.b@example.test",
        "team-confirm+@example.test",
        "team+bounces-nobody@example.test",
        "team+news@example.test",
        "team-digest@example.test",
    ] {
        let text = c.ok(&format!("RCPT TO:<{unknown}>"), 550).await;
        assert!(
            text.starts_with("5.1.1 no such mailbox"),
            "{unknown}: {text}"
        );
    }
    c.ok("RSET", 250).await;

    // A post to the list is stored for the pipeline, addressed to the list.
    let id = c
        .deliver(
            "carol@example.org",
            &["team@example.test"],
            b"From: carol@example.org\r\nTo: team@example.test\r\nSubject: hello team\r\n\r\nHi all.\r\n",
        )
        .await;
    let stored = row(&ingress.db, id).await;
    assert_eq!(stored.rcpt_to, ["team@example.test"]);
    assert_eq!(stored.mail_from, "carol@example.org");
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.workqueue WHERE 'team@example.test' = ANY(rcpt_to)",
    )
    .fetch_one(&ingress.db.pool)
    .await
    .unwrap();
    assert_eq!(rows, 1);
    c.ok("QUIT", 221).await;
}

/// A list has no mailbox, so nothing of the RCPT quota check applies to it: with its
/// domain's total exhausted, a mailbox of the domain is refused with 452 4.2.2 while the
/// list's addresses are accepted, on a listener that checks recipients and on one that
/// does not.
#[tokio::test]
async fn a_full_domain_does_not_refuse_its_lists_at_rcpt() {
    let ingress = Ingress::start(
        "CHECK_QUOTA = yes\nQUOTA_CACHE_TTL = 1h\n\n[pepsi]\nRECIPIENT_DELIMITER = +\n",
        &[
            ("mx", "ROLE = mx\nVERIFY = no\nCHECK_RECIPIENTS = yes\n"),
            ("open", "ROLE = mx\nVERIFY = no\nCHECK_RECIPIENTS = no\n"),
        ],
    )
    .await;
    ingress.add_account("alice@example.test", "pw").await;
    add_list(&ingress, "team@example.test").await;
    sqlx::query("INSERT INTO pepsi.quota_limit (scope, messages) VALUES ('@example.test', 1)")
        .execute(&ingress.db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pepsi.quota_usage (mailbox, storage, messages) VALUES ('alice@example.test', 100, 1)",
    )
    .execute(&ingress.db.pool)
    .await
    .unwrap();
    for listener in ["mx", "open"] {
        let mut c = Client::connect(ingress.port(listener)).await;
        c.ok("EHLO relay.example", 250).await;
        c.ok("MAIL FROM:<carol@example.org>", 250).await;
        let text = c.ok("RCPT TO:<alice@example.test>", 452).await;
        assert!(text.starts_with("4.2.2"), "{listener}: {text}");
        // Twice each: the second answer comes from the kept quota answer (QUOTA_CACHE_TTL).
        for address in LIST_ADDRESSES.iter().chain(LIST_ADDRESSES) {
            c.ok(&format!("RCPT TO:<{address}>"), 250).await;
        }
        let text = c.ok("RCPT TO:<alice@example.test>", 452).await;
        assert!(text.starts_with("4.2.2"), "{listener}: {text}");
        c.ok("QUIT", 221).await;
    }
}
