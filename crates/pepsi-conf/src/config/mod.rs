//! Configuration: INI files with `[PATHS]`, `$VAR` expansion, `@inline@` includes, `secrets.d/`
//! fragments, typed getters, and the rules of the database overlay of `pepsi.config_override`.
//!
//! Every program builds one [`Config`] at start ([`Config::load_default`]) and reads it through
//! [`Section`] getters whose errors name file, line, section, option and value. The operator's
//! guide is `docs/configuration.md`.
//!
//! Must never: take a protected section (`[PATHS]`, `[database]`, `[listener*]`) from the
//! database, let a database value read the process environment or a `secrets.d/` entry, accept
//! a world-readable secrets fragment, or print a value that came from one. Nothing here opens
//! the database: [`Config::with_overrides`] applies rows that `pepsi_contract::overlay` read.

mod check;
pub mod edit;
mod error;
mod expand;
mod layered;
mod overlay;
mod parse;
mod shown;
mod stage_name;
mod value;
pub use value::{MAX_ORIGIN, https_origin, parse_size};

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

pub use check::{
    FILE_READ_SECTIONS, GLOBAL_ONLY_OPTIONS, ProgramCheck, Refusal, Verdict, check_all,
    check_override,
};
pub use error::{ConfigError, ExpandProblem, ValueAt};
pub use layered::Layered;
pub use overlay::{
    CONNECTION_OPTIONS, FILE_ONLY_OPTIONS, OverrideRow, Scope, is_file_only_option,
    is_protected_section,
};
pub use shown::{ShownValues, ValueRow, program_check, shown_values};
pub use stage_name::{StageName, StageNameError, section_name as stage_section_name};

use expand::{Expander, Trust};
use parse::Loader;

/// Where the configuration is looked for when neither `-c` nor `PEPSI_CONFIG` names a file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pepsi/pepsi.conf";

/// The environment variable that names the configuration file when `-c` is not given.
pub const CONFIG_ENV: &str = "PEPSI_CONFIG";

/// Reads a duration written as in a configuration file (`90`, `30s`, `1h30m`, `2d`), so a
/// command-line option takes the same syntax; the error says what is expected.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    value::parse_duration(text)
}

/// The kernel's host name, else `localhost`: the fallback of every `HOSTNAME`-like option
/// (`[pepsi] HOSTNAME` and a program's own name options).
pub fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Identifies a program to the configuration and logging machinery; each program defines
/// one as `constants::CONFIG_SOURCE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigSource {
    /// The project, `pepsi`.
    pub project: &'static str,
    /// The component within the project, e.g. `stage-discard`.
    pub component: &'static str,
    /// The executable name, e.g. `pepsi-stage-discard`.
    pub exec: &'static str,
}

/// Where a value came from, shown at the start of every message about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A line of a configuration file (or of text loaded under that name).
    File { path: PathBuf, line: usize },
    /// A row of `pepsi.config_override`, e.g. `database override scope=domain:example.test`.
    Override { description: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
            Origin::Override { description } => f.write_str(description),
        }
    }
}

#[derive(Clone)]
struct Entry {
    /// The option name as last written, for messages.
    name: String,
    /// The value as written (quotes removed), not yet expanded.
    value: String,
    origin: Origin,
    /// Came from a `secrets.d/` fragment: never shown, never visible to database values.
    secret: bool,
}

#[derive(Clone)]
struct SectionData {
    /// The section name as first written, for messages.
    name: String,
    /// Keyed by the upper-cased option name.
    options: BTreeMap<String, Entry>,
}

/// A loaded configuration: sections of options, each value with its provenance.
///
/// Cheap to query, and immutable once built except through [`Config::with_overrides`], which
/// returns a new one. `Debug` lists names and origins but never values, so a configuration
/// can be logged without leaking a password.
#[derive(Clone)]
pub struct Config {
    /// The main file (or the name given to [`Config::from_str_named`]), named in messages
    /// about options that are missing altogether.
    file: PathBuf,
    /// Keyed by the upper-cased section name.
    sections: BTreeMap<String, SectionData>,
    /// Where option lookups are noted, when someone asked ([`Config::recording`]).
    reads: Option<ReadLog>,
}

/// The options looked up in a configuration since [`Config::recording`] made it: every
/// `(SECTION, OPTION)` any getter (or `has`, `origin`) asked for, upper-cased, whether or
/// not it was set. pepsi-config runs every program's parser on a candidate configuration
/// and refuses an override of an option none of them asked for.
#[derive(Debug, Clone, Default)]
pub struct ReadLog(std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>>);

impl ReadLog {
    fn note(&self, section: &str, option: &str) {
        if let Ok(mut set) = self.0.lock() {
            set.insert((section.to_ascii_uppercase(), option.to_ascii_uppercase()));
        }
    }

    /// Whether `option` of `section` (any letter case) was looked up.
    pub fn was_read(&self, section: &str, option: &str) -> bool {
        self.0.lock().is_ok_and(|set| {
            set.contains(&(section.to_ascii_uppercase(), option.to_ascii_uppercase()))
        })
    }

    /// Every `(SECTION, OPTION)` looked up, upper-cased, in order.
    pub fn all(&self) -> Vec<(String, String)> {
        self.0
            .lock()
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The options of `section` that were looked up, upper-cased, in order.
    pub fn options_of(&self, section: &str) -> Vec<String> {
        let upper = section.to_ascii_uppercase();
        self.0
            .lock()
            .map(|set| {
                set.iter()
                    .filter(|(s, _)| *s == upper)
                    .map(|(_, o)| o.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for section in self.sections.values() {
            for entry in section.options.values() {
                map.entry(
                    &format_args!("[{}] {}", section.name, entry.name),
                    &format_args!("{}", entry.origin),
                );
            }
        }
        map.finish()
    }
}

impl Config {
    /// A host-name option: `option` of `section` when set and not blank, else
    /// `[pepsi] HOSTNAME`, else the system's host name (trimmed). The one fallback of every
    /// program's own name options (HELO_NAME, HOSTNAME, AUTHSERV_ID, SRS_DOMAIN, …).
    pub fn name_option(&self, section: &Section<'_>, option: &str) -> Result<String, ConfigError> {
        let set = |v: Option<String>| v.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if let Some(name) = set(section.string_opt(option)?) {
            return Ok(name);
        }
        Ok(set(self.section("pepsi").string_opt("HOSTNAME")?).unwrap_or_else(system_hostname))
    }

    /// Loads the configuration from the file `-c/--config` named, else from `$PEPSI_CONFIG`,
    /// else from `/etc/pepsi/pepsi.conf`, then its `secrets.d/` fragments.
    pub fn load_default(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, chosen) = choose_location(explicit, std::env::var_os(CONFIG_ENV));
        match std::fs::metadata(&path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Err(ConfigError::NotFound { path, chosen })
            }
            _ => Config::load(&path),
        }
    }

    /// Loads `path` and its `@inline@` includes but no `secrets.d/` fragment: for a program
    /// any local user runs (pepsi-sendmail), which needs no secret and may not read them.
    pub fn load_without_secrets(path: &Path) -> Result<Config, ConfigError> {
        let mut config = Config::empty(path);
        Loader {
            config: &mut config,
            stack: Vec::new(),
        }
        .load_file(path, false)?;
        Ok(config)
    }

    /// Loads `path`, its `@inline@` includes, then every `*.conf` in its secrets directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let mut config = Config::empty(path);
        let mut loader = Loader {
            config: &mut config,
            stack: Vec::new(),
        };
        loader.load_file(path, false)?;
        loader.load_secrets(path)?;
        Ok(config)
    }

    /// Parses configuration text held in memory (tests, embedded defaults) under `name`, used
    /// in messages. `@inline@` paths are relative to the current directory; no secrets are read.
    pub fn from_str_named(text: &str, name: &str) -> Result<Config, ConfigError> {
        let mut config = Config::empty(Path::new(name));
        Loader {
            config: &mut config,
            stack: Vec::new(),
        }
        .load_text(text, Path::new(name), Path::new(""), false)?;
        Ok(config)
    }

    fn empty(file: &Path) -> Config {
        Config {
            file: file.to_owned(),
            sections: BTreeMap::new(),
            reads: None,
        }
    }

    /// A copy that notes every option looked up in it (and in its clones) in the returned
    /// log. Only for checking a configuration; programs never record.
    pub fn recording(&self) -> (Config, ReadLog) {
        let log = ReadLog::default();
        let mut config = self.clone();
        config.reads = Some(log.clone());
        (config, log)
    }

    /// Whether the option (any letter case) comes from a `secrets.d/` fragment: its value
    /// is never shown.
    pub fn is_secret(&self, section: &str, option: &str) -> bool {
        self.sections
            .get(&section.to_ascii_uppercase())
            .and_then(|d| d.options.get(&option.to_ascii_uppercase()))
            .is_some_and(|e| e.secret)
    }

    /// The value of an option as written (not expanded), unless it is a secret.
    pub fn raw_value(&self, section: &str, option: &str) -> Option<&str> {
        let entry = self
            .sections
            .get(&section.to_ascii_uppercase())?
            .options
            .get(&option.to_ascii_uppercase())?;
        (!entry.secret).then_some(entry.value.as_str())
    }

    /// The main file, or the name given to [`Config::from_str_named`].
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// A section by name, case-insensitive; a section that does not exist reads as empty.
    pub fn section(&self, name: &str) -> Section<'_> {
        let data = self.sections.get(&name.to_ascii_uppercase());
        Section {
            config: self,
            name: data.map_or_else(|| name.to_owned(), |d| d.name.clone()),
            data,
        }
    }

    /// The names of all sections, as first written, in case-insensitive order.
    pub fn sections(&self) -> impl Iterator<Item = &str> {
        self.sections.values().map(|s| s.name.as_str())
    }

    /// Whether a section of that name (case-insensitive) exists.
    pub fn has_section(&self, name: &str) -> bool {
        self.sections.contains_key(&name.to_ascii_uppercase())
    }

    /// Sets one value; a later call for the same option replaces the earlier one.
    fn set(&mut self, section: &str, option: &str, value: &str, origin: Origin) {
        self.sections
            .entry(section.to_ascii_uppercase())
            .or_insert_with(|| SectionData {
                name: section.to_owned(),
                options: BTreeMap::new(),
            })
            .options
            .insert(
                option.to_ascii_uppercase(),
                Entry {
                    name: option.to_owned(),
                    value: value.to_owned(),
                    origin,
                    secret: false,
                },
            );
    }
}

/// Picks the configuration file and says, for messages, how it was picked.
fn choose_location(
    explicit: Option<&Path>,
    env: Option<std::ffi::OsString>,
) -> (PathBuf, &'static str) {
    if let Some(path) = explicit {
        (path.to_owned(), "given with -c/--config")
    } else if let Some(path) = env.filter(|p| !p.is_empty()) {
        (
            PathBuf::from(path),
            "named by the PEPSI_CONFIG environment variable",
        )
    } else {
        (
            PathBuf::from(DEFAULT_CONFIG_PATH),
            "the default location; use -c/--config or PEPSI_CONFIG to choose another",
        )
    }
}

/// One section of a [`Config`]; obtained with [`Config::section`].
///
/// Every getter expands `$VAR` references first. A required getter fails when the option is
/// missing; its `_opt` form returns `Ok(None)` instead. Both fail when the value is present but
/// not of the right kind.
#[derive(Clone)]
pub struct Section<'a> {
    config: &'a Config,
    name: String,
    data: Option<&'a SectionData>,
}

impl fmt::Debug for Section<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Section")
            .field("name", &self.name)
            .field("options", &self.options().collect::<Vec<_>>())
            .finish()
    }
}

impl<'a> Section<'a> {
    /// The section name as written in the file (or as asked for, when it does not exist).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the option (case-insensitive) is set.
    pub fn has(&self, option: &str) -> bool {
        self.entry(option).is_some()
    }

    /// The option names, as last written, in case-insensitive order.
    pub fn options(&self) -> impl Iterator<Item = &'a str> + use<'a> {
        self.data
            .into_iter()
            .flat_map(|d| d.options.values().map(|e| e.name.as_str()))
    }

    /// Where the option's value came from, if it is set.
    pub fn origin(&self, option: &str) -> Option<&'a Origin> {
        self.entry(option).map(|e| &e.origin)
    }

    pub fn string(&self, option: &str) -> Result<String, ConfigError> {
        self.required(option, self.string_opt(option)?)
    }

    pub fn string_opt(&self, option: &str) -> Result<Option<String>, ConfigError> {
        self.typed(option, |v| Ok(v.to_owned()))
    }

    /// Any type that implements `FromStr`; the error says what range an integer type takes.
    pub fn number<T: FromStr>(&self, option: &str) -> Result<T, ConfigError> {
        self.required(option, self.number_opt(option)?)
    }

    pub fn number_opt<T: FromStr>(&self, option: &str) -> Result<Option<T>, ConfigError> {
        self.typed(option, value::parse_number::<T>)
    }

    /// `yes`/`no`, `true`/`false`, `on`/`off` or `1`/`0`, in any case.
    pub fn bool(&self, option: &str) -> Result<bool, ConfigError> {
        self.required(option, self.bool_opt(option)?)
    }

    pub fn bool_opt(&self, option: &str) -> Result<Option<bool>, ConfigError> {
        self.typed(option, value::parse_bool)
    }

    /// `250ms`, `30s`, `5m`, `2h`, `1d`, sums such as `1h30m` or `1h 30m`; a bare number is
    /// seconds.
    pub fn duration(&self, option: &str) -> Result<Duration, ConfigError> {
        self.required(option, self.duration_opt(option)?)
    }

    pub fn duration_opt(&self, option: &str) -> Result<Option<Duration>, ConfigError> {
        self.typed(option, value::parse_duration)
    }

    /// Bytes: a bare number, or one with `k`/`kb`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`,
    /// all binary multiples (`1k` = 1024).
    pub fn size(&self, option: &str) -> Result<u64, ConfigError> {
        self.required(option, self.size_opt(option)?)
    }

    pub fn size_opt(&self, option: &str) -> Result<Option<u64>, ConfigError> {
        self.typed(option, value::parse_size)
    }

    /// The expanded value as a path; an empty value is an error.
    pub fn path(&self, option: &str) -> Result<PathBuf, ConfigError> {
        self.required(option, self.path_opt(option)?)
    }

    pub fn path_opt(&self, option: &str) -> Result<Option<PathBuf>, ConfigError> {
        self.typed(option, value::parse_path)
    }

    /// Items separated by commas and/or whitespace; empty items are dropped.
    pub fn list(&self, option: &str) -> Result<Vec<String>, ConfigError> {
        self.required(option, self.list_opt(option)?)
    }

    pub fn list_opt(&self, option: &str) -> Result<Option<Vec<String>>, ConfigError> {
        self.typed(option, |v| Ok(value::parse_list(v)))
    }

    /// One of `allowed`, matched case-insensitively; returns the spelling from `allowed`.
    pub fn choice(&self, option: &str, allowed: &[&str]) -> Result<String, ConfigError> {
        self.required(option, self.choice_opt(option, allowed)?)
    }

    pub fn choice_opt(
        &self,
        option: &str,
        allowed: &[&str],
    ) -> Result<Option<String>, ConfigError> {
        self.typed(option, |v| value::parse_choice(v, allowed))
    }

    /// The expanded value parsed by `parse`, which returns what was expected on failure:
    /// for option kinds a program defines itself (a condition, a route list). The error
    /// names the file, line, section, option and value like every other getter's.
    pub fn parse_opt<T>(
        &self,
        option: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        self.typed(option, parse)
    }

    /// As `parse_opt`, for a required option.
    pub fn parse<T>(
        &self,
        option: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        self.required(option, self.parse_opt(option, parse)?)
    }

    fn entry(&self, option: &str) -> Option<&'a Entry> {
        if let Some(log) = &self.config.reads {
            log.note(&self.name, option);
        }
        self.data?.options.get(&option.to_ascii_uppercase())
    }

    fn value_at(&self, entry: &Entry) -> Box<ValueAt> {
        Box::new(ValueAt {
            origin: entry.origin.clone(),
            section: self.name.clone(),
            option: entry.name.clone(),
        })
    }

    fn required<T>(&self, option: &str, value: Option<T>) -> Result<T, ConfigError> {
        value.ok_or_else(|| ConfigError::Missing {
            file: self.config.file.clone(),
            section: self.name.clone(),
            option: option.to_owned(),
        })
    }

    /// Expands the option's value and parses it; `parse` returns what was expected on failure.
    fn typed<T>(
        &self,
        option: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(entry) = self.entry(option) else {
            return Ok(None);
        };
        let env = |name: &str| std::env::var(name).ok();
        let trust = match entry.origin {
            Origin::File { .. } => Trust::File,
            Origin::Override { .. } => Trust::Override,
        };
        let expanded = Expander {
            paths: self.config.sections.get("PATHS"),
            env: &env,
        }
        .expand(&entry.value, trust)
        .map_err(|problem| ConfigError::Expansion {
            at: self.value_at(entry),
            problem,
        })?;
        parse(&expanded)
            .map(Some)
            .map_err(|expected| ConfigError::Invalid {
                at: self.value_at(entry),
                raw: entry.value.clone(),
                value: expanded,
                secret: entry.secret,
                expected,
            })
    }
}

#[cfg(test)]
mod tests;
