//! The effective configuration as an operator sees it (`pepsi-config show`, pepsi-httpd's
//! `GET /api/config/effective`): each option with its value as written, whether it is a
//! secret (then never shown) and the file line or override row it comes from. Pure over a
//! [`Config`] and the parser table it is given; it never prints a `secrets.d/` value.

use serde::Serialize;

use super::{Config, ProgramCheck, check_all};

/// One option as the configuration holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValueRow {
    pub section: String,
    pub option: String,
    /// Whether the files or an override set it (else the program's default applies).
    pub set: bool,
    /// The value as written, unexpanded; `None` when unset or secret.
    pub value: Option<String>,
    /// The value comes from `secrets.d/` and is not shown.
    pub secret: bool,
    /// `file:line`, or `database override scope=...`.
    pub origin: Option<String>,
}

impl ValueRow {
    pub fn of(cfg: &Config, section: &str, option: &str) -> ValueRow {
        let s = cfg.section(section);
        let name = s
            .options()
            .find(|o| o.eq_ignore_ascii_case(option))
            .unwrap_or(option)
            .to_owned();
        ValueRow {
            section: s.name().to_owned(),
            option: name,
            set: s.has(option),
            // raw_value never gives a secrets.d/ value.
            value: cfg.raw_value(section, option).map(str::to_owned),
            secret: cfg.is_secret(section, option),
            origin: s.origin(option).map(ToString::to_string),
        }
    }

    pub fn is(&self, section: &str, option: &str) -> bool {
        self.section.eq_ignore_ascii_case(section) && self.option.eq_ignore_ascii_case(option)
    }
}

/// What `show` found: the values, and each named program whose parser fails on `cfg`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShownValues {
    pub values: Vec<ValueRow>,
    /// (program, its error), for the programs asked about.
    pub problems: Vec<(&'static str, String)>,
}

/// The program `name` of `checks`, or an error listing the known ones.
pub fn program_check<'a>(
    checks: &'a [ProgramCheck],
    name: &str,
) -> Result<&'a ProgramCheck, String> {
    checks.iter().find(|c| c.program == name).ok_or_else(|| {
        let names: Vec<&str> = checks.iter().map(|c| c.program).collect();
        format!(
            "{name:?} is not a Pepsi program whose configuration is known (known: {})",
            names.join(", ")
        )
    })
}

/// The values of `cfg` to show. Without `programs`: every option set in the files or the
/// overrides; with them, exactly the options each program's parser looks up, set or not.
/// `sections` (any letter case) narrows either to those sections when not empty.
pub fn shown_values(cfg: &Config, programs: &[&ProgramCheck], sections: &[String]) -> ShownValues {
    let wanted = |section: &str| {
        sections.is_empty() || sections.iter().any(|s| s.eq_ignore_ascii_case(section))
    };
    let mut shown = ShownValues::default();
    if programs.is_empty() {
        for section in cfg.sections().filter(|s| wanted(s)) {
            for option in cfg.section(section).options() {
                shown.values.push(ValueRow::of(cfg, section, option));
            }
        }
        return shown;
    }
    for check in programs {
        let verdict = check_all(cfg, std::slice::from_ref(*check));
        shown.problems.extend(verdict.errors);
        for (section, option) in verdict.reads.all() {
            let name = cfg.section(&section).name().to_owned();
            if wanted(&name) && !shown.values.iter().any(|r| r.is(&name, &option)) {
                shown.values.push(ValueRow::of(cfg, &name, &option));
            }
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads_relay(cfg: &Config) -> anyhow::Result<()> {
        let s = cfg.section("stage-relay");
        s.number_opt::<u32>("PARALLELISM")?;
        s.string_opt("QUEUE_LIMIT")?;
        Ok(())
    }

    const CHECKS: &[ProgramCheck] = &[ProgramCheck {
        program: "relay",
        check: reads_relay,
    }];

    #[test]
    fn values_are_those_set_or_those_a_program_reads_with_their_origin() {
        let cfg = Config::from_str_named(
            "[stage-relay]\nPARALLELISM = 4\n[pepsi]\nHOSTNAME = mx.example\n",
            "t.conf",
        )
        .unwrap();
        let rows = [
            ValueRow::of(&cfg, "stage-relay", "parallelism"),
            ValueRow::of(&cfg, "stage-relay", "QUEUE_LIMIT"),
        ];
        assert_eq!(rows[0].option, "PARALLELISM");
        assert_eq!(rows[0].value.as_deref(), Some("4"));
        assert_eq!(rows[0].origin.as_deref(), Some("t.conf:2"));
        assert!(!rows[1].set && rows[1].value.is_none() && rows[1].origin.is_none());

        let all = shown_values(&cfg, &[], &[]);
        let names: Vec<&str> = all.values.iter().map(|r| r.option.as_str()).collect();
        assert_eq!(names, ["HOSTNAME", "PARALLELISM"], "sections in name order");
        let pepsi = shown_values(&cfg, &[], &["PEPSI".into()]);
        assert_eq!(pepsi.values.len(), 1);
        assert_eq!(pepsi.values[0].value.as_deref(), Some("mx.example"));

        let relay = program_check(CHECKS, "relay").unwrap();
        let read = shown_values(&cfg, &[relay], &[]);
        let names: Vec<(&str, bool)> = read
            .values
            .iter()
            .map(|r| (r.option.as_str(), r.set))
            .collect();
        assert_eq!(names, [("PARALLELISM", true), ("QUEUE_LIMIT", false)]);
        assert!(read.problems.is_empty());
        let bad = Config::from_str_named("[stage-relay]\nPARALLELISM = many\n", "t.conf").unwrap();
        let broken = shown_values(&bad, &[relay], &[]);
        assert_eq!(broken.problems.len(), 1);
        assert!(
            broken.problems[0].1.contains("many"),
            "{:?}",
            broken.problems
        );
        let e = program_check(CHECKS, "nope").unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("known: relay"), "{e}");
    }
}
