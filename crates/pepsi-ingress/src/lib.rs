//! pepsi-ingress: the SMTP and submission server, where mail enters Pepsi.
//!
//! Reads: the `[pepsi-ingress]` and `[listener-<name>]` sections (listeners from the file
//! only), `pepsi.mailbox_account` / `pepsi.mailbox_password` for AUTH and the recipient
//! check. Writes: each accepted message through `pepsi.workqueue_add`, or with the messages
//! of other sessions that finished meanwhile through one `pepsi.workqueue_add_batch`
//! (`admission`; stage `init`, status `pending`), and, after commit, a coalesced
//! `workqueue` notification.
//! It must never reply 250 to a message before its row has committed, and never notify
//! inside the admission transaction.
//!
//! Layout: the protocol itself (parsing, replies, the data scanner) is `pepsi_smtp`'s;
//! here `session` (the state machine,
//! one file per verb), `server` (listeners, limits, signals), `verify` (SPF, DKIM, DMARC,
//! ARC, iprev), `headers` (Received, forged Authentication-Results), `admission` (group admission over `pepsi_contract::db::admit`), `wake`,
//! `accounts`, `relay`, `tls`, `limits`, `config`.

pub mod accounts;
pub mod admission;
pub mod config;
pub mod headers;
pub mod inflow;
pub mod limits;
pub mod recipients;
pub mod relay;
pub mod sender;
pub mod server;
pub mod session;
pub mod shared;
pub mod stats;
pub mod tls;
pub mod verify;
pub mod wake;

use std::process::ExitCode;

use clap::Parser;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "ingress",
        exec: "pepsi-ingress",
    };
}

const LONG_ABOUT: &str = "\
Accepts mail over SMTP (RFC 5321) on the listeners of the configuration and stores each \
accepted message in the Pepsi work queue at stage init, status pending, where the \
dispatcher picks it up. A message is answered with 250 only after its row has committed.

Each [listener-<name>] section opens one socket with a ROLE: mx (mail from other servers: \
local domains only, STARTTLS offered, SPF/DKIM/DMARC/ARC/iprev checked), submission \
(STARTTLS, AUTH required) or submissions (implicit TLS, AUTH required). Listener sections \
are read from the configuration file only, never from the database overlay. Options shared \
by all listeners live in [pepsi-ingress]; docs/ingress.md describes every one of them and \
the mailbox account store AUTH checks against.

Extensions: PIPELINING, SIZE, 8BITMIME, SMTPUTF8, ENHANCEDSTATUSCODES, DSN, CHUNKING \
(BDAT), STARTTLS, AUTH PLAIN LOGIN. Message data must use CRLF line ends; bare CR or LF \
is refused (SMTP smuggling), and input pipelined behind STARTTLS is discarded.";

const AFTER_HELP: &str = "\
SIGNALS:
  SIGHUP           re-read every listener's TLS_CERT and TLS_KEY; a failed reload keeps
                   the old certificate and logs why
  SIGTERM, SIGINT  stop accepting; idle sessions get 421 4.3.2; sessions in DATA may
                   finish within [pepsi-ingress] SHUTDOWN_GRACE, then are dropped (a
                   dropped message is never half stored)

FILES:
  /etc/pepsi/pepsi.conf   the configuration (or -c FILE, or $PEPSI_CONFIG)

EXIT STATUS:
  0  stopped by a signal after a clean shutdown, or --check-config found no fault
  1  configuration error, a listener could not bind, or the database is unreachable

EXAMPLE:
  [listener-mx]
  ROLE    = mx
  ADDRESS = 0.0.0.0:25
  TLS_CERT = /etc/pepsi/tls/mx.pem
  TLS_KEY  = /etc/pepsi/tls/mx.key

SEE ALSO:
  docs/ingress.md, docs/configuration.md, docs/state.md, pepsi-setup(1), pepsi-dispatch(1)";

/// The Pepsi SMTP ingress.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-ingress",
    version,
    about = "Pepsi's SMTP and submission server: admits mail into the work queue",
    long_about = LONG_ABOUT,
    after_long_help = AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    /// Read and validate the configuration (listeners, limits, certificates), then exit
    /// without binding a socket or connecting to the database
    #[arg(long)]
    check_config: bool,
}

/// The command line of `pepsi-ingress` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-ingress` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let config = cli.common.load_config()?;
        if cli.check_config {
            let settings = config::Options::from_config(&config)?;
            for l in &settings.listeners {
                if let Some(files) = &l.tls {
                    tls::TlsHandle::load(files)
                        .map_err(|e| e.context(format!("[listener-{}]", l.name)))?;
                }
            }
            eprintln!(
                "configuration ok: {} listener(s): {}",
                settings.listeners.len(),
                settings
                    .listeners
                    .iter()
                    .map(|l| format!("{} ({} on {})", l.name, l.role.as_str(), l.address))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Ok(ExitCode::SUCCESS);
        }
        server::serve(config).await?;
        Ok(ExitCode::SUCCESS)
    })
}
