//! Local delivery as programs: `pepsi-stage-relay-to-maildir worker` over its stdin/stdout
//! protocol against a real database, writing through the real `pepsi-helper-maildir-writer`
//! into real Maildirs; and the writer alone over its own protocol.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-relay-to-maildir");
const WRITER: &str = env!("CARGO_BIN_EXE_pepsi-helper-maildir-writer");

const HEADERS: &str = "From: bob@remote.test\r\nTo: alice@example.test\r\nSubject: hi\r\n";
const BODY: &str = "Hello,\r\n\r\nthis is the body.\r\n";

/// A mail root with Maildirs for `users`, and a configuration whose stages deliver into it.
struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

fn setup(db: &TestDb, users: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mail");
    for u in users {
        maildir(&root.join(u).join("Maildir"));
    }
    let config = dir.path().join("pepsi.conf");
    // Tests may run as root, where the writer refuses root-owned mailboxes unless allowed.
    let common = format!(
        "PROGRAM = pepsi-stage-relay-to-maildir\nHELPER = {WRITER}\nBOUNCE_STAGE = bounce\n\
         NONLOCAL_STAGE = remote\nALLOW_ROOT_OWNER = yes\nRETRY_INITIAL = 10m\n"
    );
    std::fs::write(
        &config,
        format!(
            "[PATHS]\nMAIL_ROOT = {root}\n\n[database]\nURL = {url}\n\n\
             [pepsi]\nLOCAL_DOMAINS = example.test\n\n\
             [stage-local]\n{common}MAILDIR = %u/Maildir\n\n\
             [stage-small]\n{common}QUOTA = 1k\nQUOTA_GRACE = 0\n\n\
             [stage-soft]\n{common}QUOTA = 1k\nQUOTA_FULL_TEMPORARY = yes\n\n\
             [stage-broken]\n{common}HELPER = /bin/false\n\n\
             [stage-remote]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-discard\n",
            root = root.display(),
            url = db.url,
        ),
    )
    .unwrap();
    Setup {
        _dir: dir,
        root,
        config,
    }
}

fn maildir(path: &Path) {
    for sub in ["tmp", "new", "cur"] {
        std::fs::create_dir_all(path.join(sub)).unwrap();
    }
}

/// A message from bob@remote.test to `rcpt`, running at `stage`; `dsn.rcpt[i].orcpt` names
/// each recipient so the tests can follow the entries.
async fn message(db: &TestDb, stage: &str, rcpt: &[&str]) -> i64 {
    let dsn: Vec<Value> = rcpt
        .iter()
        .map(|r| json!({"notify": null, "orcpt": format!("rfc822;{r}")}))
        .collect();
    let state = json!({"dsn": {"ret": null, "envid": "env-1", "rcpt": dsn}});
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("bob@remote.test")
        .bind(&rcpt)
        .bind(HEADERS.as_bytes())
        .bind(BODY.as_bytes())
        .bind(&state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, stage).await;
    id
}

async fn worker(s: &Setup, ids: &[i64]) -> Vec<String> {
    support::run_ids(STAGE, &s.config, ids).await
}

/// (stage, status, rcpt_to, state) of every row, oldest first.
async fn rows(db: &TestDb) -> Vec<(i64, String, String, Vec<String>, Value)> {
    support::rows(&db.pool).await
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn expected_copy(rcpt: &str) -> Vec<u8> {
    format!("Return-Path: <bob@remote.test>\r\nDelivered-To: {rcpt}\r\n{HEADERS}\r\n{BODY}")
        .into_bytes()
}

/// One file in `user`'s new/, byte for byte the expected copy, and nothing left in tmp/.
fn assert_delivered(s: &Setup, user: &str, rcpt: &str) {
    let md = s.root.join(user).join("Maildir");
    let new = files(&md.join("new"));
    assert_eq!(new.len(), 1, "{user}: {new:?}");
    let stored = std::fs::read(&new[0]).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&stored),
        String::from_utf8_lossy(&expected_copy(rcpt))
    );
    let name = new[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with(&format!(",S={}", stored.len())), "{name}");
    assert_eq!(
        files(&md.join("tmp")),
        Vec::<PathBuf>::new(),
        "tmp/ of {user}"
    );
}

#[tokio::test]
async fn a_message_to_two_local_recipients_lands_in_both_maildirs() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice", "bob"]);
    let id = message(
        &db,
        "local",
        &["alice@example.test", "Bob+news@Example.Test"],
    )
    .await;
    assert_eq!(worker(&s, &[id]).await, vec![r#"0 {"finished":true}"#]);
    assert_delivered(&s, "alice", "alice@example.test");
    assert_delivered(&s, "bob", "Bob+news@Example.Test");
    assert!(rows(&db).await.is_empty(), "the row is finished");
}

#[tokio::test]
async fn mixed_recipients_are_split_and_the_remote_ones_go_on() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice"]);
    let id = message(
        &db,
        "local",
        &[
            "carol@remote.test",
            "alice@example.test",
            "dave@remote.test",
        ],
    )
    .await;
    assert_eq!(worker(&s, &[id]).await, vec![r#"0 {"finished":true}"#]);
    assert_delivered(&s, "alice", "alice@example.test");
    let left = rows(&db).await;
    assert_eq!(left.len(), 1, "{left:?}");
    let (sibling, stage, status, rcpt, state) = &left[0];
    assert_ne!(*sibling, id);
    assert_eq!((stage.as_str(), status.as_str()), ("remote", "pending"));
    assert_eq!(rcpt, &["carol@remote.test", "dave@remote.test"]);
    let orcpt: Vec<&str> = state["dsn"]["rcpt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["orcpt"].as_str().unwrap())
        .collect();
    assert_eq!(
        orcpt,
        ["rfc822;carol@remote.test", "rfc822;dave@remote.test"]
    );
    assert_eq!(state["dsn"]["envid"], "env-1");
}

#[tokio::test]
async fn an_unknown_user_is_bounced_alone_and_the_other_recipient_delivered() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice"]);
    let id = message(&db, "local", &["nobody@example.test", "alice@example.test"]).await;
    assert_eq!(worker(&s, &[id]).await, vec![r#"0 {"finished":true}"#]);
    assert_delivered(&s, "alice", "alice@example.test");
    let left = rows(&db).await;
    assert_eq!(left.len(), 1, "only the bounce clone: {left:?}");
    let (_, stage, status, rcpt, state) = &left[0];
    assert_eq!((stage.as_str(), status.as_str()), ("bounce", "pending"));
    assert_eq!(rcpt, &["nobody@example.test"]);
    let bounce = &state["bounce"];
    assert_eq!(bounce["kind"], "permanent");
    assert_eq!(bounce["enhanced_status"], "5.1.1");
    assert_eq!(bounce["stage"], "local");
    let per = bounce["recipients"].as_object().unwrap();
    assert_eq!(per.keys().collect::<Vec<_>>(), ["nobody@example.test"]);
    assert!(
        per["nobody@example.test"]["diagnostic"]
            .as_str()
            .unwrap()
            .contains("no such mailbox"),
        "{bounce}"
    );
    assert_eq!(
        state["dsn"]["rcpt"][0]["orcpt"],
        "rfc822;nobody@example.test"
    );
    assert!(
        !s.root.join("nobody").exists(),
        "nothing created for an unknown user"
    );
}

/// A 1000-byte message already in cur/ (sized by stat: its name has no S=).
fn fill(s: &Setup, user: &str) {
    std::fs::write(
        s.root.join(user).join("Maildir/cur/1.M1P1Q1.host:2,S"),
        vec![b'x'; 1000],
    )
    .unwrap();
}

#[tokio::test]
async fn over_quota_is_a_5_2_2_bounce_or_a_4_2_2_wait_when_configured() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice", "bob"]);
    fill(&s, "alice");
    fill(&s, "bob");
    let hard = message(&db, "small", &["alice@example.test"]).await;
    let soft = message(&db, "soft", &["bob@example.test"]).await;
    let lines = worker(&s, &[hard, soft]).await;
    assert_eq!(lines, vec![r#"0 {"finished":true}"#, "0"]);
    let left = rows(&db).await;
    assert_eq!(left.len(), 2, "{left:?}");
    let (soft_id, stage, status, _, state) = &left[0];
    assert_eq!(
        (*soft_id, stage.as_str(), status.as_str()),
        (soft, "soft", "paused")
    );
    assert_eq!(state["attempts"], 1);
    assert!(
        state["last_error"]
            .as_str()
            .unwrap()
            .starts_with("4.2.2 mailbox full"),
        "{state}"
    );
    let (_, stage, _, rcpt, state) = &left[1];
    assert_eq!(
        (stage.as_str(), rcpt.as_slice()),
        ("bounce", &["alice@example.test".to_owned()][..])
    );
    assert_eq!(state["bounce"]["enhanced_status"], "5.2.2");
    for u in ["alice", "bob"] {
        let md = s.root.join(u).join("Maildir");
        assert!(
            files(&md.join("new")).is_empty() && files(&md.join("tmp")).is_empty(),
            "{u}"
        );
    }
}

#[tokio::test]
async fn a_broken_maildir_pauses_the_row_with_a_transient_error() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice"]);
    // new/ is a regular file: the rename into it fails whatever our privileges.
    let md = s.root.join("alice/Maildir");
    std::fs::remove_dir(md.join("new")).unwrap();
    std::fs::write(md.join("new"), b"").unwrap();
    let id = message(&db, "local", &["alice@example.test"]).await;
    assert_eq!(worker(&s, &[id]).await, vec!["0"]);
    let left = rows(&db).await;
    assert_eq!(left.len(), 1);
    let (row, stage, status, _, state) = &left[0];
    assert_eq!(
        (*row, stage.as_str(), status.as_str()),
        (id, "local", "paused")
    );
    assert_eq!(state["attempts"], 1);
    let err = state["last_error"].as_str().unwrap();
    assert!(err.starts_with("4.3.0 ") && err.contains("new"), "{err}");
    let due: bool = sqlx::query_scalar(
        "SELECT timeout > now() + interval '9 minutes' FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(due, "paused for RETRY_INITIAL");
    assert!(
        files(&md.join("tmp")).is_empty(),
        "the failed write left nothing in tmp/"
    );
}

#[tokio::test]
async fn a_helper_that_dies_makes_the_recipient_wait_and_is_restarted() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice"]);
    let broken = message(&db, "broken", &["alice@example.test"]).await;
    let good = message(&db, "local", &["alice@example.test"]).await;
    // Same worker: the dead helper is replaced for the next message.
    let lines = worker(&s, &[broken, good]).await;
    assert_eq!(lines, vec!["0", r#"0 {"finished":true}"#]);
    let left = rows(&db).await;
    assert_eq!(left.len(), 1);
    let (_, _, status, _, state) = &left[0];
    assert_eq!(status, "paused");
    let err = state["last_error"].as_str().unwrap();
    assert!(err.contains("4.3.0") && err.contains("/bin/false"), "{err}");
    assert_delivered(&s, "alice", "alice@example.test");
}

// ----- the writer alone, over its own protocol -----

struct Writer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Writer {
    fn start(root: &Path, extra: &[&str]) -> Writer {
        let mut child = Command::new(WRITER)
            .arg("--root")
            .arg(root)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Writer {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, mailbox: &Path, message: &[u8]) -> String {
        self.send_with(mailbox, "now", message)
    }

    fn send_with(&mut self, mailbox: &Path, dir_sync: &str, message: &[u8]) -> String {
        write!(
            self.stdin,
            "mailbox {}\nreturn-path a@b.test\ndelivered-to c@d.test\nkey\nquota 0\nquota-messages 0\n\
             dir-sync {dir_sync}\nsize {}\n",
            mailbox.display(),
            message.len()
        )
        .unwrap();
        self.stdin.write_all(message).unwrap();
        self.answer()
    }

    /// A keyed `dir-sync now` delivery for row `row` (incarnation 1733550000.000001).
    fn send_keyed(&mut self, mailbox: &Path, row: i64, message: &[u8]) -> String {
        write!(
            self.stdin,
            "mailbox {}\nreturn-path a@b.test\ndelivered-to c@d.test\nkey {row} 1733550000000001\n\
             quota 0\nquota-messages 0\ndir-sync now\nsize {}\n",
            mailbox.display(),
            message.len()
        )
        .unwrap();
        self.stdin.write_all(message).unwrap();
        self.answer()
    }

    fn sync(&mut self) -> String {
        self.stdin.write_all(b"sync\n").unwrap();
        self.answer()
    }

    /// A `dir-sync now` delivery under a quota of `bytes` and `messages` (0: none).
    fn send_quota(&mut self, mailbox: &Path, bytes: u64, messages: u64, message: &[u8]) -> String {
        write!(
            self.stdin,
            "mailbox {}\nreturn-path a@b.test\ndelivered-to c@d.test\nkey\nquota {bytes}\n\
             quota-messages {messages}\ndir-sync now\nsize {}\n",
            mailbox.display(),
            message.len()
        )
        .unwrap();
        self.stdin.write_all(message).unwrap();
        self.answer()
    }

    fn usage(&mut self, mailbox: &Path, bytes: u64, messages: u64, rebuild: bool) -> String {
        write!(
            self.stdin,
            "usage {}\nquota {bytes}\nquota-messages {messages}\nrebuild {}\n",
            mailbox.display(),
            if rebuild { "yes" } else { "no" }
        )
        .unwrap();
        self.answer()
    }

    fn answer(&mut self) -> String {
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line
    }

    fn finish(mut self) -> Option<i32> {
        drop(self.stdin);
        self.child.wait().unwrap().code()
    }
}

/// The effective uid the tests run as.
fn my_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

#[test]
fn the_writer_refuses_paths_that_escape_its_root_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mail");
    maildir(&root.join("alice/Maildir"));
    let outside = dir.path().join("outside/Maildir");
    maildir(&outside);
    std::os::unix::fs::symlink(dir.path().join("outside"), root.join("mallory")).unwrap();
    let mut w = Writer::start(&root, &["--allow-root-owner", "--create"]);
    for escape in [
        root.join("alice/../../outside/Maildir"),
        root.join("mallory/Maildir"),
        outside.clone(),
        PathBuf::from("relative/Maildir"),
    ] {
        let reply = w.send(&escape, b"x\r\n");
        assert!(
            reply.starts_with("temp 4.3.5 mailbox path") && reply.contains("refused"),
            "{escape:?}: {reply}"
        );
    }
    assert!(files(&outside.join("new")).is_empty() && files(&outside.join("tmp")).is_empty());
    // The session goes on: a good request after the refusals is delivered.
    let reply = w.send(&root.join("alice/Maildir"), b"Subject: ok\r\n\r\nbody\r\n");
    let name = reply
        .strip_prefix("ok ")
        .expect(&reply)
        .trim_end()
        .to_owned();
    let stored = std::fs::read(root.join("alice/Maildir/new").join(&name)).unwrap();
    assert_eq!(
        stored,
        b"Return-Path: <a@b.test>\r\nDelivered-To: c@d.test\r\nSubject: ok\r\n\r\nbody\r\n"
    );
    assert!(files(&root.join("alice/Maildir/tmp")).is_empty());
    // --create makes a missing Maildir (and the directory above it) under the root.
    let reply = w.send(&root.join("newcomer/Maildir"), b"x\r\n");
    assert!(reply.starts_with("ok "), "{reply}");
    for sub in ["cur", "tmp"] {
        assert!(root.join("newcomer/Maildir").join(sub).is_dir());
    }
    assert_eq!(files(&root.join("newcomer/Maildir/new")).len(), 1);
    assert_eq!(w.finish(), Some(0));
}

/// A symbolic link below the root that a mailbox owner planted (owned by another user than
/// root or the writer's own) is not followed: it would pick another owner's Maildir and the
/// identity the write runs as. Root's links are followed.
#[test]
fn a_symbolic_link_planted_by_a_mailbox_owner_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mail");
    maildir(&root.join("alice/Maildir"));
    std::fs::create_dir_all(root.join("mallory")).unwrap();
    let planted = root.join("mallory/Maildir");
    std::os::unix::fs::symlink(root.join("alice/Maildir"), &planted).unwrap();
    // Run as root (as in CI), the test can give the link to another user, as a mailbox
    // owner's own link would be; run as anyone else, the link is the writer's user's own.
    let as_root = my_uid() == 0;
    if as_root {
        std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    }
    let mut w = Writer::start(&root, &["--allow-root-owner"]);
    let reply = w.send(&planted, b"Subject: planted\r\n\r\nx\r\n");
    if as_root {
        assert!(
            reply.starts_with("temp 4.3.5 mailbox path")
                && reply.contains("symbolic link owned by uid 65534"),
            "{reply}"
        );
        assert!(files(&root.join("alice/Maildir/new")).is_empty());
    } else {
        assert!(reply.starts_with("ok "), "the writer's own link: {reply}");
    }
    // A link of the writer's own user (root's, run as root) is followed.
    std::os::unix::fs::symlink(root.join("alice"), root.join("alias")).unwrap();
    let reply = w.send(&root.join("alias/Maildir"), b"Subject: alias\r\n\r\nx\r\n");
    assert!(reply.starts_with("ok "), "{reply}");
    assert_eq!(
        files(&root.join("alice/Maildir/new")).len(),
        if as_root { 1 } else { 2 }
    );
    assert_eq!(w.finish(), Some(0));
}

#[test]
fn the_writer_writes_as_the_mailbox_owner_and_refuses_root_owned_mailboxes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mail");
    let md = root.join("user/Maildir");
    maildir(&md);
    let uid = my_uid();
    let mut w = Writer::start(&root, &[]);
    if uid == 0 {
        // Root-owned: refused without --allow-root-owner.
        let reply = w.send(&md, b"x\r\n");
        assert!(
            reply.starts_with("temp 4.3.5 mailbox") && reply.contains("owned by root"),
            "{reply}"
        );
        // Owned by nobody (65534): the file is written as nobody.
        for p in [dir.path(), root.as_path()] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        for p in [md.clone(), md.join("tmp"), md.join("new"), md.join("cur")] {
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        }
    }
    let reply = w.send(&md, b"x\r\n");
    let name = reply
        .strip_prefix("ok ")
        .expect(&reply)
        .trim_end()
        .to_owned();
    let meta = std::fs::metadata(md.join("new").join(&name)).unwrap();
    let owner = if uid == 0 { 65534 } else { uid };
    assert_eq!(
        (meta.uid(), meta.gid()),
        (owner, if uid == 0 { 65534 } else { meta.gid() })
    );
    assert_eq!(w.finish(), Some(0));
}

/// `dir-sync later` deliveries are in new/ when answered; `sync` then syncs each Maildir's
/// new/ once however many copies went into it, and says how many it synced.
#[test]
fn deliveries_with_a_later_sync_are_synced_once_per_maildir_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mail");
    for u in ["alice", "bob"] {
        maildir(&root.join(u).join("Maildir"));
    }
    let mut w = Writer::start(&root, &["--allow-root-owner"]);
    for u in ["alice", "bob", "alice"] {
        let reply = w.send_with(&root.join(u).join("Maildir"), "later", b"x\r\n");
        assert!(reply.starts_with("ok "), "{reply}");
    }
    assert_eq!(files(&root.join("alice/Maildir/new")).len(), 2);
    assert_eq!(files(&root.join("bob/Maildir/new")).len(), 1);
    assert_eq!(w.sync(), "ok synced 2\n");
    assert_eq!(w.sync(), "ok synced 0\n", "nothing waits any more");
    // A `now` delivery leaves nothing for the next sync.
    assert!(
        w.send(&root.join("bob/Maildir"), b"y\r\n")
            .starts_with("ok ")
    );
    assert_eq!(w.sync(), "ok synced 0\n");
    assert_eq!(w.finish(), Some(0));
}

/// A writer that has written into a Maildir before (its index of keyed copies built) still
/// finds a delivery's copy that another writer stored since, in new/ or moved by a reader
/// to cur/ and renamed there for its flags, and writes it again once the reader deleted it:
/// the same answers with the index and without it (`--key-index-dirs 0`).
#[test]
fn a_long_running_writer_sees_copies_stored_moved_and_deleted_by_others() {
    for index in ["256", "0"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mail");
        let md = root.join("alice/Maildir");
        maildir(&md);
        let args = ["--allow-root-owner", "--key-index-dirs", index];
        let (mut w1, mut w2) = (Writer::start(&root, &args), Writer::start(&root, &args));
        let name = |reply: String| {
            reply
                .strip_prefix("ok ")
                .unwrap_or_else(|| panic!("index {index}: {reply}"))
                .trim_end()
                .to_owned()
        };
        let one = name(w1.send_keyed(&md, 1, b"one\r\n"));
        // Another writer stores row 2; asked again, the first one finds it in new/.
        let two = name(w2.send_keyed(&md, 2, b"two\r\n"));
        assert_eq!(
            name(w1.send_keyed(&md, 2, b"two\r\n")),
            two,
            "index {index}"
        );
        assert_eq!(files(&md.join("new")).len(), 2, "index {index}");
        // A reader moves it to cur/ and changes its flags: still found, nothing written.
        std::fs::rename(
            md.join("new").join(&two),
            md.join("cur").join(format!("{two}:2,S")),
        )
        .unwrap();
        std::fs::rename(
            md.join("cur").join(format!("{two}:2,S")),
            md.join("cur").join(format!("{two}:2,RS")),
        )
        .unwrap();
        assert_eq!(
            name(w1.send_keyed(&md, 2, b"two\r\n")),
            format!("{two}:2,RS"),
            "index {index}"
        );
        assert_eq!(files(&md.join("new")), vec![md.join("new").join(&one)]);
        // Deleted by the reader: the delivery is made again.
        std::fs::remove_file(md.join("cur").join(format!("{two}:2,RS"))).unwrap();
        assert_eq!(
            name(w1.send_keyed(&md, 2, b"two\r\n")),
            two,
            "index {index}"
        );
        assert_eq!(files(&md.join("new")).len(), 2, "index {index}");
        assert!(files(&md.join("cur")).is_empty());
        assert_eq!((w1.finish(), w2.finish()), (Some(0), Some(0)));
    }
}

/// An index size out of range is refused at start, naming the option.
#[test]
fn the_writer_refuses_a_key_index_beyond_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(WRITER)
        .args(["--root"])
        .arg(dir.path())
        .args(["--key-index-dirs", "65537"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--key-index-dirs") && err.contains("65537"),
        "{err}"
    );
}

/// A helper that stops between answering deliveries and syncing their Maildirs: the
/// worker records none of that round's deliveries (each row answers a temporary error and
/// stays running for the dispatcher to retry), though the copies are in new/.
#[tokio::test]
async fn deliveries_whose_maildir_sync_is_lost_are_not_recorded() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice"]);
    let proxy = sync_loser(&s);
    let config = std::fs::read_to_string(&s.config).unwrap().replace(
        "[stage-small]",
        &format!(
            "[stage-lossy]\nPROGRAM = pepsi-stage-relay-to-maildir\nHELPER = {}\n\
             ALLOW_ROOT_OWNER = yes\nBOUNCE_STAGE = bounce\nQUEUE_LIMIT = 8\n\n[stage-small]",
            proxy.display()
        ),
    );
    std::fs::write(&s.config, config).unwrap();
    let a = message(&db, "lossy", &["alice@example.test"]).await;
    let b = message(&db, "lossy", &["alice@example.test"]).await;
    let lines = worker(&s, &[a, b]).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert!(
            line.starts_with("1 ")
                && line.contains("\"temporary\":true")
                && line.contains("could not sync the Maildirs written"),
            "{line}"
        );
    }
    let left = rows(&db).await;
    assert_eq!(left.len(), 2, "both rows are still queued: {left:?}");
    for (_, stage, status, _, _) in &left {
        assert_eq!((stage.as_str(), status.as_str()), ("lossy", "running"));
    }
    assert_eq!(
        files(&s.root.join("alice/Maildir/new")).len(),
        2,
        "the copies were written; only their recording waits"
    );
}

/// A writer that passes deliveries through to the real one and exits when asked to sync:
/// the writer dying after it stored copies and before the worker could commit them.
fn sync_loser(s: &Setup) -> PathBuf {
    let proxy = s.root.parent().unwrap().join("sync-loser.py");
    std::fs::write(
        &proxy,
        format!(
            "#!/usr/bin/env python3\n\
             import subprocess, sys\n\
             w = subprocess.Popen([{WRITER:?}] + sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n\
             inp, out = sys.stdin.buffer, sys.stdout.buffer\n\
             while True:\n\
             \x20   first = inp.readline()\n\
             \x20   if not first or first == b'sync\\n':\n\
             \x20       sys.exit(0)\n\
             \x20   head = [first] + [inp.readline() for _ in range(7)]\n\
             \x20   size = int(head[-1].split()[1])\n\
             \x20   w.stdin.write(b''.join(head) + inp.read(size))\n\
             \x20   w.stdin.flush()\n\
             \x20   out.write(w.stdout.readline())\n\
             \x20   out.flush()\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&proxy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    proxy
}

#[test]
fn the_writer_answers_a_broken_request_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::start(dir.path(), &[]);
    w.stdin.write_all(b"mailbox /x\nsize 3\n").unwrap();
    w.stdin.flush().unwrap();
    let mut line = String::new();
    w.stdout.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("temp 4.3.0 protocol error: expected a return-path line"),
        "{line}"
    );
    assert_eq!(w.finish(), Some(2));
}

#[test]
fn the_writer_help_documents_the_protocol_and_the_privilege_model() {
    let out = Command::new(WRITER).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "delivered-to <envelope recipient>",
        "perm <5.x.y>",
        "setuid",
        "--root",
    ] {
        assert!(help.contains(want), "{want}: {help}");
    }
}

/// Quotas through the writer and Dovecot on one Maildir: the writer keeps `maildirsize`
/// (answering each delivery with the usage, refusing what does not fit with `full`), Dovecot's
/// maildir quota reads the same usage from it, a message Dovecot expunges frees its room for
/// the writer (Dovecot's negative line), and `usage … rebuild yes` counts the directory again.
#[test]
fn the_writer_and_dovecot_agree_on_a_maildir_quota() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Dovecot's mail processes and the writer work as the mailbox's owner, nobody.
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = root.join("mail/alice");
    let md = home.join("Maildir");
    maildir(&md);
    for p in [
        home.clone(),
        md.clone(),
        md.join("new"),
        md.join("cur"),
        md.join("tmp"),
    ] {
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    let (bytes, messages) = (10240u64, 3u64);
    let mut w = Writer::start(&root.join("mail"), &[]);
    let body = |n: usize| format!("Subject: {n}\r\n\r\n{}\r\n", "x".repeat(3000)).into_bytes();
    let mut sizes = Vec::new();
    for n in 0..2 {
        let reply = w.send_quota(&md, bytes, messages, &body(n));
        let fields: Vec<&str> = reply.trim_end().split(' ').collect();
        assert_eq!((fields[0], fields.len()), ("ok", 4), "{reply}");
        sizes.push(
            fields[1]
                .rsplit("S=")
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        );
        assert_eq!(fields[3], (n + 1).to_string(), "{reply}");
        assert_eq!(
            fields[2].parse::<u64>().unwrap(),
            sizes.iter().sum::<u64>(),
            "{reply}"
        );
    }
    let used: u64 = sizes.iter().sum();
    assert_eq!(
        std::fs::read_to_string(md.join("maildirsize")).unwrap(),
        format!("10240S,3C\n0 0\n{} 1\n{} 1\n", sizes[0], sizes[1]),
        "rebuilt on the first delivery (an empty Maildir), then a line per delivery"
    );
    assert_eq!(
        std::fs::metadata(md.join("maildirsize")).unwrap().uid(),
        65534,
        "written as the mailbox's owner"
    );
    // 2 × ~3 KiB used: a third message of ~6 KiB does not fit the 10 KiB.
    let big = format!("Subject: big\r\n\r\n{}\r\n", "y".repeat(6000));
    let reply = w.send_quota(&md, bytes, messages, big.as_bytes());
    assert!(
        reply.starts_with(&format!("full {used} 2 mailbox full")),
        "{reply}"
    );
    assert_eq!(files(&md.join("new")).len(), 2, "nothing stored");

    // Dovecot, with the same limits, reads the same usage.
    std::fs::write(
        root.join("passwd"),
        format!("alice:{{PLAIN}}x:65534:65534::{}::\n", home.display()),
    )
    .unwrap();
    let conf = root.join("dovecot.conf");
    let r = root.display();
    std::fs::write(
        &conf,
        format!(
            "protocols =\nbase_dir = {r}/run\nstate_dir = {r}/state\nlog_path = {r}/dovecot.log\n\
             ssl = no\ndefault_internal_user = nobody\ndefault_internal_group = nogroup\n\
             default_login_user = nobody\nmail_location = maildir:~/Maildir\nmail_plugins = quota\n\
             passdb {{\n  driver = passwd-file\n  args = {r}/passwd\n}}\n\
             userdb {{\n  driver = passwd-file\n  args = {r}/passwd\n}}\n\
             plugin {{\n  quota = maildir:User quota\n  quota_rule = *:storage=10k:messages=3\n}}\n"
        ),
    )
    .unwrap();
    // doveadm finds users through Dovecot's auth service: run one (no mail protocol).
    let dovecot = Command::new("dovecot")
        .arg("-F")
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dovecot (Debian's dovecot-core, scripts/apt-packages.txt)");
    let socket = root.join("run/auth-userdb");
    let start = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "dovecot did not open {}: {}",
            socket.display(),
            std::fs::read_to_string(root.join("dovecot.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _dovecot = Stop(dovecot);
    let doveadm = |args: &[&str]| {
        let out = Command::new("doveadm")
            .arg("-c")
            .arg(&conf)
            .args(args)
            .output()
            .expect("doveadm (Debian's dovecot-core, scripts/apt-packages.txt)");
        assert!(
            out.status.success(),
            "doveadm {args:?}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(root.join("dovecot.log")).unwrap_or_default()
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let quota = |field: &str| -> (u64, u64) {
        let table = doveadm(&["-f", "tab", "quota", "get", "-u", "alice"]);
        let row = table
            .lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|f| f.get(1) == Some(&field))
            .unwrap_or_else(|| panic!("no {field} row: {table}"));
        (row[2].parse().unwrap(), row[3].parse().unwrap())
    };
    assert_eq!(
        quota("MESSAGE"),
        (2, 3),
        "Dovecot counts what the writer counted"
    );
    let (kib, limit) = quota("STORAGE");
    assert_eq!(limit, 10, "in KiB, as Dovecot reports it");
    assert_eq!(kib, used.div_ceil(1024), "{used} bytes, in KiB rounded up");

    // Dovecot expunges the first message: its negative line frees the room for the writer.
    doveadm(&["expunge", "-u", "alice", "mailbox", "INBOX", "uid", "1"]);
    let left = sizes[1];
    assert_eq!(
        w.usage(&md, bytes, messages, false),
        format!("usage {left} 1\n"),
        "the writer reads Dovecot's change"
    );
    let reply = w.send_quota(&md, bytes, messages, big.as_bytes());
    assert!(reply.starts_with("ok "), "{reply}");
    assert_eq!(quota("MESSAGE").0, 2);

    // A file removed behind both: only a recount from the directory notices.
    let victim = files(&md.join("new"))
        .into_iter()
        .chain(files(&md.join("cur")))
        .next()
        .unwrap();
    let gone = std::fs::metadata(&victim).unwrap().len();
    std::fs::remove_file(&victim).unwrap();
    let before = w.usage(&md, bytes, messages, false);
    let after = w.usage(&md, bytes, messages, true);
    assert_ne!(before, after);
    let count = |line: &str| -> (u64, u64) {
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        (f[0], f[1])
    };
    assert_eq!(count(&after).1, 1, "{after}");
    assert!(
        count(&before).0 - count(&after).0 >= gone.min(1),
        "{before} → {after}"
    );
    assert_eq!(quota("MESSAGE").0, 1, "Dovecot reads the rebuilt file");
    assert!(
        w.usage(&md, 10, 0, false).starts_with("usage "),
        "other limits: rebuilt, answered all the same"
    );
    assert_eq!(w.finish(), Some(0));
}

// ----- exactly once: a delivery redone after a crash -----

/// The `[stage-lossy]` section: QUOTA on, so `maildirsize` is kept, through `helper`.
fn lossy_section(helper: &Path) -> String {
    format!(
        "\n[stage-lossy]\nPROGRAM = pepsi-stage-relay-to-maildir\nHELPER = {}\n\
         ALLOW_ROOT_OWNER = yes\nBOUNCE_STAGE = bounce\nQUOTA = 1M\n",
        helper.display()
    )
}

/// Issue 34's chaos finding: the writer stored the copies and died before the worker
/// committed them; redone with a writer that lives, each copy is in the Maildir once, and
/// `maildirsize` counts it once.
#[tokio::test]
async fn a_delivery_redone_after_the_writer_died_before_the_commit_stores_one_copy() {
    let db = TestDb::new().await;
    let s = setup(&db, &["alice", "bob"]);
    let base = std::fs::read_to_string(&s.config).unwrap();
    let proxy = sync_loser(&s);
    std::fs::write(&s.config, format!("{base}{}", lossy_section(&proxy))).unwrap();
    let a = message(&db, "lossy", &["alice@example.test", "bob@example.test"]).await;
    let b = message(&db, "lossy", &["alice@example.test"]).await;
    let lines = worker(&s, &[a, b]).await;
    assert!(
        lines.len() == 2 && lines.iter().all(|l| l.starts_with("1 ")),
        "nothing recorded: {lines:?}"
    );
    let new = |u: &str| files(&s.root.join(u).join("Maildir/new"));
    assert_eq!((new("alice").len(), new("bob").len()), (2, 1));
    let sizes = |u: &str| std::fs::read_to_string(s.root.join(u).join("Maildir/maildirsize"));
    let before = (sizes("alice").unwrap(), sizes("bob").unwrap());
    assert_eq!(before.0.lines().count(), 4, "{before:?}");

    std::fs::write(
        &s.config,
        format!("{base}{}", lossy_section(Path::new(WRITER))),
    )
    .unwrap();
    let lines = worker(&s, &[a, b]).await;
    assert_eq!(
        lines,
        vec![r#"0 {"finished":true}"#, r#"0 {"finished":true}"#]
    );
    assert!(rows(&db).await.is_empty(), "both rows finished");
    assert_eq!(
        (new("alice").len(), new("bob").len()),
        (2, 1),
        "each copy once: {:?} {:?}",
        new("alice"),
        new("bob")
    );
    assert_delivered(&s, "bob", "bob@example.test");
    assert_eq!(
        (sizes("alice").unwrap(), sizes("bob").unwrap()),
        before,
        "maildirsize counts no copy twice"
    );
}

/// The writer's host part of a file name, as it computes it.
fn writer_host() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    pepsi_helper_maildir_writer::maildir::maildir_host(host.trim())
}

/// The file name the writer gives row `id`'s copy for `rcpt`, of `size` bytes, on `host`.
async fn keyed_name(db: &TestDb, id: i64, rcpt: &str, host: &str, size: usize) -> String {
    let incarnation: i64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM received_at) * 1000000)::bigint FROM pepsi.workqueue \
         WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let key = pepsi_helper_maildir_writer::protocol::DeliveryKey {
        row: id,
        incarnation,
    };
    format!(
        "{}{host},S={size}",
        pepsi_helper_maildir_writer::maildir::keyed_prefix(key, rcpt)
    )
}

/// The states a crash leaves a keyed delivery in, redone through the stage and the writer:
/// a complete copy in tmp/ is finished (the same file renamed into new/), a partial one
/// (and one of another host) replaced by a whole copy, and a copy a reader already moved to
/// cur/ makes the delivery count as done without a second copy.
#[tokio::test]
async fn a_redone_delivery_finishes_its_copy_in_tmp_and_writes_none_when_one_is_stored() {
    use std::os::unix::fs::MetadataExt;
    let db = TestDb::new().await;
    let s = setup(&db, &["alice", "bob", "carol"]);
    let host = writer_host();
    let a = message(&db, "local", &["alice@example.test"]).await;
    let b = message(&db, "local", &["bob@example.test"]).await;
    let c = message(&db, "local", &["carol@example.test"]).await;
    let md = |u: &str| s.root.join(u).join("Maildir");
    let copy = |r: &str| expected_copy(r);

    let whole = keyed_name(
        &db,
        a,
        "alice@example.test",
        &host,
        copy("alice@example.test").len(),
    )
    .await;
    std::fs::write(
        md("alice").join("tmp").join(&whole),
        copy("alice@example.test"),
    )
    .unwrap();
    let inode = std::fs::metadata(md("alice").join("tmp").join(&whole))
        .unwrap()
        .ino();

    let bob = copy("bob@example.test");
    let partial = keyed_name(&db, b, "bob@example.test", &host, bob.len()).await;
    std::fs::write(md("bob").join("tmp").join(&partial), &bob[..bob.len() / 2]).unwrap();
    let elsewhere = keyed_name(&db, b, "bob@example.test", "other-host", bob.len()).await;
    std::fs::write(md("bob").join("tmp").join(&elsewhere), &bob[..10]).unwrap();
    let unrelated = md("bob").join("tmp/1.M1P1Q1.other-host,S=3");
    std::fs::write(&unrelated, b"abc").unwrap();

    let read = keyed_name(
        &db,
        c,
        "carol@example.test",
        &host,
        copy("carol@example.test").len(),
    )
    .await;
    let moved = md("carol").join("cur").join(format!("{read}:2,S"));
    std::fs::write(&moved, copy("carol@example.test")).unwrap();

    let lines = worker(&s, &[a, b, c]).await;
    assert_eq!(lines, vec![r#"0 {"finished":true}"#; 3]);
    assert!(rows(&db).await.is_empty());

    assert_delivered(&s, "alice", "alice@example.test");
    let done = md("alice").join("new").join(&whole);
    assert_eq!(
        std::fs::metadata(&done).unwrap().ino(),
        inode,
        "the copy in tmp/ was renamed, not written again"
    );
    assert_eq!(
        files(&md("bob").join("new")),
        vec![md("bob").join("new").join(&partial)]
    );
    assert_eq!(
        std::fs::read(md("bob").join("new").join(&partial)).unwrap(),
        bob
    );
    assert_eq!(
        files(&md("bob").join("tmp")),
        vec![unrelated],
        "this delivery's partial copies are gone, another's file stays"
    );
    assert!(files(&md("carol").join("new")).is_empty(), "no second copy");
    assert_eq!(files(&md("carol").join("cur")), vec![moved]);
}

/// Two workers on one row (a claim PostgreSQL lost in a crash, handed out again): the second
/// writer finds the first one's partial copy in tmp/ still being written (locked) and leaves
/// it alone with a temporary failure, instead of removing it and racing it to new/, which
/// could publish a half-written file; once the first writer is gone, the retry rewrites it.
#[tokio::test]
async fn a_keyed_copy_still_being_written_by_another_writer_is_left_to_it() {
    use std::os::fd::AsRawFd as _;
    let db = TestDb::new().await;
    let s = setup(&db, &["alice"]);
    let host = writer_host();
    let a = message(&db, "local", &["alice@example.test"]).await;
    let tmp = s.root.join("alice/Maildir/tmp");
    let new = s.root.join("alice/Maildir/new");
    let copy = expected_copy("alice@example.test");
    let name = keyed_name(&db, a, "alice@example.test", &host, copy.len()).await;
    std::fs::write(tmp.join(&name), &copy[..copy.len() / 2]).unwrap();
    // The other writer, alive: its file open and locked.
    let other = std::fs::File::open(tmp.join(&name)).unwrap();
    // SAFETY: the fd is open; flock has no memory effects.
    assert_eq!(
        unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );

    let lines = worker(&s, &[a]).await;
    assert_ne!(lines, vec![r#"0 {"finished":true}"#], "{lines:?}");
    assert_eq!(rows(&db).await.len(), 1, "the row waits: {lines:?}");
    assert!(
        files(&new).is_empty(),
        "nothing published beside the writer at work"
    );
    assert_eq!(
        std::fs::read(tmp.join(&name)).unwrap(),
        &copy[..copy.len() / 2],
        "the other writer's file is untouched"
    );

    // The other writer died: its lock went with it.
    drop(other);
    support::claim(&db.pool, a, "local").await;
    let lines = worker(&s, &[a]).await;
    assert_eq!(lines, vec![r#"0 {"finished":true}"#]);
    assert_eq!(files(&new), vec![new.join(&name)]);
    assert_eq!(std::fs::read(new.join(&name)).unwrap(), copy);
    assert!(files(&tmp).is_empty());
}

/// Security review 2026-12-04 #6: a mailbox owner (nobody) who keeps swapping their Maildir
/// for a link to another user's Maildir while deliveries run gets nothing written there
/// (before the fix, the owner was looked up through the swapped path and the write went
/// through it: the message landed in the victim's new/, written as the victim).
#[test]
fn a_maildir_swapped_for_a_symlink_after_the_check_cannot_redirect_the_write() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    assert_eq!(
        my_uid(),
        0,
        "the writer switches to mailbox owners only as root"
    );
    let (mallory, victim) = (65534, 65533);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let root = dir.path().join("mail");
    let alice = root.join("alice/Maildir");
    maildir(&alice);
    let home = root.join("mallory");
    let real = home.join("Maildir");
    maildir(&real);
    for (path, owner) in [
        (root.join("alice"), victim),
        (alice.clone(), victim),
        (home.clone(), mallory),
        (real.clone(), mallory),
    ] {
        std::os::unix::fs::chown(&path, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o700)).unwrap();
        for sub in ["tmp", "new", "cur"] {
            let p = path.join(sub);
            if p.is_dir() {
                std::os::unix::fs::chown(&p, Some(owner), Some(owner)).unwrap();
            }
        }
    }
    std::fs::set_permissions(&root, PermissionsExt::from_mode(0o755)).unwrap();
    let swap = home.join("swap");
    std::os::unix::fs::symlink(&alice, &swap).unwrap();
    std::os::unix::fs::lchown(&swap, Some(mallory), Some(mallory)).unwrap();

    // Mallory's side: exchange Maildir and the link, atomically, as fast as possible.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let a = std::ffi::CString::new(real.as_os_str().as_bytes()).unwrap();
        let b = std::ffi::CString::new(swap.as_os_str().as_bytes()).unwrap();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: two valid C strings; renameat2 has no memory effects.
                let rc = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                swaps += 1;
            }
            swaps
        })
    };
    let mut w = Writer::start(&root, &[]);
    let (mut stored, mut refused) = (0, 0);
    let start = std::time::Instant::now();
    // Each try loses the race only now and then: try for a few seconds.
    while start.elapsed() < std::time::Duration::from_secs(4) && stored + refused < 5000 {
        let reply = w.send_with(&real, "later", b"Subject: mallory\r\n\r\nx\r\n");
        if reply.starts_with("ok ") {
            stored += 1;
        } else {
            assert!(reply.starts_with("temp "), "{reply}");
            refused += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert_eq!(w.sync().split(' ').next(), Some("ok"));
    assert_eq!(w.finish(), Some(0));
    assert!(
        files(&alice.join("new")).is_empty() && files(&alice.join("tmp")).is_empty(),
        "nothing of mallory's reached alice's Maildir: {} copies there ({stored} stored, \
         {refused} refused, {swaps} swaps)",
        files(&alice.join("new")).len()
    );
    assert!(
        stored > 0 && refused > 0,
        "{stored} stored, {refused} refused: the race ran"
    );
    // Whichever name holds mallory's directory now, every copy in it is mallory's own.
    let theirs = [real, swap]
        .into_iter()
        .find(|p| std::fs::symlink_metadata(p).unwrap().is_dir())
        .unwrap();
    let copies = files(&theirs.join("new"));
    assert_eq!(copies.len(), stored);
    for f in copies {
        assert_eq!(std::fs::metadata(&f).unwrap().uid(), mallory, "{f:?}");
    }
}
