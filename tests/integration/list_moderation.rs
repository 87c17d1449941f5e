//! Moderation from the terminal against a real PostgreSQL and the real binaries: posts the
//! list stage held (`pepsi-stage-list worker`) are listed by `pepsi-list held`, approved
//! (back at the list stage with `state.list_approval`, then fanned out to the members by the
//! stage), rejected (a 5.7.1 DSN at the bounce stage) or discarded, each once, with a
//! decision row and events; bans are checked by PostgreSQL before they are stored and
//! refuse the banned senders' posts.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support::{self, Run};

const LIST: &str = env!("CARGO_BIN_EXE_pepsi-list");
const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-list");

/// The status line of a pass that ended its row.
const FINISHED: &str = "0 {\"finished\":true}";

struct Harness {
    db: TestDb,
    dir: tempfile::TempDir,
    config: PathBuf,
}

/// The stages of the test's pipeline: the list stage `lists`, its members' copies to
/// `deliver`, other recipients to `next`, DSNs from `bounced`.
const STAGES: &str = "[stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\
    NEXT_STAGE = next\nBOUNCE_STAGE = bounced\n\n\
    [stage-deliver]\nPROGRAM = pepsi-stage-discard\n\n\
    [stage-next]\nPROGRAM = pepsi-stage-discard\n\n\
    [stage-bounced]\nPROGRAM = pepsi-stage-discard\n";

impl Harness {
    /// The list team@example.test with members alice and carol.
    async fn new() -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
                 LOCAL_DOMAINS = example.test\n\n{STAGES}",
                db.url
            ),
        )
        .unwrap();
        let list: i64 = sqlx::query_scalar(
            "INSERT INTO pepsi.mailing_list (address, display_name) \
             VALUES ('team@example.test', 'The Team') RETURNING list_id",
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
        Harness { db, dir, config }
    }

    /// Runs pepsi-list on `config` as the user `ops-alice`.
    fn run_with(&self, config: &Path, args: &[&str]) -> Run {
        let out = Command::new(LIST)
            .arg("-c")
            .arg(config)
            .args(args)
            .env("USER", "ops-alice")
            .env_remove("SUDO_USER")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Run::of(out)
    }

    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run_with(&self.config, args);
        assert_eq!(run.code, 0, "pepsi-list {args:?}: {run:?}");
        run
    }

    /// A refusal with exit status `code` whose message holds `says`.
    fn refused_with(&self, config: &Path, args: &[&str], code: i32, says: &str) {
        let run = self.run_with(config, args);
        assert_eq!(run.code, code, "pepsi-list {args:?}: {run:?}");
        assert!(
            run.stderr.starts_with("pepsi-list: ") && run.stderr.contains(says),
            "pepsi-list {args:?} should say {says:?}: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{run:?}");
    }

    fn refused(&self, args: &[&str], code: i32, says: &str) {
        self.refused_with(&self.config, args, code, says)
    }

    /// A post from `from` to the list, running at the list stage.
    async fn post(&self, from: &str, subject: &str) -> i64 {
        let headers = format!(
            "From: {from}\r\nTo: team@example.test\r\nSubject: {subject}\r\n\
             Message-ID: <{subject}@else.test>\r\n"
        );
        let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
            .bind(from)
            .bind(vec!["team@example.test".to_owned()])
            .bind(headers.as_bytes())
            .bind(b"Hello, list.\r\n".as_slice())
            .bind(json!({}))
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
        support::claim(&self.db.pool, id, "lists").await;
        id
    }

    /// Runs the list stage's worker on the rows `ids`; every pass ends its row.
    async fn stage(&self, ids: &[i64]) {
        assert_eq!(
            support::run_ids(STAGE, &self.config, ids).await,
            vec![FINISHED; ids.len()]
        );
    }

    /// The rows at `stage`: (id, envelope sender, recipients, state).
    async fn rows_at(&self, stage: &str) -> Vec<(i64, String, Vec<String>, Value)> {
        sqlx::query_as(
            "SELECT workqueue_id, mail_from, rcpt_to, state FROM pepsi.workqueue \
              WHERE stage = $1 ORDER BY workqueue_id",
        )
        .bind(stage)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

/// Three posts from a nonmember are held; one is approved and reaches both members through
/// the list stage, once; one is rejected with a DSN to its sender; one is discarded. Each
/// decision is written, by the invoking user.
#[tokio::test]
async fn held_posts_are_approved_rejected_and_discarded() {
    let h = Harness::new().await;
    let mut posts = Vec::new();
    for subject in ["one", "two", "three"] {
        posts.push(h.post("stranger@else.test", subject).await);
    }
    h.stage(&posts).await;
    assert!(h.rows_at("deliver").await.is_empty(), "all three held");

    let held = h.ok(&["held", "team@example.test", "--json"]).json();
    let held = held["held"].as_array().unwrap().clone();
    let summary: Vec<(String, String, String)> = held
        .iter()
        .map(|p| {
            (
                p["sender"].as_str().unwrap().to_owned(),
                p["subject"].as_str().unwrap().to_owned(),
                p["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let reason = "stranger@else.test is not a member of the list".to_owned();
    assert_eq!(
        summary,
        ["one", "two", "three"]
            .iter()
            .map(|s| (
                "stranger@else.test".to_owned(),
                s.to_string(),
                reason.clone()
            ))
            .collect::<Vec<_>>()
    );
    assert!(held[0]["size"].as_i64().unwrap() > 100, "{held:?}");
    assert!(held[0]["expires_at"].is_string(), "{held:?}");
    let ids: Vec<String> = held
        .iter()
        .map(|p| p["id"].as_i64().unwrap().to_string())
        .collect();
    let text = h.ok(&["held", "team@example.test"]).stdout;
    assert!(
        text.starts_with("ID") && text.contains("stranger@else.test") && text.contains("three"),
        "{text}"
    );

    // Approved: back at the list stage for the list alone, marked approved by ops-alice.
    let done = h
        .ok(&["approve", "team@example.test", &ids[0], "--json"])
        .json();
    assert_eq!(done["action"], "approve");
    assert_eq!(done["stage"], "lists");
    let queued = done["posts"][0]["queue_id"].as_i64().unwrap();
    let at_list = h.rows_at("lists").await;
    assert_eq!(at_list.len(), 1, "{at_list:?}");
    let (id, mail_from, rcpt, state) = &at_list[0];
    assert_eq!(*id, queued);
    assert_eq!(mail_from, "stranger@else.test");
    assert_eq!(rcpt, &vec!["team@example.test".to_owned()]);
    assert_eq!(state["list_approval"]["list"], "team@example.test");
    assert_eq!(
        state["list_approval"]["held_id"]
            .as_i64()
            .unwrap()
            .to_string(),
        ids[0]
    );
    assert_eq!(state["list_approval"]["moderator"], "ops-alice");
    // The list stage sends it to the members, although the list holds nonmembers' posts.
    support::claim(&h.db.pool, queued, "lists").await;
    h.stage(&[queued]).await;
    let copies: Vec<Vec<String>> = h
        .rows_at("deliver")
        .await
        .into_iter()
        .map(|r| r.2)
        .collect();
    assert_eq!(
        copies,
        vec![
            vec!["alice@example.test".to_owned()],
            vec!["carol@remote.test".to_owned()]
        ]
    );
    // Once only.
    h.refused(
        &["approve", "team@example.test", &ids[0]],
        1,
        &format!("no held post {}", ids[0]),
    );
    assert!(h.rows_at("lists").await.is_empty());

    // Rejected: a DSN to the sender from the list stage's BOUNCE_STAGE.
    let text = h
        .ok(&[
            "reject",
            "team@example.test",
            &ids[1],
            "--reason",
            "off topic",
        ])
        .stdout;
    assert!(
        text.contains("rejected: the sender's notice is row"),
        "{text}"
    );
    let bounced = h.rows_at("bounced").await;
    assert_eq!(bounced.len(), 1, "{bounced:?}");
    let bounce = &bounced[0].3["bounce"];
    assert_eq!(bounce["kind"], "permanent");
    assert_eq!(
        bounce["recipients"]["team@example.test"]["enhanced_status"],
        "5.7.1"
    );
    assert_eq!(
        bounce["diagnostic"],
        "rejected by the list's moderator: off topic"
    );
    assert_eq!(bounced[0].1, "stranger@else.test");

    // Discarded: gone, nothing sent.
    h.ok(&["discard", "team@example.test", &ids[2]]);
    let held = h.ok(&["held", "team@example.test", "--json"]).json();
    assert_eq!(held["held"], json!([]));
    assert_eq!(h.rows_at("bounced").await.len(), 1);
    assert_eq!(h.rows_at("deliver").await.len(), 2);

    let decisions: Vec<(String, String, String, String, String)> = sqlx::query_as(
        "SELECT subject_kind, action, sender, moderator, reason \
           FROM pepsi.list_moderation_decision ORDER BY decision_id",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap();
    let d = |action: &str, reason: &str| {
        (
            "post".to_owned(),
            action.to_owned(),
            "stranger@else.test".to_owned(),
            "ops-alice".to_owned(),
            reason.to_owned(),
        )
    };
    assert_eq!(
        decisions,
        vec![d("approve", ""), d("reject", "off topic"), d("discard", "")]
    );
    let events: Vec<(String, String)> = sqlx::query_as(
        "SELECT event, actor FROM pepsi.list_event_log WHERE event LIKE 'post.%' \
          ORDER BY event_id",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap();
    let ops = |e: &str| (e.to_owned(), "ops-alice".to_owned());
    assert_eq!(
        events,
        vec![ops("post.approve"), ops("post.reject"), ops("post.discard")]
    );
    let audit: Vec<String> =
        sqlx::query_scalar("SELECT action FROM pepsi.event_log ORDER BY event_id")
            .fetch_all(&h.db.pool)
            .await
            .unwrap();
    assert_eq!(audit, vec!["list.approve", "list.reject", "list.discard"]);

    // Two list stages: the operator must say which.
    let two = h.dir.path().join("two.conf");
    std::fs::write(
        &two,
        format!(
            "[database]\nURL = {}\n\n{STAGES}\n[stage-news]\nPROGRAM = pepsi-stage-list\n",
            h.db.url
        ),
    )
    .unwrap();
    h.refused_with(
        &two,
        &["approve", "team@example.test", "1"],
        2,
        "2 stages run pepsi-stage-list (lists, news): say which with --stage NAME",
    );
}

/// A ban whose regular expression PostgreSQL refuses is not stored; the banned senders'
/// posts (by pattern on the list, by address on every list) are refused by the stage; a
/// lifted ban is gone.
#[tokio::test]
async fn bans_are_checked_and_refuse_posts() {
    let h = Harness::new().await;
    h.refused(
        &["ban", "team@example.test", "^(spam"],
        2,
        "is not a valid regular expression",
    );
    h.refused(
        &["ban", "team@example.test"],
        2,
        "give the list and the pattern",
    );
    h.refused(&["ban", "team@example.test", "nobody"], 2, "ban pattern");
    h.ok(&[
        "ban",
        "team@example.test",
        "^.*@spam\\.test$",
        "--reason",
        "spam run",
    ]);
    let again = h
        .ok(&["ban", "team@example.test", "^.*@spam\\.test$"])
        .stdout;
    assert!(again.contains("already"), "{again}");
    h.ok(&["ban", "--all", "Troll@Else.test"]);
    let bans = h.ok(&["bans", "team@example.test", "--json"]).json();
    let listed: Vec<(Value, Value)> = bans["bans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["list"].clone(), b["pattern"].clone()))
        .collect();
    assert_eq!(
        listed,
        vec![
            (json!("team@example.test"), json!("^.*@spam\\.test$")),
            (Value::Null, json!("troll@else.test")),
        ]
    );

    let spam = h.post("x@spam.test", "buy").await;
    let troll = h.post("troll@else.test", "flame").await;
    h.stage(&[spam, troll]).await;
    let bounced = h.rows_at("bounced").await;
    assert_eq!(bounced.len(), 2, "{bounced:?}");
    for (b, who) in bounced.iter().zip(["x@spam.test", "troll@else.test"]) {
        let text = b.3["bounce"].to_string();
        assert!(
            text.contains("5.7.1") && text.contains(&format!("{who} may not post")),
            "{text}"
        );
    }
    let held = h.ok(&["held", "team@example.test", "--json"]).json();
    assert_eq!(held["held"], json!([]), "a ban refuses, it does not hold");

    let lifted = h.ok(&["unban", "--all", "troll@else.test"]).stdout;
    assert_eq!(
        lifted,
        "lifted the ban of troll@else.test from every list\n"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_ban")
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
    let events: Vec<(Option<i64>, String, String)> = sqlx::query_as(
        "SELECT list_id, address, event FROM pepsi.list_event_log ORDER BY event_id",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap();
    let events: Vec<(bool, &str, &str)> = events
        .iter()
        .map(|(l, a, e)| (l.is_some(), a.as_str(), e.as_str()))
        .collect();
    assert_eq!(
        events,
        vec![
            (true, "^.*@spam\\.test$", "ban.add"),
            (false, "troll@else.test", "ban.add"),
            (false, "troll@else.test", "ban.remove"),
        ]
    );
}
