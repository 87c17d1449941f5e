//! The real `pepsi-archive` against a real PostgreSQL: an mbox of generated threads
//! imported (a reply under a missing parent, a message too long, one that is no message),
//! found by search and counted by show, imported again without a change, exported back to
//! the same messages (plain, by month, by thread, gzip'ed through the system's gzip), purged
//! by url id and by author, reindexed; bad input refused naming it; and the acceptance of
//! the archive's issue, scaled to what a test may take: a 2,000-message mbox imported through
//! stdin is fully searchable (10,000 take about a minute on two cores; docs/archive.md).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chrono::{DateTime, Duration, TimeZone as _, Utc};
use pepsi_archive::mbox::{self, Format, Item};
use pepsi_archive::url::url_id;
use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::Run;

const TOOL: &str = env!("CARGO_BIN_EXE_pepsi-archive");
const TEAM: &str = "team@example.test";

struct Harness {
    db: TestDb,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Harness {
    /// The lists team@ and other@ (archived) and quiet@ (archive_policy none).
    async fn new() -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
                 LOCAL_DOMAINS = example.test\n",
                db.url
            ),
        )
        .unwrap();
        for (address, policy) in [
            (TEAM, "private"),
            ("other@example.test", "public"),
            ("quiet@example.test", "none"),
        ] {
            sqlx::query("INSERT INTO pepsi.mailing_list (address, archive_policy) VALUES ($1, $2)")
                .bind(address)
                .bind(policy)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        Harness { db, dir, config }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn run_with(&self, args: &[&str], stdin: Option<&[u8]>) -> Run {
        let mut child = Command::new(TOOL)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .env("USER", "ops-alice")
            .env_remove("SUDO_USER")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            let input = input.to_vec();
            std::thread::spawn(move || pipe.write_all(&input).unwrap());
        }
        Run::of(child.wait_with_output().unwrap())
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, None)
    }

    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "pepsi-archive {args:?}: {run:?}");
        run
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all).stdout).unwrap()
    }

    /// A refusal with exit status `code` whose message names `says`; nothing on stdout.
    fn refused(&self, args: &[&str], code: i32, says: &str) {
        let run = self.run(args);
        assert_eq!(run.code, code, "pepsi-archive {args:?}: {run:?}");
        assert!(
            run.stderr.starts_with("pepsi-archive: ") && run.stderr.contains(says),
            "pepsi-archive {args:?} should say {says:?}: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{run:?}");
    }

    /// The url ids of the hits of `query` in team@.
    fn hits(&self, query: &str) -> Vec<String> {
        let v = self.json(&["search", TEAM, query, "--limit", "200"]);
        v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["url_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn day(i: usize) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 9, 0, 0).unwrap() + Duration::hours(24 * i as i64)
}

fn mid(i: usize) -> String {
    format!("<m{i}@gen.example>")
}

fn url(i: usize) -> String {
    url_id(&mid(i)).unwrap()
}

/// Generated post `i` (CRLF): threads of ten (each reply refers to its thread's first post
/// and the post before it; thread 29's first post refers to a post never archived), one
/// author of seven, the word `word<i>` in the body and a body line starting "From ".
fn post(i: usize, per_day: usize) -> Vec<u8> {
    let root = i - i % 10;
    let refs = if !i.is_multiple_of(10) {
        format!(
            "In-Reply-To: {}\r\nReferences: {} {}\r\n",
            mid(i - 1),
            mid(root),
            mid(i - 1)
        )
    } else if i == 290 {
        "References: <missing@gen.example>\r\n".to_owned()
    } else {
        String::new()
    };
    let date = day(i / per_day) + Duration::seconds((i % per_day) as i64);
    format!(
        "From: User {u} <user{u}@example.net>\r\nTo: {TEAM}\r\nSubject: topic {t}\r\n\
         Date: {date}\r\nMessage-ID: {id}\r\n{refs}\r\n\
         Hello, word{i} and the common text.\r\nFrom the start of a line.\r\n",
        u = i % 7,
        t = i / 10,
        date = date.format("%a, %d %b %Y %H:%M:%S +0000"),
        id = mid(i),
    )
    .into_bytes()
}

/// An mbox of `posts` (mboxrd, as public-inbox writes it), with `extra` raw text appended.
fn mbox_of(posts: &[Vec<u8>], extra: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in posts.iter().enumerate() {
        mbox::write_message(&mut out, &mbox::from_line_of("x@example.net", day(i)), p).unwrap();
    }
    out.extend_from_slice(extra.as_bytes());
    out
}

/// The messages of an mbox file's bytes.
fn read_mbox(bytes: &[u8]) -> Vec<Vec<u8>> {
    mbox::Reader::new(bytes, Format::Mboxrd, 1 << 30)
        .map(|i| match i.unwrap() {
            Item::Message { raw, .. } => raw,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn message_id_of(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    text.lines()
        .find_map(|l| l.strip_prefix("Message-ID: "))
        .unwrap()
        .trim()
        .to_owned()
}

async fn count(db: &TestDb, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

fn write(path: &Path, bytes: &[u8]) -> String {
    std::fs::write(path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_mbox_is_imported_searched_exported_and_purged() {
    let h = Harness::new().await;
    let posts: Vec<Vec<u8>> = (0..300).map(|i| post(i, 1)).collect();
    let long_body = "x".repeat(80 * 1024);
    let extra = format!(
        "From big@example.net Mon Jan  1 00:00:00 2024\nSubject: big\nMessage-ID: <big@gen.example>\n\n\
         {long_body}\n\nFrom junk@example.net Mon Jan  1 00:00:00 2024\njust some text\nno header\n"
    );
    let file = write(&h.path("team.mbox"), &mbox_of(&posts, &extra));

    // Autovacuum kept away from the table: its statistics can only come from the import.
    sqlx::query("ALTER TABLE pepsi.archive_message SET (autovacuum_enabled = false)")
        .execute(&h.db.pool)
        .await
        .unwrap();
    // The import: 300 archived, the long one and the text that is no message named.
    let run = h.ok(&["import", TEAM, &file, "--max-message-size", "64K", "--json"]);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        (
            &v["read"],
            &v["archived"],
            &v["duplicates"],
            &v["too_long"],
            &v["failed"]
        ),
        (&302.into(), &300.into(), &0.into(), &1.into(), &1.into()),
        "{run:?}"
    );
    let skipped = v["skipped"].as_array().unwrap();
    assert_eq!(skipped[0]["number"], 301);
    assert!(
        skipped[0]["from_line"]
            .as_str()
            .unwrap()
            .starts_with("big@example.net")
    );
    assert_eq!(skipped[1]["number"], 302);
    assert!(
        skipped[1]["why"]
            .as_str()
            .unwrap()
            .contains("no header field"),
        "{v}"
    );
    assert!(
        run.stderr
            .contains("message 302 (From junk@example.net Mon Jan  1 00:00:00 2024) not archived"),
        "{run:?}"
    );
    let row: (String, String, i32, i32, i32, i32, i32, bool) = sqlx::query_as(
        "SELECT file_name, started_by, read, archived, duplicates, too_long, failed, \
                finished_at IS NOT NULL \
           FROM pepsi.archive_import",
    )
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (file.clone(), "ops-alice".into(), 302, 300, 0, 1, 1, true)
    );
    // The import left the planner statistics of the grown table (pepsi.archive_analyze).
    let tuples: f32 = sqlx::query_scalar(
        "SELECT reltuples FROM pg_class WHERE oid = 'pepsi.archive_message'::regclass",
    )
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(tuples, 300.0);
    assert_eq!(
        count(
            &h.db,
            "SELECT count(*) FROM pepsi.archive_event_log WHERE event = 'import'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &h.db,
            "SELECT count(*) FROM pepsi.event_log WHERE action = 'archive.import'"
        )
        .await,
        1
    );
    // The reply of thread 29 hangs under a placeholder for the post never sent.
    assert_eq!(
        count(&h.db, "SELECT count(*) FROM pepsi.archive_placeholder").await,
        1
    );

    // Search by a body word, by author; show counts it all.
    assert_eq!(h.hits("word123"), [url(123)]);
    assert_eq!(h.hits("from:user3@example.net").len(), 43);
    let text = h.ok(&["search", TEAM, "word42"]).stdout;
    assert!(
        text.contains(&url(42)) && text.contains("topic 4"),
        "{text}"
    );
    let shown = h.json(&["show", TEAM]);
    assert_eq!(
        (&shown["posts"], &shown["threads"], &shown["months"]),
        (&300.into(), &30.into(), &10.into()),
        "{shown}"
    );
    assert_eq!(shown["last_post"], "2025-10-27T09:00:00Z");
    assert!(h.ok(&["show", TEAM]).stdout.contains("posts       300"));

    // Again: nothing more, each counted as a duplicate.
    let again = h.json(&["import", TEAM, &file, "--max-message-size", "64K"]);
    assert_eq!(
        (&again["archived"], &again["duplicates"], &again["too_long"]),
        (&0.into(), &300.into(), &1.into())
    );
    assert_eq!(h.json(&["show", TEAM])["posts"], 300);

    // A dry run into another list counts and stores nothing.
    let dry = h.json(&["import", "other@example.test", &file, "--dry-run"]);
    assert_eq!(
        (&dry["archived"], &dry["dry_run"]),
        (&301.into(), &true.into()),
        "{dry}"
    );
    assert_eq!(h.json(&["show", "other@example.test"])["posts"], 0);
    assert_eq!(
        count(&h.db, "SELECT count(*) FROM pepsi.archive_import").await,
        2
    );

    // Export: the same messages, in date order; by month; by thread; gzip'ed.
    let out = h.ok(&["export", TEAM]);
    assert_eq!(read_mbox(out.stdout.as_bytes()), posts);
    let feb = read_mbox(
        h.ok(&["export", TEAM, "--month", "2025-02"])
            .stdout
            .as_bytes(),
    );
    assert_eq!(feb, posts[31..59].to_vec());
    let thread = read_mbox(
        h.ok(&["export", TEAM, "--thread", &url(123)])
            .stdout
            .as_bytes(),
    );
    assert_eq!(thread, posts[120..130].to_vec());
    let gz = h.path("team.mbox.gz");
    let summary = h.json(&["export", TEAM, "--gzip", "-o", gz.to_str().unwrap()]);
    assert_eq!(summary["posts"], 300);
    let gunzipped = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
    assert!(gunzipped.status.success());
    assert_eq!(read_mbox(&gunzipped.stdout), posts);

    // Purge by url id: refused without --yes, saying what; then gone from search and export.
    h.refused(
        &["purge", TEAM, &url(5)],
        2,
        "not purged: 1 of the 1 post named is in the archive of team@example.test",
    );
    let purged = h.json(&["purge", TEAM, &url(5), &url(999), "--yes"]);
    assert_eq!(purged["purged"], serde_json::json!([url(5)]));
    assert_eq!(purged["not_in_archive"], serde_json::json!([url(999)]));
    assert!(h.hits("word5").is_empty());
    let left = read_mbox(h.ok(&["export", TEAM]).stdout.as_bytes());
    assert_eq!(left.len(), 299);
    assert!(!left.iter().any(|m| message_id_of(m) == mid(5)));

    // Purge by author, in every list.
    h.refused(
        &["purge", "--address", "User3@example.net"],
        2,
        "not purged: 43 posts by User3@example.net in 1 list (team@example.test: 43)",
    );
    let by = h.json(&["purge", "--address", "User3@example.net", "--yes"]);
    assert_eq!(by["purged"], 43);
    assert!(h.hits("from:user3").is_empty());
    let left = read_mbox(h.ok(&["export", TEAM]).stdout.as_bytes());
    assert_eq!(left.len(), 256);
    assert!(
        !left
            .iter()
            .any(|m| String::from_utf8_lossy(m).contains("user3@"))
    );
    assert_eq!(
        count(
            &h.db,
            "SELECT count(*) FROM pepsi.archive_event_log WHERE event LIKE 'purge.%'"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &h.db,
            "SELECT count(*) FROM pepsi.event_log WHERE action = 'archive.purge'"
        )
        .await,
        2
    );

    // Reindex: a lost search column is rebuilt from the stored posts.
    sqlx::query("UPDATE pepsi.archive_message SET search = ''::tsvector")
        .execute(&h.db.pool)
        .await
        .unwrap();
    assert!(h.hits("word123").is_empty());
    let re = h.json(&["reindex", TEAM]);
    assert_eq!(re["reindexed"], 256);
    assert_eq!(h.hits("word123"), [url(123)]);
    assert_eq!(h.hits("topic").len(), 200);
    assert_eq!(
        count(
            &h.db,
            "SELECT count(*) FROM pepsi.archive_event_log WHERE event = 'reindex'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn bad_input_is_refused_naming_it() {
    let h = Harness::new().await;
    let good = write(&h.path("ok.mbox"), &mbox_of(&[post(1, 1)], ""));
    let not_mbox = write(
        &h.path("notes.txt"),
        b"Subject: hello\n\nno From_ line here\n",
    );
    h.refused(
        &["import", "nosuch@example.test", &good],
        1,
        "there is no list nosuch@example.test",
    );
    h.refused(
        &["import", TEAM, &not_mbox],
        2,
        "notes.txt: no line starting \"From \"",
    );
    h.refused(
        &["import", "quiet@example.test", &good],
        1,
        "quiet@example.test is not archived (its archive_policy is none)",
    );
    h.refused(
        &["import", TEAM, &good, "--format", "maildir"],
        2,
        "--format \"maildir\"",
    );
    h.refused(
        &["import", TEAM, &good, "--max-message-size", "lots"],
        2,
        "--max-message-size \"lots\"",
    );
    h.refused(
        &["export", TEAM, "--month", "2025-13"],
        2,
        "--month \"2025-13\" is not a month",
    );
    h.refused(
        &["export", TEAM, "--month", "March"],
        2,
        "--month \"March\"",
    );
    h.refused(
        &["export", TEAM, "--thread", &url(1)],
        1,
        &format!("the archive of team@example.test has no post {}", url(1)),
    );
    h.refused(
        &["purge", TEAM, "not-an-id", "--yes"],
        2,
        "\"not-an-id\" is not a url id",
    );
    h.refused(
        &["purge", TEAM, "--yes"],
        2,
        "give the list and the url ids",
    );
    h.refused(&["search", TEAM, "from:"], 2, "from: has no value");
    h.refused(
        &["search", TEAM, "x", "--limit", "0"],
        2,
        "--limit 0 is not valid",
    );
    h.refused(
        &["show", "no-at-sign"],
        2,
        "list \"no-at-sign\" is not an address",
    );
    assert_eq!(
        count(&h.db, "SELECT count(*) FROM pepsi.archive_import").await,
        0
    );
    assert_eq!(
        count(&h.db, "SELECT count(*) FROM pepsi.archive_message").await,
        0
    );
}

/// The archive's acceptance ("an imported 10,000-message mbox is fully searchable") at 2,000
/// messages, so the suite stays quick: read from stdin, with progress lines every 1,000.
#[tokio::test]
async fn thousands_of_messages_imported_from_stdin_are_all_searchable() {
    let h = Harness::new().await;
    let posts: Vec<Vec<u8>> = (0..2_000).map(|i| post(i, 8)).collect();
    let run = h.run_with(&["import", TEAM, "-", "--json"], Some(&mbox_of(&posts, "")));
    assert_eq!(run.code, 0, "{run:?}");
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        (&v["archived"], &v["file"]),
        (&2_000.into(), &"stdin".into())
    );
    assert!(
        run.stderr.contains("team@example.test: 2000 messages read"),
        "{}",
        run.stderr
    );
    assert_eq!(h.json(&["show", TEAM])["posts"], 2_000);
    for i in [0, 1, 1234, 1999] {
        assert_eq!(h.hits(&format!("word{i}")), [url(i)], "word{i}");
    }
    // Every post is found by its own word.
    let unfound = count(
        &h.db,
        "SELECT count(*) FROM pepsi.archive_message m \
          WHERE NOT m.search @@ to_tsquery('simple', 'word' || substring(m.message_id from 'm([0-9]+)@'))",
    )
    .await;
    assert_eq!(unfound, 0);
}
