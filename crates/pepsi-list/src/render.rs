//! What pepsi-list prints for people: tables and summaries of what `store` returns (whose
//! serde shapes are `--json`'s), and the `--json` document of `import`. Pure functions,
//! no I/O.

use std::fmt::Write as _;

use pepsi_admin::queue::json::ts;
use pepsi_conf::text::{clip, table};
use serde::Serialize;

use crate::members_csv::Invalid;
use crate::store::{
    Added, Ban, BanChange, Changed, Decided, Forgotten, HeldPost, ListShown, ListSummary, Member,
    Removed, RoleCounts,
};

pub fn created(list: &str, owners: &[String]) -> String {
    if owners.is_empty() {
        format!(
            "created list {list} without an owner (add one: pepsi-list add {list} ADDRESS --role owner)\n"
        )
    } else {
        format!("created list {list}, owners {}\n", owners.join(", "))
    }
}

pub fn lists(rows: &[ListSummary]) -> String {
    if rows.is_empty() {
        return "no lists\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|l| {
            let mut flags = Vec::new();
            if !l.advertised {
                flags.push("unadvertised");
            }
            if l.emergency {
                flags.push("emergency");
            }
            vec![
                l.address.clone(),
                l.members.to_string(),
                l.subscription_policy.clone(),
                l.member_action.clone(),
                l.nonmember_action.clone(),
                l.archive_policy.clone(),
                flags.join(","),
                clip(&l.display_name, 40),
            ]
        })
        .collect();
    table(
        &[
            "ADDRESS",
            "MEMBERS",
            "SUBSCRIPTION",
            "MEMBER-POSTS",
            "NONMEMBER-POSTS",
            "ARCHIVE",
            "FLAGS",
            "NAME",
        ],
        &[false, true, false, false, false, false, false, false],
        &cells,
    )
}

pub fn shown(s: &ListShown) -> String {
    let mut out = format!(
        "{} (list {}, created {}, updated {})\n",
        s.address,
        s.list_id,
        ts(s.created_at),
        ts(s.updated_at)
    );
    let width = s.options.0.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, value) in &s.options.0 {
        let shown = value.display();
        let mut lines = shown.lines();
        let _ = writeln!(out, "  {name:width$}  {}", lines.next().unwrap_or(""));
        for more in lines {
            let _ = writeln!(out, "  {:width$}  {more}", "");
        }
    }
    let d = &s.delivery;
    let r = &s.roles;
    let _ = writeln!(
        out,
        "members: {} (delivery enabled {}, disabled by bounces {}, by themselves {}, by a moderator {})",
        r.member, d.enabled, d.by_bounces, d.by_user, d.by_moderator
    );
    let _ = writeln!(
        out,
        "owners: {}, moderators: {}, nonmember rules: {}",
        r.owner, r.moderator, r.nonmember
    );
    let _ = writeln!(
        out,
        "pending: {} waiting for a confirmation, {} for a moderator; held posts: {}",
        s.pending.confirm, s.pending.approve, s.held
    );
    if s.filters.is_empty() {
        out.push_str("header filters: none\n");
    } else {
        out.push_str("header filters:\n");
        for f in &s.filters {
            let _ = writeln!(
                out,
                "  {:>7}  {} ~ {:?}: {}",
                f.position, f.header, f.pattern, f.action
            );
        }
    }
    out
}

pub fn configured(list: &str, changed: &[Changed]) -> String {
    let mut out = String::new();
    for c in changed {
        let _ = writeln!(
            out,
            "{list}: {} = {} (was {})",
            c.option,
            clip(&c.to.display(), 80),
            clip(&c.from.display(), 80)
        );
    }
    out
}

pub fn deleted(list: &str, r: &RoleCounts) -> String {
    format!(
        "deleted list {list} with {} members, {} owners, {} moderators and {} nonmember rules\n",
        r.member, r.owner, r.moderator, r.nonmember
    )
}

pub fn members(list: &str, rows: &[Member]) -> String {
    if rows.is_empty() {
        return format!("{list} has no such rows\n");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|m| {
            vec![
                m.address.clone(),
                m.role.clone(),
                m.delivery_status.clone(),
                m.moderation_action.clone().unwrap_or_else(|| "-".into()),
                m.subscribed_via.clone(),
                ts(m.created_at),
                clip(&m.display_name, 40),
            ]
        })
        .collect();
    table(
        &[
            "ADDRESS", "ROLE", "DELIVERY", "ACTION", "VIA", "SINCE", "NAME",
        ],
        &[false; 7],
        &cells,
    )
}

pub fn added(a: &Added) -> String {
    let mut out = String::new();
    for address in &a.added {
        let _ = writeln!(
            out,
            "added {address} to {} as {}",
            a.list,
            a.role.with_article()
        );
    }
    for address in &a.already {
        let _ = writeln!(
            out,
            "{address} is {} of {} already: unchanged",
            a.role.with_article(),
            a.list
        );
    }
    out
}

pub fn removed(r: &Removed) -> String {
    let mut out = String::new();
    for address in &r.removed {
        let _ = writeln!(
            out,
            "removed {address} from {} ({})",
            r.list,
            r.role.as_str()
        );
    }
    for address in &r.not_found {
        let _ = writeln!(
            out,
            "{address} is not {} of {}: nothing removed",
            r.role.with_article(),
            r.list
        );
    }
    out
}

/// What `import` did (or, under --dry-run, would do).
#[derive(Debug, Clone, Serialize)]
pub struct Imported {
    pub list: String,
    pub file: String,
    pub dry_run: bool,
    /// Rows read, the header not counted.
    pub rows: u64,
    pub added: u64,
    pub already_members: u64,
    /// Lines that repeat an address of an earlier line.
    pub duplicates: Vec<u64>,
    pub invalid: Vec<Invalid>,
}

pub fn imported(i: &Imported) -> String {
    let mut out = format!(
        "{}: {} rows read from {}: {} {}, {} already members, {} repeated, {} invalid\n",
        i.list,
        i.rows,
        i.file,
        i.added,
        if i.dry_run { "would be added" } else { "added" },
        i.already_members,
        i.duplicates.len(),
        i.invalid.len()
    );
    if !i.duplicates.is_empty() {
        let lines: Vec<String> = i.duplicates.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "  repeated (an address of an earlier line), lines {}",
            lines.join(", ")
        );
    }
    for bad in &i.invalid {
        let _ = writeln!(
            out,
            "  line {}: {:?} not imported: {}",
            bad.line,
            clip(&bad.text, 80),
            bad.reason
        );
    }
    if i.dry_run {
        out.push_str("dry run: nothing was stored\n");
    }
    out
}

pub fn forgotten(f: &Forgotten) -> String {
    if f.is_empty() {
        return format!(
            "{} is on no list and in no list table: nothing removed\n",
            f.address
        );
    }
    let mut out = format!("removed {} from every list:\n", f.address);
    for m in &f.memberships {
        let _ = writeln!(out, "  {} ({})", m.list, m.role);
    }
    for (n, what) in [
        (f.pending, "pending requests"),
        (f.member_links, "member page links"),
        (f.bounce_scores, "bounce scores"),
        (f.bounce_events, "bounce reports"),
        (f.confirm_rates, "confirmation counts"),
        (f.autoresponses, "automatic response counts"),
    ] {
        if n > 0 {
            let _ = writeln!(out, "  {n} {what}");
        }
    }
    out
}

pub fn held(list: &str, rows: &[HeldPost]) -> String {
    if rows.is_empty() {
        return format!("{list} holds no posts\n");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|h| {
            vec![
                h.id.to_string(),
                h.sender.clone(),
                h.size.to_string(),
                ts(h.held_at),
                ts(h.expires_at),
                clip(&h.reason, 50),
                clip(&h.subject, 50),
            ]
        })
        .collect();
    table(
        &[
            "ID", "SENDER", "SIZE", "HELD", "EXPIRES", "REASON", "SUBJECT",
        ],
        &[true, false, true, false, false, false, false],
        &cells,
    )
}

pub fn decided(d: &Decided) -> String {
    let mut out = String::new();
    for p in &d.posts {
        let what = match (d.action, p.queue_id) {
            ("approve", Some(q)) => format!("approved: queued again as row {q} at the list stage"),
            ("reject", Some(q)) => {
                format!("rejected: the sender's notice is row {q} at the bounce stage")
            }
            _ => "discarded".to_owned(),
        };
        let _ = writeln!(
            out,
            "{}: post {} from {} ({}) {what}",
            d.list,
            p.id,
            p.sender,
            clip(&p.subject, 60)
        );
    }
    out
}

fn scope(list: &Option<String>) -> String {
    match list {
        Some(l) => l.clone(),
        None => "every list".to_owned(),
    }
}

pub fn ban_changed(b: &BanChange, banning: bool) -> String {
    let scope = scope(&b.list);
    match (banning, b.changed) {
        (true, true) => format!("banned {} from {scope}\n", b.pattern),
        (true, false) => format!("{} is banned from {scope} already: unchanged\n", b.pattern),
        (false, true) => format!("lifted the ban of {} from {scope}\n", b.pattern),
        (false, false) => format!(
            "{} is not banned from {scope}: nothing removed\n",
            b.pattern
        ),
    }
}

pub fn bans(rows: &[Ban]) -> String {
    if rows.is_empty() {
        return "no bans\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|b| {
            vec![
                b.pattern.clone(),
                scope(&b.list),
                b.created_by.clone(),
                ts(b.created_at),
                clip(&b.reason, 60),
            ]
        })
        .collect();
    table(
        &["PATTERN", "LIST", "BY", "SINCE", "REASON"],
        &[false; 5],
        &cells,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Role;

    #[test]
    fn summaries_say_what_happened_to_each_address() {
        let a = Added {
            list: "team@example.org".into(),
            role: Role::Owner,
            added: vec!["a@example.org".into()],
            already: vec!["b@example.org".into()],
        };
        assert_eq!(
            added(&a),
            "added a@example.org to team@example.org as an owner\n\
             b@example.org is an owner of team@example.org already: unchanged\n"
        );
        let i = Imported {
            list: "team@example.org".into(),
            file: "m.csv".into(),
            dry_run: true,
            rows: 4,
            added: 2,
            already_members: 0,
            duplicates: vec![4],
            invalid: vec![Invalid {
                line: 3,
                text: "x".into(),
                reason: "no @".into(),
            }],
        };
        let text = imported(&i);
        assert!(text.contains("2 would be added"), "{text}");
        assert!(text.contains("line 3: \"x\" not imported: no @"), "{text}");
        assert!(text.contains("lines 4"), "{text}");
        assert!(text.ends_with("dry run: nothing was stored\n"), "{text}");
        let b = BanChange {
            list: None,
            pattern: "^.*@spam\\.test$".into(),
            changed: false,
        };
        assert_eq!(
            ban_changed(&b, true),
            "^.*@spam\\.test$ is banned from every list already: unchanged\n"
        );
        let d = Decided {
            list: "team@example.org".into(),
            action: "reject",
            stage: Some("bounce".into()),
            reason: "off topic".into(),
            posts: vec![crate::store::DecidedPost {
                id: 4,
                sender: "x@example.net".into(),
                subject: "hi".into(),
                queue_id: Some(9),
            }],
        };
        assert_eq!(
            decided(&d),
            "team@example.org: post 4 from x@example.net (hi) rejected: the sender's notice is \
             row 9 at the bounce stage\n"
        );
        assert!(
            forgotten(&Forgotten {
                address: "x@example.org".into(),
                ..Default::default()
            })
            .contains("nothing removed")
        );
    }
}
