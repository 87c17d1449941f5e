//! pepsi-list as a process against a real PostgreSQL: lists created at local addresses
//! only (not at a foreign domain, a command address or a mailbox's), options changed only
//! to values the schema takes, members added, listed and removed, a Mailman 3 members
//! export imported with its bad lines reported by number and exported back, a person
//! forgotten on every list, a list deleted only with --yes; and each change's rows in
//! pepsi.list_event_log (the invoking user as actor) and pepsi.event_log.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support::Run;

const LIST: &str = env!("CARGO_BIN_EXE_pepsi-list");

struct Harness {
    db: TestDb,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Harness {
    /// A database with the schema, and a configuration whose local domain is
    /// example.test (lists.example.test is made local in the settings layer).
    async fn new() -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi]\nLOCAL_DOMAINS = example.test\n",
                db.url
            ),
        )
        .unwrap();
        sqlx::query(
            "INSERT INTO pepsi.settings (address, name, value) \
             VALUES ('@lists.example.test', 'local_domain', 'true')",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        Harness { db, dir, config }
    }

    /// Runs pepsi-list as the user `ops-alice` (not through sudo).
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

    /// A refusal with exit status `code` whose message holds `says`.
    fn refused(&self, args: &[&str], code: i32, says: &str) {
        let run = self.run(args);
        assert_eq!(run.code, code, "pepsi-list {args:?}: {run:?}");
        assert!(
            run.stderr.starts_with("pepsi-list: ") && run.stderr.contains(says),
            "pepsi-list {args:?} should say {says:?}: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{run:?}");
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The number a test query counts (the test's own SQL).
    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// The list_event_log rows: (list_id set, address, event, detail, actor).
    async fn list_events(&self) -> Vec<(bool, String, String, Value, String)> {
        sqlx::query_as(
            "SELECT list_id IS NOT NULL, address, event, detail, actor \
               FROM pepsi.list_event_log ORDER BY event_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// The pepsi.event_log actions, in order.
    async fn audit(&self) -> Vec<(String, Value)> {
        sqlx::query_as("SELECT action, detail FROM pepsi.event_log ORDER BY event_id")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    /// The addresses of `list`'s rows of `role`, in order.
    async fn members(&self, list: &str, role: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT m.address FROM pepsi.list_member m JOIN pepsi.mailing_list l USING (list_id) \
              WHERE l.address = $1 AND m.role = $2 ORDER BY m.address",
        )
        .bind(list)
        .bind(role)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn lists_are_created_only_at_addresses_a_list_may_take() {
    let h = Harness::new().await;
    sqlx::query(
        "INSERT INTO pepsi.mailbox_account (address) \
         VALUES ('postmaster@example.test'), ('sales-owner@example.test')",
    )
    .execute(&h.db.pool)
    .await
    .unwrap();

    let run = h.ok(&[
        "create",
        "Team@Example.TEST",
        "--display-name",
        "The team",
        "--subject-prefix",
        "[team] ",
        "--owner",
        "Alice@example.test",
        "--owner",
        "bob@example.org",
    ]);
    assert_eq!(
        run.stdout,
        "created list team@example.test, owners alice@example.test, bob@example.org\n"
    );
    // A domain made local in the settings layer takes lists too.
    let created = h
        .ok(&["create", "news@lists.example.test", "--json"])
        .json();
    assert_eq!(created["list"], "news@lists.example.test");
    assert_eq!(created["owners"], json!([]));
    assert!(created["list_id"].as_i64().unwrap() > 0);

    let refusals: &[(&[&str], i32, &str)] = &[
        (
            &["create", "team@example.test"],
            1,
            "list team@example.test exists already",
        ),
        (
            &["create", "team@elsewhere.example"],
            2,
            "elsewhere.example is not a local domain of this server",
        ),
        (&["create", "team-join@example.test"], 2, "ends in -join"),
        (
            &["create", "team-unsubscribe@example.test"],
            2,
            "ends in -unsubscribe",
        ),
        (
            &["create", "news-confirm@example.test"],
            2,
            "ends in -confirm",
        ),
        (
            &["create", "postmaster@example.test"],
            2,
            "list address postmaster@example.test is a mailbox",
        ),
        (
            &["create", "sales@example.test"],
            2,
            "sales-owner@example.test is a mailbox, and list sales@example.test's command address",
        ),
        (&["create", "team+x@example.test"], 2, "may hold only a-z"),
        (&["create", "team"], 2, "is not an address: no @"),
        (
            &[
                "create",
                "long@example.test",
                "--subject-prefix",
                &"x".repeat(61),
            ],
            2,
            "--subject-prefix",
        ),
        (
            &["create", "x@example.test", "--owner", "not an address"],
            2,
            "\"not an address\" is not an address",
        ),
    ];
    for (args, code, says) in refusals {
        h.refused(args, *code, says);
    }
    assert_eq!(h.count("SELECT count(*) FROM pepsi.mailing_list").await, 2);
    assert_eq!(
        h.members("team@example.test", "owner").await,
        ["alice@example.test", "bob@example.org"]
    );

    let events = h.list_events().await;
    assert_eq!(events.len(), 2, "{events:?}");
    let (linked, address, event, detail, actor) = &events[0];
    assert!(linked);
    assert_eq!((address.as_str(), event.as_str()), ("", "list.create"));
    assert_eq!(actor, "ops-alice");
    assert_eq!(detail["list"], "team@example.test");
    assert_eq!(detail["subject_prefix"], "[team] ");
    let audit = h.audit().await;
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0].0, "list.create");
    assert_eq!(audit[0].1["tool"], "pepsi-list");
    assert_eq!(
        audit[0].1["owners"],
        json!(["alice@example.test", "bob@example.org"])
    );

    let lists = h.ok(&["lists", "--json"]).json();
    let rows = lists["lists"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["address"], "news@lists.example.test");
    assert_eq!(rows[1]["address"], "team@example.test");
    assert_eq!(rows[1]["members"], 0);
    assert_eq!(rows[1]["nonmember_action"], "hold");
    let table = h.ok(&["lists"]).stdout;
    assert!(table.starts_with("ADDRESS "), "{table}");
    assert!(table.contains("team@example.test"), "{table}");
}

#[tokio::test]
async fn options_change_only_to_values_the_schema_takes() {
    let h = Harness::new().await;
    h.ok(&["create", "team@example.test"]);
    let shown = h.ok(&["show", "team@example.test", "--json"]).json();
    let defaults = &shown["options"];
    // The schema's defaults, read back.
    assert_eq!(defaults["member_action"], "accept");
    assert_eq!(defaults["nonmember_action"], "hold");
    assert_eq!(defaults["subscription_policy"], "confirm");
    assert_eq!(defaults["pending_lifetime"], "3d");
    assert_eq!(defaults["confirm_window"], "1h");
    assert_eq!(defaults["bounce_score_threshold"], 5.0);
    assert_eq!(defaults["max_message_size"], 1_048_576);
    assert_eq!(defaults["advertised"], true);
    assert_eq!(defaults["reply_to_address"], Value::Null);
    assert_eq!(defaults["personalize"], "none");
    assert_eq!(defaults.as_object().unwrap().len(), 27);

    let run = h.ok(&[
        "configure",
        "team@example.test",
        "nonmember_action=reject",
        "pending_lifetime=1d12h",
        "bounce_score_threshold=2.5",
        "max_message_size=2M",
        "subject_prefix=[team] ",
        "emergency=yes",
    ]);
    assert!(
        run.stdout
            .contains("team@example.test: nonmember_action = reject (was hold)\n"),
        "{run:?}"
    );
    let after = h.ok(&["show", "team@example.test", "--json"]).json();
    let o = &after["options"];
    assert_eq!(o["nonmember_action"], "reject");
    assert_eq!(o["pending_lifetime"], "1d12h");
    assert_eq!(o["bounce_score_threshold"], 2.5);
    assert_eq!(o["max_message_size"], 2 * 1_048_576);
    assert_eq!(o["subject_prefix"], "[team] ");
    assert_eq!(o["emergency"], true);
    assert_eq!(
        h.count(
            "SELECT count(*) FROM pepsi.mailing_list WHERE pending_lifetime = interval '36 hours' \
             AND bounce_score_threshold = 2.5 AND updated_at > created_at"
        )
        .await,
        1
    );

    let refusals: &[(&[&str], &str)] = &[
        (
            &["member_action=maybe"],
            "option member_action: \"maybe\" is not valid: one of accept, hold, reject, discard, defer",
        ),
        (&["fanout_batch=0"], "a whole number from 1 to 1000"),
        (&["pending_lifetime=soon"], "a duration from 1h to 365d"),
        (&["emergency=perhaps"], "yes, no, true or false"),
        (
            &["colour=blue"],
            "unknown option \"colour\"; the options are: display_name",
        ),
        (
            &["address=other@example.test"],
            "unknown option \"address\"",
        ),
        (&["reply_goes_to=explicit"], "needs reply_to_address"),
        (
            &["reply_to_address=desk@example.test"],
            "used only with reply_goes_to=explicit",
        ),
        // One bad value refuses the whole command: nothing of it is stored.
        (
            &["emergency=no", "archive_policy=everyone"],
            "one of public, private, none",
        ),
    ];
    for (assignments, says) in refusals {
        let mut args = vec!["configure", "team@example.test"];
        args.extend_from_slice(assignments);
        h.refused(&args, 2, says);
    }
    h.refused(
        &["configure", "nosuch@example.test", "emergency=no"],
        1,
        "there is no list nosuch@example.test",
    );
    let unchanged = h.ok(&["show", "team@example.test", "--json"]).json();
    assert_eq!(unchanged["options"], after["options"]);

    // Replies to an explicit address need both options; leaving `explicit` drops it.
    h.ok(&[
        "configure",
        "team@example.test",
        "reply_goes_to=explicit",
        "reply_to_address=Desk@Example.test",
    ]);
    let changed = h
        .ok(&[
            "configure",
            "team@example.test",
            "reply_goes_to=list",
            "--json",
        ])
        .json();
    assert_eq!(
        changed["changed"],
        json!([
            {"option": "reply_goes_to", "from": "explicit", "to": "list"},
            {"option": "reply_to_address", "from": "desk@example.test", "to": null},
        ])
    );

    let events = h.list_events().await;
    let configured: Vec<&Value> = events
        .iter()
        .filter(|e| e.2 == "list.configure")
        .map(|e| &e.3)
        .collect();
    assert_eq!(
        configured.len(),
        3,
        "one row per configure that changed something"
    );
    assert_eq!(
        configured[0]["changes"][0],
        json!({"option": "nonmember_action", "from": "hold", "to": "reject"})
    );
    let text = h.ok(&["show", "team@example.test"]).stdout;
    assert!(text.contains("  pending_lifetime "), "{text}");
    assert!(text.contains("members: 0"), "{text}");
}

#[tokio::test]
async fn members_are_added_listed_and_removed() {
    let h = Harness::new().await;
    h.ok(&["create", "team@example.test"]);
    let added = h
        .ok(&[
            "add",
            "team@example.test",
            "Carol@example.com",
            "dave@example.net",
            "carol@example.com",
            "--name",
            "Someone",
            "--json",
        ])
        .json();
    assert_eq!(
        added,
        json!({
            "list": "team@example.test",
            "role": "member",
            "added": ["carol@example.com", "dave@example.net"],
            "already": [],
        })
    );
    // An existing member is reported, not an error.
    let again = h.ok(&["add", "team@example.test", "carol@example.com"]);
    assert_eq!(
        again.stdout,
        "carol@example.com is a member of team@example.test already: unchanged\n"
    );
    h.ok(&[
        "add",
        "team@example.test",
        "carol@example.com",
        "--role",
        "moderator",
    ]);
    h.ok(&[
        "add",
        "team@example.test",
        "spam@example.org",
        "--role",
        "nonmember",
        "--action",
        "discard",
    ]);
    // One bad address refuses the command: the good one is not added either.
    h.refused(
        &[
            "add",
            "team@example.test",
            "erin@example.com",
            "erin at example",
        ],
        2,
        "\"erin at example\" is not an address",
    );
    let run = h.run(&[
        "add",
        "team@example.test",
        "x@example.com",
        "--role",
        "boss",
    ]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("member, owner, moderator, nonmember"),
        "{run:?}"
    );

    let all = h.ok(&["members", "team@example.test", "--json"]).json();
    let rows: Vec<(&str, &str)> = all["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["address"].as_str().unwrap(), m["role"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rows,
        [
            ("carol@example.com", "moderator"),
            ("carol@example.com", "member"),
            ("dave@example.net", "member"),
            ("spam@example.org", "nonmember"),
        ]
    );
    let spam = &all["members"][3];
    assert_eq!(spam["moderation_action"], "discard");
    assert_eq!(all["members"][1]["display_name"], "Someone");
    assert_eq!(all["members"][1]["subscribed_via"], "operator");
    assert_eq!(all["members"][1]["delivery_status"], "enabled");
    let only = h
        .ok(&["members", "team@example.test", "--role", "member", "--json"])
        .json();
    assert_eq!(only["members"].as_array().unwrap().len(), 2);
    let table = h.ok(&["members", "team@example.test"]).stdout;
    assert!(table.starts_with("ADDRESS "), "{table}");

    let removed = h
        .ok(&[
            "remove",
            "team@example.test",
            "carol@example.com",
            "nobody@example.com",
            "--json",
        ])
        .json();
    assert_eq!(removed["removed"], json!(["carol@example.com"]));
    assert_eq!(removed["not_found"], json!(["nobody@example.com"]));
    // Only the member row went; the moderator row stays.
    assert_eq!(
        h.members("team@example.test", "moderator").await,
        ["carol@example.com"]
    );
    assert_eq!(
        h.members("team@example.test", "member").await,
        ["dave@example.net"]
    );

    let shown = h.ok(&["show", "team@example.test", "--json"]).json();
    assert_eq!(
        shown["roles"],
        json!({"member": 1, "owner": 0, "moderator": 1, "nonmember": 1})
    );
    assert_eq!(shown["delivery"]["enabled"], 1);

    let events = h.list_events().await;
    let per_address: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e.2 != "list.create")
        .map(|e| (e.2.as_str(), e.1.as_str()))
        .collect();
    assert_eq!(
        per_address,
        [
            ("member.add", "carol@example.com"),
            ("member.add", "dave@example.net"),
            ("member.add", "carol@example.com"),
            ("member.add", "spam@example.org"),
            ("member.remove", "carol@example.com"),
        ]
    );
    assert!(events.iter().all(|e| e.4 == "ops-alice"));
    let actions: Vec<String> = h.audit().await.into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        actions,
        [
            "list.create",
            "list.add",
            "list.add",
            "list.add",
            "list.remove"
        ]
    );
}

#[tokio::test]
async fn a_mailman_export_is_imported_with_its_bad_lines_by_number_and_exported_back() {
    let h = Harness::new().await;
    h.ok(&["create", "team@example.test"]);
    h.ok(&["add", "team@example.test", "bob@example.net"]);
    let csv = h.file(
        "members.csv",
        "Email,Display Name,Delivery Mode\r\n\
         alice@example.org,Alice Liddell,regular\r\n\
         Bob@Example.net,Bob,regular\r\n\
         not-an-address,Nobody,regular\r\n\
         \"carol@example.com\",\"Carol, the Second\",mime_digest\r\n\
         ALICE@example.org,Alice again,regular\r\n\
         dave@example.net,,regular\r\n",
    );

    let dry = h
        .ok(&[
            "import",
            "team@example.test",
            path(&csv),
            "--dry-run",
            "--json",
        ])
        .json();
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["added"], 3);
    assert_eq!(
        h.members("team@example.test", "member").await,
        ["bob@example.net"]
    );

    let report = h
        .ok(&["import", "team@example.test", path(&csv), "--json"])
        .json();
    assert_eq!(report["rows"], 6);
    assert_eq!(report["added"], 3);
    assert_eq!(report["already_members"], 1);
    assert_eq!(report["duplicates"], json!([6]));
    let invalid = report["invalid"].as_array().unwrap();
    assert_eq!(invalid.len(), 1);
    assert_eq!(invalid[0]["line"], 4);
    assert_eq!(invalid[0]["text"], "not-an-address");
    assert_eq!(
        h.members("team@example.test", "member").await,
        [
            "alice@example.org",
            "bob@example.net",
            "carol@example.com",
            "dave@example.net"
        ]
    );
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.list_member WHERE subscribed_via = 'import'")
            .await,
        3
    );
    let text = h.ok(&["import", "team@example.test", path(&csv)]).stdout;
    assert!(
        text.contains("0 added, 4 already members, 1 repeated, 1 invalid"),
        "{text}"
    );
    assert!(
        text.contains("line 4: \"not-an-address\" not imported"),
        "{text}"
    );

    let exported = h.ok(&["export", "team@example.test"]).stdout;
    assert_eq!(
        exported,
        "email,display_name\n\
         alice@example.org,Alice Liddell\n\
         bob@example.net,\n\
         carol@example.com,\"Carol, the Second\"\n\
         dave@example.net,\n"
    );
    // What export writes, import reads: a second list gets the same members.
    h.ok(&["create", "copy@example.test"]);
    let back = h.file("export.csv", &exported);
    h.ok(&["import", "copy@example.test", path(&back)]);
    assert_eq!(h.ok(&["export", "copy@example.test"]).stdout, exported);

    // A long file reports its progress every 1,000 rows, on stderr.
    let mut big = String::from("email,name\n");
    for i in 0..2500 {
        big.push_str(&format!("m{i}@example.org,Member {i}\n"));
    }
    let big = h.file("big.csv", &big);
    h.ok(&["create", "big@example.test"]);
    let run = h.ok(&["import", "big@example.test", path(&big)]);
    assert!(run.stderr.contains("1000 of 2500"), "{run:?}");
    assert!(run.stderr.contains("2000 of 2500"), "{run:?}");
    assert!(run.stdout.contains("2500 added"), "{run:?}");
    assert_eq!(
        h.count(
            "SELECT count(*) FROM pepsi.list_event_log WHERE event = 'member.add' \
             AND detail->>'list' = 'big@example.test'"
        )
        .await,
        2500
    );

    let headless = h.file("bad.csv", "who,what\nx,y\n");
    h.refused(
        &["import", "team@example.test", path(&headless)],
        2,
        "the header names no email column",
    );
    let audit: Vec<String> = h.audit().await.into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        audit.iter().filter(|a| *a == "list.import").count(),
        3,
        "a dry run, and an import that added nobody, leave no audit row: {audit:?}"
    );
}

#[tokio::test]
async fn a_person_is_forgotten_on_every_list() {
    let h = Harness::new().await;
    h.ok(&[
        "create",
        "team@example.test",
        "--owner",
        "carol@example.com",
    ]);
    h.ok(&["create", "news@example.test"]);
    h.ok(&[
        "add",
        "news@example.test",
        "Carol@example.com",
        "dave@example.net",
    ]);
    h.ok(&["add", "team@example.test", "dave@example.net"]);
    for person in ["carol@example.com", "dave@example.net"] {
        sqlx::query(
            "WITH l AS (SELECT list_id FROM pepsi.mailing_list WHERE address = 'news@example.test') \
             INSERT INTO pepsi.list_pending (list_id, address, kind, token_hash, requested_via, expires_at) \
             SELECT list_id, $1, 'subscribe', sha256(convert_to($1, 'UTF8')), 'web', now() + interval '1 day' FROM l",
        )
        .bind(person)
        .execute(&h.db.pool)
        .await
        .unwrap();
        for sql in [
            "INSERT INTO pepsi.list_bounce_score (list_id, address, score) \
             SELECT list_id, $1, 1 FROM pepsi.mailing_list",
            "INSERT INTO pepsi.list_member_link (token_hash, address, expires_at) \
             VALUES (sha256(convert_to('link' || $1, 'UTF8')), $1, now() + interval '1 hour')",
            "INSERT INTO pepsi.list_confirm_rate (list_id, key_kind, key, window_start, count) \
             SELECT list_id, 'address', $1, now(), 1 FROM pepsi.mailing_list",
        ] {
            sqlx::query(sql)
                .bind(person)
                .execute(&h.db.pool)
                .await
                .unwrap();
        }
    }

    h.refused(
        &["forget", "carol@example.com"],
        2,
        "not forgotten: this removes carol@example.com from every list for good; confirm with --yes",
    );
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.list_member WHERE address = 'carol@example.com'")
            .await,
        2
    );

    let forgotten = h
        .ok(&["forget", "Carol@Example.com", "--yes", "--json"])
        .json();
    assert_eq!(
        forgotten,
        json!({
            "address": "carol@example.com",
            "memberships": [
                {"list": "news@example.test", "role": "member"},
                {"list": "team@example.test", "role": "owner"},
            ],
            "pending": 1,
            "member_links": 1,
            "bounce_scores": 2,
            "bounce_events": 0,
            "confirm_rates": 2,
            "autoresponses": 0,
        })
    );
    for table in [
        "list_member",
        "list_pending",
        "list_bounce_score",
        "list_member_link",
    ] {
        let left = h
            .count(&format!(
                "SELECT count(*) FROM pepsi.{table} WHERE address = 'carol@example.com'"
            ))
            .await;
        assert_eq!(left, 0, "{table}");
        let other = h
            .count(&format!(
                "SELECT count(*) FROM pepsi.{table} WHERE address = 'dave@example.net'"
            ))
            .await;
        assert!(other > 0, "dave's {table} rows stay");
    }
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.list_confirm_rate WHERE key = 'carol@example.com'")
            .await,
        0
    );
    let events = h.list_events().await;
    let last = events.last().unwrap();
    assert_eq!(
        (last.0, last.1.as_str(), last.2.as_str()),
        (false, "carol@example.com", "member.forget")
    );
    assert_eq!(h.audit().await.last().unwrap().0, "list.forget");

    let again = h.ok(&["forget", "carol@example.com", "--yes"]);
    assert!(again.stdout.contains("nothing removed"), "{again:?}");
    assert_eq!(
        h.list_events().await.len(),
        events.len(),
        "no change, no row"
    );
}

#[tokio::test]
async fn a_list_is_deleted_only_with_yes() {
    let h = Harness::new().await;
    h.ok(&[
        "create",
        "team@example.test",
        "--owner",
        "alice@example.test",
    ]);
    h.ok(&["add", "team@example.test", "bob@example.net"]);
    h.refused(
        &["delete", "team@example.test"],
        2,
        "not deleted: deleting team@example.test removes its members",
    );
    assert_eq!(h.count("SELECT count(*) FROM pepsi.mailing_list").await, 1);

    let run = h.ok(&["delete", "team@example.test", "--yes"]);
    assert_eq!(
        run.stdout,
        "deleted list team@example.test with 1 members, 1 owners, 0 moderators and 0 nonmember rules\n"
    );
    assert_eq!(h.count("SELECT count(*) FROM pepsi.mailing_list").await, 0);
    assert_eq!(h.count("SELECT count(*) FROM pepsi.list_member").await, 0);
    // The log outlives the list, which its rows name in their detail.
    let events = h.list_events().await;
    assert_eq!(events.len(), 3);
    assert!(
        events
            .iter()
            .all(|e| !e.0 && e.3["list"] == "team@example.test")
    );
    assert_eq!(events[2].2, "list.delete");
    h.refused(
        &["delete", "team@example.test", "--yes"],
        1,
        "there is no list team@example.test",
    );
}
