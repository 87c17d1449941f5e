//! Options read from one section, else from a fallback section: the one form of "this
//! stage's section, else `[pepsi]`, else the default".
//!
//! An option set in the first section is read there (and a bad value there is an error,
//! even when the fallback holds a good one); only an option the first section does not set
//! at all is read from the fallback. The default stays with the caller, as `unwrap_or`.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::{Config, ConfigError, Section, StageName};

/// The section the global fallbacks live in.
const GLOBAL: &str = "pepsi";

/// Two sections read as one: each option from `first` when it sets it, else from `then`.
/// Made with [`Section::or`] or [`Config::stage_or_global`].
#[derive(Debug, Clone)]
pub struct Layered<'a> {
    first: Section<'a>,
    then: Section<'a>,
}

impl<'a> Section<'a> {
    /// This section, and `fallback` for the options it does not set.
    pub fn or(&self, fallback: &Section<'a>) -> Layered<'a> {
        Layered {
            first: self.clone(),
            then: fallback.clone(),
        }
    }

    /// This section, and `[pepsi]` for the options it does not set.
    pub fn or_global(&self) -> Layered<'a> {
        self.or(&self.config.section(GLOBAL))
    }
}

impl Config {
    /// `[stage-<name>]`, and `[pepsi]` for the options it does not set.
    pub fn stage_or_global(&self, stage: &StageName) -> Layered<'_> {
        self.stage_section(stage).or_global()
    }
}

/// The `_opt` getters of [`Section`], each reading the section that sets the option.
macro_rules! layered_getters {
    ($($name:ident -> $ty:ty;)*) => {
        $(
            #[doc = concat!("[`Section::", stringify!($name), "`] of the section that sets the option.")]
            pub fn $name(&self, option: &str) -> Result<Option<$ty>, ConfigError> {
                self.section_for(option).$name(option)
            }
        )*
    };
}

impl<'a> Layered<'a> {
    /// The section an option is read from: the first when it sets the option, else the
    /// fallback.
    pub fn section_for(&self, option: &str) -> &Section<'a> {
        if self.first.has(option) {
            &self.first
        } else {
            &self.then
        }
    }

    layered_getters! {
        string_opt -> String;
        bool_opt -> bool;
        duration_opt -> Duration;
        size_opt -> u64;
        path_opt -> PathBuf;
        list_opt -> Vec<String>;
    }

    /// [`Section::number_opt`] of the section that sets the option.
    pub fn number_opt<T: FromStr>(&self, option: &str) -> Result<Option<T>, ConfigError> {
        self.section_for(option).number_opt(option)
    }

    /// [`Section::choice_opt`] of the section that sets the option.
    pub fn choice_opt(
        &self,
        option: &str,
        allowed: &[&str],
    ) -> Result<Option<String>, ConfigError> {
        self.section_for(option).choice_opt(option, allowed)
    }

    /// [`Section::parse_opt`] of the section that sets the option.
    pub fn parse_opt<T>(
        &self,
        option: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        self.section_for(option).parse_opt(option, parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_str_named(
            "[pepsi]\n\
             MAX_LIFETIME = 2d\n\
             RETRY_INITIAL = 5m\n\
             IPV6 = no\n\
             DNS_TIMEOUT = soon\n\
             BAD_GLOBAL = x\n\
             [stage-relay]\n\
             MAX_LIFETIME = 1d\n\
             IPV6 = maybe\n\
             DNS_TIMEOUT = 3s\n\
             BAD_GLOBAL = 4s\n",
            "t.conf",
        )
        .unwrap()
    }

    /// Each option and what the layered duration getter makes of it: the value and the
    /// section it came from, `none`, or the error.
    #[test]
    fn the_first_section_that_sets_an_option_decides() {
        let cfg = config();
        let relay = StageName::new("relay").unwrap();
        let layered = cfg.stage_or_global(&relay);
        let cases: &[(&str, &str)] = &[
            // Set in the stage: read there.
            ("MAX_LIFETIME", "ok 86400s from stage-relay"),
            // Set only in [pepsi]: read there.
            ("RETRY_INITIAL", "ok 300s from pepsi"),
            // Set in neither: none, and the caller's default applies.
            ("RETRY_FACTOR", "none from pepsi"),
            // A good value in the stage wins over a bad one in [pepsi], which is not read.
            ("DNS_TIMEOUT", "ok 3s from stage-relay"),
            ("BAD_GLOBAL", "ok 4s from stage-relay"),
        ];
        for (option, expected) in cases {
            let from = layered.section_for(option).name().to_owned();
            let got = match layered.duration_opt(option) {
                Ok(Some(d)) => format!("ok {d:?} from {from}"),
                Ok(None) => format!("none from {from}"),
                Err(e) => format!("err {e}"),
            };
            assert_eq!(got, *expected, "option {option}");
        }
    }

    /// A bad value in the section that sets the option is an error naming that section,
    /// even when the fallback holds a good value; a bad value in the fallback is an error
    /// only when the first section leaves the option unset.
    #[test]
    fn bad_values_are_reported_where_they_are_read() {
        let cfg = config();
        let relay = StageName::new("relay").unwrap();
        let layered = cfg.stage_or_global(&relay);
        assert_eq!(
            layered.bool_opt("IPV6").unwrap_err().to_string(),
            "t.conf:9: [stage-relay] IPV6 = \"maybe\": expected yes or no (also true/false, on/off, 1/0)"
        );
        let other = cfg.section("stage-other").or_global();
        assert_eq!(other.bool_opt("IPV6").unwrap(), Some(false));
        assert_eq!(
            other.duration_opt("DNS_TIMEOUT").unwrap_err().to_string(),
            format!(
                "t.conf:5: [pepsi] DNS_TIMEOUT = \"soon\": expected {}",
                super::super::value::DURATION_EXPECTED
            )
        );
    }

    /// Every getter reads the same section `section_for` names, and a recording
    /// configuration notes the fallback only when the first section leaves the option unset.
    #[test]
    fn getters_read_through_one_section_and_note_what_they_read() {
        let (cfg, log) = config().recording();
        let relay = StageName::new("relay").unwrap();
        let layered = cfg.stage_section(&relay).or(&cfg.section("pepsi"));
        assert_eq!(
            layered.string_opt("MAX_LIFETIME").unwrap().as_deref(),
            Some("1d")
        );
        assert_eq!(
            layered.string_opt("RETRY_INITIAL").unwrap().as_deref(),
            Some("5m")
        );
        assert_eq!(
            layered.list_opt("RETRY_INITIAL").unwrap(),
            Some(vec!["5m".to_owned()])
        );
        assert_eq!(layered.number_opt::<u32>("NOWHERE").unwrap(), None);
        assert_eq!(
            layered
                .choice_opt("IPV6", &["maybe", "no"])
                .unwrap()
                .as_deref(),
            Some("maybe")
        );
        assert_eq!(layered.parse_opt("IPV6", |v| Ok(v.len())).unwrap(), Some(5));
        assert!(log.was_read("stage-relay", "MAX_LIFETIME"));
        assert!(!log.was_read("pepsi", "MAX_LIFETIME"));
        assert!(log.was_read("stage-relay", "RETRY_INITIAL"));
        assert!(log.was_read("pepsi", "RETRY_INITIAL"));
        assert!(log.was_read("pepsi", "NOWHERE"));
    }
}
