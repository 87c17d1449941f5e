//! pepsi-sendmail as a process against a real PostgreSQL, connecting as the sendmail role
//! through its one function: a plain message, `-t` with Bcc removed, `-f`/`-F`, `-i`, a bad
//! option, an over-size message, an `-bs` dialogue, and the drop directory: with the
//! database unreachable the message goes to a file and the exit status is 0, then the
//! pickup (`-q`) inserts it and removes the file, and a file inserted before is not
//! inserted twice.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pepsi_contract::state::{Dsn, Origin};
use pepsi_testkit::TestDb;
use serde_json::Value;

const SENDMAIL: &str = env!("CARGO_BIN_EXE_pepsi-sendmail");

struct Harness {
    db: TestDb,
    dir: tempfile::TempDir,
    spool: PathBuf,
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// A stored row: (mail_from, rcpt_to, headers, body, state).
type Row = (String, Vec<String>, String, String, Value);

/// A row as selected: the columns of `Row` as stored, then stage and status.
type Stored = (String, Vec<String>, Vec<u8>, Vec<u8>, Value, String, String);

impl Harness {
    async fn new() -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        std::fs::create_dir(&spool).unwrap();
        let h = Harness { db, dir, spool };
        h.write_config("pepsi.conf", "");
        // Unreachable: a port nothing listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        h.write_config(
            "down.conf",
            &format!("DATABASE_URL = postgres://pepsi-sendmail@127.0.0.1:{port}/x\n"),
        );
        h
    }

    fn write_config(&self, name: &str, extra: &str) {
        std::fs::write(
            self.dir.path().join(name),
            format!(
                "[database]\nURL = {url}\n\n[pepsi]\nHOSTNAME = mail.example.test\n\n\
                 [pepsi-sendmail]\nDOMAIN = example.test\nSPOOL_DIR = {spool}\n\
                 MAX_MESSAGE_SIZE = 4k\nCONNECT_TIMEOUT = 3s\n{extra}",
                url = self.db.url,
                spool = self.spool.display(),
            ),
        )
        .unwrap();
    }

    fn run_with(&self, config: &str, args: &[&str], input: &[u8]) -> Run {
        self.run_in_env(config, &[], args, input)
    }

    /// `run_with`, with `env` added to the program's environment.
    fn run_in_env(&self, config: &str, env: &[(&str, &str)], args: &[&str], input: &[u8]) -> Run {
        let mut child = Command::new(SENDMAIL)
            .arg("-C")
            .arg(self.dir.path().join(config))
            .args(args)
            .env_remove("PEPSI_CONFIG")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The program may refuse before reading everything (EPIPE is then expected).
        let _ = child.stdin.take().unwrap().write_all(input);
        let out = child.wait_with_output().unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn run(&self, args: &[&str], input: &[u8]) -> Run {
        self.run_with("pepsi.conf", args, input)
    }

    /// Runs a command that must exit 0.
    fn ok(&self, args: &[&str], input: &[u8]) -> Run {
        let r = self.run(args, input);
        assert_eq!(r.code, 0, "pepsi-sendmail {args:?}: {r:?}");
        r
    }

    async fn rows(&self) -> Vec<Row> {
        let rows: Vec<Stored> = sqlx::query_as(
            "SELECT w.mail_from, w.rcpt_to, w.headers, b.body, w.state, w.stage, w.status::text \
                 FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
                 ORDER BY w.workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(from, rcpt, h, b, state, stage, status)| {
                assert_eq!((stage.as_str(), status.as_str()), ("init", "pending"));
                (
                    from,
                    rcpt,
                    String::from_utf8(h).unwrap(),
                    String::from_utf8(b).unwrap(),
                    state,
                )
            })
            // The stored state must parse as the Rust types read it.
            .inspect(|r| {
                let state = r.4.as_object().unwrap();
                Origin::from_state(state).unwrap().unwrap();
                Dsn::from_state(state).unwrap().unwrap();
            })
            .collect()
    }

    async fn only_row(&self) -> Row {
        let mut rows = self.rows().await;
        assert_eq!(rows.len(), 1, "{rows:#?}");
        rows.remove(0)
    }

    async fn clear(&self) {
        sqlx::query("DELETE FROM pepsi.workqueue")
            .execute(&self.db.pool)
            .await
            .unwrap();
    }

    fn spool_files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.spool)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// The login name the program finds for this uid (the test runs as some user the system
/// knows, or as a bare uid in a container).
fn login() -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let uid = uid().to_string();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid).then(|| f[0].to_owned())
        })
        .unwrap_or_else(|| format!("uid{uid}"))
}

fn field<'a>(headers: &'a str, name: &str) -> Vec<&'a str> {
    headers
        .split("\r\n")
        .filter(|l| {
            l.len() > name.len()
                && l[..name.len()].eq_ignore_ascii_case(name)
                && l.as_bytes()[name.len()] == b':'
        })
        .collect()
}

#[tokio::test]
async fn a_plain_message_is_queued_as_a_local_submission() {
    let h = Harness::new().await;
    let r = h.ok(
        &["-v", "bob@example.org", "root"],
        b"Subject: disk\n\n/var is full\n",
    );
    assert!(r.stderr.contains("queued as "), "{r:?}");
    let (from, rcpt, headers, body, state) = h.only_row().await;
    let me = format!("{}@example.test", login());
    assert_eq!(from, me);
    assert_eq!(rcpt, ["bob@example.org", "root@example.test"]);
    assert_eq!(body, "/var is full\r\n");
    assert!(
        headers.starts_with(&format!(
            "Received: by mail.example.test (pepsi-sendmail, from userid {} ",
            uid()
        )),
        "{headers}"
    );
    assert_eq!(field(&headers, "Subject"), ["Subject: disk"]);
    assert_eq!(field(&headers, "From").len(), 1, "{headers}");
    assert!(field(&headers, "From")[0].contains(&me), "{headers}");
    assert_eq!(field(&headers, "Date").len(), 1, "{headers}");
    assert_eq!(field(&headers, "Message-ID").len(), 1, "{headers}");
    assert!(field(&headers, "Message-ID")[0].ends_with("@example.test>"));
    let local = &state["origin"]["local"];
    assert_eq!(local["program"], "pepsi-sendmail");
    assert_eq!(local["uid"], uid());
    assert_eq!(local["user"], login().as_str());
    assert_eq!(local["via"], "direct");
    assert_eq!(state["origin"]["client_addr"], Value::Null);
    assert_eq!(state["dsn"]["rcpt"].as_array().unwrap().len(), 2);
    assert!(h.spool_files().is_empty());
}

/// Security review 2026-12-04 #12: a local user cannot hand a mailbox a forged
/// `X-Pepsi-Decrypted` through sendmail, which does not pass the ingress's STRIP_FIELDS.
#[tokio::test]
async fn security_review_12_a_forged_decryption_result_field_is_removed_from_local_submissions() {
    let h = Harness::new().await;
    h.ok(
        &["bob@example.org"],
        b"X-Pepsi-Decrypted: openpgp; key=0xDEADBEEF;\n signature=good\n\
          Subject: pay this\n\
          x-pepsi-decrypted: smime; signature=good\n\
          X-Pepsi-Decrypted-Note: another field, kept\n\
          \n\
          X-Pepsi-Decrypted: in the body, kept\n",
    );
    let (_, _, headers, body, _) = h.only_row().await;
    assert!(
        !headers.to_ascii_lowercase().contains("x-pepsi-decrypted:")
            && !headers.to_ascii_lowercase().contains("x-pepsi-decrypted :")
            && !headers.contains("signature=good"),
        "a forged decryption result was queued: {headers}"
    );
    assert_eq!(
        field(&headers, "Subject"),
        ["Subject: pay this"],
        "{headers}"
    );
    assert_eq!(
        field(&headers, "X-Pepsi-Decrypted-Note"),
        ["X-Pepsi-Decrypted-Note: another field, kept"],
        "{headers}\n\n{body}"
    );
    assert_eq!(body, "X-Pepsi-Decrypted: in the body, kept\r\n");

    // The function itself strips it, so calling it without the program changes nothing.
    let stripped: Vec<u8> = sqlx::query_scalar("SELECT pepsi.strip_decrypt_result($1)")
        .bind(
            b"X-Pepsi-Decrypted: a\r\nX-PEPSI-DECRYPTED : b\r\n\tc\r\nSubject: \\ \xff\r\n"
                .to_vec(),
        )
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
    assert_eq!(stripped, b"Subject: \\ \xff\r\n".to_vec());
}

#[tokio::test]
async fn minus_t_reads_the_recipients_and_removes_bcc() {
    let h = Harness::new().await;
    let message = b"From: Ops <ops@example.org>\nTo: A <a@example.org>, b@example.org\n\
                    Cc: c@example.org\nBcc: hidden@example.org,\n secret@example.org\n\
                    Subject: t\n\nbody\n";
    h.ok(&["-t", "-oi", "extra@example.org"], message);
    let (from, rcpt, headers, _, state) = h.only_row().await;
    assert_eq!(from, format!("{}@example.test", login()));
    assert_eq!(
        rcpt,
        [
            "extra@example.org",
            "a@example.org",
            "b@example.org",
            "c@example.org",
            "hidden@example.org",
            "secret@example.org"
        ]
    );
    assert!(!headers.to_ascii_lowercase().contains("bcc"), "{headers}");
    assert!(!headers.contains("secret@"), "{headers}");
    assert_eq!(field(&headers, "From"), ["From: Ops <ops@example.org>"]);
    assert_eq!(state["dsn"]["rcpt"].as_array().unwrap().len(), 6);

    // -t with no recipient anywhere is a usage error.
    let r = h.run(&["-t"], b"Subject: nobody\n\nx\n");
    assert_eq!(r.code, 64, "{r:?}");
    assert!(r.stderr.contains("no recipients"), "{r:?}");
}

#[tokio::test]
async fn minus_f_minus_f_and_the_dsn_options() {
    let h = Harness::new().await;
    h.ok(
        &[
            "-f",
            "cron@example.org",
            "-F",
            "Cron Daemon",
            "-N",
            "failure,delay",
            "-R",
            "hdrs",
            "-V",
            "job-42",
            "-oem",
            "-odb",
            "ops@example.org",
        ],
        b"Subject: report\n\nok\n",
    );
    let (from, _, headers, _, state) = h.only_row().await;
    assert_eq!(from, "cron@example.org");
    assert_eq!(
        field(&headers, "From"),
        ["From: \"Cron Daemon\" <cron@example.org>"]
    );
    assert_eq!(state["dsn"]["ret"], "HDRS");
    assert_eq!(state["dsn"]["envid"], "job-42");
    assert_eq!(
        state["dsn"]["rcpt"][0]["notify"],
        serde_json::json!(["FAILURE", "DELAY"])
    );
    h.clear().await;
    // The null sender.
    h.ok(&["-f", "<>", "ops@example.org"], b"Subject: n\n\nx\n");
    assert_eq!(h.only_row().await.0, "");
}

#[tokio::test]
async fn a_lone_dot_ends_the_message_unless_minus_i() {
    let h = Harness::new().await;
    let message = b"Subject: dots\n\nbefore\n.\nafter\n";
    h.ok(&["a@example.org"], message);
    assert_eq!(h.only_row().await.3, "before\r\n");
    h.clear().await;
    h.ok(&["-i", "a@example.org"], message);
    assert_eq!(h.only_row().await.3, "before\r\n.\r\nafter\r\n");
    h.clear().await;
    h.ok(&["-oi", "a@example.org"], message);
    assert_eq!(h.only_row().await.3, "before\r\n.\r\nafter\r\n");
}

#[tokio::test]
async fn refusals_and_their_exit_statuses() {
    let h = Harness::new().await;
    let r = h.run(&["-Z", "a@example.org"], b"x\n");
    assert_eq!(r.code, 64, "{r:?}");
    assert!(r.stderr.contains("unknown option -Z"), "{r:?}");
    let r = h.run(&["-bp"], b"");
    assert_eq!(r.code, 64, "{r:?}");
    assert!(r.stderr.contains("pepsi-queue list"), "{r:?}");
    // Over MAX_MESSAGE_SIZE (4k).
    let big = format!("Subject: big\n\n{}", "0123456789abcdef\n".repeat(400));
    let r = h.run(&["a@example.org"], big.as_bytes());
    assert_eq!(r.code, 65, "{r:?}");
    assert!(r.stderr.contains("MAX_MESSAGE_SIZE"), "{r:?}");
    // A line over MAX_LINE_LENGTH.
    let long = format!("Subject: long\n\n{}\n", "x".repeat(1200));
    let r = h.run(&["a@example.org"], long.as_bytes());
    assert_eq!(r.code, 65, "{r:?}");
    assert!(r.stderr.contains("line 3 exceeds"), "{r:?}");
    // Not an address.
    let r = h.run(&["bad address@example.org"], b"x\n");
    assert_eq!(r.code, 67, "{r:?}");
    assert!(r.stderr.contains("bad address@example.org"), "{r:?}");
    assert!(h.rows().await.is_empty());
    assert!(h.spool_files().is_empty());
    let r = h.ok(&["--help"], b"");
    assert!(r.stdout.contains("EXIT STATUS"), "{r:?}");
}

#[tokio::test]
async fn an_smtp_session_on_standard_input() {
    let h = Harness::new().await;
    let session = "EHLO localhost\r\nMAIL FROM:<app@example.org> RET=FULL\r\n\
                   RCPT TO:<a@example.org> NOTIFY=SUCCESS,FAILURE\r\nRCPT TO:<b@example.org>\r\n\
                   DATA\r\nSubject: via -bs\r\n\r\n..leading dot\r\nend\r\n.\r\nQUIT\r\n";
    let r = h.ok(&["-bs"], session.as_bytes());
    let codes: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.as_bytes().get(3) != Some(&b'-'))
        .map(|l| &l[..3])
        .collect();
    assert_eq!(
        codes,
        ["220", "250", "250", "250", "250", "354", "250", "221"],
        "{r:?}"
    );
    assert!(r.stdout.contains("250-DSN"), "{r:?}");
    assert!(r.stdout.contains("queued as "), "{r:?}");
    let (from, rcpt, headers, body, state) = h.only_row().await;
    assert_eq!(from, "app@example.org");
    assert_eq!(rcpt, ["a@example.org", "b@example.org"]);
    assert_eq!(body, ".leading dot\r\nend\r\n");
    assert_eq!(field(&headers, "Subject"), ["Subject: via -bs"]);
    assert_eq!(state["dsn"]["ret"], "FULL");
    assert_eq!(
        state["dsn"]["rcpt"][0]["notify"],
        serde_json::json!(["SUCCESS", "FAILURE"])
    );
    assert_eq!(state["origin"]["local"]["uid"], uid());
}

#[tokio::test]
async fn with_the_database_down_the_message_waits_in_the_drop_directory_for_the_pickup() {
    let h = Harness::new().await;
    let r = h.run_with(
        "down.conf",
        &[
            "-v",
            "-f",
            "job@example.org",
            "-N",
            "never",
            "ops@example.org",
        ],
        b"Subject: while down\n\nkept\n",
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("drop directory"), "{r:?}");
    assert!(h.rows().await.is_empty());
    let files = h.spool_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with(".msg"), "{files:?}");
    let path = h.spool.join(&files[0]);
    let copy = h.dir.path().join("copy");
    std::fs::copy(&path, &copy).unwrap();

    // The pickup with the database down leaves the file and says so.
    let r = h.run_with("down.conf", &["-q"], b"");
    assert_eq!(r.code, 75, "{r:?}");
    assert_eq!(h.spool_files(), files);

    // The database is back: the pickup inserts it and removes the file.
    h.ok(&["-q"], b"");
    assert!(h.spool_files().is_empty(), "{:?}", h.spool_files());
    let (from, rcpt, headers, body, state) = h.only_row().await;
    assert_eq!(from, "job@example.org");
    assert_eq!(rcpt, ["ops@example.org"]);
    assert_eq!(body, "kept\r\n");
    assert_eq!(field(&headers, "Subject"), ["Subject: while down"]);
    assert_eq!(state["origin"]["local"]["via"], "spool");
    assert_eq!(state["origin"]["local"]["uid"], uid());
    assert_eq!(
        state["dsn"]["rcpt"][0]["notify"],
        serde_json::json!(["NEVER"])
    );

    // A file inserted before (a pickup that died between the commit and the removal) is
    // removed without a second row.
    std::fs::copy(&copy, &path).unwrap();
    h.ok(&["-q"], b"");
    assert!(h.spool_files().is_empty());
    assert_eq!(h.rows().await.len(), 1);

    // A file that is not ours is set aside for an operator, not inserted, not lost.
    std::fs::write(h.spool.join("1.junk.msg"), b"not a spool file\n").unwrap();
    let r = h.run(&["-q"], b"");
    assert_eq!(r.code, 65, "{r:?}");
    assert_eq!(h.spool_files(), ["1.junk.msg.bad"]);
    assert_eq!(h.rows().await.len(), 1);
}

#[test]
fn the_drop_directory_must_exist_for_the_pickup() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = postgres://x@127.0.0.1:1/x\n[pepsi-sendmail]\nDOMAIN = example.test\nSPOOL_DIR = {}\n",
            Path::new("/nonexistent/pepsi-spool").display()
        ),
    )
    .unwrap();
    let out = Command::new(SENDMAIL)
        .arg("-C")
        .arg(&config)
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/pepsi-spool"));
}

/// A port whose socket file is in none of the directories the client library searches
/// (`/var/run/postgresql`, `/tmp`), for a fake server of this test's own in `/tmp`.
fn unused_socket_port() -> u16 {
    let base = 40000 + (std::process::id() % 10000) as u16;
    (base..base + 5000)
        .find(|p| {
            !Path::new(&format!("/var/run/postgresql/.s.PGSQL.{p}")).exists()
                && !Path::new(&format!("/tmp/.s.PGSQL.{p}")).exists()
        })
        .expect("a free socket port")
}

/// Security review 2026-12-04 #3: a database URL that names no host is pinned to
/// `[database] SOCKET_DIR`: while the server's socket is gone (PostgreSQL stopped), every
/// user's sendmail goes to the drop directory instead of to a listener some local user put
/// in /tmp, which hears nothing ([pepsi-sendmail] DATABASE_URL and [database] URL alike).
#[tokio::test]
async fn security_review_3_sendmail_never_connects_to_a_socket_a_user_put_in_tmp() {
    let h = Harness::new().await;
    // The pinned directory holds no socket: the server is "down".
    let run_dir = h.dir.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let port = unused_socket_port();
    let fake_path = PathBuf::from(format!("/tmp/.s.PGSQL.{port}"));
    let fake = std::os::unix::net::UnixListener::bind(&fake_path).unwrap();
    fake.set_nonblocking(true).unwrap();
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(fake_path.clone());
    let common = format!(
        "[pepsi]\nHOSTNAME = mail.example.test\n[pepsi-sendmail]\nDOMAIN = example.test\n\
         SPOOL_DIR = {}\nCONNECT_TIMEOUT = 3s\n",
        h.spool.display()
    );
    let configs = [
        (
            "own-url.conf",
            format!(
                "[database]\nURL = {}\nSOCKET_DIR = {}\n{common}DATABASE_URL = postgres:///x\n",
                h.db.url,
                run_dir.display()
            ),
        ),
        (
            "database-url.conf",
            format!(
                "[database]\nURL = postgres:///x\nSOCKET_DIR = {}\n{common}",
                run_dir.display()
            ),
        ),
    ];
    for (i, (name, text)) in configs.iter().enumerate() {
        std::fs::write(h.dir.path().join(name), text).unwrap();
        // PGPORT makes the library's own search (the old behaviour) find the fake socket
        // for this port in /tmp, as it finds /tmp/.s.PGSQL.5432 while the server is down.
        let pgport = port.to_string();
        let r = h.run_in_env(
            name,
            &[("PGPORT", &pgport)],
            &["-v", "ops@example.org"],
            b"Subject: secret\n\nfor ops only\n",
        );
        let stderr = &r.stderr;
        assert_eq!(r.code, 0, "{name}: {stderr}");
        assert!(stderr.contains("drop directory"), "{name}: {stderr}");
        assert_eq!(h.spool_files().len(), i + 1, "{name}: {stderr}");
        match fake.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{name}: sendmail connected to the socket in /tmp: {other:?}"),
        }
    }
    assert!(h.rows().await.is_empty());
}

/// Security review 2026-12-04 #4: the sendmail role, which every local user reaches, may
/// not take advisory locks (the dispatcher's singleton lock and epoch membership keys) and
/// has a connection limit and server-side statement and idle timeouts; the real
/// `pepsi-setup db` sets all of it, and `--check` reports a grant that drifted.
#[tokio::test]
async fn security_review_4_the_sendmail_role_cannot_hold_the_dispatcher_lock() {
    use sqlx::Connection as _;
    const SETUP: &str = env!("CARGO_BIN_EXE_pepsi-setup");
    let db = TestDb::new().await;
    let setup = |args: &[&str]| {
        let out = Command::new(SETUP)
            .arg("db")
            .args(["--database-url", &db.url])
            .args(args)
            .env_remove("PEPSI_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // The server's default, as before pepsi-setup took it away: a drifted grant is found.
    sqlx::raw_sql("GRANT EXECUTE ON FUNCTION pg_advisory_lock(integer, integer) TO PUBLIC")
        .execute(&db.pool)
        .await
        .unwrap();
    let (code, out) = setup(&["--check"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("PUBLIC must not have EXECUTE on pg_advisory_lock(integer,integer)"),
        "{out}"
    );
    let (code, out) = setup(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("REVOKE EXECUTE ON FUNCTION pg_advisory_lock(integer,integer) FROM PUBLIC"),
        "{out}"
    );
    let (code, out) = setup(&["--check"]);
    assert_eq!(code, 0, "{out}");

    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let mut sendmail =
        sqlx::PgConnection::connect_with(&options.clone().username("pepsi-sendmail"))
            .await
            .unwrap();
    for sql in [
        "SELECT pg_advisory_lock(1885697139, 1)",
        "SELECT pg_try_advisory_lock(1885697139, 1)",
        "SELECT pg_advisory_lock(1885696116, 2)",
        "SELECT pg_advisory_lock_shared(1885697139, 1)",
        "SELECT pg_advisory_xact_lock(1885697139::bigint << 32 | 1)",
    ] {
        match sqlx::raw_sql(sql).execute(&mut sendmail).await {
            Err(sqlx::Error::Database(d)) => {
                assert_eq!(d.code().as_deref(), Some("42501"), "{sql}: {d}")
            }
            other => panic!("the sendmail role ran {sql}: {other:?}"),
        }
    }
    for (setting, want) in [
        ("statement_timeout", "1min"),
        ("idle_session_timeout", "1min"),
        ("idle_in_transaction_session_timeout", "10s"),
    ] {
        let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(&mut sendmail)
            .await
            .unwrap();
        assert_eq!(value, want, "{setting} of the sendmail role");
    }
    let limit: i32 =
        sqlx::query_scalar("SELECT rolconnlimit FROM pg_roles WHERE rolname = 'pepsi-sendmail'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(limit, 20);
    // Its one function still works.
    sqlx::raw_sql(
        "SELECT pepsi.sendmail_submit('alice@example.test', ARRAY['bob@example.org'], \
         'Subject: x\r\n'::bytea, 'y'::bytea, '{}', 1000, 'alice', 'direct')",
    )
    .execute(&mut sendmail)
    .await
    .unwrap();
    // The pipeline role (the dispatcher) still takes its lock.
    let mut pipeline = sqlx::PgConnection::connect_with(&options.username("pepsi"))
        .await
        .unwrap();
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(1885697139, 77)")
        .fetch_one(&mut pipeline)
        .await
        .unwrap();
    assert!(got);
}
