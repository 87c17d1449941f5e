//! The real `pepsi-secure-link` against a real PostgreSQL, connected as the pipeline role
//! (`pepsi`) as it runs in production, over links made by `pepsi_secure_link::store::create`:
//! the listing filtered by sender, recipient, state and limit, newest first; one link with
//! its access log; revoke (a second one refused, naming who revoked), extend by days and to
//! a time, purge of one link and of every expired or revoked one, each leaving its access-log
//! line and its event_log row; `--json` read back; bad input refused naming it (exit 2), a
//! refusal and a database that does not answer exit 1.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use chrono::{DateTime, TimeDelta, Utc};
use pepsi_secure_link::store;
use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::Run;

const TOOL: &str = env!("CARGO_BIN_EXE_pepsi-secure-link");
const CEO: &str = "ceo@example.test";
const CFO: &str = "cfo@example.test";
const PARTNER: &str = "partner@example.net";
const OTHER: &str = "other@example.org";
/// The form of a link id that no link has.
const NO_LINK: &str = "AAAAAAAAAAAAAAAAAAAAAA";

struct Harness {
    db: TestDb,
    _dir: tempfile::TempDir,
    config: PathBuf,
}

impl Harness {
    async fn new() -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        let url = crate::support::httpd::url_as(&db.url, "pepsi");
        std::fs::write(&config, format!("[database]\nURL = {url}\n")).unwrap();
        Harness {
            db,
            _dir: dir,
            config,
        }
    }

    /// A link from `sender` to `recipient`, living a week; its id.
    async fn link(&self, sender: &str, recipient: &str) -> String {
        let mut tx = self.db.pool.begin().await.unwrap();
        let created = store::create(
            &mut tx,
            sender,
            recipient,
            b"Subject: figures\r\n\r\nThe figures.\r\n",
            TimeDelta::days(7),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        created.link_id
    }

    /// Lets the link's time run out.
    async fn expire(&self, link_id: &str) {
        sqlx::query(
            "UPDATE pepsi.secure_link_message SET expires_at = now() - interval '1 day' \
              WHERE link_id = $1",
        )
        .bind(link_id)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    fn run(&self, args: &[&str]) -> Run {
        let out = Command::new(TOOL)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .env("USER", "ops-alice")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Run::of(out)
    }

    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "pepsi-secure-link {args:?}: {run:?}");
        run
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        self.ok(&all).json()
    }

    /// A refusal with exit status `code` whose message names `says`; nothing on stdout.
    fn refused(&self, args: &[&str], code: i32, says: &str) {
        let run = self.run(args);
        assert_eq!(run.code, code, "pepsi-secure-link {args:?}: {run:?}");
        assert!(
            run.stderr.contains(says),
            "pepsi-secure-link {args:?} should say {says:?}: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{run:?}");
    }

    /// The ids of `list ARGS --json`, in order.
    fn listed(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["list"];
        all.extend_from_slice(args);
        let v = self.json(&all);
        v["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["link_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The events of the link's access log, oldest first, as `show --json` prints them.
    fn events(&self, link_id: &str) -> Vec<String> {
        let v = self.json(&["show", link_id]);
        v["access"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["event"].as_str().unwrap().to_owned())
            .collect()
    }

    async fn audit_rows(&self, action: &str) -> Vec<Value> {
        sqlx::query_scalar("SELECT detail FROM pepsi.event_log WHERE action = $1 ORDER BY event_id")
            .bind(action)
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }
}

/// A link's stored nonce, ciphertext and db half.
type Sealed = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);

fn time(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("not a time: {v}")))
        .unwrap()
        .with_timezone(&Utc)
}

#[tokio::test]
async fn list_filters_newest_first_and_show_prints_the_link_with_its_access_log() {
    let h = Harness::new().await;
    let a = &*h.link(CEO, PARTNER).await;
    let b = &*h.link(CEO, OTHER).await;
    let c = &*h.link(CFO, PARTNER).await;
    h.expire(c).await;

    assert_eq!(h.listed(&[]), [c, b, a]);
    // Addresses compare without case; a filter of each kind, and both at once.
    assert_eq!(h.listed(&["--sender", "CEO@Example.TEST"]), [b, a]);
    assert_eq!(h.listed(&["--recipient", PARTNER]), [c, a]);
    assert_eq!(h.listed(&["--sender", CEO, "--recipient", PARTNER]), [a]);
    assert_eq!(h.listed(&["--state", "expired"]), [c]);
    assert_eq!(h.listed(&["--state", "active"]), [b, a]);
    assert!(h.listed(&["--state", "revoked"]).is_empty());
    assert!(h.listed(&["--sender", "nobody@example.test"]).is_empty());

    let v = h.json(&["list", "--limit", "1"]);
    assert_eq!(v["limit"], 1);
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), 1);
    let first = &links[0];
    assert_eq!(first["link_id"], c);
    assert_eq!(first["sender"], CFO);
    assert_eq!(first["recipient"], PARTNER);
    assert_eq!(first["state"], "expired");
    assert_eq!(first["generation"], 1);
    assert_eq!(first["size"], 34);
    assert_eq!(first["revoked_by"], Value::Null);
    assert!(time(&first["expires"]) < time(&first["created"]));

    // The table: a header, a line per link, and what the limit left out.
    let text = h.ok(&["list", "--limit", "2"]).stdout;
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("LINK") && lines[0].contains("LAST ACCESS"),
        "{text}"
    );
    assert!(
        lines[1].starts_with(c) && lines[1].contains("expired"),
        "{text}"
    );
    assert!(
        lines[2].starts_with(b) && lines[2].contains(OTHER),
        "{text}"
    );
    assert!(lines[3].contains("--limit"), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(h.ok(&["list", "--state", "purged"]).stdout, "no links\n");

    let v = h.json(&["show", a]);
    assert_eq!(v["link"]["link_id"], a);
    assert_eq!(v["link"]["state"], "active");
    assert_eq!(v["access"].as_array().unwrap().len(), 1);
    assert_eq!(v["access"][0]["event"], "created");
    assert_eq!(v["access"][0]["client_key"], Value::Null);
    let text = h.ok(&["show", a]).stdout;
    assert!(
        text.contains(&format!("link        {a}"))
            && text.contains("state       active")
            && text.contains(&format!("recipient   {PARTNER}"))
            && text.contains("access log:")
            && text.contains("created"),
        "{text}"
    );
}

#[tokio::test]
async fn revoke_extend_and_purge_change_the_link_and_each_leaves_its_log_lines() {
    let h = Harness::new().await;
    let a = &*h.link(CEO, PARTNER).await;
    let b = &*h.link(CEO, OTHER).await;
    let c = &*h.link(CFO, PARTNER).await;
    let d = &*h.link(CFO, OTHER).await;

    // Revoke, once.
    let v = h.json(&["revoke", a, "--by", "helpdesk ticket 4711"]);
    assert_eq!(v["state"], "revoked");
    assert_eq!(v["revoked_by"], "helpdesk ticket 4711");
    h.refused(
        &["revoke", a],
        1,
        &format!("link {a} is revoked already (by helpdesk ticket 4711)"),
    );
    h.refused(&["extend", a, "--days", "3"], 1, "is revoked already");
    assert_eq!(h.events(a), ["created", "revoked"]);
    // The default revoker, as text.
    let text = h.ok(&["revoke", b]).stdout;
    assert_eq!(text, format!("revoked link {b} (by operator)\n"));

    // Extend by days, then to a time (which may also bring the expiry closer).
    let before = time(&h.json(&["show", c])["link"]["expires"]);
    let v = h.json(&["extend", c, "--days", "30"]);
    assert!(time(&v["expires"]) > before, "{v}");
    assert_eq!(v["state"], "active");
    let until =
        (Utc::now() + TimeDelta::days(3)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let v = h.json(&["extend", c, "--until", &until]);
    assert_eq!(time(&v["expires"]), time(&Value::from(until.clone())));
    let shown = h.json(&["show", c]);
    let log = shown["access"].as_array().unwrap();
    assert_eq!(log.last().unwrap()["event"], "extended");
    assert_eq!(
        time(&log.last().unwrap()["detail"]),
        time(&Value::from(until.clone()))
    );
    // An expired link comes back.
    h.expire(d).await;
    assert_eq!(h.json(&["show", d])["link"]["state"], "expired");
    assert_eq!(h.json(&["extend", d, "--days", "1"])["state"], "active");

    // Purge one link now, though it is active: its sealed parts go, the row stays.
    let v = h.json(&["purge", c]);
    assert_eq!(v["state"], "purged");
    assert_eq!(v["link_id"], c);
    let sealed: Sealed = sqlx::query_as(
        "SELECT nonce, ciphertext, db_half FROM pepsi.secure_link_message WHERE link_id = $1",
    )
    .bind(c)
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(sealed, (None, None, None));
    h.refused(
        &["purge", c],
        1,
        &format!("link {c}: the message was purged"),
    );
    h.refused(&["revoke", c], 1, "the message was purged");
    assert_eq!(h.events(c), ["created", "extended", "extended", "purged"]);

    // Purge every expired or revoked one: a and b (revoked); d is active again.
    h.expire(d).await;
    assert_eq!(h.json(&["purge"])["purged"], 3);
    assert_eq!(
        h.ok(&["purge"]).stdout,
        "purged 0 expired or revoked links\n"
    );
    assert_eq!(h.listed(&["--state", "purged"]).len(), 4);
    assert_eq!(h.events(a), ["created", "revoked", "purged"]);

    // Each change has its audit row, naming the tool and who ran it.
    let revokes = h.audit_rows("secure_link.revoke").await;
    assert_eq!(revokes.len(), 2, "{revokes:?}");
    assert_eq!(revokes[0]["link_id"], a);
    assert_eq!(revokes[0]["by"], "helpdesk ticket 4711");
    assert_eq!(revokes[0]["tool"], "pepsi-secure-link");
    assert_eq!(revokes[0]["os_user"], "ops-alice");
    assert_eq!(h.audit_rows("secure_link.extend").await.len(), 3);
    let purges = h.audit_rows("secure_link.purge").await;
    assert_eq!(purges.len(), 3, "{purges:?}");
    assert_eq!(purges[0]["link_id"], c);
    assert_eq!(purges[1]["purged"], 3);
    assert_eq!(purges[2]["purged"], 0);
}

#[tokio::test]
async fn bad_input_is_refused_naming_it_and_a_database_failure_is_no_success() {
    let h = Harness::new().await;
    let a = &*h.link(CEO, PARTNER).await;
    // Usage and input that is not valid: 2, before anything is read or changed.
    for (args, says) in [
        (vec!["show", "nope"], "\"nope\" is not a link id"),
        (vec!["revoke", "AAAA/../x"], "is not a link id"),
        (
            vec!["list", "--state", "open"],
            "--state \"open\" is not a link state",
        ),
        (
            vec!["list", "--limit", "0"],
            "--limit 0 is not valid: 1 to 10000",
        ),
        (
            vec!["list", "--limit", "10001"],
            "--limit 10001 is not valid",
        ),
        (
            vec!["list", "--sender", "nobody"],
            "--sender \"nobody\" is not an address",
        ),
        (
            vec!["extend", a, "--days", "400"],
            "--days 400 is not valid: 1 to 365",
        ),
        (vec!["extend", a, "--days", "-1"], "--days -1 is not valid"),
        (
            vec!["extend", a, "--until", "tomorrow"],
            "is not an RFC 3339 time",
        ),
        (
            vec!["extend", a, "--until", "2001-01-01T00:00:00Z"],
            "is not between now and 365 days from now",
        ),
        (vec!["extend", a], "--until"),
        (
            vec![
                "extend",
                a,
                "--days",
                "3",
                "--until",
                "2027-01-01T00:00:00Z",
            ],
            "cannot be used",
        ),
        (vec!["revoke", a, "--by", " "], "--by \" \" is not a name"),
        (vec!["frobnicate"], "unrecognized subcommand"),
    ] {
        h.refused(&args, 2, says);
    }
    assert_eq!(h.events(a), ["created"]);
    // A link that is not there: refused, 1.
    h.refused(&["show", NO_LINK], 1, &format!("no link {NO_LINK}"));
    h.refused(&["revoke", NO_LINK], 1, &format!("no link {NO_LINK}"));
    h.refused(&["extend", NO_LINK, "--days", "2"], 1, "no link");
    h.refused(&["purge", NO_LINK], 1, "no link");

    // A database that does not answer: 1, naming it.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    let port = crate::support::free_port();
    std::fs::write(
        &config,
        format!("[database]\nURL = postgres://pepsi@127.0.0.1:{port}/pepsi\n"),
    )
    .unwrap();
    let run = Run::of(
        Command::new(TOOL)
            .arg("-c")
            .arg(&config)
            .args(["list"])
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.starts_with("pepsi-secure-link: ") && run.stderr.contains("database"),
        "{run:?}"
    );
    assert!(run.stdout.is_empty(), "{run:?}");
}
