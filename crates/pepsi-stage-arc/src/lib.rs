//! pepsi-stage-arc: adds an ARC set (RFC 8617) to mail leaving the server, so the next
//! receiver can see what this server's checks found when the message arrived, even after
//! forwarding broke SPF or DKIM.
//!
//! Reads: the whole message (`Load::Full`: the message signature covers the body hash, as
//! for DKIM, see docs/dkim.md "Load") and `state.auth` / `state.origin` as the ingress wrote
//! them. Writes: the header block only (`set_headers`, the new `ARC-Seal`,
//! `ARC-Message-Signature` and `ARC-Authentication-Results` prepended); the body row is never
//! touched. Terminal helper: `advance`, sealed or not: a message this stage cannot or must
//! not seal (unreadable header block, a chain that already failed or has 50 sets) goes on
//! unsealed, with the reason logged; it is never held back.
//!
//! The decisions (`seal::plan`) and the results text (`aar`) are pure and tested as tables;
//! the key file is read once at start through `pepsi_outbound::keys`, shared with
//! pepsi-stage-dkim-sign.

pub mod aar;
pub mod seal;

use std::process::ExitCode;

use anyhow::Context as _;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::Origin;
use pepsi_outbound::keys;
use serde_json::{Map, Value};

use crate::seal::{Chain, Plan, SealMode, Sealer, Skip};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-arc",
        exec: "pepsi-stage-arc",
    };
    pub const PROGRAM: &str = "pepsi-stage-arc";
}

/// The header fields the message signature covers when `HEADERS` is not set: those DKIM
/// signs, plus `DKIM-Signature`, so the set vouches for the signatures the message carried
/// here. From is over-signed as in DKIM.
pub fn default_headers() -> Vec<String> {
    let mut list: Vec<String> = keys::DEFAULT_HEADERS
        .iter()
        .map(|h| h.to_string())
        .collect();
    list.push("DKIM-Signature".into());
    keys::signed_headers(&list)
}

/// What one stage section seals with.
pub struct ArcStage {
    pub sealer: Sealer,
    /// The authserv-id for messages whose `state.origin` has none.
    pub authserv_id: String,
    pub mode: SealMode,
}

impl ArcStage {
    /// Reads `[stage-<stage>]` and loads its key file.
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Self> {
        let name = pepsi_conf::config::stage_section_name(stage);
        let s = cfg.section(&name);
        let required = |option: &str, what: &str| -> anyhow::Result<String> {
            s.string_opt(option)?
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| anyhow::anyhow!("[{name}] {option} is required: {what}"))
        };
        let domain = required("DOMAIN", "the sealing domain (d=), e.g. example.test")?;
        let domain = keys::signing_domain(&domain).ok_or_else(|| {
            anyhow::anyhow!("[{name}] DOMAIN: {domain:?} is not a domain name (d=)")
        })?;
        let selector = required("SELECTOR", "the key's selector (s=), e.g. arc2026")?;
        let selector = selector.trim().to_owned();
        if !keys::valid_selector(&selector) {
            anyhow::bail!(
                "[{name}] SELECTOR: {selector:?} is not a selector (letters, digits, '-', '_', \
                 dot-separated)"
            );
        }
        let key_file = s.path_opt("KEY_FILE")?.ok_or_else(|| {
            anyhow::anyhow!("[{name}] KEY_FILE is required: the PEM private key of {selector}._domainkey.{domain}")
        })?;
        let key = keys::load_key(&key_file).with_context(|| format!("[{name}] KEY_FILE"))?;
        if matches!(key, mail_auth::common::crypto::DkimKey::Ed25519(_)) {
            // RFC 8617 allows any DKIM algorithm, but deployed validators (dkimpy among
            // them) check ARC with rsa-sha256 only: an Ed25519 seal reads as a broken chain.
            tracing::warn!(
                "[{name}] KEY_FILE {} is an Ed25519 key: many ARC validators accept only \
                 rsa-sha256 seals",
                key_file.display()
            );
        }
        let headers = match s.list_opt("HEADERS")? {
            Some(list) => {
                keys::check_header_names(&list)
                    .map_err(|e| anyhow::anyhow!("[{name}] HEADERS: {e}"))?;
                if let Some(arc) = list
                    .iter()
                    .find(|h| h.to_ascii_lowercase().starts_with("arc-"))
                {
                    anyhow::bail!(
                        "[{name}] HEADERS: {arc:?} cannot be listed: the ARC fields are covered \
                         by the seal, not the message signature"
                    );
                }
                keys::signed_headers(&list)
            }
            None => default_headers(),
        };
        let authserv_id = cfg.name_option(&s, "AUTHSERV_ID")?;
        if !aar::is_token(&authserv_id) {
            anyhow::bail!(
                "[{name}] AUTHSERV_ID: {authserv_id:?} is not an authserv-id (a host name, no \
                 blanks or ';')"
            );
        }
        let mode = match s.choice_opt("SEAL", &["forwarded", "all"])?.as_deref() {
            Some("all") => SealMode::All,
            _ => SealMode::Forwarded,
        };
        Ok(ArcStage {
            sealer: Sealer {
                key,
                domain,
                selector,
                headers,
            },
            authserv_id,
            mode,
        })
    }
}

/// The ingress verdict on the chain the message arrived with: `None` without `state.auth`
/// (not verified at arrival), else `auth.arc.result` (`none` when absent).
pub fn verdict(state: &Map<String, Value>) -> Option<String> {
    let auth = state.get("auth").filter(|a| a.is_object())?;
    Some(
        auth.get("arc")
            .and_then(|a| a.get("result"))
            .and_then(Value::as_str)
            .unwrap_or("none")
            .to_owned(),
    )
}

/// The ARC sealing program: each stage's `ArcStage` (with its key) is its section.
pub struct ArcSealer;

/// The new header block, or why the message goes on unsealed.
enum Outcome {
    Sealed {
        headers: Vec<u8>,
        instance: u32,
        cv: seal::Cv,
    },
    Skipped(Skip),
    /// The header block or its chain cannot be read: sealed it would carry a broken set.
    Unreadable(String),
}

fn seal_message(
    stage: &ArcStage,
    state: &Map<String, Value>,
    headers: &[u8],
    body: &[u8],
    now: u64,
) -> Result<Outcome, StageError> {
    let fields = match seal::fields(headers) {
        Ok(f) => f,
        Err(e) => return Ok(Outcome::Unreadable(e)),
    };
    let chain = match Chain::read(&fields) {
        Ok(c) => c,
        Err(e) => return Ok(Outcome::Unreadable(e)),
    };
    let verdict = verdict(state);
    let (instance, cv) = match seal::plan(&chain, &fields, verdict.as_deref(), stage.mode) {
        Plan::Skip(why) => return Ok(Outcome::Skipped(why)),
        Plan::Seal { instance, cv } => (instance, cv),
    };
    let origin = Origin::from_state(state)?.unwrap_or_default();
    let payload = aar::payload(
        aar::authserv_id(&origin, &stage.authserv_id),
        &aar::results(&origin, state),
    );
    let set = stage
        .sealer
        .seal(&fields, &chain, body, instance, cv, &payload, now)
        .map_err(|e| StageError::Permanent(format!("ARC sealing failed: {e}")))?;
    let mut out = set.into_bytes();
    out.extend_from_slice(headers);
    Ok(Outcome::Sealed {
        headers: out,
        instance,
        cv,
    })
}

impl Stage for ArcSealer {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    // Sealing is local work (a hash and a signature): its passes batch.
    const BATCH: bool = true;
    type Section = ArcStage;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(ArcSealer)
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<ArcStage> {
        ArcStage::from_config(cfg, name)
    }

    async fn process(
        &self,
        stage: &ArcStage,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let outcome = seal_message(stage, ctx.state(), ctx.headers()?, ctx.body()?, now)?;
        match outcome {
            Outcome::Sealed {
                headers,
                instance,
                cv,
            } => {
                tracing::info!(
                    id = ctx.id(),
                    instance,
                    cv = cv.as_str(),
                    key = %stage.sealer.describe(),
                    "ARC sealed"
                );
                ctx.set_headers(headers);
            }
            Outcome::Skipped(why) => {
                let why = match why {
                    Skip::NotForwarded => "not forwarded (no state.auth) and SEAL = forwarded",
                    Skip::ChainEnded => "the last ARC-Seal says cv=fail: the chain has ended",
                    Skip::ChainFull => "the chain already has 50 ARC sets",
                    Skip::NoVerdict => "an ARC chain without a verdict on it (no state.auth)",
                };
                tracing::debug!(id = ctx.id(), "not ARC sealed: {why}");
            }
            Outcome::Unreadable(e) => {
                tracing::warn!(id = ctx.id(), "not ARC sealed: {e}");
            }
        }
        ctx.advance()
    }
}

const ABOUT: &str = "Pepsi stage that ARC-seals mail leaving the server (RFC 8617)";

/// The command line of `pepsi-stage-arc`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}

/// Entry point of the `pepsi-stage-arc` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<ArcSealer>(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}

const LONG_ABOUT: &str = "\
Pepsi stage that adds an ARC set (RFC 8617) to mail leaving the server: \
ARC-Authentication-Results (the verdicts the ingress recorded in state.auth, under the \
authserv-id of state.origin), ARC-Message-Signature and ARC-Seal, prepended to the header \
block; the body is left as it is.

cv= of the seal: none for the first set; pass when the message arrived with a chain the \
ingress verified as pass; fail otherwise (that seal covers only its own set). A message \
whose last seal already says cv=fail, that has 50 sets, or whose header block cannot be \
read advances unsealed (the reason is logged).

Options of the [stage-<name>] section:
  DOMAIN = example.test   (required) the sealing domain, d=.
  SELECTOR = arc2026   (required) the selector, s=: the public key is published at \
<selector>._domainkey.<domain>.
  KEY_FILE = /etc/pepsi/arc/example.test.pem   (required) PEM private key, RSA or Ed25519, \
PKCS#8 or PKCS#1, read at start; an unreadable file or another key type stops the worker. \
Use RSA: many ARC validators accept only rsa-sha256 seals.
  HEADERS = From, To, Subject, ...   the fields the message signature covers (default: those \
of pepsi-stage-dkim-sign plus DKIM-Signature); From is always signed twice; ARC-* fields \
cannot be listed.
  AUTHSERV_ID = mx.example.test   the authserv-id when state.origin has none (default: \
[pepsi] HOSTNAME, else the system host name).
  SEAL = forwarded | all   forwarded (default): only messages verified at arrival (with \
state.auth); all: locally submitted mail too.
  NEXT_STAGE   where the message goes, sealed or not.

See docs/arc.md.";

#[cfg(test)]
mod tests;
