//! pepsi-stage-encrypt: encrypts outgoing mail end to end, OpenPGP/MIME (RFC 3156) or
//! S/MIME (RFC 8551) as each recipient's key dictates, signed inside the encryption when
//! the sender has an identity, and carries the sender's Autocrypt header.
//!
//! Reads: the whole message (`Load::Full`), `pepsi.settings` (`encrypt` of the sender and
//! the recipients), the key store (peer keys and identities, the sender's private key
//! through pepsi-keymat), `pepsi.crypto_request_key` for discovery. Writes: the header
//! block and body (encrypted, or the Autocrypt header added), `state.crypto.encrypted`,
//! `state.keydisc` while parked. Terminal helpers: `advance`/`advance_with`, `pause`
//! (parked for key discovery), `reroute` to BOUNCE_STAGE or SECURE_LINK_STAGE,
//! `fan_out_keeping_age` (refused recipients; recipients needing another scheme, which come
//! back to this stage; recipients without a key sent to SECURE_LINK_STAGE, marked
//! `state.secure_link.reason = "encrypt-fallback"`, when `pepsi.secure_link_policy` allows).
//!
//! The decisions are `plan` (pure, tested as a table); this file gathers the facts and
//! carries the plan out. The stage is standalone and set-user-id `pepsi-crypto` in a
//! package (spec 22.2): only that database role may read the sealed private keys.

pub mod plan;

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pepsi_conf::address::Address;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::message;
use pepsi_contract::settings;
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{FanGroup, FanRecipients};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{
    self, Bounce, BounceDetail, BounceKind, Crypto, Encrypted, Keydisc, Origin, SecureLink,
    SecureLinkReason,
};
use pepsi_crypto::{Scheme, autocrypt, openpgp, smime};
use pepsi_keymat::Keyring;
use pepsi_keymat::store::{self, Identity};
use plan::{Discovery, Plan, Policy, Refusal, Then};
use serde_json::{Map, Value};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-encrypt",
        exec: "pepsi-stage-encrypt",
    };
    pub const PROGRAM: &str = "pepsi-stage-encrypt";

    /// The settings name (`pepsi.settings`) of the per-address policy.
    pub const SETTING: &str = "encrypt";
    /// The settings name of an identity's Autocrypt preference (`mutual` to ask for it).
    pub const PREFER_SETTING: &str = "autocrypt_prefer_encrypt";
    /// The RFC 3463 status of a recipient returned for want of a key.
    pub const NO_KEY_STATUS: &str = "5.7.5";
}

/// The key-discovery methods, as `DISCOVERY_METHODS` names them.
pub const METHODS: [&str; 4] = ["wkd", "openpgpkey", "smimea", "keyserver"];

/// One `[stage-<name>]` running this program.
#[derive(Debug, Clone)]
pub struct Options {
    /// `POLICY` (default opportunistic): for senders without an `encrypt` setting.
    pub policy: Policy,
    /// `PREFER` (default `openpgp, smime`): the scheme for a recipient with keys of both.
    pub prefer: Vec<Scheme>,
    /// `SIGN` (default yes): sign inside the encryption with the sender's identity.
    pub sign: bool,
    /// `AUTOCRYPT` (default yes): our Autocrypt header on mail from an identity.
    pub autocrypt: bool,
    /// `DISCOVERY` (default yes): a recipient without a key under `required` waits for
    /// pepsi-keydisc; `no` returns it at once.
    pub discovery: bool,
    /// `DISCOVERY_METHODS`: what pepsi-keydisc is asked to try.
    pub methods: Vec<String>,
    /// `DISCOVERY_TIMEOUT` (default 1h): how long a message waits for discovery to settle.
    pub discovery_timeout: Duration,
    /// `DISCOVERY_RECHECK` (default 1m): the longest a parked message waits before it looks
    /// again by itself.
    pub discovery_recheck: Duration,
    /// `SECURE_LINK_STAGE` (default none): where a recipient without a key under `required`
    /// goes instead of being returned with 5.7.5, when the secure-link policy of its domain
    /// or the sender's says `fallback` or `always` (pepsi-stage-secure-link).
    pub secure_link_stage: Option<String>,
}

impl Options {
    pub fn from_config(
        cfg: &Config,
        name: &str,
        keyring: &Result<Keyring, String>,
    ) -> anyhow::Result<Self> {
        let section_name = pepsi_conf::config::stage_section_name(name);
        let s = cfg.section(&section_name);
        let policy = s
            .parse_opt("POLICY", Policy::parse)?
            .unwrap_or(Policy::Opportunistic);
        let prefer = match s.list_opt("PREFER")? {
            Some(list) => {
                let mut out = Vec::new();
                for item in list {
                    let scheme = Scheme::parse(&item).ok_or_else(|| {
                        anyhow::anyhow!("[{section_name}] PREFER: {item:?} is not openpgp or smime")
                    })?;
                    if !out.contains(&scheme) {
                        out.push(scheme);
                    }
                }
                out
            }
            None => vec![Scheme::OpenPgp, Scheme::Smime],
        };
        let methods = match s.list_opt("DISCOVERY_METHODS")? {
            Some(list) => {
                for m in &list {
                    if !METHODS.contains(&m.as_str()) {
                        anyhow::bail!(
                            "[{section_name}] DISCOVERY_METHODS: {m:?} is not one of {}",
                            METHODS.join(", ")
                        );
                    }
                }
                list
            }
            None => METHODS.iter().map(|m| m.to_string()).collect(),
        };
        if methods.is_empty() {
            anyhow::bail!(
                "[{section_name}] DISCOVERY_METHODS lists no method (DISCOVERY = no turns discovery off)"
            );
        }
        let secure_link_stage = s
            .string_opt("SECURE_LINK_STAGE")?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty());
        if let Some(target) = &secure_link_stage
            && cfg.stage(target).is_none()
        {
            anyhow::bail!(
                "[{section_name}] SECURE_LINK_STAGE = {target}: there is no [stage-{target}]"
            );
        }
        let sign = s.bool_opt("SIGN")?.unwrap_or(true);
        if sign && let Err(e) = keyring {
            anyhow::bail!(
                "[{section_name}] SIGN = yes opens the senders' private keys, which needs the \
                 key-encryption key: {e} (or set SIGN = no)"
            );
        }
        Ok(Options {
            policy,
            prefer,
            sign,
            autocrypt: s.bool_opt("AUTOCRYPT")?.unwrap_or(true),
            discovery: s.bool_opt("DISCOVERY")?.unwrap_or(true),
            methods,
            discovery_timeout: s
                .duration_opt("DISCOVERY_TIMEOUT")?
                .unwrap_or(Duration::from_secs(3600)),
            discovery_recheck: s
                .duration_opt("DISCOVERY_RECHECK")?
                .unwrap_or(Duration::from_secs(60)),
            secure_link_stage,
        })
    }
}

/// The program: the keyring, loaded once (or why it could not be).
pub struct Encrypt {
    keyring: Result<Keyring, String>,
}

/// A recipient's key, chosen.
struct Chosen {
    scheme: Scheme,
    key: Vec<u8>,
}

impl Stage for Encrypt {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Encrypt {
            keyring: Keyring::from_config(cfg).map_err(|e| e.to_string()),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name, &self.keyring)
    }

    /// NEXT_STAGE, and SECURE_LINK_STAGE when set: where recipients without a key go
    /// instead of a 5.7.5 bounce.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        if let Some(target) = d.option("SECURE_LINK_STAGE") {
            d.branch("SECURE_LINK_STAGE", target, "secure-link");
        }
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let headers = ctx.headers()?.to_vec();
        if pepsi_crypto::carries_ciphertext(&headers, ctx.body()?) {
            // Encrypted by the sender's own client: nothing to add. A label alone is not
            // enough: the body must hold an OpenPGP message or CMS enveloped data.
            return ctx.advance_with(clear_keydisc(ctx.state()));
        }
        let now = Utc::now();
        // Whose policy applies: the authenticated mailbox, else the envelope sender (which
        // the ingress checked), never a From field anyone can write.
        let origin = Origin::from_state(ctx.state())?;
        let author = message::from_addresses(&headers)
            .into_iter()
            .next()
            .unwrap_or_default()
            .to_lowercase();
        let sender = origin
            .as_ref()
            .and_then(|o| o.auth_user.clone())
            .unwrap_or_else(|| ctx.mail_from().to_owned())
            .to_lowercase();
        let rcpts: Vec<String> = ctx.rcpt_to().iter().map(|r| r.to_lowercase()).collect();
        let pool = ctx.pool();

        let mut keys = settings::lookup_keys(&sender);
        for r in &rcpts {
            for k in settings::lookup_keys(r) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        let table = settings::fetch(
            pool,
            &keys,
            &[constants::SETTING, constants::PREFER_SETTING],
        )
        .await?;
        let setting = |address: &str| -> Option<Policy> {
            let value = table.resolve(address, constants::SETTING)?.value;
            let text = match &value {
                Value::String(s) => s.clone(),
                Value::Bool(true) => "required".into(),
                Value::Bool(false) => "off".into(),
                other => other.to_string(),
            };
            Policy::parse(&text)
                .inspect_err(|e| tracing::warn!(address, "encrypt setting not used: {e}"))
                .ok()
        };
        let sender_policy = setting(&sender).unwrap_or(options.policy);
        let rcpt_policies: Vec<Option<Policy>> = rcpts.iter().map(|r| setting(r)).collect();
        let mut policy = plan::message_policy(sender_policy, &rcpt_policies);
        let mark = SecureLink::from_state(ctx.state())
            .inspect_err(|e| tracing::warn!(id = ctx.id(), "{e}: read as absent"))
            .ok()
            .flatten();
        if policy == Policy::Required
            && (ctx.mail_from().is_empty() || mark.as_ref().is_some_and(|m| m.made.is_some()))
        {
            // A delivery report cannot be returned, nor wait on its reader's key: it goes
            // encrypted when it can and as it is otherwise. Nor can a secure link's notice or
            // receipt, which carries nothing of the message it is about.
            policy = Policy::Opportunistic;
        }

        // The author's identities, when the message is theirs to sign.
        let own: Vec<Identity> = if may_speak_for(origin.as_ref(), &author) {
            store::identities(pool, std::slice::from_ref(&author))
                .await
                .map_err(keymat)?
                .into_iter()
                .filter(|i| i.is_primary && i.is_usable(now))
                .collect()
        } else {
            Vec::new()
        };
        let prefer_mutual = table
            .resolve(&author, constants::PREFER_SETTING)
            .is_some_and(|s| s.value.as_str() == Some("mutual"));
        let with_autocrypt = autocrypt_header(options, &headers, &author, &own, prefer_mutual);

        if policy == Policy::Off {
            return finish_plain(ctx, with_autocrypt);
        }

        let mut chosen = recipient_keys(pool, &rcpts, &options.prefer, now).await?;
        let mut discovery: Vec<Option<Discovery>> = vec![None; rcpts.len()];
        if policy == Policy::Required {
            let mut reread = false;
            for (i, r) in rcpts.iter().enumerate() {
                if chosen[i].is_some() {
                    continue;
                }
                discovery[i] = Some(match options.discovery {
                    true => request_key(pool, r, &options.methods).await?,
                    false => Discovery::Off,
                });
                reread |= discovery[i] == Some(Discovery::Unusable);
            }
            if reread {
                // Discovery settled with a key after the keys above were read: read again;
                // a key that is still not usable is refused.
                chosen = recipient_keys(pool, &rcpts, &options.prefer, now).await?;
                for (i, c) in chosen.iter().enumerate() {
                    if c.is_some() {
                        discovery[i] = None;
                    }
                }
            }
        }
        let visible: Vec<String> = message::visible_recipient_addresses(&headers)
            .into_iter()
            .map(|a| a.to_lowercase())
            .collect();
        // A message already sent to the secure-link stage once (and back here) falls back no
        // more: its recipients without a key are returned.
        let fallback = match (&options.secure_link_stage, policy, &mark) {
            (Some(_), Policy::Required, None) => {
                let keyless: Vec<&String> = rcpts
                    .iter()
                    .zip(&chosen)
                    .filter(|(_, c)| c.is_none())
                    .map(|(r, _)| r)
                    .collect();
                secure_link_allowed(pool, &keyless, ctx.mail_from()).await?
            }
            _ => Vec::new(),
        };
        let facts: Vec<plan::Recipient> = rcpts
            .iter()
            .zip(&chosen)
            .zip(discovery)
            .map(|((r, c), discovery)| plan::Recipient {
                scheme: c.as_ref().map(|c| c.scheme),
                discovery,
                hidden: !visible.contains(r),
                fallback: fallback.contains(r),
            })
            .collect();
        let since = parked_since(ctx.state()).unwrap_or(now);
        let timed_out = now
            .signed_duration_since(since)
            .to_std()
            .unwrap_or_default()
            >= options.discovery_timeout;
        let plan = plan::plan(policy, &facts, timed_out);
        tracing::debug!(id = ctx.id(), ?policy, ?plan, "encryption plan");
        carry_out(
            self,
            options,
            ctx,
            plan,
            &rcpts,
            chosen,
            &own,
            headers,
            with_autocrypt,
            since,
        )
        .await
    }
}

/// Whether the message may carry the author's signature and Autocrypt header: only when
/// the very mailbox of its From address submitted it after AUTH. Anyone else (an MX
/// delivery forwarded out, another mailbox writing someone's From, a row made without an
/// origin by whoever may write the queue) is not signed in that address's name.
fn may_speak_for(origin: Option<&Origin>, author: &str) -> bool {
    !author.is_empty()
        && origin
            .and_then(|o| o.auth_user.as_deref())
            .is_some_and(|u| u.eq_ignore_ascii_case(author))
}

/// `state.keydisc` cleared, for every way out but a park.
fn clear_keydisc(state: &Map<String, Value>) -> Map<String, Value> {
    Keydisc::clear(state)
}

fn keymat(e: pepsi_keymat::KeymatError) -> StageError {
    match e {
        pepsi_keymat::KeymatError::Database(db) => StageError::Database(db),
        // A key that does not open, or a KEK missing: the operator must act; the message
        // waits rather than leaving unsigned or unencrypted.
        other => StageError::Temporary(other.to_string()),
    }
}

/// The header block with our Autocrypt header added, when AUTOCRYPT is on, the sender has
/// a published OpenPGP identity and the message has no Autocrypt header for it already.
fn autocrypt_header(
    options: &Options,
    headers: &[u8],
    sender: &str,
    own: &[Identity],
    prefer_mutual: bool,
) -> Option<Vec<u8>> {
    if !options.autocrypt || autocrypt::from_message(headers, sender).is_some() {
        return None;
    }
    let identity = own
        .iter()
        .find(|i| i.scheme == Scheme::OpenPgp && i.published)?;
    let prefer = if prefer_mutual {
        autocrypt::PreferEncrypt::Mutual
    } else {
        autocrypt::PreferEncrypt::NoPreference
    };
    match autocrypt::header_value(sender, &identity.public_key, prefer) {
        Ok(value) => {
            let mut out = headers.to_vec();
            out.extend_from_slice(format!("Autocrypt: {value}\r\n").as_bytes());
            Some(out)
        }
        Err(e) => {
            tracing::warn!(identity = %identity.fingerprint, "no Autocrypt header: {e}");
            None
        }
    }
}

fn finish_plain(
    ctx: &mut StageContext<'_>,
    with_autocrypt: Option<Vec<u8>>,
) -> Result<Terminal, StageError> {
    if let Some(h) = with_autocrypt {
        ctx.set_headers(h);
    }
    ctx.advance_with(clear_keydisc(ctx.state()))
}

/// Each recipient's key, chosen by PREFER among the usable ones: a peer key (valid, within
/// its cache time) or the recipient's own primary identity when the recipient is ours.
async fn recipient_keys(
    pool: &sqlx::PgPool,
    rcpts: &[String],
    prefer: &[Scheme],
    now: DateTime<Utc>,
) -> Result<Vec<Option<Chosen>>, StageError> {
    let mut peers = store::peer_keys(pool, rcpts).await.map_err(keymat)?;
    // The most trustworthy source first: an operator's import, then what the recipient's
    // domain publishes, then a signed message's certificate, and a key that arrived in a
    // header anyone could have written last. Newest first within a source.
    peers.sort_by_key(|p| {
        let rank = match p.source.as_str() {
            "import" => 0,
            "wkd" | "keyserver" => 1,
            "openpgpkey" | "smimea" if p.dnssec_validated => 1,
            "openpgpkey" | "smimea" => 2,
            "signature" => 3,
            _ => 4,
        };
        (rank, std::cmp::Reverse(p.updated_at))
    });
    let locals = store::identities(pool, rcpts).await.map_err(keymat)?;
    let mut out = Vec::with_capacity(rcpts.len());
    for r in rcpts {
        let mut available: Vec<(Scheme, Vec<u8>)> = Vec::new();
        let candidates = locals
            .iter()
            .filter(|i| {
                &i.address == r && i.is_primary && i.is_usable(now) && i.capability.decrypts()
            })
            .map(|i| (i.scheme, &i.public_key))
            .chain(
                peers
                    .iter()
                    .filter(|p| {
                        &p.address == r
                            && p.verdict == "valid"
                            && p.cache_until.is_none_or(|t| t > now)
                    })
                    .map(|p| (p.scheme, &p.public_key)),
            );
        for (scheme, key) in candidates {
            if available.iter().any(|(s, _)| *s == scheme) {
                continue;
            }
            if usable_for_encryption(scheme, key) {
                available.push((scheme, key.clone()));
            }
        }
        let schemes: Vec<Scheme> = available.iter().map(|(s, _)| *s).collect();
        out.push(plan::choose(&schemes, prefer).map(|scheme| {
            let key = available
                .iter()
                .find(|(s, _)| *s == scheme)
                .map(|(_, k)| k.clone())
                .expect("chosen among the available");
            Chosen { scheme, key }
        }));
    }
    Ok(out)
}

fn usable_for_encryption(scheme: Scheme, key: &[u8]) -> bool {
    let info = match scheme {
        Scheme::OpenPgp => openpgp::inspect(key),
        Scheme::Smime => smime::inspect(key),
    };
    info.ok()
        .and_then(|i| i.into_iter().next())
        .is_some_and(|i| i.can_encrypt && !i.revoked)
}

async fn request_key(
    pool: &sqlx::PgPool,
    address: &str,
    methods: &[String],
) -> Result<Discovery, StageError> {
    let status: String = sqlx::query_scalar("SELECT pepsi.crypto_request_key($1, $2)")
        .bind(address)
        .bind(methods)
        .fetch_one(pool)
        .await?;
    Ok(match status.as_str() {
        "none" => Discovery::NoKey,
        // Settled with a key the caller did not find usable (it reads again first).
        "found" => Discovery::Unusable,
        _ => Discovery::Pending,
    })
}

/// Of `recipients`, those the secure-link policy (`pepsi_secure_link::policy`: the
/// recipient domain's row, else the sender domain's) lets fall back to a secure link.
async fn secure_link_allowed(
    pool: &sqlx::PgPool,
    recipients: &[&String],
    sender: &str,
) -> Result<Vec<String>, StageError> {
    if recipients.is_empty() || sender.is_empty() {
        return Ok(Vec::new());
    }
    let domain = |a: &str| Address::parse(a).ok().map(|a| a.domain().to_owned());
    let sender_domain = domain(sender);
    let domains: Vec<Option<String>> = recipients.iter().map(|r| domain(r)).collect();
    let mut distinct: Vec<String> = domains.iter().flatten().cloned().collect();
    distinct.sort_unstable();
    distinct.dedup();
    let policies =
        pepsi_secure_link::policy::load(pool, &distinct, sender_domain.as_slice()).await?;
    Ok(recipients
        .iter()
        .zip(&domains)
        .filter(|(_, d)| {
            policies
                .resolve(d.as_deref(), sender_domain.as_deref())
                .is_some_and(|r| r.rule.mode.allows_fallback())
        })
        .map(|(r, _)| (*r).clone())
        .collect())
}

/// When the message was first parked for discovery (`state.keydisc.since`).
fn parked_since(state: &Map<String, Value>) -> Option<DateTime<Utc>> {
    let parked = Keydisc::from_state(state).ok().flatten()?;
    DateTime::parse_from_rfc3339(&parked.since)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The bounce of the refused recipients.
fn refusal_state(
    stage: &str,
    rcpts: &[String],
    refused: &[(usize, Refusal)],
    timeout: Duration,
) -> Map<String, Value> {
    let detail = |why: Refusal, address: &str| {
        let diagnostic = match why {
            Refusal::NoKey => format!(
                "the sender's policy requires encryption and no key for {address} was found \
                 (key discovery settled without one)"
            ),
            Refusal::DiscoveryTimedOut => format!(
                "the sender's policy requires encryption and key discovery for {address} did \
                 not settle within {}s",
                timeout.as_secs()
            ),
            Refusal::UnusableKey => format!(
                "the sender's policy requires encryption and the key found for {address} \
                 cannot be used (expired, revoked, or of a scheme this server does not use)"
            ),
        };
        BounceDetail {
            diagnostic: Some(diagnostic),
            enhanced_status: Some(constants::NO_KEY_STATUS.into()),
            ..BounceDetail::default()
        }
    };
    let (first, why) = refused[0];
    let mut bounce = Bounce::new(BounceKind::Permanent)
        .stage(stage)
        .with_detail(detail(why, &rcpts[first]));
    bounce.recipients = refused
        .iter()
        .map(|(i, why)| (rcpts[*i].clone(), detail(*why, &rcpts[*i])))
        .collect();
    let mut state = Map::new();
    bounce.insert_into(&mut state);
    state
}

/// `state.crypto` with `encrypted` set and what else it holds kept exactly as stored (the other
/// crypto stage's part included, whether it parses or not).
fn crypto_state(state: &Map<String, Value>, encrypted: Encrypted) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        Crypto::KEY.into(),
        state::with_member(state, Crypto::KEY, "encrypted", Some(&encrypted)),
    );
    m
}

#[allow(clippy::too_many_arguments)]
async fn carry_out(
    stage: &Encrypt,
    options: &Options,
    ctx: &mut StageContext<'_>,
    plan: Plan,
    rcpts: &[String],
    chosen: Vec<Option<Chosen>>,
    own: &[Identity],
    headers: Vec<u8>,
    with_autocrypt: Option<Vec<u8>>,
    since: DateTime<Utc>,
) -> Result<Terminal, StageError> {
    let name = ctx.options().name.clone();
    let refused_idx: Vec<usize> = plan.refuse.iter().map(|(i, _)| *i).collect();
    let bounce_stage = || {
        ctx.options()
            .bounce_stage
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(name.to_string()))
    };
    // Recipients without a key sent to the secure-link stage, marked why.
    let secure_link = match (&options.secure_link_stage, plan.secure_link.is_empty()) {
        (Some(stage), false) => {
            let mut state = Map::new();
            SecureLink::to_secure(SecureLinkReason::EncryptFallback).insert_into(&mut state);
            state.extend(clear_keydisc(ctx.state()));
            tracing::info!(id = ctx.id(), rcpt = ?plan.secure_link.iter().map(|i| &rcpts[*i]).collect::<Vec<_>>(),
                %stage, "no key where encryption is required: to a secure link");
            Some((stage.clone(), state))
        }
        _ => None,
    };
    if matches!(plan.then, Then::Nothing) {
        let Some((stage, link_state)) = secure_link else {
            let mut state = refusal_state(&name, rcpts, &plan.refuse, options.discovery_timeout);
            state.extend(clear_keydisc(ctx.state()));
            return ctx.reroute(&bounce_stage()?, state);
        };
        if !plan.refuse.is_empty() {
            let state = refusal_state(&name, rcpts, &plan.refuse, options.discovery_timeout);
            let refused = FanGroup {
                state,
                ..FanGroup::new(FanRecipients::Indices(refused_idx), bounce_stage()?)
            };
            ctx.fan_out_keeping_age(&plan.secure_link, &[refused])
                .await?;
        }
        return ctx.reroute(&stage, link_state);
    }
    // The recipients this row keeps, and the rows split off.
    let remaining: Vec<usize> = (0..rcpts.len())
        .filter(|i| !refused_idx.contains(i) && !plan.secure_link.contains(i))
        .collect();
    let (keep, mut groups): (Vec<usize>, Vec<FanGroup>) = match &plan.then {
        Then::Split(parts) => (
            parts[0].clone(),
            parts[1..]
                .iter()
                .map(|p| FanGroup::new(FanRecipients::Indices(p.clone()), name.clone()))
                .collect(),
        ),
        _ => (remaining, Vec::new()),
    };
    if !plan.refuse.is_empty() {
        let state = refusal_state(&name, rcpts, &plan.refuse, options.discovery_timeout);
        groups.push(FanGroup {
            state,
            ..FanGroup::new(FanRecipients::Indices(refused_idx.clone()), bounce_stage()?)
        });
    }
    if let Some((stage, state)) = secure_link {
        groups.push(FanGroup {
            state,
            ..FanGroup::new(FanRecipients::Indices(plan.secure_link.clone()), stage)
        });
    }
    if !groups.is_empty() {
        ctx.fan_out_keeping_age(&keep, &groups).await?;
    }
    match plan.then {
        Then::Nothing => unreachable!("returned above"),
        Then::Plain => finish_plain(ctx, with_autocrypt),
        Then::Park(_) => {
            let waiting: Vec<&String> = keep
                .iter()
                .filter(|i| chosen[**i].is_none())
                .map(|i| &rcpts[*i])
                .collect();
            let left = options.discovery_timeout.saturating_sub(
                Utc::now()
                    .signed_duration_since(since)
                    .to_std()
                    .unwrap_or_default(),
            );
            tracing::info!(id = ctx.id(), ?waiting, "parked for key discovery");
            let mut state = Map::new();
            Keydisc {
                waiting: waiting.into_iter().cloned().collect(),
                since: since.to_rfc3339(),
                stage: name.to_string(),
            }
            .insert_into(&mut state);
            // Due again after DISCOVERY_RECHECK at the latest (keydisc_release wakes it
            // sooner), so a settle that came just before this pause is not missed for long.
            let wait = left.min(options.discovery_recheck) + Duration::from_secs(1);
            ctx.pause(state, wait)
        }
        Then::Encrypt(_) | Then::Split(_) => {
            let scheme = chosen[keep[0]]
                .as_ref()
                .expect("a kept recipient has a key")
                .scheme;
            let keys: Vec<&[u8]> = keep
                .iter()
                .map(|i| {
                    chosen[*i]
                        .as_ref()
                        .expect("a kept recipient has a key")
                        .key
                        .as_slice()
                })
                .collect();
            let base = with_autocrypt.unwrap_or(headers);
            let body = ctx.body()?.to_vec();
            let mut signer = match options.sign {
                true => signer(stage, ctx, own, scheme).await?,
                false => None,
            };
            let encrypt = |signer: Option<&Signer>| match scheme {
                Scheme::OpenPgp => {
                    openpgp::encrypt(&base, &body, &keys, signer.map(|s| s.secret.as_slice()))
                }
                Scheme::Smime => smime::encrypt(
                    &base,
                    &body,
                    &keys,
                    signer.map(|s| (s.public.as_slice(), s.secret.as_slice())),
                ),
            };
            let failed = |e: pepsi_crypto::CryptoError| {
                StageError::Permanent(format!("cannot encrypt ({scheme}): {e}"))
            };
            let mut sign_error = None;
            let protected = match encrypt(signer.as_ref()) {
                Ok(p) => p,
                // A signing key that cannot sign (expired, protected) must not stop the
                // author's mail: it leaves encrypted and unsigned, and the reason is kept.
                Err(e) if signer.is_some() => {
                    tracing::warn!(id = ctx.id(), "cannot sign, encrypting unsigned: {e}");
                    sign_error = Some(e.to_string());
                    signer = None;
                    encrypt(None).map_err(failed)?
                }
                Err(e) => return Err(failed(e)),
            };
            ctx.set_headers(protected.headers);
            ctx.set_body(protected.body);
            let mut state = crypto_state(
                ctx.state(),
                Encrypted {
                    stage: name.to_string(),
                    scheme: scheme.as_str().to_owned(),
                    recipients: keep.len(),
                    signed_by: signer.as_ref().map(|s| s.fingerprint.clone()),
                    sign_error,
                },
            );
            state.extend(clear_keydisc(ctx.state()));
            tracing::info!(id = ctx.id(), %scheme, recipients = keep.len(), signed = signer.is_some(), "encrypted");
            ctx.advance_with(state)
        }
    }
}

/// The sender's signing key of `scheme`, opened.
struct Signer {
    fingerprint: String,
    public: Vec<u8>,
    secret: pepsi_keymat::Zeroizing<Vec<u8>>,
}

async fn signer(
    stage: &Encrypt,
    ctx: &StageContext<'_>,
    own: &[Identity],
    scheme: Scheme,
) -> Result<Option<Signer>, StageError> {
    let Some(identity) = own
        .iter()
        .find(|i| i.scheme == scheme && i.capability.signs())
    else {
        return Ok(None);
    };
    let keyring = stage
        .keyring
        .as_ref()
        .map_err(|e| StageError::Temporary(e.clone()))?;
    let unsealed =
        store::unsealed_identities(ctx.pool(), keyring, std::slice::from_ref(&identity.address))
            .await
            .map_err(keymat)?
            .into_iter()
            .find(|u| u.identity.id == identity.id);
    Ok(unsealed.map(|u| Signer {
        fingerprint: u.identity.fingerprint.clone(),
        public: u.identity.public_key.clone(),
        secret: u.secret,
    }))
}

const ABOUT: &str = "Encrypt outgoing mail end to end: OpenPGP/MIME (RFC 3156) or S/MIME \
(RFC 8551) as each recipient's key dictates, signed inside the encryption with the sender's \
identity, with the sender's Autocrypt header. The policy is the `encrypt` setting of the sender \
(address, else @domain, else POLICY) raised to `required` by a recipient's own: off, \
opportunistic (encrypt when every recipient has a key) or required (a recipient without a key \
waits for pepsi-keydisc and is returned with 5.7.5 when discovery settles without one, or \
goes to SECURE_LINK_STAGE instead when that is set and pepsi.secure_link_policy says \
`fallback` or `always` for its domain or the sender's; a delivery report, which cannot be \
returned, and a secure link's notice are never held to `required`). Options of \
[stage-NAME]: NEXT_STAGE, BOUNCE_STAGE, POLICY (opportunistic), PREFER (openpgp, smime), \
SIGN (yes; needs [crypto] KEK), AUTOCRYPT (yes), DISCOVERY (yes), DISCOVERY_METHODS (wkd, \
openpgpkey, smimea, keyserver), DISCOVERY_TIMEOUT (1h), DISCOVERY_RECHECK (1m), \
SECURE_LINK_STAGE (none: recipients without a key are returned). See docs/crypto.md.";

/// The command line of `pepsi-stage-encrypt`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-encrypt` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Encrypt>(&constants::CONFIG_SOURCE, ABOUT, "")
}
