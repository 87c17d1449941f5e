//! The stage graph as the workers see it, pure: the `[stage-<name>]` sections of a
//! configuration (the file with the global database overlay, as `queue::bounce_stage_of`
//! reads it) become nodes, and their NEXT_STAGE, BOUNCE_STAGE and branch options edges,
//! laid out in columns by distance from the first stage. The live pipeline page draws it.
//!
//! Each stage program declares its own edges from its own section (`Stage::edges`: route's
//! `ROUTES`, `ROUTE_LOCAL`, `ROUTE_REMOTE`, if's `THEN`, `ELSE`, ...), read here through
//! `pepsi_contract::stage::edges::declared` and the table of declarations the root package
//! passes in (`pepsi::programs::STAGE_EDGES`), so pepsi-httpd links no stage crate and knows
//! no program's options. A value the stages would refuse is not an error here but a
//! `problem` the page shows, since a graph with a dangling edge is exactly what an operator
//! must see.

use std::collections::{BTreeMap, VecDeque};

use pepsi_conf::config::Config;
pub use pepsi_contract::stage::edges::EdgeKind;
use pepsi_contract::stage::edges::{self, StageEdges};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// The stage fresh mail enters at (`pepsi.workqueue_add`).
pub const FIRST_STAGE: &str = "init";

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

/// The graph of `cfg`; `queued` are the stages rows are at now, so that a stage without a
/// section that still holds rows is drawn too. `table` is every stage program's declaration
/// of its edges (the root package's `pepsi::programs::STAGE_EDGES`); a program it does not
/// hold is drawn by the default rule, NEXT_STAGE.
pub fn build(cfg: &Config, queued: &[String], table: &[StageEdges]) -> Graph {
    let mut problems = Vec::new();
    let declared = edges::declared(cfg, table);
    let stages: Vec<String> = declared.iter().map(|d| d.stage.clone()).collect();
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
    for d in declared {
        problems.extend(d.problems);
        for e in d.edges {
            raw.push((d.stage.clone(), e.option, e.target, e.kind, e.label));
        }
        if let Some(c) = d.condition {
            conditions.insert(d.stage.clone(), c);
        }
        programs.insert(d.stage, d.program);
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
pub(crate) mod tests {
    use super::*;

    /// A program that declares two labelled branches, LEFT and RIGHT, as the routing
    /// programs do: what this module does with declared edges, apart from any program's
    /// rules (the real programs' declarations drive this graph in the root package's
    /// tests/integration/httpd_graph.rs).
    pub(crate) const TWO_WAY: &[StageEdges] = &[StageEdges {
        program: "two-way",
        edges: |d| {
            for (option, label) in [("LEFT", "left"), ("RIGHT", "right")] {
                match d.option(option) {
                    Some(t) => d.branch(option, t, label),
                    None => d.problem(format_args!("has no {option}")),
                }
            }
        },
    }];

    #[test]
    fn a_program_s_declared_branches_are_edges_merged_per_target() {
        check(
            "[stage-init]\nPROGRAM = /usr/libexec/pepsi/two-way\nLEFT = a\nRIGHT = A\n\
             NEXT_STAGE = b\nBOUNCE_STAGE = b\n[stage-a]\nPROGRAM = two-way\nLEFT = b\n\
             [stage-b]\nPROGRAM = x\nNEXT_STAGE = a\n",
            &[],
            "init@0.0 a@1.0 b@2.0",
            &[
                "a -branch[left]-> b",
                "b -next-> a",
                "init -branch[left, right]-> a",
                "init -bounce-> b",
            ],
            &["[stage-a] has no RIGHT"],
        );
    }

    /// The graph of `text` (with `queued` stages holding rows) as compact lines: nodes as
    /// `name@column.row` (`?` unconfigured, `!` unreachable), edges as `from -kind-> to`
    /// with the label in brackets, and the problems.
    fn check(text: &str, queued: &[&str], nodes: &str, edges: &[&str], problems: &[&str]) {
        let cfg = Config::from_str_named(text, "test.conf").unwrap();
        let queued: Vec<String> = queued.iter().map(|s| s.to_string()).collect();
        let g = build(&cfg, &queued, TWO_WAY);
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
    fn dangling_targets_and_orphan_rows_become_unconfigured_nodes() {
        check(
            "[stage-init]\nPROGRAM = x\nNEXT_STAGE = Relay\nBOUNCE_STAGE = nowhere\n\
             [stage-relay]\nPROGRAM = x\n",
            &["old", "relay"],
            "init@0.0 old?!@0.1 relay@1.0 nowhere?@1.1",
            &["init -next-> relay", "init -bounce-> nowhere"],
            &[
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
