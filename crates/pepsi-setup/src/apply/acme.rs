//! The `tls_acme` task's certificate, obtained by certbot from the task's ACME server:
//! certbot answers the http-01 challenge with its own web server (`--standalone` on
//! `ACME_HTTP_PORT`) and keeps the certificate as the lineage `pepsi` in `ACME_CONFIG_DIR`,
//! where the plan's edits then point every listener's `TLS_CERT` and `TLS_KEY`.
//!
//! certbot runs with `--keep-until-expiring`: a task carried out again while the lineage
//! holds a certificate for the same names that is not due for renewal keeps it and asks the
//! ACME server for nothing. Names that changed are a new certificate in the same lineage.
//!
//! The ingress runs as `pepsi-ingress` and reads its key as that account (at its start and
//! on SIGHUP), while certbot makes `live/` and `archive/` 0700 and each key 0600, all root's.
//! So once certbot has succeeded the key goes to `TLS_GROUP`: the directories on the way to
//! it 0750 and the lineage's keys in `archive/pepsi/` 0640, that group's. certbot gives a
//! renewed key the previous key's group and group bits (`save_successor`), so its timer keeps
//! them; and it stores `ACME_DEPLOY_HOOK` (`--deploy-hook`) in the lineage's renewal
//! configuration and runs it after each renewal, so the ingress reloads the new pair.
//!
//! It must never run certbot through a shell or with anything but the task's validated
//! values and the operator's options, never edit `pepsi.conf` itself (the plan's edits do,
//! after the check), and never let certbot run or log without bound: `ACME_TIMEOUT` stops it
//! and at most [`MAX_LOGGED_LINES`] of its lines go to the task log. It never opens more than
//! the lineage's own directories and keys to the group, never to others, and never follows
//! a link to do it.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use pepsi_conf::config::Config;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::sync::mpsc;

use super::TaskLog;
use super::plan::{ACME_CERT_NAME, AcmeRequest};

/// How many of certbot's lines one run writes to the task log; the rest are counted.
pub const MAX_LOGGED_LINES: usize = 500;

/// How long certbot may run by default (`ACME_TIMEOUT`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The group that reads the key by default (`TLS_GROUP`): the ingress's own
/// (debian/systemd/pepsi-ingress.service).
const DEFAULT_TLS_GROUP: &str = "pepsi-ingress";

/// What certbot runs after each certificate it obtains by default (`ACME_DEPLOY_HOOK`):
/// the ingress re-reads its certificate, or restarts where it cannot be reloaded.
const DEFAULT_DEPLOY_HOOK: &str = "systemctl try-reload-or-restart pepsi-ingress.service";

/// The mode of the directories on the way to the key, and of the key itself.
const DIR_MODE: u32 = 0o750;
const KEY_MODE: u32 = 0o640;

/// The `[pepsi-setup]` options that say how certbot runs. Where it keeps the certificate
/// (`ACME_CONFIG_DIR`) is the plan's ([`super::plan::Layout`]): its paths go into
/// `pepsi.conf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeOptions {
    /// `CERTBOT`: the certbot program; default `certbot`, found on `PATH`.
    pub certbot: PathBuf,
    /// `ACME_HTTP_PORT`: where certbot's own web server answers the http-01 challenge; the
    /// ACME server asks port 80, so another port only does behind a redirect. Default 80.
    pub http_port: u16,
    /// `ACME_WORK_DIR`: certbot's working directory; default `/var/lib/letsencrypt`.
    pub work_dir: PathBuf,
    /// `ACME_LOGS_DIR`: certbot's own logs; default `/var/log/letsencrypt`.
    pub logs_dir: PathBuf,
    /// `ACME_TIMEOUT`: how long certbot may run before it is stopped and the task fails;
    /// default 5m.
    pub timeout: Duration,
    /// `TLS_GROUP`: the group given the lineage's keys (0640) and the directories on the way
    /// to them (0750), so that the ingress, running as `pepsi-ingress`, reads its key;
    /// default `pepsi-ingress`. It must exist when a task runs.
    pub tls_group: String,
    /// `ACME_DEPLOY_HOOK`: the shell command certbot runs after each certificate it obtains
    /// for the lineage, the first and each renewal by its timer (`--deploy-hook`, kept in
    /// `renewal/pepsi.conf`); default `systemctl try-reload-or-restart
    /// pepsi-ingress.service`; none when set empty.
    pub deploy_hook: Option<String>,
}

impl AcmeOptions {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        let s = cfg.section("pepsi-setup");
        let absolute = |option: &str, default: &str| -> anyhow::Result<PathBuf> {
            let dir = s
                .path_opt(option)?
                .unwrap_or_else(|| PathBuf::from(default));
            if !dir.is_absolute() {
                bail!(
                    "[pepsi-setup] {option} {} is not an absolute path",
                    dir.display()
                );
            }
            Ok(dir)
        };
        let http_port = s.number_opt::<u16>("ACME_HTTP_PORT")?.unwrap_or(80);
        if http_port == 0 {
            bail!("[pepsi-setup] ACME_HTTP_PORT 0 is not a port");
        }
        let timeout = s.duration_opt("ACME_TIMEOUT")?.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            bail!("[pepsi-setup] ACME_TIMEOUT 0 leaves certbot no time");
        }
        let tls_group = s
            .string_opt("TLS_GROUP")?
            .unwrap_or_else(|| DEFAULT_TLS_GROUP.into());
        // Whitespace and ':' never occur in a name of the group database.
        if tls_group.is_empty() || tls_group.contains(|c: char| c.is_whitespace() || c == ':') {
            bail!("[pepsi-setup] TLS_GROUP {tls_group:?} is not a group name");
        }
        let deploy_hook = match s.string_opt("ACME_DEPLOY_HOOK")? {
            None => Some(DEFAULT_DEPLOY_HOOK.to_owned()),
            Some(hook) if hook.trim().is_empty() => None,
            Some(hook) => Some(hook.trim().to_owned()),
        };
        Ok(Self {
            certbot: s
                .path_opt("CERTBOT")?
                .unwrap_or_else(|| PathBuf::from("certbot")),
            http_port,
            work_dir: absolute("ACME_WORK_DIR", "/var/lib/letsencrypt")?,
            logs_dir: absolute("ACME_LOGS_DIR", "/var/log/letsencrypt")?,
            timeout,
            tls_group,
            deploy_hook,
        })
    }
}

/// certbot's arguments for `request`. Each value the task gave is one argument joined to
/// its option (`--email=…`), so none can be read as an option of its own.
pub fn certbot_args(request: &AcmeRequest, options: &AcmeOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "certonly",
        "--non-interactive",
        "--agree-tos",
        // The contact address goes to the ACME server alone, not to a mailing list.
        "--no-eff-email",
        "--keep-until-expiring",
        "--standalone",
    ]
    .map(OsString::from)
    .to_vec();
    args.push(format!("--email={}", request.email).into());
    args.push(format!("--server={}", request.directory).into());
    args.push(format!("--http-01-port={}", options.http_port).into());
    args.push(format!("--cert-name={ACME_CERT_NAME}").into());
    if let Some(hook) = &options.deploy_hook {
        args.push(format!("--deploy-hook={hook}").into());
    }
    for domain in &request.domains {
        args.push(format!("--domain={domain}").into());
    }
    for (option, dir) in [
        ("--config-dir=", &request.config_dir),
        ("--work-dir=", &options.work_dir),
        ("--logs-dir=", &options.logs_dir),
    ] {
        let mut arg = OsString::from(option);
        arg.push(dir);
        args.push(arg);
    }
    args
}

/// What certbot printed, as the task log and the outcome see it: which lines are logged,
/// how many were not, and the line that says what happened.
#[derive(Debug, Default)]
struct Transcript {
    logged: usize,
    unlogged: usize,
    /// The last line that says something of this run (not a banner, a rule or a pointer to
    /// certbot's own log).
    last: Option<String>,
    /// The name the ACME server's report is about (`Domain: …`), for its `Detail: …`.
    domain: Option<String>,
    /// The ACME server's own word on the first challenge that failed.
    detail: Option<String>,
}

/// Lines certbot prints whatever happened.
const BOILERPLATE: [&str; 6] = [
    "Saving debug log",
    "Ask for help",
    "See the logfile",
    "If you like Certbot",
    "* Donating",
    "Certbot has set up a scheduled task",
];

impl Transcript {
    /// Takes one line; whether it goes to the task log (blank lines and those past
    /// [`MAX_LOGGED_LINES`] do not).
    fn take(&mut self, line: &str) -> bool {
        let text = line.trim();
        if text.is_empty() {
            return false;
        }
        let rule = text.chars().all(|c| c == '-' || c == ' ');
        if !rule && !BOILERPLATE.iter().any(|b| text.starts_with(b)) {
            self.last = Some(text.to_owned());
            if let Some(domain) = text.strip_prefix("Domain:") {
                self.domain = Some(domain.trim().to_owned());
            } else if let Some(detail) = text.strip_prefix("Detail:")
                && self.detail.is_none()
            {
                self.detail = Some(match &self.domain {
                    Some(domain) => format!("{domain}: {}", detail.trim()),
                    None => detail.trim().to_owned(),
                });
            }
        }
        if self.logged < MAX_LOGGED_LINES {
            self.logged += 1;
            true
        } else {
            self.unlogged += 1;
            false
        }
    }

    /// What happened, in certbot's words: its last meaningful line, with the ACME server's
    /// reason when a challenge failed; none when it said nothing but where its log is.
    fn reason(&self) -> Option<String> {
        let last = self.last.as_ref()?;
        Some(match &self.detail {
            Some(detail) if !last.contains(detail.as_str()) => format!("{last} ({detail})"),
            _ => last.clone(),
        })
    }
}

/// An argument as the task log shows it: quoted when it holds a space (the deploy hook).
fn shown(arg: &OsString) -> String {
    let text = arg.to_string_lossy();
    if text.contains(char::is_whitespace) {
        format!("'{}'", text.replace('\'', r"'\''"))
    } else {
        text.into_owned()
    }
}

/// Runs certbot for `request`, each line it prints logged as it comes, then gives the key to
/// `TLS_GROUP`; fails with certbot's reason when it fails, or when it runs past
/// `ACME_TIMEOUT` (then it is killed), and before asking certbot anything when that group
/// does not exist.
pub(super) async fn obtain(
    request: &AcmeRequest,
    options: &AcmeOptions,
    log: &mut TaskLog,
) -> anyhow::Result<()> {
    let group = &options.tls_group;
    let gid = pepsi_conf::privilege::group_id(group)
        .with_context(|| format!("cannot look up the group {group} (TLS_GROUP)"))?
        .ok_or_else(|| {
            anyhow!(
                "the group {group} (TLS_GROUP), which the ingress reads its key as, does not \
                 exist"
            )
        })?;
    let args = certbot_args(request, options);
    log.step(&format!(
        "running {} {}{}",
        options.certbot.display(),
        args.iter().map(shown).collect::<Vec<_>>().join(" "),
        match &request.ca_file {
            Some(ca) => format!(" (REQUESTS_CA_BUNDLE={})", ca.display()),
            None => String::new(),
        }
    ))
    .await?;
    let mut command = tokio::process::Command::new(&options.certbot);
    command
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(ca) = &request.ca_file {
        // How certbot's HTTP library trusts a private ACME server.
        command.env("REQUESTS_CA_BUNDLE", ca);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {} (CERTBOT)", options.certbot.display()))?;
    let (tx, mut rx) = mpsc::channel::<String>(64);
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_lines(out, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward_lines(err, tx.clone()));
    }
    drop(tx);

    let mut transcript = Transcript::default();
    let deadline = tokio::time::Instant::now() + options.timeout;
    let finished = tokio::time::timeout_at(deadline, async {
        while let Some(line) = rx.recv().await {
            if transcript.take(&line) {
                log.output(&line).await?;
            }
        }
        anyhow::Ok(child.wait().await?)
    })
    .await;
    if transcript.unlogged > 0 {
        log.step(&format!(
            "{} more lines of certbot's output not logged (certbot's own log is in {})",
            transcript.unlogged,
            options.logs_dir.display()
        ))
        .await?;
    }
    let status = match finished {
        Ok(status) => status?,
        Err(_) => {
            let _ = child.kill().await;
            let limit = pepsi_conf::text::human_duration(options.timeout.as_secs_f64());
            match transcript.reason() {
                Some(reason) => bail!(
                    "certbot did not finish within ACME_TIMEOUT ({limit}) and was stopped; \
                     its last line: {reason}"
                ),
                None => bail!(
                    "certbot did not finish within ACME_TIMEOUT ({limit}) and was stopped \
                     (its own log is in {})",
                    options.logs_dir.display()
                ),
            }
        }
    };
    if !status.success() {
        bail!(
            "certbot failed ({status}): {}",
            transcript.reason().unwrap_or_else(|| format!(
                "it said nothing of why; its own log is in {}",
                options.logs_dir.display()
            ))
        );
    }
    log.step(&format!(
        "certbot: the certificate for {} is in {}",
        request.domains.join(", "),
        request.live().display()
    ))
    .await?;
    let changes = give_to_group(&request.config_dir, group, gid)?;
    if changes.is_empty() {
        log.step(&format!(
            "the key and the directories on the way to it were already group {group}'s"
        ))
        .await?;
    }
    for change in changes {
        log.step(&change).await?;
    }
    Ok(())
}

/// Whether `name` is one of the lineage's keys in `archive/pepsi/`: certbot's
/// `privkey<N>.pem`.
fn is_key_name(name: &str) -> bool {
    name.strip_prefix("privkey")
        .and_then(|rest| rest.strip_suffix(".pem"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What the group is given, with its mode, when `archive/pepsi/` holds `archive_names`: each
/// key among those files (0640) and the directories from `config_dir` to the lineage's
/// links and files (0750), innermost first, so that nothing is within the group's reach
/// before it has its own mode. Nothing else of the lineage (its certificates are 0644
/// already) and nothing else of `config_dir`, which holds the ACME account's key.
fn grants(config_dir: &Path, archive_names: &[String]) -> Vec<(PathBuf, u32)> {
    let live = config_dir.join("live");
    let archive = config_dir.join("archive");
    let lineage = archive.join(ACME_CERT_NAME);
    let mut keys: Vec<&String> = archive_names.iter().filter(|n| is_key_name(n)).collect();
    keys.sort();
    let mut out: Vec<(PathBuf, u32)> = keys
        .into_iter()
        .map(|name| (lineage.join(name), KEY_MODE))
        .collect();
    out.extend([
        (lineage, DIR_MODE),
        (archive, DIR_MODE),
        (live.join(ACME_CERT_NAME), DIR_MODE),
        (live, DIR_MODE),
    ]);
    out
}

/// Gives each of [`grants`] to `gid` with its mode where it has not got them yet, a line for
/// each change. A link is left alone: certbot links a key it reuses to one of the files
/// given, and following one could open a file outside the lineage.
fn give_to_group(config_dir: &Path, group: &str, gid: u32) -> anyhow::Result<Vec<String>> {
    let archive = config_dir.join("archive").join(ACME_CERT_NAME);
    let names: Vec<String> = fs::read_dir(&archive)
        .with_context(|| format!("cannot read {}", archive.display()))?
        .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", archive.display()))?;
    let mut changes = Vec::new();
    for (path, mode) in grants(config_dir, &names) {
        let meta = fs::symlink_metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let was_mode = meta.permissions().mode() & 0o7777;
        if meta.gid() == gid && was_mode == mode {
            continue;
        }
        // The group first: the bits then open the file to it alone.
        std::os::unix::fs::lchown(&path, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {group}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot make {} mode {mode:04o}", path.display()))?;
        changes.push(format!(
            "{}: group {group}, mode {mode:04o} (was gid {}, mode {was_mode:04o})",
            path.display(),
            meta.gid()
        ));
    }
    Ok(changes)
}

/// Sends each line of `stream` (lossy UTF-8, without its line end) until its end, or until
/// nobody reads them.
async fn forward_lines(stream: impl AsyncRead + Unpin, tx: mpsc::Sender<String>) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']).to_owned();
                if tx.send(line).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> AcmeOptions {
        AcmeOptions::from_config(&Config::from_str_named("[pepsi-setup]\n", "t.conf").unwrap())
            .unwrap()
    }

    #[test]
    fn options_and_their_defaults() {
        assert_eq!(
            options(),
            AcmeOptions {
                certbot: "certbot".into(),
                http_port: 80,
                work_dir: "/var/lib/letsencrypt".into(),
                logs_dir: "/var/log/letsencrypt".into(),
                timeout: Duration::from_secs(300),
                tls_group: "pepsi-ingress".into(),
                deploy_hook: Some("systemctl try-reload-or-restart pepsi-ingress.service".into()),
            }
        );
        let from = |text: &str| {
            AcmeOptions::from_config(
                &Config::from_str_named(&format!("[pepsi-setup]\n{text}\n"), "t.conf").unwrap(),
            )
            .map_err(|e| format!("{e:#}"))
        };
        let set = from(
            "CERTBOT = /opt/certbot/bin/certbot\nACME_HTTP_PORT = 8080\n\
             ACME_WORK_DIR = /srv/w\nACME_LOGS_DIR = /srv/l\nACME_TIMEOUT = 90s",
        )
        .unwrap();
        assert_eq!(
            (
                set.certbot.to_str(),
                set.http_port,
                set.work_dir.to_str(),
                set.logs_dir.to_str(),
                set.timeout
            ),
            (
                Some("/opt/certbot/bin/certbot"),
                8080,
                Some("/srv/w"),
                Some("/srv/l"),
                Duration::from_secs(90)
            )
        );
        for (text, want) in [
            ("ACME_HTTP_PORT = 0", "ACME_HTTP_PORT 0 is not a port"),
            ("ACME_HTTP_PORT = 70000", "ACME_HTTP_PORT"),
            ("ACME_TIMEOUT = 0", "ACME_TIMEOUT 0 leaves certbot no time"),
            (
                "ACME_WORK_DIR = work",
                "ACME_WORK_DIR work is not an absolute path",
            ),
            ("TLS_GROUP =", "TLS_GROUP \"\" is not a group name"),
            (
                "TLS_GROUP = pepsi ingress",
                "TLS_GROUP \"pepsi ingress\" is not a group name",
            ),
            (
                "TLS_GROUP = ssl:cert",
                "TLS_GROUP \"ssl:cert\" is not a group name",
            ),
        ] {
            let got = from(text).unwrap_err();
            assert!(got.contains(want), "{text}: {got}");
        }
    }

    #[test]
    fn the_tls_group_and_the_deploy_hook_as_set() {
        let from = |text: &str| {
            AcmeOptions::from_config(
                &Config::from_str_named(&format!("[pepsi-setup]\n{text}\n"), "t.conf").unwrap(),
            )
            .unwrap()
        };
        for (text, group, hook) in [
            (
                "TLS_GROUP = ssl-cert",
                "ssl-cert",
                Some(DEFAULT_DEPLOY_HOOK),
            ),
            ("ACME_DEPLOY_HOOK =", "pepsi-ingress", None),
            ("ACME_DEPLOY_HOOK =   ", "pepsi-ingress", None),
            (
                "ACME_DEPLOY_HOOK = /usr/local/bin/tls-renewed --quiet",
                "pepsi-ingress",
                Some("/usr/local/bin/tls-renewed --quiet"),
            ),
            // certbot runs it through a shell, where $RENEWED_LINEAGE names the lineage.
            (
                "ACME_DEPLOY_HOOK = logger renewed $$RENEWED_LINEAGE",
                "pepsi-ingress",
                Some("logger renewed $RENEWED_LINEAGE"),
            ),
        ] {
            let options = from(text);
            assert_eq!(
                (options.tls_group.as_str(), options.deploy_hook.as_deref()),
                (group, hook),
                "{text}"
            );
        }
    }

    #[test]
    fn certbot_is_asked_for_the_lineage_pepsi_keeping_a_certificate_not_due() {
        let request = AcmeRequest {
            domains: vec!["mx.example.org".into(), "example.org".into()],
            email: "postmaster@example.org".into(),
            directory: "https://acme.example/dir".into(),
            ca_file: None,
            config_dir: "/etc/letsencrypt".into(),
        };
        let args: Vec<String> = certbot_args(&request, &options())
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "certonly",
                "--non-interactive",
                "--agree-tos",
                "--no-eff-email",
                "--keep-until-expiring",
                "--standalone",
                "--email=postmaster@example.org",
                "--server=https://acme.example/dir",
                "--http-01-port=80",
                "--cert-name=pepsi",
                "--deploy-hook=systemctl try-reload-or-restart pepsi-ingress.service",
                "--domain=mx.example.org",
                "--domain=example.org",
                "--config-dir=/etc/letsencrypt",
                "--work-dir=/var/lib/letsencrypt",
                "--logs-dir=/var/log/letsencrypt",
            ]
        );
        let none = AcmeOptions {
            deploy_hook: None,
            ..options()
        };
        assert!(
            !certbot_args(&request, &none)
                .iter()
                .any(|a| a.to_string_lossy().starts_with("--deploy-hook")),
            "no hook, no --deploy-hook"
        );
    }

    #[test]
    fn the_log_quotes_an_argument_with_a_space() {
        for (arg, want) in [
            ("--cert-name=pepsi", "--cert-name=pepsi"),
            ("--deploy-hook=a b", "'--deploy-hook=a b'"),
            ("--deploy-hook=echo 'x'", r"'--deploy-hook=echo '\''x'\'''"),
        ] {
            assert_eq!(shown(&OsString::from(arg)), want);
        }
    }

    #[test]
    fn the_keys_of_the_lineage_are_certbots_privkey_files() {
        for (name, want) in [
            ("privkey1.pem", true),
            ("privkey12.pem", true),
            ("privkey.pem", false),
            ("privkey1.pem.bak", false),
            ("privkeyx.pem", false),
            ("cert1.pem", false),
            ("fullchain1.pem", false),
        ] {
            assert_eq!(is_key_name(name), want, "{name}");
        }
    }

    #[test]
    fn the_group_gets_the_keys_then_the_directories_to_them_innermost_first() {
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let got = |list: &[&str]| -> Vec<(String, u32)> {
            grants(Path::new("/etc/letsencrypt"), &names(list))
                .into_iter()
                .map(|(p, m)| (p.display().to_string(), m))
                .collect()
        };
        let dirs = [
            ("/etc/letsencrypt/archive/pepsi", 0o750),
            ("/etc/letsencrypt/archive", 0o750),
            ("/etc/letsencrypt/live/pepsi", 0o750),
            ("/etc/letsencrypt/live", 0o750),
        ];
        let want = |keys: &[&str]| -> Vec<(String, u32)> {
            keys.iter()
                .map(|k| (format!("/etc/letsencrypt/archive/pepsi/{k}"), 0o640))
                .chain(dirs.iter().map(|(p, m)| (p.to_string(), *m)))
                .collect()
        };
        assert_eq!(
            got(&["cert1.pem", "chain1.pem", "fullchain1.pem", "privkey1.pem"]),
            want(&["privkey1.pem"])
        );
        assert_eq!(
            got(&["privkey2.pem", "cert2.pem", "privkey1.pem", "cert1.pem"]),
            want(&["privkey1.pem", "privkey2.pem"])
        );
        assert_eq!(got(&[]), want(&[]));
    }

    /// certbot's output (as certbot 2.1 prints it) → the reason the outcome gives.
    fn check_reason(output: &str, want: Option<&str>) {
        let mut t = Transcript::default();
        for line in output.lines() {
            t.take(line);
        }
        assert_eq!(t.reason().as_deref(), want, "{output}");
    }

    #[test]
    fn the_reason_is_certbots_last_meaningful_line() {
        check_reason("", None);
        check_reason("Saving debug log to /l/letsencrypt.log\n", None);
        check_reason(
            "Saving debug log to /var/log/letsencrypt/letsencrypt.log\n\
             An unexpected error occurred:\n\
             ValueError: Requesting 127.0.0.1/dir: Connection refused\n\
             Ask for help or search for solutions at https://community.letsencrypt.org. See \
             the logfile /var/log/letsencrypt/letsencrypt.log or re-run Certbot with -v for \
             more details.\n",
            Some("ValueError: Requesting 127.0.0.1/dir: Connection refused"),
        );
        check_reason(
            "Saving debug log to /l/letsencrypt.log\n\
             Renewing an existing certificate for mx.acme.test and other.test\n\n\
             Certbot failed to authenticate some domains (authenticator: standalone). The \
             Certificate Authority reported these problems:\n\
             \x20 Domain: other.test\n\
             \x20 Type:   connection\n\
             \x20 Detail: could not resolve URL \"http://other.test:80/.well-known/x\"\n\n\
             Hint: The Certificate Authority failed to download the challenge files.\n\n\
             Some challenges have failed.\n\
             Ask for help or search for solutions at https://community.letsencrypt.org.\n",
            Some(
                "Some challenges have failed. (other.test: could not resolve URL \
                 \"http://other.test:80/.well-known/x\")",
            ),
        );
        check_reason(
            "Saving debug log to /l/letsencrypt.log\n\
             Certificate not yet due for renewal\n\n\
             - - - - - - - - - - - - - - - - - - - -\n\
             Certificate not yet due for renewal; no action taken.\n\
             - - - - - - - - - - - - - - - - - - - -\n",
            Some("Certificate not yet due for renewal; no action taken."),
        );
        check_reason(
            "Successfully received certificate.\n\
             Certificate is saved at: /etc/letsencrypt/live/pepsi/fullchain.pem\n\
             Certbot has set up a scheduled task to automatically renew this certificate.\n\
             - - - - - - - - -\n\
             If you like Certbot, please consider supporting our work by:\n\
             \x20* Donating to EFF:                    https://eff.org/donate-le\n",
            Some("Certificate is saved at: /etc/letsencrypt/live/pepsi/fullchain.pem"),
        );
    }

    #[test]
    fn at_most_the_bound_of_lines_is_logged_and_blank_ones_never() {
        let mut t = Transcript::default();
        assert!(!t.take(""));
        assert!(!t.take("   "));
        let logged = (0..MAX_LOGGED_LINES + 7)
            .filter(|i| t.take(&format!("line {i}")))
            .count();
        assert_eq!(logged, MAX_LOGGED_LINES);
        assert_eq!(t.unlogged, 7);
        // The reason still comes from the last line, logged or not.
        assert_eq!(t.reason(), Some(format!("line {}", MAX_LOGGED_LINES + 6)));
    }
}
