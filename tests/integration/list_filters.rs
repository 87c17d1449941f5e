//! A list's header filters from the terminal, against a real PostgreSQL and the real
//! `pepsi-list`: `filter` adds them (after the last, or at a free position), `filters` and
//! `show` list them in order, `unfilter` removes one; bad input is refused naming it
//! before anything is stored, and each change leaves its event and audit rows.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support::Run;

const LIST: &str = env!("CARGO_BIN_EXE_pepsi-list");
const TEAM: &str = "team@example.test";

struct Harness {
    db: TestDb,
    _dir: tempfile::TempDir,
    config: PathBuf,
}

impl Harness {
    /// The list team@example.test, without filters.
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
        sqlx::query("INSERT INTO pepsi.mailing_list (address) VALUES ($1)")
            .bind(TEAM)
            .execute(&db.pool)
            .await
            .unwrap();
        Harness {
            db,
            _dir: dir,
            config,
        }
    }

    fn run(&self, args: &[&str]) -> Run {
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

    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "pepsi-list {args:?}: {run:?}");
        run
    }

    /// A refusal with exit status `code` whose message holds `says`; nothing on stdout.
    fn refused(&self, args: &[&str], code: i32, says: &str) {
        let run = self.run(args);
        assert_eq!(run.code, code, "pepsi-list {args:?}: {run:?}");
        assert!(
            run.stderr.starts_with("pepsi-list: ") && run.stderr.contains(says),
            "pepsi-list {args:?} should say {says:?}: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{run:?}");
    }

    /// The stored filters: (position, header, pattern, action) in position order.
    async fn stored(&self) -> Vec<(i32, String, String, String)> {
        sqlx::query_as(
            "SELECT position, header, pattern, action FROM pepsi.list_header_filter \
              ORDER BY position",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

fn rows(v: &[(i32, &str, &str, &str)]) -> Vec<(i32, String, String, String)> {
    v.iter()
        .map(|(p, h, pat, a)| (*p, h.to_string(), pat.to_string(), a.to_string()))
        .collect()
}

#[tokio::test]
async fn filters_are_added_listed_inserted_and_removed() {
    let h = Harness::new().await;
    assert_eq!(
        h.ok(&["filters", TEAM]).stdout,
        "team@example.test has no header filters\n"
    );

    let added = h
        .ok(&["filter", TEAM, "X-Spam-Flag", "^yes", "discard"])
        .stdout;
    assert_eq!(
        added,
        "added to team@example.test at position 10: X-Spam-Flag ~ \"^yes\": discard\n"
    );
    let second = h
        .ok(&[
            "filter",
            TEAM,
            "Subject",
            "unsubscribe|remove me",
            "HOLD",
            "--json",
        ])
        .json();
    assert_eq!(
        second,
        json!({"list": TEAM, "filter": {"position": 20, "header": "Subject",
               "pattern": "unsubscribe|remove me", "action": "hold"}})
    );
    // Inserted before the first, and between the two.
    h.ok(&[
        "filter",
        TEAM,
        "List-Id",
        "other\\.list",
        "reject",
        "--position",
        "5",
    ]);
    h.ok(&[
        "filter",
        TEAM,
        "From",
        "@trusted\\.test>?$",
        "accept",
        "--position",
        "15",
    ]);
    // After the last: the last position plus 10, whatever was inserted.
    h.ok(&["filter", TEAM, "X-Later", "x", "defer"]);
    let want = rows(&[
        (5, "List-Id", "other\\.list", "reject"),
        (10, "X-Spam-Flag", "^yes", "discard"),
        (15, "From", "@trusted\\.test>?$", "accept"),
        (20, "Subject", "unsubscribe|remove me", "hold"),
        (30, "X-Later", "x", "defer"),
    ]);
    assert_eq!(h.stored().await, want);

    let text = h.ok(&["filters", TEAM]).stdout;
    assert_eq!(
        text,
        "POSITION  HEADER       ACTION   PATTERN\n\
         \x20      5  List-Id      reject   other\\.list\n\
         \x20     10  X-Spam-Flag  discard  ^yes\n\
         \x20     15  From         accept   @trusted\\.test>?$\n\
         \x20     20  Subject      hold     unsubscribe|remove me\n\
         \x20     30  X-Later      defer    x\n"
    );
    let listed = h.ok(&["filters", TEAM, "--json"]).json();
    assert_eq!(listed["list"], json!(TEAM));
    let got: Vec<(i64, String, String, String)> = listed["filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["position"].as_i64().unwrap(),
                f["header"].as_str().unwrap().to_owned(),
                f["pattern"].as_str().unwrap().to_owned(),
                f["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want_json: Vec<(i64, String, String, String)> = want
        .iter()
        .map(|(p, h, pat, a)| (i64::from(*p), h.clone(), pat.clone(), a.clone()))
        .collect();
    assert_eq!(got, want_json);

    // `show` carries them too, text and JSON.
    let shown = h.ok(&["show", TEAM]).stdout;
    assert!(
        shown.contains("header filters:\n")
            && shown.contains("       15  From ~ \"@trusted\\\\.test>?$\": accept\n"),
        "{shown}"
    );
    let shown = h.ok(&["show", TEAM, "--json"]).json();
    assert_eq!(shown["filters"], listed["filters"]);

    // A taken position is refused, and nothing changes.
    h.refused(
        &["filter", TEAM, "Subject", "y", "hold", "--position", "15"],
        1,
        "position 15 of team@example.test is taken",
    );
    assert_eq!(h.stored().await, want);

    let removed = h.ok(&["unfilter", TEAM, "15"]).stdout;
    assert_eq!(
        removed,
        "removed from team@example.test at position 15: From ~ \"@trusted\\\\.test>?$\": accept\n"
    );
    h.refused(
        &["unfilter", TEAM, "15"],
        1,
        "team@example.test has no header filter at position 15",
    );
    // The position is free again.
    h.ok(&["filter", TEAM, "Subject", "y", "hold", "--position", "15"]);
    assert_eq!(h.stored().await.len(), 5);

    let events: Vec<(bool, String, String, Value, String)> = sqlx::query_as(
        "SELECT list_id IS NOT NULL, address, event, detail, actor \
           FROM pepsi.list_event_log ORDER BY event_id",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.2.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "filter.add",
            "filter.add",
            "filter.add",
            "filter.add",
            "filter.add",
            "filter.remove",
            "filter.add"
        ]
    );
    assert!(
        events.iter().all(|e| e.0 && e.4 == "ops-alice"),
        "{events:?}"
    );
    assert_eq!(
        events[5].3,
        json!({"list": TEAM, "filter": {"position": 15, "header": "From",
               "pattern": "@trusted\\.test>?$", "action": "accept"}})
    );
    let audit: Vec<(String, Value)> =
        sqlx::query_as("SELECT action, detail FROM pepsi.event_log ORDER BY event_id")
            .fetch_all(&h.db.pool)
            .await
            .unwrap();
    let actions: Vec<&str> = audit.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(
        actions,
        [
            "list.filter",
            "list.filter",
            "list.filter",
            "list.filter",
            "list.filter",
            "list.unfilter",
            "list.filter"
        ]
    );
    assert_eq!(audit[0].1["filter"]["header"], json!("X-Spam-Flag"));
    assert_eq!(audit[5].1["filter"], events[5].3["filter"]);
    assert_eq!(audit[5].1["os_user"], json!("ops-alice"));

    // Deleting the list takes its filters with it.
    h.ok(&["delete", TEAM, "--yes"]);
    assert!(h.stored().await.is_empty());
}

#[tokio::test]
async fn bad_filters_are_refused_naming_the_input() {
    let h = Harness::new().await;
    let long_header = "X".repeat(101);
    let long_pattern = "a".repeat(501);
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["filter", TEAM, "X-Spam:", "yes", "hold"],
            2,
            "header \"X-Spam:\" is not a header field name",
        ),
        (
            &["filter", TEAM, "X Spam", "yes", "hold"],
            2,
            "header \"X Spam\" is not a header field name",
        ),
        (
            &["filter", TEAM, &long_header, "yes", "hold"],
            2,
            "is not a header field name: 1 to 100",
        ),
        (
            &["filter", TEAM, "Subject", "", "hold"],
            2,
            "pattern \"\" is not valid",
        ),
        (
            &["filter", TEAM, "Subject", &long_pattern, "hold"],
            2,
            "of 1 to 500 characters",
        ),
        (
            &["filter", TEAM, "Subject", "(unclosed", "hold"],
            2,
            "pattern \"(unclosed\" is not a valid regular expression",
        ),
        (
            &["filter", TEAM, "Subject", "yes", "drop"],
            2,
            "action \"drop\" is not one of accept, hold, reject, discard, defer",
        ),
        (
            &["filter", TEAM, "Subject", "yes", "hold", "--position", "0"],
            2,
            "position 0 is not valid",
        ),
        (&["unfilter", TEAM, "-3"], 2, "position -3 is not valid"),
        (
            &["filter", "nobody@example.test", "Subject", "yes", "hold"],
            1,
            "there is no list nobody@example.test",
        ),
        (
            &["unfilter", "nobody@example.test", "10"],
            1,
            "there is no list nobody@example.test",
        ),
        (
            &["filters", "nobody@example.test"],
            1,
            "there is no list nobody@example.test",
        ),
    ];
    for (args, code, says) in cases {
        h.refused(args, *code, says);
    }
    assert!(h.stored().await.is_empty());
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_event_log")
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
    assert_eq!(events, 0);
}

/// `content-filter`: shown when there is none, set option by option (what an option does
/// not name is kept), shown as text and JSON, cleared; bad values refused naming them with
/// nothing stored; each change one event and one audit row.
#[tokio::test]
async fn content_filters_are_shown_set_and_cleared() {
    let h = Harness::new().await;
    let none = h.ok(&["content-filter", TEAM]);
    assert_eq!(
        none.stdout,
        "team@example.test has no content filter: posts go out whole\n"
    );
    let set = h.ok(&[
        "content-filter",
        TEAM,
        "--filter-extensions",
        ".EXE, bat",
        "--filter-types",
        "video,image/gif",
    ]);
    assert!(
        set.stdout
            .starts_with("set the content filter of team@example.test:\n"),
        "{set:?}"
    );
    assert!(
        set.stdout.contains("filter extensions:     exe, bat\n"),
        "{set:?}"
    );
    let json = h.ok(&[
        "content-filter",
        TEAM,
        "--collapse-alternatives",
        "yes",
        "--empty-action",
        "discard",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v,
        json!({"list": TEAM, "changed": true, "content_filter": {
            "filter_types": ["video", "image/gif"], "pass_types": [],
            "filter_extensions": ["exe", "bat"], "pass_extensions": [],
            "collapse_alternatives": true, "empty_action": "discard"}})
    );
    let stored: (Vec<String>, Vec<String>, bool, String) = sqlx::query_as(
        "SELECT filter_types, filter_extensions, collapse_alternatives, empty_action \
           FROM pepsi.list_content_filter",
    )
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(
        stored,
        (
            vec!["video".to_owned(), "image/gif".to_owned()],
            vec!["exe".to_owned(), "bat".to_owned()],
            true,
            "discard".to_owned()
        )
    );
    // An empty value empties one list only.
    h.ok(&["content-filter", TEAM, "--filter-types", ""]);
    let shown: Value =
        serde_json::from_str(&h.ok(&["content-filter", TEAM, "--json"]).stdout).unwrap();
    assert_eq!(shown["changed"], json!(false));
    assert_eq!(shown["content_filter"]["filter_types"], json!([]));
    assert_eq!(
        shown["content_filter"]["filter_extensions"],
        json!(["exe", "bat"])
    );

    for (args, code, says) in [
        (
            vec!["content-filter", TEAM, "--filter-types", "multipart/mixed"],
            2,
            "--filter-types: \"multipart/mixed\" cannot be filtered",
        ),
        (
            vec!["content-filter", TEAM, "--pass-types", "image/"],
            2,
            "--pass-types: \"image/\" is not a media type",
        ),
        (
            vec!["content-filter", TEAM, "--pass-extensions", "tar.gz"],
            2,
            "--pass-extensions: \"tar.gz\" is not a file name extension",
        ),
        (
            vec!["content-filter", TEAM, "--empty-action", "accept"],
            2,
            "--empty-action: \"accept\" is not one of hold, reject, discard",
        ),
        (
            vec!["content-filter", TEAM, "--collapse-alternatives", "maybe"],
            2,
            "--collapse-alternatives: \"maybe\" is not yes or no",
        ),
        (
            vec![
                "content-filter",
                "nobody@example.test",
                "--empty-action",
                "hold",
            ],
            1,
            "there is no list nobody@example.test",
        ),
    ] {
        h.refused(&args, code, says);
    }
    let cleared = h.ok(&["content-filter", TEAM, "--clear"]);
    assert_eq!(
        cleared.stdout,
        "removed the content filter of team@example.test\n"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_content_filter")
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    // Clearing again changes nothing and writes nothing.
    h.ok(&["content-filter", TEAM, "--clear"]);
    let events: Vec<String> =
        sqlx::query_scalar("SELECT event FROM pepsi.list_event_log ORDER BY event_id")
            .fetch_all(&h.db.pool)
            .await
            .unwrap();
    assert_eq!(
        events,
        [
            "content_filter.set",
            "content_filter.set",
            "content_filter.set",
            "content_filter.clear"
        ]
    );
    let audit: Vec<(String, Value)> =
        sqlx::query_as("SELECT action, detail FROM pepsi.event_log ORDER BY event_id")
            .fetch_all(&h.db.pool)
            .await
            .unwrap();
    assert_eq!(audit.len(), 4);
    assert!(
        audit.iter().all(|a| a.0 == "list.content-filter"),
        "{audit:?}"
    );
    assert_eq!(audit[3].1["after"], Value::Null);
    assert_eq!(
        audit[0].1["after"]["filter_extensions"],
        json!(["exe", "bat"])
    );
}
