//! pepsi-keys: the operator's tool for the end-to-end encryption key store (pepsi-0013.sql,
//! docs/crypto.md): our identities (generate, import, export, list, rotate, revoke,
//! purge), correspondents' keys (`peer`), the CAs inbound S/MIME must reach (`ca`), and the
//! key-encryption key (`kek-new`, `rewrap`).
//!
//! A private key is sealed (pepsi-keymat) before it reaches the database and opened only to
//! export it or re-seal it; every change is recorded in `pepsi.event_log` in the same
//! transaction. It connects as the role `[database] URL` names, which must be the crypto
//! role (`[pepsi-setup] CRYPTO_ROLE`): no other role may touch the sealed column.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_contract::audit::{self, Actor};
use pepsi_crypto::{KeyInfo, KeyPair, Scheme, openpgp, smime};
use pepsi_keymat::Keyring;
use pepsi_keymat::store::{self, Identity};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "keys",
        exec: "pepsi-keys",
    };
}

/// The largest key or certificate file read.
const MAX_INPUT: u64 = 1 << 20;

const LONG_ABOUT: &str = "\
Manage the keys of Pepsi's end-to-end encryption: the OpenPGP keys and S/MIME certificates \
of the addresses Pepsi serves (identities), the keys of correspondents (peers), and the CAs an \
inbound S/MIME signature must chain to.

An identity's public half is stored as it is; its private half is sealed with AES-256-GCM \
under the key-encryption key (KEK) of [crypto] KEK before it is stored, and only the crypto \
role may read the sealed column. The KEK lives in a secrets.d fragment readable by the crypto \
user alone; `kek-new` prints one. To rotate the KEK: put a new one in KEK, move the old one to \
RETIRED_KEKS, run `rewrap`, then remove the old one.

Identities are for the addresses of local domains ([pepsi] LOCAL_DOMAINS or the settings \
layer); a correspondent's key goes in with `peer import`. One identity per address and scheme \
is primary: the one the encrypt stage signs with and \
advertises in Autocrypt headers. Older identities stay and still decrypt mail sent to them \
until they are purged. `rotate` makes a new primary and retires the old; `revoke` marks a key \
revoked (an OpenPGP key gets its revocation signature, to publish); `purge` deletes a private \
half for good.

pepsi-keys connects with [database] URL as the role named there, which must be the crypto \
role ([pepsi-setup] CRYPTO_ROLE, default pepsi-crypto). Every change is recorded in \
pepsi.event_log.

Exit status: 0 when the command did what it says, 1 when it could not (a database error, a \
KEK that does not open a row), 2 on a usage error or input that is not valid (an address the \
key does not name, a file that holds no key).";

const EXAMPLES: &str = "\
Examples:
  pepsi-keys kek-new --id 2026-12                      a KEK line for secrets.d
  pepsi-keys generate alice@example.org                an OpenPGP key, primary
  pepsi-keys generate alice@example.org --scheme smime --valid-days 730
  pepsi-keys import alice@example.org alice.p12 --password-file pw
  pepsi-keys list --json
  pepsi-keys export alice@example.org > alice.asc      the public key
  pepsi-keys rotate alice@example.org
  pepsi-keys revoke 0123456789ABCDEF... --reason 'key compromised'
  pepsi-keys peer import bob.asc
  pepsi-keys ca add corporate-ca.pem --note 'HR department'
  pepsi-keys rewrap                                    re-seal every key under the current KEK";

/// Manage Pepsi's end-to-end encryption keys.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-keys",
    version,
    about,
    long_about = LONG_ABOUT,
    after_long_help = EXAMPLES
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a new key-encryption key line (`id:base64`) for [crypto] KEK in secrets.d.
    KekNew(KekNewArgs),
    /// Make a new identity for an address: an OpenPGP key or a self-signed S/MIME certificate.
    Generate(GenerateArgs),
    /// Store an identity made elsewhere: an OpenPGP secret key, or a PKCS#12 / PEM
    /// certificate with its key.
    Import(ImportArgs),
    /// Print an identity's public key (or, with --secret, its private key).
    Export(ExportArgs),
    /// The identities, by address.
    List(ListArgs),
    /// Make a new primary identity for an address and retire the old one.
    Rotate(RotateArgs),
    /// Mark an identity revoked (an OpenPGP key gets its revocation signature).
    Revoke(RevokeArgs),
    /// Delete an identity's private half for good (it no longer decrypts).
    Purge(FingerprintArg),
    /// Re-seal every private key under the current KEK.
    Rewrap,
    /// Correspondents' keys.
    #[command(subcommand)]
    Peer(PeerCommand),
    /// The CAs an inbound S/MIME signature must chain to.
    #[command(subcommand)]
    Ca(CaCommand),
}

#[derive(Debug, Args)]
struct KekNewArgs {
    /// The new key's id (letters, digits, - _ .), stored with every row it seals
    #[arg(long, default_value_t = default_kek_id())]
    id: String,
}

fn default_kek_id() -> String {
    chrono::Utc::now().format("kek-%Y%m%d").to_string()
}

#[derive(Debug, Args)]
struct GenerateArgs {
    /// The address the identity is for
    address: String,
    /// openpgp or smime
    #[arg(long, default_value = "openpgp")]
    scheme: String,
    /// A display name for the OpenPGP user ID
    #[arg(long)]
    name: Option<String>,
    /// Validity in days (OpenPGP: none means no expiry; S/MIME default 365)
    #[arg(long, value_name = "DAYS")]
    valid_days: Option<u32>,
    /// Do not offer the key to others (Autocrypt, WKD) yet
    #[arg(long)]
    unpublished: bool,
    /// Make it primary even when the address has a primary identity of this scheme
    #[arg(long)]
    primary: bool,
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// The address the identity is for; the key must name it
    address: String,
    /// The file: an armored or binary OpenPGP secret key, a PKCS#12 (.p12/.pfx), or PEM
    /// with a certificate and its key (`-` for standard input)
    file: PathBuf,
    /// A file holding the PKCS#12 password (its first line)
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Make it primary even when the address has a primary identity of this scheme
    #[arg(long)]
    primary: bool,
    /// Do not offer the key to others (Autocrypt, WKD) yet
    #[arg(long)]
    unpublished: bool,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// The address (its primary identity) or an identity's fingerprint
    key: String,
    /// openpgp or smime, when an address has both
    #[arg(long)]
    scheme: Option<String>,
    /// Print the private key instead (unsealed; recorded in the audit log)
    #[arg(long)]
    secret: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only these addresses
    addresses: Vec<String>,
    /// One JSON document instead of the table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RotateArgs {
    /// The address whose primary identity is replaced
    address: String,
    /// openpgp or smime
    #[arg(long, default_value = "openpgp")]
    scheme: String,
    /// Validity of the new identity in days
    #[arg(long, value_name = "DAYS")]
    valid_days: Option<u32>,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The identity's fingerprint
    fingerprint: String,
    /// Why, recorded in the revocation signature and the audit log
    #[arg(long, default_value = "revoked by the operator")]
    reason: String,
}

#[derive(Debug, Args)]
struct FingerprintArg {
    /// The identity's fingerprint
    fingerprint: String,
}

#[derive(Debug, Subcommand)]
enum PeerCommand {
    /// Store a correspondent's OpenPGP certificate(s) or S/MIME certificate.
    Import(PeerImportArgs),
    /// The stored peer keys.
    List(ListArgs),
    /// Forget an address's keys.
    Remove(PeerRemoveArgs),
}

#[derive(Debug, Args)]
struct PeerImportArgs {
    /// The file (armored or binary OpenPGP, PEM or DER certificate; `-` for standard input)
    file: PathBuf,
    /// Store under this address only (it must be one the key names); default: every
    /// address the key names
    #[arg(long)]
    address: Option<String>,
}

#[derive(Debug, Args)]
struct PeerRemoveArgs {
    address: String,
    /// openpgp or smime (default: both)
    #[arg(long)]
    scheme: Option<String>,
}

#[derive(Debug, Subcommand)]
enum CaCommand {
    /// Trust a CA certificate (PEM or DER; every certificate in the file).
    Add(CaAddArgs),
    /// The trusted CAs.
    List(JsonArg),
    /// Stop trusting a CA.
    Remove(FingerprintArg),
}

#[derive(Debug, Args)]
struct CaAddArgs {
    file: PathBuf,
    /// A note kept beside it
    #[arg(long)]
    note: Option<String>,
}

#[derive(Debug, Args)]
struct JsonArg {
    #[arg(long)]
    json: bool,
}

/// The command line of `pepsi-keys` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

type Done = Result<(), Failure>;

fn invalid(text: impl Into<String>) -> Failure {
    Failure::Invalid(text.into())
}

/// Runs `pepsi-keys` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        if let Command::KekNew(a) = &cli.command {
            return Ok(exit(kek_new(a)));
        }
        let cfg = cli.common.load_config()?;
        let pool = pepsi_contract::db::connect(&cfg).await?;
        let actor = Actor::local(constants::CONFIG_SOURCE.exec);
        // The KEK is read only by the commands that seal or open.
        let keyring = || Keyring::from_config(&cfg).map_err(|e| Failure::Other(e.into()));
        let result = match cli.command {
            Command::KekNew(_) => unreachable!("handled above"),
            Command::Generate(a) => match keyring() {
                Ok(k) => match local(&pool, &cfg, &a.address).await {
                    Ok(()) => generate(&pool, &k, &actor, a).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Command::Import(a) => match keyring() {
                Ok(k) => match local(&pool, &cfg, &a.address).await {
                    Ok(()) => import(&pool, &k, &actor, a).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Command::Export(a) => export(&pool, &cfg, &actor, a).await,
            Command::List(a) => list(&pool, a).await,
            Command::Rotate(a) => match keyring() {
                Ok(k) => rotate(&pool, &k, &actor, a).await,
                Err(e) => Err(e),
            },
            Command::Revoke(a) => match keyring() {
                Ok(k) => revoke(&pool, &k, &actor, a).await,
                Err(e) => Err(e),
            },
            Command::Purge(a) => purge(&pool, &actor, &a.fingerprint).await,
            Command::Rewrap => match keyring() {
                Ok(k) => rewrap(&pool, &k, &actor).await,
                Err(e) => Err(e),
            },
            Command::Peer(PeerCommand::Import(a)) => peer_import(&pool, &actor, a).await,
            Command::Peer(PeerCommand::List(a)) => peer_list(&pool, a).await,
            Command::Peer(PeerCommand::Remove(a)) => peer_remove(&pool, &actor, a).await,
            Command::Ca(CaCommand::Add(a)) => ca_add(&pool, &actor, a).await,
            Command::Ca(CaCommand::List(a)) => ca_list(&pool, a.json).await,
            Command::Ca(CaCommand::Remove(a)) => ca_remove(&pool, &actor, &a.fingerprint).await,
        };
        Ok(exit(result))
    })
}

fn exit(result: Done) -> ExitCode {
    pepsi_conf::cli::tool_exit(&constants::CONFIG_SOURCE, result)
}

fn kek_new(a: &KekNewArgs) -> Done {
    let line = pepsi_keymat::new_kek(&a.id).map_err(|e| invalid(format!("--id: {e}")))?;
    println!("{line}");
    Ok(())
}

/// A lower-case address, or the reason it is not one.
fn address(text: &str) -> Result<String, Failure> {
    match pepsi_conf::address::Address::parse(text) {
        Ok(a) => Ok(a.key()),
        Err(_) => Err(invalid(format!(
            "{text:?} is not an address (local@domain)"
        ))),
    }
}

/// An identity is for an address Pepsi serves: its domain is local (`[pepsi]
/// LOCAL_DOMAINS` or the settings layer).
async fn local(pool: &PgPool, cfg: &pepsi_conf::config::Config, text: &str) -> Done {
    let address = address(text)?;
    let domain = pepsi_conf::address::domain_part(&address).expect("checked by address()");
    let locals = pepsi_contract::local::LocalRecipients::from_config(cfg)
        .map_err(|e| Failure::Other(e.into()))?;
    if locals.is_local_domain(pool, domain).await? {
        Ok(())
    } else {
        Err(invalid(format!(
            "{address}: {domain} is not a local domain ([pepsi] LOCAL_DOMAINS or the settings \
             layer); identities are for the addresses this server serves (a correspondent's \
             key goes in with `peer import`)"
        )))
    }
}

fn scheme(text: &str) -> Result<Scheme, Failure> {
    Scheme::parse(text)
        .ok_or_else(|| invalid(format!("--scheme {text:?}: expected openpgp or smime")))
}

fn read_input(path: &Path) -> Result<Vec<u8>, Failure> {
    let mut data = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin()
            .take(MAX_INPUT + 1)
            .read_to_end(&mut data)
            .map(|_| ())
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_INPUT + 1).read_to_end(&mut data).map(|_| ()))
    };
    read.map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    if data.len() as u64 > MAX_INPUT {
        return Err(invalid(format!(
            "{}: larger than {MAX_INPUT} bytes; not a key file",
            path.display()
        )));
    }
    Ok(data)
}

/// How a new identity is stored: made primary even beside a primary one, offered to
/// others, and the audit action recorded.
struct Placement {
    primary: bool,
    published: bool,
    action: &'static str,
}

/// Stores a new identity in one transaction with its audit row; primary when `primary`
/// or when the address has no primary identity of the scheme.
async fn store_identity(
    pool: &PgPool,
    keyring: &Keyring,
    actor: &Actor,
    address: &str,
    pair: &KeyPair,
    how: Placement,
) -> Result<bool, Failure> {
    let Placement {
        primary,
        published,
        action,
    } = how;
    let info = &pair.info;
    let sealed = keyring
        .seal(info.scheme, &info.fingerprint, &pair.secret)
        .map_err(|e| Failure::Other(e.into()))?;
    let capability = match (info.can_sign, info.can_encrypt) {
        (true, false) => "sign",
        (false, true) => "encrypt",
        _ => "both",
    };
    let mut tx = pool.begin().await?;
    let has_primary: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pepsi.crypto_identity \
         WHERE address = $1 AND scheme = $2 AND is_primary)",
    )
    .bind(address)
    .bind(info.scheme.as_str())
    .fetch_one(&mut *tx)
    .await?;
    let make_primary = primary || !has_primary;
    if make_primary && has_primary {
        sqlx::query(
            "UPDATE pepsi.crypto_identity SET is_primary = false, updated_at = now() \
             WHERE address = $1 AND scheme = $2 AND is_primary",
        )
        .bind(address)
        .bind(info.scheme.as_str())
        .execute(&mut *tx)
        .await?;
    }
    let inserted = sqlx::query(
        "INSERT INTO pepsi.crypto_identity (address, scheme, capability, fingerprint, public_key, \
         private_wrapped, kek_id, is_primary, published, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, to_timestamp($10)) \
         ON CONFLICT (scheme, fingerprint) DO NOTHING",
    )
    .bind(address)
    .bind(info.scheme.as_str())
    .bind(capability)
    .bind(&info.fingerprint)
    .bind(&pair.public)
    .bind(&sealed)
    .bind(keyring.current_id())
    .bind(make_primary)
    .bind(published)
    .bind(info.expires_at.map(|t| t as f64))
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(invalid(format!(
            "an identity with fingerprint {} is stored already",
            info.fingerprint
        )));
    }
    audit::record(
        &mut tx,
        actor,
        action,
        None,
        json!({"address": address, "scheme": info.scheme.as_str(),
               "fingerprint": info.fingerprint, "primary": make_primary}),
    )
    .await?;
    tx.commit().await?;
    Ok(make_primary)
}

fn make_key(
    scheme: Scheme,
    address: &str,
    name: Option<&str>,
    days: Option<u32>,
) -> Result<KeyPair, Failure> {
    let made = match scheme {
        Scheme::OpenPgp => openpgp::generate(address, name, days.map(|d| u64::from(d) * 86_400)),
        Scheme::Smime => smime::generate_self_signed(address, days.unwrap_or(365)),
    };
    made.map_err(|e| Failure::Other(anyhow::anyhow!("cannot make a key for {address}: {e}")))
}

async fn generate(pool: &PgPool, keyring: &Keyring, actor: &Actor, a: GenerateArgs) -> Done {
    let address = address(&a.address)?;
    let scheme = scheme(&a.scheme)?;
    if a.valid_days == Some(0) {
        return Err(invalid(
            "--valid-days 0: a key must be valid for at least a day",
        ));
    }
    let pair = make_key(scheme, &address, a.name.as_deref(), a.valid_days)?;
    let primary = store_identity(
        pool,
        keyring,
        actor,
        &address,
        &pair,
        Placement {
            primary: a.primary,
            published: !a.unpublished,
            action: "crypto.identity.generate",
        },
    )
    .await?;
    println!(
        "{address}: {scheme} identity {}{}",
        pair.info.fingerprint,
        if primary { " (primary)" } else { "" }
    );
    Ok(())
}

/// The key pair in an identity file, read as the scheme its content shows.
fn read_identity(data: &[u8], password: Option<&str>) -> Result<KeyPair, Failure> {
    let pgp_error = match openpgp::split_keyring(data) {
        Ok(certs) => {
            let secret: Vec<_> = certs
                .into_iter()
                .filter(|c| openpgp::inspect(c).is_ok_and(|i| i.iter().any(|i| i.has_secret)))
                .collect();
            match secret.as_slice() {
                [one] => {
                    let info = openpgp::inspect(one)
                        .map_err(|e| invalid(e.to_string()))?
                        .remove(0);
                    let public = openpgp::public_part(one).map_err(|e| invalid(e.to_string()))?;
                    return Ok(KeyPair {
                        public,
                        secret: one.clone(),
                        info,
                    });
                }
                [] => "an OpenPGP key without its secret part (a peer key? use `peer import`)"
                    .to_owned(),
                _ => "several OpenPGP secret keys: import one at a time".to_owned(),
            }
        }
        Err(e) => e.to_string(),
    };
    smime::import(data, password).map_err(|e| {
        invalid(format!(
            "holds no identity: as OpenPGP: {pgp_error}; as S/MIME: {e}"
        ))
    })
}

async fn import(pool: &PgPool, keyring: &Keyring, actor: &Actor, a: ImportArgs) -> Done {
    let address = address(&a.address)?;
    let data = read_input(&a.file)?;
    let password = match &a.password_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| invalid(format!("--password-file {}: {e}", p.display())))?;
            Some(text.lines().next().unwrap_or("").to_owned())
        }
        None => None,
    };
    let pair = read_identity(&data, password.as_deref()).map_err(|e| match e {
        Failure::Invalid(t) => invalid(format!("{}: {t}", a.file.display())),
        other => other,
    })?;
    if !pair.info.addresses.contains(&address) {
        return Err(invalid(format!(
            "{}: the key names {}, not {address}",
            a.file.display(),
            if pair.info.addresses.is_empty() {
                "no address".to_owned()
            } else {
                pair.info.addresses.join(", ")
            }
        )));
    }
    if pair.info.revoked {
        return Err(invalid(format!("{}: the key is revoked", a.file.display())));
    }
    // The stages sign unattended: a key behind a passphrase, or one that cannot sign at
    // all, is refused here rather than found out on every message.
    let probe = match pair.info.scheme {
        Scheme::OpenPgp => {
            openpgp::sign(b"Subject: probe\r\n", b"probe\r\n", &pair.secret).map(drop)
        }
        Scheme::Smime => smime::sign(
            b"Subject: probe\r\n",
            b"probe\r\n",
            &pair.public,
            &pair.secret,
        )
        .map(drop),
    };
    if let (true, Err(e)) = (pair.info.can_sign, probe) {
        return Err(invalid(format!(
            "{}: the key cannot sign unattended (protected by a passphrase, or not a signing \
             key): {e}; remove the passphrase before importing",
            a.file.display()
        )));
    }
    let primary = store_identity(
        pool,
        keyring,
        actor,
        &address,
        &pair,
        Placement {
            primary: a.primary,
            published: !a.unpublished,
            action: "crypto.identity.import",
        },
    )
    .await?;
    println!(
        "{address}: imported {} identity {}{}",
        pair.info.scheme,
        pair.info.fingerprint,
        if primary { " (primary)" } else { "" }
    );
    Ok(())
}

/// The identity an argument names: a fingerprint, or an address's primary (of `scheme`).
async fn find_identity(
    pool: &PgPool,
    key: &str,
    scheme: Option<Scheme>,
) -> Result<Identity, Failure> {
    let all = store::all_identities(pool)
        .await
        .map_err(|e| Failure::Other(e.into()))?;
    let wanted = key.trim().to_ascii_uppercase().replace(' ', "");
    if let Some(found) = all.iter().find(|i| i.fingerprint == wanted) {
        return Ok(found.clone());
    }
    if !key.contains('@') {
        return Err(invalid(format!("no identity has fingerprint {wanted}")));
    }
    let address = address(key)?;
    let primaries: Vec<&Identity> = all
        .iter()
        .filter(|i| i.address == address && i.is_primary)
        .filter(|i| scheme.is_none_or(|s| i.scheme == s))
        .collect();
    match primaries.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(invalid(format!(
            "{address} has no primary {}identity",
            scheme.map(|s| format!("{s} ")).unwrap_or_default()
        ))),
        _ => Err(invalid(format!(
            "{address} has an OpenPGP and an S/MIME identity: give --scheme"
        ))),
    }
}

async fn export(
    pool: &PgPool,
    cfg: &pepsi_conf::config::Config,
    actor: &Actor,
    a: ExportArgs,
) -> Done {
    let scheme = a.scheme.as_deref().map(scheme).transpose()?;
    let identity = find_identity(pool, &a.key, scheme).await?;
    if !a.secret {
        let text = match identity.scheme {
            Scheme::OpenPgp => openpgp::armor(&identity.public_key),
            Scheme::Smime => smime::certificates_pem(&identity.public_key),
        }
        .map_err(|e| Failure::Other(anyhow::anyhow!("stored key {}: {e}", identity.fingerprint)))?;
        print!("{text}");
        return Ok(());
    }
    let keyring = Keyring::from_config(cfg).map_err(|e| Failure::Other(e.into()))?;
    let unsealed =
        store::unsealed_identities(pool, &keyring, std::slice::from_ref(&identity.address))
            .await
            .map_err(|e| Failure::Other(e.into()))?
            .into_iter()
            .find(|u| u.identity.id == identity.id)
            .ok_or_else(|| {
                invalid(format!(
                    "{}: its private half was purged",
                    identity.fingerprint
                ))
            })?;
    let text = match identity.scheme {
        Scheme::OpenPgp => openpgp::armor(&unsealed.secret),
        Scheme::Smime => smime::key_pem(&unsealed.secret),
    }
    .map_err(|e| Failure::Other(anyhow::anyhow!("stored key {}: {e}", identity.fingerprint)))?;
    let mut conn = pool.acquire().await?;
    audit::record(
        &mut conn,
        actor,
        "crypto.identity.export_secret",
        None,
        json!({"address": identity.address, "fingerprint": identity.fingerprint}),
    )
    .await?;
    print!("{text}");
    Ok(())
}

#[derive(Debug, Serialize)]
struct IdentityRow {
    address: String,
    scheme: &'static str,
    fingerprint: String,
    capability: &'static str,
    status: String,
    primary: bool,
    published: bool,
    has_private: bool,
    kek_id: Option<String>,
    created_at: String,
    expires_at: Option<String>,
}

impl From<&Identity> for IdentityRow {
    fn from(i: &Identity) -> Self {
        IdentityRow {
            address: i.address.clone(),
            scheme: i.scheme.as_str(),
            fingerprint: i.fingerprint.clone(),
            capability: i.capability.as_str(),
            status: i.status.clone(),
            primary: i.is_primary,
            published: i.published,
            has_private: i.kek_id.is_some(),
            kek_id: i.kek_id.clone(),
            created_at: i.created_at.to_rfc3339(),
            expires_at: i.expires_at.map(|t| t.to_rfc3339()),
        }
    }
}

async fn list(pool: &PgPool, a: ListArgs) -> Done {
    let addresses = a
        .addresses
        .iter()
        .map(|s| address(s))
        .collect::<Result<Vec<_>, _>>()?;
    let identities = if addresses.is_empty() {
        store::all_identities(pool).await
    } else {
        store::identities(pool, &addresses).await
    }
    .map_err(|e| Failure::Other(e.into()))?;
    let rows: Vec<IdentityRow> = identities.iter().map(IdentityRow::from).collect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("serialisable")
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no identities");
        return Ok(());
    }
    println!(
        "{:<32} {:<8} {:<9} {:<8} {:<10} FINGERPRINT",
        "ADDRESS", "SCHEME", "STATUS", "PRIMARY", "EXPIRES"
    );
    for r in &rows {
        println!(
            "{:<32} {:<8} {:<9} {:<8} {:<10} {}{}",
            r.address,
            r.scheme,
            r.status,
            if r.primary { "yes" } else { "" },
            r.expires_at.as_deref().map_or("never", |e| &e[..10]),
            r.fingerprint,
            if r.has_private {
                ""
            } else {
                " (private half purged)"
            }
        );
    }
    Ok(())
}

async fn rotate(pool: &PgPool, keyring: &Keyring, actor: &Actor, a: RotateArgs) -> Done {
    let address = address(&a.address)?;
    let scheme = scheme(&a.scheme)?;
    let old = find_identity(pool, &address, Some(scheme)).await?;
    let pair = make_key(scheme, &address, None, a.valid_days)?;
    store_identity(
        pool,
        keyring,
        actor,
        &address,
        &pair,
        Placement {
            primary: true,
            published: old.published,
            action: "crypto.identity.rotate",
        },
    )
    .await?;
    sqlx::query(
        "UPDATE pepsi.crypto_identity SET status = 'retired', updated_at = now() \
         WHERE identity_id = $1 AND status = 'active'",
    )
    .bind(old.id)
    .execute(pool)
    .await?;
    println!(
        "{address}: {scheme} identity {} is primary; {} retired (it still decrypts until purged)",
        pair.info.fingerprint, old.fingerprint
    );
    Ok(())
}

async fn revoke(pool: &PgPool, keyring: &Keyring, actor: &Actor, a: RevokeArgs) -> Done {
    let identity = find_identity(pool, &a.fingerprint, None).await?;
    if identity.status == "revoked" {
        return Err(invalid(format!(
            "{} is revoked already",
            identity.fingerprint
        )));
    }
    let mut public = identity.public_key.clone();
    let mut sealed_update: Option<Vec<u8>> = None;
    if identity.scheme == Scheme::OpenPgp {
        let unsealed =
            store::unsealed_identities(pool, keyring, std::slice::from_ref(&identity.address))
                .await
                .map_err(|e| Failure::Other(e.into()))?
                .into_iter()
                .find(|u| u.identity.id == identity.id);
        if let Some(u) = unsealed {
            let revoked = openpgp::revoke(&u.secret, &a.reason).map_err(|e| {
                Failure::Other(anyhow::anyhow!(
                    "cannot revoke {}: {e}",
                    identity.fingerprint
                ))
            })?;
            public = revoked.public.clone();
            sealed_update = Some(
                keyring
                    .seal(identity.scheme, &identity.fingerprint, &revoked.secret)
                    .map_err(|e| Failure::Other(e.into()))?,
            );
        }
    }
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE pepsi.crypto_identity SET status = 'revoked', is_primary = false, \
         revoked_at = now(), updated_at = now(), public_key = $2, \
         private_wrapped = COALESCE($3, private_wrapped), \
         kek_id = CASE WHEN $3 IS NULL THEN kek_id ELSE $4 END \
         WHERE identity_id = $1",
    )
    .bind(identity.id)
    .bind(&public)
    .bind(&sealed_update)
    .bind(keyring.current_id())
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        actor,
        "crypto.identity.revoke",
        None,
        json!({"address": identity.address, "fingerprint": identity.fingerprint, "reason": a.reason}),
    )
    .await?;
    tx.commit().await?;
    println!(
        "{}: {} identity {} revoked{}",
        identity.address,
        identity.scheme,
        identity.fingerprint,
        if identity.scheme == Scheme::OpenPgp {
            " (export it to publish the revocation)"
        } else {
            ""
        }
    );
    Ok(())
}

async fn purge(pool: &PgPool, actor: &Actor, fingerprint: &str) -> Done {
    let identity = find_identity(pool, fingerprint, None).await?;
    if identity.is_primary {
        return Err(invalid(format!(
            "{} is the primary identity of {}: rotate or revoke it first",
            identity.fingerprint, identity.address
        )));
    }
    let mut tx = pool.begin().await?;
    let done = sqlx::query(
        "UPDATE pepsi.crypto_identity SET private_wrapped = NULL, kek_id = NULL, \
         private_purged_at = now(), updated_at = now() \
         WHERE identity_id = $1 AND private_wrapped IS NOT NULL",
    )
    .bind(identity.id)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Err(invalid(format!(
            "{}: its private half was purged already",
            identity.fingerprint
        )));
    }
    audit::record(
        &mut tx,
        actor,
        "crypto.identity.purge",
        None,
        json!({"address": identity.address, "fingerprint": identity.fingerprint}),
    )
    .await?;
    tx.commit().await?;
    println!(
        "{}: private half of {} deleted",
        identity.address, identity.fingerprint
    );
    Ok(())
}

async fn rewrap(pool: &PgPool, keyring: &Keyring, actor: &Actor) -> Done {
    let rows: Vec<(i64, String, String, String, Vec<u8>)> = sqlx::query_as(
        "SELECT identity_id, scheme, fingerprint, kek_id, private_wrapped \
         FROM pepsi.crypto_identity WHERE private_wrapped IS NOT NULL AND kek_id <> $1 \
         ORDER BY identity_id",
    )
    .bind(keyring.current_id())
    .fetch_all(pool)
    .await?;
    let total = rows.len();
    let mut done = 0;
    for (id, scheme, fingerprint, kek_id, sealed) in rows {
        let scheme = Scheme::parse(&scheme).expect("the table's CHECK");
        let secret = keyring
            .open(&kek_id, scheme, &fingerprint, &sealed)
            .map_err(|e| Failure::Other(e.into()))?;
        let resealed = keyring
            .seal(scheme, &fingerprint, &secret)
            .map_err(|e| Failure::Other(e.into()))?;
        let mut tx = pool.begin().await?;
        sqlx::query(
            "UPDATE pepsi.crypto_identity SET private_wrapped = $2, kek_id = $3, updated_at = now() \
             WHERE identity_id = $1 AND kek_id = $4",
        )
        .bind(id)
        .bind(&resealed)
        .bind(keyring.current_id())
        .bind(&kek_id)
        .execute(&mut *tx)
        .await?;
        audit::record(
            &mut tx,
            actor,
            "crypto.identity.rewrap",
            None,
            json!({"fingerprint": fingerprint, "from": kek_id, "to": keyring.current_id()}),
        )
        .await?;
        tx.commit().await?;
        done += 1;
        if done % 100 == 0 {
            eprintln!("pepsi-keys: re-sealed {done} of {total}");
        }
    }
    println!(
        "{done} private key(s) re-sealed under {}; every stored key is now sealed under it",
        keyring.current_id()
    );
    Ok(())
}

/// The certificates of a peer key file, each with what it is.
fn read_peer_keys(data: &[u8]) -> Result<Vec<(Vec<u8>, KeyInfo)>, String> {
    let pgp = openpgp::split_keyring(data).and_then(|certs| {
        certs
            .into_iter()
            .map(|c| {
                let info = openpgp::inspect(&c)?.remove(0);
                Ok((openpgp::public_part(&c)?, info))
            })
            .collect::<Result<Vec<_>, _>>()
    });
    match pgp {
        Ok(v) if !v.is_empty() => return Ok(v),
        _ => {}
    }
    let pgp_error = pgp
        .err()
        .map(|e| e.to_string())
        .unwrap_or_else(|| "no certificate".into());
    let certs = smime::certificates(data)
        .map_err(|e| format!("holds no key: as OpenPGP: {pgp_error}; as a certificate: {e}"))?;
    certs
        .into_iter()
        .map(|der| {
            let info = smime::inspect(&der).map_err(|e| e.to_string())?.remove(0);
            Ok((der, info))
        })
        .collect()
}

async fn peer_import(pool: &PgPool, actor: &Actor, a: PeerImportArgs) -> Done {
    let data = read_input(&a.file)?;
    let only = a.address.as_deref().map(address).transpose()?;
    let keys = read_peer_keys(&data).map_err(|e| invalid(format!("{}: {e}", a.file.display())))?;
    let mut stored = 0;
    let mut tx = pool.begin().await?;
    for (public, info) in &keys {
        if info.has_secret {
            return Err(invalid(format!(
                "{}: holds a secret key; a peer key is public only",
                a.file.display()
            )));
        }
        let addresses: Vec<&String> = info
            .addresses
            .iter()
            .filter(|ad| only.as_ref().is_none_or(|o| o == *ad))
            .collect();
        for ad in addresses {
            let verdict = if info.revoked {
                "revoked"
            } else if info.can_encrypt {
                "valid"
            } else {
                "unusable"
            };
            sqlx::query(
                "INSERT INTO pepsi.peer_key (address, scheme, fingerprint, public_key, source, verdict) \
                 VALUES ($1, $2, $3, $4, 'import', $5) \
                 ON CONFLICT (address, scheme, source) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
                 public_key = EXCLUDED.public_key, verdict = EXCLUDED.verdict, verdict_at = now(), \
                 updated_at = now()",
            )
            .bind(ad)
            .bind(info.scheme.as_str())
            .bind(&info.fingerprint)
            .bind(public)
            .bind(verdict)
            .execute(&mut *tx)
            .await?;
            audit::record(
                &mut tx,
                actor,
                "crypto.peer.import",
                None,
                json!({"address": ad, "scheme": info.scheme.as_str(), "fingerprint": info.fingerprint}),
            )
            .await?;
            println!("{ad}: {} key {} ({verdict})", info.scheme, info.fingerprint);
            stored += 1;
        }
    }
    if stored == 0 {
        return Err(invalid(format!(
            "{}: no key names {}",
            a.file.display(),
            only.as_deref().unwrap_or("an address")
        )));
    }
    tx.commit().await?;
    Ok(())
}

#[derive(Debug, Serialize)]
struct PeerRow {
    address: String,
    scheme: &'static str,
    fingerprint: String,
    source: String,
    verdict: String,
    dnssec_validated: bool,
    prefer_encrypt: Option<String>,
    cache_until: Option<String>,
    updated_at: String,
}

async fn peer_list(pool: &PgPool, a: ListArgs) -> Done {
    let mut addresses = a
        .addresses
        .iter()
        .map(|s| address(s))
        .collect::<Result<Vec<_>, _>>()?;
    if addresses.is_empty() {
        addresses = sqlx::query_scalar("SELECT DISTINCT address FROM pepsi.peer_key ORDER BY 1")
            .fetch_all(pool)
            .await?;
    }
    let keys = store::peer_keys(pool, &addresses)
        .await
        .map_err(|e| Failure::Other(e.into()))?;
    let rows: Vec<PeerRow> = keys
        .into_iter()
        .map(|k| PeerRow {
            address: k.address,
            scheme: k.scheme.as_str(),
            fingerprint: k.fingerprint,
            source: k.source,
            verdict: k.verdict,
            dnssec_validated: k.dnssec_validated,
            prefer_encrypt: k.prefer_encrypt,
            cache_until: k.cache_until.map(|t| t.to_rfc3339()),
            updated_at: k.updated_at.to_rfc3339(),
        })
        .collect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("serialisable")
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no peer keys");
        return Ok(());
    }
    println!(
        "{:<32} {:<8} {:<10} {:<9} FINGERPRINT",
        "ADDRESS", "SCHEME", "SOURCE", "VERDICT"
    );
    for r in &rows {
        println!(
            "{:<32} {:<8} {:<10} {:<9} {}",
            r.address, r.scheme, r.source, r.verdict, r.fingerprint
        );
    }
    Ok(())
}

async fn peer_remove(pool: &PgPool, actor: &Actor, a: PeerRemoveArgs) -> Done {
    let address = address(&a.address)?;
    let scheme = a.scheme.as_deref().map(scheme).transpose()?;
    let mut tx = pool.begin().await?;
    let done = sqlx::query(
        "DELETE FROM pepsi.peer_key WHERE address = $1 AND ($2::text IS NULL OR scheme = $2)",
    )
    .bind(&address)
    .bind(scheme.map(Scheme::as_str))
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Err(invalid(format!("no peer key is stored for {address}")));
    }
    audit::record(
        &mut tx,
        actor,
        "crypto.peer.remove",
        None,
        json!({"address": address}),
    )
    .await?;
    tx.commit().await?;
    println!("{address}: {} peer key(s) removed", done.rows_affected());
    Ok(())
}

async fn ca_add(pool: &PgPool, actor: &Actor, a: CaAddArgs) -> Done {
    let data = read_input(&a.file)?;
    let certs = smime::certificates(&data)
        .map_err(|e| invalid(format!("{}: no certificate: {e}", a.file.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!("{}: no certificate", a.file.display())));
    }
    let mut tx = pool.begin().await?;
    for der in &certs {
        let info = smime::inspect(der)
            .map_err(|e| invalid(format!("{}: {e}", a.file.display())))?
            .remove(0);
        let subject = smime::subject(der).unwrap_or_default();
        sqlx::query(
            "INSERT INTO pepsi.ca_trust (fingerprint, subject, certificate, not_after, note) \
             VALUES ($1, $2, $3, to_timestamp($4), $5) \
             ON CONFLICT (fingerprint) DO UPDATE SET note = COALESCE(EXCLUDED.note, pepsi.ca_trust.note)",
        )
        .bind(&info.fingerprint)
        .bind(&subject)
        .bind(der)
        .bind(info.expires_at.map(|t| t as f64))
        .bind(&a.note)
        .execute(&mut *tx)
        .await?;
        audit::record(
            &mut tx,
            actor,
            "crypto.ca.add",
            None,
            json!({"fingerprint": info.fingerprint, "subject": subject}),
        )
        .await?;
        println!("trusted: {subject} ({})", info.fingerprint);
    }
    tx.commit().await?;
    Ok(())
}

async fn ca_list(pool: &PgPool, json_out: bool) -> Done {
    #[derive(Serialize)]
    struct CaRow {
        fingerprint: String,
        subject: String,
        not_after: Option<chrono::DateTime<chrono::Utc>>,
        note: Option<String>,
    }
    type Raw = (
        String,
        String,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<String>,
    );
    let raw: Vec<Raw> = sqlx::query_as(
        "SELECT fingerprint, subject, not_after, note FROM pepsi.ca_trust ORDER BY subject",
    )
    .fetch_all(pool)
    .await?;
    let rows: Vec<CaRow> = raw
        .into_iter()
        .map(|(fingerprint, subject, not_after, note)| CaRow {
            fingerprint,
            subject,
            not_after,
            note,
        })
        .collect();
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("serialisable")
        );
    } else if rows.is_empty() {
        println!("no trusted CAs");
    } else {
        for r in rows {
            println!(
                "{}  {}  until {}{}",
                r.fingerprint,
                r.subject,
                r.not_after
                    .map_or("?".into(), |t| t.format("%Y-%m-%d").to_string()),
                r.note.map(|n| format!("  ({n})")).unwrap_or_default()
            );
        }
    }
    Ok(())
}

async fn ca_remove(pool: &PgPool, actor: &Actor, fingerprint: &str) -> Done {
    let wanted = fingerprint.trim().to_ascii_uppercase().replace(':', "");
    let mut tx = pool.begin().await?;
    let done = sqlx::query("DELETE FROM pepsi.ca_trust WHERE fingerprint = $1")
        .bind(&wanted)
        .execute(&mut *tx)
        .await?;
    if done.rows_affected() == 0 {
        return Err(invalid(format!("no trusted CA has fingerprint {wanted}")));
    }
    audit::record(
        &mut tx,
        actor,
        "crypto.ca.remove",
        None,
        json!({"fingerprint": wanted}),
    )
    .await?;
    tx.commit().await?;
    println!("no longer trusted: {wanted}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_schemes_are_checked_before_any_connection() {
        assert_eq!(
            address(" Alice@Example.ORG").ok(),
            Some("alice@example.org".into())
        );
        for bad in ["alice", "@example.org", "alice@"] {
            assert!(matches!(address(bad), Err(Failure::Invalid(_))), "{bad}");
        }
        assert_eq!(scheme("S/MIME").ok(), Some(Scheme::Smime));
        assert!(matches!(scheme("x509"), Err(Failure::Invalid(t)) if t.contains("x509")));
    }
}
