//! pepsi-stage-relay-to-internet: delivers mail for other domains to their MX hosts by
//! SMTP, one envelope recipient per attempt, and turns the answer into the message's fate
//! through `delivery::conclude`.
//!
//! Reads: envelope, `state.dsn` (passed on to peers that offer DSN), `state.origin.smtputf8`,
//! `state.attempts`/`delay_sent`, headers and body (`Load::Full`). Writes (through
//! `conclude`): `attempts`, `last_error`, `delay_sent` on a paused row; `bounce` on the
//! notification clones. Fan-out: `split_to_one_per_row` on a row with several recipients.
//! Terminal helpers: only those `conclude` picks — `advance_or_finish`, `finish_with`
//! (bounce, success notice) or `pause_with` (backoff).
//!
//! Besides the queue row, the stage reads and writes `pepsi.dns_address` (`cache`, the
//! resolved MX-host addresses with their connect health), `pepsi.mta_sts_policy` (`sts`, the
//! MTA-STS policies of recipient domains) and `pepsi.tls_report_result` (`tls_result`, each
//! session's TLS result for TLS reports), and nothing else.
//!
//! Modules: `options` (the section, pure), `route` (MX answer → hosts in order, pure),
//! `cache` (the address cache's stored functions), `sts` (which MTA-STS policy applies),
//! `tls_result` (what a session means for TLS reports), `attempt` (the walk over hosts and
//! addresses, the transport security of each, MTA-STS or DANE, and what ends it). The DNS
//! lookups are `pepsi_outbound::dns`'s (DANE's through its `Validating`); the sessions kept
//! between messages are `pepsi_outbound::keep`'s, under its `MX_HOSTS` rules.

pub mod attempt;
pub mod cache;
pub mod options;
pub mod route;
pub mod sts;
pub mod tls_result;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use pepsi_conf::address::Address;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_outbound::delivery::{self, Failure, RcptResult};

use crate::attempt::{Attempt, Key};
use crate::options::Options;
use pepsi_outbound::dns::Dns;
use pepsi_outbound::keep::{Keeper, Rules};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-relay-to-internet",
        exec: "pepsi-stage-relay-to-internet",
    };
    pub const PROGRAM: &str = "pepsi-stage-relay-to-internet";
}

/// One stage section, built at start: its options, its resolver and its kept sessions.
pub struct Built {
    pub options: Options,
    pub dns: Dns,
    pub keeper: Keeper<Key>,
    pub sts: sts::Fetcher,
    /// The validating resolver, with `DANE = yes`.
    pub validating: Option<pepsi_outbound::dns::Validating>,
}

/// The stage: whether this worker swept the address cache (each section's `Built` is its
/// section).
#[derive(Default)]
pub struct RelayToInternet {
    swept: AtomicBool,
}

impl Stage for RelayToInternet {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    type Section = Built;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::default())
    }

    /// Reads and checks `[stage-<name>]`, and makes its resolver.
    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Built> {
        let options = Options::from_config(cfg, name)?;
        pepsi_contract::stage::check_attempt_timeout(cfg, name, options.attempt_timeout)
            .map_err(anyhow::Error::msg)?;
        let dns = Dns::new(&options.dns_servers, options.dns_timeout)
            .with_context(|| format!("[stage-{name}]"))?;
        let keeper = Keeper::new(Rules::MX_HOSTS);
        let sts = sts::Fetcher::new(&options).with_context(|| format!("[stage-{name}]"))?;
        let validating = match options.dane {
            true => Some(
                pepsi_outbound::dns::Validating::new(
                    &options.dane_dns_servers,
                    options.dns_timeout,
                )
                .with_context(|| format!("[stage-{name}] DANE_DNS_SERVERS"))?,
            ),
            false => None,
        };
        Ok(Built {
            options,
            dns,
            keeper,
            sts,
            validating,
        })
    }

    async fn process(
        &self,
        built: &Built,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        if ctx.rcpt_to().len() > 1 {
            ctx.split_to_one_per_row().await?;
        }
        if !self.swept.swap(true, Ordering::Relaxed) {
            cache::gc(ctx.pool()).await;
            sts::gc(ctx.pool()).await;
        }
        let rcpt = ctx.rcpt_to()[0].clone();
        let result = match Address::parse(&rcpt).map(Address::into_parts) {
            Err(_) => {
                let mut f =
                    Failure::new(format!("{rcpt:?} is not an address with a domain"), "5.1.3");
                f.phase = Some("routing".into());
                RcptResult::Permanent(f)
            }
            Ok((_, domain)) => {
                let message = ctx.raw_message()?;
                let env = pepsi_outbound::delivery::envelope(
                    ctx.mail_from(),
                    ctx.rcpt_to(),
                    ctx.state(),
                )?;
                let attempt = Attempt {
                    options: &built.options,
                    dns: &built.dns,
                    pool: ctx.pool(),
                    keeper: &built.keeper,
                    sts: &built.sts,
                    validating: built.validating.as_ref(),
                };
                let limit = built.options.attempt_timeout;
                match tokio::time::timeout(limit, attempt.deliver(&env, &domain, &message)).await {
                    Ok(result) => result,
                    Err(_) => {
                        let mut f = Failure::attempt_timed_out(limit);
                        f.phase = Some("connect".into());
                        RcptResult::Transient(f)
                    }
                }
            }
        };
        if let RcptResult::Transient(f) | RcptResult::Permanent(f) = &result {
            tracing::info!(id = ctx.id(), %rcpt, "not delivered: {}", f.summary());
        }
        delivery::conclude(ctx, &built.options.policy, &[result])
    }
}

const ABOUT: &str = "Pepsi delivery stage that sends mail for other domains to their MX hosts";

const LONG_ABOUT: &str = "\
Pepsi delivery stage that sends mail for other domains to their MX hosts by SMTP

A message with several recipients is first split into one row per recipient, each \
delivered, retried and bounced on its own. For a recipient the stage looks up the MX \
records of its domain (without any, the domain's own A/AAAA records: RFC 5321 5.1), tries \
the hosts in preference order (random among equal preferences) and each host's addresses \
in order of connect health, and takes the first answer a server gives:

  delivered                      2xx after the message
  bounced (BOUNCE_STAGE)         5xx to MAIL, RCPT or DATA; NXDOMAIN (5.1.2); a null MX
                                 (RFC 7505, 5.1.10); this host as best MX (5.4.6)
  paused, retried with backoff   4xx; a connection lost during the message; no host
                                 reachable (refused, timeouts, 421, refused greeting);
                                 DNS failure (SERVFAIL, timeout: 4.4.3); an MX host that
                                 does not resolve; a malformed reply

Sessions use STARTTLS as the recipient domain's policy says (verify checks the \
certificate against the MX host name). A domain that publishes an MTA-STS policy \
(RFC 8461) gets it: under enforce only the MX hosts the policy names are tried, each with \
a certificate valid for its name, and mail that cannot go so waits (4.7.5) and is bounced \
at MAX_LIFETIME, never sent in clear; under testing mail goes as usual and the failures \
are counted. Policies are cached in pepsi.mta_sts_policy for their max_age; a TLS_DOMAINS \
entry overrides a domain's policy. With DANE = yes an MX host with a DNSSEC-secure TLSA \
record set (RFC 7672) must present a certificate matching it, over STARTTLS, or is \
skipped (4.7.5); DANE wins over MTA-STS. Every session's TLS result is counted per day in \
pepsi.tls_report_result for TLS reports (RFC 8460). An 8-bit message for a server without 8BITMIME is \
converted to 7 bits; one that needs SMTPUTF8 for a server without it is bounced (5.6.7).

Resolved addresses are kept in pepsi.dns_address until their DNS TTL: a working address \
is used first, one that refused is tried last, and a host is resolved again when all its \
addresses failed or expired.

Options of [stage-<name>]:
  DNS_SERVERS       ip or ip:port list ([pepsi] DNS_SERVERS; default /etc/resolv.conf)
  DNS_TIMEOUT       10s per query and server ([pepsi] DNS_TIMEOUT)
  SMTP_PORT         25
  HELO_NAME         name given in EHLO/HELO (default [pepsi] HOSTNAME, else the host name)
  CONNECT_TIMEOUT   30s    GREETING_TIMEOUT 5m    COMMAND_TIMEOUT 5m    DATA_TIMEOUT 10m
  IPV6              prefer (IPv6 first among equally healthy addresses) | no (IPv4 only)
                    ([pepsi] IPV6; default prefer)
  MAX_ADDRESSES     10     addresses one attempt connects to at most
  CONNECTION_IDLE   5s     keep a session open this long for the next message to the same
                           MX host and address (RSET before reuse); 0 = QUIT after each
  TLS               none | may | encrypt | verify   policy for every domain (default may)
  TLS_DOMAINS       domain:policy, ...              a policy per recipient domain
  TLS_CA_FILE       PEM file of the CAs verify trusts (default: the system's roots)
  MTA_STS           yes | no    look up and apply MTA-STS policies (default yes)
  MTA_STS_TIMEOUT   20s         one policy fetch, connect to last byte
  MTA_STS_REFRESH   1d          fetch a cached policy again once it is this old
  MTA_STS_FETCH_BACKOFF 5m      after a failed fetch, ask the policy host again only then
  MTA_STS_CA_FILE   PEM file of the CAs a policy host must chain to (default: the web PKI)
  MTA_STS_PORT      443         HTTPS port of policy hosts
  TLS_REPORTING     yes | no    count TLS results for TLS reports (default yes)
  DANE              yes | no    use DNSSEC-validated TLSA records of MX hosts (default no)
  DANE_DNS_SERVERS  the validating resolver whose AD bit DANE trusts (default DNS_SERVERS)
  RETRY_INITIAL 5m, RETRY_FACTOR 2, RETRY_MAX_INTERVAL 1h, DELAY_WARNING 4h (0 = off),
  MAX_LIFETIME 5d          retry policy; each falls back to [pepsi], then to the default
  BOUNCE_STAGE, NEXT_STAGE, ORIGINATE_SUCCESS_DSN   as for every stage

See docs/relay-internet.md.";

/// The command line of `pepsi-stage-relay-to-internet`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}

/// Entry point of the `pepsi-stage-relay-to-internet` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<RelayToInternet>(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}
