//! pepsi-config as a process against a real PostgreSQL and a real pepsi-ingress: an override
//! it stores reaches the running ingress through config_changed (new sessions only), a value
//! a program would refuse or an option nothing reads is refused before anything is stored,
//! `show` names where each value comes from, and `check` finds a broken configuration.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::Run;
use crate::support::ingress::{Client, Ingress};

const CONFIG: &str = env!("CARGO_BIN_EXE_pepsi-config");
const MX: &str = "ROLE = mx\nVERIFY = no\n";

fn config_tool(config: &Path, args: &[&str]) -> Run {
    let out = Command::new(CONFIG)
        .arg("-c")
        .arg(config)
        .args(args)
        .output()
        .expect("run pepsi-config");
    Run::of(out)
}

fn ok(config: &Path, args: &[&str]) -> Run {
    let run = config_tool(config, args);
    assert_eq!(run.code, 0, "{args:?}: {run:?}");
    run
}

async fn overrides(ingress: &Ingress) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pepsi.config_override")
        .fetch_one(&ingress.db.pool)
        .await
        .unwrap()
}

/// Opens a session and names `n` recipients; the reply code of the last.
async fn last_rcpt(port: u16, n: usize) -> u16 {
    let mut c = Client::connect(port).await;
    c.ok("EHLO relay.example", 250).await;
    c.ok("MAIL FROM:<carol@example.org>", 250).await;
    let mut code = 0;
    for i in 0..n {
        code = c.cmd(&format!("RCPT TO:<r{i}@example.test>")).await.0;
    }
    code
}

#[tokio::test]
async fn an_override_reaches_the_running_ingress_for_new_sessions() {
    let ingress = Ingress::start("MAX_RECIPIENTS = 5\n", &[("mx", MX)]).await;
    let cfg = ingress.config.clone();
    let port = ingress.port("mx");
    assert_eq!(last_rcpt(port, 3).await, 250);

    // A session open before the change keeps the settings it started with.
    let mut before = Client::connect(port).await;
    before.ok("EHLO relay.example", 250).await;
    before.ok("MAIL FROM:<carol@example.org>", 250).await;

    let run = ok(&cfg, &["set", "Pepsi-Ingress", "max_recipients", "2"]);
    assert_eq!(
        run.stdout,
        "set [pepsi-ingress] MAX_RECIPIENTS = \"2\" for global\n"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if last_rcpt(port, 3).await == 452 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ingress never applied the override: {}",
            ingress.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..3 {
        before
            .ok(&format!("RCPT TO:<old{i}@example.test>"), 250)
            .await;
    }

    // Where the value now comes from, and after unset where it falls back to.
    let shown = ok(&cfg, &["show", "pepsi-ingress", "--json"]).json();
    let row = shown["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["option"] == "MAX_RECIPIENTS")
        .expect("show pepsi-ingress lists MAX_RECIPIENTS")
        .clone();
    assert_eq!(row["value"], "2");
    assert_eq!(row["origin"], "database override scope=global");
    let unset = ok(&cfg, &["unset", "pepsi-ingress", "MAX_RECIPIENTS"]);
    assert!(
        unset.stdout.contains("was \"2\"") && unset.stdout.contains("now from"),
        "{unset:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while last_rcpt(port, 3).await != 250 {
        assert!(
            Instant::now() < deadline,
            "the unset never reached the ingress"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let actions: Vec<(String, Value)> =
        sqlx::query_as("SELECT action, detail FROM pepsi.event_log ORDER BY event_id")
            .fetch_all(&ingress.db.pool)
            .await
            .unwrap();
    assert_eq!(actions.len(), 2);
    assert_eq!(actions[0].0, "config.set");
    assert_eq!(actions[0].1["value"], "2");
    assert_eq!(actions[0].1["tool"], "pepsi-config");
    assert_eq!(actions[1].0, "config.unset");
    assert_eq!(actions[1].1["previous"], "2");
}

#[tokio::test]
async fn overrides_a_program_would_refuse_are_never_stored() {
    let ingress = Ingress::start("", &[("mx", MX)]).await;
    let cfg = ingress.config.clone();
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).unwrap()
            + "\n[stage-init]\nPROGRAM = pepsi-stage-route\nROUTE_LOCAL = local\nROUTE_REMOTE = remote\n\
               [stage-local]\nPROGRAM = pepsi-stage-discard\n[stage-remote]\nPROGRAM = pepsi-stage-discard\n",
    )
    .unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["set", "pepsi-ingress", "MAX_RECIPIENTS", "lots"],
            1,
            "would stop pepsi-ingress: ",
        ),
        (
            &["set", "pepsi-ingress", "MAX_RECIPIENTS", "lots"],
            1,
            "expected a whole number",
        ),
        (
            &["set", "pepsi-ingress", "MAX_RECIPENTS", "5"],
            2,
            "no Pepsi program reads [pepsi-ingress] MAX_RECIPENTS (the options read from [pepsi-ingress]: ",
        ),
        (
            &["set", "stage-init", "PARALLELISM", "-3"],
            1,
            "would stop pepsi-dispatch",
        ),
        (
            &["set", "stage-local", "BOUNCE_STAGE", "bonce"],
            1,
            "[stage-local] BOUNCE_STAGE = \"bonce\" would break the stage graph: [stage-local] \
             BOUNCE_STAGE = bonce: no [stage-bonce] section",
        ),
        (
            &["set", "stage-init", "PROGRAM", "/tmp/evil"],
            2,
            "configuration file only",
        ),
        (
            &["set", "database", "URL", "postgres://evil/"],
            2,
            "configuration file only",
        ),
        (
            &["set", "listener-mx", "ADDRESS", "0.0.0.0:25"],
            2,
            "configuration file only",
        ),
        (
            &[
                "set",
                "pepsi-ingress",
                "MAX_RECIPIENTS",
                "5",
                "--scope",
                "domain:",
            ],
            2,
            "scope \"\" is not a domain name",
        ),
        (
            &[
                "set",
                "pepsi-ingress",
                "MAX_RECIPIENTS",
                "5",
                "--scope",
                "planet:mars",
            ],
            2,
            "is not global, domain:DOMAIN or address:ADDRESS",
        ),
        (
            &["set", "bad section!", "X", "1"],
            2,
            "is not a section name",
        ),
        (
            &["unset", "pepsi-ingress", "MAX_RECIPIENTS"],
            1,
            "there is no override of [pepsi-ingress] MAX_RECIPIENTS for scope global",
        ),
        (
            &["show", "pepsi-nonsense"],
            2,
            "is not a Pepsi program whose configuration is known",
        ),
    ];
    for (args, code, want) in cases {
        let run = config_tool(&cfg, args);
        assert_eq!(run.code, *code, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(want),
            "{args:?}: wanted {want:?} in {run:?}"
        );
    }
    assert_eq!(
        overrides(&ingress).await,
        0,
        "a refused override was stored"
    );

    // A stage option the route stage reads is accepted, for a domain as well; one it does
    // not read needs --force.
    ok(&cfg, &["set", "stage-init", "PARALLELISM", "2"]);
    ok(
        &cfg,
        &[
            "set",
            "stage-local",
            "RETURN_STATUS",
            "5.7.1",
            "--scope",
            "domain:Example.TEST",
        ],
    );
    let run = config_tool(
        &cfg,
        &[
            "set",
            "stage-local",
            "PARALLELISM",
            "3",
            "--scope",
            "domain:example.test",
        ],
    );
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("set it without --scope"), "{run:?}");
    let run = config_tool(&cfg, &["set", "stage-local", "COLOUR", "blue"]);
    assert_eq!(run.code, 2, "{run:?}");
    ok(&cfg, &["set", "stage-local", "COLOUR", "blue", "--force"]);
    let listed = ok(&cfg, &["overrides", "--json"]).json();
    let scopes: Vec<&str> = listed["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["scope"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["domain:example.test", "global", "global"]);
    let shown = ok(
        &cfg,
        &[
            "show",
            "--section",
            "stage-local",
            "--scope",
            "domain:example.test",
            "--json",
        ],
    )
    .json();
    let status = shown["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["option"] == "RETURN_STATUS")
        .unwrap()
        .clone();
    assert_eq!(
        status["origin"],
        "database override scope=domain:example.test"
    );
    ok(&cfg, &["check"]);

    // A file the programs cannot read is what `check` is for.
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).unwrap() + "\n[pepsi-dispatch]\nPOLL_INTERVAL = soon\n",
    )
    .unwrap();
    let run = config_tool(&cfg, &["check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stdout.contains("pepsi-dispatch:") && run.stdout.contains("POLL_INTERVAL"),
        "{run:?}"
    );
}

#[tokio::test]
async fn secrets_are_never_shown() {
    let db = pepsi_testkit::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    let secrets = dir.path().join("secrets.d");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[PATHS]\nSECRETS_DIR = {}\n[database]\nURL = {}\n[stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            secrets.display(),
            db.url
        ),
    )
    .unwrap();
    let fragment = secrets.join("relay.conf");
    std::fs::write(&fragment, "[stage-relay]\nPASSWORD = hunter2-secret\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fragment, std::fs::Permissions::from_mode(0o600)).unwrap();
    let run = ok(&cfg, &["show", "--section", "stage-relay"]);
    assert!(!run.stdout.contains("hunter2"), "{run:?}");
    assert!(run.stdout.contains("(secret)"), "{run:?}");
    let json = ok(&cfg, &["show", "--section", "stage-relay", "--json"]);
    assert!(!json.stdout.contains("hunter2"), "{json:?}");
}

/// Security review 2026-12-04 #2: whoever may write the overlay cannot point the smarthost
/// stage, whose AUTH_PASSWORD comes from secrets.d, at a host of their own or turn its TLS
/// off: HOST, PORT, TLS and TLS_SERVER_NAME (and the count stage's URL) are refused by
/// pepsi-config, --force and --scope included, and by the table's CHECK.
#[tokio::test]
async fn security_review_2_an_override_cannot_send_the_smarthost_password_elsewhere() {
    let db = pepsi_testkit::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pepsi.conf");
    let secrets = dir.path().join("secrets.d");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[PATHS]\nSECRETS_DIR = {}\n[database]\nURL = {}\n[stage-smarthost]\n\
             PROGRAM = pepsi-stage-relay-to-smarthost\nHOST = smarthost.example.net\n\
             AUTH_USERNAME = pepsi\n[stage-count]\nPROGRAM = pepsi-stage-count\n\
             URL = https://count.example.net\n",
            secrets.display(),
            db.url
        ),
    )
    .unwrap();
    let fragment = secrets.join("smarthost.conf");
    std::fs::write(
        &fragment,
        "[stage-smarthost]\nAUTH_PASSWORD = hunter2-secret\n[stage-count]\nAUTH_TOKEN = t0ken\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fragment, std::fs::Permissions::from_mode(0o600)).unwrap();
    let attempts: &[&[&str]] = &[
        &["set", "stage-smarthost", "HOST", "mx.attacker.example"],
        &[
            "set",
            "stage-smarthost",
            "HOST",
            "mx.attacker.example",
            "--force",
        ],
        &[
            "set",
            "stage-smarthost",
            "host",
            "mx.attacker.example",
            "--scope",
            "domain:example.test",
        ],
        &["set", "stage-smarthost", "PORT", "2525"],
        &["set", "stage-smarthost", "TLS", "none"],
        &[
            "set",
            "stage-smarthost",
            "TLS_SERVER_NAME",
            "mx.attacker.example",
        ],
        &[
            "set",
            "stage-count",
            "URL",
            "https://count.attacker.example",
        ],
    ];
    for args in attempts {
        let run = config_tool(&cfg, args);
        assert_eq!(run.code, 2, "{args:?} was not refused: {run:?}");
        assert!(
            run.stderr
                .contains("decides where a stage connects and sends its credentials"),
            "{args:?}: {run:?}"
        );
    }
    // The table refuses them too, whoever writes it (the configuration role, here the
    // test's superuser).
    for option in ["HOST", " port ", "TLS", "TLS_SERVER_NAME", "URL"] {
        let r = sqlx::query(
            "INSERT INTO pepsi.config_override (scope, section, option, value) \
             VALUES ('global', 'stage-smarthost', $1, 'mx.attacker.example')",
        )
        .bind(option)
        .execute(&db.pool)
        .await;
        match r {
            Err(sqlx::Error::Database(d)) => {
                assert_eq!(d.code().as_deref(), Some("23514"), "{option}: {d}")
            }
            other => panic!("[stage-smarthost] {option} was stored: {other:?}"),
        }
    }
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pepsi.config_override")
            .fetch_one(&db.pool)
            .await
            .unwrap(),
        0
    );
    // An option that does not decide the destination is still accepted.
    ok(
        &cfg,
        &["set", "stage-smarthost", "ATTEMPT_TIMEOUT", "2m", "--force"],
    );
}

/// `check` judges the stage graph as the dispatcher does at start: a NEXT_STAGE naming no
/// section and a misspelt stage PROGRAM are errors (exit 1, the last lines, as pepsi-setup
/// apply quotes the last), a stage nothing reaches a warning printed before them.
#[tokio::test]
async fn check_names_the_stage_graphs_errors_after_its_warnings() {
    // The ingress's configuration (a listener, which its parser wants), with a pipeline.
    let ingress = Ingress::start("", &[("mx", MX)]).await;
    let cfg = ingress.config.clone();
    let whole = std::fs::read_to_string(&cfg).unwrap()
        + "\n[stage-init]\nPROGRAM = pepsi-stage-discard\nNEXT_STAGE = relay\n\
           [stage-relay]\nPROGRAM = pepsi-stage-discard\n";
    std::fs::write(&cfg, &whole).unwrap();
    let run = ok(&cfg, &["check"]);
    assert!(
        run.stdout.contains("the stage graph is whole") && !run.stdout.contains("warning:"),
        "{run:?}"
    );

    std::fs::write(
        &cfg,
        whole.replace("NEXT_STAGE = relay", "NEXT_STAGE = rleay")
            + "[stage-old]\nPROGRAM = pepsi-stage-dicsard\n",
    )
    .unwrap();
    let run = config_tool(&cfg, &["check"]);
    assert_eq!(run.code, 1, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "warning: stage graph: [stage-old] is reached from [stage-init] by no NEXT_STAGE, \
             BOUNCE_STAGE or branch: only a message moved there by hand gets there",
            "warning: stage graph: [stage-relay] is reached from [stage-init] by no NEXT_STAGE, \
             BOUNCE_STAGE or branch: only a message moved there by hand gets there",
            "error: stage graph: [stage-init] NEXT_STAGE = rleay: no [stage-rleay] section \
             (did you mean relay?)",
            "error: stage graph: [stage-old] PROGRAM = pepsi-stage-dicsard: this Pepsi has no \
             stage program pepsi-stage-dicsard (did you mean pepsi-stage-discard?)",
        ],
        "{run:?}"
    );
    let json = config_tool(&cfg, &["check", "--json"]).json();
    assert_eq!(json["problems"][0]["program"], Value::Null, "{json}");
    assert_eq!(
        json["problems"][0]["error"],
        "[stage-init] NEXT_STAGE = rleay: no [stage-rleay] section (did you mean relay?)"
    );
    assert_eq!(json["warnings"].as_array().unwrap().len(), 2, "{json}");
}
