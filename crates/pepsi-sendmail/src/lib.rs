//! pepsi-sendmail: the sendmail(1) command-line interface of Pepsi, for cron, PHP's
//! `mail()`, monitoring scripts and every program that hands mail to `/usr/sbin/sendmail`.
//!
//! Reads: the command line, standard input, `[pepsi-sendmail]` (never `secrets.d/`), the
//! system's user database. Writes: one `pepsi.sendmail_submit` call per message, as the
//! sendmail role, which may execute that function and nothing else (the privilege
//! boundary, procedures.sql LOCAL SUBMISSION); when the database cannot take it, one file of
//! the drop directory (`spool`), which the pickup (`-q`) inserts later. It must never exit 0
//! for a message that is neither committed nor synced to a file, and never read a spool
//! file except as the pickup run by the directory's owner.
//!
//! Layout: `options` (the command line), `message` (reading and completing a message, pure),
//! `smtp` (`-bs`), `queue` (database, drop directory, pickup), `spool` (the file format),
//! `section` (its `[pepsi-sendmail]` options). Installed set-group-id `pepsi-sendmail` (the group that may write the drop
//! directory), hence standalone rather than folded into the unified binary.

pub mod message;
pub mod options;
pub mod queue;
pub mod section;
pub mod smtp;
pub mod spool;

use std::io::Write as _;
use std::process::ExitCode;

use pepsi_conf::config::{CONFIG_ENV, Config, ConfigSource};
use pepsi_smtp::Reply;

use message::{Context, EnvelopeRequest, MessageError, Prepared, Submitter};
use options::{Invocation, Mode};
use queue::{QueueError, Queued};
use section::{Options, User};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "sendmail",
        exec: "pepsi-sendmail",
    };
}

/// The exit statuses of sysexits.h that sendmail callers test.
pub mod exit {
    pub const OK: u8 = 0;
    pub const USAGE: u8 = 64;
    pub const DATAERR: u8 = 65;
    pub const NOINPUT: u8 = 66;
    pub const NOUSER: u8 = 67;
    pub const SOFTWARE: u8 = 70;
    pub const CANTCREAT: u8 = 73;
    pub const TEMPFAIL: u8 = 75;
    pub const NOPERM: u8 = 77;
    pub const CONFIG: u8 = 78;
}

/// A failure with its exit status; printed as `pepsi-sendmail: <message>`.
struct Failure(u8, String);

impl Failure {
    fn new(code: u8, msg: impl Into<String>) -> Failure {
        Failure(code, msg.into())
    }
}

/// Entry point of the `pepsi-sendmail` binary.
pub fn run() -> ExitCode {
    let source = &constants::CONFIG_SOURCE;
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let privileged = section::privileged();
    let env_config = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty());
    if privileged {
        // A set-group-id program must not let its caller steer it: the configuration's
        // $VAR expansions (PEPSI_HOME, DATABASE_URL …) read the environment.
        for (key, _) in std::env::vars_os() {
            // SAFETY: single-threaded here, before any runtime or thread exists.
            unsafe { std::env::remove_var(key) };
        }
    }
    let code = match main(source, &args, privileged, env_config.is_some()) {
        Ok(code) => code,
        Err(Failure(code, msg)) => {
            eprintln!("{}: {msg}", source.exec);
            code
        }
    };
    ExitCode::from(code)
}

fn main(
    source: &ConfigSource,
    args: &[String],
    privileged: bool,
    env_config: bool,
) -> Result<u8, Failure> {
    let inv = options::parse(args.iter().cloned())
        .map_err(|e| Failure::new(exit::USAGE, format!("{e} (see --help)")))?;
    match inv.mode {
        Mode::Help => {
            print!("{}", options::HELP);
            return Ok(exit::OK);
        }
        Mode::Version => {
            println!("{} {}", source.exec, env!("CARGO_PKG_VERSION"));
            return Ok(exit::OK);
        }
        Mode::Newaliases => {
            eprintln!(
                "{}: nothing to rebuild: Pepsi reads its alias file itself (docs/aliases.md)",
                source.exec
            );
            return Ok(exit::OK);
        }
        _ => {}
    }
    pepsi_conf::cli::init_logging(source, &inv.log_level);
    let uid = section::real_uid();
    if privileged && uid != 0 && (inv.config.is_some() || env_config) {
        return Err(Failure::new(
            exit::NOPERM,
            "-C/--config and PEPSI_CONFIG are refused while running set-group-id for another user",
        ));
    }
    let path = inv
        .config
        .clone()
        .or_else(|| {
            std::env::var_os(CONFIG_ENV)
                .filter(|v| !v.is_empty())
                .map(Into::into)
        })
        .unwrap_or_else(|| pepsi_conf::config::DEFAULT_CONFIG_PATH.into());
    let cfg = Config::load_without_secrets(&path)
        .map_err(|e| Failure::new(exit::CONFIG, e.to_string()))?;
    let settings =
        Options::from_config(&cfg).map_err(|e| Failure::new(exit::CONFIG, format!("{e:#}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("cannot start the async runtime: {e}"),
            )
        })?;
    match inv.mode {
        Mode::Pickup { every } => pickup(&runtime, &settings, uid, every),
        Mode::Smtp => {
            let who = section::user(uid);
            smtp_session(&runtime, &settings, &who, &inv)
        }
        _ => {
            let who = section::user(uid);
            deliver(&runtime, &settings, &who, &inv)
        }
    }
}

/// `-bm`: one message from standard input.
fn deliver(
    runtime: &tokio::runtime::Runtime,
    options: &Options,
    who: &User,
    inv: &Invocation,
) -> Result<u8, Failure> {
    let raw = message::read_message(&mut std::io::stdin().lock(), inv.dot_ends, &options.limits)
        .map_err(|e| match e {
            MessageError::Read(_) => Failure::new(exit::NOINPUT, e.to_string()),
            _ => Failure::new(exit::DATAERR, e.to_string()),
        })?;
    let req = EnvelopeRequest {
        sender: inv.sender.clone(),
        // `sendmail "a@x, b@y"` is one argument naming two recipients.
        recipients: inv
            .recipients
            .iter()
            .flat_map(|r| r.split(','))
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect(),
        rcpt_params: Vec::new(),
        from_headers: inv.from_headers,
        full_name: inv.full_name.clone(),
        notify: inv.notify.clone(),
        ret: inv.ret,
        envid: inv.envid.clone(),
    };
    let prepared = prepare(options, who, &raw, &req).map_err(|e| {
        let code = match e {
            MessageError::NoRecipients => exit::USAGE,
            MessageError::BadRecipient { .. } | MessageError::BadSender { .. } => exit::NOUSER,
            _ => exit::DATAERR,
        };
        Failure::new(code, e.to_string())
    })?;
    match runtime.block_on(queue::queue(options, who, &prepared)) {
        Ok(queued) => {
            let place = match queued {
                Queued::Database(id) => format!("queued as {id}"),
                Queued::Spool(path) => format!(
                    "the database is unreachable: queued in the drop directory as {} for the pickup",
                    path.display()
                ),
            };
            tracing::info!(rcpts = prepared.rcpt_to.len(), "{place}");
            if inv.verbose {
                eprintln!("pepsi-sendmail: {place}");
            }
            Ok(exit::OK)
        }
        Err(QueueError::Refused(m)) => Err(Failure::new(
            exit::DATAERR,
            format!("the message was refused: {m}"),
        )),
        Err(QueueError::Temporary(m)) => Err(Failure::new(exit::TEMPFAIL, m)),
    }
}

fn prepare(
    options: &Options,
    who: &User,
    raw: &[u8],
    req: &EnvelopeRequest,
) -> Result<Prepared, MessageError> {
    let now = chrono::Local::now();
    let date = now.to_rfc2822();
    let unique = unique_id(&now);
    let submitter = Submitter {
        uid: who.uid,
        login: who.login.clone(),
        gecos_name: who.gecos_name.clone(),
    };
    message::prepare(
        raw,
        req,
        &submitter,
        &Context {
            domain: &options.domain,
            hostname: &options.hostname,
            date: &date,
            unique: &unique,
        },
        &options.limits,
    )
}

/// The left part of a Message-ID: the time to the nanosecond, the pid and a counter.
fn unique_id(now: &chrono::DateTime<chrono::Local>) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}.{}.{}",
        now.format("%Y%m%d%H%M%S%.9f").to_string().replace('.', ""),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// `-bs`.
fn smtp_session(
    runtime: &tokio::runtime::Runtime,
    options: &Options,
    who: &User,
    inv: &Invocation,
) -> Result<u8, Failure> {
    let session = smtp::SessionOptions {
        hostname: options.hostname.clone(),
        limits: options.limits,
        full_name: inv.full_name.clone(),
    };
    let mut stdout = std::io::stdout().lock();
    smtp::run(
        &mut std::io::stdin().lock(),
        &mut stdout,
        &session,
        |req, raw| {
            let prepared = match prepare(options, who, raw, req) {
                Ok(p) => p,
                Err(e) => {
                    let (code, status) = match e {
                        MessageError::TooBig { .. } => (552, "5.3.4"),
                        MessageError::BadRecipient { .. } => (553, "5.1.3"),
                        MessageError::BadSender { .. } => (553, "5.1.7"),
                        _ => (554, "5.6.0"),
                    };
                    return Reply::new(code, status, e.to_string());
                }
            };
            match runtime.block_on(queue::queue(options, who, &prepared)) {
                Ok(Queued::Database(id)) => Reply::new(250, "2.0.0", format!("queued as {id}")),
                Ok(Queued::Spool(_)) => {
                    Reply::new(250, "2.0.0", "queued in the drop directory for the pickup")
                }
                Err(QueueError::Refused(m)) => Reply::new(554, "5.6.0", m),
                Err(QueueError::Temporary(m)) => {
                    tracing::error!("{m}");
                    Reply::new(
                        451,
                        "4.3.0",
                        "cannot queue the message now, try again later",
                    )
                }
            }
        },
    )
    .map_err(|e| Failure::new(exit::NOINPUT, format!("the SMTP session failed: {e}")))?;
    stdout.flush().ok();
    Ok(exit::OK)
}

/// `-q[INTERVAL]`.
fn pickup(
    runtime: &tokio::runtime::Runtime,
    options: &Options,
    uid: u32,
    every: Option<std::time::Duration>,
) -> Result<u8, Failure> {
    use std::os::unix::fs::MetadataExt as _;
    let dir = &options.spool_dir;
    let owner = std::fs::metadata(dir)
        .map_err(|e| {
            Failure::new(
                exit::CANTCREAT,
                format!("drop directory {}: {e}", dir.display()),
            )
        })?
        .uid();
    if uid != 0 && uid != owner {
        return Err(Failure::new(
            exit::NOPERM,
            format!(
                "the pickup runs as the owner of the drop directory {} (uid {owner}) or root, not uid {uid}",
                dir.display()
            ),
        ));
    }
    let Some(every) = every else {
        return match runtime.block_on(queue::pickup(options)) {
            Ok(r) => {
                tracing::info!(
                    inserted = r.inserted,
                    set_aside = r.set_aside,
                    "pickup pass done"
                );
                Ok(if r.set_aside > 0 {
                    exit::DATAERR
                } else {
                    exit::OK
                })
            }
            Err(e) => Err(Failure::new(exit::TEMPFAIL, format!("{e:#}"))),
        };
    };
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot handle SIGTERM: {e}")))?;
        loop {
            match queue::pickup(options).await {
                Ok(r) if r.inserted + r.set_aside > 0 => {
                    tracing::info!(
                        inserted = r.inserted,
                        set_aside = r.set_aside,
                        "pickup pass done"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("pickup: {e:#}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = term.recv() => return Ok(exit::OK),
                _ = tokio::signal::ctrl_c() => return Ok(exit::OK),
            }
        }
    })
}
