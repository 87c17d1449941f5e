//! The ingress configuration: `[pepsi-ingress]` options and the `[listener-<name>]`
//! sections, read once at start into `Options` and validated there, so that a mistake
//! stops the program with a message naming the option rather than surfacing mid-session.
//!
//! Listener sections are protected: the configuration layer never takes them from the
//! database, so a compromised database cannot open or move a socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use pepsi_conf::config::{Config, Section};

/// The section of the ingress's own options.
pub const SECTION: &str = "pepsi-ingress";
/// Prefix of listener sections.
pub const LISTENER_PREFIX: &str = "listener-";
/// The result field of pepsi-stage-decrypt unless its RESULT_HEADER names another (that
/// stage's `constants::RESULT_HEADER`; the ingress does not link the stage).
pub const DECRYPT_RESULT_HEADER: &str = "X-Pepsi-Decrypted";

/// What a listener is for, which sets its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Mail from other servers (port 25): local domains only, STARTTLS offered, AUTH not.
    Mx,
    /// Submission with STARTTLS (port 587): AUTH required, after TLS.
    Submission,
    /// Submission over implicit TLS (port 465): AUTH required.
    Submissions,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Mx => "mx",
            Role::Submission => "submission",
            Role::Submissions => "submissions",
        }
    }
}

/// A certificate chain and key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One `[listener-<name>]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// The part after `listener-`; it goes into `state.origin.listener`.
    pub name: String,
    pub role: Role,
    pub address: SocketAddr,
    pub tls: Option<TlsFiles>,
    /// AUTH is offered.
    pub auth: bool,
    /// MAIL is refused until the client authenticated.
    pub require_auth: bool,
    /// AUTH is allowed before TLS (test rigs only: the password crosses in the clear).
    pub plaintext_auth: bool,
    /// SPF, DKIM, DMARC, ARC and iprev are checked for mail on this listener.
    pub verify: bool,
    /// An authenticated client may use only the sender addresses its login owns, in MAIL
    /// FROM and in From (crate::sender).
    pub sender_login_binding: bool,
    /// Mail to an unknown address of a local domain is refused at RCPT (crate::recipients).
    pub check_recipients: bool,
}

/// The resolver message authentication uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsOptions {
    /// Empty: the system's resolver configuration (`/etc/resolv.conf`).
    pub servers: Vec<SocketAddr>,
    /// Per query attempt (two attempts).
    pub timeout: Duration,
    /// All the DNS work for one message's verdicts; past it the message is taken with
    /// `temperror` verdicts.
    pub budget: Duration,
    /// DKIM-Signature fields verified per message (the first ones); the rest are ignored.
    pub max_dkim_signatures: usize,
    /// The least time a negative answer (NXDOMAIN, no such record) is remembered, whatever
    /// the zone says: a flood of mail naming a domain without SPF or DMARC records asks once.
    pub negative_ttl: Duration,
    /// How long a failed lookup (timeout, SERVFAIL) is remembered: the next message about
    /// the same domain or address gets `temperror` without asking again.
    pub failure_ttl: Duration,
}

/// Everything the ingress reads from its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub hostname: String,
    pub authserv_id: String,
    pub local_domains: Vec<String>,
    /// The shared local-recipient resolver: `local_domains` above plus the domains the
    /// settings layer marks local, and `[pepsi] RECIPIENT_DELIMITER`.
    pub local: pepsi_contract::local::LocalRecipients,
    pub max_message_size: u64,
    pub max_recipients: usize,
    pub max_line_length: usize,
    pub max_command_length: usize,
    pub max_bad_commands: u32,
    pub command_timeout: Duration,
    pub data_timeout: Duration,
    /// The longest one database lookup of a session (RCPT, the sender check, AUTH) may take
    /// before it counts as failed.
    pub lookup_timeout: Duration,
    /// A reply the client does not take within this ends the session.
    pub write_timeout: Duration,
    /// A session is closed (421 4.4.2) once it has lasted this long.
    pub max_session_time: Duration,
    /// Commands one session may send before it is closed (421 4.7.0).
    pub max_commands: u32,
    /// NOOP, RSET, VRFY, HELP and EXPN one session may send before it is closed.
    pub max_junk_commands: u32,
    /// Connections count per client network: an IPv4 address masked to this many bits.
    pub client_prefix_v4: u8,
    /// The same for IPv6 (64: one customer's /64 is one client).
    pub client_prefix_v6: u8,
    /// Message bytes all sessions together may hold in memory while receiving.
    pub message_memory: u64,
    /// How long an answer of the settings layer about a domain is reused.
    pub domain_cache_ttl: Duration,
    /// How long CHECK_RECIPIENTS reuses the finding that a recipient exists.
    pub recipient_cache_ttl: Duration,
    /// `CHECK_QUOTA`: refuse RCPT to a local mailbox the quota record shows full.
    pub check_quota: bool,
    /// How long a recorded usage counts for that check.
    pub quota_usage_ttl: Duration,
    /// How long the check's answer for a mailbox is reused.
    pub quota_cache_ttl: Duration,
    /// How often the counters are added to `pepsi.ingress_stats`.
    pub stats_interval: Duration,
    /// Failed logins a client network may make per AUTH_FAILURE_WINDOW (0: no limit).
    pub auth_failures_per_client: u32,
    /// Failed logins for one account per AUTH_FAILURE_WINDOW, from anywhere (0: no limit).
    pub auth_failures_per_account: u32,
    pub auth_failure_window: Duration,
    /// Password checks (Argon2id) running at once over all sessions.
    pub auth_concurrency: usize,
    pub tls_handshake_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_client: u32,
    pub dispatch_wake_interval: Duration,
    /// How accepted messages are grouped into admission statements (`ADMISSION_*`).
    pub admission: crate::admission::Limits,
    /// How much backlog builds before new messages wait (`INFLOW_*`).
    pub inflow: crate::inflow::Limits,
    pub shutdown_grace: Duration,
    pub dns: DnsOptions,
    /// Header fields removed from every message at admission, whoever sent it: fields
    /// only our own stages may write (`STRIP_FIELDS`, and the RESULT_HEADER of every
    /// decrypt stage section).
    pub strip_fields: Vec<String>,
    pub listeners: Vec<ListenerConfig>,
}

/// `STRIP_FIELDS` (default: the decrypt stage's default result field), then the
/// `RESULT_HEADER` of every `[stage-*]` section running pepsi-stage-decrypt, each once
/// (names compare without regard to case). A name that is no header field name is an error
/// naming it.
fn strip_fields(cfg: &Config, s: &Section<'_>) -> anyhow::Result<Vec<String>> {
    let mut names = s
        .list_opt("STRIP_FIELDS")?
        .unwrap_or_else(|| vec![DECRYPT_RESULT_HEADER.to_owned()]);
    for name in &names {
        if !is_field_name(name) {
            bail!("[{SECTION}] STRIP_FIELDS: {name:?} is not a header field name");
        }
    }
    for name in cfg.stage_names() {
        let stage = cfg.stage_section(&name);
        let program = stage.string_opt("PROGRAM")?.unwrap_or_default();
        let runs_decrypt = std::path::Path::new(program.trim())
            .file_name()
            .is_some_and(|f| f == "pepsi-stage-decrypt");
        if !runs_decrypt {
            continue;
        }
        let name = stage
            .string_opt("RESULT_HEADER")?
            .unwrap_or_else(|| DECRYPT_RESULT_HEADER.to_owned());
        if is_field_name(&name) {
            names.push(name);
        }
    }
    let mut seen = Vec::<String>::new();
    names.retain(|n| {
        let lower = n.to_ascii_lowercase();
        let new = !seen.contains(&lower);
        seen.push(lower);
        new
    });
    Ok(names)
}

/// RFC 5322 §3.6.8: printable ASCII but the colon, at least one.
fn is_field_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (33..=126).contains(&b) && b != b':')
}

impl Options {
    /// Reads and validates the ingress's options and its listener sections.
    pub fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section(SECTION);
        let hostname = cfg.name_option(&s, "HOSTNAME")?;
        let local_domains = s.or_global().list_opt("LOCAL_DOMAINS")?.unwrap_or_default();
        let servers = pepsi_outbound::dns::servers_opt(&s)?.unwrap_or_default();
        let settings = Options {
            authserv_id: s
                .string_opt("AUTHSERV_ID")?
                .unwrap_or_else(|| hostname.clone()),
            hostname,
            local: pepsi_contract::local::LocalRecipients::from_config(cfg)?
                .with_domains(local_domains.clone()),
            local_domains: local_domains
                .into_iter()
                .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            max_message_size: s.size_opt("MAX_MESSAGE_SIZE")?.unwrap_or(25 << 20),
            max_recipients: s.number_opt("MAX_RECIPIENTS")?.unwrap_or(100),
            max_line_length: s.number_opt("MAX_LINE_LENGTH")?.unwrap_or(1000),
            max_command_length: s.number_opt("MAX_COMMAND_LENGTH")?.unwrap_or(2048),
            max_bad_commands: s.number_opt("MAX_BAD_COMMANDS")?.unwrap_or(10),
            command_timeout: s
                .duration_opt("COMMAND_TIMEOUT")?
                .unwrap_or(Duration::from_secs(300)),
            data_timeout: s
                .duration_opt("DATA_TIMEOUT")?
                .unwrap_or(Duration::from_secs(600)),
            lookup_timeout: s
                .duration_opt("LOOKUP_TIMEOUT")?
                .unwrap_or(Duration::from_secs(10)),
            write_timeout: s
                .duration_opt("WRITE_TIMEOUT")?
                .unwrap_or(Duration::from_secs(300)),
            max_session_time: s
                .duration_opt("MAX_SESSION_TIME")?
                .unwrap_or(Duration::from_secs(3600)),
            max_commands: s.number_opt("MAX_COMMANDS")?.unwrap_or(10_000),
            max_junk_commands: s.number_opt("MAX_JUNK_COMMANDS")?.unwrap_or(100),
            client_prefix_v4: s.number_opt("CLIENT_PREFIX_V4")?.unwrap_or(32),
            client_prefix_v6: s.number_opt("CLIENT_PREFIX_V6")?.unwrap_or(64),
            message_memory: s.size_opt("MESSAGE_MEMORY")?.unwrap_or(1 << 30),
            domain_cache_ttl: s
                .duration_opt("DOMAIN_CACHE_TTL")?
                .unwrap_or(Duration::from_secs(10)),
            recipient_cache_ttl: s
                .duration_opt("RECIPIENT_CACHE_TTL")?
                .unwrap_or(Duration::from_secs(10)),
            check_quota: s.bool_opt("CHECK_QUOTA")?.unwrap_or(true),
            quota_usage_ttl: s
                .duration_opt("QUOTA_USAGE_TTL")?
                .unwrap_or(Duration::from_secs(15 * 60)),
            quota_cache_ttl: s
                .duration_opt("QUOTA_CACHE_TTL")?
                .unwrap_or(Duration::from_secs(10)),
            stats_interval: s
                .duration_opt("STATS_INTERVAL")?
                .unwrap_or(Duration::from_secs(10))
                .max(Duration::from_millis(100)),
            auth_failures_per_client: s.number_opt("AUTH_FAILURES_PER_CLIENT")?.unwrap_or(10),
            auth_failures_per_account: s.number_opt("AUTH_FAILURES_PER_ACCOUNT")?.unwrap_or(30),
            auth_failure_window: s
                .duration_opt("AUTH_FAILURE_WINDOW")?
                .unwrap_or(Duration::from_secs(900)),
            auth_concurrency: s.number_opt("AUTH_CONCURRENCY")?.unwrap_or(4),
            tls_handshake_timeout: s
                .duration_opt("TLS_HANDSHAKE_TIMEOUT")?
                .unwrap_or(Duration::from_secs(30)),
            max_connections: s.number_opt("MAX_CONNECTIONS")?.unwrap_or(1000),
            max_connections_per_client: s.number_opt("MAX_CONNECTIONS_PER_CLIENT")?.unwrap_or(20),
            dispatch_wake_interval: s
                .duration_opt("DISPATCH_WAKE_INTERVAL")?
                .unwrap_or(Duration::ZERO),
            admission: crate::admission::Limits {
                batch: s.number_opt("ADMISSION_BATCH")?.unwrap_or(32),
                batch_size: s.size_opt("ADMISSION_BATCH_SIZE")?.unwrap_or(4 << 20),
                lanes: s.number_opt("ADMISSION_LANES")?.unwrap_or(2),
                timeout: s
                    .duration_opt("ADMISSION_TIMEOUT")?
                    .unwrap_or(Duration::from_secs(60)),
            },
            inflow: crate::inflow::Limits {
                backlog: s.number_opt("INFLOW_BACKLOG")?.unwrap_or(500),
                delay: s
                    .duration_opt("INFLOW_DELAY")?
                    .unwrap_or(Duration::from_secs(1)),
                poll: s
                    .duration_opt("INFLOW_POLL")?
                    .unwrap_or(Duration::from_millis(50)),
            },
            shutdown_grace: s
                .duration_opt("SHUTDOWN_GRACE")?
                .unwrap_or(Duration::from_secs(30)),
            dns: DnsOptions {
                servers,
                timeout: s
                    .duration_opt("DNS_TIMEOUT")?
                    .unwrap_or(Duration::from_secs(2)),
                budget: s
                    .duration_opt("DNS_BUDGET")?
                    .unwrap_or(Duration::from_secs(10)),
                max_dkim_signatures: s.number_opt("MAX_DKIM_SIGNATURES")?.unwrap_or(5),
                negative_ttl: s
                    .duration_opt("DNS_NEGATIVE_TTL")?
                    .unwrap_or(Duration::from_secs(60)),
                failure_ttl: s
                    .duration_opt("DNS_FAILURE_TTL")?
                    .unwrap_or(Duration::from_secs(30)),
            },
            strip_fields: strip_fields(cfg, &s)?,
            listeners: listeners(cfg)?,
        };
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.listeners.is_empty() {
            bail!("no [{LISTENER_PREFIX}<name>] section: the ingress would accept nothing");
        }
        if self.max_line_length < 80 {
            bail!(
                "[{SECTION}] MAX_LINE_LENGTH = {}: must be at least 80",
                self.max_line_length
            );
        }
        if self.max_command_length < 512 {
            bail!(
                "[{SECTION}] MAX_COMMAND_LENGTH = {}: RFC 5321 needs at least 512",
                self.max_command_length
            );
        }
        if self.client_prefix_v4 > 32 || self.client_prefix_v6 > 128 {
            bail!(
                "[{SECTION}] CLIENT_PREFIX_V4 = {}, CLIENT_PREFIX_V6 = {}: at most 32 and 128 bits",
                self.client_prefix_v4,
                self.client_prefix_v6
            );
        }
        if self.message_memory < self.max_message_size {
            bail!(
                "[{SECTION}] MESSAGE_MEMORY = {} is less than MAX_MESSAGE_SIZE = {}: no message \
                 of the largest size could ever be received",
                self.message_memory,
                self.max_message_size
            );
        }
        for (name, d) in [
            ("WRITE_TIMEOUT", self.write_timeout),
            ("MAX_SESSION_TIME", self.max_session_time),
            ("COMMAND_TIMEOUT", self.command_timeout),
            ("DATA_TIMEOUT", self.data_timeout),
        ] {
            if d.is_zero() {
                bail!("[{SECTION}] {name} = 0: a session needs a time limit");
            }
        }
        if self.lookup_timeout < Duration::from_secs(1)
            || self.lookup_timeout > Duration::from_secs(300)
        {
            bail!(
                "[{SECTION}] LOOKUP_TIMEOUT = {:?}: from 1s to 5m (clients wait 5 minutes for the reply to RCPT)",
                self.lookup_timeout
            );
        }
        let a = &self.admission;
        if a.batch == 0 || a.batch > 1000 {
            bail!(
                "[{SECTION}] ADMISSION_BATCH = {}: from 1 (every message alone) to 1000",
                a.batch
            );
        }
        if a.lanes == 0 || a.lanes > 64 {
            bail!("[{SECTION}] ADMISSION_LANES = {}: from 1 to 64", a.lanes);
        }
        if a.batch_size == 0 {
            bail!("[{SECTION}] ADMISSION_BATCH_SIZE must be larger than 0");
        }
        if a.timeout < Duration::from_secs(1) || a.timeout > Duration::from_secs(600) {
            bail!(
                "[{SECTION}] ADMISSION_TIMEOUT = {:?}: from 1s to 10m (clients wait 10 minutes for the reply to DATA)",
                a.timeout
            );
        }
        let f = &self.inflow;
        if f.backlog > 1_000_000 {
            bail!(
                "[{SECTION}] INFLOW_BACKLOG = {}: from 0 (no inflow control) to 1000000 rows",
                f.backlog
            );
        }
        if f.delay > Duration::from_secs(60) {
            bail!(
                "[{SECTION}] INFLOW_DELAY = {:?}: from 0s to 1m (a client waits this long, at most, for the reply to DATA on top of the storing)",
                f.delay
            );
        }
        if f.poll < Duration::from_millis(1) || f.poll > Duration::from_secs(10) {
            bail!("[{SECTION}] INFLOW_POLL = {:?}: from 1ms to 10s", f.poll);
        }
        if self.auth_concurrency == 0 {
            bail!("[{SECTION}] AUTH_CONCURRENCY must be at least 1");
        }
        if self.auth_failure_window.is_zero() {
            bail!("[{SECTION}] AUTH_FAILURE_WINDOW must be longer than 0");
        }
        if self.max_commands == 0 || self.max_junk_commands == 0 {
            bail!("[{SECTION}] MAX_COMMANDS and MAX_JUNK_COMMANDS must be at least 1");
        }
        if self.max_recipients == 0 || self.max_connections == 0 {
            bail!("[{SECTION}] MAX_RECIPIENTS and MAX_CONNECTIONS must be at least 1");
        }
        for (i, a) in self.listeners.iter().enumerate() {
            if let Some(b) = self.listeners[..i].iter().find(|b| b.address == a.address) {
                bail!(
                    "[{LISTENER_PREFIX}{}] ADDRESS = {}: already used by [{LISTENER_PREFIX}{}]",
                    a.name,
                    a.address,
                    b.name
                );
            }
        }
        Ok(())
    }
}

fn listeners(cfg: &Config) -> anyhow::Result<Vec<ListenerConfig>> {
    let check_recipients = cfg.section(SECTION).bool_opt("CHECK_RECIPIENTS")?;
    let mut out = Vec::new();
    for name in cfg.sections() {
        let lower = name.to_ascii_lowercase();
        let Some(short) = lower.strip_prefix(LISTENER_PREFIX) else {
            if lower.starts_with("listener") {
                bail!("[{name}]: listener sections are named [{LISTENER_PREFIX}<name>]");
            }
            continue;
        };
        if short.is_empty() {
            bail!("[{name}]: a listener needs a name after {LISTENER_PREFIX:?}");
        }
        out.push(listener(short, &cfg.section(name), check_recipients)?);
    }
    Ok(out)
}

/// One listener; `check_recipients` is `[pepsi-ingress] CHECK_RECIPIENTS` when set.
fn listener(
    name: &str,
    s: &Section<'_>,
    check_recipients: Option<bool>,
) -> anyhow::Result<ListenerConfig> {
    let section = s.name();
    let role = match s
        .choice("ROLE", &["mx", "submission", "submissions"])?
        .as_str()
    {
        "mx" => Role::Mx,
        "submission" => Role::Submission,
        _ => Role::Submissions,
    };
    let address_text = s.string("ADDRESS")?;
    let address: SocketAddr = address_text.parse().with_context(|| {
        format!("[{section}] ADDRESS = {address_text:?}: expected IP:port, such as 0.0.0.0:25 or [::]:587")
    })?;
    let tls = match (s.path_opt("TLS_CERT")?, s.path_opt("TLS_KEY")?) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        (None, None) => None,
        _ => bail!("[{section}]: TLS_CERT and TLS_KEY go together; one is missing"),
    };
    let submission = role != Role::Mx;
    let plaintext_auth = s.bool_opt("ALLOW_PLAINTEXT_AUTH")?.unwrap_or(false);
    let auth = s.bool_opt("AUTH")?.unwrap_or(submission);
    let require_auth = s.bool_opt("REQUIRE_AUTH")?.unwrap_or(submission);
    if role == Role::Submissions && tls.is_none() {
        bail!("[{section}] ROLE = submissions needs TLS_CERT and TLS_KEY (implicit TLS)");
    }
    if role == Role::Submission && tls.is_none() && !plaintext_auth {
        bail!(
            "[{section}] ROLE = submission needs TLS_CERT and TLS_KEY for STARTTLS (or ALLOW_PLAINTEXT_AUTH = yes on a test rig)"
        );
    }
    if require_auth && !auth {
        bail!("[{section}] REQUIRE_AUTH = yes with AUTH = no would refuse every message");
    }
    Ok(ListenerConfig {
        name: name.to_owned(),
        role,
        address,
        tls,
        auth,
        require_auth,
        plaintext_auth,
        verify: s.bool_opt("VERIFY")?.unwrap_or(!submission),
        sender_login_binding: s.bool_opt("SENDER_LOGIN_BINDING")?.unwrap_or(true),
        check_recipients: s
            .bool_opt("CHECK_RECIPIENTS")?
            .or(check_recipients)
            .unwrap_or(role == Role::Mx),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> anyhow::Result<Options> {
        Options::from_config(&Config::from_str_named(text, "test.conf")?)
    }

    #[test]
    fn defaults_and_roles() {
        let s = load(
            "[pepsi]\nLOCAL_DOMAINS = Example.TEST\n\
             [listener-mx]\nROLE = mx\nADDRESS = 127.0.0.1:2525\n\
             [listener-sub]\nROLE = submission\nADDRESS = 127.0.0.1:2587\nTLS_CERT = c.pem\nTLS_KEY = k.pem\n",
        )
        .unwrap();
        assert_eq!(s.local_domains, ["example.test"]);
        assert_eq!(s.authserv_id, s.hostname);
        let mx = s.listeners.iter().find(|l| l.name == "mx").unwrap();
        assert!(!mx.auth && !mx.require_auth && mx.verify && mx.tls.is_none());
        let sub = s.listeners.iter().find(|l| l.name == "sub").unwrap();
        assert!(sub.auth && sub.require_auth && !sub.verify && !sub.plaintext_auth);
    }

    #[test]
    fn strip_fields_hold_the_decrypt_result_fields() {
        let base = "[listener-a]\nROLE = mx\nADDRESS = 127.0.0.1:1\n";
        assert_eq!(load(base).unwrap().strip_fields, ["X-Pepsi-Decrypted"]);
        let s = load(&format!(
            "{base}[stage-decrypt]\nPROGRAM = /usr/lib/pepsi/pepsi-stage-decrypt\n\
             RESULT_HEADER = X-Our-Decrypted\n\
             [stage-other]\nPROGRAM = pepsi-stage-decrypt\n\
             [stage-arc]\nPROGRAM = pepsi-stage-arc\nRESULT_HEADER = X-Not-Ours\n"
        ))
        .unwrap();
        assert_eq!(s.strip_fields, ["X-Pepsi-Decrypted", "X-Our-Decrypted"]);
        // A stage section's name matches in any case, as the dispatcher runs it.
        let s = load(&format!(
            "{base}[Stage-Decrypt]\nPROGRAM = pepsi-stage-decrypt\nRESULT_HEADER = X-Upper\n"
        ))
        .unwrap();
        assert_eq!(s.strip_fields, ["X-Pepsi-Decrypted", "X-Upper"]);
        let s = load(&format!("{base}[pepsi-ingress]\nSTRIP_FIELDS = X-A, x-b\n")).unwrap();
        assert_eq!(s.strip_fields, ["X-A", "x-b"]);
        let e = load(&format!("{base}[pepsi-ingress]\nSTRIP_FIELDS = X:A\n")).unwrap_err();
        assert!(
            format!("{e:#}").contains("\"X:A\" is not a header field name"),
            "{e:#}"
        );
    }

    #[test]
    fn refused_table() {
        let base = "[listener-a]\nROLE = mx\nADDRESS = 127.0.0.1:1\n";
        let cases: &[(&str, &str)] = &[
            ("[pepsi-ingress]\nHOSTNAME = x\n", "no [listener-<name>]"),
            (
                "[listener-a]\nROLE = relay\nADDRESS = 127.0.0.1:1\n",
                "ROLE",
            ),
            (
                "[listener-a]\nROLE = mx\nADDRESS = localhost\n",
                "\"localhost\"",
            ),
            (
                "[listener-a]\nROLE = submissions\nADDRESS = 127.0.0.1:1\n",
                "implicit TLS",
            ),
            (
                "[listener-a]\nROLE = submission\nADDRESS = 127.0.0.1:1\n",
                "STARTTLS",
            ),
            (
                "[listener-a]\nROLE = mx\nADDRESS = 127.0.0.1:1\nTLS_CERT = c\n",
                "go together",
            ),
            (
                "[listener-a]\nROLE = mx\nADDRESS = 127.0.0.1:1\nREQUIRE_AUTH = yes\n",
                "AUTH = no",
            ),
            ("[listener]\nROLE = mx\n", "named [listener-<name>]"),
            (
                &format!("{base}[listener-b]\nROLE = mx\nADDRESS = 127.0.0.1:1\n"),
                "already used",
            ),
            (
                &format!("{base}[pepsi-ingress]\nDNS_SERVERS = dns.example\n"),
                "dns.example",
            ),
            (
                &format!("{base}[pepsi-ingress]\nMAX_COMMAND_LENGTH = 100\n"),
                "512",
            ),
            (
                &format!("{base}[pepsi-ingress]\nLOOKUP_TIMEOUT = 10m\n"),
                "LOOKUP_TIMEOUT = 600s: from 1s to 5m",
            ),
            (
                &format!("{base}[pepsi-ingress]\nINFLOW_BACKLOG = 1000001\n"),
                "INFLOW_BACKLOG = 1000001: from 0 (no inflow control) to 1000000 rows",
            ),
            (
                &format!("{base}[pepsi-ingress]\nINFLOW_DELAY = 2m\n"),
                "INFLOW_DELAY = 120s: from 0s to 1m",
            ),
            (
                &format!("{base}[pepsi-ingress]\nINFLOW_POLL = 0s\n"),
                "INFLOW_POLL = 0ns: from 1ms to 10s",
            ),
            (
                &format!("{base}[pepsi-ingress]\nINFLOW_BACKLOG = lots\n"),
                "INFLOW_BACKLOG",
            ),
        ];
        for (text, needle) in cases {
            let err = format!("{:#}", load(text).expect_err(text));
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let s = load(&format!(
            "{base}[pepsi-ingress]\nDNS_SERVERS = 127.0.0.1:5353 ::1\n"
        ))
        .unwrap();
        assert_eq!(
            s.dns.servers,
            [
                "127.0.0.1:5353".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
    }
}
