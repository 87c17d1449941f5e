//! pepsi-helper-auto-pay, the real program run as root (as its setuid bit makes it), paying
//! through the test wallet (tests/integration/stage_secretary/wallet.py, a stand-in for a GNU
//! Taler wallet) and the loopback merchant stand-in (merchant.py) as a real non-root
//! account made for the test (useradd, as the `.forward` tests do): the wallet runs with the
//! account's uid, in its home; unknown accounts, accounts below MIN_UID, other domains,
//! malformed URIs and over-long lines are refused without running anything; a wallet that
//! says no or hangs is a failure, the hang stopped at TIMEOUT. The set-user-id start itself
//! (the CALLER check) is tested in the package's throwaway root (package.rs).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_helper_auto_pay::client;
use pepsi_helper_auto_pay::protocol::{Outcome, Request};

use crate::support::{
    self,
    taler::{Account, Merchant},
};

const HELPER: &str = env!("CARGO_BIN_EXE_pepsi-helper-auto-pay");

/// A configuration with `section`'s lines under `[pepsi-helper-auto-pay]`.
fn config(dir: &Path, name: &str, section: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("[pepsi]\nLOCAL_DOMAINS = example.test\n\n[pepsi-helper-auto-pay]\n{section}\n"),
    )
    .unwrap();
    path
}

fn wallet(flags: &str) -> String {
    format!(
        "WALLET = /usr/bin/python3 {} {flags}",
        support::taler::wallet_program().display()
    )
}

/// Runs the helper on `input`: its exit status, stdout and stderr.
fn helper(config: &Path, input: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(HELPER)
        .arg("-c")
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A refusal of a long line may come before all of it is written.
    let _ = child.stdin.take().unwrap().write_all(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line(login: &str, uri: &str) -> Vec<u8> {
    Request {
        login: login.into(),
        uri: uri.into(),
        amount: "KUDOS:0.5".into(),
    }
    .to_line()
    .into_bytes()
}

/// The wallet runs as the account (its uid, not root's; its home; its HOME), the merchant's
/// order is paid, and the helper answers `paid` on one line; through the stage's client too.
#[tokio::test(flavor = "multi_thread")]
async fn the_wallet_pays_as_the_account_never_as_root() {
    let dir = tempfile::tempdir().unwrap();
    let merchant = Merchant::start(dir.path());
    let alice = Account::create("a");
    assert_ne!(alice.uid, 0);
    let conf = config(dir.path(), "pepsi.conf", &wallet(""));
    let (id, uri) = merchant.order();
    let login = format!("{}@Example.TEST", alice.name);
    let (code, out, err) = helper(&conf, &line(&login, &uri));
    assert_eq!((code, out.as_str()), (0, "paid\n"), "{err}");
    assert!(merchant.paid(&id), "order {id} not paid");
    assert_eq!(alice.wallet_log(), [(alice.uid, uri.clone())]);
    let meta = std::fs::metadata(alice.home.join("wallet.log")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        alice.uid,
        "wallet.log written as the account"
    );

    // The stage's end of it, through a wrapper naming the test configuration.
    let wrapper = dir.path().join("helper.sh");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {HELPER} -c {} \"$@\"\n", conf.display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (id2, uri2) = merchant.order();
    let request = Request {
        login: format!("{}@example.test", alice.name),
        uri: uri2.clone(),
        amount: "KUDOS:0.5".into(),
    };
    let outcome = client::pay(&wrapper, &request, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Paid);
    assert!(merchant.paid(&id2));
    assert_eq!(alice.wallet_log().last(), Some(&(alice.uid, uri2)));
}

/// Nothing runs for an unknown account, an account below MIN_UID (daemon, uid 1), a login
/// of another domain, a missing WALLET, a malformed URI or a line past the limit: each is
/// one `refused` line.
#[test]
fn requests_the_helper_will_not_try_are_refused_without_running_the_wallet() {
    let dir = tempfile::tempdir().unwrap();
    let bob = Account::create("b");
    let conf = config(dir.path(), "pepsi.conf", &wallet(""));
    let uri = "taler://pay/127.0.0.1:9/o-1/";
    let nosuch = format!("nosuch{}@example.test", std::process::id());
    let mine = format!("{}@example.test", bob.name);
    let long = format!(
        "pay {mine} KUDOS:1 taler://pay/127.0.0.1:9/{}/\n",
        "x".repeat(3000)
    );
    for (input, code, want) in [
        (line(&nosuch, uri), 0, "refused no account nosuch"),
        (
            line("daemon@example.test", uri),
            0,
            "refused account daemon has uid 1, below MIN_UID 1000",
        ),
        (
            line(&format!("{}@elsewhere.test", bob.name), uri),
            0,
            "is not a local domain",
        ),
        (line("root@example.test", uri), 0, "uid 0, below MIN_UID"),
        (
            line(&mine, "https://127.0.0.1:9/o-1/"),
            2,
            "refused protocol error: uri",
        ),
        (
            line(&mine, "taler://pay/127.0.0.1:9/o 1/"),
            2,
            "refused protocol error: expected `pay",
        ),
        (
            long.into_bytes(),
            2,
            "refused protocol error: a line longer than",
        ),
        (
            b"pay\0\n".to_vec(),
            2,
            "refused protocol error: a line holding '\\0'",
        ),
        (Vec::new(), 2, "refused protocol error: no request"),
    ] {
        let (got, out, err) = helper(&conf, &input);
        assert!(
            got == code
                && out.starts_with("refused ")
                && out.contains(want)
                && out.ends_with('\n')
                && out.lines().count() == 1,
            "{}: {got} {out:?} {err}",
            String::from_utf8_lossy(&input)
        );
    }
    // A configuration without WALLET refuses even a good request.
    let bare = config(dir.path(), "bare.conf", "MIN_UID = 1000");
    let (code, out, _) = helper(&bare, &line(&mine, uri));
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            "refused no wallet configured ([pepsi-helper-auto-pay] WALLET)\n"
        )
    );
    // MIN_UID above the account's own uid refuses it too.
    let high = config(
        dir.path(),
        "high.conf",
        &format!("{}\nMIN_UID = {}", wallet(""), bob.uid + 1),
    );
    let (_, out, _) = helper(&high, &line(&mine, uri));
    assert!(
        out.starts_with("refused account") && out.contains("below MIN_UID"),
        "{out}"
    );
    assert!(
        bob.wallet_log().is_empty(),
        "the wallet ran: {:?}",
        bob.wallet_log()
    );
}

/// A wallet that says no is `failed` with its exit status and the first line of its
/// stderr; one that hangs is stopped at TIMEOUT and `failed` too; an unknown URI shape is
/// the wallet's refusal, not the helper's.
#[test]
fn a_wallet_that_says_no_or_hangs_fails() {
    let dir = tempfile::tempdir().unwrap();
    let merchant = Merchant::start(dir.path());
    let carol = Account::create("c");
    let login = format!("{}@example.test", carol.name);
    let conf = config(
        dir.path(),
        "pepsi.conf",
        &format!("{}\nTIMEOUT = 2s", wallet("")),
    );
    let unknown = format!("taler://pay/127.0.0.1:{}/o-99/", merchant.port);
    let (code, out, err) = helper(&conf, &line(&login, &unknown));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("failed wallet exited 1: wallet.py: the merchant refused order o-99: 404"),
        "{out}"
    );
    let odd = "taler://pay/no-port/o-1/";
    let (_, out, _) = helper(&conf, &line(&login, odd));
    assert!(
        out.starts_with(
            "failed wallet exited 1: wallet.py: not a taler://pay/HOST:PORT/ORDER/ URI"
        ),
        "{out}"
    );

    let hang = config(
        dir.path(),
        "hang.conf",
        &format!("{}\nTIMEOUT = 2s", wallet("--hang")),
    );
    let (id, uri) = merchant.order();
    let started = Instant::now();
    let (code, out, err) = helper(&hang, &line(&login, &uri));
    let took = started.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("failed the wallet /usr/bin/python3 took longer than TIMEOUT (2s)"),
        "{out}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert!(!merchant.paid(&id));
    let log = carol.wallet_log();
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log.iter().all(|(uid, _)| *uid == carol.uid), "{log:?}");
}

/// The manual's text names the protocol, the options and the privilege model.
#[test]
fn the_help_documents_the_protocol_and_the_options() {
    let out = Command::new(HELPER).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "pay <login> <amount> <uri>",
        "refused <text>",
        "failed <text>",
        "WALLET",
        "MIN_UID",
        "TIMEOUT",
        "CALLER",
        "setuid root",
        "%h",
    ] {
        assert!(help.contains(want), "{want}: {help}");
    }
}
