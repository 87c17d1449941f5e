//! migadu_counters' web-app notifications against real targets: retries then giving up on a
//! target answering 500 and on a refused connection, SIGTERM waiting for (or abandoning) a
//! notification in flight, and HTTPS targets trusted through `SSL_CERT_FILE` or not trusted.

use std::time::Duration;

use migadu_counters_testkit::{
    Daemon, DaemonSetup, HttpTarget, RedisServer, TargetSetup, TempDir, TestCa, free_port,
    wait_until,
};

const BIN: &str = env!("CARGO_BIN_EXE_migadu_counters");
/// One outgoing message crosses both the address and the organisation limit.
const ROWS: &[(&str, &str)] = &[("example.com", "1234|A/o=1,O/o=1")];
const QUERY: &str = "level=$LEVEL&id=$ID&flow=$FLOW&period=$PERIOD&by=$ADDRESS&count=$COUNT";
/// Five attempts with 1 + 2 + 4 + 8 s between them take 15 s; this bounds only liveness.
const GIVE_UP: Duration = Duration::from_secs(90);

fn notify_section(org: &str, addr: &str, extra: &str) -> String {
    format!(
        "[notify]\norg_url = \"{org}/org?{QUERY}\"\naddress_url = \"{addr}/addr?{QUERY}\"\n\
         user = \"web\"\npassword = \"pw\"\n{extra}"
    )
}

fn start(redis: &RedisServer, sections: &str, env: &[(&str, &str)]) -> Daemon {
    Daemon::start(
        BIN,
        DaemonSetup {
            redis: &redis.addr(),
            rows: ROWS,
            sections,
            env,
            ..Default::default()
        },
    )
}

/// Sends the crossing request; both A and O cross on it.
fn cross(d: &Daemon, trace: &str) {
    let r = d.post(
        "/out",
        &format!(
            r#"{{"trace_id":"{trace}","auth_user":"x@example.com","recipient":"s@gmail.com"}}"#
        ),
    );
    assert_eq!(r.status, 202, "{}", r.body);
}

fn org_url(base: &str) -> String {
    format!("{base}/org?level=O&id=1234&flow=o&period=d&by=x%40example.com&count=1")
}

fn addr_url(base: &str) -> String {
    format!("{base}/addr?level=A&id=x%40example.com&flow=o&period=d&by=x%40example.com&count=1")
}

fn log_line<'a>(log: &'a str, needle: &str) -> Option<&'a str> {
    log.lines().find(|l| l.contains(needle))
}

fn wait_log_line(d: &Daemon, needle: &str, limit: Duration) -> String {
    let mut line = None;
    wait_until(limit, || {
        line = log_line(&d.counting_log(), needle).map(str::to_string);
        line.is_some()
    });
    line.unwrap_or_else(|| {
        panic!(
            "counting log lacks {needle:?}:\n{}\n{}",
            d.counting_log(),
            d.logs()
        )
    })
}

#[test]
fn a_failing_target_is_tried_five_times_with_doubling_backoff_then_given_up() {
    let redis = RedisServer::start();
    let failing = HttpTarget::start_blocking(500);
    // nothing listens there: every attempt is a refused connection
    let refused = format!("http://127.0.0.1:{}", free_port());
    let d = start(&redis, &notify_section(&failing.base(), &refused, ""), &[]);
    cross(&d, "r1");

    let o = wait_log_line(
        &d,
        &format!(
            "failed limit exceeded notification to url \"{}\"",
            org_url(&failing.base())
        ),
        GIVE_UP,
    );
    let a = wait_log_line(
        &d,
        &format!(
            "failed limit exceeded notification to url \"{}\"",
            addr_url(&refused)
        ),
        GIVE_UP,
    );
    // the plan's line: `failed limit exceeded notification to url "…" after 5 attempts: <err>`
    assert!(
        o.contains("<r1> out; failed limit exceeded notification"),
        "{o}"
    );
    assert!(o.ends_with("\" after 5 attempts: status 500"), "{o}");
    assert!(
        a.contains("<r1> out; failed limit exceeded notification"),
        "{a}"
    );
    assert!(a.contains("\" after 5 attempts: "), "{a}");
    assert!(a.contains("Connection refused"), "the cause is named: {a}");
    assert!(
        !d.counting_log()
            .contains("sent limit exceeded notification")
    );

    // five requests reached the 500 target, each with basic auth, and none after giving up;
    // the pauses between them are at least 1, 2, 4 and 8 s (a lower bound, never a deadline)
    let got = failing.requests();
    assert_eq!(got.len(), 5, "{got:?}");
    for r in &got {
        assert_eq!(r.path_and_query, org_url(""));
        assert_eq!(r.authorization.as_deref(), Some("Basic d2ViOnB3"));
    }
    for (i, pair) in got.windows(2).enumerate() {
        let pause = pair[1].at - pair[0].at;
        let min = Duration::from_secs(1 << i);
        assert!(pause >= min, "pause {i} was {pause:?}, less than {min:?}");
    }

    // metrics: one failure per level, nothing sent, and both crossings counted
    for level in ["O", "A"] {
        assert_eq!(
            d.metric(&format!(
                "migadu_counters_notifications_total{{level=\"{level}\",result=\"failed\"}}"
            )),
            1.0,
            "{level}"
        );
        assert_eq!(
            d.metric(&format!(
                "migadu_counters_notifications_total{{level=\"{level}\",result=\"sent\"}}"
            )),
            0.0
        );
        assert_eq!(
            d.metric(&format!(
                "migadu_counters_limit_reached_total{{level=\"{level}\",flow=\"o\"}}"
            )),
            1.0
        );
    }
    // the final failure is also an error in the app log, with the trace id and the URL
    let app = d.app_log();
    let err = log_line(&app, "limit notification failed").unwrap_or_else(|| panic!("{app}"));
    assert!(
        err.contains("ERROR") && err.contains("trace_id=\"r1\""),
        "{err}"
    );
    assert_eq!(
        app.matches("limit notification failed").count(),
        2,
        "one error per notification: {app}"
    );
    assert_eq!(failing.requests().len(), 5, "no attempt after giving up");
}

#[test]
fn sigterm_waits_for_a_notification_in_flight_and_exits_0() {
    let redis = RedisServer::start();
    let slow = HttpTarget::start_with(
        200,
        TargetSetup {
            held: true,
            ..Default::default()
        },
    );
    // only the organisation level is notified here
    let sections = format!("[notify]\norg_url = \"{}/org?{QUERY}\"\n", slow.base());
    let mut d = start(&redis, &sections, &[]);
    cross(&d, "s1");
    assert!(
        wait_until(Duration::from_secs(20), || slow.requests().len() == 1),
        "the target never got the notification: {}",
        d.logs()
    );
    d.signal("TERM");
    // the target answers only once the service is waiting for it at shutdown
    assert!(
        wait_until(Duration::from_secs(30), || d
            .app_log()
            .contains("waiting for notifications in flight")),
        "{}",
        d.logs()
    );
    assert!(d.app_log().contains("in_flight=1"), "{}", d.app_log());
    assert!(d.exited().is_none(), "exited without waiting: {}", d.logs());
    slow.release();
    let status = d.wait_exit(Duration::from_secs(60));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", d.logs());
    let line = log_line(&d.counting_log(), "sent limit exceeded notification")
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{}", d.counting_log()));
    assert_eq!(
        line.split_once(" <").map(|(_, rest)| rest),
        Some(
            format!(
                "s1> out; sent limit exceeded notification to url \"{}\"",
                org_url(&slow.base())
            )
            .as_str()
        )
    );
    assert_eq!(slow.requests().len(), 1);
    let app = d.app_log();
    assert!(app.contains("stopped"), "{app}");
    assert!(!app.contains("abandoned"), "{app}");
}

#[test]
fn sigterm_abandons_a_notification_never_answered_after_the_bound_and_exits_0() {
    let redis = RedisServer::start();
    let mute = HttpTarget::start_with(
        200,
        TargetSetup {
            held: true,
            ..Default::default()
        },
    );
    // the per-attempt timeout is longer than the shutdown bound, so only the bound ends it
    let sections = format!(
        "[notify]\norg_url = \"{}/org?{QUERY}\"\ntimeout_seconds = 600\n",
        mute.base()
    );
    let mut d = start(&redis, &sections, &[]);
    cross(&d, "h1");
    assert!(
        wait_until(Duration::from_secs(20), || mute.requests().len() == 1),
        "{}",
        d.logs()
    );
    d.signal("TERM");
    let status = d.wait_exit(Duration::from_secs(90));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", d.logs());
    let app = d.app_log();
    let line = log_line(&app, "limit notification abandoned at shutdown")
        .unwrap_or_else(|| panic!("what was abandoned is not logged: {app}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("trace_id=h1"), "{line}");
    assert!(line.contains("level=\"O\""), "{line}");
    assert!(
        line.contains(&format!("url={}", org_url(&mute.base()))),
        "{line}"
    );
    assert!(line.contains("attempts=1"), "{line}");
    assert!(app.contains("abandoned=1"), "{app}");
    assert!(app.contains("stopped"), "{app}");
    let counting = d.counting_log();
    assert!(!counting.contains("sent limit exceeded"), "{counting}");
    assert!(!counting.contains("failed limit exceeded"), "{counting}");
}

#[test]
fn https_targets_are_reached_when_their_ca_is_trusted_and_fail_when_not() {
    let redis = RedisServer::start();
    let pki = TempDir::new("pki");
    let trusted_ca = TestCa::new(pki.path(), "trusted");
    let other_ca = TestCa::new(pki.path(), "other");
    let (cert, key) = trusted_ca.issue("web");
    let (ocert, okey) = other_ca.issue("web");
    let good = HttpTarget::start_with(
        200,
        TargetSetup {
            tls: Some((cert, key)),
            ..Default::default()
        },
    );
    let untrusted = HttpTarget::start_with(
        200,
        TargetSetup {
            tls: Some((ocert, okey)),
            ..Default::default()
        },
    );
    assert!(good.base().starts_with("https://localhost:"));
    let ca_file = trusted_ca.ca_pem();
    let ca_file = ca_file.to_str().unwrap();

    // the operator adds the CA with SSL_CERT_FILE: the org target is reached, the address
    // target, whose certificate another CA signed, is refused
    let d = start(
        &redis,
        &notify_section(&good.base(), &untrusted.base(), ""),
        &[("SSL_CERT_FILE", ca_file)],
    );
    // without it the same trusted target is refused: neither the built-in roots nor the
    // system store know the test CA
    let redis2 = RedisServer::start();
    let plain = start(
        &redis2,
        &notify_section(&good.base(), &good.base(), ""),
        &[],
    );
    cross(&d, "tls1");
    cross(&plain, "tls2");

    wait_log_line(
        &d,
        &format!(
            "<tls1> out; sent limit exceeded notification to url \"{}\"",
            org_url(&good.base())
        ),
        GIVE_UP,
    );
    let got = good.requests();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].authorization.as_deref(), Some("Basic d2ViOnB3"));
    assert!(
        got[0].path_and_query.starts_with("/org?level=O&id=1234"),
        "{got:?}"
    );

    let refused = wait_log_line(
        &d,
        &format!(
            "<tls1> out; failed limit exceeded notification to url \"{}\"",
            addr_url(&untrusted.base())
        ),
        GIVE_UP,
    );
    assert!(refused.contains("after 5 attempts: "), "{refused}");
    assert!(
        refused.contains("UnknownIssuer"),
        "the cause is named: {refused}"
    );
    assert!(
        untrusted.requests().is_empty(),
        "a request passed an untrusted handshake"
    );

    for url in [org_url(&good.base()), addr_url(&good.base())] {
        let line = wait_log_line(
            &plain,
            &format!("<tls2> out; failed limit exceeded notification to url \"{url}\""),
            GIVE_UP,
        );
        assert!(line.contains("UnknownIssuer"), "{line}");
    }
    assert_eq!(
        good.requests().len(),
        1,
        "the untrusting daemon got through"
    );
    assert_eq!(
        d.metric("migadu_counters_notifications_total{level=\"O\",result=\"sent\"}"),
        1.0
    );
    assert_eq!(
        d.metric("migadu_counters_notifications_total{level=\"A\",result=\"failed\"}"),
        1.0
    );
    assert_eq!(
        plain.metric("migadu_counters_notifications_total{level=\"O\",result=\"failed\"}"),
        1.0
    );

    // start-up names where the extra trust anchors came from
    assert!(
        d.app_log()
            .contains(&format!("source=SSL_CERT_FILE={ca_file} certificates=1")),
        "{}",
        d.app_log()
    );
    assert!(
        plain.app_log().contains("source=system store"),
        "{}",
        plain.app_log()
    );
}

#[test]
fn a_missing_ssl_cert_file_is_named_in_a_start_up_warning() {
    let redis = RedisServer::start();
    let dir = TempDir::new("badca");
    let missing = dir.path().join("missing.pem");
    let d = start(&redis, "", &[("SSL_CERT_FILE", missing.to_str().unwrap())]);
    let app = d.app_log();
    let warn = log_line(&app, "notification TLS trust: cannot load certificates")
        .unwrap_or_else(|| panic!("{app}"));
    assert!(
        warn.contains("WARN") && warn.contains("missing.pem"),
        "{warn}"
    );
}
