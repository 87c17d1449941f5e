//! Where mailboxes are: the Maildir location a `pepsi-stage-relay-to-maildir` section
//! configures (`MAILDIR_ROOT`, else `[PATHS] MAIL_ROOT`; the `MAILDIR` template;
//! `RECIPIENT_DELIMITER`), the writer it starts and the default limits it applies, read the
//! same way by the delivery stage and by the tools that read Maildirs (`pepsi-quota recalc`,
//! `pepsi-whitelist learn`), which therefore link no stage crate. The template is pure; the
//! only I/O is looking the writer program up.
//!
//! Which recipients are local is `local`'s to say.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pepsi_conf::config::{Config, ConfigError, Section};

use crate::delivery::Failure;

/// One piece of a parsed `MAILDIR` template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// `%u`: the local part, lower-cased, without its `+tag` extension.
    User,
    /// `%d`: the domain, lower-cased.
    Domain,
    /// `%a`: `%u@%d`.
    Address,
}

/// A parsed `MAILDIR` template, e.g. `%u/Maildir` or `/srv/mail/%d/%u`. A relative result is
/// taken under the root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `%u`, `%d`, `%a` and `%%`; any other `%` sequence is refused, as is a template
    /// with no `%u`, `%d` or `%a` (every recipient would share one mailbox).
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                lit.push(c);
                continue;
            }
            let piece = match chars.next() {
                Some('%') => {
                    lit.push('%');
                    continue;
                }
                Some('u') => Piece::User,
                Some('d') => Piece::Domain,
                Some('a') => Piece::Address,
                Some(other) => {
                    return Err(format!(
                        "a template with %u, %d, %a or %% (unknown %{other})"
                    ));
                }
                None => return Err("a template with %u, %d, %a or %% (a lone % at the end)".into()),
            };
            if !lit.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut lit)));
            }
            pieces.push(piece);
        }
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit));
        }
        if !pieces.iter().any(|p| !matches!(p, Piece::Text(_))) {
            return Err("a template naming the recipient with %u, %d or %a".into());
        }
        Ok(Template { pieces })
    }

    /// The Maildir of `address`; `delimiters` are the characters that start an address
    /// extension (`+` in `alice+lists@`), empty for none. A local part or domain that could
    /// leave its directory (`/`, a leading `.`, control characters, empty) is refused with a
    /// permanent 5.1.3.
    pub fn mailbox(
        &self,
        root: &Path,
        address: &str,
        delimiters: &str,
    ) -> Result<PathBuf, Box<Failure>> {
        let bad = |why: &str| {
            let mut f = Failure::new(
                format!("bad destination mailbox address {address:?}: {why}"),
                "5.1.3",
            );
            f.phase = Some("delivery".into());
            Box::new(f)
        };
        let Some((local, domain)) = pepsi_conf::address::parts(address) else {
            return Err(bad("no domain"));
        };
        let user = match local.find(|c| delimiters.contains(c)) {
            // A local part that *is* the delimiter followed by text keeps it all.
            Some(i) if i > 0 => &local[..i],
            _ => local,
        }
        .to_lowercase();
        let domain = domain.trim_end_matches('.').to_lowercase();
        for (what, v) in [("local part", &user), ("domain", &domain)] {
            if v.is_empty() {
                return Err(bad(&format!("empty {what}")));
            }
            if v.starts_with('.') {
                return Err(bad(&format!("{what} starts with a dot")));
            }
            if v.contains('/') || v.chars().any(char::is_control) {
                return Err(bad(&format!("{what} contains / or a control character")));
            }
        }
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::User => out.push_str(&user),
                Piece::Domain => out.push_str(&domain),
                Piece::Address => {
                    out.push_str(&user);
                    out.push('@');
                    out.push_str(&domain);
                }
            }
        }
        let path = PathBuf::from(out);
        Ok(if path.is_absolute() {
            path
        } else {
            root.join(path)
        })
    }
}

/// The program whose stage sections say where mailboxes are.
pub const DELIVERY_PROGRAM: &str = "pepsi-stage-relay-to-maildir";
/// `HELPER`'s default: the Maildir writer.
pub const DEFAULT_WRITER: &str = "pepsi-helper-maildir-writer";
/// `MAILDIR`'s default.
pub const DEFAULT_TEMPLATE: &str = "%u/Maildir";

pub use pepsi_conf::mailbox::WriterArgs;

/// What a delivery stage section says about mailboxes: where they are, the writer that
/// reaches them, and the limits of a mailbox without a `pepsi.quota_limit` row of its own.
#[derive(Debug, Clone)]
pub struct Mailboxes {
    pub root: PathBuf,
    pub template: Template,
    pub delimiters: String,
    pub quota: Option<u64>,
    pub quota_messages: Option<u64>,
    pub writer: WriterArgs,
    /// `HELPER_TIMEOUT`: a writer silent this long is killed (at least a second).
    pub writer_timeout: Duration,
}

impl Mailboxes {
    /// Reads the stage section `s`, with `[PATHS] MAIL_ROOT` and `[pepsi]
    /// RECIPIENT_DELIMITER` as fallbacks.
    pub fn from_section(cfg: &Config, s: &Section<'_>) -> Result<Mailboxes, ConfigError> {
        let root = match s.path_opt("MAILDIR_ROOT")? {
            Some(p) => p,
            None => match cfg.section("PATHS").path_opt("MAIL_ROOT")? {
                Some(p) => p,
                None => s.path("MAILDIR_ROOT")?,
            },
        };
        let template = s
            .parse_opt("MAILDIR", Template::parse)?
            .unwrap_or_else(|| Template::parse(DEFAULT_TEMPLATE).expect("default"));
        let delimiters = s
            .or_global()
            .string_opt("RECIPIENT_DELIMITER")?
            .unwrap_or_else(|| "+".into());
        let writer = s
            .string_opt("HELPER")?
            .unwrap_or_else(|| DEFAULT_WRITER.into());
        Ok(Mailboxes {
            template,
            delimiters,
            quota: s.size_opt("QUOTA")?.filter(|&q| q > 0),
            quota_messages: s.number_opt::<u64>("QUOTA_MESSAGES")?.filter(|&q| q > 0),
            writer: WriterArgs {
                program: pepsi_conf::cli::locate_program(&writer),
                root: root.clone(),
                create: s.bool_opt("CREATE_MAILDIR")?.unwrap_or(false),
                allow_root_owner: s.bool_opt("ALLOW_ROOT_OWNER")?.unwrap_or(false),
                key_index_dirs: s.parse_opt("KEY_INDEX_DIRS", |v| {
                    let max = pepsi_conf::mailbox::MAX_KEY_INDEX_DIRS;
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n <= max)
                        .ok_or_else(|| format!("a number of directories from 0 to {max}"))
                })?,
                log_level: "info".into(),
            },
            writer_timeout: s
                .duration_opt("HELPER_TIMEOUT")?
                .unwrap_or(Duration::from_secs(60))
                .max(Duration::from_secs(1)),
            root,
        })
    }

    /// Reads `[stage-<stage>]` (a stage [`delivery_stage`] chose).
    pub fn of_stage(cfg: &Config, stage: &str) -> Result<Mailboxes, ConfigError> {
        Mailboxes::from_section(cfg, &cfg.stage_section_named(stage))
    }
}

/// Why no one delivery stage could be chosen ([`delivery_stage`]); each holds the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoStage {
    /// The stage asked for does not run the delivery program.
    Unknown(String),
    /// No stage runs it.
    None(String),
    /// Several do, and none was named.
    Several(String),
}

/// The `[stage-<name>]` running [`DELIVERY_PROGRAM`] whose settings say where mailboxes
/// are, for a tool that reads Maildirs: the one asked for (`--stage`), else the only one.
pub fn delivery_stage(cfg: &Config, asked: Option<&str>) -> Result<String, NoStage> {
    let program = DELIVERY_PROGRAM;
    let stages = pepsi_contract::stage::StageOptions::stages_of(cfg, program);
    match asked {
        Some(name) if stages.iter().any(|s| s.eq_ignore_ascii_case(name)) => Ok(name.to_owned()),
        Some(name) => Err(NoStage::Unknown(format!(
            "--stage {name}: no [stage-{name}] runs {program} (stages that do: {})",
            if stages.is_empty() {
                "none".into()
            } else {
                names(&stages)
            }
        ))),
        None => match &stages[..] {
            [one] => Ok(one.to_string()),
            [] => Err(NoStage::None(format!(
                "no [stage-*] section runs {program}: there is no Maildir to read"
            ))),
            many => Err(NoStage::Several(format!(
                "several stages run {program}: name one with --stage ({})",
                names(many)
            ))),
        },
    }
}

/// Stage names as a comma-separated list, for a message.
fn names(stages: &[pepsi_conf::config::StageName]) -> String {
    let names: Vec<&str> = stages.iter().map(|s| s.as_str()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(template: &str, address: &str, want: Result<&str, &str>) {
        let t = Template::parse(template).unwrap();
        match (t.mailbox(Path::new("/srv/mail"), address, "+"), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, Path::new(want), "{template} {address}"),
            (Err(f), Err(want)) => {
                assert_eq!(f.enhanced_status.as_deref(), Some("5.1.3"));
                assert!(
                    f.diagnostic.contains(want),
                    "{template} {address}: {}",
                    f.diagnostic
                );
            }
            (got, want) => panic!("{template} {address}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn mailbox_template_table() {
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            (
                "%u/Maildir",
                "alice@example.test",
                Ok("/srv/mail/alice/Maildir"),
            ),
            (
                "%u/Maildir",
                "Alice@Example.Test",
                Ok("/srv/mail/alice/Maildir"),
            ),
            (
                "%u/Maildir",
                "alice+lists@example.test",
                Ok("/srv/mail/alice/Maildir"),
            ),
            (
                "%u/Maildir",
                "+tag@example.test",
                Ok("/srv/mail/+tag/Maildir"),
            ),
            (
                "%d/%u",
                "bob@Example.Test.",
                Ok("/srv/mail/example.test/bob"),
            ),
            ("/home/%u/Maildir", "bob@x.test", Ok("/home/bob/Maildir")),
            ("%a", "Bob+x@X.test", Ok("/srv/mail/bob@x.test")),
            ("100%%/%u", "bob@x.test", Ok("/srv/mail/100%/bob")),
            (
                "%u/Maildir",
                "../etc@example.test",
                Err("starts with a dot"),
            ),
            ("%u/Maildir", "a/../../etc@example.test", Err("contains /")),
            ("%u/Maildir", "..@example.test", Err("starts with a dot")),
            (
                "%u/Maildir",
                ".hidden@example.test",
                Err("starts with a dot"),
            ),
            ("%u/Maildir", "a\nb@example.test", Err("control character")),
            ("%u/Maildir", "@example.test", Err("empty local part")),
            ("%d/%u", "bob@", Err("empty domain")),
            ("%u/Maildir", "nodomain", Err("no domain")),
        ];
        for (template, address, want) in cases {
            check(template, address, *want);
        }
    }

    #[test]
    fn templates_that_are_refused() {
        for (t, want) in [
            ("%x/Maildir", "unknown %x"),
            ("Maildir/%", "lone %"),
            ("/var/mail/shared", "naming the recipient"),
        ] {
            let err = Template::parse(t).unwrap_err();
            assert!(err.contains(want), "{t}: {err}");
        }
    }

    /// `KEY_INDEX_DIRS` reaches the writer's command line as written, within its bound.
    #[test]
    fn key_index_dirs_as_a_table() {
        let read = |line: &str| {
            let cfg = pepsi_conf::config::Config::from_str_named(
                &format!("[stage-local]\nMAILDIR_ROOT = /var/mail\n{line}\n"),
                "pepsi.conf",
            )
            .unwrap();
            Mailboxes::from_section(&cfg, &cfg.section("stage-local"))
                .map(|m| m.writer.key_index_dirs)
                .map_err(|e| e.to_string())
        };
        assert_eq!(read(""), Ok(None));
        assert_eq!(read("KEY_INDEX_DIRS = 0"), Ok(Some(0)));
        assert_eq!(read("KEY_INDEX_DIRS = 65536"), Ok(Some(65_536)));
        for bad in ["65537", "-1", "many"] {
            let err = read(&format!("KEY_INDEX_DIRS = {bad}")).unwrap_err();
            assert!(
                err.contains("KEY_INDEX_DIRS") && err.contains("from 0 to 65536"),
                "{bad}: {err}"
            );
        }
    }
}
