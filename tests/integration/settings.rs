//! pepsi-settings as a process against a real PostgreSQL and a real pepsi-ingress: accounts
//! it creates log in (and stop logging in when disabled or given a new password), aliases,
//! catch-alls, local domains and send_as rows it writes are what the ingress reads, every
//! change leaves its event_log row without the password, bad input is refused naming what
//! was wrong and writes nothing, and the listings come as tables and as JSON.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::Run;
use crate::support::ingress::{Client, Ingress};

const SETTINGS: &str = env!("CARGO_BIN_EXE_pepsi-settings");

const SUB: &str = "ROLE = submission\nALLOW_PLAINTEXT_AUTH = yes\n";
const MX: &str = "ROLE = mx\nVERIFY = no\n";

/// Runs pepsi-settings with `args` on `config`, `stdin` as its standard input.
fn settings(config: &Path, args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(SETTINGS)
        .arg("-c")
        .arg(config)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pepsi-settings");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run::of(out)
}

fn ok(config: &Path, args: &[&str], stdin: &str) -> Run {
    let run = settings(config, args, stdin);
    assert_eq!(run.code, 0, "{args:?}: {run:?}");
    run
}

async fn start() -> Ingress {
    Ingress::start(
        "CHECK_RECIPIENTS = yes\nRECIPIENT_CACHE_TTL = 0s\nDOMAIN_CACHE_TTL = 0s\n\n[pepsi]\nLOCAL_DOMAINS = example.test\nRECIPIENT_DELIMITER = +\n",
        &[("mx", MX), ("sub", SUB)],
    )
    .await
}

/// The AUTH PLAIN reply code for `user`/`password` at `port`.
async fn login(port: u16, user: &str, password: &str) -> u16 {
    let plain = pepsi_smtp::encoding::base64_encode(format!("\0{user}\0{password}").as_bytes());
    let mut c = Client::connect(port).await;
    c.ok("EHLO laptop.example", 250).await;
    c.cmd(&format!("AUTH PLAIN {plain}")).await.0
}

async fn events(ingress: &Ingress) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT action, detail FROM pepsi.event_log ORDER BY event_id")
        .fetch_all(&ingress.db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn accounts_made_here_log_in_at_the_real_ingress() {
    let ingress = start().await;
    let cfg = ingress.config.clone();
    let sub = ingress.port("sub");

    let run = ok(
        &cfg,
        &["account", "add", "Alice@Example.test", "--password-stdin"],
        "first secret\n",
    );
    assert_eq!(
        run.stdout,
        "created mailbox alice@example.test with a password\n"
    );
    assert_eq!(login(sub, "alice@example.test", "first secret").await, 235);
    assert_eq!(login(sub, "alice@example.test", "wrong").await, 535);

    let pw = ingress.dir.path().join("pw");
    std::fs::write(&pw, "second secret\nignored line\n").unwrap();
    ok(
        &cfg,
        &[
            "account",
            "password",
            "alice@example.test",
            "--password-file",
            pw.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(login(sub, "alice@example.test", "second secret").await, 235);
    assert_eq!(login(sub, "alice@example.test", "first secret").await, 535);

    let run = ok(&cfg, &["account", "disable", "alice@example.test"], "");
    assert_eq!(run.stdout, "mailbox alice@example.test disabled\n");
    assert_eq!(login(sub, "alice@example.test", "second secret").await, 535);
    let run = ok(&cfg, &["account", "disable", "alice@example.test"], "");
    assert!(run.stdout.contains("nothing changed"), "{run:?}");
    ok(&cfg, &["account", "enable", "alice@example.test"], "");
    assert_eq!(login(sub, "alice@example.test", "second secret").await, 235);

    // A mailbox without a password takes mail but cannot log in.
    ok(
        &cfg,
        &["account", "add", "bob@example.test", "--no-password"],
        "",
    );
    assert_eq!(login(sub, "bob@example.test", "").await, 535);
    let mut mx = Client::connect(ingress.port("mx")).await;
    mx.ok("EHLO relay.example", 250).await;
    mx.ok("MAIL FROM:<carol@example.org>", 250).await;
    mx.ok("RCPT TO:<bob@example.test>", 250).await;

    let listed = ok(&cfg, &["account", "list", "--json"], "").json();
    let accounts = listed["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2);
    assert_eq!(accounts[0]["address"], "alice@example.test");
    assert_eq!(accounts[0]["has_password"], true);
    assert_eq!(accounts[1]["has_password"], false);

    ok(
        &cfg,
        &["account", "delete", "bob@example.test", "--yes"],
        "",
    );
    assert_eq!(
        ok(&cfg, &["account", "list", "--json"], "").json()["accounts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let log = events(&ingress).await;
    let actions: Vec<&str> = log.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "account.create",
            "account.password",
            "account.disable",
            "account.enable",
            "account.create",
            "account.delete"
        ]
    );
    for (action, detail) in &log {
        assert_eq!(detail["tool"], "pepsi-settings", "{action}");
        let text = detail.to_string();
        assert!(
            !text.contains("secret") && !text.contains("$argon2"),
            "{action} records a password or its hash: {text}"
        );
    }
}

#[tokio::test]
async fn aliases_domains_and_settings_made_here_are_what_the_ingress_reads() {
    let ingress = start().await;
    let cfg = ingress.config.clone();
    ok(
        &cfg,
        &["account", "add", "alice@example.test", "--password-stdin"],
        "pw\n",
    );
    ok(&cfg, &["domain", "add", "Hosted.TEST"], "");
    ok(&cfg, &["domain", "add", "catch.test"], "");
    let run = ok(
        &cfg,
        &[
            "alias",
            "set",
            "team@hosted.test",
            "Alice@Example.test,",
            "alice@example.test",
        ],
        "",
    );
    assert_eq!(
        run.stdout,
        "set alias of team@hosted.test: alice@example.test\n"
    );
    ok(
        &cfg,
        &["alias", "set", "@catch.test", "alice@example.test"],
        "",
    );
    ok(
        &cfg,
        &["set", "alice@example.test", "send_as", "@Admin.test"],
        "",
    );

    let mut mx = Client::connect(ingress.port("mx")).await;
    mx.ok("EHLO relay.example", 250).await;
    mx.ok("MAIL FROM:<carol@example.org>", 250).await;
    mx.ok("RCPT TO:<team@hosted.test>", 250).await;
    mx.ok("RCPT TO:<anyone@catch.test>", 250).await;
    let text = mx.ok("RCPT TO:<nobody@hosted.test>", 550).await;
    assert!(text.starts_with("5.1.1"), "{text}");

    let plain = pepsi_smtp::encoding::base64_encode(b"\0alice@example.test\0pw");
    let mut sub = Client::connect(ingress.port("sub")).await;
    sub.ok("EHLO laptop.example", 250).await;
    sub.ok(&format!("AUTH PLAIN {plain}"), 235).await;
    sub.ok("MAIL FROM:<boss@admin.test>", 250).await;
    sub.ok("RSET", 250).await;
    let text = sub.ok("MAIL FROM:<boss@elsewhere.test>", 553).await;
    assert!(text.starts_with("5.7.1"), "{text}");

    // What applies to an address, and the row each value comes from.
    ok(
        &cfg,
        &["alias", "set", "@example.test", "alice@example.test"],
        "",
    );
    let shown = ok(&cfg, &["show", "alice@example.test", "--json"], "").json();
    assert_eq!(shown["account"]["enabled"], true);
    let from = |shown: &Value, name: &str| -> Option<String> {
        shown["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["from"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        from(&shown, "send_as").as_deref(),
        Some("alice@example.test")
    );
    assert_eq!(from(&shown, "catchall").as_deref(), Some("@example.test"));
    let shown = ok(&cfg, &["show", "carol@example.test", "--json"], "").json();
    assert_eq!(shown["account"], Value::Null);
    assert_eq!(from(&shown, "catchall").as_deref(), Some("@example.test"));
    // send_as is read for the login's own address only: alice's row is not carol's.
    assert_eq!(from(&shown, "send_as"), None, "{shown}");
    ok(&cfg, &["alias", "delete", "@example.test"], "");

    let domains = ok(&cfg, &["domain", "list", "--json"], "").json();
    let listed: Vec<(String, String)> = domains["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["domain"].as_str().unwrap().to_owned(),
                d["source"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("example.test", "config"),
        ("catch.test", "settings"),
        ("hosted.test", "settings"),
    ];
    assert_eq!(listed.len(), want.len(), "{listed:?}");
    for (d, s) in want {
        assert!(
            listed.contains(&(d.into(), s.into())),
            "{d} {s}: {listed:?}"
        );
    }
    let aliases = ok(&cfg, &["alias", "list"], "").stdout;
    let lines: Vec<&str> = aliases.lines().collect();
    assert!(lines[0].starts_with("ADDRESS"), "{aliases}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("@catch.test") && l.contains("catchall"))
    );

    // Taking them away again.
    ok(&cfg, &["alias", "delete", "team@hosted.test"], "");
    ok(&cfg, &["domain", "delete", "catch.test"], "");
    let mut mx = Client::connect(ingress.port("mx")).await;
    mx.ok("EHLO relay.example", 250).await;
    mx.ok("MAIL FROM:<carol@example.org>", 250).await;
    let text = mx.ok("RCPT TO:<team@hosted.test>", 550).await;
    assert!(text.starts_with("5.1.1"), "{text}");
    let text = mx.ok("RCPT TO:<anyone@catch.test>", 554).await;
    assert!(text.starts_with("5.7.1"), "{text}");

    let actions: Vec<String> = events(&ingress).await.into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        actions.iter().filter(|a| *a == "settings.set").count(),
        6,
        "{actions:?}"
    );
    assert_eq!(
        actions.iter().filter(|a| *a == "settings.delete").count(),
        3,
        "{actions:?}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_naming_it_and_writes_nothing() {
    let ingress = start().await;
    let cfg = ingress.config.clone();
    ok(
        &cfg,
        &["account", "add", "alice@example.test", "--no-password"],
        "",
    );
    let before = events(&ingress).await.len();
    let cases: &[(&[&str], &str, i32, &str)] = &[
        (
            &["account", "add", "alice", "--no-password"],
            "",
            2,
            "address \"alice\" is not an address: no @",
        ),
        (
            &["account", "add", "new@example.test"],
            "",
            2,
            "stdin is not a terminal",
        ),
        (
            &["account", "add", "new@example.test", "--password-stdin"],
            "\n",
            2,
            "the password is empty",
        ),
        (
            &["account", "add", "alice@example.test", "--no-password"],
            "",
            1,
            "mailbox alice@example.test exists already",
        ),
        (
            &[
                "account",
                "password",
                "nobody@example.test",
                "--password-stdin",
            ],
            "pw\n",
            1,
            "there is no mailbox nobody@example.test",
        ),
        (
            &["account", "delete", "alice@example.test"],
            "",
            2,
            "confirm with --yes",
        ),
        (
            &["account", "delete", "nobody@example.test", "--yes"],
            "",
            1,
            "there is no mailbox nobody@example.test",
        ),
        (
            &["set", "alice@example.test", "colour", "blue"],
            "",
            2,
            "setting \"colour\" is not one Pepsi reads (known: local_domain, alias, catchall, send_as, vacation, block_languages, secretary, auto_pay)",
        ),
        (
            &[
                "set",
                "alice@example.test",
                "secretary",
                "{\"expire_days\": 0}",
            ],
            "",
            2,
            "secretary setting: expire_days must be 1 to 90, not 0",
        ),
        (
            &["set", "@example.test", "secretary", "{}"],
            "",
            2,
            "setting secretary belongs to an address, not to a domain",
        ),
        (
            &[
                "set",
                "alice@example.test",
                "auto_pay",
                "{\"per_payment\": \"KUDOS:2\", \"per_month\": \"KUDOS:1\"}",
            ],
            "",
            2,
            "auto_pay setting: per_payment (KUDOS:2) is above per_month (KUDOS:1)",
        ),
        (
            &["set", "@example.test", "alias", "a@example.test"],
            "",
            2,
            "setting alias belongs to an address, not to a domain (@example.test)",
        ),
        (
            &["set", "a@example.test", "local_domain", "yes"],
            "",
            2,
            "setting local_domain belongs to a domain",
        ),
        (
            &["set", "@other.test", "local_domain", "no"],
            "",
            2,
            "takes the value yes",
        ),
        (
            &["alias", "set", "team@example.test", "not an address"],
            "",
            2,
            "alias value 1 \"not an address\" is not an address",
        ),
        (
            &["alias", "set", "team@example.test", "|/bin/sh"],
            "",
            2,
            "alias value 1 \"|/bin/sh\" is not an address",
        ),
        (
            &["domain", "add", "no_such domain"],
            "",
            2,
            "domain \"no_such domain\" is not a domain name",
        ),
        (
            &["domain", "delete", "example.test"],
            "",
            2,
            "listed in [pepsi] LOCAL_DOMAINS",
        ),
        (
            &["unset", "alice@example.test", "send_as"],
            "",
            1,
            "alice@example.test has no send_as setting",
        ),
        (&["account", "list", "--limit", "0"], "", 2, "--limit"),
        (&["frobnicate"], "", 2, "unrecognized subcommand"),
    ];
    for (args, stdin, code, want) in cases {
        let run = settings(&cfg, args, stdin);
        assert_eq!(run.code, *code, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(want),
            "{args:?}: wanted {want:?} in {run:?}"
        );
        assert_eq!(run.stdout, "", "{args:?}");
    }
    assert_eq!(
        events(&ingress).await.len(),
        before,
        "a refused change was logged"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.settings")
        .fetch_one(&ingress.db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[test]
fn the_known_settings_are_listed_with_their_shape() {
    let dir = tempfile::tempdir().unwrap();
    // `names` needs no database: a server nobody listens on must not matter.
    let cfg = dir.path().join("pepsi.conf");
    std::fs::write(&cfg, "[database]\nURL = postgres://127.0.0.1:9/none\n").unwrap();
    let names = ok(&cfg, &["names", "--json"], "").json();
    let rows = names["settings"].as_array().unwrap();
    let shape: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().into(),
                r["key"].as_str().unwrap().into(),
                r["value"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("local_domain".into(), "domain".into(), "true".into()),
            ("alias".into(), "address".into(), "addresses".into()),
            ("catchall".into(), "domain".into(), "addresses".into()),
            (
                "send_as".into(),
                "address".into(),
                "addresses_or_domains".into()
            ),
            ("vacation".into(), "address".into(), "vacation".into()),
            (
                "block_languages".into(),
                "either".into(),
                "language_block".into()
            ),
            ("secretary".into(), "address".into(), "secretary".into()),
            ("auto_pay".into(), "address".into(), "auto_pay".into()),
        ]
    );
    let table = ok(&cfg, &["names"], "").stdout;
    assert!(table.starts_with("NAME"), "{table}");
    let help = ok(&cfg, &["--help"], "").stdout;
    for part in ["Exit status:", "Examples:", "event_log", "--password-stdin"] {
        assert!(help.contains(part), "--help lacks {part}");
    }
}
