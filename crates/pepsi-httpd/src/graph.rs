//! The stage graph as the workers see it, pure: the `[stage-<name>]` sections of a
//! configuration (the file with the global database overlay, as `queue::bounce_stage_of`
//! reads it) become nodes, and their NEXT_STAGE, BOUNCE_STAGE and branch options edges,
//! laid out in columns by distance from the first stage. The live pipeline page draws it.
//!
//! The branch options of the routing stages are read here, by the rules their programs
//! document (docs/routing.md: `ROUTES`, `ROUTE_LOCAL`, `ROUTE_REMOTE` of pepsi-stage-route;
//! `THEN`, `ELSE` of pepsi-stage-if and pepsi-stage-if-headers; `NONLOCAL_STAGE` of
//! pepsi-stage-relay-to-maildir; `JUNK_STAGE` of pepsi-stage-block-language), not by linking
//! those crates: pepsi-httpd depends on no
//! stage crate. A value the stages would refuse is not an error here but a `problem` the
//! page shows, since a graph with a dangling edge is exactly what an operator must see.

use std::collections::{BTreeMap, VecDeque};

use pepsi_common::config::Config;
use pepsi_common::stage::program_name;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// The stage fresh mail enters at (`pepsi.workqueue_add`).
pub const FIRST_STAGE: &str = "init";

/// What an edge stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// NEXT_STAGE: where a stage advances a message by default.
    Next,
    /// A branch of a routing stage (route, if, if-headers, the Maildir stage's non-local
    /// recipients); its label says which.
    Branch,
    /// BOUNCE_STAGE: where a message that cannot go on is returned from.
    Bounce,
}

/// One edge; edges of one kind between the same two stages are merged, their labels joined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub kind: EdgeKind,
    /// For a branch: `then`, `else`, `local`, `remote`, `non-local` or a routed domain.
    pub label: Option<String>,
}

/// One stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    /// As the section spells it (the name rows carry in `workqueue.stage`).
    pub name: String,
    /// Its PROGRAM; `None` for a stage without a section (named by an edge or by queue rows).
    pub program: Option<String>,
    /// Whether a `[stage-<name>]` section exists.
    pub configured: bool,
    /// Whether a message entering at the first stage can reach it.
    pub reachable: bool,
    /// Distance from the first stage along NEXT_STAGE and branch edges (a stage reached only
    /// through BOUNCE_STAGE sits one column right of the furthest stage that bounces to it).
    pub column: usize,
    /// Its place within the column, top down.
    pub row: usize,
    /// The CONDITION of an `if` stage.
    pub condition: Option<String>,
}

/// The whole graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Graph {
    pub first_stage: String,
    /// Ordered by column, then row.
    pub nodes: Vec<Node>,
    /// Ordered by source, kind, target.
    pub edges: Vec<Edge>,
    /// What a worker would refuse or an operator should know, each naming the section,
    /// option and value.
    pub problems: Vec<String>,
}

impl Graph {
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// 16 hex digits of SHA-256 over the nodes and edges: the page redraws its picture
    /// when this changes (the configuration did, or rows wait at a stage without one).
    pub fn id(&self) -> String {
        let text = serde_json::to_vec(&(&self.nodes, &self.edges)).unwrap_or_default();
        crate::credentials::hex(&Sha256::digest(&text)[..8])
    }
}

/// The stage name of a `[stage-<name>]` section.
fn stage_of_section(section: &str) -> Option<&str> {
    section
        .get(..6)
        .filter(|p| p.eq_ignore_ascii_case("stage-"))
        .map(|_| &section[6..])
        .filter(|s| !s.is_empty())
}

/// Items of a list option: commas and whitespace separate them.
fn items(value: &str) -> impl Iterator<Item = &str> {
    value
        .split([',', ' ', '\t'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// One option's value; a value the configuration cannot expand is a problem.
fn option(cfg: &Config, stage: &str, name: &str, problems: &mut Vec<String>) -> Option<String> {
    match cfg.section(&format!("stage-{stage}")).string_opt(name) {
        Ok(v) => v.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()),
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    }
}

/// The graph of `cfg`; `queued` are the stages rows are at now, so that a stage without a
/// section that still holds rows is drawn too.
pub fn build(cfg: &Config, queued: &[String]) -> Graph {
    let mut problems = Vec::new();
    let stages: Vec<String> = cfg
        .sections()
        .filter_map(stage_of_section)
        .map(str::to_owned)
        .collect();
    // Stage names are matched as sections are, in any letter case; a node carries the
    // spelling of its section.
    let canonical = |name: &str| -> Option<String> {
        stages
            .iter()
            .find(|s| s.eq_ignore_ascii_case(name))
            .cloned()
    };
    let mut programs: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut conditions: BTreeMap<String, String> = BTreeMap::new();
    // (from, option that names the target, target as written, kind, label)
    let mut raw: Vec<(String, &'static str, String, EdgeKind, Option<String>)> = Vec::new();
    for stage in &stages {
        let program = option(cfg, stage, "PROGRAM", &mut problems);
        if program.is_none() {
            problems.push(format!("[stage-{stage}] has no PROGRAM"));
        }
        let next = option(cfg, stage, "NEXT_STAGE", &mut problems);
        let name = program.as_deref().map(program_name).unwrap_or_default();
        let branch = |label: &str| Some(label.to_owned());
        match name {
            "pepsi-stage-route" => {
                for (opt, label) in [("ROUTE_LOCAL", "local"), ("ROUTE_REMOTE", "remote")] {
                    match option(cfg, stage, opt, &mut problems) {
                        Some(t) => {
                            raw.push((stage.clone(), opt, t, EdgeKind::Branch, branch(label)))
                        }
                        None => match &next {
                            Some(t) => raw.push((
                                stage.clone(),
                                "NEXT_STAGE",
                                t.clone(),
                                EdgeKind::Branch,
                                branch(label),
                            )),
                            None => {
                                problems.push(format!("[stage-{stage}] needs {opt} or NEXT_STAGE"))
                            }
                        },
                    }
                }
                for item in option(cfg, stage, "ROUTES", &mut problems)
                    .as_deref()
                    .map(|v| items(v).map(str::to_owned).collect::<Vec<_>>())
                    .unwrap_or_default()
                {
                    match item.rsplit_once(':') {
                        Some((domain, target)) if !domain.is_empty() && !target.is_empty() => raw
                            .push((
                                stage.clone(),
                                "ROUTES",
                                target.to_owned(),
                                EdgeKind::Branch,
                                Some(domain.to_ascii_lowercase()),
                            )),
                        _ => problems.push(format!(
                            "[stage-{stage}] ROUTES: {item:?} is not a `domain:stage` item"
                        )),
                    }
                }
            }
            "pepsi-stage-if" | "pepsi-stage-if-headers" => {
                match option(cfg, stage, "CONDITION", &mut problems) {
                    Some(c) => {
                        conditions.insert(stage.clone(), c);
                    }
                    None => problems.push(format!("[stage-{stage}] has no CONDITION")),
                }
                match option(cfg, stage, "THEN", &mut problems) {
                    Some(t) => {
                        raw.push((stage.clone(), "THEN", t, EdgeKind::Branch, branch("then")))
                    }
                    None => problems.push(format!("[stage-{stage}] has no THEN")),
                }
                match option(cfg, stage, "ELSE", &mut problems) {
                    Some(t) => {
                        raw.push((stage.clone(), "ELSE", t, EdgeKind::Branch, branch("else")))
                    }
                    None => match &next {
                        Some(t) => raw.push((
                            stage.clone(),
                            "NEXT_STAGE",
                            t.clone(),
                            EdgeKind::Branch,
                            branch("else"),
                        )),
                        None => problems.push(format!("[stage-{stage}] needs ELSE or NEXT_STAGE")),
                    },
                }
            }
            _ => {
                if let Some(t) = &next {
                    raw.push((stage.clone(), "NEXT_STAGE", t.clone(), EdgeKind::Next, None));
                }
                if name == "pepsi-stage-relay-to-maildir"
                    && let Some(t) = option(cfg, stage, "NONLOCAL_STAGE", &mut problems)
                {
                    raw.push((
                        stage.clone(),
                        "NONLOCAL_STAGE",
                        t,
                        EdgeKind::Branch,
                        branch("non-local"),
                    ));
                }
                if name == "pepsi-stage-block-language"
                    && let Some(t) = option(cfg, stage, "JUNK_STAGE", &mut problems)
                {
                    raw.push((
                        stage.clone(),
                        "JUNK_STAGE",
                        t,
                        EdgeKind::Branch,
                        branch("junk"),
                    ));
                }
            }
        }
        if let Some(t) = option(cfg, stage, "BOUNCE_STAGE", &mut problems) {
            raw.push((stage.clone(), "BOUNCE_STAGE", t, EdgeKind::Bounce, None));
        }
        programs.insert(stage.clone(), program);
    }

    // Targets in the section's spelling; a target without a section becomes a node of its
    // own, so the dangling edge shows.
    let mut missing: Vec<String> = Vec::new();
    let mut merged: BTreeMap<(String, EdgeKind, String), Vec<String>> = BTreeMap::new();
    for (from, opt, target, kind, label) in raw {
        let to = match canonical(&target) {
            Some(t) => t,
            None => {
                problems.push(format!(
                    "[stage-{from}] {opt} = {target}: there is no [stage-{target}] section"
                ));
                if !missing.iter().any(|m| m.eq_ignore_ascii_case(&target)) {
                    missing.push(target.clone());
                }
                missing
                    .iter()
                    .find(|m| m.eq_ignore_ascii_case(&target))
                    .cloned()
                    .unwrap_or(target)
            }
        };
        let labels = merged.entry((from, kind, to)).or_default();
        if let Some(l) = label
            && !labels.contains(&l)
        {
            labels.push(l);
        }
    }
    let edges: Vec<Edge> = merged
        .into_iter()
        .map(|((from, kind, to), labels)| Edge {
            from,
            to,
            kind,
            label: (!labels.is_empty()).then(|| labels.join(", ")),
        })
        .collect();
    for q in queued {
        if canonical(q).is_some() {
            continue;
        }
        problems.push(format!(
            "rows wait at stage {q}, which has no [stage-{q}] section: no worker will take them"
        ));
        if !missing.contains(q) {
            missing.push(q.clone());
        }
    }
    if canonical(FIRST_STAGE).is_none() && !stages.is_empty() {
        problems.push(format!(
            "there is no [stage-{FIRST_STAGE}] section: fresh mail enters at stage {FIRST_STAGE}"
        ));
    }

    let mut names: Vec<String> = stages.clone();
    names.extend(missing.iter().cloned());
    let first = canonical(FIRST_STAGE).unwrap_or_else(|| FIRST_STAGE.to_owned());
    let placed = layout(&names, &edges, &first);
    let reachable = reach(&edges, &first, names.contains(&first));
    let mut nodes: Vec<Node> = names
        .iter()
        .map(|name| {
            let (column, row) = placed[name];
            Node {
                name: name.clone(),
                program: programs.get(name).cloned().flatten(),
                configured: programs.contains_key(name),
                reachable: reachable.contains(name),
                column,
                row,
                condition: conditions.get(name).cloned(),
            }
        })
        .collect();
    nodes.sort_by_key(|n| (n.column, n.row));
    Graph {
        first_stage: first,
        nodes,
        edges,
        problems,
    }
}

/// The stages a message entering at `first` can reach, along every kind of edge.
fn reach(edges: &[Edge], first: &str, exists: bool) -> Vec<String> {
    if !exists {
        return Vec::new();
    }
    let mut seen = vec![first.to_owned()];
    let mut i = 0;
    while i < seen.len() {
        let at = seen[i].clone();
        for e in edges.iter().filter(|e| e.from == at) {
            if !seen.contains(&e.to) {
                seen.push(e.to.clone());
            }
        }
        i += 1;
    }
    seen
}

/// (column, row) of every name. Columns: breadth first from `first` along NEXT_STAGE and
/// branch edges; a stage reached only through BOUNCE_STAGE goes one column right of the
/// furthest stage bouncing to it, and the search goes on from there; a stage reached by
/// neither starts a component of its own at column 0. Rows: the order stages were placed.
fn layout(names: &[String], edges: &[Edge], first: &str) -> BTreeMap<String, (usize, usize)> {
    let mut column: BTreeMap<String, usize> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut queue: VecDeque<String> = VecDeque::new();
    let mut place = |name: &str,
                     col: usize,
                     column: &mut BTreeMap<String, usize>,
                     queue: &mut VecDeque<String>| {
        column.insert(name.to_owned(), col);
        order.push(name.to_owned());
        queue.push_back(name.to_owned());
    };
    if names.iter().any(|n| n == first) {
        place(first, 0, &mut column, &mut queue);
    }
    loop {
        while let Some(at) = queue.pop_front() {
            let col = column[&at];
            for e in edges
                .iter()
                .filter(|e| e.from == at && e.kind != EdgeKind::Bounce)
            {
                if !column.contains_key(&e.to) {
                    place(e.to.as_str(), col + 1, &mut column, &mut queue);
                }
            }
        }
        // Bounce targets of what is placed, furthest source first.
        let mut bounced: BTreeMap<String, usize> = BTreeMap::new();
        for e in edges.iter().filter(|e| e.kind == EdgeKind::Bounce) {
            if let Some(&c) = column.get(&e.from)
                && !column.contains_key(&e.to)
            {
                let best = bounced.entry(e.to.clone()).or_insert(c + 1);
                *best = (*best).max(c + 1);
            }
        }
        if !bounced.is_empty() {
            for (name, col) in bounced {
                place(name.as_str(), col, &mut column, &mut queue);
            }
            continue;
        }
        // A new component: prefer a stage nothing unplaced leads to.
        let unplaced: Vec<&String> = names.iter().filter(|n| !column.contains_key(*n)).collect();
        let Some(root) = unplaced
            .iter()
            .find(|n| {
                !edges
                    .iter()
                    .any(|e| &&e.to == *n && !column.contains_key(&e.from))
            })
            .or(unplaced.first())
        else {
            break;
        };
        let root = (*root).clone();
        place(root.as_str(), 0, &mut column, &mut queue);
    }
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    order
        .into_iter()
        .map(|name| {
            let col = column[&name];
            let row = rows.entry(col).or_insert(0);
            let at = *row;
            *row += 1;
            (name, (col, at))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The graph of `text` (with `queued` stages holding rows) as compact lines: nodes as
    /// `name@column.row` (`?` unconfigured, `!` unreachable), edges as `from -kind-> to`
    /// with the label in brackets, and the problems.
    fn check(text: &str, queued: &[&str], nodes: &str, edges: &[&str], problems: &[&str]) {
        let cfg = Config::from_str_named(text, "test.conf").unwrap();
        let queued: Vec<String> = queued.iter().map(|s| s.to_string()).collect();
        let g = build(&cfg, &queued);
        let got_nodes: Vec<String> = g
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}{}{}@{}.{}",
                    n.name,
                    if n.configured { "" } else { "?" },
                    if n.reachable { "" } else { "!" },
                    n.column,
                    n.row
                )
            })
            .collect();
        assert_eq!(got_nodes.join(" "), nodes, "nodes of:\n{text}");
        let got_edges: Vec<String> = g
            .edges
            .iter()
            .map(|e| {
                let kind = match e.kind {
                    EdgeKind::Next => "next",
                    EdgeKind::Branch => "branch",
                    EdgeKind::Bounce => "bounce",
                };
                match &e.label {
                    Some(l) => format!("{} -{kind}[{l}]-> {}", e.from, e.to),
                    None => format!("{} -{kind}-> {}", e.from, e.to),
                }
            })
            .collect();
        assert_eq!(got_edges, edges, "edges of:\n{text}");
        assert_eq!(
            g.problems.len(),
            problems.len(),
            "problems: {:?}",
            g.problems
        );
        for (got, want) in g.problems.iter().zip(problems) {
            assert!(
                got.contains(want),
                "problem {got:?} should contain {want:?}"
            );
        }
    }

    #[test]
    fn a_chain_of_next_stages_is_one_row_of_columns() {
        check(
            "[stage-init]\nPROGRAM = a\nNEXT_STAGE = relay\nBOUNCE_STAGE = bounce\n\
             [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\nBOUNCE_STAGE = bounce\n\
             [stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = init\n",
            &[],
            "init@0.0 relay@1.0 bounce@2.0",
            &[
                "bounce -next-> init",
                "init -next-> relay",
                "init -bounce-> bounce",
                "relay -bounce-> bounce",
            ],
            &[],
        );
    }

    #[test]
    fn route_branches_default_to_next_stage_and_merge_per_target() {
        check(
            "[stage-init]\nPROGRAM = /usr/lib/pepsi/pepsi-stage-route\nNEXT_STAGE = out\n\
             ROUTES = partner.example:partner, .Internal.example:lmtp bad\n\
             [stage-out]\nPROGRAM = x\n[stage-partner]\nPROGRAM = x\n[stage-lmtp]\nPROGRAM = x\n",
            &[],
            "init@0.0 lmtp@1.0 out@1.1 partner@1.2",
            &[
                "init -branch[.internal.example]-> lmtp",
                "init -branch[local, remote]-> out",
                "init -branch[partner.example]-> partner",
            ],
            &["ROUTES: \"bad\" is not a `domain:stage` item"],
        );
    }

    #[test]
    fn the_default_configuration_draws_every_branch() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../etc/pepsi.conf"))
                .unwrap();
        check(
            &text,
            &[],
            "init@0.0 discard!@0.1 aliases@1.0 whitelist@2.0 route@3.0 remote@4.0 vacation@4.1 \
             dkim@5.0 local@5.1 arc@6.0 relay@7.0 bounce@8.0",
            &[
                "aliases -next-> whitelist",
                "aliases -bounce-> bounce",
                "arc -next-> relay",
                "bounce -next-> init",
                "dkim -next-> arc",
                "init -next-> aliases",
                "init -bounce-> bounce",
                "local -branch[non-local]-> remote",
                "local -bounce-> bounce",
                "relay -bounce-> bounce",
                "remote -next-> dkim",
                "route -branch[remote]-> remote",
                "route -branch[local]-> vacation",
                "vacation -next-> local",
                "whitelist -next-> route",
            ],
            &[],
        );
    }

    #[test]
    fn a_language_block_branches_to_its_junk_stage() {
        check(
            "[stage-init]\nPROGRAM = pepsi-stage-block-language\nNEXT_STAGE = deliver\n\
             JUNK_STAGE = junk\n[stage-deliver]\nPROGRAM = x\n[stage-junk]\nPROGRAM = x\n",
            &[],
            "init@0.0 deliver@1.0 junk@1.1",
            &["init -next-> deliver", "init -branch[junk]-> junk"],
            &[],
        );
    }

    #[test]
    fn if_stages_branch_to_then_and_else() {
        check(
            "[stage-init]\nPROGRAM = pepsi-stage-if\nCONDITION = state.junk == true\n\
             THEN = quarantine\nNEXT_STAGE = deliver\n\
             [stage-deliver]\nPROGRAM = pepsi-stage-if-headers\nCONDITION = header:X-A == \"1\"\n\
             THEN = a\nELSE = b\n\
             [stage-quarantine]\nPROGRAM = x\n[stage-a]\nPROGRAM = x\n[stage-b]\nPROGRAM = x\n",
            &[],
            "init@0.0 deliver@1.0 quarantine@1.1 a@2.0 b@2.1",
            &[
                "deliver -branch[then]-> a",
                "deliver -branch[else]-> b",
                "init -branch[else]-> deliver",
                "init -branch[then]-> quarantine",
            ],
            &[],
        );
        let cfg = Config::from_str_named(
            "[stage-init]\nPROGRAM = pepsi-stage-if\nCONDITION = any_rcpt_local\nTHEN = init\nELSE = init\n",
            "t.conf",
        )
        .unwrap();
        let g = build(&cfg, &[]);
        assert_eq!(
            g.node("init").unwrap().condition.as_deref(),
            Some("any_rcpt_local")
        );
        assert_eq!(g.edges[0].label.as_deref(), Some("then, else"));
    }

    #[test]
    fn dangling_targets_and_orphan_rows_become_unconfigured_nodes() {
        check(
            "[stage-init]\nPROGRAM = x\nNEXT_STAGE = Relay\nBOUNCE_STAGE = nowhere\n\
             [stage-relay]\nPROGRAM = x\n\
             [stage-if]\nPROGRAM = pepsi-stage-if\n\
             [stage-r]\nPROGRAM = pepsi-stage-route\n",
            &["old", "relay"],
            "init@0.0 if!@0.1 r!@0.2 old?!@0.3 relay@1.0 nowhere?@1.1",
            &["init -next-> relay", "init -bounce-> nowhere"],
            &[
                "[stage-if] has no CONDITION",
                "[stage-if] has no THEN",
                "[stage-if] needs ELSE or NEXT_STAGE",
                "[stage-r] needs ROUTE_LOCAL or NEXT_STAGE",
                "[stage-r] needs ROUTE_REMOTE or NEXT_STAGE",
                "[stage-init] BOUNCE_STAGE = nowhere: there is no [stage-nowhere] section",
                "rows wait at stage old, which has no [stage-old] section",
            ],
        );
    }

    #[test]
    fn without_an_init_stage_every_component_starts_at_column_zero() {
        check(
            "[stage-b]\nPROGRAM = x\nNEXT_STAGE = c\n[stage-c]\nPROGRAM = x\n[stage-a]\nPROGRAM = x\nNEXT_STAGE = c\n",
            &[],
            "a!@0.0 b!@0.1 c!@1.0",
            &["a -next-> c", "b -next-> c"],
            &["there is no [stage-init] section"],
        );
    }
}
