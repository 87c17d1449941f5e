//! pepsi-setup: creates, upgrades and verifies the Pepsi database, prints and checks a mail
//! domain's DNS records, and carries out the online setup's tasks.
//!
//! `pepsi-setup db` applies the numbered patches in `db/` that the database lacks, re-applies
//! `db/procedures.sql`, creates the PostgreSQL roles and brings their privileges to exactly
//! the matrix in `schema::privilege_matrix`, then verifies that matrix against the live
//! server. A second run changes nothing.
//!
//! `pepsi-setup dns` makes a domain's DKIM key and prints the records to publish (`dns`);
//! `pepsi-setup check-dns` looks up what is published and names what is missing or wrong
//! (`dns_check`, which pepsi-httpd's setup page runs too).
//!
//! `pepsi-setup apply` (root) carries out the online setup's tasks, the rows of
//! `pepsi.setup_task` the configuration role wrote (`apply`; a certificate over ACME in
//! `apply::acme`).

pub mod apply;
pub mod dns;
pub mod dns_check;
pub mod schema;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "setup",
        exec: "pepsi-setup",
    };
}

/// Provision and upgrade a Pepsi installation.
#[derive(Debug, Parser)]
#[command(name = "pepsi-setup", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the database, its procedures, roles and grants, then verify them.
    ///
    /// Creates the database named in the URL when it does not exist, applies every numbered
    /// patch not yet recorded in pepsi.schema_patch (each in the same transaction as its
    /// record), re-applies procedures.sql, creates the roles (pipeline, ingress, config,
    /// sendmail, httpd) and grants each exactly its privileges (the sendmail role: EXECUTE
    /// on pepsi.sendmail_submit and nothing else; the httpd role alone: the credential
    /// tables), and checks them against the live server. Running
    /// it again changes nothing. Exit status 0 when the database is current and verified,
    /// 1 on any error, 2 when --check finds work to do.
    #[command(long_about)]
    Db(DbArgs),

    /// Make a domain's DKIM key and print the DNS records to publish for it.
    ///
    /// Generates a DKIM key (RSA 2048 by default, or Ed25519) for DOMAIN under SELECTOR,
    /// stores the private key (a new PEM file with --key-file, mode 0600; else a row of
    /// pepsi.signing_key in the database of [database] URL or --database-url, which the
    /// signing stage uses with DATABASE_KEYS = yes), and prints the records an operator
    /// publishes, as zone-file lines: MX, SPF ("v=spf1 mx -all"), the DKIM key, DMARC with
    /// aggregate reports to --reports, and unless --mta-sts off the MTA-STS and TLS-RPT
    /// records together with the MTA-STS policy file to serve over HTTPS (pepsi-httpd serves
    /// it with [pepsi-httpd] MTA_STS_MODE), and with a certificate (--certificate, else
    /// the TLS_CERT of the first [listener-<name>] with ROLE = mx) the DANE TLSA record of the MX (3 1 1, publish it only in a
    /// DNSSEC-signed zone). --json prints the
    /// same as JSON. An existing key file or database row is never replaced: choose another
    /// selector to rotate. Exit status 0 on success, 1 on any error (named).
    #[command(long_about)]
    Dns(DnsArgs),

    /// Check the DNS records a mail domain publishes, and print the ones to fix.
    ///
    /// Looks up, through the resolver of --dns-server (else [pepsi] DNS_SERVERS, else
    /// /etc/resolv.conf; [pepsi] DNS_TIMEOUT per attempt, 5s by default), every record
    /// pepsi-setup dns prints for DOMAIN and the reverse DNS of the MX host, and judges
    /// each: ok, missing, wrong, failed (the lookup got no answer: SERVFAIL, a refusal, a
    /// timeout; nothing is known, and it is never reported as missing) or unchecked (no
    /// DKIM key to compare with). Where exact text would be too strict the comparison is of
    /// meaning: the MX records must name --mx (default [pepsi] HOSTNAME, else this system's
    /// host name); there must be one v=spf1 record, which lets the MX send (an mx term for
    /// the domain, an a term naming the MX host, or ip4:/ip6: terms holding its addresses;
    /// include: and redirect= are not followed) and does not end in +all; one DKIM record
    /// at SELECTOR._domainkey.DOMAIN whose p= is the public half of the domain's key in
    /// pepsi.signing_key (the key of --selector, else the domain's newest enabled key; the
    /// database of [database] URL or --database-url); one v=DMARC1 record with a policy
    /// (p=); one v=STSv1 record with a valid id; one v=TLSRPTv1 record with a mailto: or
    /// https: rua=; an A or AAAA record of the MX host; and for each of its addresses a PTR
    /// record naming the MX host (published by whoever holds the address).
    ///
    /// Prints a table (record, name, status), then for each record that is not ok why,
    /// what was found, and the exact zone-file line to publish instead: the record
    /// pepsi-setup dns prints (DMARC p=none, reports to --reports), or for an SPF record
    /// that lacks the MX that record with mx added. --json prints the same as JSON for
    /// scripts and pages. Exit status 0 when every record is ok, 1 when one is missing,
    /// wrong, failed or unchecked, or on an error (named).
    #[command(long_about)]
    CheckDns(CheckDnsArgs),

    /// Carry out the setup tasks the setup pages wrote to pepsi.setup_task (as root).
    ///
    /// pepsi-httpd runs without privileges, so the setup pages do not change the system:
    /// through the configuration role they add rows to pepsi.setup_task, each saying what
    /// should be true (the host name, the mail domains, a certificate from files or over
    /// ACME with certbot, a DKIM key, the relay, local delivery, a mailbox;
    /// pepsi-setup-model's eleven kinds), and apply,
    /// run as root, makes it so. The trust model: a row is carried out only when the
    /// database says the configuration role wrote it (written_by, which a trigger sets
    /// from the connection's role, never from the row) and its parameters are exactly
    /// those of its kind, each validated; any other row is refused and the refusal
    /// logged. Root is reached through that table only, never through a socket, and every
    /// request and outcome stays a row. Whoever holds the configuration role can already
    /// change every override; apply adds the host name, domains, certificate files,
    /// DKIM keys, relay, delivery and mailboxes, each checked as the programs check them.
    ///
    /// Each task is carried out in steps, each logged in pepsi.setup_task_log as it
    /// happens: the steps that may safely run twice first (the schema, a DKIM key kept
    /// if one exists, a secrets.d/ fragment 0640 root:SECRETS_GROUP), then the edits of
    /// the configuration file, made in a candidate beside it, checked by every program's
    /// parser (CHECK_PROGRAM -c CANDIDATE check, default the pepsi-config beside this
    /// program), the old file kept as NAME.bak-TASK and the candidate renamed over it,
    /// then RELOAD_COMMAND (default systemctl try-reload-or-restart pepsi.target). A task
    /// that fails leaves the configuration as it was; killed mid-task, apply runs the task
    /// again when it next starts (at most three starts). Once done, a task's secrets (the
    /// smarthost password, a mailbox's password hash) are replaced by (redacted).
    ///
    /// Without --follow, apply carries out every pending task and exits: 0 when every
    /// task was done, 1 when one failed or was refused (each printed), or on an error.
    /// With --follow it then waits for new tasks (NOTIFY setup_task) until stopped, as
    /// pepsi-setup-apply.service runs it. Only one apply runs per database.
    #[command(long_about)]
    Apply(ApplyArgs),
}

#[derive(Debug, clap::Args)]
struct ApplyArgs {
    /// PostgreSQL URL (a superuser or the schema's owner); overrides [database] URL of the
    /// configuration file
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,

    /// After the pending tasks, wait for new ones until stopped
    #[arg(long)]
    follow: bool,
}

#[derive(Debug, clap::Args)]
struct DnsArgs {
    /// The mail domain, e.g. example.org
    domain: String,

    /// The host that receives the domain's mail (the MX); default [pepsi] HOSTNAME, else
    /// this system's host name
    #[arg(long, value_name = "HOST")]
    mx: Option<String>,

    /// DKIM selector; default s<year><month>, e.g. s202612
    #[arg(long)]
    selector: Option<String>,

    /// DKIM key algorithm
    #[arg(long, value_enum, default_value = "rsa")]
    algorithm: dns::Algorithm,

    /// Where DMARC aggregate and TLS-RPT reports go; default postmaster@DOMAIN
    #[arg(long, value_name = "ADDRESS")]
    reports: Option<String>,

    /// DMARC policy for mail that fails: start with none, move to quarantine or reject
    /// once the reports show every legitimate source passes
    #[arg(long, value_enum, default_value = "none")]
    dmarc: dns::DmarcPolicy,

    /// MTA-STS mode; off prints neither MTA-STS nor TLS-RPT records
    #[arg(long, value_enum, default_value = "testing")]
    mta_sts: dns::MtaSts,

    /// The MX's TLS certificate (PEM; default the TLS_CERT of the first [listener-<name>]
    /// with ROLE = mx): print the DANE
    /// TLSA record of _25._tcp.<MX> for it, 3 1 1 (the certificate's own public key,
    /// SHA-256), which survives a renewal that keeps the key
    #[arg(long, value_name = "PEM")]
    certificate: Option<std::path::PathBuf>,

    /// Write the private key to this new file (PEM, mode 0600) instead of the database
    #[arg(long, value_name = "PATH")]
    key_file: Option<std::path::PathBuf>,

    /// PostgreSQL URL for the key; overrides [database] URL of the configuration file
    #[arg(long, value_name = "URL", conflicts_with = "key_file")]
    database_url: Option<String>,

    /// Print the records as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct CheckDnsArgs {
    /// The mail domain, e.g. example.org
    domain: String,

    /// The host that receives the domain's mail (the MX); default [pepsi] HOSTNAME, else
    /// this system's host name
    #[arg(long, value_name = "HOST")]
    mx: Option<String>,

    /// The DKIM selector whose record is checked; default that of the domain's newest
    /// enabled key in pepsi.signing_key
    #[arg(long)]
    selector: Option<String>,

    /// The DNS server to ask, IP or IP:PORT (several separated by commas); default
    /// [pepsi] DNS_SERVERS, else /etc/resolv.conf
    #[arg(long, value_name = "IP:PORT")]
    dns_server: Option<String>,

    /// Where DMARC and TLS-RPT reports go in a record to publish; default
    /// postmaster@DOMAIN
    #[arg(long, value_name = "ADDRESS")]
    reports: Option<String>,

    /// PostgreSQL URL to read the DKIM key from; overrides [database] URL of the
    /// configuration file
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,

    /// Print the report as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct DbArgs {
    /// PostgreSQL URL; overrides [database] URL of the configuration file
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,

    /// Only report what would change and verify the grants; change nothing
    #[arg(long)]
    check: bool,

    /// Print the report as JSON
    #[arg(long)]
    json: bool,
}

/// The command line of `pepsi-setup` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-setup` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        match cli.command {
            Command::Db(args) => db_command(&cli.common, args).await,
            Command::Dns(args) => dns_command(&cli.common, args).await,
            Command::CheckDns(args) => check_dns_command(&cli.common, args).await,
            Command::Apply(args) => {
                let cfg = cli.common.load_config()?;
                let url = match args.database_url {
                    Some(url) => url,
                    None => cfg.section("database").string("URL")?,
                };
                apply::command(cfg.file(), &url, args.follow).await
            }
        }
    })
}

async fn db_command(common: &CommonArgs, args: DbArgs) -> anyhow::Result<ExitCode> {
    let (url, roles) = match &args.database_url {
        Some(url) => {
            let roles = match common.config.is_some() {
                true => schema::Roles::from_config(&common.load_config()?)?,
                false => schema::Roles::default(),
            };
            (url.clone(), roles)
        }
        None => {
            let cfg = common.load_config()?;
            (
                cfg.section("database").string("URL")?,
                schema::Roles::from_config(&cfg)?,
            )
        }
    };
    let report = if args.check {
        schema::check(&url, &roles).await?
    } else {
        schema::setup_url(&url, &roles).await?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render());
    }
    Ok(if args.check && !report.is_current() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// A new DKIM key: the PKCS#8 PEM of the private key and the DKIM `p=` value (base64 of
/// the SubjectPublicKeyInfo for RSA, of the raw 32-octet key for Ed25519, RFC 8463).
pub(crate) fn generate_key(algorithm: dns::Algorithm) -> anyhow::Result<(String, String)> {
    use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der, PublicKeyX509Der};
    use aws_lc_rs::signature::KeyPair as _;
    use pepsi_smtp::encoding::base64_encode;
    let fail = |_| anyhow::anyhow!("cannot generate a {algorithm:?} key");
    let (der, public) = match algorithm {
        dns::Algorithm::Rsa => {
            let key = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
                .map_err(fail)?;
            let der: Pkcs8V1Der = key.as_der().map_err(fail)?;
            let spki: PublicKeyX509Der = key.public_key().as_der().map_err(fail)?;
            (der.as_ref().to_vec(), base64_encode(spki.as_ref()))
        }
        dns::Algorithm::Ed25519 => {
            let key = aws_lc_rs::signature::Ed25519KeyPair::generate().map_err(fail)?;
            let der: Pkcs8V1Der = key.as_der().map_err(fail)?;
            (
                der.as_ref().to_vec(),
                base64_encode(key.public_key().as_ref()),
            )
        }
    };
    let body = base64_encode(&der);
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line)?);
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    // The signing stages must be able to load what was made.
    pepsi_outbound::keys::parse_private_key(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("the generated key does not load: {e}"))?;
    Ok((pem, public))
}

async fn dns_command(common: &CommonArgs, args: DnsArgs) -> anyhow::Result<ExitCode> {
    let domain = dns::check_name("domain", &args.domain).map_err(anyhow::Error::msg)?;
    let cfg = common.load_config().ok();
    let mx = match (&args.mx, &cfg) {
        (Some(mx), _) => mx.clone(),
        (None, Some(cfg)) => cfg.name_option(&cfg.section("pepsi"), "HOSTNAME")?,
        (None, None) => pepsi_conf::config::system_hostname(),
    };
    let mx = dns::check_name("MX host (--mx)", &mx).map_err(anyhow::Error::msg)?;
    let now = chrono::Utc::now();
    let selector = args
        .selector
        .clone()
        .unwrap_or_else(|| now.format("s%Y%m").to_string());
    if !pepsi_outbound::keys::valid_selector(&selector) {
        anyhow::bail!(
            "selector {selector:?} is not valid: dotted labels of letters, digits, '-' and '_'"
        );
    }
    let reports = args
        .reports
        .clone()
        .unwrap_or_else(|| format!("postmaster@{domain}"));
    if !reports.contains('@') || reports.contains([' ', ';', ',', '"']) {
        anyhow::bail!("--reports {reports:?} is not an address");
    }
    let certificate = match (&args.certificate, &cfg) {
        (Some(path), _) => Some(path.clone()),
        (None, Some(cfg)) => mx_certificate(cfg)?,
        (None, None) => None,
    };
    let tlsa = certificate.as_deref().map(tlsa_hash).transpose()?;
    let (pem, public_key) = generate_key(args.algorithm)?;
    let key = match &args.key_file {
        Some(path) => {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| {
                    anyhow::anyhow!("cannot create the key file {}: {e}", path.display())
                })?;
            f.write_all(pem.as_bytes())?;
            f.sync_all()?;
            path.display().to_string()
        }
        None => {
            let url = match (&args.database_url, &cfg) {
                (Some(url), _) => url.clone(),
                (None, Some(cfg)) => cfg.section("database").string("URL")?,
                (None, None) => anyhow::bail!(
                    "no configuration file to find the database in: give --database-url URL, \
                     or --key-file PATH to write the key to a file"
                ),
            };
            store_key(&url, &domain, &selector, &pem).await?;
            format!("pepsi.signing_key ({domain}, {selector}); sign with DATABASE_KEYS = yes")
        }
    };
    let plan = dns::Plan {
        domain,
        mx,
        selector,
        algorithm: args.algorithm,
        public_key,
        reports,
        dmarc: args.dmarc,
        mta_sts: args.mta_sts,
        policy_id: now.format("%Y%m%dT%H%M%S").to_string(),
        tlsa,
    };
    let out = dns::Output {
        records: dns::records(&plan),
        mta_sts_policy: dns::mta_sts_policy(&plan),
        key,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{out}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn check_dns_command(common: &CommonArgs, args: CheckDnsArgs) -> anyhow::Result<ExitCode> {
    let domain = dns::check_name("domain", &args.domain).map_err(anyhow::Error::msg)?;
    let cfg = common.load_config().ok();
    let mx = match (&args.mx, &cfg) {
        (Some(mx), _) => mx.clone(),
        (None, Some(cfg)) => cfg.name_option(&cfg.section("pepsi"), "HOSTNAME")?,
        (None, None) => pepsi_conf::config::system_hostname(),
    };
    let mx = dns::check_name("MX host (--mx)", &mx).map_err(anyhow::Error::msg)?;
    if let Some(s) = &args.selector
        && !pepsi_outbound::keys::valid_selector(s)
    {
        anyhow::bail!("selector {s:?} is not valid: dotted labels of letters, digits, '-' and '_'");
    }
    let reports = args
        .reports
        .clone()
        .unwrap_or_else(|| format!("postmaster@{domain}"));
    if pepsi_conf::address::Address::parse(&reports).is_err() || reports.contains([' ', ';', ',']) {
        anyhow::bail!("--reports {reports:?} is not an address");
    }
    let (configured, timeout) = match &cfg {
        Some(cfg) => dns_check::resolver_options(cfg)?,
        None => (vec![], std::time::Duration::from_secs(5)),
    };
    let servers = match &args.dns_server {
        Some(text) => pepsi_outbound::dns::parse_servers(text)
            .map_err(|e| anyhow::anyhow!("--dns-server: {e}"))?,
        None => configured,
    };

    let url = match (&args.database_url, &cfg) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(cfg)) => cfg.section("database").string_opt("URL")?,
        (None, None) => None,
    };
    let mut conn = match url {
        None => None,
        Some(url) => {
            use sqlx::Connection as _;
            Some(
                sqlx::PgConnection::connect_with(&schema::connect_options(&url)?)
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!("cannot connect to the database for the DKIM key: {e}")
                    })?,
            )
        }
    };
    let expected =
        dns_check::expected(conn.as_mut(), domain, mx, args.selector.as_deref(), reports).await?;
    let report = dns_check::run(&servers, timeout, &expected).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(if report.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// SHA-256 of the public key of the first certificate in the PEM file `path`, hex: the
/// data of a `3 1 1` TLSA record.
fn tlsa_hash(path: &std::path::Path) -> anyhow::Result<String> {
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read the certificate {}: {e}", path.display()))?;
    let cert = rustls_pemfile::certs(&mut pem.as_slice())
        .next()
        .ok_or_else(|| anyhow::anyhow!("{} holds no PEM certificate", path.display()))?
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let spki = pepsi_smtp::dane::spki(cert.as_ref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, spki);
    Ok(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// Inserts the key; an existing (domain, selector) is an error, never replaced.
async fn store_key(url: &str, domain: &str, selector: &str, pem: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect_with(&schema::connect_options(url)?)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to the database to store the key: {e}"))?;
    let inserted = sqlx::query(
        "INSERT INTO pepsi.signing_key (domain, selector, private_key) VALUES ($1, $2, $3) \
         ON CONFLICT (domain, selector) DO NOTHING",
    )
    .bind(domain)
    .bind(selector)
    .bind(pem)
    .execute(&mut conn)
    .await
    .map_err(|e| anyhow::anyhow!("cannot store the key in pepsi.signing_key: {e}"))?
    .rows_affected();
    if inserted == 0 {
        anyhow::bail!(
            "pepsi.signing_key already has a key for {domain} under selector {selector}: \
             choose another --selector (keys are never replaced)"
        );
    }
    Ok(())
}

/// The certificate the MX serves: `TLS_CERT` of the first `[listener-<name>]` (in name
/// order) with `ROLE = mx` that has one.
fn mx_certificate(cfg: &pepsi_conf::config::Config) -> anyhow::Result<Option<std::path::PathBuf>> {
    for name in cfg.sections() {
        let is_listener = name
            .get(..9)
            .is_some_and(|p| p.eq_ignore_ascii_case("listener-"));
        let section = cfg.section(name);
        if is_listener
            && section.string_opt("ROLE")?.as_deref() == Some("mx")
            && let Some(path) = section.path_opt("TLS_CERT")?
        {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tlsa_default_is_the_first_mx_listeners_certificate() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "[listener-a-sub]\nROLE = submission\nTLS_CERT = /s.pem\n\
                 [listener-b]\nROLE = mx\n\
                 [listener-c]\nROLE = mx\nTLS_CERT = /c.pem\n\
                 [listener-d]\nROLE = mx\nTLS_CERT = /d.pem\n",
                Some("/c.pem"),
            ),
            // The ingress reads no certificate from its own section.
            ("[pepsi-ingress]\nTLS_CERT = /i.pem\n", None),
            (
                "[listener-s]\nROLE = submissions\nTLS_CERT = /s.pem\n",
                None,
            ),
        ];
        for (text, want) in cases {
            let cfg = pepsi_conf::config::Config::from_str_named(text, "t.conf").unwrap();
            assert_eq!(
                mx_certificate(&cfg).unwrap(),
                want.map(std::path::PathBuf::from),
                "{text}"
            );
        }
    }
}
