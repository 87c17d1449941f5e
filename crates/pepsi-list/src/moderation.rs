//! What moderation from the terminal decides before it touches the database: the stage a
//! held post goes back to (`approve`) and the stage a rejected one is returned from
//! (`reject`), both read from the configuration; the `--reason` of a rejection and a ban;
//! and a ban's pattern. Pure, no I/O: whether a regular expression compiles is
//! PostgreSQL's answer (`store::check_regex`), since the list stage matches it there; the
//! state a rejected post's DSN carries is `pepsi.list_held_reject`'s (procedures.sql).

use pepsi_conf::config::Config;
use pepsi_contract::stage::StageOptions;
use pepsi_contract::stage::edges;

/// The program of the list stage: approved posts go back to the stage that runs it.
pub const LIST_PROGRAM: &str = "pepsi-stage-list";

/// The most characters of a `--reason` (it becomes a line of a DSN, or of a ban's row).
pub const MAX_REASON_CHARS: usize = 300;

/// The shortest and longest ban pattern (`list_ban.pattern`'s CHECK).
pub const PATTERN_CHARS: (usize, usize) = (3, 500);

/// Why no stage could be chosen: input the operator must change (`--stage`), or a
/// configuration without a list stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoStage {
    /// Exit 2: the operator must say which (or named one that is not a list stage).
    Usage(String),
    /// Exit 1: nothing to inject at.
    Missing(String),
}

/// The list stage a held post goes back to: `given` (`--stage NAME`), which must be a
/// stage whose PROGRAM is pepsi-stage-list, else the only such stage.
pub fn list_stage(cfg: &Config, given: Option<&str>) -> Result<String, NoStage> {
    let stages = StageOptions::stages_of(cfg, LIST_PROGRAM);
    if let Some(name) = given {
        return match stages.iter().find(|s| s.eq_ignore_ascii_case(name)) {
            Some(s) => Ok(s.to_string()),
            None => Err(NoStage::Usage(format!(
                "--stage {name}: there is no [stage-{name}] whose PROGRAM is {LIST_PROGRAM}{}",
                listed(&stages)
            ))),
        };
    }
    match stages.as_slice() {
        [one] => Ok(one.to_string()),
        [] => Err(NoStage::Missing(format!(
            "{}: no [stage-*] section runs {LIST_PROGRAM}: there is no list stage to send \
             the post to",
            cfg.file().display()
        ))),
        _ => Err(NoStage::Usage(format!(
            "{} stages run {LIST_PROGRAM}{}: say which with --stage NAME",
            stages.len(),
            listed(&stages)
        ))),
    }
}

fn listed(stages: &[impl std::fmt::Display]) -> String {
    if stages.is_empty() {
        return String::new();
    }
    let names: Vec<String> = stages.iter().map(ToString::to_string).collect();
    format!(" ({})", names.join(", "))
}

/// Where a post rejected at list stage `stage` is returned from: the stage's BOUNCE_STAGE,
/// else `[pepsi] BOUNCE_STAGE`; it must be a configured stage.
pub fn bounce_stage(cfg: &Config, stage: &str) -> Result<String, String> {
    let own = edges::bounce_stage(&cfg.stage_section_named(stage)).map_err(|e| e.to_string())?;
    let target = match own {
        Some(t) => t,
        None => edges::bounce_stage(&cfg.section("pepsi"))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "neither [stage-{stage}] nor [pepsi] has a BOUNCE_STAGE: nowhere to \
                     return the rejected post from"
                )
            })?,
    };
    match cfg.stage(&target) {
        Some(s) => Ok(s.to_string()),
        None => Err(format!(
            "BOUNCE_STAGE = {target} (for [stage-{stage}]), but there is no [stage-{target}] \
             section"
        )),
    }
}

/// A `--reason` as stored: trimmed, one line, at most `MAX_REASON_CHARS` characters.
pub fn reason(text: &str) -> Result<String, String> {
    let t = text.trim();
    if t.chars().count() > MAX_REASON_CHARS || t.chars().any(char::is_control) {
        return Err(format!(
            "--reason {text:?} is not valid: text of at most {MAX_REASON_CHARS} characters, \
             on one line"
        ));
    }
    Ok(t.to_owned())
}

/// A ban pattern as given: a regular expression (it starts with `^`), or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Matched without regard to case against the sender; PostgreSQL must compile it.
    Regex(String),
    /// Compared with the sender, lower case.
    Address(String),
}

impl Pattern {
    /// The text stored in `list_ban.pattern`.
    pub fn as_str(&self) -> &str {
        match self {
            Pattern::Regex(p) | Pattern::Address(p) => p,
        }
    }
}

/// Reads a ban pattern: one starting with `^` is a POSIX regular expression (of 3 to 500
/// characters, one line); anything else must be an address, stored lower case.
pub fn pattern(text: &str) -> Result<Pattern, String> {
    if text.starts_with('^') {
        let n = text.chars().count();
        if n < PATTERN_CHARS.0 || n > PATTERN_CHARS.1 || text.chars().any(char::is_control) {
            return Err(format!(
                "ban pattern {text:?}: a regular expression is {} to {} characters on one line",
                PATTERN_CHARS.0, PATTERN_CHARS.1
            ));
        }
        return Ok(Pattern::Regex(text.to_owned()));
    }
    crate::names::member_address(text)
        .map(Pattern::Address)
        .map_err(|e| format!("ban pattern: {e} (a regular expression starts with ^)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "t.conf").unwrap()
    }

    #[test]
    fn the_list_stage_is_the_one_that_runs_the_program_table() {
        let one = "[stage-lists]\nPROGRAM = pepsi-stage-list\nBOUNCE_STAGE = bounce\n\
                   [stage-bounce]\nPROGRAM = pepsi-stage-bounce\n";
        let two = "[stage-lists]\nPROGRAM = pepsi-stage-list\n\
                   [stage-news]\nPROGRAM = /usr/lib/pepsi/pepsi-stage-list\n";
        let none = "[stage-bounce]\nPROGRAM = pepsi-stage-bounce\n";
        let cases: &[(&str, Option<&str>, Result<&str, &str>)] = &[
            (one, None, Ok("lists")),
            (one, Some("LISTS"), Ok("lists")),
            (
                one,
                Some("bounce"),
                Err(
                    "usage: --stage bounce: there is no [stage-bounce] whose PROGRAM is pepsi-stage-list (lists)",
                ),
            ),
            (two, Some("news"), Ok("news")),
            (
                two,
                None,
                Err(
                    "usage: 2 stages run pepsi-stage-list (lists, news): say which with --stage NAME",
                ),
            ),
            (
                none,
                None,
                Err("missing: t.conf: no [stage-*] section runs pepsi-stage-list"),
            ),
        ];
        for (text, given, want) in cases {
            let got = list_stage(&cfg(text), *given).map_err(|e| match e {
                NoStage::Usage(m) => format!("usage: {m}"),
                NoStage::Missing(m) => format!("missing: {m}"),
            });
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{given:?}"),
                (Err(g), Err(w)) => assert!(g.starts_with(w), "{given:?}: {g}"),
                (g, w) => panic!("{given:?}: {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn a_rejection_returns_from_the_list_stages_bounce_stage_table() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (
                "[stage-lists]\nPROGRAM = x\nBOUNCE_STAGE = bounce\n[stage-bounce]\nPROGRAM = y\n",
                Ok("bounce"),
            ),
            (
                "[pepsi]\nBOUNCE_STAGE = dsn\n[stage-lists]\nPROGRAM = x\n[stage-dsn]\nPROGRAM = y\n",
                Ok("dsn"),
            ),
            (
                "[pepsi]\nBOUNCE_STAGE = dsn\n[stage-lists]\nPROGRAM = x\nBOUNCE_STAGE = own\n\
                 [stage-own]\nPROGRAM = y\n[stage-dsn]\nPROGRAM = y\n",
                Ok("own"),
            ),
            (
                "[stage-lists]\nPROGRAM = x\n",
                Err("neither [stage-lists] nor [pepsi] has a BOUNCE_STAGE"),
            ),
            (
                "[stage-lists]\nPROGRAM = x\nBOUNCE_STAGE = gone\n",
                Err("BOUNCE_STAGE = gone (for [stage-lists]), but there is no [stage-gone]"),
            ),
        ];
        for (text, want) in cases {
            let got = bounce_stage(&cfg(text), "lists");
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{text}"),
                (Err(g), Err(w)) => assert!(g.starts_with(w), "{text}: {g}"),
                (g, w) => panic!("{text}: {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn reasons_and_patterns_table() {
        let reasons: &[(&str, Result<&str, ()>)] = &[
            ("  off topic ", Ok("off topic")),
            ("", Ok("")),
            ("two\nlines", Err(())),
        ];
        for (text, want) in reasons {
            assert_eq!(
                reason(text).map_err(|_| ()),
                want.map(str::to_owned),
                "{text:?}"
            );
        }
        assert!(reason(&"x".repeat(MAX_REASON_CHARS + 1)).is_err());

        let patterns: &[(&str, Result<Pattern, &str>)] = &[
            (
                "^.*@spam\\.example$",
                Ok(Pattern::Regex("^.*@spam\\.example$".into())),
            ),
            (
                "Bob@Example.NET",
                Ok(Pattern::Address("bob@example.net".into())),
            ),
            ("^a", Err("a regular expression is 3 to 500 characters")),
            ("nobody", Err("ban pattern: ")),
            ("^a\nb", Err("on one line")),
        ];
        for (text, want) in patterns {
            match (pattern(text), want) {
                (Ok(g), Ok(w)) => assert_eq!(&g, w, "{text:?}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "{text:?}: {g}"),
                (g, w) => panic!("{text:?}: {g:?}, want {w:?}"),
            }
        }
        assert!(pattern(&format!("^{}", "a".repeat(500))).is_err());
    }
}
