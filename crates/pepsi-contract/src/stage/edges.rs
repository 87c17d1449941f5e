//! The stage graph as each stage declares it: every `[stage-<name>]` section, and the stages
//! it can send a message to, read by the section's own program ([`Stage::edges`]) from its
//! own options. NEXT_STAGE is every program's default; a routing program declares its
//! branches instead (route's `ROUTES`, if's `THEN`/`ELSE`, ...), and a stage that makes a
//! new message declares where it enters (vacation's `REPLY_STAGE`, dot-forward's
//! `FORWARD_STAGE`). BOUNCE_STAGE is every
//! stage's and is read here, by [`bounce_stage`], the one reader `queue::bounce_stage_of`
//! uses too.
//!
//! pepsi-contract links no stage crate: the programs' declarations come in as a table
//! ([`StageEdges`], the root package's `pepsi::programs::STAGE_EDGES`); a program the table
//! does not hold is read by the default rule. Pure: nothing here does I/O, and a value a
//! stage would refuse is not an error but a problem in the result, since a graph with a
//! dangling or unreadable edge is what an operator must be shown.

use super::{Stage, program_name};
use pepsi_conf::config::{Config, ConfigError, Section, StageName};

/// What an edge stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// NEXT_STAGE: where a stage advances a message by default.
    Next,
    /// A branch of a routing stage (route, if, if-headers, the Maildir stage's non-local
    /// recipients, the language block's junk) or where a stage sends a message it makes
    /// (vacation's reply, dot-forward's forwarded copy); its label says which.
    Branch,
    /// BOUNCE_STAGE: where a message that cannot go on is returned from.
    Bounce,
}

/// One edge a section declares: its target as written in the option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The option that names the target.
    pub option: &'static str,
    pub target: String,
    pub kind: EdgeKind,
    /// For a branch: `then`, `else`, `local`, `remote`, `non-local`, `junk`, `reply`,
    /// `forward` or a routed domain.
    pub label: Option<String>,
}

/// What a program's [`Stage::edges`] writes its declaration into: the section to read, the
/// edges found and the problems met on the way.
#[derive(Debug)]
pub struct Declare<'a> {
    stage: &'a str,
    section: Section<'a>,
    edges: Vec<Edge>,
    problems: Vec<String>,
    condition: Option<String>,
}

impl<'a> Declare<'a> {
    /// A declaration of stage `stage` from its section `section`.
    pub fn new(stage: &'a str, section: Section<'a>) -> Self {
        Self {
            stage,
            section,
            edges: Vec::new(),
            problems: Vec::new(),
            condition: None,
        }
    }

    /// The stage name, as its section spells it.
    pub fn stage(&self) -> &str {
        self.stage
    }

    /// An option of the section, trimmed; `None` when unset or empty. A value the
    /// configuration cannot read is a problem.
    pub fn option(&mut self, name: &str) -> Option<String> {
        match self.section.string_opt(name) {
            Ok(v) => v.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()),
            Err(e) => {
                self.problems.push(e.to_string());
                None
            }
        }
    }

    /// An edge to `target`, named by `option`.
    pub fn edge(
        &mut self,
        option: &'static str,
        target: impl Into<String>,
        kind: EdgeKind,
        label: Option<&str>,
    ) {
        self.edges.push(Edge {
            option,
            target: target.into(),
            kind,
            label: label.map(str::to_owned),
        });
    }

    /// A branch to `target`, named by `option`, labelled `label`.
    pub fn branch(&mut self, option: &'static str, target: impl Into<String>, label: &str) {
        self.edge(option, target, EdgeKind::Branch, Some(label));
    }

    /// What the stage would refuse, or an operator should know (`text` follows the section
    /// name: `has no THEN`).
    pub fn problem(&mut self, text: impl std::fmt::Display) {
        self.problems
            .push(format!("[{}] {text}", self.section.name()));
    }

    /// The condition the stage decides on, shown beside it (an `if` stage's CONDITION).
    pub fn condition(&mut self, condition: String) {
        self.condition = Some(condition);
    }

    /// The default declaration: the NEXT_STAGE edge, when set.
    pub fn next(&mut self) {
        if let Some(t) = self.option(NEXT_STAGE) {
            self.edge(NEXT_STAGE, t, EdgeKind::Next, None);
        }
    }
}

/// The option every stage advances by.
pub const NEXT_STAGE: &str = "NEXT_STAGE";

/// The option every stage returns a message from.
pub const BOUNCE_STAGE: &str = "BOUNCE_STAGE";

/// The NEXT_STAGE of a section, `None` when unset or empty.
pub fn next_stage(section: &Section<'_>) -> Result<Option<String>, ConfigError> {
    Ok(section
        .string_opt(NEXT_STAGE)?
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty()))
}

/// The BOUNCE_STAGE of a section, trimmed; `None` when unset or empty.
pub fn bounce_stage(section: &Section<'_>) -> Result<Option<String>, ConfigError> {
    Ok(section
        .string_opt(BOUNCE_STAGE)?
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty()))
}

/// One program's declaration, as the table the root package builds holds it.
#[derive(Debug, Clone, Copy)]
pub struct StageEdges {
    /// The program (`[stage-*] PROGRAM`, as [`program_name`] reads it).
    pub program: &'static str,
    pub edges: fn(&mut Declare<'_>),
}

impl StageEdges {
    /// The row of stage program `S`.
    pub const fn of<S: Stage>() -> Self {
        Self {
            program: S::PROGRAM,
            edges: S::edges,
        }
    }
}

/// One stage section and what it declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// As the section spells it (the name rows carry in `workqueue.stage`).
    pub stage: String,
    /// Its PROGRAM, as written.
    pub program: Option<String>,
    /// Its edges, BOUNCE_STAGE last.
    pub edges: Vec<Edge>,
    /// Its CONDITION, for a stage that decides on one.
    pub condition: Option<String>,
    /// What a worker would refuse, each naming the section, option and value.
    pub problems: Vec<String>,
}

/// Every `[stage-<name>]` section of `cfg`, in the order `Config::sections` gives, with the edges its
/// program declares (by `table`, else by the default rule: NEXT_STAGE) and its BOUNCE_STAGE.
pub fn declared(cfg: &Config, table: &[StageEdges]) -> Vec<Declared> {
    cfg.stage_names()
        .map(|stage| declare(cfg, &stage, table))
        .collect()
}

fn declare(cfg: &Config, stage: &StageName, table: &[StageEdges]) -> Declared {
    let mut d = Declare::new(stage, cfg.stage_section(stage));
    let program = d.option("PROGRAM");
    if program.is_none() {
        d.problem("has no PROGRAM");
    }
    let name = program.as_deref().map(program_name).unwrap_or_default();
    match table.iter().find(|row| row.program == name) {
        Some(row) => (row.edges)(&mut d),
        None => d.next(),
    }
    if let Some(t) = d.option(BOUNCE_STAGE) {
        d.edge(BOUNCE_STAGE, t, EdgeKind::Bounce, None);
    }
    Declared {
        stage: stage.to_string(),
        program,
        edges: d.edges,
        condition: d.condition,
        problems: d.problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn branching(d: &mut Declare<'_>) {
        if let Some(t) = d.option("LEFT") {
            d.branch("LEFT", t, "left");
        } else {
            d.problem("has no LEFT");
        }
    }

    const TABLE: &[StageEdges] = &[StageEdges {
        program: "branching",
        edges: branching,
    }];

    #[test]
    fn a_program_in_the_table_declares_its_own_edges_and_others_follow_next_stage() {
        let cfg = Config::from_str_named(
            "[stage-init]\nPROGRAM = /usr/libexec/branching\nLEFT = a\nNEXT_STAGE = ignored\n\
             BOUNCE_STAGE = b\n[stage-a]\nPROGRAM = other\nNEXT_STAGE = \" b \"\n\
             [stage-b]\n[stage-c]\nPROGRAM = branching\n",
            "t.conf",
        )
        .unwrap();
        let got = declared(&cfg, TABLE);
        let lines: Vec<String> = got
            .iter()
            .map(|d| {
                let edges: Vec<String> = d
                    .edges
                    .iter()
                    .map(|e| format!("{}:{:?}:{}:{:?}", e.option, e.kind, e.target, e.label))
                    .collect();
                format!("{} {} {:?}", d.stage, edges.join(" "), d.problems)
            })
            .collect();
        assert_eq!(
            lines,
            [
                "a NEXT_STAGE:Next:b:None []",
                "b  [\"[stage-b] has no PROGRAM\"]",
                "c  [\"[stage-c] has no LEFT\"]",
                "init LEFT:Branch:a:Some(\"left\") BOUNCE_STAGE:Bounce:b:None []",
            ]
        );
    }

    #[test]
    fn the_worker_sends_where_the_graph_draws() {
        // A stage's own settings read NEXT_STAGE and BOUNCE_STAGE through the graph's readers:
        // a quoted value with spaces is the stage the graph shows, an empty one is none.
        let cfg = Config::from_str_named(
            "[stage-a]\nPROGRAM = other\nNEXT_STAGE = \" b \"\nBOUNCE_STAGE = \"\"\n\
             [stage-b]\nPROGRAM = other\n",
            "t.conf",
        )
        .unwrap();
        let s = crate::stage::StageOptions::from_config(&cfg, "a").unwrap();
        assert_eq!(s.next_stage.as_deref(), Some("b"));
        assert_eq!(s.bounce_stage, None);
        let graph = declared(&cfg, &[]);
        assert_eq!(graph[0].edges.len(), 1);
        assert_eq!(graph[0].edges[0].target, "b");
    }
}
