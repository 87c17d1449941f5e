//! Stage names and the `[stage-<name>]` sections they select: the one place a stage's
//! section name is built from its name, and the one rule a stage name follows.
//!
//! A stage name is what can be written as `[stage-<name>]` and read back as the same name:
//! not empty, without `[`, `]` or a line break, and without whitespace at either end (a
//! section header is trimmed, and so is an option value that names a stage). Like section
//! names, stage names match in any letter case: `Relay` and `relay` are one stage.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::str::FromStr;

use super::{Config, Section};

/// The prefix of every stage section's name, matched in any letter case.
const PREFIX: &str = "stage-";

/// The name of a stage, e.g. `relay-to-maildir`: the `<name>` of its `[stage-<name>]`
/// section, the value of a `NEXT_STAGE`, the `stage` of a queue row.
///
/// Validated when built ([`StageName::new`]); kept as written, compared, hashed and ordered
/// in any letter case, as the configuration matches sections. Dereferences to the name as
/// written.
#[derive(Clone)]
pub struct StageName(String);

/// Why a text is not a stage name; the message names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a stage name: {reason}")]
pub struct StageNameError {
    pub text: String,
    pub reason: &'static str,
}

/// The name as written, where a `String` is kept (a queue row's `stage`, a `state` record).
impl From<&StageName> for String {
    fn from(name: &StageName) -> String {
        name.0.clone()
    }
}

impl From<StageName> for String {
    fn from(name: StageName) -> String {
        name.0
    }
}

impl StageName {
    /// `name` when it can name a `[stage-<name>]` section (see the module's rule).
    pub fn new(name: impl Into<String>) -> Result<StageName, StageNameError> {
        let name = name.into();
        match problem(&name) {
            None => Ok(StageName(name)),
            Some(reason) => Err(StageNameError { text: name, reason }),
        }
    }

    /// The stage a section serves: `<name>` of a `[stage-<name>]` section (the prefix in any
    /// letter case), or `None` for any other section.
    pub fn of_section(section: &str) -> Option<StageName> {
        let name = section
            .get(..PREFIX.len())
            .filter(|p| p.eq_ignore_ascii_case(PREFIX))
            .map(|_| &section[PREFIX.len()..])?;
        StageName::new(name).ok()
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name of the stage's section, `stage-<name>`.
    pub fn section_name(&self) -> String {
        section_name(&self.0)
    }
}

/// `stage-<name>`: the one place a stage section's name is built. For a name that arrives
/// as text and is not checked, as [`Config::stage_section_named`] looks it up; messages about
/// a stage's options name the section with it.
pub fn section_name(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// What keeps `name` from being a stage name, if anything.
fn problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.contains(['[', ']']) {
        Some("it holds [ or ], which end a section header")
    } else if name.contains(['\n', '\r']) {
        Some("it holds a line break")
    } else if name.trim() != name {
        Some("it begins or ends with whitespace")
    } else {
        None
    }
}

impl Deref for StageName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for StageName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl PartialEq for StageName {
    fn eq(&self, other: &Self) -> bool {
        self.0.eq_ignore_ascii_case(&other.0)
    }
}

impl Eq for StageName {}

impl Hash for StageName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for b in self.0.bytes() {
            state.write_u8(b.to_ascii_lowercase());
        }
        state.write_u8(0xff);
    }
}

impl Ord for StageName {
    fn cmp(&self, other: &Self) -> Ordering {
        let lower = |s: &StageName| {
            s.0.bytes()
                .map(|b| b.to_ascii_lowercase())
                .collect::<Vec<_>>()
        };
        lower(self).cmp(&lower(other))
    }
}

impl PartialOrd for StageName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for StageName {
    type Err = StageNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StageName::new(s)
    }
}

impl TryFrom<&str> for StageName {
    type Error = StageNameError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        StageName::new(s)
    }
}

impl TryFrom<String> for StageName {
    type Error = StageNameError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        StageName::new(s)
    }
}

impl Config {
    /// The stage's section, `[stage-<name>]`; one that does not exist reads as empty.
    pub fn stage_section(&self, stage: &StageName) -> Section<'_> {
        self.section(&stage.section_name())
    }

    /// `[stage-<name>]` of a stage named by text that was not checked (a function's
    /// argument, an option's value, a queue row), looked up as the text stands: a text that
    /// is no stage name finds no section a file can hold, so it reads as empty, and messages
    /// name the section as the text has it.
    pub fn stage_section_named(&self, name: &str) -> Section<'_> {
        self.section(&section_name(name))
    }

    /// Whether the configuration has a section for the stage.
    pub fn has_stage_section(&self, stage: &StageName) -> bool {
        self.has_section(&stage.section_name())
    }

    /// The stage `name` names, when it is a stage name and the configuration has its
    /// section: what an option naming a stage (`NEXT_STAGE`, `THEN`, `BOUNCE_STAGE`, …) is
    /// checked with.
    pub fn stage(&self, name: &str) -> Option<StageName> {
        StageName::new(name)
            .ok()
            .filter(|stage| self.has_stage_section(stage))
    }

    /// `[stage-<stage>] <option>` where it names the stage something is sent to (a reply, a
    /// challenge, a notice): `default` when unset or empty, the value trimmed; an error
    /// naming the file, the option and the value when the configuration has no section for
    /// the stage it names. `None` only when unset and without a default.
    pub fn stage_target(
        &self,
        stage: &str,
        option: &str,
        default: Option<&str>,
    ) -> anyhow::Result<Option<String>> {
        let target = self
            .stage_section_named(stage)
            .string_opt(option)?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .or_else(|| default.map(str::to_owned));
        if let Some(t) = &target
            && self.stage(t).is_none()
        {
            anyhow::bail!(
                "{}: [stage-{stage}] {option} = {t}: there is no [stage-{t}]",
                self.file().display()
            );
        }
        Ok(target)
    }

    /// `[stage-<stage>] <option>`, a duration that must be above zero, else `default`.
    pub fn stage_positive_duration(
        &self,
        stage: &str,
        option: &str,
        default: std::time::Duration,
    ) -> anyhow::Result<std::time::Duration> {
        match self.stage_section_named(stage).duration_opt(option)? {
            Some(d) if d.is_zero() => anyhow::bail!(
                "{}: [stage-{stage}] {option} must be above 0",
                self.file().display()
            ),
            Some(d) => Ok(d),
            None => Ok(default),
        }
    }

    /// The stages that have a section, each named as its section is written, in the order
    /// of [`Config::sections`].
    pub fn stage_names(&self) -> impl Iterator<Item = StageName> + '_ {
        self.sections().filter_map(StageName::of_section)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each text and what `StageName::new` makes of it: `ok` or the reason it is refused.
    #[test]
    fn stage_names_follow_the_section_header_rule() {
        let cases: &[(&str, &str)] = &[
            ("relay-to-maildir", "ok"),
            ("init", "ok"),
            ("Relay_2.b", "ok"),
            ("a b", "ok"),
            ("ünïcode", "ok"),
            ("", "it is empty"),
            ("a[b", "it holds [ or ], which end a section header"),
            ("a]", "it holds [ or ], which end a section header"),
            ("a\nb", "it holds a line break"),
            ("a\rb", "it holds a line break"),
            (" relay", "it begins or ends with whitespace"),
            ("relay\t", "it begins or ends with whitespace"),
        ];
        for (text, expected) in cases {
            let got = match StageName::new(*text) {
                Ok(name) => {
                    assert_eq!(name.as_str(), *text);
                    "ok".to_owned()
                }
                Err(e) => {
                    assert_eq!(e.text, *text);
                    e.reason.to_owned()
                }
            };
            assert_eq!(got, *expected, "text {text:?}");
        }
        assert_eq!(
            StageName::new("").unwrap_err().to_string(),
            "\"\" is not a stage name: it is empty"
        );
    }

    /// Each section name and the stage it serves, if any.
    #[test]
    fn the_stage_of_a_section() {
        let cases: &[(&str, Option<&str>)] = &[
            ("stage-relay", Some("relay")),
            ("STAGE-Relay", Some("Relay")),
            ("Stage-a-b", Some("a-b")),
            ("stage-", None),
            ("stage- x", None),
            ("stage", None),
            ("pepsi", None),
            ("stages-x", None),
            ("pepsi-dispatch", None),
        ];
        for (section, expected) in cases {
            let got = StageName::of_section(section);
            assert_eq!(got.as_deref(), *expected, "section {section:?}");
            if let Some(stage) = got {
                assert!(stage.section_name().eq_ignore_ascii_case(section));
            }
        }
    }

    #[test]
    fn stage_names_match_in_any_letter_case() {
        use std::collections::HashSet;
        let a = StageName::new("Relay").unwrap();
        let b = StageName::new("relay").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.cmp(&b), Ordering::Equal);
        assert_eq!(HashSet::from([a.clone(), b]).len(), 1);
        assert_ne!(a, StageName::new("relay2").unwrap());
        assert!(StageName::new("alpha").unwrap() < StageName::new("Beta").unwrap());
        assert_eq!(a.to_string(), "Relay");
    }

    #[test]
    fn sections_are_looked_up_by_stage_name() {
        let cfg = Config::from_str_named(
            "[stage-Relay]\nPROGRAM = r\n[stage-init]\nPROGRAM = i\n[pepsi]\nX = 1\n[stage-]\nY = 2\n",
            "t.conf",
        )
        .unwrap();
        let relay = StageName::new("relay").unwrap();
        assert_eq!(cfg.stage_section(&relay).name(), "stage-Relay");
        assert_eq!(cfg.stage_section(&relay).string("PROGRAM").unwrap(), "r");
        assert!(cfg.has_stage_section(&relay));
        let missing = StageName::new("gone").unwrap();
        assert!(!cfg.has_stage_section(&missing));
        assert_eq!(cfg.stage_section(&missing).name(), "stage-gone");
        assert!(!cfg.stage_section(&missing).has("PROGRAM"));

        let names: Vec<String> = cfg.stage_names().map(|n| n.to_string()).collect();
        assert_eq!(names, ["init", "Relay"]);

        let cases: &[(&str, Option<&str>)] = &[
            ("relay", Some("Relay")),
            ("INIT", Some("init")),
            ("gone", None),
            ("", None),
            ("a]b", None),
        ];
        for (text, expected) in cases {
            let got = cfg
                .stage(text)
                .map(|s| cfg.stage_section(&s).name().to_owned());
            let expected = expected.map(|n| [PREFIX, n].concat());
            assert_eq!(got, expected, "text {text:?}");
        }

        // Unchecked text: a valid name finds its section, any other text reads as empty
        // under the name it would have had.
        assert_eq!(
            cfg.stage_section_named("RELAY").string("PROGRAM").unwrap(),
            "r"
        );
        let odd = cfg.stage_section_named("a]b");
        assert_eq!(odd.name(), "stage-a]b");
        assert!(!odd.has("PROGRAM"));
        assert_eq!(
            odd.string("PROGRAM").unwrap_err().to_string(),
            "t.conf: [stage-a]b] PROGRAM is required but missing"
        );
    }
}
