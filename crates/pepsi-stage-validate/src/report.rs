//! What a validation found: each problem with its severity and who found it (a program's
//! parser or the rules of the stage graph), and the counts of what was checked. Pure.

use std::fmt;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// A program would refuse the configuration, or mail would stop where nothing takes it:
    /// pepsi-config's `check` fails, the dispatcher does not start.
    Error,
    /// Worth an operator's look, but nothing refuses it.
    Warning,
}

/// Who found a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A program's own parser (`pepsi_conf::config::ProgramCheck`), by the program's name.
    Program(&'static str),
    /// The rules of the stage graph, which no single program sees whole.
    Graph,
}

impl Source {
    /// The program whose parser found it; `None` for the graph.
    pub fn program(&self) -> Option<&'static str> {
        match self {
            Source::Program(p) => Some(p),
            Source::Graph => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Program(p) => f.write_str(p),
            Source::Graph => f.write_str("stage graph"),
        }
    }
}

/// One problem; its message names the section, the option and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    pub source: Source,
    pub message: String,
}

impl Problem {
    pub(crate) fn error(source: Source, message: impl Into<String>) -> Problem {
        Problem {
            severity: Severity::Error,
            source,
            message: message.into(),
        }
    }

    pub(crate) fn warning(source: Source, message: impl Into<String>) -> Problem {
        Problem {
            severity: Severity::Warning,
            source,
            message: message.into(),
        }
    }
}

/// `<source>: <message>`, as `pepsi-dispatch: [pepsi-dispatch] POLL_INTERVAL ...` or
/// `stage graph: [stage-aliases] NEXT_STAGE = whitelsit: no [stage-whitelsit] section`.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source, self.message)
    }
}

/// Everything a validation found, in the order found: the parsers' errors first (in the
/// order of the table), then the graph's, section by section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub(crate) problems: Vec<Problem>,
    pub(crate) programs: usize,
    pub(crate) stages: usize,
}

impl Report {
    /// Every problem, errors and warnings, in the order found.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.of(Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.of(Severity::Warning)
    }

    /// No error: every program starts with the configuration and the graph is whole.
    pub fn is_ok(&self) -> bool {
        self.errors().next().is_none()
    }

    /// How many programs' parsers ran.
    pub fn programs_checked(&self) -> usize {
        self.programs
    }

    /// How many `[stage-*]` sections the graph holds.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// One line: what was checked and how many errors and warnings it found.
    pub fn summary(&self) -> String {
        let plural = |n: usize, one: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {one}s")
            }
        };
        // A judge of the graph alone runs no parser: no "0 programs".
        let checked = match self.programs {
            0 => plural(self.stages, "stage"),
            n => format!(
                "{} and {}",
                plural(n, "program"),
                plural(self.stages, "stage")
            ),
        };
        format!(
            "{checked} checked: {}, {}",
            plural(self.errors().count(), "error"),
            plural(self.warnings().count(), "warning"),
        )
    }

    fn of(&self, severity: Severity) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(move |p| p.severity == severity)
    }
}

/// One line per problem, errors first: `error: <problem>`, `warning: <problem>`. Nothing for
/// a report without problems.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.errors() {
            writeln!(f, "error: {p}")?;
        }
        for p in self.warnings() {
            writeln!(f, "warning: {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_first_and_each_line_names_its_source() {
        let report = Report {
            problems: vec![
                Problem::warning(Source::Graph, "[stage-old] is reached by nothing"),
                Problem::error(Source::Program("pepsi-dispatch"), "POLL_INTERVAL = soon"),
                Problem::error(
                    Source::Graph,
                    "[stage-a] NEXT_STAGE = b: no [stage-b] section",
                ),
            ],
            programs: 1,
            stages: 2,
        };
        assert!(!report.is_ok());
        assert_eq!(
            report.to_string(),
            "error: pepsi-dispatch: POLL_INTERVAL = soon\n\
             error: stage graph: [stage-a] NEXT_STAGE = b: no [stage-b] section\n\
             warning: stage graph: [stage-old] is reached by nothing\n"
        );
        assert_eq!(
            report.summary(),
            "1 program and 2 stages checked: 2 errors, 1 warning"
        );
        let warned = Report {
            problems: vec![report.problems[0].clone()],
            ..Report::default()
        };
        assert!(warned.is_ok());
        assert_eq!(warned.summary(), "0 stages checked: 0 errors, 1 warning");
        assert_eq!(Report::default().to_string(), "");
    }
}
