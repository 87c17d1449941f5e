//! The rules of the stage graph, over the edges each stage program declares from its own
//! section (`pepsi_contract::stage::edges::declared`):
//!
//! - every `[stage-*]` section runs a stage program of this Pepsi: a PROGRAM in Pepsi's
//!   stage namespace (`pepsi-stage-*`) that no stage program has, or a Pepsi program that is
//!   no stage, is an error; a program of the site's own (any other name, the tests'
//!   `pepsi-test-stage`) is a warning, since nothing here can check its options; a section
//!   without PROGRAM is a warning (no worker takes what reaches it: it waits there);
//! - every stage an edge names (NEXT_STAGE, BOUNCE_STAGE, a routing stage's branches, where
//!   a stage sends a message it makes) has its section: an error otherwise;
//! - what a stage would refuse of its own edges (`if` without THEN, an unreadable value) is
//!   an error;
//! - the stage new mail enters at, [`ENTRY_STAGE`], has its section: an error otherwise;
//! - every stage is reached from it along some edge: a warning otherwise.
//!
//! Pure: never does I/O.

use std::collections::BTreeSet;

use pepsi_conf::config::Config;
use pepsi_contract::stage::edges::{self, NEXT_STAGE};
use pepsi_contract::stage::program_name;

use crate::Tables;
use crate::report::{Problem, Source};

/// The stage new mail enters at: the ingress and pepsi-sendmail store it there
/// (`pepsi.workqueue_add`), and the stages that make a message (vacation's replies, the
/// secretary's challenges, auto-pay's notices) send it there unless told otherwise.
pub const ENTRY_STAGE: &str = "init";

/// The prefix of every stage program's name: a PROGRAM with it that no row of the table
/// holds is a misspelt or retired Pepsi stage, not a program of the site's own.
const STAGE_PROGRAM_PREFIX: &str = "pepsi-stage-";

/// The graph's problems, section by section, then the entry's and the unreached stages';
/// and how many stage sections there are.
pub(crate) fn check(cfg: &Config, tables: &Tables) -> (Vec<Problem>, usize) {
    let error = |m: String| Problem::error(Source::Graph, m);
    let warning = |m: String| Problem::warning(Source::Graph, m);
    let mut problems = Vec::new();
    let declared = edges::declared(cfg, tables.edges);
    let stages: Vec<&str> = declared.iter().map(|d| d.stage.as_str()).collect();
    // (from, to), lower-case: stage names match in any letter case, as sections do.
    let mut arcs: Vec<(String, String)> = Vec::new();
    for d in &declared {
        let section = format!("[stage-{}]", d.stage);
        let no_program = format!("{section} has no PROGRAM");
        if let Some(configured) = &d.program {
            problems.extend(program(&section, configured, tables));
        }
        for p in &d.problems {
            if d.program.is_none() && *p == no_program {
                problems.push(warning(format!(
                    "{no_program}: no worker takes the messages that reach it, they wait \
                     there until moved by hand"
                )));
            } else {
                problems.push(error(p.clone()));
            }
        }
        for e in &d.edges {
            match cfg.stage(&e.target) {
                Some(to) => arcs.push((d.stage.to_ascii_lowercase(), to.to_ascii_lowercase())),
                None => problems.push(error(format!(
                    "{section} {} = {}: no [stage-{}] section{}",
                    e.option,
                    e.target,
                    e.target,
                    did_you_mean(&e.target, &stages)
                ))),
            }
        }
    }
    if stages.is_empty() {
        problems.push(warning(format!(
            "there is no [stage-*] section: the mail the ingress stores at stage \
             {ENTRY_STAGE} waits there"
        )));
    } else if cfg.stage(ENTRY_STAGE).is_none() {
        problems.push(error(format!(
            "there is no [stage-{ENTRY_STAGE}] section: the ingress and pepsi-sendmail store \
             new mail at stage {ENTRY_STAGE}{}",
            did_you_mean(ENTRY_STAGE, &stages)
        )));
    } else {
        let reached = reach(&arcs, ENTRY_STAGE);
        for stage in &stages {
            if !reached.contains(&stage.to_ascii_lowercase()) {
                problems.push(warning(format!(
                    "[stage-{stage}] is reached from [stage-{ENTRY_STAGE}] by no {NEXT_STAGE}, \
                     BOUNCE_STAGE or branch: only a message moved there by hand gets there"
                )));
            }
        }
    }
    (problems, stages.len())
}

/// What is wrong with a section's PROGRAM, if anything.
fn program(section: &str, configured: &str, tables: &Tables) -> Option<Problem> {
    let name = program_name(configured);
    if tables.edges.iter().any(|row| row.program == name) {
        return None;
    }
    if tables.checks.iter().any(|row| row.program == name) {
        return Some(Problem::error(
            Source::Graph,
            format!(
                "{section} PROGRAM = {configured}: {name} is a Pepsi program but not a stage \
                 program, it cannot take messages"
            ),
        ));
    }
    if name.starts_with(STAGE_PROGRAM_PREFIX) {
        let known: Vec<&str> = tables.edges.iter().map(|row| row.program).collect();
        return Some(Problem::error(
            Source::Graph,
            format!(
                "{section} PROGRAM = {configured}: this Pepsi has no stage program {name}{}",
                did_you_mean(name, &known)
            ),
        ));
    }
    Some(Problem::warning(
        Source::Graph,
        format!(
            "{section} PROGRAM = {configured}: not a stage program of this Pepsi, so its \
             options are not checked and its edges are read as {NEXT_STAGE} alone"
        ),
    ))
}

/// The stages (lower-case) reached from `entry` along `arcs`, `entry` included.
fn reach(arcs: &[(String, String)], entry: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::from([entry.to_ascii_lowercase()]);
    let mut todo = vec![entry.to_ascii_lowercase()];
    while let Some(at) = todo.pop() {
        for (_, to) in arcs.iter().filter(|(from, _)| *from == at) {
            if seen.insert(to.clone()) {
                todo.push(to.clone());
            }
        }
    }
    seen
}

/// ` (did you mean <name>?)` for the one of `known` closest to `text` when it differs by a
/// few letters (at most a third of them: a misspelling, not another name); else nothing.
fn did_you_mean(text: &str, known: &[&str]) -> String {
    let text = text.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (distance(&text, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d > 0 && d * 3 <= text.chars().count())
        .min()
        .map(|(_, k)| format!(" (did you mean {k}?)"))
        .unwrap_or_default()
}

/// The edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // d[i][j]: the distance between a[..i] and b[..j].
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Severity;
    use pepsi_conf::config::ProgramCheck;
    use pepsi_contract::stage::edges::{Declare, StageEdges};

    /// A routing program: THEN and ELSE, as `if` declares them.
    fn branching(d: &mut Declare<'_>) {
        match d.option("THEN") {
            Some(t) => d.branch("THEN", t, "then"),
            None => d.problem("has no THEN"),
        }
        if let Some(t) = d.option("ELSE") {
            d.branch("ELSE", t, "else");
        }
    }

    fn plain(d: &mut Declare<'_>) {
        d.next();
    }

    fn parses(_: &Config) -> anyhow::Result<()> {
        Ok(())
    }

    const TABLES: Tables = Tables {
        checks: &[ProgramCheck {
            program: "pepsi-ingress",
            check: parses,
        }],
        edges: &[
            StageEdges {
                program: "pepsi-stage-if",
                edges: branching,
            },
            StageEdges {
                program: "pepsi-stage-aliases",
                edges: plain,
            },
            StageEdges {
                program: "pepsi-stage-whitelist",
                edges: plain,
            },
            StageEdges {
                program: "pepsi-stage-discard",
                edges: plain,
            },
        ],
    };

    /// The problems the graph's rules find in `text`, one `E <message>` or `W <message>`
    /// each, against `want`.
    fn check_graph(text: &str, want: &[&str]) {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        let (problems, _) = check(&cfg, &TABLES);
        let got: Vec<String> = problems
            .iter()
            .map(|p| {
                assert_eq!(p.source, Source::Graph);
                let mark = match p.severity {
                    Severity::Error => "E",
                    Severity::Warning => "W",
                };
                format!("{mark} {}", p.message)
            })
            .collect();
        assert_eq!(got, want, "{text}");
    }

    const WHOLE: &str = "[stage-init]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = whitelist\n\
                         BOUNCE_STAGE = bounce\n\
                         [stage-whitelist]\nPROGRAM = /usr/libexec/pepsi/pepsi-stage-whitelist\n\
                         NEXT_STAGE = decide\n\
                         [stage-decide]\nPROGRAM = pepsi-stage-if\nTHEN = relay\nELSE = bounce\n\
                         [stage-relay]\nPROGRAM = pepsi-stage-discard\n\
                         [stage-bounce]\nPROGRAM = pepsi-stage-discard\n";

    #[test]
    fn a_whole_graph_has_no_problem() {
        check_graph(WHOLE, &[]);
        // Stage names match in any letter case, as sections do.
        check_graph(
            "[stage-INIT]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = Relay\n\
             [stage-relay]\nPROGRAM = pepsi-stage-discard\n",
            &[],
        );
    }

    #[test]
    fn dangling_edges_are_errors_naming_section_option_and_value() {
        check_graph(
            &WHOLE.replace("NEXT_STAGE = whitelist", "NEXT_STAGE = whitelsit"),
            &[
                "E [stage-init] NEXT_STAGE = whitelsit: no [stage-whitelsit] section \
                 (did you mean whitelist?)",
                // Sections in the order the configuration lists them (by name).
                "W [stage-decide] is reached from [stage-init] by no NEXT_STAGE, \
                 BOUNCE_STAGE or branch: only a message moved there by hand gets there",
                "W [stage-relay] is reached from [stage-init] by no NEXT_STAGE, \
                 BOUNCE_STAGE or branch: only a message moved there by hand gets there",
                "W [stage-whitelist] is reached from [stage-init] by no NEXT_STAGE, \
                 BOUNCE_STAGE or branch: only a message moved there by hand gets there",
            ],
        );
        check_graph(
            &WHOLE.replace("BOUNCE_STAGE = bounce", "BOUNCE_STAGE = nowhere"),
            &["E [stage-init] BOUNCE_STAGE = nowhere: no [stage-nowhere] section"],
        );
        check_graph(
            &WHOLE.replace("ELSE = bounce", "ELSE = b"),
            &["E [stage-decide] ELSE = b: no [stage-b] section"],
        );
    }

    #[test]
    fn programs_are_stage_programs_of_the_table() {
        check_graph(
            &WHOLE.replace(
                "[stage-relay]\nPROGRAM = pepsi-stage-discard",
                "[stage-relay]\nPROGRAM = /usr/libexec/pepsi-stage-dicsard -v",
            ),
            &[
                "E [stage-relay] PROGRAM = /usr/libexec/pepsi-stage-dicsard -v: this Pepsi has \
               no stage program pepsi-stage-dicsard (did you mean pepsi-stage-discard?)",
            ],
        );
        check_graph(
            &WHOLE.replace(
                "[stage-relay]\nPROGRAM = pepsi-stage-discard",
                "[stage-relay]\nPROGRAM = pepsi-ingress",
            ),
            &[
                "E [stage-relay] PROGRAM = pepsi-ingress: pepsi-ingress is a Pepsi program but \
               not a stage program, it cannot take messages",
            ],
        );
        check_graph(
            &WHOLE.replace(
                "[stage-relay]\nPROGRAM = pepsi-stage-discard",
                "[stage-relay]\nPROGRAM = /opt/site/filter\nNEXT_STAGE = bounce",
            ),
            &[
                "W [stage-relay] PROGRAM = /opt/site/filter: not a stage program of this Pepsi, \
               so its options are not checked and its edges are read as NEXT_STAGE alone",
            ],
        );
        // A section without PROGRAM holds what reaches it.
        check_graph(
            &WHOLE.replace(
                "[stage-relay]\nPROGRAM = pepsi-stage-discard\n",
                "[stage-relay]\n",
            ),
            &[
                "W [stage-relay] has no PROGRAM: no worker takes the messages that reach it, \
               they wait there until moved by hand",
            ],
        );
    }

    #[test]
    fn what_a_stage_refuses_of_its_own_edges_is_an_error() {
        check_graph(
            &WHOLE.replace("THEN = relay\n", ""),
            &[
                "E [stage-decide] has no THEN",
                "W [stage-relay] is reached from [stage-init] by no NEXT_STAGE, \
                 BOUNCE_STAGE or branch: only a message moved there by hand gets there",
            ],
        );
    }

    #[test]
    fn the_entry_stage_exists_and_reaches_every_stage() {
        check_graph(
            &WHOLE.replace("[stage-init]", "[stage-inti]"),
            &[
                "E there is no [stage-init] section: the ingress and pepsi-sendmail store new \
               mail at stage init (did you mean inti?)",
            ],
        );
        check_graph(
            &format!("{WHOLE}[stage-old]\nPROGRAM = pepsi-stage-discard\nNEXT_STAGE = relay\n"),
            &[
                "W [stage-old] is reached from [stage-init] by no NEXT_STAGE, BOUNCE_STAGE or \
               branch: only a message moved there by hand gets there",
            ],
        );
        // A stage reached only as a bounce target is reached.
        check_graph(
            "[stage-init]\nPROGRAM = pepsi-stage-discard\nBOUNCE_STAGE = b\n\
             [stage-b]\nPROGRAM = pepsi-stage-discard\n",
            &[],
        );
        check_graph(
            "[pepsi]\nHOSTNAME = mx.example\n",
            &[
                "W there is no [stage-*] section: the mail the ingress stores at stage init \
               waits there",
            ],
        );
    }

    #[test]
    fn did_you_mean_only_a_misspelling() {
        let known = ["whitelist", "relay", "a"];
        let cases = [
            ("whitelsit", " (did you mean whitelist?)"),
            ("relya", " (did you mean relay?)"),
            ("rely", " (did you mean relay?)"),
            ("b", ""),
            ("bounce", ""),
            ("RELAY", ""),
        ];
        for (text, want) in cases {
            assert_eq!(did_you_mean(text, &known), want, "{text}");
        }
    }
}
