//! pepsi-helper-mailbox-scan: reads a Maildir and prints, in the lines of [`protocol`], the
//! addresses its owner wrote to (its sent folders) and answered (messages flagged replied).
//! `pepsi-whitelist learn` runs it as the mailbox's owner, having dropped its own privilege
//! first, and adds what it prints to the owner's whitelist.
//!
//! It carries no permission bit and needs none: it reads what the user running it may read,
//! and it writes nothing but its findings to standard output.

pub mod protocol;
pub mod scan;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "helper-mailbox-scan",
        exec: "pepsi-helper-mailbox-scan",
    };
}

const LONG_ABOUT: &str = "\
Reads a Maildir and prints whom its owner trusts: the addresses of the To, Cc and Bcc fields \
of the messages in its sent folders, and the From address of every message flagged replied \
(R in a cur/ file name) in the inbox and the other folders. Junk, Spam, Trash, Deleted \
Messages and Drafts are not read. pepsi-whitelist learn runs it as the mailbox's owner and \
adds what it prints to that mailbox's whitelist; it can be run by hand to see what would be \
learnt.

Output, one line each, every address in lower case and printed once per kind:

    sent <address>        the owner wrote to this address
    replied <address>     the owner answered mail from this address
    done <read> <skipped> last: messages read, and messages not read (past --max-messages,
                          or unreadable)

Only the newest --max-messages messages are read (by modification time), at most 64 KiB of \
each, and at most --max-findings addresses are printed. Message files are opened only when \
they are regular files, never through a symbolic link.

Exit status: 0 after the `done` line, 1 when the Maildir cannot be read, 2 on a usage error.";

#[derive(Debug, Parser)]
#[command(
    name = "pepsi-helper-mailbox-scan",
    version,
    about = "Prints the addresses a Maildir's owner wrote to and replied to",
    long_about = LONG_ABOUT
)]
struct Cli {
    /// The Maildir (the directory holding cur/, new/, tmp/ and the .Folder subdirectories)
    maildir: PathBuf,

    /// A sent folder, by its Maildir++ name without the leading dot (repeat for several;
    /// default: Sent, Sent Messages, Sent Items, INBOX.Sent)
    #[arg(long = "sent-folder", value_name = "NAME")]
    sent_folders: Vec<String>,

    /// Read at most this many messages, the newest first
    #[arg(long, value_name = "N", default_value_t = 20_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_messages: u32,

    /// Print at most this many addresses
    #[arg(long, value_name = "N", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_findings: u32,
}

/// The command line of `pepsi-helper-mailbox-scan` as clap defines it: its `--help` and its
/// manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-helper-mailbox-scan` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let mut opts = scan::Options {
        max_messages: cli.max_messages as usize,
        max_findings: cli.max_findings as usize,
        ..scan::Options::default()
    };
    if !cli.sent_folders.is_empty() {
        opts.sent_folders = cli.sent_folders;
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = scan::scan(&cli.maildir, &opts, &mut |f| {
        out.write_all(f.line().as_bytes())
    })
    .and_then(|()| out.flush());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {e}", constants::CONFIG_SOURCE.exec);
            ExitCode::from(1)
        }
    }
}
