//! What the ingress counts reaches pepsi-httpd's /metrics: a real pepsi-ingress serves
//! sessions that are refused and accepted in several ways, flushes its counters into
//! pepsi.ingress_stats, and the real pepsi-httpd exposes them, with the mail log's outcomes
//! per destination domain (the busiest by name, the rest as `other`), in a document
//! Prometheus's own parser reads.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support;
use crate::support::httpd::{Auth, Httpd, prometheus_parse, sample, write_config};
use crate::support::ingress::{Client, Ingress};

#[tokio::test]
async fn ingress_counters_and_destination_outcomes_are_in_the_metrics() {
    let ingress = Ingress::start(
        "CHECK_RECIPIENTS = yes\nSTATS_INTERVAL = 200ms\nMAX_CONNECTIONS_PER_CLIENT = 50\n",
        &[("mx", "ROLE = mx\nVERIFY = no\n")],
    )
    .await;
    let port = ingress.port("mx");
    for _ in 0..2 {
        let mut c = Client::connect(port).await;
        c.ok("EHLO relay.example", 250).await;
        c.ok("MAIL FROM:<carol@example.org>", 250).await;
        c.ok("RCPT TO:<nobody@example.test>", 550).await;
        c.ok("RCPT TO:<someone@elsewhere.example>", 554).await;
        c.ok("RCPT TO:<postmaster@example.test>", 250).await;
        c.ok("DATA", 354).await;
        c.send(b"Subject: counted\r\n\r\nbody\r\n").await;
        c.ok(".", 250).await;
        c.ok("QUIT", 221).await;
    }
    // The flush runs every STATS_INTERVAL: wait for both sessions to be written.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sessions: Option<i64> = sqlx::query_scalar(
            "SELECT value FROM pepsi.ingress_stats WHERE counter = 'sessions' AND reason = ''",
        )
        .fetch_optional(&ingress.db.pool)
        .await
        .unwrap();
        if sessions.unwrap_or(0) >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ingress never flushed its counters: {}",
            ingress.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Delivered recipients in 25 domains: the 20 busiest by name, the others as `other`.
    for i in 0..25 {
        let rcpts: Vec<String> = (0..=(30 - i))
            .map(|n| format!("u{n}@d{i:02}.example"))
            .collect();
        sqlx::query(
            "INSERT INTO pepsi.mail_log (stage, event, mail_from, rcpt_to) VALUES ('relay', 'delivered', 'a@example.test', $1)",
        )
        .bind(&rcpts)
        .execute(&ingress.db.pool)
        .await
        .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let http_port = support::free_port();
    let config = write_config(
        dir.path(),
        &ingress.db.url,
        http_port,
        "[pepsi-httpd]\nMETRICS_PUBLIC = yes\n",
    );
    let mut httpd = Httpd::new(config, http_port);
    httpd.start().await;
    let r = httpd.get("/metrics", &Auth::None).await;
    assert_eq!(r.status, 200, "{r:?}");
    let doc = prometheus_parse(&r.text);
    let plain = |family: &str| sample(&doc, family, &format!("{family}_total"), json!({}));
    assert!(
        plain("pepsi_ingress_sessions").is_some_and(|n| n >= 2.0),
        "{}",
        r.text
    );
    assert_eq!(plain("pepsi_ingress_messages"), Some(2.0), "{}", r.text);
    assert_eq!(plain("pepsi_ingress_recipients"), Some(2.0), "{}", r.text);
    let refused = |status: &str| {
        sample(
            &doc,
            "pepsi_ingress_refused",
            "pepsi_ingress_refused_total",
            json!({"command": "RCPT", "status": status}),
        )
    };
    assert_eq!(refused("5.1.1"), Some(2.0), "{}", r.text);
    assert_eq!(refused("5.7.1"), Some(2.0), "{}", r.text);
    assert_eq!(doc["pepsi_ingress_refused"]["type"], "counter");

    let family = "pepsi_destination_outcomes_last_hour";
    assert_eq!(doc[family]["type"], "gauge");
    let domains: Vec<String> = doc[family]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[1]["domain"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(domains.len(), 21, "20 by name and other: {domains:?}");
    let delivered = |domain: &str| {
        sample(
            &doc,
            family,
            family,
            json!({"domain": domain, "event": "delivered"}),
        )
    };
    assert_eq!(delivered("d00.example"), Some(31.0));
    assert_eq!(delivered("d19.example"), Some(12.0));
    assert_eq!(delivered("d20.example"), None, "not among the 20 busiest");
    // d20..d24 had 11, 10, 9, 8 and 7 recipients.
    assert_eq!(delivered("other"), Some(45.0));
    httpd.stop();
}
