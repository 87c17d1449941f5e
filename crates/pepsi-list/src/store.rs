//! The SQL of pepsi-list: the list tables of pepsi-0016.sql read and written, every change
//! in one transaction together with its `pepsi.list_event_log` rows (who, as `actor`) and
//! its `pepsi.event_log` row (`pepsi_contract::audit`).
//!
//! Inputs arrive checked (`names`, `options`, `members_csv`); every statement is a constant
//! with bound parameters, or, for a list's options, made of `options::OPTIONS`' column
//! names and placeholders, never of input. Nothing here prints.

use chrono::{DateTime, Utc};
use pepsi_conf::address::Address;
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_contract::audit::{self, Actor};
use pepsi_contract::local::LocalRecipients;
use serde::Serialize;
use serde_json::{Value as Json, json};
use sqlx::{PgConnection, PgPool, Postgres, Row as _, Transaction};

use crate::members_csv::Entry;
use crate::names::{self, Action, Role};
use crate::options::{self, Change, OPTIONS, Value};

/// Who acts: the audit log's actor, and the name `list_event_log.actor` records.
#[derive(Debug, Clone)]
pub struct Who {
    pub actor: Actor,
    /// The person at the keyboard: the user who ran `sudo` when it was sudo (`SUDO_USER`),
    /// else the operating-system user, else the uid.
    pub name: String,
}

impl Who {
    pub fn local(program: &str) -> Who {
        let actor = Actor::local(program);
        let sudo = std::env::var("SUDO_USER").ok().filter(|s| !s.is_empty());
        let name = actor
            .principal
            .clone()
            .or(sudo)
            .or_else(|| actor.os_user.clone())
            .or_else(|| actor.os_uid.map(|u| format!("uid {u}")))
            .unwrap_or_else(|| program.to_owned());
        Who { actor, name }
    }
}

fn invalid(text: impl Into<String>) -> Failure {
    Failure::Invalid(text.into())
}

pub(crate) fn other(text: impl Into<String>) -> Failure {
    Failure::Other(anyhow::anyhow!(text.into()))
}

fn no_list(list: &str) -> Failure {
    other(format!(
        "there is no list {list} (`pepsi-list lists` shows them)"
    ))
}

/// Appends one `pepsi.list_event_log` row.
pub(crate) async fn event(
    conn: &mut PgConnection,
    who: &Who,
    list_id: Option<i64>,
    address: &str,
    event: &str,
    detail: Json,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(list_id)
    .bind(address)
    .bind(event)
    .bind(detail)
    .bind(&who.name)
    .execute(conn)
    .await?;
    Ok(())
}

/// The id of `list` inside `tx`, its row locked against a concurrent delete or change.
pub(crate) async fn lock_list(tx: &mut PgConnection, list: &str) -> Result<i64, Failure> {
    sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list WHERE address = $1 FOR UPDATE")
        .bind(list)
        .fetch_optional(tx)
        .await?
        .ok_or_else(|| no_list(list))
}

pub(crate) async fn list_id(pool: &PgPool, list: &str) -> Result<i64, Failure> {
    sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list WHERE address = $1")
        .bind(list)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| no_list(list))
}

/// A new list as `create` makes it.
#[derive(Debug, Clone, Serialize)]
pub struct NewList {
    pub address: String,
    pub display_name: String,
    pub description: String,
    pub subject_prefix: String,
    pub owners: Vec<String>,
}

/// Creates a list after the checks only the database can answer: its domain is local, and
/// neither it nor one of its command addresses is a mailbox. Returns the list's id.
pub async fn create(
    pool: &PgPool,
    who: &Who,
    local: &LocalRecipients,
    new: &NewList,
) -> Result<i64, Failure> {
    let parsed = Address::parse(&new.address).map_err(|e| invalid(e.to_string()))?;
    if !local.is_local_domain(pool, parsed.domain()).await? {
        return Err(invalid(format!(
            "list address {}: {} is not a local domain of this server (local domains are \
             [pepsi] LOCAL_DOMAINS and those added with `pepsi-settings domain add`)",
            new.address,
            parsed.domain()
        )));
    }
    let mut taken = vec![new.address.clone()];
    taken.extend(names::command_addresses(&parsed));
    let mailboxes: Vec<String> = sqlx::query_scalar(
        "SELECT address FROM pepsi.mailbox_account WHERE address = ANY($1) ORDER BY 1",
    )
    .bind(&taken)
    .fetch_all(pool)
    .await?;
    if mailboxes.contains(&new.address) {
        return Err(invalid(format!(
            "list address {} is a mailbox (pepsi.mailbox_account): a list cannot take a \
             mailbox's address",
            new.address
        )));
    }
    if let Some(m) = mailboxes.first() {
        return Err(invalid(format!(
            "{m} is a mailbox, and list {}'s command address: the list would take its mail; \
             choose another name for the list",
            new.address
        )));
    }
    let mut tx = pool.begin().await?;
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO pepsi.mailing_list (address, display_name, description, subject_prefix) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (address) DO NOTHING RETURNING list_id",
    )
    .bind(&new.address)
    .bind(&new.display_name)
    .bind(&new.description)
    .bind(&new.subject_prefix)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        return Err(other(format!("list {} exists already", new.address)));
    };
    sqlx::query(
        "INSERT INTO pepsi.list_member (list_id, address, role, subscribed_via) \
         SELECT $1, a, 'owner', 'operator' FROM unnest($2::text[]) AS a \
         ON CONFLICT (list_id, address, role) DO NOTHING",
    )
    .bind(id)
    .bind(&new.owners)
    .execute(&mut *tx)
    .await?;
    let detail = json!({
        "list": new.address,
        "display_name": new.display_name,
        "description": new.description,
        "subject_prefix": new.subject_prefix,
        "owners": new.owners,
    });
    event(&mut tx, who, Some(id), "", "list.create", detail.clone()).await?;
    audit::record(&mut tx, &who.actor, "list.create", None, detail).await?;
    tx.commit().await?;
    Ok(id)
}

/// A list as `lists` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ListSummary {
    pub address: String,
    pub display_name: String,
    /// Rows of role `member`.
    pub members: i64,
    pub subscription_policy: String,
    pub member_action: String,
    pub nonmember_action: String,
    pub archive_policy: String,
    pub advertised: bool,
    pub emergency: bool,
}

pub async fn lists(pool: &PgPool) -> Result<Vec<ListSummary>, Failure> {
    let rows = sqlx::query(
        "SELECT l.address, l.display_name, l.subscription_policy, l.member_action, \
                l.nonmember_action, l.archive_policy, l.advertised, l.emergency, \
                (SELECT count(*) FROM pepsi.list_member m \
                  WHERE m.list_id = l.list_id AND m.role = 'member') AS members \
           FROM pepsi.mailing_list l ORDER BY l.address",
    )
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(ListSummary {
            address: r.try_get("address")?,
            display_name: r.try_get("display_name")?,
            members: r.try_get("members")?,
            subscription_policy: r.try_get("subscription_policy")?,
            member_action: r.try_get("member_action")?,
            nonmember_action: r.try_get("nonmember_action")?,
            archive_policy: r.try_get("archive_policy")?,
            advertised: r.try_get("advertised")?,
            emergency: r.try_get("emergency")?,
        });
    }
    Ok(out)
}

/// The options of a list by name, in `OPTIONS`' order; serialized as one JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionValues(pub Vec<(&'static str, Value)>);

impl Serialize for OptionValues {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl OptionValues {
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// `SELECT` list of every option, each as text under its own name.
fn options_select() -> String {
    OPTIONS
        .iter()
        .map(|o| format!("{} AS {}", o.kind.select_sql(o.name), o.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn option_values(row: &sqlx::postgres::PgRow) -> Result<OptionValues, sqlx::Error> {
    let mut out = Vec::with_capacity(OPTIONS.len());
    for o in OPTIONS {
        let stored: Option<String> = row.try_get(o.name)?;
        out.push((o.name, o.kind.read(stored.as_deref())));
    }
    Ok(OptionValues(out))
}

/// Rows of `list_member` by role.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoleCounts {
    pub member: i64,
    pub owner: i64,
    pub moderator: i64,
    pub nonmember: i64,
}

/// Members (role `member`) by `delivery_status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeliveryCounts {
    pub enabled: i64,
    pub by_bounces: i64,
    pub by_user: i64,
    pub by_moderator: i64,
}

/// Requests in `list_pending`, by what they wait for.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PendingCounts {
    /// The person's emailed confirmation.
    pub confirm: i64,
    /// A moderator's approval.
    pub approve: i64,
}

/// A list as `show` shows it: every column, and what it holds.
#[derive(Debug, Clone, Serialize)]
pub struct ListShown {
    pub address: String,
    pub list_id: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub options: OptionValues,
    pub roles: RoleCounts,
    pub delivery: DeliveryCounts,
    pub pending: PendingCounts,
    /// Posts in `list_held_message`.
    pub held: i64,
    /// Its header filters, in position order.
    pub filters: Vec<Filter>,
}

pub async fn show(pool: &PgPool, list: &str) -> Result<ListShown, Failure> {
    let sql = format!(
        "SELECT list_id, address, created_at, updated_at, {} FROM pepsi.mailing_list \
         WHERE address = $1",
        options_select()
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(list)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| no_list(list))?;
    let list_id: i64 = row.try_get("list_id")?;
    let mut roles = RoleCounts::default();
    let mut delivery = DeliveryCounts::default();
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT role, delivery_status, count(*) FROM pepsi.list_member WHERE list_id = $1 \
         GROUP BY role, delivery_status",
    )
    .bind(list_id)
    .fetch_all(pool)
    .await?;
    for (role, status, n) in counts {
        match role.as_str() {
            "member" => roles.member += n,
            "owner" => roles.owner += n,
            "moderator" => roles.moderator += n,
            _ => roles.nonmember += n,
        }
        if role == "member" {
            match status.as_str() {
                "enabled" => delivery.enabled += n,
                "by_bounces" => delivery.by_bounces += n,
                "by_user" => delivery.by_user += n,
                _ => delivery.by_moderator += n,
            }
        }
    }
    let (confirm, approve): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE waiting_for = 'confirm'), \
                count(*) FILTER (WHERE waiting_for = 'approve') \
           FROM pepsi.list_pending WHERE list_id = $1",
    )
    .bind(list_id)
    .fetch_one(pool)
    .await?;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.list_held_message WHERE list_id = $1")
            .bind(list_id)
            .fetch_one(pool)
            .await?;
    let filters = of_list(&mut *pool.acquire().await?, list_id).await?;
    Ok(ListShown {
        address: row.try_get("address")?,
        list_id,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        options: option_values(&row)?,
        roles,
        delivery,
        pending: PendingCounts { confirm, approve },
        held,
        filters,
    })
}

/// One option `configure` changed.
#[derive(Debug, Clone, Serialize)]
pub struct Changed {
    pub option: &'static str,
    pub from: Value,
    pub to: Value,
}

/// Applies `changes` (checked by `options::parse_assignments`) to `list` in one UPDATE,
/// after the rule between the reply options (`options::settle`) on the values it locked.
pub async fn configure(
    pool: &PgPool,
    who: &Who,
    list: &str,
    changes: Vec<Change>,
) -> Result<Vec<Changed>, Failure> {
    let mut tx = pool.begin().await?;
    let sql = format!(
        "SELECT list_id, {} FROM pepsi.mailing_list WHERE address = $1 FOR UPDATE",
        options_select()
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(list)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| no_list(list))?;
    let list_id: i64 = row.try_get("list_id")?;
    let before = option_values(&row)?;
    let goes_to = match before.get("reply_goes_to") {
        Some(Value::Text(t)) => t.clone(),
        _ => String::new(),
    };
    let reply_to = match before.get("reply_to_address") {
        Some(Value::Text(t)) => Some(t.clone()),
        _ => None,
    };
    let changes = options::settle(changes, &goes_to, reply_to.as_deref()).map_err(invalid)?;
    let sets: Vec<String> = changes
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} = {}", c.option.name, c.option.kind.set_sql(i + 2)))
        .collect();
    let sql = format!(
        "UPDATE pepsi.mailing_list SET {}, updated_at = now() WHERE list_id = $1",
        sets.join(", ")
    );
    let mut update = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(list_id);
    for c in &changes {
        update = update.bind(c.value.sql_text());
    }
    update.execute(&mut *tx).await?;
    let changed: Vec<Changed> = changes
        .into_iter()
        .map(|c| Changed {
            option: c.option.name,
            from: before.get(c.option.name).cloned().unwrap_or(Value::None),
            to: c.value,
        })
        .collect();
    let detail = json!({"list": list, "changes": changed});
    event(
        &mut tx,
        who,
        Some(list_id),
        "",
        "list.configure",
        detail.clone(),
    )
    .await?;
    audit::record(&mut tx, &who.actor, "list.configure", None, detail).await?;
    tx.commit().await?;
    Ok(changed)
}

/// Deletes `list` and everything it holds (ON DELETE CASCADE); returns its rows by role.
pub async fn delete(pool: &PgPool, who: &Who, list: &str) -> Result<RoleCounts, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = lock_list(&mut tx, list).await?;
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT role, count(*) FROM pepsi.list_member WHERE list_id = $1 GROUP BY role",
    )
    .bind(list_id)
    .fetch_all(&mut *tx)
    .await?;
    let mut roles = RoleCounts::default();
    for (role, n) in counts {
        match role.as_str() {
            "member" => roles.member = n,
            "owner" => roles.owner = n,
            "moderator" => roles.moderator = n,
            _ => roles.nonmember = n,
        }
    }
    let detail = json!({"list": list, "roles": roles});
    // Written before the DELETE, whose ON DELETE SET NULL then clears the row's list_id:
    // the list's address stays in the detail.
    event(
        &mut tx,
        who,
        Some(list_id),
        "",
        "list.delete",
        detail.clone(),
    )
    .await?;
    audit::record(&mut tx, &who.actor, "list.delete", None, detail).await?;
    sqlx::query("DELETE FROM pepsi.mailing_list WHERE list_id = $1")
        .bind(list_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(roles)
}

/// A row of `list_member` as `members` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Member {
    pub address: String,
    pub display_name: String,
    pub role: String,
    pub delivery_status: String,
    /// The sender's own posting rule; `null`: the list's.
    pub moderation_action: Option<String>,
    pub subscribed_via: String,
    pub created_at: DateTime<Utc>,
}

/// The rows of `list` (of `role`, or every role), owners first, then moderators, members
/// and nonmembers, each by address.
pub async fn members(
    pool: &PgPool,
    list: &str,
    role: Option<Role>,
) -> Result<Vec<Member>, Failure> {
    let id = list_id(pool, list).await?;
    let rows = sqlx::query(
        "SELECT address, display_name, role, delivery_status, moderation_action, \
                subscribed_via, created_at \
           FROM pepsi.list_member WHERE list_id = $1 AND ($2::text IS NULL OR role = $2) \
          ORDER BY array_position(ARRAY['owner', 'moderator', 'member', 'nonmember'], role), \
                   address",
    )
    .bind(id)
    .bind(role.map(Role::as_str))
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(Member {
            address: r.try_get("address")?,
            display_name: r.try_get("display_name")?,
            role: r.try_get("role")?,
            delivery_status: r.try_get("delivery_status")?,
            moderation_action: r.try_get("moderation_action")?,
            subscribed_via: r.try_get("subscribed_via")?,
            created_at: r.try_get("created_at")?,
        });
    }
    Ok(out)
}

/// Inserts the `addresses` (with their display names) as rows of `role`, and a
/// `member.add` event for each row made; returns the addresses added (those already of the
/// role are left as they are).
#[allow(clippy::too_many_arguments)]
async fn insert_members(
    conn: &mut PgConnection,
    who: &Who,
    list_id: i64,
    addresses: &[String],
    display_names: &[String],
    role: Role,
    action: Option<Action>,
    via: &str,
    detail: &Json,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH added AS ( \
             INSERT INTO pepsi.list_member \
                    (list_id, address, display_name, role, moderation_action, subscribed_via) \
             SELECT $1, a, n, $4, $5, $6 FROM unnest($2::text[], $3::text[]) AS t(a, n) \
             ON CONFLICT (list_id, address, role) DO NOTHING \
             RETURNING address) \
         INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         SELECT $1, address, 'member.add', $7, $8 FROM added \
         RETURNING address",
    )
    .bind(list_id)
    .bind(addresses)
    .bind(display_names)
    .bind(role.as_str())
    .bind(action.map(Action::as_str))
    .bind(via)
    .bind(detail)
    .bind(&who.name)
    .fetch_all(conn)
    .await
}

/// What `add` did: the addresses added and those that had the role already.
#[derive(Debug, Clone, Serialize)]
pub struct Added {
    pub list: String,
    pub role: Role,
    pub added: Vec<String>,
    pub already: Vec<String>,
}

/// Adds `addresses` (checked, each once) to `list` as `role`; no confirmation is asked.
pub async fn add(
    pool: &PgPool,
    who: &Who,
    list: &str,
    addresses: &[String],
    role: Role,
    display_name: &str,
    action: Option<Action>,
) -> Result<Added, Failure> {
    add_via(
        pool,
        who,
        list,
        addresses,
        role,
        display_name,
        action,
        "operator",
    )
    .await
}

/// [`add`], the rows' `subscribed_via` being `via` (`operator`, or `api` for pepsi-httpd).
#[allow(clippy::too_many_arguments)]
pub async fn add_via(
    pool: &PgPool,
    who: &Who,
    list: &str,
    addresses: &[String],
    role: Role,
    display_name: &str,
    action: Option<Action>,
    via: &str,
) -> Result<Added, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = lock_list(&mut tx, list).await?;
    let names = vec![display_name.to_owned(); addresses.len()];
    let detail = json!({
        "list": list,
        "role": role,
        "via": via,
        "action": action,
    });
    let added = insert_members(
        &mut tx, who, list_id, addresses, &names, role, action, via, &detail,
    )
    .await?;
    let already: Vec<String> = addresses
        .iter()
        .filter(|a| !added.contains(a))
        .cloned()
        .collect();
    let added: Vec<String> = addresses
        .iter()
        .filter(|a| added.contains(a))
        .cloned()
        .collect();
    if !added.is_empty() {
        let detail = json!({"list": list, "role": role, "added": added, "action": action});
        audit::record(&mut tx, &who.actor, "list.add", None, detail).await?;
    }
    tx.commit().await?;
    Ok(Added {
        list: list.to_owned(),
        role,
        added,
        already,
    })
}

/// What `remove` did.
#[derive(Debug, Clone, Serialize)]
pub struct Removed {
    pub list: String,
    pub role: Role,
    pub removed: Vec<String>,
    /// Addresses that were not of the role on the list.
    pub not_found: Vec<String>,
}

/// Removes the rows of `role` of `addresses` (checked, each once) from `list`, with what
/// hangs on them (preferences, unsubscribe tokens).
pub async fn remove(
    pool: &PgPool,
    who: &Who,
    list: &str,
    addresses: &[String],
    role: Role,
) -> Result<Removed, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = lock_list(&mut tx, list).await?;
    let detail = json!({"list": list, "role": role});
    let gone: Vec<String> = sqlx::query_scalar(
        "WITH gone AS ( \
             DELETE FROM pepsi.list_member \
              WHERE list_id = $1 AND role = $3 AND address = ANY($2) RETURNING address) \
         INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         SELECT $1, address, 'member.remove', $4, $5 FROM gone \
         RETURNING address",
    )
    .bind(list_id)
    .bind(addresses)
    .bind(role.as_str())
    .bind(&detail)
    .bind(&who.name)
    .fetch_all(&mut *tx)
    .await?;
    let (removed, not_found): (Vec<String>, Vec<String>) =
        addresses.iter().cloned().partition(|a| gone.contains(a));
    if !removed.is_empty() {
        let detail = json!({"list": list, "role": role, "removed": removed});
        audit::record(&mut tx, &who.actor, "list.remove", None, detail).await?;
    }
    tx.commit().await?;
    Ok(Removed {
        list: list.to_owned(),
        role,
        removed,
        not_found,
    })
}

/// An import in progress: one transaction over every chunk, committed by `finish` (or
/// rolled back for a dry run), so a file is imported whole or not at all.
pub struct Import {
    tx: Transaction<'static, Postgres>,
    list_id: i64,
    list: String,
    detail: Json,
}

impl Import {
    pub async fn begin(pool: &PgPool, list: &str, file: &str) -> Result<Import, Failure> {
        let mut tx = pool.begin().await?;
        let list_id = lock_list(&mut tx, list).await?;
        Ok(Import {
            tx,
            list_id,
            list: list.to_owned(),
            detail: json!({"list": list, "role": "member", "via": "import", "file": file}),
        })
    }

    /// Adds one chunk of members; returns how many were added (the rest were members).
    pub async fn chunk(&mut self, who: &Who, entries: &[Entry]) -> Result<usize, Failure> {
        let addresses: Vec<String> = entries.iter().map(|e| e.address.clone()).collect();
        let names: Vec<String> = entries.iter().map(|e| e.display_name.clone()).collect();
        let added = insert_members(
            &mut self.tx,
            who,
            self.list_id,
            &addresses,
            &names,
            Role::Member,
            None,
            "import",
            &self.detail,
        )
        .await?;
        Ok(added.len())
    }

    /// Commits the import with its audit row (`summary` its detail) when it added anyone,
    /// or rolls it back.
    pub async fn finish(
        mut self,
        who: &Who,
        summary: Json,
        added: usize,
        dry_run: bool,
    ) -> Result<(), Failure> {
        if dry_run || added == 0 {
            self.tx.rollback().await?;
            return Ok(());
        }
        let mut detail = summary;
        if let Json::Object(m) = &mut detail {
            m.insert("list".into(), json!(self.list));
        }
        audit::record(&mut self.tx, &who.actor, "list.import", None, detail).await?;
        self.tx.commit().await?;
        Ok(())
    }
}

/// The addresses and display names of `list`'s rows of `role`, by address.
pub async fn export(
    pool: &PgPool,
    list: &str,
    role: Role,
) -> Result<Vec<(String, String)>, Failure> {
    let id = list_id(pool, list).await?;
    Ok(sqlx::query_as(
        "SELECT address, display_name FROM pepsi.list_member WHERE list_id = $1 AND role = $2 \
         ORDER BY address",
    )
    .bind(id)
    .bind(role.as_str())
    .fetch_all(pool)
    .await?)
}

/// A row of `list_member` `forget` removed.
#[derive(Debug, Clone, Serialize)]
pub struct Membership {
    pub list: String,
    pub role: String,
}

/// What `forget` removed, table by table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Forgotten {
    pub address: String,
    /// `list_member` rows, with their preferences and unsubscribe tokens.
    pub memberships: Vec<Membership>,
    /// `list_pending`: requests waiting for a confirmation or a moderator.
    pub pending: u64,
    /// `list_member_link`: emailed links to member pages.
    pub member_links: u64,
    /// `list_bounce_score`: bounce scores.
    pub bounce_scores: u64,
    /// `list_bounce_event`: the bounces received for the address.
    pub bounce_events: u64,
    /// `list_confirm_rate` rows keyed by the address.
    pub confirm_rates: u64,
    /// `list_autoresponse`: the count of automatic responses sent to it.
    pub autoresponses: u64,
}

impl Forgotten {
    pub fn is_empty(&self) -> bool {
        self.memberships.is_empty()
            && self.pending
                + self.member_links
                + self.bounce_scores
                + self.bounce_events
                + self.confirm_rates
                + self.autoresponses
                == 0
    }
}

/// Removes `address` (checked) from every list and every list table keyed by it.
pub async fn forget(pool: &PgPool, who: &Who, address: &str) -> Result<Forgotten, Failure> {
    let mut tx = pool.begin().await?;
    let gone: Vec<(String, String)> = sqlx::query_as(
        "WITH gone AS (DELETE FROM pepsi.list_member WHERE address = $1 RETURNING list_id, role) \
         SELECT l.address, g.role FROM gone g JOIN pepsi.mailing_list l USING (list_id) \
          ORDER BY 1, 2",
    )
    .bind(address)
    .fetch_all(&mut *tx)
    .await?;
    let memberships = gone
        .into_iter()
        .map(|(list, role)| Membership { list, role })
        .collect();
    // Each a constant statement: table names are not parameters.
    let statements = [
        "DELETE FROM pepsi.list_pending WHERE address = $1",
        "DELETE FROM pepsi.list_member_link WHERE address = $1",
        "DELETE FROM pepsi.list_bounce_score WHERE address = $1",
        "DELETE FROM pepsi.list_bounce_event WHERE address = $1",
        "DELETE FROM pepsi.list_confirm_rate WHERE key_kind = 'address' AND key = $1",
        "DELETE FROM pepsi.list_autoresponse WHERE address = $1",
    ];
    let mut counts = [0u64; 6];
    for (sql, n) in statements.iter().zip(counts.iter_mut()) {
        *n = sqlx::query(*sql)
            .bind(address)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    let [
        pending,
        member_links,
        bounce_scores,
        bounce_events,
        confirm_rates,
        autoresponses,
    ] = counts;
    let out = Forgotten {
        address: address.to_owned(),
        memberships,
        pending,
        member_links,
        bounce_scores,
        bounce_events,
        confirm_rates,
        autoresponses,
    };
    if !out.is_empty() {
        let detail = json!({"removed": out});
        event(&mut tx, who, None, address, "member.forget", detail.clone()).await?;
        audit::record(&mut tx, &who.actor, "list.forget", None, detail).await?;
    }
    tx.commit().await?;
    Ok(out)
}

/// A post in `list_held_message`, as `held` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HeldPost {
    /// `held_id`: what `approve`, `reject` and `discard` take.
    pub id: i64,
    /// The post's From address (what the posting policy judged).
    pub sender: String,
    /// The envelope sender: where a rejection's DSN goes.
    pub mail_from: String,
    pub subject: String,
    pub message_id: String,
    /// Why it was held.
    pub reason: String,
    pub held_at: DateTime<Utc>,
    /// When it expires unless a moderator decides.
    pub expires_at: DateTime<Utc>,
    /// Bytes: the header block, its blank line and the body, as the stage measured it.
    pub size: i64,
}

/// The posts `list` holds, oldest first.
pub async fn held(pool: &PgPool, list: &str) -> Result<Vec<HeldPost>, Failure> {
    let id = list_id(pool, list).await?;
    let rows = sqlx::query(
        "SELECT held_id, sender, mail_from, subject, message_id, reason, held_at, expires_at, \
                octet_length(headers) + 2 + octet_length(body) AS size \
           FROM pepsi.list_held_message WHERE list_id = $1 ORDER BY held_at, held_id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(HeldPost {
            id: r.try_get("held_id")?,
            sender: r.try_get("sender")?,
            mail_from: r.try_get("mail_from")?,
            subject: r.try_get("subject")?,
            message_id: r.try_get("message_id")?,
            reason: r.try_get("reason")?,
            held_at: r.try_get("held_at")?,
            expires_at: r.try_get("expires_at")?,
            size: r.try_get::<i32, _>("size")?.into(),
        });
    }
    Ok(out)
}

/// What a moderator decided about held posts, with what it needs.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Back to the list stage `stage`, approved (`state.list_approval`).
    Approve { stage: String },
    /// A DSN to the sender from `bounce_stage`, as list stage `stage` refuses (5.7.1).
    Reject {
        stage: String,
        bounce_stage: String,
        reason: String,
    },
    /// Dropped.
    Discard,
}

impl Verdict {
    /// `list_moderation_decision.action`.
    pub fn action(&self) -> &'static str {
        match self {
            Verdict::Approve { .. } => "approve",
            Verdict::Reject { .. } => "reject",
            Verdict::Discard => "discard",
        }
    }

    fn reason(&self) -> &str {
        match self {
            Verdict::Reject { reason, .. } => reason,
            _ => "",
        }
    }
}

/// One held post decided.
#[derive(Debug, Clone, Serialize)]
pub struct DecidedPost {
    pub id: i64,
    pub sender: String,
    pub subject: String,
    /// The queue row made: the approved post at the list stage, or the rejection at the
    /// bounce stage; `null` for a discarded post.
    pub queue_id: Option<i64>,
}

/// What `approve`, `reject` or `discard` did.
#[derive(Debug, Clone, Serialize)]
pub struct Decided {
    pub list: String,
    pub action: &'static str,
    /// Where the queue rows were made (the list stage, or the bounce stage).
    pub stage: Option<String>,
    pub reason: String,
    pub posts: Vec<DecidedPost>,
}

/// A held post queued again as held, at the list stage with `state.list_approval`, at most
/// once (procedures.sql: the caller chooses neither the message nor the state).
const APPROVE: &str = "SELECT pepsi.list_held_approve($1, $2, $3)";

/// A held post returned from the bounce stage with a 5.7.1 `state.bounce`, at most once.
const REJECT: &str = "SELECT pepsi.list_held_reject($1, $2, $3, $4)";

/// Decides the held posts `ids` (each once) of `list` in one transaction: each is sent on
/// as `verdict` says, its row deleted, a `list_moderation_decision` row and a
/// `post.<action>` event written, and one `list.<action>` audit row for the command. An id
/// that is no held post of the list refuses the whole command. After the commit, the
/// dispatcher is woken for the rows made.
pub async fn decide(
    pool: &PgPool,
    who: &Who,
    list: &str,
    ids: &[i64],
    verdict: &Verdict,
) -> Result<Decided, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = lock_list(&mut tx, list).await?;
    // Not FOR UPDATE: pepsi-httpd's role may not change a held row, only delete it. The
    // list's row, locked above, keeps two decisions on one list apart.
    let rows = sqlx::query(
        "SELECT held_id, sender, subject, message_id \
           FROM pepsi.list_held_message WHERE list_id = $1 AND held_id = ANY($2) \
          ORDER BY held_id",
    )
    .bind(list_id)
    .bind(ids)
    .fetch_all(&mut *tx)
    .await?;
    let found: Vec<i64> = rows
        .iter()
        .map(|r| r.try_get("held_id"))
        .collect::<Result<_, _>>()?;
    let missing: Vec<String> = ids
        .iter()
        .filter(|i| !found.contains(i))
        .map(i64::to_string)
        .collect();
    if !missing.is_empty() {
        return Err(other(format!(
            "no held post {} on {list} (decided already, expired, or never held; \
             `pepsi-list held {list}` shows them): nothing done",
            missing.join(", ")
        )));
    }
    let action = verdict.action();
    let mut posts = Vec::with_capacity(rows.len());
    for r in rows {
        let id: i64 = r.try_get("held_id")?;
        let sender: String = r.try_get("sender")?;
        let subject: String = r.try_get("subject")?;
        let message_id: String = r.try_get("message_id")?;
        let queued: Option<(Option<i64>, &str)> = match verdict {
            Verdict::Approve { stage } => Some((
                sqlx::query_scalar(APPROVE)
                    .bind(id)
                    .bind(stage)
                    .bind(&who.name)
                    .fetch_one(&mut *tx)
                    .await?,
                "list-approve",
            )),
            Verdict::Reject {
                stage,
                bounce_stage,
                reason,
            } => Some((
                sqlx::query_scalar(REJECT)
                    .bind(id)
                    .bind(bounce_stage)
                    .bind(stage)
                    .bind(reason)
                    .fetch_one(&mut *tx)
                    .await?,
                "list-reject",
            )),
            Verdict::Discard => None,
        };
        let queue_id = match queued {
            Some((Some(queue_id), _)) => Some(queue_id),
            Some((None, token)) => {
                return Err(other(format!(
                    "held post {id} of {list} was sent on before (token {token}:{id} is used): \
                     nothing done"
                )));
            }
            None => None,
        };
        sqlx::query("DELETE FROM pepsi.list_held_message WHERE held_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO pepsi.list_moderation_decision \
             (list_id, subject_kind, sender, message_id, action, moderator, reason) \
             VALUES ($1, 'post', $2, $3, $4, $5, $6)",
        )
        .bind(list_id)
        .bind(&sender)
        .bind(&message_id)
        .bind(action)
        .bind(&who.name)
        .bind(verdict.reason())
        .execute(&mut *tx)
        .await?;
        let detail = json!({
            "list": list,
            "held_id": id,
            "subject": subject,
            "message_id": message_id,
            "reason": verdict.reason(),
            "queue_id": queue_id,
        });
        event(
            &mut tx,
            who,
            Some(list_id),
            &sender,
            &format!("post.{action}"),
            detail,
        )
        .await?;
        posts.push(DecidedPost {
            id,
            sender,
            subject,
            queue_id,
        });
    }
    let stage = match verdict {
        Verdict::Approve { stage } => Some(stage.clone()),
        Verdict::Reject { bounce_stage, .. } => Some(bounce_stage.clone()),
        Verdict::Discard => None,
    };
    let detail = json!({
        "list": list,
        "held": ids,
        "reason": verdict.reason(),
        "stage": stage,
        "queue_ids": posts.iter().filter_map(|p| p.queue_id).collect::<Vec<_>>(),
    });
    audit::record(&mut tx, &who.actor, &format!("list.{action}"), None, detail).await?;
    tx.commit().await?;
    if posts.iter().any(|p| p.queue_id.is_some()) {
        // procedures.sql's NOTIFY contract: a tool that injects wakes the dispatcher once
        // its rows have committed. The rows are there either way; a lost wake-up only waits
        // for the dispatcher's next claim.
        if let Err(e) = pepsi_contract::db::notify_workqueue(pool).await {
            tracing::warn!(error = %e, "could not wake the dispatcher");
        }
    }
    Ok(Decided {
        list: list.to_owned(),
        action,
        stage,
        reason: verdict.reason().to_owned(),
        posts,
    })
}

/// Whether PostgreSQL compiles `pattern` as the regular expression the list stage matches
/// senders with (`~*`); a pattern it refuses is input that is not valid.
pub async fn check_regex(pool: &PgPool, pattern: &str) -> Result<(), Failure> {
    match regex_error(pool, pattern).await? {
        None => Ok(()),
        Some(e) => Err(invalid(format!(
            "ban pattern {pattern:?} is not a valid regular expression: {e}"
        ))),
    }
}

/// PostgreSQL's complaint about `pattern` as a regular expression matched with `~*`, or
/// None when it compiles.
pub async fn regex_error(pool: &PgPool, pattern: &str) -> Result<Option<String>, Failure> {
    match sqlx::query_scalar::<_, bool>("SELECT '' ~* $1")
        .bind(pattern)
        .fetch_one(pool)
        .await
    {
        Ok(_) => Ok(None),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("2201B") => {
            Ok(Some(e.message().to_owned()))
        }
        Err(e) => Err(e.into()),
    }
}

/// A row of `list_ban`, as `bans` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Ban {
    /// The list it bans from; `null`: every list.
    pub list: Option<String>,
    pub pattern: String,
    pub reason: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

/// What `ban` or `unban` did.
#[derive(Debug, Clone, Serialize)]
pub struct BanChange {
    /// `null`: every list.
    pub list: Option<String>,
    pub pattern: String,
    /// Whether a row was added (`ban`) or removed (`unban`); false: it was there already,
    /// or was not.
    pub changed: bool,
}

/// Bans `pattern` (checked) from `list`, or from every list.
pub async fn ban(
    pool: &PgPool,
    who: &Who,
    list: Option<&str>,
    pattern: &str,
    reason: &str,
) -> Result<BanChange, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = match list {
        Some(l) => Some(lock_list(&mut tx, l).await?),
        None => None,
    };
    let added: Option<i64> = sqlx::query_scalar(
        "INSERT INTO pepsi.list_ban (list_id, pattern, reason, created_by) \
         VALUES ($1, $2, $3, $4) ON CONFLICT ((COALESCE(list_id, 0)), pattern) DO NOTHING \
         RETURNING ban_id",
    )
    .bind(list_id)
    .bind(pattern)
    .bind(reason)
    .bind(&who.name)
    .fetch_optional(&mut *tx)
    .await?;
    if added.is_some() {
        let detail = json!({"list": list, "pattern": pattern, "reason": reason});
        event(&mut tx, who, list_id, pattern, "ban.add", detail.clone()).await?;
        audit::record(&mut tx, &who.actor, "list.ban", None, detail).await?;
    }
    tx.commit().await?;
    Ok(BanChange {
        list: list.map(str::to_owned),
        pattern: pattern.to_owned(),
        changed: added.is_some(),
    })
}

/// Lifts the ban of `pattern` (as stored) from `list`, or from every list.
pub async fn unban(
    pool: &PgPool,
    who: &Who,
    list: Option<&str>,
    pattern: &str,
) -> Result<BanChange, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = match list {
        Some(l) => Some(lock_list(&mut tx, l).await?),
        None => None,
    };
    let gone = sqlx::query(
        "DELETE FROM pepsi.list_ban WHERE list_id IS NOT DISTINCT FROM $1 AND pattern = $2",
    )
    .bind(list_id)
    .bind(pattern)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if gone > 0 {
        let detail = json!({"list": list, "pattern": pattern});
        event(&mut tx, who, list_id, pattern, "ban.remove", detail.clone()).await?;
        audit::record(&mut tx, &who.actor, "list.unban", None, detail).await?;
    }
    tx.commit().await?;
    Ok(BanChange {
        list: list.map(str::to_owned),
        pattern: pattern.to_owned(),
        changed: gone > 0,
    })
}

/// The bans that apply to `list` (its own, then those of every list), or with `None` only
/// those of every list.
pub async fn bans(pool: &PgPool, list: Option<&str>) -> Result<Vec<Ban>, Failure> {
    let id = match list {
        Some(l) => Some(list_id(pool, l).await?),
        None => None,
    };
    let rows = sqlx::query(
        "SELECT l.address, b.pattern, b.reason, b.created_by, b.created_at \
           FROM pepsi.list_ban b LEFT JOIN pepsi.mailing_list l USING (list_id) \
          WHERE b.list_id IS NULL OR b.list_id = $1 \
          ORDER BY b.list_id NULLS LAST, b.pattern",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(Ban {
            list: r.try_get("address")?,
            pattern: r.try_get("pattern")?,
            reason: r.try_get("reason")?,
            created_by: r.try_get("created_by")?,
            created_at: r.try_get("created_at")?,
        });
    }
    Ok(out)
}

/// A row of `list_header_filter`, as `pepsi-list filters` and `show` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Filter {
    pub position: i32,
    pub header: String,
    pub pattern: String,
    pub action: String,
}

/// The filters of the list `list_id`, in position order.
pub async fn of_list(conn: &mut PgConnection, list_id: i64) -> Result<Vec<Filter>, sqlx::Error> {
    let rows: Vec<(i32, String, String, String)> = sqlx::query_as(
        "SELECT position, header, pattern, action FROM pepsi.list_header_filter \
          WHERE list_id = $1 ORDER BY position",
    )
    .bind(list_id)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(position, header, pattern, action)| Filter {
            position,
            header,
            pattern,
            action,
        })
        .collect())
}
