//! Commands by mail (docs/lists.md, "Commands by mail"): `-join`, `-leave`, `-request` and
//! `-confirm+<token>`. Every subscription and every unsubscription by mail is confirmed by
//! the address it concerns (double opt-in): the request makes a `list_pending` row and mails
//! a confirmation to that address, whose reply (to `team-confirm+<token>@`) or whose
//! `confirm <token>` to `-request` carries it out. Only a SHA-256 of the token is stored.
//!
//! Confirmations are limited per address and list to `confirm_limit_per_address` in each
//! `confirm_window` (`list_confirm_rate`), and per SMTP client ([`client_key`]) to the
//! stage's `CONFIRMATIONS_PER_CLIENT` (the list's `confirm_limit_per_client` unless it says
//! otherwise), counted with the web's requests from that client: past either a request is
//! dropped without a word, so nobody can use a list to flood a stranger's mailbox, nor one
//! client many strangers' (the request's sender may be forged; answering it would be
//! backscatter).
//!
//! `parse_request` (pure, a table) reads a `-request` message's subject or first body line;
//! the rest is the I/O around it.

use chrono::Utc;
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use pepsi_contract::list::{self, ListAddress, MAX_TOKEN_LEN, token_hash};
use pepsi_contract::stage::{StageContext, StageError};
use pepsi_outbound::delivery::{Failure, RcptResult};
use serde_json::Map;
use sqlx::Row as _;

use crate::{ClientLimit, List, Options, delivered};

/// What a `-request` message asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Join,
    Leave,
    Confirm(String),
    Help,
}

/// The command of a `-request` message: the first word of its subject (after any `Re:`),
/// else of its first non-empty body line: `join`/`subscribe`, `leave`/`unsubscribe`,
/// `confirm <token>`, `help`. `None` for anything else.
pub fn parse_request(subject: &str, body: &str) -> Option<Request> {
    let read = |line: &str| -> Option<Request> {
        let mut line = line.trim();
        while let Some(rest) = line
            .strip_prefix("Re:")
            .or_else(|| line.strip_prefix("RE:"))
            .or_else(|| line.strip_prefix("re:"))
        {
            line = rest.trim_start();
        }
        let mut words = line.split_whitespace();
        let word = words.next()?.to_ascii_lowercase();
        Some(match word.as_str() {
            "join" | "subscribe" => Request::Join,
            "leave" | "unsubscribe" => Request::Leave,
            "help" => Request::Help,
            "confirm" => {
                let token = words.next()?.to_ascii_lowercase();
                if token.is_empty()
                    || token.len() > MAX_TOKEN_LEN
                    || !token.bytes().all(|b| b.is_ascii_alphanumeric())
                {
                    return None;
                }
                Request::Confirm(token)
            }
            _ => return None,
        })
    };
    read(subject).or_else(|| body.lines().find(|l| !l.trim().is_empty()).and_then(read))
}

/// A fresh token ([`pepsi_contract::list::new_token`]); no random bytes is a temporary
/// failure.
fn new_token() -> Result<String, StageError> {
    list::new_token()
        .map_err(|e| StageError::Temporary(format!("no random bytes for a token: {e}")))
}

/// Whether a message is from a program rather than a person (RFC 3834): a null envelope
/// sender, `Auto-Submitted` other than `no`, `Precedence` bulk, junk or list, or a
/// `List-Id` or `X-Loop` field (list traffic). Commands in such mail are never carried out
/// and never answered.
pub fn automated(mail_from: &str, headers: &[u8]) -> bool {
    let first = |name: &str| {
        pepsi_contract::message::field_values(headers, name)
            .into_iter()
            .next()
            .map(|v| v.trim().to_ascii_lowercase())
    };
    mail_from.is_empty()
        || first("Auto-Submitted").is_some_and(|v| !v.starts_with("no"))
        || first("Precedence").is_some_and(|v| matches!(v.as_str(), "bulk" | "junk" | "list"))
        || pepsi_contract::message::has_field(headers, "List-Id")
        || pepsi_contract::message::has_field(headers, "X-Loop")
}

/// Who asks: the sender (`crate::sender_of`), unless the message is automated or the sender
/// is an address of this list itself; `None` then, and the command is dropped.
fn requester(ctx: &StageContext<'_>, list: &List) -> Result<Option<String>, StageError> {
    if automated(ctx.mail_from(), ctx.headers()?) {
        return Ok(None);
    }
    let Some(who) = crate::sender_of(ctx)? else {
        return Ok(None);
    };
    if ListAddress::candidates(&who)
        .iter()
        .any(|c| c.list == list.address)
    {
        return Ok(None);
    }
    Ok(Some(who))
}

/// What a request by mail counts under for the per-client limit
/// (`list_confirm_rate.key_kind` `client`): the SMTP client's address the ingress recorded
/// (`state.origin.client_addr`), in the web's form ([`list::client_key`]: IPv4, IPv6 by its
/// /64); for a message without one or from this host (pepsi-sendmail, a relay of ours on
/// loopback), where the address tells no client apart, the envelope sender's domain
/// (`domain:example.net`). `None` when there is neither.
pub fn client_key(client: Option<std::net::IpAddr>, mail_from: &str) -> Option<String> {
    let local = |ip: std::net::IpAddr| {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        ip.is_loopback() || ip.is_unspecified()
    };
    if let Some(ip) = client.filter(|ip| !local(*ip)) {
        return Some(list::client_key(ip));
    }
    let address = pepsi_conf::address::Address::parse(mail_from).ok()?;
    Some(format!("domain:{}", address.domain()))
}

/// Counts the request against the stage's per-client limit: whether it is within it (true
/// when `CONFIRMATIONS_PER_CLIENT` is 0 or there is no client to count).
async fn within_client_limit(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
) -> Result<(bool, Option<String>), StageError> {
    let limit = match options.confirm_limit_per_client {
        ClientLimit::Off => return Ok((true, None)),
        ClientLimit::List => None,
        ClientLimit::At(n) => Some(n as i32),
    };
    let origin = pepsi_contract::state::Origin::from_state(ctx.state())?;
    let Some(key) = client_key(origin.and_then(|o| o.client_addr), ctx.mail_from()) else {
        return Ok((true, None));
    };
    let allowed =
        list::count_confirmation_within(tx, list.id, list::RateKey::Client, &key, limit).await?;
    Ok((allowed, Some(key)))
}

/// The answer for a command nobody (or a program) asked.
fn dropped(what: &str) -> RcptResult {
    delivered(&format!(
        "{what} from a program, the list itself or no address: dropped"
    ))
}

/// `-join`: a confirmation to the requester, unless they are a member already, banned, the
/// list takes no subscriptions, or the limit is reached.
pub(crate) async fn join(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
) -> Result<RcptResult, StageError> {
    let Some(who) = requester(ctx, list)? else {
        return Ok(dropped("a subscription request"));
    };
    let pool = ctx.pool();
    let row = sqlx::query(concat!(
        "SELECT subscription_policy, \
           EXISTS (SELECT 1 FROM pepsi.list_member WHERE list_id = $1 AND address = $2 \
                   AND role = 'member') AS member, ",
        pepsi_contract::list_banned_sql!(),
        " AS banned FROM pepsi.mailing_list WHERE list_id = $1",
    ))
    .bind(list.id)
    .bind(&who)
    .fetch_one(pool)
    .await?;
    let policy: String = row.try_get("subscription_policy")?;
    if policy == "closed" || row.try_get::<bool, _>("banned")? {
        if !crate::refusal_notice(options, ctx, list).await? {
            return Ok(delivered(&format!(
                "a subscription request from {who} refused; no notice: the day's are spent"
            )));
        }
        return Ok(RcptResult::Permanent(Failure::new(
            format!("{} takes no subscription from {who}", list.address),
            "5.7.1",
        )));
    }
    if row.try_get::<bool, _>("member")? {
        return Ok(delivered(&format!("{who} is a member already")));
    }
    request(options, ctx, list, &who, "subscribe").await
}

/// `-leave`: a confirmation to the requester when they are a member; nothing otherwise (the
/// list does not say who its members are).
pub(crate) async fn leave(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
) -> Result<RcptResult, StageError> {
    let Some(who) = requester(ctx, list)? else {
        return Ok(dropped("an unsubscription request"));
    };
    let member = pepsi_contract::list::is_member(ctx.pool(), list.id, &who).await?;
    if !member {
        return Ok(delivered(
            "an unsubscription request from no member: dropped",
        ));
    }
    request(options, ctx, list, &who, "unsubscribe").await
}

/// A pending request of `kind` for `who` and its confirmation mail, within the limit: the
/// count, the pending row and the queued confirmation in one transaction, at most once per
/// queue row (a pass run again counts nothing twice and sends nothing twice).
async fn request(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
    who: &str,
    kind: &str,
) -> Result<RcptResult, StageError> {
    let token = new_token()?;
    let facts = list.facts();
    let confirm = facts.command_address(&format!("-confirm+{token}"));
    let text = format!(
        "We received a request to {kind} {who} {} the mailing list {}.\r\n\r\n\
         To confirm, reply to this message (it goes to {confirm}),\r\n\
         or send a message to {} with the subject:\r\n\r\n    confirm {token}\r\n\r\n\
         If you did not ask for this, ignore this message: nothing changes.\r\n",
        if kind == "subscribe" { "to" } else { "from" },
        list.address,
        facts.command_address("-request"),
    );
    let raw = compose(
        options,
        ctx,
        list,
        who,
        &format!("confirm {token}"),
        &text,
        Some(&confirm),
    )?;
    let mut tx = ctx.pool().begin().await?;
    if !once(
        &mut tx,
        &format!("list-request:{}:{}:{kind}", ctx.id(), list.id),
    )
    .await?
    {
        tx.rollback().await?;
        return Ok(delivered(&format!(
            "{kind} request from {who}: answered before"
        )));
    }
    // Both limits are counted even when the first refuses (as on the web), so a flood
    // from one client is stopped however it spreads over addresses.
    let by_address =
        list::count_confirmation(&mut tx, list.id, list::RateKey::Address, who).await?;
    let (by_client, client) = within_client_limit(&mut tx, options, ctx, list).await?;
    if !by_address || !by_client {
        tx.commit().await?;
        let whose = if by_address {
            format!("client {}", client.as_deref().unwrap_or_default())
        } else {
            "address".to_owned()
        };
        tracing::warn!(list = %list.address, %who, client = client.as_deref().unwrap_or_default(),
            kind, "confirmation limit of the {whose} reached: no confirmation sent");
        return Ok(delivered(&format!(
            "{kind} request from {who}: the confirmation limit of the {whose} is reached, \
             none sent"
        )));
    }
    sqlx::query(
        "INSERT INTO pepsi.list_pending (list_id, address, kind, token_hash, requested_via, \
         expires_at) SELECT $1, $2, $3, $4, 'mail', now() + pending_lifetime \
         FROM pepsi.mailing_list WHERE list_id = $1",
    )
    .bind(list.id)
    .bind(who)
    .bind(kind)
    .bind(token_hash(&token))
    .execute(&mut *tx)
    .await?;
    inject(&mut tx, options, list, who, &raw).await?;
    tx.commit().await?;
    ctx.note_rows_created();
    Ok(delivered(&format!(
        "{kind} request from {who}: confirmation sent"
    )))
}

/// Takes the at-most-once `token` in `tx`: false when it was taken before.
async fn once(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    token: &str,
) -> Result<bool, StageError> {
    let taken: Option<i32> = sqlx::query_scalar(
        "INSERT INTO pepsi.clone_token (token) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1",
    )
    .bind(token)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(taken.is_some())
}

/// Queues the list's message `raw` to `to` in `tx` (the caller notes the new row).
async fn inject(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    options: &Options,
    list: &List,
    to: &str,
    raw: &[u8],
) -> Result<(), StageError> {
    let (headers, body) = pepsi_contract::message::split(raw);
    sqlx::query("SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, '{}')")
        .bind(&options.deliver_stage)
        .bind(list.facts().command_address("-bounces"))
        .bind(vec![to.to_owned()])
        .bind(headers)
        .bind(body)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// `-confirm+<token>` or `confirm <token>`: the pending request carried out, and the
/// person told, in one transaction, at most once per queue row.
pub(crate) async fn confirm(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
    token: &str,
) -> Result<RcptResult, StageError> {
    if automated(ctx.mail_from(), ctx.headers()?) {
        return Ok(dropped("a confirmation"));
    }
    let mut tx = ctx.pool().begin().await?;
    if !once(&mut tx, &format!("list-confirmed:{}:{}", ctx.id(), list.id)).await? {
        tx.rollback().await?;
        return Ok(delivered("confirmed before"));
    }
    let spare = token_hash(&new_token()?);
    let carried = list::carry_out(
        &mut tx,
        list.id,
        &token_hash(token),
        list::Via::Mail,
        &spare,
    )
    .await?;
    let Some(carried) = carried else {
        tx.rollback().await?;
        return Ok(RcptResult::Permanent(Failure::new(
            format!(
                "no request of {} waits for this confirmation: it was used or has expired",
                list.address
            ),
            "5.7.1",
        )));
    };
    let who = carried.address;
    let event = carried.event;
    let facts = list.facts();
    let (subject, text) = match event {
        "subscription.confirmed" => (
            format!("Your subscription to {} waits for approval", list.address),
            format!(
                "Your subscription to {} is confirmed and waits for a moderator's approval.\r\n",
                list.address
            ),
        ),
        "member.subscribe" => (
            format!("Welcome to {}", list.address),
            format!(
                "Welcome to {}.\r\n\r\nTo post, write to {}.\r\nTo leave, write to {}.\r\n",
                list.address,
                list.address,
                facts.command_address("-leave")
            ),
        ),
        _ => (
            format!("You have left {}", list.address),
            format!("You have left {}.\r\n", list.address),
        ),
    };
    let raw = compose(options, ctx, list, &who, &subject, &text, None)?;
    inject(&mut tx, options, list, &who, &raw).await?;
    tx.commit().await?;
    ctx.note_rows_created();
    tracing::info!(list = %list.address, %who, event, "list request confirmed");
    Ok(delivered(&format!("{event} of {who}")))
}

/// `-request`: the command it carries.
pub(crate) async fn request_message(
    options: &Options,
    ctx: &mut StageContext<'_>,
    list: &List,
) -> Result<RcptResult, StageError> {
    let subject = pepsi_contract::message::field_values(ctx.headers()?, "Subject")
        .into_iter()
        .next()
        .unwrap_or_default();
    let body = ctx
        .fetch_body(64 * 1024)
        .await?
        .map(|b| String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned())
        .unwrap_or_default();
    match parse_request(&subject, &body) {
        Some(Request::Join) => join(options, ctx, list).await,
        Some(Request::Leave) => leave(options, ctx, list).await,
        Some(Request::Confirm(token)) => confirm(options, ctx, list, &token).await,
        Some(Request::Help) => {
            let Some(who) = requester(ctx, list)? else {
                return Ok(dropped("a help request"));
            };
            let facts = list.facts();
            let text = format!(
                "Commands for {}:\r\n\r\n\
                 join:    write to {} (you confirm by mail)\r\n\
                 leave:   write to {} (you confirm by mail)\r\n\
                 confirm: reply to a confirmation, or write `confirm TOKEN` to {}\r\n\
                 owners:  {}\r\n",
                list.address,
                facts.command_address("-join"),
                facts.command_address("-leave"),
                facts.command_address("-request"),
                facts.command_address("-owner"),
            );
            send(
                options,
                ctx,
                list,
                &who,
                &format!("Help for {}", list.address),
                &text,
                None,
                &format!("list-help:{}:{}", ctx.id(), list.id),
            )
            .await?;
            Ok(delivered("help sent"))
        }
        None => Ok(RcptResult::Permanent(Failure::new(
            format!(
                "no command for {} in the subject or the first line: join, leave, \
                 confirm TOKEN or help",
                list.address
            ),
            "5.5.2",
        ))),
    }
}

/// A message from the list to `to`: from the list's `-request` address (replies to
/// `reply_to` when given), `Auto-Submitted: auto-replied`, the list's `List-Id`.
fn compose(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
    to: &str,
    subject: &str,
    text: &str,
    reply_to: Option<&str>,
) -> Result<Vec<u8>, StageError> {
    let facts = list.facts();
    let now = Utc::now();
    let mut message = MessageBuilder::new()
        .from(facts.command_address("-request"))
        .to(to)
        .subject(subject)
        .date(Date::new(now.timestamp()))
        .message_id(format!(
            "{}.{}.list@{}",
            now.timestamp_micros(),
            ctx.id(),
            options.hostname
        ))
        .header("Auto-Submitted", Raw::new("auto-replied"))
        .header("List-Id", Raw::new(format!("<{}>", facts.list_id())));
    if let Some(r) = reply_to {
        message = message.reply_to(r);
    }
    message
        .text_body(text)
        .write_to_vec()
        .map_err(|e| StageError::Temporary(format!("writing a message: {e}")))
}

/// [`compose`]d and queued at DELIVER_STAGE with the `-bounces` address as envelope
/// sender, once per `token`.
#[allow(clippy::too_many_arguments)]
async fn send(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
    to: &str,
    subject: &str,
    text: &str,
    reply_to: Option<&str>,
    token: &str,
) -> Result<(), StageError> {
    let raw = compose(options, ctx, list, to, subject, text, reply_to)?;
    ctx.enqueue_new(
        &options.deliver_stage,
        &list.facts().command_address("-bounces"),
        &[to.to_owned()],
        &raw,
        Map::new(),
        Some(token),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_keys_table() {
        let cases: &[(Option<&str>, &str, Option<&str>)] = &[
            (Some("192.0.2.7"), "a@b.example", Some("192.0.2.7")),
            (Some("2001:db8:1:2:3::9"), "", Some("2001:db8:1:2::/64")),
            (Some("::ffff:192.0.2.7"), "a@b.example", Some("192.0.2.7")),
            // From this host: the envelope sender's domain tells clients apart instead.
            (
                Some("127.0.0.1"),
                "bot@Spam.Example",
                Some("domain:spam.example"),
            ),
            (Some("::1"), "bot@spam.example", Some("domain:spam.example")),
            (
                Some("::ffff:127.0.0.1"),
                "bot@spam.example",
                Some("domain:spam.example"),
            ),
            (None, "bot@spam.example", Some("domain:spam.example")),
            (None, "", None),
            (None, "no address", None),
        ];
        for (ip, mail_from, want) in cases {
            let ip = ip.map(|i| i.parse().unwrap());
            assert_eq!(
                client_key(ip, mail_from).as_deref(),
                *want,
                "{ip:?} {mail_from:?}"
            );
        }
    }

    #[test]
    fn requests_table() {
        let t = "0a1b2c";
        let cases: &[(&str, &str, Option<Request>)] = &[
            ("join", "", Some(Request::Join)),
            ("Subscribe me please", "", Some(Request::Join)),
            ("LEAVE", "", Some(Request::Leave)),
            ("unsubscribe", "", Some(Request::Leave)),
            ("Re: confirm 0A1B2C", "", Some(Request::Confirm(t.into()))),
            (
                "Re: Re: confirm 0a1b2c",
                "",
                Some(Request::Confirm(t.into())),
            ),
            ("help", "", Some(Request::Help)),
            ("", "\r\n  join\r\nmore", Some(Request::Join)),
            ("hello", "leave\r\n", Some(Request::Leave)),
            ("confirm", "", None),
            ("confirm a.b", "", None),
            ("lunch?", "who is in?", None),
            ("", "", None),
        ];
        for (subject, body, want) in cases {
            assert_eq!(&parse_request(subject, body), want, "{subject:?} {body:?}");
        }
    }
}
