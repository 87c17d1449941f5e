//! pepsi-stage-dkim-sign: DKIM-signs outgoing mail (RFC 6376, RSA-SHA256 and Ed25519-SHA256
//! per RFC 8463) with the keys of the RFC5322.From domain.
//!
//! Reads: the whole message (`Load::Full`). Writes: the header block (`set_headers`
//! with the new `DKIM-Signature:` fields prepended); the body only for an 8-bit message under
//! `SEVEN_BIT` (its 7-bit form, a new body row); otherwise the
//! commit keeps the row's `body_id`. Terminal helper: `advance`, signed or not.
//!
//! Why `Load::Full`: the signature covers the relaxed body hash (`bh=`), and mail-auth's
//! signer computes it from the raw message. Loading only the headers would need the body
//! hash computed once at admission and stored with the body row (a schema change, and one
//! hash per canonicalization and algorithm). Signing is one pass per outgoing message, just
//! before a relay that loads the full message anyway, so the extra transfer is accepted;
//! the stored body hash is a later optimisation (docs/dkim.md, "Load").
//!
//! Keys come from PEM files named in `KEYS` (`domain:selector:path`, comma separated), read
//! once at start by `pepsi_outbound::keys` (shared with the ARC stage): a file that cannot be
//! read or holds no usable key stops the worker with an error naming the file. With
//! `DATABASE_KEYS`, the enabled rows of `pepsi.signing_key` are added, read once per worker
//! on its first message with a From domain (the build function has no database): a row
//! whose key does not parse is logged and skipped, a row for a domain and selector `KEYS`
//! already has is shadowed by the file, and a failing query is a temporary error, so the
//! message is retried rather than sent unsigned. A change to the table notifies
//! `config_changed`, and the dispatcher's replacement workers read it anew.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::Context as _;
use mail_auth::common::crypto::DkimKey;
use mail_auth::common::headers::HeaderWriter;
use mail_auth::dkim::{Canonicalization, DkimSigner, Done};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
pub use pepsi_outbound::keys::{
    KeySpec, StoredKey, load_key, parse_keys, parse_private_key, signed_headers,
};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-dkim-sign",
        exec: "pepsi-stage-dkim-sign",
    };
    pub const PROGRAM: &str = "pepsi-stage-dkim-sign";

    /// The signed header fields when `HEADERS` is not set (shared with the ARC stage).
    pub use pepsi_outbound::keys::DEFAULT_HEADERS;
}

/// One key of a signing domain.
pub struct DomainKey {
    pub selector: String,
    signer: DkimSigner<DkimKey, Done>,
    /// The same key over the `h=` list and [`LIST_UNSUBSCRIBE_FIELDS`], for mail that
    /// carries `List-Unsubscribe`.
    list_signer: DkimSigner<DkimKey, Done>,
}

/// The fields RFC 8058 (section 4) wants a signature to cover in mail that offers one-click
/// unsubscription: signed, with the `h=` list, in mail that has `List-Unsubscribe` (a
/// missing `List-Unsubscribe-Post` is signed as absent, so nobody can add one). Other mail
/// does not name them, so a list elsewhere that adds its own does not break our signature.
pub const LIST_UNSUBSCRIBE_FIELDS: [&str; 2] = ["List-Unsubscribe", "List-Unsubscribe-Post"];

/// Signing domain (lower case) → its keys, one signature per key.
pub type DomainKeys = HashMap<String, Vec<DomainKey>>;

/// Why a row of `pepsi.signing_key` does not sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// `KEYS` has a file for the same domain and selector; the file signs.
    Shadowed { domain: String, selector: String },
    /// The row's domain, selector or key cannot be used.
    Unusable {
        domain: String,
        selector: String,
        why: String,
    },
}

/// What one stage section signs with.
pub struct SignStage {
    /// The keys of `KEYS`, by signing domain.
    pub domains: DomainKeys,
    /// `DATABASE_KEYS`: add the enabled rows of `pepsi.signing_key`.
    pub database_keys: bool,
    /// The signers of the rows of `pepsi.signing_key`, once this worker has read them.
    stored: std::sync::OnceLock<DomainKeys>,
    /// The `h=` list (From already doubled).
    pub headers: Vec<String>,
    /// Sign with a parent domain's keys when the From domain has none.
    pub parent_domains: bool,
    /// Convert an 8-bit message to its 7-bit form before signing it (RFC 6376 §5.3), so
    /// that no relay has to re-encode it after the signature was made.
    pub seven_bit: bool,
    /// `SIGN`: which messages get a signature at all.
    pub policy: SignPolicy,
}

/// `SIGN`: the signing policy. A signature vouches for a message in the From domain's name,
/// so by default only mail whose author proved who they are gets one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignPolicy {
    /// `authenticated` (the default): mail submitted by an authenticated client
    /// (`state.origin.auth_user`), and mail generated here (no `state.origin`: DSNs,
    /// auto-replies, messages an operator injected). Mail that came in unauthenticated
    /// (an MX delivery forwarded by an alias) leaves unsigned: its From is not ours to vouch
    /// for, and ARC records what was verified instead.
    Authenticated,
    /// `all`: every message with a key for its From domain, whoever sent it.
    All,
}

impl SignPolicy {
    fn parse(v: &str) -> Result<SignPolicy, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "authenticated" => Ok(SignPolicy::Authenticated),
            "all" => Ok(SignPolicy::All),
            _ => Err("`authenticated` or `all`".to_owned()),
        }
    }

    /// Whether a message with this `state` is signed. Pure.
    pub fn signs(self, state: &serde_json::Map<String, serde_json::Value>) -> Result<bool, String> {
        if self == SignPolicy::All {
            return Ok(true);
        }
        match pepsi_contract::state::Origin::from_state(state) {
            Ok(None) => Ok(true),
            Ok(Some(origin)) => Ok(origin.auth_user.is_some()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl SignStage {
    /// Reads `[stage-<stage>]` and loads its key files.
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Self> {
        let section_name = pepsi_conf::config::stage_section_name(stage);
        let s = cfg.section(&section_name);
        let database_keys = s.bool_opt("DATABASE_KEYS")?.unwrap_or(false);
        let specs = match s.parse_opt("KEYS", parse_keys)? {
            Some(specs) => specs,
            None if database_keys => Vec::new(),
            None => anyhow::bail!(
                "[{section_name}] KEYS is required (or DATABASE_KEYS = yes for keys stored in \
                 pepsi.signing_key)"
            ),
        };
        let headers = match s.list_opt("HEADERS")? {
            Some(list) => {
                pepsi_outbound::keys::check_header_names(&list)
                    .map_err(|e| anyhow::anyhow!("[{section_name}] HEADERS: {e}"))?;
                list
            }
            None => constants::DEFAULT_HEADERS
                .iter()
                .map(|h| h.to_string())
                .collect(),
        };
        let headers = signed_headers(&headers);
        let parent_domains = s.bool_opt("PARENT_DOMAINS")?.unwrap_or(false);
        let seven_bit = s.bool_opt("SEVEN_BIT")?.unwrap_or(true);
        let policy = s
            .parse_opt("SIGN", SignPolicy::parse)?
            .unwrap_or(SignPolicy::Authenticated);
        let mut domains = DomainKeys::new();
        for spec in specs {
            let load = || load_key(&spec.path).with_context(|| format!("[{section_name}] KEYS"));
            let key = domain_key(load()?, load()?, &spec.domain, &spec.selector, &headers);
            domains.entry(spec.domain).or_default().push(key);
        }
        Ok(Self {
            domains,
            database_keys,
            stored: std::sync::OnceLock::new(),
            headers,
            parent_domains,
            seven_bit,
            policy,
        })
    }

    /// Signers for the usable rows of `pepsi.signing_key` (`usable_rows`), except a row
    /// for a domain and selector `KEYS` already has: the file signs, the row is returned as
    /// shadowed. Pure.
    pub fn stored_keys(&self, rows: &[StoredKey]) -> (DomainKeys, Vec<Skipped>) {
        let mut keys = DomainKeys::new();
        let mut skipped = Vec::new();
        for row in rows {
            let (domain, selector) = (row.domain.clone(), row.selector.clone());
            let shadowed = self
                .domains
                .get(&domain)
                .is_some_and(|keys| keys.iter().any(|k| k.selector == selector));
            if shadowed {
                skipped.push(Skipped::Shadowed { domain, selector });
                continue;
            }
            let parse = || parse_private_key(row.private_key.as_bytes());
            match parse().and_then(|key| Ok((key, parse()?))) {
                Ok((key, again)) => {
                    let key = domain_key(key, again, &domain, &selector, &self.headers);
                    keys.entry(domain).or_default().push(key);
                }
                Err(why) => skipped.push(Skipped::Unusable {
                    domain,
                    selector,
                    why,
                }),
            }
        }
        (keys, skipped)
    }

    /// Builds this section's signers from the worker's rows the first time they are needed
    /// and logs the rows `KEYS` shadows, once.
    fn use_stored_rows(&self, rows: &[StoredKey], stage: &str) {
        self.stored.get_or_init(|| {
            let (keys, skipped) = self.stored_keys(rows);
            log_skipped(&skipped, Some(stage));
            keys
        });
    }

    /// The signing domain and its keys for a From domain: the domain itself, else with
    /// `PARENT_DOMAINS` the nearest parent that has keys. The keys of `KEYS` come first,
    /// then those read from the database (when they have been).
    pub fn keys_for<'s>(&'s self, from_domain: &str) -> Option<(&'s str, Vec<&'s DomainKey>)> {
        let mut domain = from_domain.trim_end_matches('.').to_ascii_lowercase();
        let stored = self.stored.get();
        loop {
            let files = self.domains.get_key_value(&domain);
            let rows = stored.and_then(|s| s.get_key_value(&domain));
            if let Some((d, _)) = files.or(rows) {
                let keys = files
                    .into_iter()
                    .chain(rows)
                    .flat_map(|(_, keys)| keys.iter())
                    .collect();
                return Some((d.as_str(), keys));
            }
            if !self.parent_domains {
                return None;
            }
            let (_, parent) = domain.split_once('.')?;
            if !parent.contains('.') {
                return None;
            }
            domain = parent.to_owned();
        }
    }
}

/// The rows of `pepsi.signing_key` a stage can sign with, and why the others are not: a
/// domain or selector the CHECKs of the table should have refused, or a key that does not
/// parse (PEM armour around something else, an EC key). Pure.
pub fn usable_rows(rows: Vec<StoredKey>) -> (Vec<StoredKey>, Vec<Skipped>) {
    let mut usable = Vec::new();
    let mut skipped = Vec::new();
    for row in rows {
        let why =
            if pepsi_outbound::keys::signing_domain(&row.domain).as_deref() != Some(&row.domain) {
                Some("not a lower-case domain name".to_owned())
            } else if !pepsi_outbound::keys::valid_selector(&row.selector) {
                Some("not a selector".to_owned())
            } else {
                parse_private_key(row.private_key.as_bytes()).err()
            };
        match why {
            None => usable.push(row),
            Some(why) => skipped.push(Skipped::Unusable {
                domain: row.domain,
                selector: row.selector,
                why,
            }),
        }
    }
    (usable, skipped)
}

fn log_skipped(skipped: &[Skipped], stage: Option<&str>) {
    for s in skipped {
        match s {
            Skipped::Shadowed { domain, selector } => tracing::warn!(
                stage,
                "DKIM key {selector}._domainkey.{domain} of pepsi.signing_key is not used: \
                 KEYS has a file for the same domain and selector"
            ),
            Skipped::Unusable {
                domain,
                selector,
                why,
            } => tracing::error!(
                "DKIM key {selector}._domainkey.{domain} of pepsi.signing_key is skipped: {why}"
            ),
        }
    }
}

/// The signers for `selector._domainkey.domain`, relaxed/relaxed: over `headers`, and (the
/// same key, parsed twice since a key is not copied) over `headers` and the RFC 8058 fields.
fn domain_key(
    key: DkimKey,
    again: DkimKey,
    domain: &str,
    selector: &str,
    headers: &[String],
) -> DomainKey {
    let signer = |key: DkimKey, headers: Vec<String>| {
        DkimSigner::from_key(key)
            .domain(domain.to_owned())
            .selector(selector.to_owned())
            .headers(headers)
            .header_canonicalization(Canonicalization::Relaxed)
            .body_canonicalization(Canonicalization::Relaxed)
    };
    let mut with_list = headers.to_vec();
    for field in LIST_UNSUBSCRIBE_FIELDS {
        if !with_list.iter().any(|h| h.eq_ignore_ascii_case(field)) {
            with_list.push(field.to_owned());
        }
    }
    DomainKey {
        selector: selector.to_owned(),
        signer: signer(key, headers.to_vec()),
        list_signer: signer(again, with_list),
    }
}

/// The domain of the (first) RFC5322.From address of a header block.
pub fn from_domain(headers: &[u8]) -> Option<String> {
    let mut block = headers.to_vec();
    block.extend_from_slice(b"\r\n");
    let message = mail_auth::AuthenticatedMessage::parse(&block)?;
    let from = message.from();
    let domain = pepsi_conf::address::domain_part(from)?;
    let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
    (!domain.is_empty()).then_some(domain)
}

/// The DKIM signing program (each stage's `SignStage`, with its keys, is its section).
#[derive(Default)]
pub struct DkimSign {
    /// The usable rows of `pepsi.signing_key`, read once per worker for every section with
    /// `DATABASE_KEYS` (so a broken row is reported once).
    rows: tokio::sync::OnceCell<Vec<StoredKey>>,
}

impl DkimSign {
    /// Reads `pepsi.signing_key` the first time a message needs its keys and logs the rows
    /// that cannot sign, once. A failing query is temporary and leaves nothing cached, so
    /// the message is retried (never sent unsigned) and the next one reads again.
    async fn stored_rows(&self, pool: &sqlx::PgPool) -> Result<&[StoredKey], StageError> {
        let rows = self
            .rows
            .get_or_try_init(|| async {
                let rows = pepsi_outbound::keys::fetch_stored_keys(pool)
                    .await
                    .map_err(|e| {
                        StageError::Temporary(format!(
                            "cannot read the DKIM keys of pepsi.signing_key (DATABASE_KEYS): {e}"
                        ))
                    })?;
                let (usable, skipped) = usable_rows(rows);
                log_skipped(&skipped, None);
                tracing::info!(
                    keys = usable.len(),
                    skipped = skipped.len(),
                    "DKIM keys read from pepsi.signing_key"
                );
                Ok::<_, StageError>(usable)
            })
            .await?;
        Ok(rows)
    }
}

impl Stage for DkimSign {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    // Signing is local work (a hash and a signature): its passes batch.
    const BATCH: bool = true;
    type Section = SignStage;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::default())
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<SignStage> {
        SignStage::from_config(cfg, name)
    }

    async fn process(
        &self,
        stage: &SignStage,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        match stage.policy.signs(ctx.state()) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(
                    id = ctx.id(),
                    "not from an authenticated client nor generated here (SIGN = authenticated): not signed"
                );
                return ctx.advance();
            }
            Err(e) => {
                return Err(StageError::Permanent(format!(
                    "cannot tell who sent the message (state.origin): {e}"
                )));
            }
        }
        let Some(domain) = from_domain(ctx.headers()?) else {
            tracing::debug!(id = ctx.id(), "no From domain: not signed");
            return ctx.advance();
        };
        if stage.database_keys {
            let rows = self.stored_rows(ctx.pool()).await?;
            stage.use_stored_rows(rows, ctx.stage());
        }
        let Some((signing_domain, keys)) = stage.keys_for(&domain) else {
            tracing::debug!(id = ctx.id(), from_domain = %domain, "no DKIM key: not signed");
            return ctx.advance();
        };
        if stage.seven_bit {
            seven_bit_form(ctx)?;
        }
        let raw = ctx.raw_message()?;
        let one_click =
            pepsi_contract::message::has_field(ctx.headers()?, LIST_UNSUBSCRIBE_FIELDS[0]);
        let mut fields = Vec::new();
        for key in &keys {
            let signer = if one_click {
                &key.list_signer
            } else {
                &key.signer
            };
            let signature = signer.sign(&raw).map_err(|e| {
                StageError::Permanent(format!(
                    "DKIM signing with {}._domainkey.{signing_domain} failed: {e}",
                    key.selector
                ))
            })?;
            fields.extend_from_slice(signature.to_header().as_bytes());
        }
        let mut headers = fields;
        headers.extend_from_slice(ctx.headers()?);
        tracing::info!(
            id = ctx.id(),
            domain = signing_domain,
            keys = keys.len(),
            "DKIM signed"
        );
        ctx.set_headers(headers);
        ctx.advance()
    }
}

/// Replaces an 8-bit message by its 7-bit form (quoted-printable or base64 per part), so the
/// signature survives a relay to a peer without 8BITMIME. A message that has none (8-bit
/// bytes in a header field: internationalized mail, which relays refuse rather than
/// downgrade) is signed as it is.
fn seven_bit_form(ctx: &mut StageContext<'_>) -> Result<(), StageError> {
    match pepsi_outbound::mime::downgrade_to_7bit(ctx.headers()?, ctx.body()?) {
        Ok(None) => {}
        Ok(Some((headers, body))) => {
            tracing::info!(
                id = ctx.id(),
                "8-bit message converted to 7-bit before signing"
            );
            ctx.set_headers(headers);
            ctx.set_body(body);
        }
        Err(e) => {
            tracing::debug!(id = ctx.id(), "signed as it is, no 7-bit form: {e}");
        }
    }
    Ok(())
}

const ABOUT: &str = "Pepsi stage that DKIM-signs outgoing mail with the keys of its From domain";

/// The command line of `pepsi-stage-dkim-sign`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}

/// Entry point of the `pepsi-stage-dkim-sign` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<DkimSign>(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}

const LONG_ABOUT: &str = "\
Pepsi stage that DKIM-signs outgoing mail (RFC 6376; RSA-SHA256 and Ed25519-SHA256).

The signing domain is the domain of the message's From: header. When KEYS (or, with \
DATABASE_KEYS, pepsi.signing_key) holds keys for it, one DKIM-Signature: field per key is prepended to the header block (relaxed/relaxed \
canonicalization, From over-signed); the body is left as it is unless SEVEN_BIT \
converts an 8-bit message to 7-bit first. A message whose From \
domain has no key advances unsigned.

Options of the [stage-<name>] section:
  KEYS = domain:selector:/path/key.pem, ...   (required unless DATABASE_KEYS) PEM private \
keys, RSA or Ed25519, PKCS#8 or PKCS#1, read at start; an unreadable file stops the worker.
  DATABASE_KEYS = no   also sign with the enabled rows of pepsi.signing_key (written by the \
config role), read once per worker on its first message. A row whose key does not parse is \
logged as an error naming its domain and selector and skipped; a row with the domain and \
selector of a KEYS item is not used (the file signs); a failing query is a temporary error \
(the message is retried, never sent unsigned). Changing the table notifies config_changed, \
so the dispatcher's new workers read the new keys.
  HEADERS = From, To, Subject, ...   the signed header fields (default: From, Reply-To, \
Sender, To, Cc, Subject, Date, Message-ID, In-Reply-To, References, MIME-Version, \
Content-Type, Content-Transfer-Encoding, Content-Disposition, Content-Language); From is \
always signed twice, and a listed field the message lacks is signed as absent. A message \
with List-Unsubscribe is also signed over List-Unsubscribe and List-Unsubscribe-Post \
(RFC 8058).
  PARENT_DOMAINS = false   sign mail from a subdomain with the nearest parent domain's keys.
  SEVEN_BIT = true   convert a message with 8-bit content to 7-bit (quoted-printable or \
base64 per part) before signing it, so that a relay to a peer without 8BITMIME does not \
have to change it afterwards and break the signature; the body is then rewritten (a new \
body row for this message).
  NEXT_STAGE   where the message goes, signed or not.

See docs/dkim.md.";

#[cfg(test)]
mod tests;
