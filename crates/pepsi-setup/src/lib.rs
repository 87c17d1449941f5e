//! pepsi-setup: creates, upgrades and verifies the Pepsi database.
//!
//! `pepsi-setup db` applies the numbered patches in `db/` that the database lacks, re-applies
//! `db/procedures.sql`, creates the PostgreSQL roles and brings their privileges to exactly
//! the matrix in `schema::privilege_matrix`, then verifies that matrix against the live
//! server. A second run changes nothing.

pub mod dns;
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
    /// records together with the MTA-STS policy file to serve over HTTPS. --json prints the
    /// same as JSON. An existing key file or database row is never replaced: choose another
    /// selector to rotate. Exit status 0 on success, 1 on any error (named).
    #[command(long_about)]
    Dns(DnsArgs),
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
fn generate_key(algorithm: dns::Algorithm) -> anyhow::Result<(String, String)> {
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
