//! pepsi-whitelist and pepsi-helper-mailbox-scan as processes against a real PostgreSQL and a
//! real Maildir: an owner's entries added, listed (table and JSON), removed, with every bad
//! input refused and nothing changed; the list's MAX_ENTRIES; the scan of the sent folder
//! and of replied messages (junk skipped, links and FIFOs never opened, the newest messages
//! first); learning that never overrides an owner's entry; and the audit rows. The setuid
//! case (a user kept to their own mailbox) runs in the package test's throwaway root, where
//! the bit, the accounts and peer authentication are real.

use std::path::{Path, PathBuf};
use std::process::Command;

use pepsi_testkit::TestDb;

use crate::support::Run;

const TOOL: &str = env!("CARGO_BIN_EXE_pepsi-whitelist");
const SCAN: &str = env!("CARGO_BIN_EXE_pepsi-helper-mailbox-scan");

fn config(db: &TestDb, dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n[pepsi]\nLOCAL_DOMAINS = example.test\nRECIPIENT_DELIMITER = +\n\
             [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = {}\nMAILDIR = %u/Maildir\n\
             [pepsi-whitelist]\nHELPER = {SCAN}\n{extra}",
            db.url,
            dir.display()
        ),
    )
    .unwrap();
    path
}

fn tool(cfg: &Path, args: &[&str]) -> Run {
    Run::of(
        Command::new(TOOL)
            .arg("-c")
            .arg(cfg)
            .args(args)
            .output()
            .unwrap(),
    )
}

async fn entries(db: &TestDb) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT mailbox, sender, origin FROM pepsi.whitelist ORDER BY mailbox, sender")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

fn e(mailbox: &str, sender: &str, origin: &str) -> (String, String, String) {
    (mailbox.into(), sender.into(), origin.into())
}

#[tokio::test]
async fn an_owner_adds_lists_and_removes_entries_and_bad_input_changes_nothing() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, dir.path(), "MAX_ENTRIES = 3\n");
    let m = ["--mailbox", "Alice+x@Example.test"];

    // Root has no mailbox of its own.
    let r = tool(&cfg, &["list"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("root has no mailbox"), "{r:?}");

    let r = tool(&cfg, &[&m[..], &["list"]].concat());
    assert_eq!(
        (r.code, r.stdout.trim()),
        (0, "alice@example.test: no entries"),
        "{r:?}"
    );

    // A learnt entry beforehand: `add` makes it the owner's.
    sqlx::query("INSERT INTO pepsi.whitelist (mailbox, sender, origin) VALUES ('alice@example.test', '@example.net', 'sent')")
        .execute(&db.pool)
        .await
        .unwrap();
    let r = tool(
        &cfg,
        &[
            &m[..],
            &["add", "Bob@Example.org", "@Example.net", "bob@example.org"],
        ]
        .concat(),
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains("alice@example.test: bob@example.org added"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("@example.net kept, now the owner's"),
        "{r:?}"
    );
    assert_eq!(
        entries(&db).await,
        [
            e("alice@example.test", "@example.net", "owner"),
            e("alice@example.test", "bob@example.org", "owner")
        ]
    );

    // Bad entries: exit 2, named, nothing changed (the good one beside them is not added).
    for bad in ["bob", "bob@", "b ob@example.org"] {
        let r = tool(&cfg, &[&m[..], &["add", "carol@example.org", bad]].concat());
        assert_eq!(r.code, 2, "{bad}: {r:?}");
        assert!(r.stderr.contains(&format!("{bad:?}")), "{bad}: {r:?}");
    }
    let r = tool(&cfg, &["--mailbox", "nobody", "list"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("--mailbox \"nobody\": not an address"),
        "{r:?}"
    );
    assert_eq!(entries(&db).await.len(), 2);

    // MAX_ENTRIES = 3: a fourth and fifth are refused together.
    let r = tool(
        &cfg,
        &[&m[..], &["add", "c@example.org", "d@example.org"]].concat(),
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains("would hold 4 entries, more than [pepsi-whitelist] MAX_ENTRIES 3"),
        "{r:?}"
    );
    assert_eq!(entries(&db).await.len(), 2);

    // The listing: a table, and JSON.
    let r = tool(&cfg, &[&m[..], &["list"]].concat());
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .starts_with("alice@example.test: 2 entries\nSENDER"),
        "{r:?}"
    );
    assert!(r.stdout.contains("bob@example.org  owner"), "{r:?}");
    let doc = tool(&cfg, &[&m[..], &["list", "--json"]].concat()).json();
    assert_eq!(doc["mailbox"], "alice@example.test");
    let senders: Vec<&str> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["sender"].as_str().unwrap())
        .collect();
    assert_eq!(senders, ["@example.net", "bob@example.org"]);
    assert!(doc["entries"][0]["added_at"].as_str().is_some(), "{doc}");

    // Remove: the one there goes, the one not there is named and makes the exit 1.
    let r = tool(
        &cfg,
        &[&m[..], &["remove", "@example.net", "zed@example.org"]].concat(),
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stdout.contains("@example.net removed"), "{r:?}");
    assert!(
        r.stderr.contains("not on the list: zed@example.org"),
        "{r:?}"
    );
    assert_eq!(
        entries(&db).await,
        [e("alice@example.test", "bob@example.org", "owner")]
    );

    // Every change has its audit row, with the mailbox and the senders.
    let log: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT action, detail FROM pepsi.event_log WHERE action LIKE 'whitelist.%' ORDER BY event_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let actions: Vec<&str> = log.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(actions, ["whitelist.add", "whitelist.remove"]);
    assert_eq!(log[0].1["mailbox"], "alice@example.test");
    assert_eq!(log[1].1["senders"], serde_json::json!(["@example.net"]));
    assert_eq!(log[0].1["tool"], "pepsi-whitelist");
}

/// A message file in `dir` (created) with a given name and header block.
fn message(dir: &Path, name: &str, headers: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), format!("{headers}\r\n\r\nbody\r\n")).unwrap();
}

/// alice's Maildir: sent mail to bob and carol, a replied message from dave, a read (not
/// replied) one from eve, a replied one in Junk, and a link and a FIFO that must not be read.
fn maildir(root: &Path) -> PathBuf {
    let md = root.join("alice/Maildir");
    for d in ["cur", "new", "tmp"] {
        std::fs::create_dir_all(md.join(d)).unwrap();
    }
    message(
        &md.join(".Sent/cur"),
        "1.a.host:2,S",
        "From: alice@example.test\r\nTo: Bob <Bob@Example.org>\r\nCc: carol@example.net, alice+self@example.test",
    );
    message(
        &md.join(".Sent/new"),
        "2.a.host",
        "To: undisclosed-recipients:;\r\nBcc: frank@example.com",
    );
    message(
        &md.join("cur"),
        "3.a.host:2,RS",
        "From: Dave <dave@example.com>\r\nTo: alice@example.test",
    );
    message(
        &md.join("cur"),
        "4.a.host:2,S",
        "From: eve@example.com\r\nTo: alice@example.test",
    );
    message(
        &md.join(".Junk/cur"),
        "5.a.host:2,RS",
        "From: spam@example.biz\r\nTo: alice@example.test",
    );
    message(
        &md.join(".Work/cur"),
        "6.a.host:2,R",
        "From: Gina@Example.com\r\nTo: alice@example.test",
    );
    let secret = root.join("secret");
    message(&secret, "x", "From: mallory@example.com");
    std::os::unix::fs::symlink(secret.join("x"), md.join("cur/7.a.host:2,R")).unwrap();
    let fifo = std::ffi::CString::new(md.join("cur/8.a.host:2,R").to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    md
}

#[test]
fn the_scan_prints_whom_the_sent_folder_and_replies_name_and_reads_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let md = maildir(dir.path());
    let r = Run::of(Command::new(SCAN).arg(&md).output().unwrap());
    assert_eq!(r.code, 0, "{r:?}");
    let mut lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.pop(), Some("done 4 0"), "{r:?}");
    lines.sort();
    assert_eq!(
        lines,
        [
            "replied dave@example.com",
            "replied gina@example.com",
            "sent alice+self@example.test",
            "sent bob@example.org",
            "sent carol@example.net",
            "sent frank@example.com",
        ]
    );
    // The newest message only: the others count as skipped.
    let newest = md.join(".Work/cur/6.a.host:2,R");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let r = Run::of(
        Command::new(SCAN)
            .args(["--max-messages", "1"])
            .arg(&md)
            .output()
            .unwrap(),
    );
    assert_eq!(r.stdout, "replied gina@example.com\ndone 1 3\n", "{r:?}");
    // A sent folder of another name, and a directory that is not a Maildir.
    let r = Run::of(
        Command::new(SCAN)
            .args(["--sent-folder", "Work"])
            .arg(&md)
            .output()
            .unwrap(),
    );
    assert!(
        r.stdout.contains("sent alice@example.test\n") && !r.stdout.contains("sent bob@"),
        "{r:?}"
    );
    let r = Run::of(Command::new(SCAN).arg(dir.path()).output().unwrap());
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("not a Maildir (no cur/)"), "{r:?}");
}

#[tokio::test]
async fn learning_adds_what_the_scan_finds_and_never_overrides_an_owner() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    maildir(dir.path());
    let cfg = config(&db, dir.path(), "");
    let m = ["--mailbox", "alice@example.test"];
    sqlx::query("INSERT INTO pepsi.whitelist (mailbox, sender, origin) VALUES ('alice@example.test', 'bob@example.org', 'owner')")
        .execute(&db.pool)
        .await
        .unwrap();

    // A dry run prints and changes nothing.
    let r = tool(&cfg, &[&m[..], &["learn", "--dry-run"]].concat());
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("dave@example.com replied\n"), "{r:?}");
    assert!(
        r.stdout
            .contains("5 addresses would be learnt or confirmed (4 messages read in"),
        "{r:?}"
    );
    assert_eq!(entries(&db).await.len(), 1);

    // The Maildir by the delivery stage's template; alice's own address is not learnt.
    let r = tool(&cfg, &[&m[..], &["learn"]].concat());
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .starts_with("alice@example.test: 4 learnt, 1 confirmed (4 messages read in"),
        "{r:?}"
    );
    let a = "alice@example.test";
    assert_eq!(
        entries(&db).await,
        [
            e(a, "bob@example.org", "owner"),
            e(a, "carol@example.net", "sent"),
            e(a, "dave@example.com", "replied"),
            e(a, "frank@example.com", "sent"),
            e(a, "gina@example.com", "replied"),
        ]
    );
    let detail: serde_json::Value =
        sqlx::query_scalar("SELECT detail FROM pepsi.event_log WHERE action = 'whitelist.learn'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (detail["added"].as_i64(), detail["confirmed"].as_i64()),
        (Some(4), Some(1))
    );

    // A full list learns what fits and says what it dropped. The scan reports at most
    // MAX_ENTRIES (3) addresses, the newest messages' first; one entry is held already.
    let db2 = TestDb::new().await;
    sqlx::query("INSERT INTO pepsi.whitelist (mailbox, sender, origin) VALUES ('alice@example.test', 'zed@example.org', 'owner')")
        .execute(&db2.pool)
        .await
        .unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let cfg2 = config(&db2, dir2.path(), "MAX_ENTRIES = 3\n");
    let md = dir.path().join("alice/Maildir");
    let r = tool(
        &cfg2,
        &[&m[..], &["learn", "--maildir", md.to_str().unwrap()]].concat(),
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains(": 2 learnt, 0 confirmed"), "{r:?}");
    assert!(
        r.stderr
            .contains("not learnt, the list being full ([pepsi-whitelist] MAX_ENTRIES 3): 1"),
        "{r:?}"
    );
    assert_eq!(entries(&db2).await.len(), 3);

    // No Maildir there: named (root's run looks for its owner first).
    let r = tool(&cfg, &["--mailbox", "nobody@example.test", "learn"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("the Maildir ") && r.stderr.contains("/nobody/Maildir: No such file"),
        "{r:?}"
    );
}

/// A held message for alice from `sender`, paused at the secretary stage as the stage leaves
/// one; returns (held id, queue id).
async fn held_message(db: &TestDb, sender: &str) -> (i64, i64) {
    let queue_id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add($1, ARRAY['alice@example.test'], $2, 'Hi.', \
         '{\"secretary\": {\"held\": \"challenged\", \"mailbox\": \"alice@example.test\"}}')",
    )
    .bind(sender)
    .bind(format!("From: {sender}\r\nSubject: about {sender}\r\n").as_bytes())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET stage = 'secretary', status = 'paused', \
         timeout = now() + interval '1 day' WHERE workqueue_id = $1",
    )
    .bind(queue_id)
    .execute(&db.pool)
    .await
    .unwrap();
    let held_id: i64 = sqlx::query_scalar(
        "INSERT INTO pepsi.secretary_held \
           (queue_id, mailbox, sender, mail_from, subject, size, reason, expires_at) \
         VALUES ($1, 'alice@example.test', $2, $2, $3, 40, 'challenged', now() + interval '14 days') \
         RETURNING held_id",
    )
    .bind(queue_id)
    .bind(sender)
    .bind(format!("about {sender}"))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    (held_id, queue_id)
}

/// The secretary's held mail on the command line: listed (table and JSON), released and
/// discarded for the mailbox's own messages only (another mailbox's id refused, nothing
/// changed), each decision waking the queue row and recorded in the audit log; the digest
/// lists what no digest listed yet, with a link to the owner's page, once.
#[tokio::test]
async fn an_owner_lists_releases_and_discards_held_mail_and_gets_one_digest() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &db,
        dir.path(),
        "[pepsi]\nSECRETARY_URL = https://mail.example.test\nHOSTNAME = mx.example.test\n",
    );
    sqlx::query("INSERT INTO pepsi.settings (address, name, value) VALUES ('alice@example.test', 'secretary', '{}')")
        .execute(&db.pool)
        .await
        .unwrap();
    let (bob, _) = held_message(&db, "bob@remote.test").await;
    let (eve, _) = held_message(&db, "eve@remote.test").await;
    let m = ["--mailbox", "alice@example.test"];
    let r = tool(&cfg, &[&m[..], &["held"]].concat());
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("alice@example.test: 2 held"), "{r:?}");
    assert!(
        r.stdout.contains("bob@remote.test") && r.stdout.contains("about eve@remote.test"),
        "{r:?}"
    );
    let r = tool(&cfg, &[&m[..], &["held", "--json"]].concat());
    let listed: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{r:?}");

    // Another mailbox's id: refused, nothing changed.
    let r = tool(
        &cfg,
        &[
            "--mailbox",
            "carol@example.test",
            "held",
            "release",
            &bob.to_string(),
        ],
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("no held message {bob} for carol@example.test")),
        "{r:?}"
    );
    let status = |id: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (String, String)>(
                "SELECT h.status, q.status::text FROM pepsi.secretary_held h \
                 JOIN pepsi.workqueue q ON q.workqueue_id = h.queue_id WHERE h.held_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(status(bob).await, ("held".into(), "paused".into()));

    // The digest: both messages, the owner's page, and the rows marked.
    let r = tool(&cfg, &["held", "digest"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("alice@example.test: digest of 2 held"),
        "{r:?}"
    );
    let (rcpt, body): (Vec<String>, Vec<u8>) = sqlx::query_as(
        "SELECT q.rcpt_to, b.body FROM pepsi.workqueue q JOIN pepsi.workqueue_body b USING (body_id) \
         WHERE q.state -> 'secretary' ->> 'made' = 'digest'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rcpt, ["alice@example.test"]);
    let body = String::from_utf8(body).unwrap();
    assert!(
        body.contains("https://mail.example.test/secretary/held/"),
        "{body}"
    );
    assert!(
        body.contains(&format!("[{bob}]")) && body.contains(&format!("[{eve}]")),
        "{body}"
    );
    let links: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.secretary_owner_link")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(links, 1);
    let r = tool(&cfg, &["held", "digest"]);
    assert!(
        r.stdout.contains("no digest due"),
        "the same mail is not listed twice: {r:?}"
    );

    let r = tool(
        &cfg,
        &[&m[..], &["held", "release", &bob.to_string()]].concat(),
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains(&format!("{bob}: released")), "{r:?}");
    assert_eq!(status(bob).await, ("released".into(), "pending".into()));
    let r = tool(
        &cfg,
        &[&m[..], &["held", "discard", &eve.to_string()]].concat(),
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(status(eve).await, ("discarded".into(), "pending".into()));
    let r = tool(
        &cfg,
        &[&m[..], &["held", "release", &eve.to_string()]].concat(),
    );
    assert!(
        r.stdout.contains(&format!("{eve}: already discarded")),
        "{r:?}"
    );
    let audit: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM pepsi.event_log WHERE action LIKE 'secretary.%' ORDER BY event_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(audit, ["secretary.released", "secretary.discarded"]);
}
