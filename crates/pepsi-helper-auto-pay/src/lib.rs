//! pepsi-helper-auto-pay: pays the GNU Taler postage a recipient's secretary asks of a
//! user's outgoing mail, as that user, with that user's own wallet program, for
//! `pepsi-stage-auto-pay`. The stage starts it once per payment, writes one request line
//! ([`protocol::Request`]) and reads one outcome line ([`protocol::Outcome`]); [`client`] is
//! the stage's end.
//!
//! It is small on purpose: in production it is setuid root (mode 4750, group
//! `pepsi-auto-pay`, the group the stage is set-group-id to), because the wallet and its
//! money are the user's and only root can become the user. As root it only reads the
//! configuration and the one request and looks the account up; then it becomes the
//! account for good (uid, gid, no other group: [`payer::drop_to`]) before anything else,
//! so the wallet, its files and the waiting for it are the user's, never root's. Started
//! through its setuid bit by another user, it reads `[pepsi-helper-auto-pay]` from
//! `/etc/pepsi/pepsi.conf` with an empty environment and serves only root, CALLER (default
//! `pepsi`, the dispatcher's account whose stage workers run it) and real members of its
//! group: anyone may run the setgid stage with a configuration of their own, and the
//! CALLER check is what keeps them from paying with another user's wallet.
//!
//! It must never write anything but the one outcome line to stdout, and never run the
//! wallet as root.

pub mod client;
pub mod payer;
pub mod protocol;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use pepsi_conf::config::Config;
use pepsi_conf::privilege;

use crate::protocol::{MAX_REQUEST_LINE, Outcome, Request};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "helper-auto-pay",
        exec: "pepsi-helper-auto-pay",
    };
    /// Where a setuid invocation reads its configuration; `-c` and `PEPSI_CONFIG` do not
    /// apply.
    pub const SYSTEM_CONFIG: &str = "/etc/pepsi/pepsi.conf";
    /// The section of its options.
    pub const SECTION: &str = "pepsi-helper-auto-pay";
}

const LONG_ABOUT: &str = "\
Pays a GNU Taler postage as a user, with the user's own wallet, on behalf of \
pepsi-stage-auto-pay, which starts it once per payment. It reads one request line on standard \
input:

    pay <login> <amount> <uri>

where <login> is the user's mail address (at most 254 bytes, no spaces), <amount> is \
CURRENCY:VALUE (the amount the stage checked against the user's limits) and <uri> a \
taler://pay/ URI of at most 2000 printable ASCII characters; and writes one line on standard \
output:

    paid                the wallet ran as the user and exited 0
    refused <text>      it did not try: a malformed or too long request, a login whose \
domain is not local, no such account, a uid below MIN_UID (root never), no WALLET configured, \
a home directory it cannot enter
    failed <text>       the wallet ran and did not pay: `wallet exited N: <the first line of \
its stderr>`, killed by a signal, or stopped after TIMEOUT

The login's local part, in lower case, is the account's name in the system's password \
database, and its domain must be one of the local domains (LOCAL_DOMAINS of the section, \
else of [pepsi]). Running as root (the production install is setuid root, mode 4750, group \
pepsi-auto-pay), it becomes the account for good before running anything: its uid and gid as \
real, effective and saved ids, its gid as the only group. Not running as root it pays only \
for the account it runs as. The wallet runs in the account's home directory with only HOME, \
USER, LOGNAME and PATH=/usr/bin:/bin in its environment, no input, its output read and \
bounded (64 KiB kept), in a process group of its own that is killed after TIMEOUT.

Options of [pepsi-helper-auto-pay]:

    WALLET          the wallet command, split at white space and run without a shell, the \
URI appended as its last argument; %h is replaced by the home directory and %a by the amount \
(e.g. `taler-wallet-cli --wallet-db=%h/.talerwalletdb.json handle-uri --yes`). Without it \
every request is refused.
    MIN_UID         accounts with a lower uid never pay (default 1000; root never)
    TIMEOUT         how long the wallet may take (default 60s, 1s to 10m)
    LOCAL_DOMAINS   the domains whose addresses are accounts' (default [pepsi] LOCAL_DOMAINS)
    CALLER          the account allowed to run it through its setuid bit (default pepsi)

Started through its setuid bit by another user, it reads /etc/pepsi/pepsi.conf with an empty \
environment (-c is refused) and refuses to start unless its real user is root, CALLER or a \
real member of its group. Not started through its bit, it reads -c, else $PEPSI_CONFIG, else \
/etc/pepsi/pepsi.conf.

Exit status: 0 after an outcome line, 1 on a start-up error (nothing on standard output), 2 \
after refusing a request that does not follow the protocol.";

#[derive(Debug, Parser)]
#[command(
    name = "pepsi-helper-auto-pay",
    version,
    about = "Pepsi's postage payer: pays a taler://pay/ URI as the user, with the user's wallet",
    long_about = LONG_ABOUT
)]
struct Cli {
    /// Configuration file, when not started through the setuid bit (default: $PEPSI_CONFIG,
    /// else /etc/pepsi/pepsi.conf)
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Log level or tracing filter for messages on stderr
    #[arg(
        short = 'L',
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info"
    )]
    log_level: String,
}

/// The command line of `pepsi-helper-auto-pay` as clap defines it: its `--help` and its
/// manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The longest TIMEOUT taken.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The options of `[pepsi-helper-auto-pay]` in `cfg`, checked.
pub fn options(cfg: &Config) -> Result<payer::Options, String> {
    let s = cfg.section(constants::SECTION);
    let wallet = s
        .string_opt("WALLET")
        .map_err(|e| e.to_string())?
        .map(|w| w.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|w| !w.is_empty());
    let min_uid = s
        .parse_opt("MIN_UID", |v| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| "a uid (a whole number)".to_owned())
        })
        .map_err(|e| e.to_string())?
        .unwrap_or(payer::DEFAULT_MIN_UID);
    let timeout = s
        .duration_opt("TIMEOUT")
        .map_err(|e| e.to_string())?
        .unwrap_or(payer::DEFAULT_TIMEOUT);
    if timeout < std::time::Duration::from_secs(1) || timeout > MAX_TIMEOUT {
        return Err(format!(
            "[{}] TIMEOUT {timeout:?}: must be 1s to 10m",
            constants::SECTION
        ));
    }
    let domains = s
        .or_global()
        .list_opt("LOCAL_DOMAINS")
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    Ok(payer::Options {
        wallet,
        min_uid,
        timeout,
        local_domains: payer::normalize_domains(domains),
    })
}

/// The configuration of this run: the system's when started through the setuid bit (and
/// then only for an allowed caller), else the one `-c` names.
fn configuration(setuid: bool, explicit: Option<&Path>) -> Result<Config, String> {
    if !setuid {
        return Config::load_default(explicit).map_err(|e| e.to_string());
    }
    if explicit.is_some() {
        return Err(format!(
            "-c/--config: started through its setuid bit, it reads {} only",
            constants::SYSTEM_CONFIG
        ));
    }
    let cfg = Config::load(Path::new(constants::SYSTEM_CONFIG)).map_err(|e| e.to_string())?;
    privilege::check_configured_caller(
        &cfg,
        constants::SECTION,
        &privilege::RealIds::current(),
        privilege::own_group(),
    )?;
    Ok(cfg)
}

/// Entry point of the `pepsi-helper-auto-pay` binary.
pub fn run() -> ExitCode {
    // Nothing from the caller's environment may reach logging, the configuration or the
    // wallet.
    let setuid = privilege::scrub_if_setuid();
    let cli = Cli::parse();
    pepsi_conf::cli::init_logging(&constants::CONFIG_SOURCE, &cli.log_level);
    let opts = match configuration(setuid, cli.config.as_deref()).and_then(|c| options(&c)) {
        Ok(o) => o,
        Err(e) => return fail(&e),
    };
    let (outcome, code) = match read_request(&mut std::io::stdin().lock()) {
        Ok(request) => {
            let outcome = payer::pay(&opts, &request);
            match &outcome {
                Outcome::Paid => {
                    tracing::info!(login = %request.login, amount = %request.amount, "paid")
                }
                Outcome::Refused(why) => tracing::warn!(login = %request.login, "refused: {why}"),
                Outcome::Failed(why) => tracing::warn!(login = %request.login, "failed: {why}"),
            }
            (outcome, ExitCode::SUCCESS)
        }
        Err(e) => {
            tracing::error!("protocol error: {e}");
            (
                Outcome::Refused(format!("protocol error: {e}")),
                ExitCode::from(2),
            )
        }
    };
    let mut out = std::io::stdout().lock();
    if out
        .write_all(outcome.to_line().as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        return ExitCode::from(1);
    }
    code
}

/// The one request on `input`: a line of at most [`MAX_REQUEST_LINE`] bytes, checked.
pub fn read_request(input: &mut impl std::io::BufRead) -> Result<Request, String> {
    match pepsi_conf::coprocess::read_line(input, MAX_REQUEST_LINE) {
        Ok(Some(line)) => Request::parse(&line),
        Ok(None) => Err("no request: the input was empty".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("{}: {msg}", constants::CONFIG_SOURCE.exec);
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "pepsi.conf").unwrap()
    }

    #[test]
    fn options_table() {
        let o = options(&cfg("[pepsi]\nLOCAL_DOMAINS = Example.ORG, b.test\n")).unwrap();
        assert_eq!(
            o,
            payer::Options {
                wallet: None,
                min_uid: 1000,
                timeout: std::time::Duration::from_secs(60),
                local_domains: vec!["example.org".into(), "b.test".into()],
            }
        );
        let o = options(&cfg(
            "[pepsi]\nLOCAL_DOMAINS = a.test\n[pepsi-helper-auto-pay]\n\
             WALLET = taler-wallet-cli  handle-uri --yes\nMIN_UID = 2000\nTIMEOUT = 5s\n\
             LOCAL_DOMAINS = c.test\n",
        ))
        .unwrap();
        assert_eq!(
            o.wallet.as_deref(),
            Some(&["taler-wallet-cli", "handle-uri", "--yes"].map(String::from)[..])
        );
        assert_eq!(
            (o.min_uid, o.timeout, o.local_domains),
            (
                2000,
                std::time::Duration::from_secs(5),
                vec!["c.test".into()]
            )
        );
        assert_eq!(
            options(&cfg("[pepsi-helper-auto-pay]\nWALLET =  \n"))
                .unwrap()
                .wallet,
            None
        );
        for (text, want) in [
            ("MIN_UID = many", "MIN_UID"),
            ("TIMEOUT = 0s", "TIMEOUT"),
            ("TIMEOUT = 1h", "TIMEOUT"),
            ("TIMEOUT = soon", "TIMEOUT"),
        ] {
            let e = options(&cfg(&format!("[pepsi-helper-auto-pay]\n{text}\n"))).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// Only CALLER (or root, or a real member of the group) may use a setuid payer.
    #[test]
    fn only_the_caller_account_may_use_the_payer() {
        let c = cfg("[pepsi-helper-auto-pay]\nCALLER = nobody\n");
        let nobody = privilege::account("nobody").unwrap().expect("nobody");
        let ids = |uid| privilege::RealIds {
            uid,
            gid: 4242,
            groups: Vec::new(),
        };
        let check = |uid, group| {
            privilege::check_configured_caller(&c, constants::SECTION, &ids(uid), group)
        };
        assert!(check(nobody.uid, None).is_ok());
        assert!(check(0, None).is_ok());
        assert!(check(nobody.uid + 1, Some(4242)).is_ok());
        let e = check(nobody.uid + 1, None).unwrap_err();
        assert!(e.contains("[pepsi-helper-auto-pay] CALLER nobody"), "{e}");
    }

    #[test]
    fn a_request_is_one_bounded_line() {
        let line = "pay alice@example.org KUDOS:1 taler://pay/h/o/\n";
        assert_eq!(
            read_request(&mut line.as_bytes()).unwrap().login,
            "alice@example.org"
        );
        let e = read_request(&mut "".as_bytes()).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let long = format!("pay a@b.test KUDOS:1 taler://pay/{}\n", "x".repeat(3000));
        let e = read_request(&mut long.as_bytes()).unwrap_err();
        assert!(e.contains("longer than"), "{e}");
        let e = read_request(&mut "pay a@b.test KUDOS:1 taler://pay/h/o/".as_bytes()).unwrap_err();
        assert!(e.contains("ended inside a line"), "{e}");
    }
}
