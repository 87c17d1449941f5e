//! The pipeline graph pepsi-httpd draws is the edges each stage program declares
//! (`Stage::edges`, through `pepsi::programs::STAGE_EDGES`, the table the `pepsi-httpd`
//! executable passes in): what each routing program declares from its own options, one
//! table row per program, and the graph's edges equal to the declared ones. pepsi-httpd's
//! own tests cover the layout with a program of their own; these use the real programs.

use std::collections::BTreeSet;

use pepsi::programs::STAGE_EDGES;
use pepsi_conf::config::Config;
use pepsi_contract::stage::edges::{self, EdgeKind};
use pepsi_httpd::graph;

/// The graph of `text` (with `queued` stages holding rows) as compact lines: nodes as
/// `name@column.row` (`?` unconfigured, `!` unreachable), edges as `from -kind-> to` with
/// the label in brackets, and the problems.
fn check(text: &str, queued: &[&str], nodes: &str, edges: &[&str], problems: &[&str]) {
    let cfg = Config::from_str_named(text, "test.conf").unwrap();
    let queued: Vec<String> = queued.iter().map(|s| s.to_string()).collect();
    let g = graph::build(&cfg, &queued, STAGE_EDGES);
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
    let got_edges: Vec<String> = g.edges.iter().map(edge_line).collect();
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

fn kind(kind: EdgeKind) -> &'static str {
    match kind {
        EdgeKind::Next => "next",
        EdgeKind::Branch => "branch",
        EdgeKind::Bounce => "bounce",
    }
}

fn edge_line(e: &graph::Edge) -> String {
    match &e.label {
        Some(l) => format!("{} -{}[{l}]-> {}", e.from, kind(e.kind), e.to),
        None => format!("{} -{}-> {}", e.from, kind(e.kind), e.to),
    }
}

/// What one section running `program` with `options` declares, as `OPTION -kind[label]->
/// target` lines, and its problems.
fn declared(program: &str, options: &str) -> (Vec<String>, Vec<String>) {
    let text = format!("[stage-s]\nPROGRAM = {program}\n{options}");
    let cfg = Config::from_str_named(&text, "t.conf").unwrap();
    let mut all = edges::declared(&cfg, STAGE_EDGES);
    assert_eq!(all.len(), 1);
    let d = all.remove(0);
    let lines = d
        .edges
        .iter()
        .map(|e| match &e.label {
            Some(l) => format!("{} -{}[{l}]-> {}", e.option, kind(e.kind), e.target),
            None => format!("{} -{}-> {}", e.option, kind(e.kind), e.target),
        })
        .collect();
    (lines, d.problems)
}

/// Each program that routes by options of its own, and what a section of it declares.
#[test]
fn each_stage_program_declares_its_edges_from_its_own_options() {
    let cases: &[(&str, &str, &[&str], &[&str])] = &[
        (
            "pepsi-stage-route",
            "NEXT_STAGE = out\nROUTE_REMOTE = far\nROUTES = a.example:a, .B.example:b x\n",
            &[
                "NEXT_STAGE -branch[local]-> out",
                "ROUTE_REMOTE -branch[remote]-> far",
                "ROUTES -branch[a.example]-> a",
                "ROUTES -branch[.b.example]-> b",
            ],
            &["[stage-s] ROUTES: \"x\" is not a `domain:stage` item"],
        ),
        (
            "pepsi-stage-route",
            "ROUTE_LOCAL = near\n",
            &["ROUTE_LOCAL -branch[local]-> near"],
            &["[stage-s] needs ROUTE_REMOTE or NEXT_STAGE"],
        ),
        (
            "pepsi-stage-if",
            "CONDITION = any_rcpt_local\nTHEN = t\nNEXT_STAGE = n\nBOUNCE_STAGE = b\n",
            &[
                "THEN -branch[then]-> t",
                "NEXT_STAGE -branch[else]-> n",
                "BOUNCE_STAGE -bounce-> b",
            ],
            &[],
        ),
        (
            "/usr/libexec/pepsi/pepsi-stage-if-headers",
            "THEN = t\nELSE = e\nNEXT_STAGE = n\n",
            &["THEN -branch[then]-> t", "ELSE -branch[else]-> e"],
            &["[stage-s] has no CONDITION"],
        ),
        (
            "pepsi-stage-if",
            "",
            &[],
            &[
                "[stage-s] has no CONDITION",
                "[stage-s] has no THEN",
                "[stage-s] needs ELSE or NEXT_STAGE",
            ],
        ),
        (
            "pepsi-stage-relay-to-maildir",
            "NEXT_STAGE = n\nNONLOCAL_STAGE = remote\n",
            &[
                "NEXT_STAGE -next-> n",
                "NONLOCAL_STAGE -branch[non-local]-> remote",
            ],
            &[],
        ),
        (
            "pepsi-stage-block-language",
            "NEXT_STAGE = n\nJUNK_STAGE = junk\n",
            &["NEXT_STAGE -next-> n", "JUNK_STAGE -branch[junk]-> junk"],
            &[],
        ),
        (
            "pepsi-stage-vacation",
            "NEXT_STAGE = n\nREPLY_STAGE = out\n",
            &["NEXT_STAGE -next-> n", "REPLY_STAGE -branch[reply]-> out"],
            &[],
        ),
        // Where replies start when REPLY_STAGE is unset: the stage's default, drawn too.
        (
            "pepsi-stage-vacation",
            "NEXT_STAGE = n\n",
            &["NEXT_STAGE -next-> n", "REPLY_STAGE -branch[reply]-> init"],
            &[],
        ),
        (
            "pepsi-stage-dot-forward",
            "NEXT_STAGE = n\nFORWARD_STAGE = fw\n",
            &[
                "NEXT_STAGE -next-> n",
                "FORWARD_STAGE -branch[forward]-> fw",
            ],
            &[],
        ),
        (
            "pepsi-stage-dot-forward",
            "NEXT_STAGE = n\n",
            &[
                "NEXT_STAGE -next-> n",
                "FORWARD_STAGE -branch[forward]-> aliases",
            ],
            &[],
        ),
        (
            "pepsi-stage-list",
            "NEXT_STAGE = n\nDELIVER_STAGE = members\n",
            &[
                "NEXT_STAGE -next-> n",
                "DELIVER_STAGE -branch[list]-> members",
            ],
            &[],
        ),
        // Where members' copies start when DELIVER_STAGE is unset: the stage's default.
        (
            "pepsi-stage-list",
            "NEXT_STAGE = n\n",
            &[
                "NEXT_STAGE -next-> n",
                "DELIVER_STAGE -branch[list]-> aliases",
            ],
            &[],
        ),
        (
            "pepsi-stage-secure-link",
            "NEXT_STAGE = n\nNOTICE_STAGE = out\nRECEIPT_STAGE = r\n",
            &[
                "NEXT_STAGE -next-> n",
                "NOTICE_STAGE -branch[notice]-> out",
                "RECEIPT_STAGE -branch[receipt]-> r",
            ],
            &[],
        ),
        // Notices go out at NEXT_STAGE (drawn once), receipts start at the default `init`.
        (
            "pepsi-stage-secure-link",
            "NEXT_STAGE = n\n",
            &[
                "NEXT_STAGE -next-> n",
                "RECEIPT_STAGE -branch[receipt]-> init",
            ],
            &[],
        ),
        (
            "pepsi-stage-secure-link",
            "",
            &["RECEIPT_STAGE -branch[receipt]-> init"],
            &["[stage-s] needs NOTICE_STAGE or NEXT_STAGE"],
        ),
        // Challenges start at the default `init`; junk goes to JUNK_STAGE when set.
        (
            "pepsi-stage-secretary",
            "NEXT_STAGE = n\nJUNK_STAGE = j\n",
            &[
                "NEXT_STAGE -next-> n",
                "CHALLENGE_STAGE -branch[challenge]-> init",
                "JUNK_STAGE -branch[junk]-> j",
            ],
            &[],
        ),
        (
            "pepsi-stage-secretary",
            "NEXT_STAGE = n\nCHALLENGE_STAGE = c\n",
            &[
                "NEXT_STAGE -next-> n",
                "CHALLENGE_STAGE -branch[challenge]-> c",
            ],
            &[],
        ),
        // Notices start at the default `init`; paid challenges go to FILED_STAGE when set.
        (
            "pepsi-stage-auto-pay",
            "NEXT_STAGE = n\nFILED_STAGE = f\n",
            &[
                "NEXT_STAGE -next-> n",
                "NOTICE_STAGE -branch[notice]-> init",
                "FILED_STAGE -branch[filed]-> f",
            ],
            &[],
        ),
        // The encrypt stage's fallback, when set.
        (
            "pepsi-stage-encrypt",
            "NEXT_STAGE = n\nSECURE_LINK_STAGE = sl\n",
            &[
                "NEXT_STAGE -next-> n",
                "SECURE_LINK_STAGE -branch[secure-link]-> sl",
            ],
            &[],
        ),
        // A program the table does not hold follows NEXT_STAGE.
        (
            "my-own-stage",
            "NEXT_STAGE = n\nTHEN = t\n",
            &["NEXT_STAGE -next-> n"],
            &[],
        ),
    ];
    for (program, options, want, problems) in cases {
        let (got, got_problems) = declared(program, options);
        assert_eq!(got, *want, "{program} with:\n{options}");
        assert_eq!(got_problems, *problems, "{program} with:\n{options}");
    }
}

/// Every other stage program declares NEXT_STAGE alone (and its BOUNCE_STAGE), whatever
/// routing options its section holds.
#[test]
fn the_other_stage_programs_declare_next_stage_only() {
    let routing = [
        "pepsi-stage-route",
        "pepsi-stage-if",
        "pepsi-stage-if-headers",
        "pepsi-stage-relay-to-maildir",
        "pepsi-stage-block-language",
        "pepsi-stage-vacation",
        "pepsi-stage-dot-forward",
        "pepsi-stage-list",
        "pepsi-stage-secure-link",
        "pepsi-stage-secretary",
        "pepsi-stage-auto-pay",
    ];
    for row in STAGE_EDGES {
        let options = "NEXT_STAGE = n\nBOUNCE_STAGE = b\nTHEN = t\nROUTE_LOCAL = l\n\
                       NONLOCAL_STAGE = x\nJUNK_STAGE = j\n";
        let (got, problems) = declared(row.program, options);
        if routing.contains(&row.program) {
            assert_ne!(
                got[..],
                ["NEXT_STAGE -next-> n", "BOUNCE_STAGE -bounce-> b"]
            );
            continue;
        }
        assert_eq!(
            got,
            ["NEXT_STAGE -next-> n", "BOUNCE_STAGE -bounce-> b"],
            "{}",
            row.program
        );
        assert!(problems.is_empty(), "{}: {problems:?}", row.program);
    }
}

/// The graph's edges are the declared ones, merged per (from, kind, to) with their labels
/// joined: none added, none lost (the default configuration, every branch kind in it).
#[test]
fn the_graph_s_edges_are_the_declared_edges() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/etc/pepsi.conf")).unwrap();
    let cfg = Config::from_str_named(&text, "pepsi.conf").unwrap();
    let g = graph::build(&cfg, &[], STAGE_EDGES);
    let mut declared: BTreeSet<(String, &str, String, String)> = BTreeSet::new();
    for d in edges::declared(&cfg, STAGE_EDGES) {
        for e in d.edges {
            let to = g
                .nodes
                .iter()
                .find(|n| n.name.eq_ignore_ascii_case(&e.target))
                .map_or(e.target.clone(), |n| n.name.clone());
            declared.insert((
                d.stage.clone(),
                kind(e.kind),
                to,
                e.label.unwrap_or_default(),
            ));
        }
    }
    let mut drawn: BTreeSet<(String, &str, String, String)> = BTreeSet::new();
    for e in &g.edges {
        match &e.label {
            Some(labels) => {
                for l in labels.split(", ") {
                    drawn.insert((e.from.clone(), kind(e.kind), e.to.clone(), l.to_owned()));
                }
            }
            None => {
                drawn.insert((e.from.clone(), kind(e.kind), e.to.clone(), String::new()));
            }
        }
    }
    assert!(!declared.is_empty());
    assert_eq!(drawn, declared);
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
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/etc/pepsi.conf")).unwrap();
    check(
        &text,
        &[],
        "init@0.0 discard!@0.1 aliases@1.0 whitelist@2.0 route@3.0 lists@4.0 remote@4.1 \
         vacation@5.0 dkim@5.1 local@6.0 arc@6.1 relay@7.0 bounce@8.0",
        &[
            "aliases -next-> whitelist",
            "aliases -bounce-> bounce",
            "arc -next-> relay",
            "bounce -next-> init",
            "dkim -next-> arc",
            "init -next-> aliases",
            "init -bounce-> bounce",
            "lists -next-> vacation",
            "lists -branch[list]-> aliases",
            "lists -bounce-> bounce",
            "local -branch[non-local]-> remote",
            "local -bounce-> bounce",
            "relay -bounce-> bounce",
            "remote -next-> dkim",
            "route -branch[local]-> lists",
            "route -branch[remote]-> remote",
            "vacation -next-> local",
            "vacation -branch[reply]-> init",
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
    let g = graph::build(&cfg, &[], STAGE_EDGES);
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
