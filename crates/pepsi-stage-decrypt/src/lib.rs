//! pepsi-stage-decrypt: decrypts inbound mail for local identities that opted in (the
//! `decrypt` setting of the recipient, else its domain's, else `DEFAULT`), verifies the
//! signature inside, and records the result in `state.crypto.decrypted` and in a header
//! field of our own (`RESULT_HEADER`), which is removed from every message first so that
//! nobody outside can forge it. Mail that cannot be decrypted goes on untouched.
//!
//! Reads: the whole message (`Load::Full`), `pepsi.settings` (`decrypt`), the recipients'
//! identities with their private halves (pepsi-keymat, the crypto role's column), peer keys
//! of the From address and the trusted CAs. Writes: the header block and body (decrypted;
//! the result header), `state.crypto.decrypted` (with `original_headers`, the encrypted
//! message's header block, which pepsi-stage-bounce returns instead of the plaintext's).
//! Terminal helpers: `advance_with`, and `fan_out_keeping_age` to NEXT_STAGE for the
//! recipients that did not opt in (they keep the encrypted message). Standalone and
//! set-user-id `pepsi-crypto` in a package.

pub mod verdict;

use std::process::ExitCode;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::message;
use pepsi_contract::settings;
use pepsi_contract::stage::{FanGroup, FanRecipients};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{self, Crypto, Decryption};
use pepsi_crypto::{Decrypted, Scheme, openpgp, smime};
use pepsi_keymat::Keyring;
use pepsi_keymat::store;
use serde_json::{Map, Value};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-decrypt",
        exec: "pepsi-stage-decrypt",
    };
    pub const PROGRAM: &str = "pepsi-stage-decrypt";

    /// The settings name of the opt-in.
    pub const SETTING: &str = "decrypt";
    /// The header field carrying the result, unless `RESULT_HEADER` names another.
    pub const RESULT_HEADER: &str = "X-Pepsi-Decrypted";
}

/// One `[stage-<name>]` running this program.
#[derive(Debug, Clone)]
pub struct Options {
    /// `DEFAULT` (no): whether an address without a `decrypt` setting has opted in.
    pub default: bool,
    /// `RESULT_HEADER`: the field recording the result.
    pub result_header: String,
}

impl Options {
    pub fn from_config(cfg: &Config, name: &str) -> anyhow::Result<Self> {
        let section_name = pepsi_conf::config::stage_section_name(name);
        let s = cfg.section(&section_name);
        let result_header = s
            .string_opt("RESULT_HEADER")?
            .unwrap_or_else(|| constants::RESULT_HEADER.to_owned());
        let valid = !result_header.is_empty()
            && result_header
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b':');
        if !valid {
            anyhow::bail!(
                "[{section_name}] RESULT_HEADER {result_header:?} is not a header field name"
            );
        }
        Ok(Options {
            default: s.bool_opt("DEFAULT")?.unwrap_or(false),
            result_header,
        })
    }
}

/// The program: the keyring, loaded once.
pub struct Decrypt {
    keyring: Keyring,
}

impl Stage for Decrypt {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        let keyring = Keyring::from_config(cfg)
            .map_err(|e| anyhow::anyhow!("pepsi-stage-decrypt opens private keys: {e}"))?;
        Ok(Decrypt { keyring })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let original = ctx.headers()?.to_vec();
        // Nobody outside may hand us a result: the field is ours alone.
        let headers = message::remove_fields(&original, &options.result_header);
        let scheme = if openpgp::is_encrypted(&headers) {
            Some(Scheme::OpenPgp)
        } else if smime::is_encrypted(&headers) {
            Some(Scheme::Smime)
        } else {
            None
        };
        let Some(scheme) = scheme else {
            if headers != original {
                ctx.set_headers(headers);
            }
            return ctx.advance();
        };
        let rcpts: Vec<String> = ctx.rcpt_to().iter().map(|r| r.to_lowercase()).collect();
        let pool = ctx.pool();
        let mut keys = Vec::new();
        for r in &rcpts {
            for k in settings::lookup_keys(r) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        let table = settings::fetch(pool, &keys, &[constants::SETTING]).await?;
        let opted: Vec<usize> = (0..rcpts.len())
            .filter(|&i| {
                table
                    .resolve(&rcpts[i], constants::SETTING)
                    .map_or(options.default, |s| truthy(&s.value))
            })
            .collect();
        let opted_addresses: Vec<String> = opted.iter().map(|&i| rcpts[i].clone()).collect();
        let identities = if opted.is_empty() {
            Vec::new()
        } else {
            store::unsealed_identities(pool, &self.keyring, &opted_addresses)
                .await
                .map_err(|e| match e {
                    pepsi_keymat::KeymatError::Database(db) => StageError::Database(db),
                    other => StageError::Temporary(other.to_string()),
                })?
                .into_iter()
                .filter(|u| u.identity.scheme == scheme && u.identity.capability.decrypts())
                .collect()
        };
        let name = ctx.options().name.clone();
        if identities.is_empty() {
            let mut state = Map::new();
            if !opted.is_empty() {
                state = crypto_state(
                    ctx.state(),
                    Decryption::NoKey {
                        stage: name.to_string(),
                        scheme: scheme.as_str().to_owned(),
                        why: "no opted-in recipient has a private key of this scheme".to_owned(),
                    },
                );
            }
            if headers != original {
                ctx.set_headers(headers);
            }
            return ctx.advance_with(state);
        }
        let from = message::from_addresses(&headers)
            .into_iter()
            .next()
            .map(|a| a.to_lowercase());
        let body = ctx.body()?.to_vec();
        let peers: Vec<Vec<u8>> = match (&from, scheme) {
            (Some(f), Scheme::OpenPgp) => store::peer_keys(pool, std::slice::from_ref(f))
                .await
                .map_err(|e| StageError::Temporary(e.to_string()))?
                .into_iter()
                .filter(|p| p.scheme == Scheme::OpenPgp && vouches(p))
                .map(|p| p.public_key)
                .collect(),
            _ => Vec::new(),
        };
        let cas: Vec<Vec<u8>> = match scheme {
            Scheme::Smime => store::trusted_cas(pool)
                .await
                .map_err(|e| StageError::Temporary(e.to_string()))?,
            Scheme::OpenPgp => Vec::new(),
        };
        // Each opted-in recipient with its own keys only: the plaintext goes to those the
        // message was encrypted to, never to another recipient who merely opted in.
        let mut decrypted: Option<Decrypted> = None;
        let mut opened_for: Vec<usize> = Vec::new();
        let mut last_error = None;
        for &i in &opted {
            let own: Vec<&pepsi_keymat::store::Unsealed> = identities
                .iter()
                .filter(|u| u.identity.address == rcpts[i])
                .collect();
            if own.is_empty() {
                continue;
            }
            let result = match scheme {
                Scheme::OpenPgp => {
                    let secrets: Vec<&[u8]> = own.iter().map(|u| u.secret.as_slice()).collect();
                    let peers: Vec<&[u8]> = peers.iter().map(Vec::as_slice).collect();
                    openpgp::decrypt(&headers, &body, &secrets, &peers)
                }
                Scheme::Smime => {
                    let cas: Vec<&[u8]> = cas.iter().map(Vec::as_slice).collect();
                    let ids: Vec<(&[u8], &[u8])> = own
                        .iter()
                        .map(|u| (u.identity.public_key.as_slice(), u.secret.as_slice()))
                        .collect();
                    smime::decrypt(&headers, &body, &ids, &cas)
                }
            };
            match result {
                Ok(d) => {
                    opened_for.push(i);
                    decrypted.get_or_insert(d);
                }
                Err(e) => last_error = Some(e),
            }
        }
        let Some(decrypted) = decrypted else {
            let why = last_error.map_or_else(
                || "no opted-in recipient has a private key of this scheme".to_owned(),
                |e| e.to_string(),
            );
            tracing::info!(id = ctx.id(), %scheme, "left encrypted: {why}");
            let state = crypto_state(
                ctx.state(),
                Decryption::Failed {
                    stage: name.to_string(),
                    scheme: scheme.as_str().to_owned(),
                    why,
                },
            );
            if headers != original {
                ctx.set_headers(headers);
            }
            return ctx.advance_with(state);
        };
        let verdict = verdict::of(&decrypted.verification, from.as_deref());
        // The other recipients keep the encrypted message, on a row of their own that comes
        // back to this stage: their copy loses a forged result field there too.
        if opened_for.len() < rcpts.len() {
            let others: Vec<usize> = (0..rcpts.len())
                .filter(|i| !opened_for.contains(i))
                .collect();
            ctx.fan_out_keeping_age(
                &opened_for,
                &[FanGroup::new(FanRecipients::Indices(others), name.clone())],
            )
            .await?;
        }
        let field = format!(
            "{}: {}\r\n",
            options.result_header,
            verdict::header_value(scheme, &decrypted.decrypted_with, &verdict)
        );
        let mut new_headers = message::remove_fields(&decrypted.headers, &options.result_header);
        new_headers.extend_from_slice(field.as_bytes());
        ctx.set_headers(new_headers);
        ctx.set_body(decrypted.body);
        tracing::info!(id = ctx.id(), %scheme, signature = verdict.word, "decrypted");
        let state = crypto_state(
            ctx.state(),
            Decryption::Decrypted {
                stage: name.to_string(),
                scheme: scheme.as_str().to_owned(),
                key: decrypted.decrypted_with,
                signature: verdict.word.to_owned(),
                signer: decrypted.verification.signer,
                signer_addresses: decrypted.verification.signer_addresses,
                detail: verdict.detail,
                // The header block the message arrived with, for a notification about it:
                // the row now holds the plaintext, which must never go back to the sender.
                original_headers: Some(String::from_utf8_lossy(&headers).into_owned()),
            },
        );
        ctx.advance_with(state)
    }
}

/// Whether a peer key may vouch for a signature: one an operator imported, or one the
/// sender's own domain published (WKD over HTTPS; DNS only when the answer was validated).
/// Not a keyserver's (whether it checked the address depends on the server), nor a key
/// from an Autocrypt header or gossip, which anyone could have sent.
fn vouches(p: &pepsi_keymat::store::PeerKey) -> bool {
    match p.source.as_str() {
        "import" | "wkd" => true,
        "openpgpkey" | "smimea" => p.dnssec_validated,
        _ => false,
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "yes" | "true" | "on" | "1"
        ),
        Value::Number(n) => n.as_i64() == Some(1),
        _ => false,
    }
}

/// `state.crypto` with `decrypted` set and what else it holds kept exactly as stored (the other
/// crypto stage's part included, whether it parses or not).
fn crypto_state(state: &Map<String, Value>, decrypted: Decryption) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        Crypto::KEY.into(),
        state::with_member(state, Crypto::KEY, "decrypted", Some(&decrypted)),
    );
    m
}

const ABOUT: &str = "Decrypt inbound OpenPGP/MIME and S/MIME mail for local identities that \
opted in (the `decrypt` setting of the recipient, else of its domain, else DEFAULT), verify the \
signature inside against the sender's stored keys (OpenPGP) or the trusted CAs (S/MIME), and \
record the result in state.crypto.decrypted and a header field (X-Pepsi-Decrypted), which is \
removed from every message that passes so nobody can forge it. Mail that cannot be decrypted \
goes on as it came; recipients who did not opt in keep the encrypted message. Options of \
[stage-NAME]: NEXT_STAGE (required), DEFAULT (no), RESULT_HEADER (X-Pepsi-Decrypted); needs \
[crypto] KEK. See docs/crypto.md.";

/// The command line of `pepsi-stage-decrypt`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-decrypt` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Decrypt>(&constants::CONFIG_SOURCE, ABOUT, "")
}
