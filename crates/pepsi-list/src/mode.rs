//! `pepsi-list set-mode LIST ADDRESS MODE`: how a member takes the list's posts, one by one
//! (`regular`) or collected in a digest (`mime`, `plain`; docs/lists.md, "Digests"). The
//! choice is the member's `list_member_preference.delivery_mode`; the list stage and
//! `pepsi-list maintain` read it when they send (`pepsi_list_digest`). A change while the
//! list's digest is open keeps the member's share of it ([`switch`]).

use pepsi_conf::cli::ToolFailure as Failure;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use crate::store::Who;

/// A member's share of the list's open digest when their mode changes between regular and
/// a digest (`list_digest_switch`): called in the change's transaction, before the mode is
/// stored, by `set` and by pepsi-httpd's member page, so neither loses nor repeats a post.
pub use pepsi_list_digest::store::switch;

/// A member's delivery mode, as the operator names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every post as it is sent to the list.
    Regular,
    /// Posts collected in a MIME digest (multipart/digest).
    #[value(alias = "mime_digest")]
    Mime,
    /// Posts collected in a plain-text digest (RFC 1153).
    #[value(alias = "plain_digest")]
    Plain,
}

impl Mode {
    /// The value of `list_member_preference.delivery_mode`.
    pub fn column(self) -> &'static str {
        match self {
            Mode::Regular => "regular",
            Mode::Mime => "mime_digest",
            Mode::Plain => "plain_digest",
        }
    }
}

/// The arguments of `set-mode`.
#[derive(Debug, clap::Args)]
pub struct SetModeArgs {
    /// The list's address
    pub list: String,
    /// The member's address
    pub address: String,
    /// regular (every post as it comes), mime (a MIME digest) or plain (a plain-text
    /// digest, RFC 1153)
    #[arg(value_enum)]
    pub mode: Mode,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

/// What `set-mode` did.
#[derive(Debug, Clone, Serialize)]
pub struct ModeSet {
    pub list: String,
    pub address: String,
    /// The mode before (`list_member_preference.delivery_mode`, `regular` without a row).
    pub from: String,
    pub to: String,
    pub changed: bool,
}

/// Sets the delivery mode of `address` (checked), a member of `list`, to `mode`, with its
/// `member.mode` event and `list.set-mode` audit row in the same transaction; nothing is
/// written when the mode is the member's already. A digest mode needs the list's
/// `digests_enabled`.
pub async fn set(
    pool: &PgPool,
    who: &Who,
    list: &str,
    address: &str,
    mode: Mode,
) -> Result<ModeSet, Failure> {
    let other = |t: String| Failure::Other(anyhow::anyhow!(t));
    let mut tx = pool.begin().await?;
    let Some((list_id, digests)): Option<(i64, bool)> = sqlx::query_as(
        "SELECT list_id, digests_enabled FROM pepsi.mailing_list WHERE address = $1 FOR SHARE",
    )
    .bind(list)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Err(other(format!(
            "there is no list {list} (`pepsi-list lists` shows them)"
        )));
    };
    if mode != Mode::Regular && !digests {
        return Err(other(format!(
            "{list} sends no digests (digests_enabled is off): turn them on with \
             `pepsi-list configure {list} digests_enabled=yes` first"
        )));
    }
    let Some((member_id, from)): Option<(i64, String)> = sqlx::query_as(
        "SELECT m.member_id, COALESCE(p.delivery_mode, 'regular') FROM pepsi.list_member m \
         LEFT JOIN pepsi.list_member_preference p USING (member_id) \
         WHERE m.list_id = $1 AND m.address = $2 AND m.role = 'member' FOR UPDATE OF m",
    )
    .bind(list_id)
    .bind(address)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Err(other(format!(
            "{address} is no member of {list} (`pepsi-list members {list}` shows them)"
        )));
    };
    let to = mode.column().to_owned();
    let changed = from != to;
    if changed {
        switch(&mut tx, member_id, &to).await?;
        sqlx::query(
            "INSERT INTO pepsi.list_member_preference (member_id, delivery_mode) VALUES ($1, $2) \
             ON CONFLICT (member_id) DO UPDATE \
             SET delivery_mode = EXCLUDED.delivery_mode, updated_at = now()",
        )
        .bind(member_id)
        .bind(&to)
        .execute(&mut *tx)
        .await?;
        let detail = json!({"list": list, "from": from, "to": to});
        sqlx::query(
            "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
             VALUES ($1, $2, 'member.mode', $3, $4)",
        )
        .bind(list_id)
        .bind(address)
        .bind(&detail)
        .bind(&who.name)
        .execute(&mut *tx)
        .await?;
        let detail = json!({"list": list, "address": address, "from": from, "to": to});
        pepsi_contract::audit::record(&mut tx, &who.actor, "list.set-mode", None, detail).await?;
    }
    tx.commit().await?;
    Ok(ModeSet {
        list: list.to_owned(),
        address: address.to_owned(),
        from,
        to,
        changed,
    })
}

/// The text of `set-mode`.
pub fn render(done: &ModeSet) -> String {
    if done.changed {
        format!(
            "{}: {} now takes {} (was {})\n",
            done.list,
            done.address,
            shown(&done.to),
            shown(&done.from)
        )
    } else {
        format!(
            "{}: {} takes {} already\n",
            done.list,
            done.address,
            shown(&done.to)
        )
    }
}

/// A stored delivery mode as people read it.
fn shown(mode: &str) -> &str {
    match mode {
        "mime_digest" => "the MIME digest",
        "plain_digest" => "the plain digest",
        "regular" => "every post as it comes",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum as _;

    #[test]
    fn modes_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("regular", Some("regular")),
            ("mime", Some("mime_digest")),
            ("plain", Some("plain_digest")),
            ("mime_digest", Some("mime_digest")),
            ("plain_digest", Some("plain_digest")),
            ("digest", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = Mode::from_str(text, true).ok().map(Mode::column);
            assert_eq!(got, *want, "{text:?}");
        }
    }

    #[test]
    fn what_set_mode_says_table() {
        let done = |from: &str, to: &str| ModeSet {
            list: "team@example.org".into(),
            address: "bob@example.net".into(),
            from: from.into(),
            to: to.into(),
            changed: from != to,
        };
        let cases = [
            (
                done("regular", "mime_digest"),
                "team@example.org: bob@example.net now takes the MIME digest (was every post as it comes)\n",
            ),
            (
                done("plain_digest", "plain_digest"),
                "team@example.org: bob@example.net takes the plain digest already\n",
            ),
        ];
        for (d, want) in cases {
            assert_eq!(render(&d), want);
        }
    }
}
