//! pepsi-helper-dot-forward: reads system accounts' `~/.forward` files for
//! `pepsi-stage-dot-forward`, which keeps it running as a co-process and speaks the framed
//! protocol of [`protocol`] over its stdin and stdout.
//!
//! It is small on purpose: in production it is setuid root (mode 4750, group of the stage),
//! because a `.forward` in a home directory is readable by its account, not by Pepsi. It
//! reads each file as the account it belongs to ([`reader`]), never as root, and passes the
//! bytes on unparsed: what the lines mean is the stage's to decide. Started through its setuid
//! bit by another user, it reads `[helper-dot-forward]` from the system configuration with
//! an empty environment: it serves only the account named by CALLER (the dispatcher's,
//! whose stage workers run it), and the caller's `--min-uid` may only raise MIN_UID. The
//! stage that runs it is setgid, so any local user could start that with a configuration
//! of their own; the CALLER check is what keeps them from the files.
//!
//! It must never write anything but answers to stdout.

pub mod protocol;
pub mod reader;

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use pepsi_conf::config::Config;
use pepsi_conf::privilege;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "helper-dot-forward",
        exec: "pepsi-helper-dot-forward",
    };
    /// Where a setuid invocation reads its limits; `-c` and `PEPSI_CONFIG` do not apply.
    pub const SYSTEM_CONFIG: &str = "/etc/pepsi/pepsi.conf";
    /// The section holding those limits.
    pub const SECTION: &str = "helper-dot-forward";
}

const LONG_ABOUT: &str = "\
Reads the ~/.forward files of system accounts on behalf of pepsi-stage-dot-forward, which \
starts it once and keeps it as a co-process. Each request on standard input is one line, \
`forward <account>` (1 to 32 of a-z, 0-9, '.', '_', '-'), answered on standard output with \
one of:

    file <n>            followed by exactly n bytes: the file as stored
    none <text>         no such account, a uid below MIN_UID (root never), or no file
    unsafe <text>       a file that is not to be trusted, and so is ignored: not a regular
                        file, a symbolic link, owned by neither the account nor root,
                        writable by its group or anyone, or larger than 65536 bytes
    temp <4.x.y> <text> try later (an I/O error, a failed switch of identity)

The account is looked up in the system's password database and the file read is \
<home>/.forward. Running as root (the production install is setuid root, mode 4750, group of \
the stage), the file is opened as the account (its uid and primary group only), so the \
reader sees exactly what the account may read. Not running as root, it reads as itself. \
Started through its setuid bit by another user, it reads [helper-dot-forward] from \
/etc/pepsi/pepsi.conf with an empty environment: it refuses to start unless its real user is \
root, CALLER (default pepsi, the account the dispatcher and its stage workers run as) or a \
real member of its group, and \
--min-uid counts only when it is higher than MIN_UID (default 1000). \
A request that does not follow the protocol is answered `temp 4.3.0 protocol error: ...` and \
the program exits 2.

Exit status: 0 at end of input, 1 on a start-up error, 2 after a protocol error.";

#[derive(Debug, Parser)]
#[command(
    name = "pepsi-helper-dot-forward",
    version,
    about = "Pepsi's .forward reader: the co-process that reads ~/.forward as its account",
    long_about = LONG_ABOUT
)]
struct Cli {
    /// Accounts with a lower uid have no .forward (root never has one)
    #[arg(long, value_name = "UID", default_value_t = reader::DEFAULT_MIN_UID)]
    min_uid: u32,

    /// Log level or tracing filter for messages on stderr
    #[arg(
        short = 'L',
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info"
    )]
    log_level: String,
}

/// The command line of `pepsi-helper-dot-forward` as clap defines it: its `--help` and its
/// manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-helper-dot-forward` binary.
pub fn run() -> ExitCode {
    // Nothing from the caller's environment may reach logging or the configuration.
    let setuid = privilege::scrub_if_setuid();
    let cli = Cli::parse();
    pepsi_conf::cli::init_logging(&constants::CONFIG_SOURCE, &cli.log_level);
    let mut opts = reader::Options {
        min_uid: cli.min_uid,
    };
    if setuid {
        let cfg = match Config::load(Path::new(constants::SYSTEM_CONFIG)) {
            Ok(c) => c,
            Err(e) => return fail(&format!("{e}")),
        };
        match narrow(
            &cfg,
            opts,
            &privilege::RealIds::current(),
            privilege::own_group(),
        ) {
            Ok(o) => opts = o,
            Err(e) => return fail(&e),
        }
    }
    serve(&opts, std::io::stdin().lock(), std::io::stdout().lock())
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("{}: {msg}", constants::CONFIG_SOURCE.exec);
    ExitCode::from(1)
}

/// Applies the system configuration to a setuid invocation by `ids`: only root, `CALLER`
/// (default `pepsi`) or a real member of the reader's group may use it, and `MIN_UID`
/// (default 1000) holds unless the caller asked for a higher one.
pub fn narrow(
    cfg: &Config,
    opts: reader::Options,
    ids: &privilege::RealIds,
    group: Option<u32>,
) -> Result<reader::Options, String> {
    let section = cfg.section(constants::SECTION);
    privilege::check_configured_caller(cfg, constants::SECTION, ids, group)?;
    let floor = section
        .parse_opt("MIN_UID", |v| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| "a uid (a whole number)".to_owned())
        })
        .map_err(|e| e.to_string())?
        .unwrap_or(reader::DEFAULT_MIN_UID);
    Ok(reader::Options {
        min_uid: opts.min_uid.max(floor),
    })
}

/// The request loop: one answer per request, flushed at once.
pub fn serve<R: BufRead, W: Write>(
    opts: &reader::Options,
    mut input: R,
    mut output: W,
) -> ExitCode {
    loop {
        let (reply, stop) = match protocol::read_request(&mut input) {
            Ok(None) => return ExitCode::SUCCESS,
            Ok(Some(account)) => {
                let reply = reader::read_forward(opts, &account);
                match &reply {
                    protocol::Reply::File(b) => {
                        tracing::debug!(%account, bytes = b.len(), ".forward read")
                    }
                    protocol::Reply::None(why) => tracing::debug!(%account, "{why}"),
                    protocol::Reply::Unsafe(why) => {
                        tracing::warn!(%account, ".forward ignored: {why}")
                    }
                    protocol::Reply::Temp { text, .. } => tracing::error!(%account, "{text}"),
                }
                (reply, false)
            }
            Err(e) => {
                tracing::error!("protocol error: {e}");
                (
                    protocol::Reply::temp("4.3.0", format!("protocol error: {e}")),
                    true,
                )
            }
        };
        if output
            .write_all(&reply.encode())
            .and_then(|_| output.flush())
            .is_err()
        {
            return ExitCode::from(1);
        }
        if stop {
            return ExitCode::from(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> privilege::RealIds {
        privilege::RealIds {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// A setuid invocation never goes below the system configuration's MIN_UID.
    #[test]
    fn the_caller_may_only_raise_min_uid() {
        let cfg = |t: &str| Config::from_str_named(t, "pepsi.conf").unwrap();
        let asked = |min_uid| reader::Options { min_uid };
        let s = "[helper-dot-forward]\n";
        assert_eq!(
            narrow(&cfg(s), asked(0), &root(), None).unwrap(),
            asked(1000)
        );
        assert_eq!(
            narrow(&cfg(s), asked(5000), &root(), None).unwrap(),
            asked(5000)
        );
        let two = cfg("[helper-dot-forward]\nMIN_UID = 2000\n");
        assert_eq!(
            narrow(&two, asked(100), &root(), None).unwrap(),
            asked(2000)
        );
        let bad = cfg("[helper-dot-forward]\nMIN_UID = many\n");
        let e = narrow(&bad, asked(0), &root(), None).unwrap_err();
        assert!(e.contains("MIN_UID") && e.contains("many"), "{e}");
    }

    /// Only CALLER (or root, or a real member of the reader's group) may use a setuid
    /// reader: another user who starts the setgid stage with a configuration of their own
    /// is refused.
    #[test]
    fn only_the_caller_account_may_use_the_reader() {
        let cfg = Config::from_str_named("[helper-dot-forward]\nCALLER = nobody\n", "pepsi.conf")
            .unwrap();
        let opts = reader::Options { min_uid: 1000 };
        let nobody = reader::account("nobody")
            .unwrap()
            .expect("the nobody account");
        let ids = |uid| privilege::RealIds {
            uid,
            gid: 4242,
            groups: Vec::new(),
        };
        assert!(narrow(&cfg, opts.clone(), &ids(nobody.uid), None).is_ok());
        let e = narrow(&cfg, opts.clone(), &ids(nobody.uid + 1), None).unwrap_err();
        assert!(e.contains("CALLER nobody"), "{e}");
        // The default CALLER is pepsi, which need not exist here: an error either way.
        let none = Config::from_str_named("[pepsi]\n", "pepsi.conf").unwrap();
        let e = narrow(&none, opts, &ids(nobody.uid + 1), None).unwrap_err();
        assert!(e.contains("CALLER pepsi"), "{e}");
    }

    /// A garbled request ends the conversation after a temp answer.
    #[test]
    fn a_protocol_error_is_answered_then_the_reader_exits() {
        let opts = reader::Options { min_uid: 1000 };
        let mut out = Vec::new();
        let code = serve(
            &opts,
            &b"forward no-such-account-x\nhello\nforward root\n"[..],
            &mut out,
        );
        assert_eq!(code, ExitCode::from(2));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("none no account"), "{text}");
        assert!(lines[1].starts_with("temp 4.3.0 protocol error"), "{text}");
    }
}
