//! Bounces and the lists' periodic work against a real PostgreSQL and the real binaries:
//! DSNs and feedback reports (`pepsi-stage-list worker`) scored per member, delivery
//! disabled at the threshold, policy refusals not counted, soft bounces once a day, a
//! complaint turning delivery off; `pepsi-list maintain` warning, then removing, the
//! members bounces disabled, expiring requests, held posts and links, once, also when two
//! runs meet.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::json;

use crate::support::{self, Run};

const LIST: &str = env!("CARGO_BIN_EXE_pepsi-list");
const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-list");

/// The status line of a pass that ended its row.
const FINISHED: &str = "0 {\"finished\":true}";

struct Harness {
    db: TestDb,
    _dir: tempfile::TempDir,
    config: PathBuf,
    list: i64,
}

impl Harness {
    /// The list team@example.test (members alice and carol; bounce threshold 3), its
    /// stage `lists` handing the list's own mail to `deliver`.
    async fn new() -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
                 LOCAL_DOMAINS = example.test\n\n\
                 [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\
                 NEXT_STAGE = next\nBOUNCE_STAGE = bounced\n\n\
                 [stage-deliver]\nPROGRAM = pepsi-stage-discard\n\n\
                 [stage-next]\nPROGRAM = pepsi-stage-discard\n\n\
                 [stage-bounced]\nPROGRAM = pepsi-stage-discard\n",
                db.url
            ),
        )
        .unwrap();
        let list: i64 = sqlx::query_scalar(
            "INSERT INTO pepsi.mailing_list (address, display_name, bounce_score_threshold) \
             VALUES ('team@example.test', 'The Team', 3) RETURNING list_id",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        for address in ["alice@example.test", "carol@remote.test"] {
            sqlx::query(
                "INSERT INTO pepsi.list_member (list_id, address, role) VALUES ($1, $2, 'member')",
            )
            .bind(list)
            .bind(address)
            .execute(&db.pool)
            .await
            .unwrap();
        }
        Harness {
            db,
            _dir: dir,
            config,
            list,
        }
    }

    /// A report `raw` (header block, empty line, body) to `rcpt`, run through the list
    /// stage: the pass ends its row.
    async fn report(&self, rcpt: &str, raw: &str) {
        let (headers, body) = raw.split_once("\r\n\r\n").unwrap();
        let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
            .bind("")
            .bind(vec![rcpt.to_owned()])
            .bind(format!("{headers}\r\n").as_bytes())
            .bind(body.as_bytes())
            .bind(json!({}))
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
        support::claim(&self.db.pool, id, "lists").await;
        assert_eq!(
            support::run_ids(STAGE, &self.config, &[id]).await,
            vec![FINISHED]
        );
    }

    /// (delivery status, score) of a member.
    async fn member(&self, address: &str) -> (String, Option<f64>) {
        sqlx::query_as(
            "SELECT m.delivery_status, s.score::float8 FROM pepsi.list_member m \
             LEFT JOIN pepsi.list_bounce_score s USING (list_id, address) \
             WHERE m.list_id = $1 AND m.address = $2 AND m.role = 'member'",
        )
        .bind(self.list)
        .bind(address)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// The events of `event` as (address, detail).
    async fn events(&self, event: &str) -> Vec<(String, serde_json::Value)> {
        sqlx::query_as(
            "SELECT address, detail FROM pepsi.list_event_log WHERE event = $1 ORDER BY event_id",
        )
        .bind(event)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn bounce_events(&self) -> Vec<(String, String, String)> {
        sqlx::query_as(
            "SELECT address, kind, status FROM pepsi.list_bounce_event ORDER BY event_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    fn maintain(&self, args: &[&str]) -> Run {
        let run = maintain_command(&self.config, args).output().unwrap();
        let run = Run::of(run);
        assert_eq!(run.code, 0, "pepsi-list maintain {args:?}: {run:?}");
        run
    }

    /// The rows at `deliver`: (envelope sender, recipients, headers).
    async fn sent(&self) -> Vec<(String, Vec<String>, String)> {
        let rows: Vec<(String, Vec<String>, Vec<u8>)> = sqlx::query_as(
            "SELECT mail_from, rcpt_to, headers FROM pepsi.workqueue WHERE stage = 'deliver' \
             ORDER BY workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(f, r, h)| (f, r, String::from_utf8(h).unwrap()))
            .collect()
    }

    async fn sql(&self, statement: &'static str) {
        sqlx::query(statement)
            .bind(self.list)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }
}

fn maintain_command(config: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(LIST);
    c.arg("-c")
        .arg(config)
        .arg("maintain")
        .args(args)
        .env("USER", "pepsi")
        .env_remove("SUDO_USER")
        .stdin(Stdio::null());
    c
}

/// A DSN as the bounce stage writes one: multipart/report with a delivery-status part for
/// `rcpt`.
fn dsn(n: u32, rcpt: &str, status: &str, diagnostic: &str) -> String {
    format!(
        "From: Mail Delivery System <MAILER-DAEMON@mx.remote.test>\r\n\
         Subject: Undelivered Mail Returned to Sender\r\n\
         Message-ID: <dsn.{n}@mx.remote.test>\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: multipart/report; report-type=delivery-status;\r\n boundary=\"b{n}\"\r\n\
         \r\n\
         --b{n}\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n\
         --b{n}\r\nContent-Type: message/delivery-status\r\n\r\n\
         Reporting-MTA: dns; mx.remote.test\r\n\r\n\
         Final-Recipient: rfc822; {rcpt}\r\nAction: failed\r\nStatus: {status}\r\n\
         Diagnostic-Code: smtp; {diagnostic}\r\n\r\n\
         --b{n}\r\nContent-Type: text/rfc822-headers\r\n\r\n\
         From: alice@example.test\r\nSubject: lunch\r\n\r\n\
         --b{n}--\r\n"
    )
}

const CAROL_VERP: &str = "team+bounces-carol=remote.test@example.test";

/// Hard DSNs score 1 each: at the threshold (3) the member's delivery is disabled, once,
/// with a member.disable event; the report's Message-ID and diagnostic are kept.
#[tokio::test]
async fn hard_dsns_disable_a_member_at_the_threshold() {
    let h = Harness::new().await;
    for n in 1..=2 {
        h.report(
            CAROL_VERP,
            &dsn(n, "carol@remote.test", "5.1.1", "550 5.1.1 no such user"),
        )
        .await;
    }
    assert_eq!(
        h.member("carol@remote.test").await,
        ("enabled".into(), Some(2.0))
    );
    assert!(h.events("member.disable").await.is_empty());
    h.report(
        CAROL_VERP,
        &dsn(3, "carol@remote.test", "5.1.1", "550 5.1.1 no such user"),
    )
    .await;
    assert_eq!(
        h.member("carol@remote.test").await,
        ("by_bounces".into(), Some(3.0))
    );
    let disabled: Vec<_> = h.events("member.disable").await;
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    assert_eq!(disabled[0].0, "carol@remote.test");
    assert_eq!(disabled[0].1["why"], "bounces");
    assert_eq!(disabled[0].1["report_message_id"], "dsn.3@mx.remote.test");
    let at: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT disabled_at FROM pepsi.list_bounce_score WHERE address = 'carol@remote.test'",
    )
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    assert!(at.is_some());
    // A fourth counts on, but disables nothing again.
    h.report(
        CAROL_VERP,
        &dsn(4, "carol@remote.test", "5.1.1", "550 5.1.1 no such user"),
    )
    .await;
    assert_eq!(
        h.member("carol@remote.test").await,
        ("by_bounces".into(), Some(4.0))
    );
    assert_eq!(h.events("member.disable").await.len(), 1);
    let kept: (String, String) = sqlx::query_as(
        "SELECT diagnostic, report_message_id FROM pepsi.list_bounce_event \
         ORDER BY event_id LIMIT 1",
    )
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(
        kept,
        (
            "smtp; 550 5.1.1 no such user".to_owned(),
            "dsn.1@mx.remote.test".to_owned()
        )
    );
}

/// A 5.7.1 refusal (a spam filter's) is recorded as policy and never counted, however
/// many arrive: the member stays enabled with no score.
#[tokio::test]
async fn a_policy_refusal_does_not_count() {
    let h = Harness::new().await;
    for n in 1..=4 {
        h.report(
            CAROL_VERP,
            &dsn(
                n,
                "carol@remote.test",
                "5.7.1",
                "550 5.7.1 message refused as spam",
            ),
        )
        .await;
    }
    assert_eq!(
        h.member("carol@remote.test").await,
        ("enabled".into(), None)
    );
    let events = h.bounce_events().await;
    assert_eq!(events.len(), 4);
    assert!(
        events.iter().all(|e| e.1 == "policy" && e.2 == "5.7.1"),
        "{events:?}"
    );
}

/// Soft bounces score 0.5, at most once a day; a score older than bounce_info_stale_after
/// starts again from 0.
#[tokio::test]
async fn soft_bounces_count_half_once_a_day() {
    let h = Harness::new().await;
    h.report(
        CAROL_VERP,
        &dsn(1, "carol@remote.test", "4.2.2", "452 4.2.2 mailbox full"),
    )
    .await;
    h.report(
        CAROL_VERP,
        &dsn(2, "carol@remote.test", "4.2.2", "452 4.2.2 mailbox full"),
    )
    .await;
    assert_eq!(
        h.member("carol@remote.test").await,
        ("enabled".into(), Some(0.5))
    );
    // The next day.
    h.sql(
        "UPDATE pepsi.list_bounce_score SET last_bounce_on = current_date - 1 WHERE list_id = $1",
    )
    .await;
    h.report(
        CAROL_VERP,
        &dsn(3, "carol@remote.test", "4.2.2", "452 4.2.2 mailbox full"),
    )
    .await;
    assert_eq!(
        h.member("carol@remote.test").await,
        ("enabled".into(), Some(1.0))
    );
    // Thirty days later (the default limit is 7 days): from 0 again.
    h.sql(
        "UPDATE pepsi.list_bounce_score SET last_bounce_on = current_date - 30 WHERE list_id = $1",
    )
    .await;
    h.report(
        CAROL_VERP,
        &dsn(4, "carol@remote.test", "5.1.1", "550 5.1.1 gone"),
    )
    .await;
    assert_eq!(
        h.member("carol@remote.test").await,
        ("enabled".into(), Some(1.0))
    );
    assert_eq!(h.bounce_events().await.len(), 4, "every report is recorded");
}

/// An ARF complaint about a list copy turns the member's delivery off as their own wish
/// (by_user), logged; a DSN to the plain -bounces address counts for the member its
/// Final-Recipient names, and one naming no member is dropped.
#[tokio::test]
async fn a_complaint_unsubscribes_and_a_plain_bounce_names_its_member() {
    let h = Harness::new().await;
    let arf = "From: fbl@isp.test\r\nSubject: complaint\r\nMessage-ID: <arf.1@isp.test>\r\n\
        MIME-Version: 1.0\r\n\
        Content-Type: multipart/report; report-type=feedback-report; boundary=\"f\"\r\n\r\n\
        --f\r\nContent-Type: text/plain\r\n\r\nA complaint about a message.\r\n\
        --f\r\nContent-Type: message/feedback-report\r\n\r\n\
        Feedback-Type: abuse\r\nUser-Agent: isp-fbl/1.0\r\nVersion: 1\r\n\
        Original-Rcpt-To: alice@example.test\r\n\r\n\
        --f\r\nContent-Type: text/rfc822-headers\r\n\r\nSubject: lunch\r\n\r\n--f--\r\n";
    h.report("team+bounces-alice=example.test@example.test", arf)
        .await;
    assert_eq!(
        h.member("alice@example.test").await,
        ("by_user".into(), None)
    );
    let disabled = h.events("member.disable").await;
    assert_eq!(disabled.len(), 1);
    assert_eq!(disabled[0].1["why"], "complaint");
    assert_eq!(
        h.bounce_events().await,
        vec![("alice@example.test".into(), "complaint".into(), "".into())]
    );
    // To team-bounces@, naming carol: hers; naming a stranger: nobody's.
    h.report(
        "team-bounces@example.test",
        &dsn(5, "Carol@Remote.test", "5.1.1", "550 5.1.1 unknown"),
    )
    .await;
    h.report(
        "team-bounces@example.test",
        &dsn(6, "zed@else.test", "5.1.1", "550 5.1.1 unknown"),
    )
    .await;
    assert_eq!(
        h.member("carol@remote.test").await,
        ("enabled".into(), Some(1.0))
    );
    assert_eq!(h.bounce_events().await.len(), 2);
}

/// The list with carol disabled by bounces, two warnings an hour apart, expired and
/// waiting requests, held posts and member links, and an old confirmation window.
async fn maintenance_setup(h: &Harness) {
    h.sql(
        "UPDATE pepsi.mailing_list SET bounce_warnings = 2, bounce_warning_interval = '1 hour' \
         WHERE list_id = $1",
    )
    .await;
    h.sql(
        "UPDATE pepsi.list_member SET delivery_status = 'by_bounces' \
         WHERE list_id = $1 AND address = 'carol@remote.test'",
    )
    .await;
    h.sql(
        "INSERT INTO pepsi.list_bounce_score (list_id, address, score, last_bounce_on, disabled_at) \
         VALUES ($1, 'carol@remote.test', 3, current_date, now())",
    )
    .await;
    h.sql(
        "INSERT INTO pepsi.list_pending (list_id, address, kind, token_hash, requested_via, expires_at) \
         VALUES ($1, 'old@else.test', 'subscribe', sha256('a'), 'mail', now() - interval '1 hour'), \
                ($1, 'new@else.test', 'subscribe', sha256('b'), 'mail', now() + interval '1 day')",
    )
    .await;
    h.sql(
        "INSERT INTO pepsi.list_held_message \
         (list_id, sender, mail_from, subject, message_id, reason, headers, body, expires_at) \
         VALUES ($1, 'stale@else.test', 'stale@else.test', 'old', 'old@else.test', 'nonmember', \
                 '', '', now() - interval '1 minute'), \
                ($1, 'fresh@else.test', 'fresh@else.test', 'new', 'new@else.test', 'nonmember', \
                 '', '', now() + interval '1 day')",
    )
    .await;
    h.sql(
        "INSERT INTO pepsi.list_member_link (token_hash, address, list_id, expires_at) \
         VALUES (sha256('l1'), 'alice@example.test', $1, now() - interval '1 minute'), \
                (sha256('l2'), 'alice@example.test', $1, now() + interval '1 hour')",
    )
    .await;
    h.sql(
        "INSERT INTO pepsi.list_confirm_rate (list_id, key_kind, key, window_start, count) \
         VALUES ($1, 'address', 'old@else.test', now() - interval '1 day', 2), \
                ($1, 'address', 'new@else.test', now(), 1)",
    )
    .await;
}

async fn count(h: &Harness, statement: &'static str) -> i64 {
    sqlx::query_scalar(statement)
        .fetch_one(&h.db.pool)
        .await
        .unwrap()
}

/// maintain warns a member disabled by bounces every interval, from the list's -bounces
/// address at the list stage's DELIVER_STAGE, removes them after the last warning, expires
/// what is past its time (a held post with an expire decision), and a second run at once
/// does nothing more.
#[tokio::test]
async fn maintain_warns_then_removes_and_expires_once() {
    let h = Harness::new().await;
    maintenance_setup(&h).await;
    let first = h.maintain(&["--json"]).json();
    let team = &first["lists"][0];
    assert_eq!(team["list"], "team@example.test");
    assert_eq!(team["warned"][0]["address"], "carol@remote.test");
    assert_eq!(team["warned"][0]["warning"], 1);
    assert_eq!(team["warned"][0]["of"], 2);
    assert_eq!(team["pending_expired"], 1);
    assert_eq!(team["held_expired"].as_array().unwrap().len(), 1);
    assert_eq!(first["member_links_expired"], 1);
    assert_eq!(first["confirm_windows_deleted"], 1);
    let sent = h.sent().await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "team-bounces@example.test");
    assert_eq!(sent[0].1, vec!["carol@remote.test"]);
    assert!(
        sent[0]
            .2
            .contains("Subject: Your delivery from team@example.test is disabled")
            && sent[0].2.contains("Auto-Submitted: auto-generated"),
        "{}",
        sent[0].2
    );
    assert_eq!(
        count(&h, "SELECT count(*) FROM pepsi.list_pending").await,
        1,
        "the waiting request stays"
    );
    let decision: (String, String, String) =
        sqlx::query_as("SELECT sender, action, moderator FROM pepsi.list_moderation_decision")
            .fetch_one(&h.db.pool)
            .await
            .unwrap();
    assert_eq!(
        decision,
        (
            "stale@else.test".into(),
            "expire".into(),
            "pepsi-list maintain".into()
        )
    );
    assert_eq!(h.events("post.expire").await.len(), 1);
    assert_eq!(
        count(&h, "SELECT count(*) FROM pepsi.list_held_message").await,
        1
    );
    assert_eq!(
        count(&h, "SELECT count(*) FROM pepsi.list_member_link").await,
        1
    );
    assert_eq!(
        count(&h, "SELECT count(*) FROM pepsi.list_confirm_rate").await,
        1
    );

    // At once again: nothing is due.
    let again = h.maintain(&[]);
    assert_eq!(again.stdout, "nothing due on 1 lists\n", "{again:?}");
    assert_eq!(h.sent().await.len(), 1);

    // An interval later: the second and last warning; another: carol removed.
    let later = "UPDATE pepsi.list_bounce_score SET last_warning_at = now() - interval '61 minutes' \
                 WHERE list_id = $1";
    h.sql(later).await;
    let second = h.maintain(&[]);
    assert_eq!(
        second.stdout, "team@example.test: bounce warning 2 of 2 to carol@remote.test\n",
        "{second:?}"
    );
    assert_eq!(h.maintain(&[]).stdout, "nothing due on 1 lists\n");
    h.sql(later).await;
    let third = h.maintain(&["--json"]).json();
    assert_eq!(third["lists"][0]["removed"], json!(["carol@remote.test"]));
    assert_eq!(
        count(
            &h,
            "SELECT count(*) FROM pepsi.list_member WHERE address = 'carol@remote.test'"
        )
        .await,
        0
    );
    let removed = h.events("member.remove").await;
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].1["why"], "bounces");
    assert_eq!(h.events("member.warn").await.len(), 2);
    assert_eq!(h.sent().await.len(), 2, "two warnings in all");
    assert_eq!(h.maintain(&[]).stdout, "nothing due on 1 lists\n");
    assert_eq!(
        count(
            &h,
            "SELECT count(*) FROM pepsi.event_log WHERE action = 'list.maintain'"
        )
        .await,
        3,
        "one audit row per run that changed something"
    );
}

/// Two runs at once (two hosts): the warning goes out once, the held post expires once.
#[tokio::test]
async fn two_maintain_runs_at_once_do_the_work_once() {
    let h = Harness::new().await;
    maintenance_setup(&h).await;
    let runs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            maintain_command(&h.config, &["--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in runs {
        let out = Run::of(r.wait_with_output().unwrap());
        assert_eq!(out.code, 0, "{out:?}");
    }
    assert_eq!(h.sent().await.len(), 1);
    assert_eq!(h.events("member.warn").await.len(), 1);
    assert_eq!(h.events("post.expire").await.len(), 1);
    assert_eq!(
        count(&h, "SELECT count(*) FROM pepsi.list_moderation_decision").await,
        1
    );
}
