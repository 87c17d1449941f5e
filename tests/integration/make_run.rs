//! `make run` (scripts/run.sh) keeps the system up as a service manager would: after a
//! kill -9 of the dispatcher and of the ingress, its supervisors start both again, mail
//! sent before and after is delivered, and SIGTERM still stops everything.
//!
//! It runs the real script from the checkout, so it uses what the script uses: ./var, port
//! 2525 and the database `pepsi` on the server DATABASE_URL names.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::root;

fn pid_of(name: &str) -> Option<u32> {
    std::fs::read_to_string(root().join(format!("var/run/{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn kill(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

fn wait_until(what: &str, limit: Duration, script: &mut Child, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !ok() {
        if let Some(status) = script.try_wait().unwrap() {
            panic!(
                "scripts/run.sh exited ({status}) while waiting for {what}: {}",
                log()
            );
        }
        assert!(
            Instant::now() < until,
            "{what}: not within {limit:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where the script's output is kept: the build's target directory (CARGO_TARGET_DIR may
/// put it outside the checkout), which exists whenever this test runs.
fn log_path() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("make-run-test.log")
}

fn log() -> String {
    std::fs::read_to_string(log_path()).unwrap_or_default()
}

fn delivered() -> usize {
    std::fs::read_dir(root().join("var/mail/alice/Maildir/new"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// One message to alice through the ingress on 2525; true when it got its 250.
fn send(subject: &str) -> bool {
    let out = Command::new("python3")
        .args([
            "-c",
            "import smtplib, sys\n\
             from email.message import EmailMessage\n\
             m = EmailMessage(); m['From'] = 'bob@example.test'; m['To'] = 'alice@example.test'\n\
             m['Subject'] = sys.argv[1]; m.set_content('after a kill -9')\n\
             with smtplib.SMTP('127.0.0.1', 2525, timeout=10) as s: s.send_message(m)\n",
            subject,
        ])
        .output()
        .unwrap();
    out.status.success()
}

#[test]
fn after_kill_9_of_the_dispatcher_and_the_ingress_make_run_serves_again_and_loses_nothing() {
    let out = std::fs::File::create(log_path()).unwrap();
    let mut script = Command::new(root().join("scripts/run.sh"))
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    wait_until(
        "the demonstration message",
        Duration::from_secs(600),
        &mut script,
        || log().contains("Pepsi is running"),
    );
    let dispatcher = pid_of("dispatch").unwrap();
    let ingress = pid_of("ingress").unwrap();
    // pepsi-httpd runs under the same supervision, and the first administrator's
    // credential is where the script says.
    assert!(
        log().contains("at http://127.0.0.1:8080/") && log().contains("var/httpd-admin.txt"),
        "{}",
        log()
    );
    assert!(pid_of("httpd").is_some_and(alive), "{}", log());
    let credential = std::fs::read_to_string(root().join("var/httpd-admin.txt")).unwrap();
    let (name, password) = credential.trim().split_once(' ').expect("name password");
    assert_eq!((name, password.len()), ("admin", 24));
    let login = Command::new("python3")
        .args([
            "-c",
            "import json, sys, urllib.request\n\
             r = urllib.request.Request('http://127.0.0.1:8080/api/login', method='POST', \
             data=json.dumps({'name': sys.argv[1], 'password': sys.argv[2]}).encode(), \
             headers={'Content-Type': 'application/json'})\n\
             print(json.load(urllib.request.urlopen(r))['name'])",
            name,
            password,
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&login.stdout).trim(),
        "admin",
        "{login:?}"
    );

    kill(dispatcher, "-KILL");
    wait_until(
        "a new dispatcher",
        Duration::from_secs(60),
        &mut script,
        || pid_of("dispatch").is_some_and(|p| p != dispatcher && alive(p)),
    );
    // Mail taken while the dispatcher was away, or by its successor, is delivered.
    let before = delivered();
    assert!(send("while the dispatcher restarts"), "{}", log());
    wait_until("its delivery", Duration::from_secs(60), &mut script, || {
        delivered() > before
    });

    kill(ingress, "-KILL");
    wait_until(
        "a new ingress",
        Duration::from_secs(60),
        &mut script,
        || pid_of("ingress").is_some_and(|p| p != ingress && alive(p)),
    );
    let before = delivered();
    let until = Instant::now() + Duration::from_secs(30);
    while !send("after the ingress restarted") {
        assert!(
            Instant::now() < until,
            "the new ingress does not take mail: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_until("its delivery", Duration::from_secs(60), &mut script, || {
        delivered() > before
    });
    assert!(log().contains("exited with status"), "{}", log());

    kill(script.id(), "-TERM");
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = script.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "scripts/run.sh did not stop: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}: {}", log());
    for name in ["dispatch", "ingress", "httpd"] {
        let pid = pid_of(name).unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while alive(pid) {
            assert!(
                Instant::now() < until,
                "{name} (pid {pid}) still runs after the stop"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
