//! pepsi-stage-validate: whether a configuration is one the programs will run with. Two
//! halves: every program's own parser over it (`pepsi_conf::config::check_all`, what each
//! runs at start), and the rules of the stage graph, which no single program sees whole
//! ([`graph`]: every `[stage-*]` section runs a stage program, every stage an edge names
//! has its section, the stage new mail enters at exists and reaches the others).
//!
//! pepsi-config's `check` and `set` (and so `pepsi-setup apply`, which runs `pepsi-config
//! check` on every candidate configuration), pepsi-httpd's configuration API and the
//! dispatcher at start all judge with [`validate`] and [`check_override`], so the setup
//! cannot write a configuration a program would refuse.
//!
//! Pure: no I/O of its own (a program's parser may read the files its configuration
//! names). It links no stage crate: the programs' parsers and their declarations of edges
//! come in as [`Tables`], the root package's (`pepsi::programs::VALIDATION`), the only
//! crate that links every program.

pub mod graph;
mod report;

use pepsi_conf::config::{Config, OverrideRow, ProgramCheck, Refusal, Scope, check_all};
use pepsi_contract::stage::edges::StageEdges;

pub use graph::ENTRY_STAGE;
pub use report::{Problem, Report, Severity, Source};

/// What a configuration is judged by: the root package's tables of programs.
#[derive(Debug, Clone, Copy)]
pub struct Tables {
    /// Every program's configuration parser (`pepsi::programs::CONFIG_CHECKS`); empty to
    /// judge the stage graph alone.
    pub checks: &'static [ProgramCheck],
    /// Every stage program's declaration of its edges (`pepsi::programs::STAGE_EDGES`):
    /// also the list of the stage programs there are.
    pub edges: &'static [StageEdges],
}

/// Every parser of `tables` over `cfg`, then the rules of the stage graph.
pub fn validate(cfg: &Config, tables: &Tables) -> Report {
    let verdict = check_all(cfg, tables.checks);
    let mut problems: Vec<Problem> = verdict
        .errors
        .into_iter()
        .map(|(program, error)| Problem::error(Source::Program(program), error))
        .collect();
    let (graph, stages) = graph::check(cfg, tables);
    problems.extend(graph);
    Report {
        problems,
        programs: tables.checks.len(),
        stages,
    }
}

/// Whether `row` may be added to `base` (the configuration with the overrides already
/// stored for the row's scope): `pepsi_conf::config::check_override` with the parsers of
/// `tables`, and no error of the stage graph that `base` did not have already (a dangling
/// NEXT_STAGE would stop the dispatcher at its next start). A graph error is
/// [`Refusal::Breaks`], as a parser's is.
pub fn check_override(
    base: &Config,
    row: &OverrideRow,
    scope: &Scope,
    tables: &Tables,
    force: bool,
) -> Result<(), Refusal> {
    pepsi_conf::config::check_override(base, row, scope, tables.checks, force)?;
    let graph_only = Tables {
        checks: &[],
        edges: tables.edges,
    };
    let before = validate(base, &graph_only);
    let candidate = base.with_overrides(std::slice::from_ref(row), scope);
    let after = validate(&candidate, &graph_only);
    let new: Vec<&str> = after
        .errors()
        .filter(|e| !before.errors().any(|b| b == *e))
        .map(|e| e.message.as_str())
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    Err(Refusal::Breaks(format!(
        "[{}] {} = {:?} would break the stage graph: {}",
        row.section.trim(),
        row.option.trim(),
        row.value,
        new.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_contract::stage::StageOptions;
    use pepsi_contract::stage::edges::Declare;

    fn plain(d: &mut Declare<'_>) {
        d.next();
    }

    fn dispatcher(cfg: &Config) -> anyhow::Result<()> {
        cfg.section("pepsi-dispatch")
            .duration_opt("POLL_INTERVAL")?;
        Ok(())
    }

    /// What every stage worker reads of its section (NEXT_STAGE, BOUNCE_STAGE, ...).
    fn stages(cfg: &Config) -> anyhow::Result<()> {
        for name in cfg.stage_names() {
            StageOptions::from_config(cfg, &name)?;
        }
        Ok(())
    }

    const TABLES: Tables = Tables {
        checks: &[
            ProgramCheck {
                program: "pepsi-dispatch",
                check: dispatcher,
            },
            ProgramCheck {
                program: "pepsi-stage-discard",
                check: stages,
            },
        ],
        edges: &[StageEdges {
            program: "pepsi-stage-discard",
            edges: plain,
        }],
    };

    const BASE: &str = "[stage-init]\nPROGRAM = pepsi-stage-discard\nNEXT_STAGE = relay\n\
                        [stage-relay]\nPROGRAM = pepsi-stage-discard\n";

    /// `validate` over `text`: its report's lines, each against the start of the line
    /// `want` has for it (a parser's message is its own, pepsi-conf's to test).
    fn check(text: &str, want: &[&str]) {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        let report = validate(&cfg, &TABLES);
        let text_report = report.to_string();
        let got: Vec<&str> = text_report.lines().collect();
        assert_eq!(got.len(), want.len(), "{text}: {got:#?}");
        for (line, want) in got.iter().zip(want) {
            assert!(line.starts_with(want), "{text}: {line:?}, wanted {want:?}");
        }
        let errors = want.iter().filter(|w| w.starts_with("error: ")).count();
        assert_eq!(report.errors().count(), errors, "{text}");
        assert_eq!(report.is_ok(), errors == 0, "{text}");
        assert_eq!(report.programs_checked(), 2);
        assert_eq!(report.stages(), cfg.stage_names().count());
    }

    #[test]
    fn the_parsers_errors_come_before_the_graphs() {
        let poll = "[pepsi-dispatch]\nPOLL_INTERVAL = soon\n";
        let gone = BASE.replace("NEXT_STAGE = relay", "NEXT_STAGE = rleay");
        let cases: &[(String, &[&str])] = &[
            (BASE.to_owned(), &[]),
            (
                format!("{poll}{BASE}"),
                &["error: pepsi-dispatch: t.conf:2: [pepsi-dispatch] POLL_INTERVAL = \"soon\": "],
            ),
            (
                format!("{poll}{gone}"),
                &[
                    "error: pepsi-dispatch: t.conf:2: [pepsi-dispatch] POLL_INTERVAL",
                    "error: stage graph: [stage-init] NEXT_STAGE = rleay: no [stage-rleay] \
                     section (did you mean relay?)",
                    "warning: stage graph: [stage-relay] is reached from [stage-init] by no \
                     NEXT_STAGE, BOUNCE_STAGE or branch: only a message moved there by hand \
                     gets there",
                ],
            ),
            (
                BASE.replace("NEXT_STAGE = relay", "NEXT_STAGE = \"\""),
                &["warning: stage graph: [stage-relay] is reached from [stage-init] by no "],
            ),
        ];
        for (text, want) in cases {
            check(text, want);
        }
    }

    fn row(section: &str, option: &str, value: &str) -> OverrideRow {
        OverrideRow {
            scope: "global".into(),
            section: section.into(),
            option: option.into(),
            value: value.into(),
        }
    }

    #[test]
    fn an_override_that_breaks_the_graph_is_refused() {
        let base = Config::from_str_named(BASE, "t.conf").unwrap();
        let cases: &[(OverrideRow, Result<(), &str>)] = &[
            (row("stage-init", "NEXT_STAGE", "relay"), Ok(())),
            (
                row("stage-init", "NEXT_STAGE", "rleay"),
                Err(
                    "[stage-init] NEXT_STAGE = \"rleay\" would break the stage graph: \
                     [stage-init] NEXT_STAGE = rleay: no [stage-rleay] section \
                     (did you mean relay?)",
                ),
            ),
            (
                row("stage-relay", "BOUNCE_STAGE", "bounce"),
                Err(
                    "would break the stage graph: [stage-relay] BOUNCE_STAGE = bounce: no \
                     [stage-bounce] section",
                ),
            ),
            // The parsers still judge first.
            (
                row("pepsi-dispatch", "POLL_INTERVAL", "soon"),
                Err("would stop pepsi-dispatch"),
            ),
        ];
        for (r, want) in cases {
            let got = check_override(&base, r, &Scope::Global, &TABLES, false);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(Refusal::Breaks(e)), Err(w)) => assert!(e.contains(w), "{r:?}: {e}"),
                (got, want) => panic!("{r:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_graph_error_already_there_does_not_block_an_unrelated_change() {
        let broken = BASE.replace("NEXT_STAGE = relay", "NEXT_STAGE = gone");
        let base = Config::from_str_named(&broken, "t.conf").unwrap();
        assert!(!validate(&base, &TABLES).is_ok());
        check_override(
            &base,
            &row("pepsi-dispatch", "POLL_INTERVAL", "2s"),
            &Scope::Global,
            &TABLES,
            false,
        )
        .unwrap();
        // And the change that mends it is accepted.
        check_override(
            &base,
            &row("stage-init", "NEXT_STAGE", "relay"),
            &Scope::Global,
            &TABLES,
            false,
        )
        .unwrap();
    }
}
