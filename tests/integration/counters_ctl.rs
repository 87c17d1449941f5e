//! counterctl against a running migadu_counters: table and `--json` output, flags in both
//! spellings, config discovery and the token override, and its exit codes.

use std::process::{Command, Output};

use migadu_counters_testkit::{
    Daemon, DaemonSetup, RedisServer, TEST_TOKEN, free_port, wait_until,
};

const DAEMON: &str = env!("CARGO_BIN_EXE_migadu_counters");
const CTL: &str = env!("CARGO_BIN_EXE_counterctl");

fn ctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(CTL);
    c.args(args).env_remove("MIGADU_COUNTERS_AUTH_TOKEN");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn counterctl_against_the_running_service() {
    let redis = RedisServer::start();
    let d = Daemon::start(
        DAEMON,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[(
                "example.com",
                "1234|A/i=500,A/o=2,D/o=400,O/i=5000,O/o=1000",
            )],
            ..Default::default()
        },
    );
    for _ in 0..2 {
        assert_eq!(
            d.post(
                "/out",
                r#"{"auth_user":"me@example.com","recipient":"y@gmail.com"}"#
            )
            .status,
            202
        );
    }
    let today = chrono::Utc::now()
        .date_naive()
        .format("%Y-%m-%d")
        .to_string();
    let k = format!("cnt/O/1234/d/{today}/o");
    assert!(wait_until(std::time::Duration::from_secs(20), || redis
        .get(&k)
        == Some(2)));
    let cfg = d.config.to_str().unwrap().to_string();

    // table, with both flag spellings
    for args in [
        vec!["--config", &cfg, "--address", "me@example.com"],
        vec![
            "-config",
            &cfg,
            "-address",
            "me@example.com",
            "-date",
            &today,
        ],
    ] {
        let out = ctl(&args, &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let want = format!(
            "me@example.com   date {today} (UTC)   domain example.com   org 1234\n\
             LEVEL  ID              IN    LIMIT  OUT   LIMIT\n\
             A      me@example.com  0     500    2!    2\n\
             D      example.com     0     -      2     400\n\
             O      1234            0     5000   2     1000\n"
        );
        assert_eq!(text(&out.stdout), want);
    }
    // --json is the service's answer unchanged
    let out = ctl(
        &["--config", &cfg, "--domain", "example.com", "--json"],
        &[],
    );
    assert!(out.status.success());
    let direct = d
        .get_counters(&format!("domain=example.com&date={today}"))
        .body;
    assert_eq!(text(&out.stdout).trim_end(), direct.trim_end());
    // notes for an unmanaged domain and an exempt address
    let out = ctl(&["--config", &cfg, "--address", "support@migadu.com"], &[]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("domain is not in rspamd_domains_db (not counted)")
            && stdout.contains("address is exempt from counting"),
        "{stdout}"
    );
    // --url overrides addr; the token comes from the environment when set
    let url = format!("http://{}", d.api);
    let bare = d.dir.path().join("bare.toml");
    std::fs::write(&bare, "addr = \":1\"\n").unwrap();
    let out = ctl(
        &[
            "--config",
            bare.to_str().unwrap(),
            "--url",
            &url,
            "--address",
            "me@example.com",
        ],
        &[("MIGADU_COUNTERS_AUTH_TOKEN", TEST_TOKEN)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // addr ":port" means this host
    let port = d.api.rsplit_once(':').unwrap().1;
    let local = d.dir.path().join("local.toml");
    std::fs::write(
        &local,
        format!("addr = \":{port}\"\nauth_token = \"{TEST_TOKEN}\"\n"),
    )
    .unwrap();
    let out = ctl(
        &[
            "--config",
            local.to_str().unwrap(),
            "--address",
            "me@example.com",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
    // an old date warns that its keys expired
    let old = (chrono::Utc::now().date_naive() - chrono::Duration::days(40))
        .format("%Y-%m-%d")
        .to_string();
    let out = ctl(
        &[
            "--config",
            &cfg,
            "--address",
            "me@example.com",
            "--date",
            &old,
        ],
        &[],
    );
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("expired"),
        "{}",
        text(&out.stderr)
    );

    // exit 1: usage errors, bad dates, wrong token (non-200), unreachable service
    let wrong = d.dir.path().join("wrong.toml");
    std::fs::write(
        &wrong,
        format!("addr = \"{}\"\nauth_token = \"nope\"\n", d.api),
    )
    .unwrap();
    let dead = d.dir.path().join("dead.toml");
    std::fs::write(
        &dead,
        format!("addr = \"127.0.0.1:{}\"\nauth_token = \"t\"\n", free_port()),
    )
    .unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--config", &cfg],
            "exactly one of --address or --domain",
        ),
        (
            vec!["--config", &cfg, "--address", "a@b", "--domain", "b"],
            "exactly one of --address or --domain",
        ),
        (
            vec!["--config", &cfg, "--address", "a@b", "--date", "2099-01-01"],
            "in the future",
        ),
        (
            vec!["--config", &cfg, "--address", "a@b", "--date", "13/10/2026"],
            "expected YYYY-MM-DD",
        ),
        (vec!["--config", &cfg, "--nonsense"], "--nonsense"),
        (
            vec!["--config", wrong.to_str().unwrap(), "--address", "a@b"],
            "service answered 401",
        ),
        (
            vec!["--config", dead.to_str().unwrap(), "--address", "a@b"],
            "service unreachable",
        ),
        (
            vec!["--config", &cfg, "--address", "not-an-address"],
            "service answered 400: address: invalid e-mail address",
        ),
    ];
    for (args, want) in cases {
        let out = ctl(&args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            text(&out.stderr).contains(want),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    for flag in ["-version", "--version"] {
        let out = ctl(&[flag], &[]);
        assert!(out.status.success());
        assert!(
            text(&out.stdout).starts_with("counterctl "),
            "{}",
            text(&out.stdout)
        );
    }
}
