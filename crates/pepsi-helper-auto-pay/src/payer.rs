//! Paying one request as its user: the login's account (`account_for`), the drop to that
//! account's ids for good (`drop_to`), and the wallet run under a deadline with its output
//! bounded (`run_wallet`). The command line of the wallet (`wallet_argv`) and the account
//! rule (`account_name`) are pure and tested as tables.
//!
//! The account rule is the one `pepsi-whitelist` applies to a user's mailboxes (its
//! `access` module): the local part of the address, lower case, is the account name, and
//! the domain is one of the configured local domains (`[pepsi] LOCAL_DOMAINS`, or this
//! program's own LOCAL_DOMAINS). It is written with `pepsi_conf::address` here because
//! `pepsi_contract::local::LocalRecipients`, where the whitelist takes it from, links sqlx.
//! No extension is removed: the stage names the user's mailbox, not an address of theirs.
//!
//! Nothing here runs the wallet as root: `pay` drops first, and refuses when it cannot.

use std::io::Read;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pepsi_conf::address::{Address, normalize_domain};
use pepsi_conf::privilege::{self, Account};

use crate::protocol::{Outcome, Request};

/// Accounts with a lower uid never pay (root never does), unless configured otherwise.
pub const DEFAULT_MIN_UID: u32 = 1000;
/// How long the wallet may take unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The PATH the wallet runs with.
pub const WALLET_PATH: &str = "/usr/bin:/bin";
/// How much of each of the wallet's outputs is kept; the rest is read and dropped, so a
/// talkative wallet never blocks on a full pipe.
pub const MAX_WALLET_OUTPUT: usize = 64 * 1024;
/// The longest part of the wallet's stderr an outcome carries.
pub const MAX_WALLET_MESSAGE: usize = 200;

/// What the program is allowed to do, fixed at start from `[pepsi-helper-auto-pay]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// WALLET split at white space; `None` when not configured.
    pub wallet: Option<Vec<String>>,
    /// MIN_UID.
    pub min_uid: u32,
    /// TIMEOUT.
    pub timeout: Duration,
    /// The local domains, normalized.
    pub local_domains: Vec<String>,
}

/// The account name `login` maps to under `local_domains` (normalized): its local part in
/// lower case, when the domain is local and the name one the password database may hold
/// (1 to 32 of `a-z 0-9 . _ -`, not starting with `-` or `.`).
pub fn account_name(login: &str, local_domains: &[String]) -> Result<String, String> {
    let (local, domain) = Address::parse(login)
        .map_err(|e| format!("login: {e}"))?
        .into_parts();
    if !local_domains.contains(&domain) {
        return Err(format!(
            "login {login}: {domain} is not a local domain ({})",
            if local_domains.is_empty() {
                "none configured: [pepsi] LOCAL_DOMAINS".to_owned()
            } else {
                local_domains.join(", ")
            }
        ));
    }
    let name = local.to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with(['-', '.'])
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if !valid {
        return Err(format!("login {login}: {name:?} is not an account name"));
    }
    Ok(name)
}

/// The local domains of a configuration's list, normalized (a name that is not a domain is
/// dropped).
pub fn normalize_domains(list: Vec<String>) -> Vec<String> {
    list.iter().filter_map(|d| normalize_domain(d)).collect()
}

/// The account that pays for `login`, or why there is none.
pub fn account_for(opts: &Options, login: &str) -> Result<Account, String> {
    let name = account_name(login, &opts.local_domains)?;
    let account = privilege::account(&name)
        .map_err(|e| format!("looking up account {name}: {e}"))?
        .ok_or_else(|| format!("no account {name}"))?;
    if account.uid == 0 || account.uid < opts.min_uid {
        return Err(format!(
            "account {name} has uid {}, below MIN_UID {}",
            account.uid, opts.min_uid
        ));
    }
    if account.gid == 0 {
        return Err(format!("account {name} has gid 0"));
    }
    if !account.home.is_absolute() {
        return Err(format!("account {name} has no absolute home directory"));
    }
    Ok(account)
}

/// The wallet's argument vector: WALLET's words with `%h` replaced by the home directory
/// and `%a` by the amount, then the URI as the last argument.
pub fn wallet_argv(words: &[String], home: &Path, amount: &str, uri: &str) -> Vec<String> {
    let home = home.to_string_lossy();
    words
        .iter()
        .map(|w| w.replace("%h", &home).replace("%a", amount))
        .chain(std::iter::once(uri.to_owned()))
        .collect()
}

/// Makes every uid and gid of this process the account's, with its gid as the only
/// supplementary group, and checks that root cannot be had back. Not running as root, the
/// process must already be the account. `Err` is the reason, for a refusal.
pub fn drop_to(account: &Account) -> Result<(), String> {
    if privilege::is_root() {
        privilege::become_ids(account.uid, account.gid).map_err(|e| {
            format!(
                "cannot become account {} (uid {}): {e}",
                account.name, account.uid
            )
        })?;
    }
    let (mut ruid, mut euid, mut suid) = (0, 0, 0);
    let (mut rgid, mut egid, mut sgid) = (0, 0, 0);
    // SAFETY: plain getters writing into our own variables.
    let ok = unsafe {
        libc::getresuid(&mut ruid, &mut euid, &mut suid) == 0
            && libc::getresgid(&mut rgid, &mut egid, &mut sgid) == 0
    };
    if !ok || [ruid, euid, suid] != [account.uid; 3] {
        return Err(format!(
            "running as uid {euid}, not as account {} (uid {}): only root may pay for another \
             account",
            account.name, account.uid
        ));
    }
    if [rgid, egid, sgid] != [account.gid; 3] {
        return Err(format!(
            "running as gid {egid}, not as account {}'s gid {}",
            account.name, account.gid
        ));
    }
    // SAFETY: both fail without effect when the process holds no privilege, as it must not.
    if unsafe { libc::setuid(0) == 0 || libc::setgid(0) == 0 } {
        return Err("root could be had back after dropping to the account".into());
    }
    Ok(())
}

/// The whole payment of `request`: the account, the drop, the home directory as the
/// working directory, the wallet.
pub fn pay(opts: &Options, request: &Request) -> Outcome {
    let account = match account_for(opts, &request.login) {
        Ok(a) => a,
        Err(e) => return Outcome::Refused(e),
    };
    let Some(words) = opts.wallet.as_ref().filter(|w| !w.is_empty()) else {
        return Outcome::Refused(format!(
            "no wallet configured ([{}] WALLET)",
            crate::constants::SECTION
        ));
    };
    if let Err(e) = drop_to(&account) {
        return Outcome::Refused(e);
    }
    if let Err(e) = std::env::set_current_dir(&account.home) {
        return Outcome::Refused(format!(
            "account {}'s home directory {}: {e}",
            account.name,
            account.home.display()
        ));
    }
    let argv = wallet_argv(words, &account.home, &request.amount, &request.uri);
    run_wallet(&argv, &account, opts.timeout)
}

/// Reads `pipe` to its end, keeping the first [`MAX_WALLET_OUTPUT`] bytes.
fn drain(mut pipe: impl Read + Send + 'static, tx: mpsc::Sender<Vec<u8>>) {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = MAX_WALLET_OUTPUT.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        let _ = tx.send(kept);
    });
}

/// The first line of the wallet's stderr that holds something, made printable and cut to
/// [`MAX_WALLET_MESSAGE`] characters.
pub fn first_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    match line {
        None => "(nothing on stderr)".to_owned(),
        Some(l) => l
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(MAX_WALLET_MESSAGE)
            .collect(),
    }
}

/// Runs the wallet (`argv`, as the current identity, which `drop_to` made the account's)
/// in a process group of its own, with an environment of HOME, USER, LOGNAME and PATH, no
/// input, and its output bounded; after `timeout` the group is killed.
pub fn run_wallet(argv: &[String], account: &Account, timeout: Duration) -> Outcome {
    let Some((program, args)) = argv.split_first() else {
        return Outcome::Refused("an empty wallet command".into());
    };
    let mut child = match Command::new(program)
        .args(args)
        .env_clear()
        .env("HOME", &account.home)
        .env("USER", &account.name)
        .env("LOGNAME", &account.name)
        .env("PATH", WALLET_PATH)
        .current_dir(&account.home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(format!("cannot start the wallet {program}: {e}")),
    };
    let deadline = Instant::now() + timeout;
    let group = child.id() as libc::pid_t;
    let (out_tx, out_rx) = mpsc::channel();
    let (err_tx, err_rx) = mpsc::channel();
    if let Some(p) = child.stdout.take() {
        drain(p, out_tx);
    }
    if let Some(p) = child.stderr.take() {
        drain(p, err_tx);
    }
    // SAFETY: a signal to the wallet's own process group; ESRCH once it is gone is ignored.
    let kill_group = || unsafe {
        libc::kill(-group, libc::SIGKILL);
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                kill_group();
                let _ = child.wait();
                return Outcome::Failed(format!("waiting for the wallet {program}: {e}"));
            }
        }
    };
    // What the wallet left running ends with it.
    kill_group();
    let Some(status) = status else {
        let _ = child.wait();
        return Outcome::Failed(format!(
            "the wallet {program} took longer than TIMEOUT ({}s) and was stopped",
            timeout.as_secs()
        ));
    };
    let wait = Duration::from_secs(1);
    let stdout = out_rx.recv_timeout(wait).unwrap_or_default();
    let stderr = err_rx.recv_timeout(wait).unwrap_or_default();
    if !stdout.is_empty() {
        tracing::debug!(
            "wallet output: {}",
            String::from_utf8_lossy(&stdout).trim_end()
        );
    }
    match (status.code(), status.signal()) {
        (Some(0), _) => Outcome::Paid,
        (Some(n), _) => Outcome::Failed(format!("wallet exited {n}: {}", first_line(&stderr))),
        (None, Some(s)) => Outcome::Failed(format!(
            "wallet killed by signal {s}: {}",
            first_line(&stderr)
        )),
        (None, None) => Outcome::Failed(format!("wallet ended with {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_map_to_account_names_table() {
        let local = normalize_domains(vec!["Example.ORG".into(), "bücher.example".into()]);
        for (login, want) in [
            ("alice@example.org", Ok("alice")),
            ("Alice@EXAMPLE.org.", Ok("alice")),
            ("bob.smith@bücher.example", Ok("bob.smith")),
            ("x_1-2@xn--bcher-kva.example", Ok("x_1-2")),
            (
                "alice@elsewhere.org",
                Err("not a local domain (example.org, xn--bcher-kva.example)"),
            ),
            ("alice", Err("no @")),
            ("alice+tag@example.org", Err("not an account name")),
            ("-rf@example.org", Err("not an account name")),
            (".x@example.org", Err("not an account name")),
            ("../etc@example.org", Err("not an account name")),
            ("\"a b\"@example.org", Err("not an account name")),
            ("ümlaut@example.org", Err("not an account name")),
        ] {
            match (account_name(login, &local), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{login}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{login}: {e}"),
                (got, want) => panic!("{login}: {got:?}, wanted {want:?}"),
            }
        }
        let e = account_name("alice@example.org", &[]).unwrap_err();
        assert!(e.contains("[pepsi] LOCAL_DOMAINS"), "{e}");
        let long = format!("{}@example.org", "a".repeat(33));
        assert!(account_name(&long, &local).is_err());
    }

    #[test]
    fn accounts_below_min_uid_and_unknown_ones_do_not_pay() {
        let opts = |min_uid| Options {
            wallet: None,
            min_uid,
            timeout: DEFAULT_TIMEOUT,
            local_domains: vec!["example.org".into()],
        };
        let e = account_for(&opts(0), "root@example.org").unwrap_err();
        assert!(e.contains("uid 0, below MIN_UID"), "{e}");
        let e = account_for(&opts(1000), "daemon@example.org").unwrap_err();
        assert!(e.contains("below MIN_UID 1000"), "{e}");
        let e = account_for(&opts(1000), "no-such-account-x@example.org").unwrap_err();
        assert_eq!(e, "no account no-such-account-x");
        let nobody = account_for(&opts(1000), "nobody@example.org").unwrap();
        assert_eq!(nobody.name, "nobody");
    }

    #[test]
    fn the_wallet_command_table() {
        let words = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let home = Path::new("/home/a b");
        for (wallet, want) in [
            (
                "taler-wallet-cli handle-uri --yes",
                vec![
                    "taler-wallet-cli",
                    "handle-uri",
                    "--yes",
                    "taler://pay/h/o/",
                ],
            ),
            (
                "taler-wallet-cli --wallet-db=%h/.talerwalletdb.json handle-uri --yes",
                vec![
                    "taler-wallet-cli",
                    "--wallet-db=/home/a b/.talerwalletdb.json",
                    "handle-uri",
                    "--yes",
                    "taler://pay/h/o/",
                ],
            ),
            (
                "/usr/local/bin/pay-at-most %a",
                vec![
                    "/usr/local/bin/pay-at-most",
                    "KUDOS:0.5",
                    "taler://pay/h/o/",
                ],
            ),
            ("w 100%", vec!["w", "100%", "taler://pay/h/o/"]),
        ] {
            assert_eq!(
                wallet_argv(&words(wallet), home, "KUDOS:0.5", "taler://pay/h/o/"),
                want,
                "{wallet}"
            );
        }
    }

    #[test]
    fn the_first_line_of_stderr_table() {
        let long = "x".repeat(1000);
        for (stderr, want) in [
            (&b""[..], "(nothing on stderr)".to_owned()),
            (b"\n\n  no money \nmore\n", "no money".to_owned()),
            (b"a\tb\x1b[31m\n", "a b [31m".to_owned()),
            (b"\xff\xfe bad\n", "\u{fffd}\u{fffd} bad".to_owned()),
            (long.as_bytes(), "x".repeat(MAX_WALLET_MESSAGE)),
        ] {
            assert_eq!(first_line(stderr), want, "{stderr:?}");
        }
    }
}
