//! Digests through the real parts: `pepsi-list set-mode` choosing a member's delivery mode,
//! `pepsi-stage-list worker` collecting posts into the list's digest and sending it at the
//! size threshold, and `pepsi-list maintain` sending a digest due by its period, once. The
//! queued digests are read back with mail-parser.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use mail_parser::{MessageParser, MimeHeaders, PartType};
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support::{self, Run};

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-list");
const LIST: &str = env!("CARGO_BIN_EXE_pepsi-list");

/// The status line of a pass that ended its row.
const FINISHED: &str = "0 {\"finished\":true}";

struct Setup {
    db: TestDb,
    _dir: tempfile::TempDir,
    config: PathBuf,
    list_id: i64,
}

/// The list team@example.test ("The Team", digests at `threshold` bytes) with the members
/// reg@example.test (every post as it comes), mime@remote.test and plain@remote.test (their
/// modes set with pepsi-list set-mode), its stage `lists` sending members' copies to
/// `deliver`.
async fn setup(threshold: i64) -> Setup {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
             LOCAL_DOMAINS = example.test\nLIST_WEB_URL = https://lists.example.test\n\n\
             [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\
             NEXT_STAGE = next\nBOUNCE_STAGE = bounced\n\n\
             [stage-deliver]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-bounced]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    let list_id: i64 = sqlx::query_scalar(
        "INSERT INTO pepsi.mailing_list (address, display_name, subject_prefix, \
         digest_size_threshold) VALUES ('team@example.test', 'The Team', '[team]', $1) \
         RETURNING list_id",
    )
    .bind(threshold)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let s = Setup {
        db,
        _dir: dir,
        config,
        list_id,
    };
    s.list_ok(&[
        "add",
        "team@example.test",
        "reg@example.test",
        "mime@remote.test",
        "plain@remote.test",
    ]);
    s.list_ok(&["set-mode", "team@example.test", "mime@remote.test", "mime"]);
    s.list_ok(&[
        "set-mode",
        "team@example.test",
        "plain@remote.test",
        "plain",
    ]);
    s
}

impl Setup {
    fn list(&self, args: &[&str]) -> Run {
        let out = Command::new(LIST)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .env("USER", "ops-alice")
            .env_remove("SUDO_USER")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Run::of(out)
    }

    fn list_ok(&self, args: &[&str]) -> Run {
        let run = self.list(args);
        assert_eq!(run.code, 0, "pepsi-list {args:?}: {run:?}");
        run
    }

    /// A post from reg@example.test with `subject` and `text`, passed through the list stage.
    async fn post(&self, subject: &str, text: &str) {
        let headers = format!(
            "From: Reg <reg@example.test>\r\nTo: team@example.test\r\nSubject: {subject}\r\n\
             Message-ID: <{}@example.test>\r\nDate: Sun, 6 Dec 2026 01:00:00 +0000\r\n",
            subject.replace(' ', ".")
        );
        let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
            .bind("reg@example.test")
            .bind(vec!["team@example.test".to_owned()])
            .bind(headers.as_bytes())
            .bind(text.as_bytes())
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

    /// The rows queued for `rcpt` at `deliver`: (envelope sender, whole message).
    async fn rows_for(&self, rcpt: &str) -> Vec<(String, Vec<u8>)> {
        let rows: Vec<(String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
            "SELECT w.mail_from, w.headers, b.body FROM pepsi.workqueue w \
             JOIN pepsi.workqueue_body b USING (body_id) \
             WHERE w.stage = 'deliver' AND w.rcpt_to = ARRAY[$1] ORDER BY w.workqueue_id",
        )
        .bind(rcpt)
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(from, headers, body)| {
                let mut raw = headers;
                raw.extend_from_slice(b"\r\n");
                raw.extend_from_slice(&body);
                (from, raw)
            })
            .collect()
    }

    /// The list's digests: (volume, number, sent, posts held).
    async fn digests(&self) -> Vec<(i32, i32, bool, i64)> {
        sqlx::query_as(
            "SELECT volume, number, sent_at IS NOT NULL, \
               (SELECT count(*) FROM pepsi.list_digest_message m WHERE m.digest_id = d.digest_id) \
             FROM pepsi.list_digest d WHERE list_id = $1 ORDER BY digest_id",
        )
        .bind(self.list_id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

/// The digest carries its member's own unsubscribe fields: the one-click link with a token
/// (RFC 8058) and the -leave address.
fn one_click(raw: &[u8]) {
    let m = MessageParser::default().parse(raw).expect("parses");
    let unsubscribe = m.header_raw("List-Unsubscribe").unwrap_or_default().trim();
    let token = unsubscribe
        .strip_prefix("<https://lists.example.test/lists/unsubscribe/")
        .and_then(|t| t.split_once(">, <mailto:team-leave@example.test>"))
        .map(|(t, _)| t);
    assert!(
        token.is_some_and(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())),
        "List-Unsubscribe: {unsubscribe}"
    );
    assert_eq!(
        m.header_raw("List-Unsubscribe-Post").map(str::trim),
        Some("List-Unsubscribe=One-Click")
    );
}

fn subject_of(raw: &[u8]) -> String {
    MessageParser::default()
        .parse(raw)
        .and_then(|m| m.subject().map(str::to_owned))
        .unwrap_or_default()
}

/// Posts go at once to the regular member and not to the digest members; the post that
/// brings the digest to its threshold sends it: one row to each digest member, the MIME one
/// holding the list copies as message/rfc822 parts, the plain one their text (RFC 1153);
/// the next post opens the next issue.
#[tokio::test]
async fn digest_members_get_the_posts_in_one_digest_at_the_size_threshold() {
    let s = setup(1200).await;
    let first_text = "Shall we meet at noon?\r\n";
    s.post("lunch", first_text).await;
    assert_eq!(s.rows_for("reg@example.test").await.len(), 1);
    assert!(s.rows_for("mime@remote.test").await.is_empty());
    assert!(s.rows_for("plain@remote.test").await.is_empty());
    assert_eq!(s.digests().await, vec![(1, 1, false, 1)]);

    let second_text = format!("Yes, at the usual place.\r\n{}\r\n", "x".repeat(900));
    s.post("the place", &second_text).await;
    let regular = s.rows_for("reg@example.test").await;
    assert_eq!(regular.len(), 2);
    assert_eq!(subject_of(&regular[1].1), "[team] the place");
    assert_eq!(s.digests().await, vec![(1, 1, true, 0)]);

    // The MIME digest: one row, VERP envelope sender, the posts inside.
    let mime = s.rows_for("mime@remote.test").await;
    assert_eq!(mime.len(), 1, "one MIME digest");
    assert_eq!(mime[0].0, "team+bounces-mime=remote.test@example.test");
    let m = MessageParser::default().parse(&mime[0].1).expect("parses");
    assert_eq!(m.subject(), Some("The Team Digest, Vol 1, Issue 1"));
    assert_eq!(
        m.from().and_then(|a| a.first()).and_then(|a| a.address()),
        Some("team-request@example.test")
    );
    assert_eq!(
        m.header_raw("List-Id").map(str::trim),
        Some("\"The Team\" <team.example.test>")
    );
    one_click(&mime[0].1);
    assert!(m.root_part().is_content_type("multipart", "mixed"));
    let contents = m.body_text(0).unwrap();
    assert!(
        contents.contains("1. [team] lunch (Reg)")
            && contents.contains("2. [team] the place (Reg)"),
        "{contents}"
    );
    let inner: Vec<_> = m
        .parts
        .iter()
        .filter_map(|p| match &p.body {
            PartType::Message(post) if p.is_content_type("message", "rfc822") => Some(post),
            _ => None,
        })
        .collect();
    assert_eq!(inner.len(), 2, "two message/rfc822 parts");
    assert_eq!(inner[0].subject(), Some("[team] lunch"));
    assert!(
        inner[0]
            .body_text(0)
            .unwrap()
            .starts_with("Shall we meet at noon?")
    );
    assert_eq!(inner[1].subject(), Some("[team] the place"));
    assert_eq!(
        inner[1].header_raw("List-Id").map(str::trim),
        Some("\"The Team\" <team.example.test>"),
        "the list copy as members get it"
    );

    // The plain digest: text only, the posts' text between RFC 1153's separators.
    let plain = s.rows_for("plain@remote.test").await;
    assert_eq!(plain.len(), 1, "one plain digest");
    let p = MessageParser::default().parse(&plain[0].1).expect("parses");
    assert!(p.root_part().is_content_type("text", "plain"));
    assert_eq!(p.subject(), Some("The Team Digest, Vol 1, Issue 1"));
    let text = p.body_text(0).unwrap().replace("\r\n", "\n");
    for want in [
        "Today's Topics:\n\n    1. [team] lunch (Reg)\n    2. [team] the place (Reg)\n",
        "\n----------------------------------------------------------------------\n\nMessage: 1\n",
        "From: Reg <reg@example.test>\n",
        "Subject: [team] lunch\n",
        "Shall we meet at noon?\n",
        "\n------------------------------\n\nMessage: 2\n",
        "Yes, at the usual place.\n",
        "\n------------------------------\n\nEnd of The Team Digest, Vol 1, Issue 1\n***",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }

    // The next post opens the next issue; nothing more goes to the digest members.
    s.post("dinner", "And dinner?\r\n").await;
    assert_eq!(s.digests().await, vec![(1, 1, true, 0), (1, 2, false, 1)]);
    assert_eq!(s.rows_for("mime@remote.test").await.len(), 1);
    assert_eq!(s.rows_for("reg@example.test").await.len(), 3);
}

/// A digest whose period has passed is sent by `pepsi-list maintain`, once: a second pass
/// sends nothing more.
#[tokio::test]
async fn a_digest_due_by_its_period_is_sent_by_maintain_once() {
    let s = setup(1_000_000).await;
    s.post("lunch", "Shall we meet at noon?\r\n").await;
    let none = s.list_ok(&["maintain", "--json"]);
    let v: Value = serde_json::from_str(&none.stdout).unwrap();
    assert_eq!(v["digests_sent"], 0, "not due yet: {v}");
    assert!(s.rows_for("mime@remote.test").await.is_empty());

    // The list's period (1 day by default) has passed since the first post.
    sqlx::query("UPDATE pepsi.list_digest SET opened_at = now() - interval '25 hours'")
        .execute(&s.db.pool)
        .await
        .unwrap();
    let sent = s.list_ok(&["maintain", "--json"]);
    let v: Value = serde_json::from_str(&sent.stdout).unwrap();
    assert_eq!(v["digests_sent"], 1, "{v}");
    let mime = s.rows_for("mime@remote.test").await;
    let plain = s.rows_for("plain@remote.test").await;
    assert_eq!((mime.len(), plain.len()), (1, 1));
    assert_eq!(subject_of(&mime[0].1), "The Team Digest, Vol 1, Issue 1");
    one_click(&mime[0].1);
    one_click(&plain[0].1);
    assert!(
        String::from_utf8_lossy(&plain[0].1).contains("Shall we meet at noon?"),
        "{}",
        String::from_utf8_lossy(&plain[0].1)
    );

    let again = s.list_ok(&["maintain", "--json"]);
    let v: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(v["digests_sent"], 0, "{v}");
    assert_eq!(s.rows_for("mime@remote.test").await.len(), 1);
    assert_eq!(s.rows_for("plain@remote.test").await.len(), 1);
    assert_eq!(s.digests().await, vec![(1, 1, true, 0)]);
}

/// `set-mode`: the mode stored and logged once; a repeat changes nothing; an address that
/// is no member, a list without digests and an unknown mode are refused.
#[tokio::test]
async fn set_mode_stores_the_members_choice() {
    let s = setup(30_720).await;
    let mode = |address: &str| {
        let address = address.to_owned();
        let pool = s.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT COALESCE(p.delivery_mode, 'regular') FROM pepsi.list_member m \
                 LEFT JOIN pepsi.list_member_preference p USING (member_id) \
                 WHERE m.address = $1 AND m.role = 'member'",
            )
            .bind(address)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(mode("mime@remote.test").await, "mime_digest");
    assert_eq!(mode("plain@remote.test").await, "plain_digest");
    assert_eq!(mode("reg@example.test").await, "regular");

    let again = s.list_ok(&[
        "set-mode",
        "team@example.test",
        "MIME@remote.test",
        "mime",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(v["changed"], false, "{v}");
    let back = s.list_ok(&[
        "set-mode",
        "team@example.test",
        "plain@remote.test",
        "regular",
    ]);
    assert!(
        back.stdout.contains("now takes every post as it comes"),
        "{back:?}"
    );
    assert_eq!(mode("plain@remote.test").await, "regular");
    let events: Vec<(String, Value, String)> = sqlx::query_as(
        "SELECT address, detail, actor FROM pepsi.list_event_log WHERE event = 'member.mode' \
         ORDER BY event_id",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[2].0, "plain@remote.test");
    assert_eq!(events[2].1["from"], "plain_digest");
    assert_eq!(events[2].1["to"], "regular");
    assert_eq!(events[2].2, "ops-alice");
    let audits: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.event_log WHERE action = 'list.set-mode'")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(audits, 3);

    let refused = |args: &[&str], code: i32, says: &str| {
        let run = s.list(args);
        assert_eq!(run.code, code, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(says),
            "{args:?} should say {says:?}: {run:?}"
        );
    };
    refused(
        &[
            "set-mode",
            "team@example.test",
            "nobody@example.test",
            "mime",
        ],
        1,
        "nobody@example.test is no member of team@example.test",
    );
    refused(
        &[
            "set-mode",
            "team@example.test",
            "reg@example.test",
            "weekly",
        ],
        2,
        "weekly",
    );
    refused(
        &["set-mode", "team@example.test", "not an address", "mime"],
        2,
        "not an address",
    );
    s.list_ok(&["configure", "team@example.test", "digests_enabled=no"]);
    refused(
        &["set-mode", "team@example.test", "reg@example.test", "plain"],
        1,
        "sends no digests",
    );
    // Back to regular is always possible.
    s.list_ok(&[
        "set-mode",
        "team@example.test",
        "mime@remote.test",
        "regular",
    ]);
}

/// A list whose digests are turned off sends its digest members each post as it comes, as
/// regular members; their mode is kept.
#[tokio::test]
async fn with_digests_off_digest_members_get_each_post() {
    let s = setup(1_000_000).await;
    s.list_ok(&["configure", "team@example.test", "digests_enabled=no"]);
    s.post("lunch", "Shall we meet at noon?\r\n").await;
    for member in ["reg@example.test", "mime@remote.test", "plain@remote.test"] {
        let rows = s.rows_for(member).await;
        assert_eq!(rows.len(), 1, "{member} gets the post");
        assert_eq!(subject_of(&rows[0].1), "[team] lunch", "{member}");
    }
    let mode: String = sqlx::query_scalar(
        "SELECT p.delivery_mode FROM pepsi.list_member m \
         JOIN pepsi.list_member_preference p USING (member_id) \
         WHERE m.list_id = $1 AND m.address = 'mime@remote.test'",
    )
    .bind(s.list_id)
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(mode, "mime_digest");
    assert!(s.digests().await.is_empty(), "nothing collected");
}

/// The posts a digest carries, by their subjects: a MIME digest's message/rfc822 parts, a
/// plain one's `Subject:` lines (RFC 1153).
fn digest_posts(raw: &[u8]) -> Vec<String> {
    let m = MessageParser::default().parse(raw).expect("parses");
    assert!(
        m.subject()
            .is_some_and(|s| s.starts_with("The Team Digest")),
        "a digest: {:?}",
        m.subject()
    );
    if m.root_part().is_content_type("text", "plain") {
        let text = m.body_text(0).unwrap().replace("\r\n", "\n");
        return text
            .lines()
            .filter_map(|l| l.strip_prefix("Subject: [team] "))
            .map(str::to_owned)
            .collect();
    }
    m.parts
        .iter()
        .filter_map(|p| match &p.body {
            PartType::Message(post) if p.is_content_type("message", "rfc822") => post
                .subject()
                .and_then(|s| s.strip_prefix("[team] "))
                .map(str::to_owned),
            _ => None,
        })
        .collect()
}

/// What `member` got, in order: a post as it came (`post:<subject>`) or a digest with its
/// posts (`digest:<subjects>`).
async fn got(s: &Setup, member: &str) -> Vec<String> {
    s.rows_for(member)
        .await
        .iter()
        .map(|(_, raw)| {
            let subject = subject_of(raw);
            match subject.strip_prefix("[team] ") {
                Some(post) => format!("post:{post}"),
                None => format!("digest:{}", digest_posts(raw).join(",")),
            }
        })
        .collect()
}

/// The list's open digest sent now, as `pepsi-list maintain` sends one whose period has
/// passed.
async fn send_open_digest(s: &Setup) {
    sqlx::query(
        "UPDATE pepsi.list_digest SET opened_at = now() - interval '25 hours' \
         WHERE sent_at IS NULL",
    )
    .execute(&s.db.pool)
    .await
    .unwrap();
    let sent = s.list_ok(&["maintain", "--json"]);
    let v: Value = serde_json::from_str(&sent.stdout).unwrap();
    assert_eq!(v["digests_sent"], 1, "{v}");
}

/// A digest member who switches to regular delivery while the digest is open loses none of
/// the posts collected for it: they come in one last digest of the kind the member took,
/// with the digest, and the posts after the switch come as copies (and not again in it).
/// The other digest members get the whole digest.
#[tokio::test]
async fn a_member_who_leaves_digests_gets_the_posts_collected_before_in_one_last_digest() {
    let s = setup(1_000_000).await;
    // A member who stays in digests, to see that the digest itself is whole.
    sqlx::query(
        "INSERT INTO pepsi.list_member (list_id, address, role) \
         VALUES ($1, 'stays@remote.test', 'member')",
    )
    .bind(s.list_id)
    .execute(&s.db.pool)
    .await
    .unwrap();
    s.list_ok(&["set-mode", "team@example.test", "stays@remote.test", "mime"]);

    s.post("one", "The first.\r\n").await;
    s.post("two", "The second.\r\n").await;
    for member in ["mime@remote.test", "plain@remote.test"] {
        s.list_ok(&["set-mode", "team@example.test", member, "regular"]);
    }
    s.post("three", "The third.\r\n").await;
    assert_eq!(got(&s, "mime@remote.test").await, ["post:three"]);
    send_open_digest(&s).await;
    assert_eq!(
        got(&s, "mime@remote.test").await,
        ["post:three", "digest:one,two"]
    );
    assert_eq!(
        got(&s, "plain@remote.test").await,
        ["post:three", "digest:one,two"]
    );
    let plain = s.rows_for("plain@remote.test").await;
    let p = MessageParser::default().parse(&plain[1].1).expect("parses");
    assert!(
        p.root_part().is_content_type("text", "plain"),
        "the kind of digest the member took"
    );
    one_click(&plain[1].1);
    assert_eq!(got(&s, "stays@remote.test").await, ["digest:one,two,three"]);
    let switches: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_digest_switch")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(switches, 0, "the shares go with the digest");

    // Later posts come as copies, and no more digests.
    s.post("four", "The fourth.\r\n").await;
    assert_eq!(
        got(&s, "mime@remote.test").await,
        ["post:three", "digest:one,two", "post:four"]
    );
    send_open_digest(&s).await;
    assert_eq!(got(&s, "mime@remote.test").await.len(), 3);
    assert_eq!(
        got(&s, "stays@remote.test").await,
        ["digest:one,two,three", "digest:four"]
    );
}

/// A regular member who switches to a digest while one is open gets in it only the posts
/// after the switch (they had the others as copies); one who goes back and forth within one
/// digest gets each post once, as a copy or in the digest.
#[tokio::test]
async fn switching_to_a_digest_mid_digest_repeats_no_post() {
    let s = setup(1_000_000).await;
    s.post("one", "The first.\r\n").await;
    s.list_ok(&["set-mode", "team@example.test", "reg@example.test", "plain"]);
    s.list_ok(&[
        "set-mode",
        "team@example.test",
        "mime@remote.test",
        "regular",
    ]);
    s.post("two", "The second.\r\n").await;
    s.list_ok(&["set-mode", "team@example.test", "mime@remote.test", "mime"]);
    s.post("three", "The third.\r\n").await;
    // A regular member's switch and its undoing change nothing.
    s.list_ok(&[
        "set-mode",
        "team@example.test",
        "plain@remote.test",
        "regular",
    ]);
    s.list_ok(&[
        "set-mode",
        "team@example.test",
        "plain@remote.test",
        "plain",
    ]);

    send_open_digest(&s).await;
    // reg@ posted them all but takes its own posts (receive_own_postings).
    assert_eq!(
        got(&s, "reg@example.test").await,
        ["post:one", "digest:two,three"]
    );
    assert_eq!(
        got(&s, "mime@remote.test").await,
        ["post:two", "digest:one,three"]
    );
    assert_eq!(got(&s, "plain@remote.test").await, ["digest:one,two,three"]);
}
