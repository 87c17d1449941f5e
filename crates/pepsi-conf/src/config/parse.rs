//! Reading INI text into a [`Config`]: section headers, assignments, comments, `@inline@`
//! includes and the `secrets.d/` fragments.
//!
//! This is the only part of the configuration layer that reads files. It never expands a value
//! (that happens when a getter reads it), except the path of an `@inline@` directive, which is
//! needed now.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::expand::{Expander, Trust};
use super::{Config, Entry, Origin, SectionData};

/// The permission bits that make a secrets fragment readable by any local account.
const WORLD_READABLE: u32 = 0o004;

pub(super) struct Loader<'c> {
    pub(super) config: &'c mut Config,
    /// Canonical paths of the files being read, outermost first, to catch include cycles.
    pub(super) stack: Vec<PathBuf>,
}

/// Where a file is being read from: the command line or an `@inline@` line.
struct IncludedFrom<'a> {
    path: &'a Path,
    line: usize,
}

impl Loader<'_> {
    /// Reads a file named on the command line (or found by the default search).
    pub(super) fn load_file(&mut self, path: &Path, secret: bool) -> Result<(), ConfigError> {
        self.read_file(path, None, secret)
    }

    /// Reads the text of a file that was already opened, or of an embedded default, under the
    /// name used in messages; includes are relative to `base`.
    pub(super) fn load_text(
        &mut self,
        text: &str,
        name: &Path,
        base: &Path,
        secret: bool,
    ) -> Result<(), ConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // An included file starts outside any section; the includer's section resumes after.
        let mut section: Option<String> = None;
        for (index, raw_line) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw_line.trim();
            let syntax = |reason: &str| ConfigError::Syntax {
                path: name.to_owned(),
                line,
                text: trimmed.to_owned(),
                reason: reason.to_owned(),
            };
            if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
                continue;
            }
            if let Some(rest) = trimmed.strip_prefix('@') {
                // Not an address: the `@inline@ <path>` directive.
                let (directive, argument) = match rest.split_once('@') {
                    Some((directive, argument)) => (directive, argument.trim()),
                    None => return Err(syntax("a directive looks like @inline@ <path>")),
                };
                if !directive.eq_ignore_ascii_case("inline") {
                    return Err(syntax(
                        "unknown directive (only @inline@ <path> is supported)",
                    ));
                }
                let target = unquote(argument).map_err(syntax)?;
                if target.is_empty() {
                    return Err(syntax("@inline@ needs a file name"));
                }
                self.include(target, name, line, base, secret)?;
                continue;
            }
            if let Some(rest) = trimmed.strip_prefix('[') {
                let inner = rest
                    .strip_suffix(']')
                    .ok_or_else(|| syntax("a section header ends with ]"))?
                    .trim();
                if inner.is_empty() {
                    return Err(syntax("the section name is empty"));
                }
                if inner.contains(['[', ']']) {
                    return Err(syntax("a section name cannot contain [ or ]"));
                }
                let key = inner.to_ascii_uppercase();
                self.config
                    .sections
                    .entry(key.clone())
                    .or_insert_with(|| SectionData {
                        name: inner.to_owned(),
                        options: Default::default(),
                    });
                section = Some(key);
                continue;
            }
            let Some((option, value)) = trimmed.split_once('=') else {
                return Err(syntax(
                    "expected [SECTION], OPTION = value, a comment starting with # or ;, or @inline@ <path>",
                ));
            };
            let option = option.trim();
            if option.is_empty() {
                return Err(syntax("the option name before = is empty"));
            }
            if option.contains(char::is_whitespace) {
                return Err(syntax("an option name cannot contain spaces"));
            }
            let Some(section) = &section else {
                return Err(syntax("an option must follow a [SECTION] header"));
            };
            let value = unquote(value.trim()).map_err(syntax)?;
            self.config
                .sections
                .get_mut(section)
                .expect("header seen")
                .options
                .insert(
                    option.to_ascii_uppercase(),
                    Entry {
                        name: option.to_owned(),
                        value: value.to_owned(),
                        origin: Origin::File {
                            path: name.to_owned(),
                            line,
                        },
                        secret,
                    },
                );
        }
        Ok(())
    }

    fn include(
        &mut self,
        target: &str,
        from: &Path,
        line: usize,
        base: &Path,
        secret: bool,
    ) -> Result<(), ConfigError> {
        let env = |name: &str| std::env::var(name).ok();
        let expanded = Expander {
            paths: self.config.sections.get("PATHS"),
            env: &env,
        }
        .expand(target, Trust::File)
        .map_err(|problem| ConfigError::IncludeExpansion {
            path: from.to_owned(),
            line,
            target: target.to_owned(),
            problem: Box::new(problem),
        })?;
        let path = base.join(expanded);
        self.read_file(&path, Some(IncludedFrom { path: from, line }), secret)
    }

    fn read_file(
        &mut self,
        path: &Path,
        from: Option<IncludedFrom<'_>>,
        secret: bool,
    ) -> Result<(), ConfigError> {
        let io_error = |error: std::io::Error| match &from {
            Some(from) => ConfigError::Include {
                path: from.path.to_owned(),
                line: from.line,
                target: path.to_owned(),
                error,
            },
            None => ConfigError::Io {
                path: path.to_owned(),
                error,
            },
        };
        let canonical = fs::canonicalize(path).map_err(io_error)?;
        if self.stack.contains(&canonical) {
            let from = from.expect("only an include can revisit a file being read");
            let chain: Vec<String> = self
                .stack
                .iter()
                .chain(std::iter::once(&canonical))
                .map(|p| p.display().to_string())
                .collect();
            return Err(ConfigError::IncludeCycle {
                path: from.path.to_owned(),
                line: from.line,
                target: path.to_owned(),
                chain: chain.join(" -> "),
            });
        }
        if secret {
            refuse_world_readable(path)?;
        }
        let text = fs::read_to_string(path).map_err(io_error)?;
        let base = path.parent().unwrap_or(Path::new("")).to_owned();
        self.stack.push(canonical);
        let result = self.load_text(&text, path, &base, secret);
        self.stack.pop();
        result
    }

    /// Reads every `*.conf` fragment of the secrets directory in name order, so a later
    /// fragment overrides an earlier one and both override the main file.
    pub(super) fn load_secrets(&mut self, main: &Path) -> Result<(), ConfigError> {
        let main_dir = main.parent().unwrap_or(Path::new(""));
        let configured = self.config.section("PATHS");
        let dir = match configured.path_opt("SECRETS_DIR")? {
            Some(dir) => main_dir.join(dir),
            None => main_dir.join("secrets.d"),
        };
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(dir = %dir.display(), "no secrets directory");
                return Ok(());
            }
            Err(error) => return Err(ConfigError::Io { path: dir, error }),
        };
        let mut fragments = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| ConfigError::Io {
                path: dir.clone(),
                error,
            })?;
            let path = entry.path();
            let is_conf = path.extension().is_some_and(|ext| ext == "conf");
            // Follows symlinks on purpose: a fragment may be a link into a key store.
            if is_conf && fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                fragments.push(path);
            }
        }
        fragments.sort();
        for fragment in fragments {
            self.load_file(&fragment, true)?;
        }
        Ok(())
    }
}

fn refuse_world_readable(path: &Path) -> Result<(), ConfigError> {
    let metadata = fs::metadata(path).map_err(|error| ConfigError::Io {
        path: path.to_owned(),
        error,
    })?;
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & WORLD_READABLE != 0 {
        return Err(ConfigError::WorldReadable {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Strips one pair of double quotes, which is how a value keeps leading or trailing spaces.
fn unquote(value: &str) -> Result<&str, &'static str> {
    match value.strip_prefix('"') {
        None => Ok(value),
        Some(rest) => rest
            .strip_suffix('"')
            .ok_or("a value that starts with \" must end with \""),
    }
}
