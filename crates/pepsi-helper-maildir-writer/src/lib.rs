//! pepsi-helper-maildir-writer: writes messages into Maildirs for
//! `pepsi-stage-relay-to-maildir`, which keeps it running as a co-process and speaks the
//! framed protocol of [`protocol`] over its stdin and stdout.
//!
//! It is small on purpose: in production it is setuid root, and it trusts nothing from the
//! stage beyond what it must. Every mailbox path must resolve under the root directory;
//! writes run as the owner of the Maildir (or of the directory above it when creating it),
//! never as root unless the configuration allows it ([`privilege`]). Started by another user
//! through its setuid bit, it reads its limits from the system configuration
//! (`/etc/pepsi/pepsi.conf`, `[helper-maildir-writer]`) with an empty environment, and the
//! caller's options may only narrow them. Not running as root, it simply writes as itself.
//!
//! It must never write anything but reply lines to stdout, and never write a partial file
//! into `new/`.

pub mod client;
pub mod fsat;
pub mod keyindex;
pub mod maildir;
/// The owner switch, shared with the `.forward` reader.
pub use pepsi_conf::privilege;
pub mod protocol;
pub mod quota;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use pepsi_conf::config::Config;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "helper-maildir-writer",
        exec: "pepsi-helper-maildir-writer",
    };
    /// Where a setuid invocation reads its limits; `-c` and `PEPSI_CONFIG` do not apply.
    pub const SYSTEM_CONFIG: &str = "/etc/pepsi/pepsi.conf";
    /// The section holding those limits.
    pub const SECTION: &str = "helper-maildir-writer";
}

const LONG_ABOUT: &str = "\
Writes messages into Maildirs on behalf of pepsi-stage-relay-to-maildir, which starts it once \
and keeps it as a co-process. Each delivery on standard input is eight lines and the message:

    mailbox <absolute path of the Maildir>
    return-path <envelope sender, empty for the null sender>
    delivered-to <envelope recipient>
    key <queue row> <its received_at in microseconds>, or empty
    quota <bytes, 0 for none>
    quota-messages <messages, 0 for none>
    dir-sync <now or later>
    size <message length in bytes>
    <exactly that many bytes>

and each is answered with one line on standard output: `ok <file name in new/>`, \
`perm <5.x.y> <text>` (will not succeed on retry: no such mailbox 5.1.1, mailbox full 5.2.2) \
or `temp <4.x.y> <text>` (try later: I/O errors, permissions, a refused path). With a quota \
(either limit) the Maildir++ file maildirsize is kept, as Dovecot's maildir quota reads it: \
rebuilt from cur/ and new/ of the inbox and every .Folder when missing, defining other limits, \
longer than 5120 octets or, before refusing, older than 15 minutes, and one line appended per \
delivery; the answer is then `ok <name> <bytes> <messages>` (the usage after it) or `full \
<bytes> <messages> <text>` when the message does not fit. The request `usage <Maildir>`, \
`quota <bytes>`, `quota-messages <n>`, `rebuild yes|no` (four lines) is answered `usage \
<bytes> <messages>`. The stored \
copy is `Return-Path: <sender>` and `Delivered-To: <recipient>` followed by the message, \
written to tmp/, synced, renamed into new/ and, with `dir-sync now`, the directory synced \
before the answer. With `dir-sync later` the directory is synced at the next request `sync` \
(one line), answered `ok synced <n>` once every new/ written since the previous one is synced \
(or `temp 4.3.0 <text>` naming the directory that failed): the stage sends it before it \
records a round of deliveries, so a round costs one directory sync per Maildir. With a key, \
the file is named <secs>.M<usecs>W<row>K<hash of the recipient>.<host>,S=<size>: a delivery \
asked again (after a crash before the stage recorded it) finds its copy in new/ or cur/ and \
answers ok with its name without storing a second one (nor counting it again in maildirsize); \
a complete copy left in tmp/ is synced and renamed, a partial one written again. Whether new/ \
and cur/ hold the copy is answered from an index of the keyed names in them, read once per \
directory and kept current by inotify whoever changes it (--key-index-dirs, on local \
filesystems only; elsewhere, and after a lost inotify event, both are read for the delivery). A request that \
does not follow the protocol is answered with `temp 4.3.0 protocol error: ...` and the program \
exits 2.

Every mailbox must resolve, symlinks followed, to a path under --root; `.` and `..` \
components are refused, and so is a symbolic link inside the root's tree that neither root \
nor this program's real user owns (a mailbox owner's link would pick another owner's \
Maildir). The path is walked one directory at a time from open descriptors (openat with \
O_NOFOLLOW); the owner is read from the descriptor of the Maildir reached and every file is \
opened, renamed and created relative to it, so swapping a directory for a link after the \
check redirects nothing. Directories made under --create are fsynced into their parents. Running as root (the production install is setuid root, mode 4750, \
group of the stage), each write runs as the owner of the Maildir (seteuid/setegid with that \
owner's group only), and a Maildir owned by root is refused unless --allow-root-owner. Not \
running as root, it writes as itself. Started through its setuid bit by another user, it \
reads ROOT, CREATE_MAILDIR, ALLOW_ROOT_OWNER and CALLER from [helper-maildir-writer] in \
/etc/pepsi/pepsi.conf with an empty environment: it refuses to start unless its real user is \
root, CALLER (default pepsi, the account the dispatcher and its stage workers run as) or a \
real member of its group; --root must lie inside ROOT, and --create and --allow-root-owner \
count only when the file allows them.

Exit status: 0 at end of input, 1 on a start-up error, 2 after a protocol error.";

#[derive(Debug, Parser)]
#[command(
    name = "pepsi-helper-maildir-writer",
    version,
    about = "Pepsi's Maildir writer: the co-process that stores messages as the mailbox owner",
    long_about = LONG_ABOUT
)]
struct Cli {
    /// Directory every mailbox must lie under (symlinks resolved)
    #[arg(long, value_name = "DIR")]
    root: PathBuf,

    /// Create a missing Maildir (and the directories above it, under the root) as the owner
    /// of the nearest existing directory above it
    #[arg(long)]
    create: bool,

    /// Running as root, write into Maildirs owned by root (refused otherwise)
    #[arg(long)]
    allow_root_owner: bool,
    /// Keep an index (inotify) of the keyed copies in at most N new/ and cur/ directories
    /// written into, so a keyed delivery reads neither directory; 0 reads both for every
    /// keyed delivery
    #[arg(long, value_name = "N", default_value_t = keyindex::DEFAULT_DIRS as u32,
          value_parser = clap::value_parser!(u32).range(0..=keyindex::MAX_DIRS as i64))]
    key_index_dirs: u32,

    /// Log level or tracing filter for messages on stderr
    #[arg(
        short = 'L',
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info"
    )]
    log_level: String,
}

/// The command line of `pepsi-helper-maildir-writer` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-helper-maildir-writer` binary.
pub fn run() -> ExitCode {
    // Nothing from the caller's environment may reach path expansion or logging.
    let setuid = privilege::scrub_if_setuid();
    let cli = Cli::parse();
    pepsi_conf::cli::init_logging(&constants::CONFIG_SOURCE, &cli.log_level);
    let mut opts = maildir::Options {
        root: cli.root,
        create: cli.create,
        allow_root_owner: cli.allow_root_owner,
        key_index_dirs: cli.key_index_dirs as usize,
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
    let mut writer = match maildir::Writer::new(opts) {
        Ok(w) => w,
        Err(e) => return fail(&e.to_string()),
    };
    serve(
        &mut writer,
        std::io::stdin().lock(),
        std::io::stdout().lock(),
    )
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("{}: {msg}", constants::CONFIG_SOURCE.exec);
    ExitCode::from(1)
}

/// Applies the system configuration's limits to a setuid invocation by `ids`: only root,
/// `CALLER` (default `pepsi`) or a real member of the writer's group (an operator running
/// pepsi-quota) may use it, and the caller's options may only narrow what the file allows.
pub fn narrow(
    cfg: &Config,
    mut opts: maildir::Options,
    ids: &privilege::RealIds,
    group: Option<u32>,
) -> Result<maildir::Options, String> {
    let section = cfg.section(constants::SECTION);
    let err = |e: pepsi_conf::config::ConfigError| e.to_string();
    privilege::check_configured_caller(cfg, constants::SECTION, ids, group)?;
    let trusted = section.path("ROOT").map_err(err)?;
    let trusted = std::fs::canonicalize(&trusted)
        .map_err(|e| format!("[{}] ROOT {}: {e}", constants::SECTION, trusted.display()))?;
    let asked = std::fs::canonicalize(&opts.root)
        .map_err(|e| format!("--root {}: {e}", opts.root.display()))?;
    if !asked.starts_with(&trusted) {
        return Err(format!(
            "--root {} is outside [{}] ROOT {}",
            asked.display(),
            constants::SECTION,
            trusted.display()
        ));
    }
    opts.root = asked;
    opts.create &= section
        .bool_opt("CREATE_MAILDIR")
        .map_err(err)?
        .unwrap_or(false);
    opts.allow_root_owner &= section
        .bool_opt("ALLOW_ROOT_OWNER")
        .map_err(err)?
        .unwrap_or(false);
    Ok(opts)
}

/// The request loop: one reply line per request, flushed at once.
pub fn serve<R: BufRead, W: Write>(
    writer: &mut maildir::Writer,
    mut input: R,
    mut output: W,
) -> ExitCode {
    loop {
        let (reply, stop) = match protocol::read_command(&mut input) {
            Ok(None) => {
                // Nothing waits on a sync the stage did not ask for, but nothing is lost by
                // making the renames durable on the way out either.
                if writer.unsynced() > 0 {
                    let _ = writer.sync();
                }
                return ExitCode::SUCCESS;
            }
            Ok(Some(protocol::Command::Sync)) => {
                let reply = writer.sync();
                if !matches!(reply, protocol::Reply::Ok(_)) {
                    tracing::error!("{}", reply.to_line().trim_end());
                }
                (reply, false)
            }
            Ok(Some(protocol::Command::Usage(req))) => {
                let reply = writer.usage(&req);
                tracing::debug!(mailbox = %req.mailbox.display(), "usage: {}", reply.to_line().trim_end());
                (reply, false)
            }
            Ok(Some(protocol::Command::Deliver(req))) => {
                let reply = writer.deliver(&req);
                match &reply {
                    protocol::Reply::Ok(name) | protocol::Reply::Stored { name, .. } => {
                        tracing::debug!(mailbox = %req.mailbox.display(), name, "delivered")
                    }
                    other => {
                        tracing::info!(mailbox = %req.mailbox.display(), "not delivered: {}", other.to_line().trim_end())
                    }
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
            .write_all(reply.to_line().as_bytes())
            .and_then(|_| output.flush())
            .is_err()
        {
            // The stage is gone; nothing is half-done (the reply comes after the rename).
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

    /// A setuid invocation's options are cut down to what the system configuration allows.
    #[test]
    fn caller_options_only_narrow_the_system_configuration() {
        let root = privilege::RealIds {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        };
        let dir = tempfile::tempdir().unwrap();
        let trusted = dir.path().join("mail");
        std::fs::create_dir_all(trusted.join("domain")).unwrap();
        let cfg = |extra: &str| {
            Config::from_str_named(
                &format!(
                    "[helper-maildir-writer]\nROOT = {}\n{extra}",
                    trusted.display()
                ),
                "pepsi.conf",
            )
            .unwrap()
        };
        let asked = |root: PathBuf| maildir::Options {
            root,
            create: true,
            allow_root_owner: true,
            key_index_dirs: keyindex::DEFAULT_DIRS,
        };
        let o = narrow(&cfg(""), asked(trusted.join("domain")), &root, None).unwrap();
        assert!(!o.create && !o.allow_root_owner);
        let o = narrow(
            &cfg("CREATE_MAILDIR = yes\n"),
            asked(trusted.clone()),
            &root,
            None,
        )
        .unwrap();
        assert!(o.create && !o.allow_root_owner);
        let err = narrow(&cfg(""), asked(dir.path().to_path_buf()), &root, None).unwrap_err();
        assert!(
            err.contains("is outside [helper-maildir-writer] ROOT"),
            "{err}"
        );
        let none = Config::from_str_named("[pepsi]\n", "pepsi.conf").unwrap();
        let err = narrow(&none, asked(trusted.clone()), &root, None).unwrap_err();
        assert!(err.contains("ROOT"), "{err}");
    }

    /// Only CALLER, root or a real member of the writer's group may use a setuid writer: a
    /// user who runs the setgid stage with a HELPER of their own gains the group as the
    /// effective one only, and is refused before any path is looked at.
    #[test]
    fn a_user_borrowing_the_stage_group_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::from_str_named(
            &format!(
                "[helper-maildir-writer]\nROOT = {}\nCALLER = nobody\n",
                dir.path().display()
            ),
            "pepsi.conf",
        )
        .unwrap();
        let nobody = privilege::account("nobody").unwrap().expect("nobody");
        let opts = || maildir::Options {
            root: dir.path().to_path_buf(),
            create: false,
            allow_root_owner: false,
            key_index_dirs: keyindex::DEFAULT_DIRS,
        };
        let ids = |uid, groups: &[u32]| privilege::RealIds {
            uid,
            gid: 4242,
            groups: groups.to_vec(),
        };
        assert!(narrow(&cfg, opts(), &ids(nobody.uid, &[]), Some(777)).is_ok());
        assert!(narrow(&cfg, opts(), &ids(nobody.uid + 1, &[777]), Some(777)).is_ok());
        let e = narrow(&cfg, opts(), &ids(nobody.uid + 1, &[]), Some(777)).unwrap_err();
        assert!(
            e.contains("CALLER nobody") && e.contains("group 777"),
            "{e}"
        );
    }
}
