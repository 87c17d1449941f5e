//! Checking a configuration the way the programs will read it: every program's own parser
//! (what it runs at start) over the configuration, the options they looked up noted
//! ([`Config::recording`]). An override is acceptable when it makes no parser fail that
//! did not fail before, and when some program reads the option it sets: a misspelt option
//! is refused rather than stored and silently ignored.
//!
//! Pure over the parsers it is given; the table of them is the root package's
//! (`pepsi::programs::CONFIG_CHECKS`), since only it links every program.

use super::overlay::is_connection_option;
use super::{Config, OverrideRow, ReadLog, Scope, is_file_only_option, is_protected_section};

/// Stage options read for the whole pipeline (by the dispatcher and the stage graph), never
/// per message: a `domain:` or `address:` override of one would mean nothing.
pub const GLOBAL_ONLY_OPTIONS: &[&str] = &[
    "NEXT_STAGE",
    "BOUNCE_STAGE",
    "ORIGINATE_SUCCESS_DSN",
    "MAIL_LOG",
    "PARALLELISM",
    "QUEUE_LIMIT",
    "MAX_MESSAGES",
    "IDLE_TIMEOUT",
    "MAX_RUNTIME",
    "ROUND_TIME",
    "LOAD",
    "ALLOW_FUSION",
    "MAIL_LOG_RETENTION",
];

/// Sections whose program reads them from the configuration file only, never with the
/// database overlay: an override there would be stored and have no effect.
/// (pepsi-httpd builds its settings before it connects: it listens, drops privileges and
/// decides who may scrape `/metrics` from the file alone; pepsi-telemetry-client never
/// connects to the database, and its SOCKET must be the one every sender reads.)
pub const FILE_READ_SECTIONS: &[&str] = &["pepsi-httpd", "pepsi-telemetry-client"];

/// One program's configuration parser: what it builds from the configuration at start,
/// without I/O beyond reading files the configuration names.
#[derive(Clone, Copy)]
pub struct ProgramCheck {
    /// The program, as messages name it.
    pub program: &'static str,
    pub check: fn(&Config) -> anyhow::Result<()>,
}

impl std::fmt::Debug for ProgramCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.program)
    }
}

/// What running every parser over a configuration found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// (program, its error with causes), in the order of the checks.
    pub errors: Vec<(&'static str, String)>,
    /// Every option any parser looked up.
    pub reads: ReadLog,
}

/// Runs every check over `cfg`, noting what they read.
pub fn check_all(cfg: &Config, checks: &[ProgramCheck]) -> Verdict {
    let (recording, reads) = cfg.recording();
    let errors = checks
        .iter()
        .filter_map(|c| {
            (c.check)(&recording)
                .err()
                .map(|e| (c.program, format!("{e:#}")))
        })
        .collect();
    Verdict { errors, reads }
}

/// Why an override was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The section or option may come from the files only.
    #[error("{0}")]
    FileOnly(String),
    /// A program would fail to start with it.
    #[error("{0}")]
    Breaks(String),
    /// No program reads the option.
    #[error("{0}")]
    Unread(String),
    /// The option cannot differ by domain or address.
    #[error("{0}")]
    Unscoped(String),
}

/// Whether `row` may be added to `base` (the files with the overrides already stored for
/// the row's scope). `force` accepts an option no parser looked up (one read only later,
/// per message), never one that breaks a parser or that the files own.
pub fn check_override(
    base: &Config,
    row: &OverrideRow,
    scope: &Scope,
    checks: &[ProgramCheck],
    force: bool,
) -> Result<(), Refusal> {
    let (section, option) = (row.section.trim(), row.option.trim());
    if is_protected_section(section) {
        return Err(Refusal::FileOnly(format!(
            "[{section}] is read from the configuration file only ([PATHS], [database] and the \
             listener sections are never taken from the database)"
        )));
    }
    if FILE_READ_SECTIONS
        .iter()
        .any(|f| f.eq_ignore_ascii_case(section))
    {
        return Err(Refusal::FileOnly(format!(
            "[{section}] is read from the configuration file only (its program reads no \
             database override)"
        )));
    }
    if is_connection_option(option) {
        return Err(Refusal::FileOnly(format!(
            "{option} decides where a stage connects and sends its credentials (a smarthost's \
             AUTH_PASSWORD, a count server's AUTH_TOKEN) and is read from the configuration \
             file only"
        )));
    }
    if is_file_only_option(option) {
        return Err(Refusal::FileOnly(format!(
            "{option} names a program, file, key or trust anchor and is read from the \
             configuration file only"
        )));
    }
    if *scope != Scope::Global {
        let is_stage = super::StageName::of_section(section).is_some();
        if !(is_stage || section.eq_ignore_ascii_case("pepsi")) {
            return Err(Refusal::Unscoped(format!(
                "[{section}] is read once for the whole deployment: only stage sections (and \
                 [pepsi]) take domain: or address: overrides"
            )));
        }
        if GLOBAL_ONLY_OPTIONS.contains(&option.to_ascii_uppercase().as_str()) {
            return Err(Refusal::Unscoped(format!(
                "{option} shapes the pipeline or its worker pools and is the same for every \
                 message: set it without --scope"
            )));
        }
    }
    let before = check_all(base, checks);
    let candidate = base.with_overrides(std::slice::from_ref(row), scope);
    let after = check_all(&candidate, checks);
    let new: Vec<String> = after
        .errors
        .iter()
        .filter(|e| !before.errors.contains(e))
        .map(|(program, error)| format!("{program}: {error}"))
        .collect();
    if !new.is_empty() {
        return Err(Refusal::Breaks(format!(
            "[{section}] {option} = {:?} would stop {}",
            row.value,
            new.join("; ")
        )));
    }
    if !force && !after.reads.was_read(section, option) {
        let known = after.reads.options_of(section);
        let hint = if known.is_empty() {
            format!("no program reads section [{section}] at all")
        } else {
            format!("the options read from [{section}]: {}", known.join(", "))
        };
        return Err(Refusal::Unread(format!(
            "no Pepsi program reads [{section}] {option} ({hint}); --force stores it anyway"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threshold(cfg: &Config) -> anyhow::Result<()> {
        let s = cfg.section("stage-spam");
        let t: u32 = s.number_opt("THRESHOLD")?.unwrap_or(5);
        anyhow::ensure!(t <= 10, "[stage-spam] THRESHOLD = {t} is over 10");
        s.string_opt("MODE")?;
        Ok(())
    }

    fn broken_before(cfg: &Config) -> anyhow::Result<()> {
        cfg.section("pepsi").number::<u32>("NEEDED")?;
        Ok(())
    }

    const CHECKS: &[ProgramCheck] = &[
        ProgramCheck {
            program: "spam",
            check: threshold,
        },
        ProgramCheck {
            program: "other",
            check: broken_before,
        },
    ];

    fn row(section: &str, option: &str, value: &str) -> OverrideRow {
        OverrideRow {
            scope: "global".into(),
            section: section.into(),
            option: option.into(),
            value: value.into(),
        }
    }

    #[test]
    fn overrides_are_refused_for_what_they_would_break_or_nobody_reads() {
        let base = Config::from_str_named("[stage-spam]\nTHRESHOLD = 5\n", "t.conf").unwrap();
        let cases: &[(OverrideRow, bool, Result<(), &str>)] = &[
            (row("stage-spam", "threshold", "7"), false, Ok(())),
            (row("stage-spam", "MODE", "tag"), false, Ok(())),
            (
                row("stage-spam", "THRESHOLD", "11"),
                false,
                Err("would stop spam: [stage-spam] THRESHOLD = 11 is over 10"),
            ),
            (
                row("stage-spam", "THRESHOLD", "lots"),
                false,
                Err("expected a whole number"),
            ),
            (
                row("stage-spam", "THRESHOLDD", "7"),
                false,
                Err(
                    "no Pepsi program reads [stage-spam] THRESHOLDD (the options read from [stage-spam]: MODE, THRESHOLD)",
                ),
            ),
            (row("stage-spam", "THRESHOLDD", "7"), true, Ok(())),
            (
                row("stage-nothing", "X", "1"),
                false,
                Err("no program reads section [stage-nothing] at all"),
            ),
            (
                row("database", "URL", "postgres://evil/"),
                true,
                Err("configuration file only"),
            ),
            (
                row("listener-mx", "ADDRESS", "0.0.0.0:25"),
                true,
                Err("configuration file only"),
            ),
            (
                row("stage-spam", "PROGRAM", "/tmp/x"),
                true,
                Err("configuration file only"),
            ),
        ];
        for (r, force, want) in cases {
            let got = check_override(&base, r, &Scope::Global, CHECKS, *force);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{r:?}: {e}"),
                (got, want) => panic!("{r:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_problem_already_there_does_not_block_an_unrelated_change() {
        // `other` fails on the base already (NEEDED is missing); a change to spam is judged
        // on what it changes.
        let base = Config::from_str_named("[stage-spam]\n", "t.conf").unwrap();
        assert!(check_all(&base, CHECKS).errors.len() == 1);
        check_override(
            &base,
            &row("stage-spam", "MODE", "x"),
            &Scope::Global,
            CHECKS,
            false,
        )
        .unwrap();
        // Setting the missing option is accepted and read.
        check_override(
            &base,
            &row("pepsi", "NEEDED", "3"),
            &Scope::Global,
            CHECKS,
            false,
        )
        .unwrap();
    }
}
