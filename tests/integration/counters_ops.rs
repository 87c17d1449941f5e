//! migadu_counters as an operator runs it: config refusals, `-version`, CDB reload by SIGHUP
//! and by file change, log reopen after rotation, SIGTERM drain, and Redis going away and back.

use std::process::Command;
use std::time::Duration;

use migadu_counters_testkit::{
    Daemon, DaemonSetup, RedisServer, TempDir, free_port, wait_until, write_cdb,
};

const BIN: &str = env!("CARGO_BIN_EXE_migadu_counters");

fn today() -> String {
    chrono::Utc::now()
        .date_naive()
        .format("%Y-%m-%d")
        .to_string()
}

fn a_out_limit(d: &Daemon, addr: &str) -> serde_json::Value {
    d.get_counters(&format!("address={addr}")).json()["levels"][0]["out_limit"].clone()
}

fn run_with_config(text: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = TempDir::new("cfg");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("-config")
        .arg(&path)
        .env_remove("MIGADU_COUNTERS_AUTH_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn startup_refusals_name_what_is_wrong() {
    let dir = TempDir::new("refuse");
    let cdb = dir.path().join("d.cdb");
    write_cdb(&cdb, &[("example.com", "1|")]);
    let base = format!(
        "domains_cdb = \"{}\"\naddr = \"127.0.0.1:{}\"\nadmin_addr = \"127.0.0.1:{}\"\n",
        cdb.display(),
        free_port(),
        free_port()
    );
    let cases = [
        (
            format!("{base}auth_token = \"t\"\nsurprise = 1\n"),
            "unknown field `surprise`",
        ),
        (base.clone(), "auth_token: missing"),
        (
            format!("{base}auth_token = \"t\"\n[redis]\ndb = 1\n"),
            "redis.db: 1 is not 0",
        ),
        (
            format!("{base}auth_token = \"t\"\n[logging]\nlevel = \"loud\"\n"),
            "logging.level",
        ),
        (
            format!(
                "auth_token = \"t\"\ndomains_cdb = \"{}\"\n",
                dir.path().join("missing.cdb").display()
            ),
            "cannot read domains cdb",
        ),
    ];
    for (text, want) in cases {
        let (code, stderr) = run_with_config(&text, &[]);
        assert_eq!(code, Some(1), "{text}");
        assert!(stderr.contains(want), "{want:?} not in {stderr}");
    }
    let (code, stderr) = {
        let out = Command::new(BIN)
            .args(["-config", "/nonexistent/c.toml"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(1));
    assert!(stderr.contains("/nonexistent/c.toml"), "{stderr}");
}

#[test]
fn auth_token_from_the_environment_and_version_flag() {
    let redis = RedisServer::start();
    let dir = TempDir::new("envtok");
    let cdb = dir.path().join("d.cdb");
    write_cdb(&cdb, &[("example.com", "1|")]);
    let (api, admin) = (free_port(), free_port());
    let path = dir.path().join("c.toml");
    std::fs::write(&path, format!(
        "addr = \"127.0.0.1:{api}\"\nadmin_addr = \"127.0.0.1:{admin}\"\ndomains_cdb = \"{}\"\n[redis]\nwrite_addr = \"{}\"\n",
        cdb.display(), redis.addr()
    )).unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .env("MIGADU_COUNTERS_AUTH_TOKEN", "from-env")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let api_addr = format!("127.0.0.1:{api}");
    let ok = wait_until(Duration::from_secs(20), || {
        migadu_counters_testkit::http(
            &api_addr,
            "GET",
            "/counters?domain=example.com",
            &[("Authorization", "Bearer from-env")],
            b"",
        )
        .is_ok_and(|r| r.status == 200)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(ok, "token from MIGADU_COUNTERS_AUTH_TOKEN not accepted");

    for flag in ["-version", "--version"] {
        let out = Command::new(BIN).arg(flag).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with(&format!(
                "migadu_counters {} (commit ",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(text.contains(", built "), "{text}");
    }
}

#[test]
fn cdb_reloads_on_sighup_on_file_change_and_keeps_the_old_one_when_unreadable() {
    let redis = RedisServer::start();
    // The service sees the CDB through a symlink, so changes to the real file in another
    // directory reach it only through SIGHUP: that isolates the signal from the watcher.
    let real = TempDir::new("realcdb");
    write_cdb(&real.path().join("d.cdb"), &[("example.com", "1|A/o=10")]);
    let mut d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.com", "1|A/o=1")],
            ..Default::default()
        },
    );
    let link = d.dir.path().join("domains.cdb");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(real.path().join("d.cdb"), &link).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || a_out_limit(&d, "x@example.com")
            == 10),
        "watcher missed the new link"
    );

    write_cdb(&real.path().join("d.cdb"), &[("example.com", "1|A/o=20")]);
    let reloads = d.metric("migadu_counters_cdb_reloads_total{result=\"ok\"}");
    d.signal("HUP");
    assert!(
        wait_until(Duration::from_secs(20), || a_out_limit(&d, "x@example.com")
            == 20),
        "SIGHUP did not reload"
    );
    assert_eq!(
        d.metric("migadu_counters_cdb_reloads_total{result=\"ok\"}"),
        reloads + 1.0
    );
    assert!(d.app_log().contains("trigger=\"SIGHUP\""), "{}", d.logs());

    // the file replaced by rename in the watched directory: reloaded without a signal
    std::fs::remove_file(&link).unwrap();
    write_cdb(&link, &[("example.com", "1|A/o=30"), ("new.example", "2|")]);
    assert!(
        wait_until(Duration::from_secs(20), || a_out_limit(&d, "x@example.com")
            == 30),
        "file change not picked up"
    );
    assert!(wait_until(Duration::from_secs(20), || d
        .metric("migadu_counters_cdb_domains")
        == 2.0));

    // an unreadable file keeps the previous one
    let tmp = d.dir.path().join("garbage");
    std::fs::write(&tmp, b"not a cdb").unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    d.signal("HUP");
    assert!(wait_until(Duration::from_secs(20), || d
        .metric("migadu_counters_cdb_reloads_total{result=\"error\"}")
        >= 1.0));
    assert_eq!(a_out_limit(&d, "x@example.com"), 30);
    assert!(d.exited().is_none());
    assert!(
        d.app_log()
            .contains("domains cdb reload failed, keeping the previous one")
    );
}

#[test]
fn sighup_reopens_logs_moved_away_by_rotation() {
    let redis = RedisServer::start();
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.com", "1|")],
            ..Default::default()
        },
    );
    let dir = d.dir.path();
    assert_eq!(
        d.post(
            "/in",
            r#"{"trace_id":"before","recipient":"y@example.com"}"#
        )
        .status,
        202
    );
    assert!(wait_until(Duration::from_secs(20), || d
        .counting_log()
        .contains("<before>")));
    std::fs::rename(dir.join("counting.log"), dir.join("counting.log.0")).unwrap();
    std::fs::rename(dir.join("app.log"), dir.join("app.log.0")).unwrap();
    d.signal("HUP");
    assert!(wait_until(Duration::from_secs(20), || dir
        .join("app.log")
        .exists()
        && d.app_log().contains("logs reopened")));
    assert_eq!(
        d.post("/in", r#"{"trace_id":"after","recipient":"y@example.com"}"#)
            .status,
        202
    );
    assert!(
        wait_until(Duration::from_secs(20), || d
            .counting_log()
            .contains("<after>")),
        "new counting log empty"
    );
    let old = std::fs::read_to_string(dir.join("counting.log.0")).unwrap();
    assert!(
        old.contains("<before>") && !old.contains("<after>"),
        "{old}"
    );
    assert!(!d.counting_log().contains("<before>"));
}

#[test]
fn sigterm_drains_queued_counting_and_exits_0() {
    let redis = RedisServer::start();
    let mut d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.com", "1|")],
            top: "workers = 1",
            ..Default::default()
        },
    );
    let mut accepted = 0;
    for i in 0..300 {
        let r = d.post(
            "/out",
            &format!(
                r#"{{"trace_id":"d{i}","auth_user":"x@example.com","recipient":"s@gmail.com"}}"#
            ),
        );
        if r.status == 202 {
            accepted += 1;
        }
    }
    d.signal("TERM");
    let status = d.wait_exit(Duration::from_secs(60));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", d.logs());
    assert_eq!(
        redis.get(&format!("cnt/A/x@example.com/d/{}/o", today())),
        Some(accepted)
    );
    assert!(d.app_log().contains("stopped"));
}

#[test]
fn redis_killed_mid_run_then_restarted_is_recovered_without_a_restart() {
    let mut redis = RedisServer::start();
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.com", "1|")],
            ..Default::default()
        },
    );
    let k = format!("cnt/A/y@example.com/d/{}/i", today());
    let send = |t: &str| {
        assert_eq!(
            d.post(
                "/in",
                &format!(r#"{{"trace_id":"{t}","recipient":"y@example.com"}}"#)
            )
            .status,
            202
        )
    };
    send("up1");
    assert!(wait_until(Duration::from_secs(20), || redis.get(&k) == Some(1)));
    assert_eq!(
        migadu_counters_testkit::http(&d.admin, "GET", "/health", &[], b"")
            .unwrap()
            .status,
        200
    );

    redis.kill();
    send("down1");
    assert!(
        wait_until(Duration::from_secs(20), || d
            .counting_log()
            .contains("<down1> in; redis error: ")),
        "{}",
        d.counting_log()
    );
    assert!(d.metric("migadu_counters_redis_errors_total{op=\"incr\"}") >= 1.0);
    let c = d.get_counters("address=y@example.com");
    assert_eq!(c.status, 503, "{}", c.body);
    let h = migadu_counters_testkit::http(&d.admin, "GET", "/health", &[], b"").unwrap();
    assert_eq!(h.status, 503);
    assert!(
        h.json()["reason"].as_str().unwrap().starts_with("redis"),
        "{}",
        h.body
    );
    assert!(d.app_log().contains("counting failed, nothing counted"));

    redis.restart();
    assert!(
        wait_until(Duration::from_secs(20), || {
            send("back");
            redis.get(&k).is_some()
        }),
        "counting did not recover: {}",
        d.logs()
    );
    assert!(wait_until(Duration::from_secs(20), || d
        .get_counters("address=y@example.com")
        .status
        == 200));
    assert_eq!(
        migadu_counters_testkit::http(&d.admin, "GET", "/health", &[], b"")
            .unwrap()
            .status,
        200
    );
}

#[test]
fn a_cdb_built_by_the_cdb_tool_is_read() {
    if Command::new("cdb").arg("-h").output().is_err() {
        println!(
            "note: the cdb tool (Debian package tinycdb) is missing; only the cdb crate's files were tested"
        );
        return;
    }
    let redis = RedisServer::start();
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.com", "1|")],
            ..Default::default()
        },
    );
    let src = d.dir.path().join("domains.txt");
    std::fs::write(
        &src,
        "tool.example 4321|A/o=9,O/i=77\nexample.com 1|A/o=5\n",
    )
    .unwrap();
    let tmp = d.dir.path().join("domains.cdb.new");
    let out = Command::new("cdb")
        .arg("-c")
        .arg("-m")
        .arg(&tmp)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cdb -c -m: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, d.dir.path().join("domains.cdb")).unwrap();
    d.signal("HUP");
    assert!(wait_until(Duration::from_secs(20), || a_out_limit(
        &d,
        "a@tool.example"
    ) == 9));
    let v = d.get_counters("address=a@tool.example").json();
    assert_eq!(v["org_id"], 4321);
    assert_eq!(v["levels"][2]["in_limit"], 77);
}

#[test]
fn app_log_in_json_format() {
    let redis = RedisServer::start();
    let d = Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.com", "1|")],
            logging: "format = \"json\"",
            ..Default::default()
        },
    );
    let r = d.post("/in", r#"{"trace_id":"js","mail_from":"s@gmail.com"}"#);
    assert_eq!(r.status, 400);
    assert!(wait_until(Duration::from_secs(20), || d
        .app_log()
        .contains("recipient: missing")));
    let lines: Vec<serde_json::Value> = d
        .app_log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let rejected = lines
        .iter()
        .find(|l| l["fields"]["reason"] == "recipient: missing")
        .expect("rejection line");
    assert_eq!(rejected["level"], "WARN");
    assert_eq!(rejected["fields"]["status"], 400);
    assert_eq!(rejected["fields"]["trace_id"], "js");
    assert_eq!(rejected["fields"]["route"], "in");
}
