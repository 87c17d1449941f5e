//! The database overlay's rules: which rows of `pepsi.config_override` apply to a scope, in
//! what order, and what they may never set. Reading the rows is `pepsi_contract::overlay`'s;
//! this crate opens no database.
//! Bootstrap and listener sections are never taken from the database, whatever a
//! row says: a compromised database must not move a listening socket or retarget the database
//! connection. Writing the table belongs to the `pepsi-config` role, not to any program here.

use std::fmt;

use super::{Config, Origin};

/// Whom a set of overrides applies to; its rows are the `global` ones, then the domain's,
/// then the address's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Deployment-wide: only `global` rows apply.
    Global,
    /// One domain: `global`, then `domain:<domain>` rows.
    Domain(String),
    /// One address: `global`, then the domain part's `domain:` rows, then `address:<address>`.
    Address(String),
}

impl Scope {
    /// The scope as stored in `pepsi.config_override.scope`: `global`, `domain:<domain>` or
    /// `address:<address>`, in lowercase, which is how rows are compared.
    pub fn to_db_string(&self) -> String {
        match self {
            Scope::Global => "global".to_owned(),
            Scope::Domain(domain) => format!("domain:{}", domain.to_lowercase()),
            Scope::Address(address) => format!("address:{}", address.to_lowercase()),
        }
    }

    /// The domain whose rows apply: the domain itself, or the part of an address after its
    /// last `@`.
    pub fn domain(&self) -> Option<&str> {
        match self {
            Scope::Global => None,
            Scope::Domain(domain) => Some(domain),
            Scope::Address(address) => crate::address::domain_part(address),
        }
    }

    /// The address whose rows apply, for an address scope.
    pub fn address(&self) -> Option<&str> {
        match self {
            Scope::Address(address) => Some(address),
            _ => None,
        }
    }

    /// Every value of the `scope` column that applies, lowercase, least specific first.
    pub fn db_scopes(&self) -> Vec<String> {
        let mut scopes = vec!["global".to_owned()];
        if let Some(domain) = self.domain() {
            scopes.push(format!("domain:{}", domain.to_lowercase()));
        }
        if let Some(address) = self.address() {
            scopes.push(format!("address:{}", address.to_lowercase()));
        }
        scopes
    }

    /// How a row's scope relates to this one: `Some(layer)` (0 global, 1 domain, 2 address)
    /// when it applies, `None` when it belongs to someone else or is malformed.
    fn layer_of(&self, row_scope: &str) -> Option<u8> {
        let row_scope = row_scope.trim();
        if row_scope.eq_ignore_ascii_case("global") {
            return Some(0);
        }
        let (kind, name) = row_scope.split_once(':')?;
        if kind.eq_ignore_ascii_case("domain") {
            self.domain()
                .filter(|d| d.eq_ignore_ascii_case(name))
                .map(|_| 1)
        } else if kind.eq_ignore_ascii_case("address") {
            self.address()
                .filter(|a| a.eq_ignore_ascii_case(name))
                .map(|_| 2)
        } else {
            None
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_db_string())
    }
}

/// One row of `pepsi.config_override`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideRow {
    pub scope: String,
    pub section: String,
    pub option: String,
    pub value: String,
}

/// Whether a section is one the database may never override: `[PATHS]` and `[database]`,
/// which must be known before a connection exists, and every `[listener*]` section, which is
/// a security boundary.
pub fn is_protected_section(name: &str) -> bool {
    let upper = name.trim().to_ascii_uppercase();
    upper == "PATHS" || upper == "DATABASE" || upper.starts_with("LISTENER")
}

/// Options the database overlay may never set, in any section: they name a program to run
/// (`PROGRAM`, `HELPER`, `LIBEXEC_DIR`), key material or a trust anchor (`KEYS`,
/// `TLS_CA_FILE`, `DNS_SERVERS` …), a file or directory (`ALIAS_FILE`, `MAILDIR_ROOT` …),
/// a privilege of the setuid Maildir writer (`ALLOW_ROOT_OWNER`, `CREATE_MAILDIR`), or where
/// a stage connects and sends its credentials ([`CONNECTION_OPTIONS`]).
/// Whoever could write a `config_override` row could otherwise make the system execute a
/// binary or forge verification verdicts. The table's `config_override_file_only` CHECK
/// (pepsi-0004.sql, replaced by pepsi-0008.sql and pepsi-0015.sql) holds the same list; a test compares the two.
pub const FILE_ONLY_OPTIONS: &[&str] = &[
    "PROGRAM",
    "HELPER",
    "LIBEXEC_DIR",
    "DNS_SERVERS",
    "KEYS",
    "KEY",
    "KEY_FILE",
    "DATABASE_KEYS",
    "TLS_CA_FILE",
    "TLS_CERT",
    "TLS_KEY",
    "ALIAS_FILE",
    "MAILDIR_ROOT",
    "MAILDIR",
    "MAIL_ROOT",
    "ROOT",
    "SECRETS",
    "SECRETS_DIR",
    "ALLOW_ROOT_OWNER",
    "CREATE_MAILDIR",
    "CONFIG_DATABASE_URL",
    // Where a stage connects, and how: the destination of the credentials a stage sends
    // (the smarthost relay's AUTH_PASSWORD, the count stage's AUTH_TOKEN). Set by the
    // database, they would hand a secrets.d value to a host of the writer's choosing
    // (pepsi-0015.sql, security review 2026-12-04 #2).
    "HOST",
    "PORT",
    "URL",
    "TLS",
    "TLS_SERVER_NAME",
];

/// The [`FILE_ONLY_OPTIONS`] that decide where a stage connects and how the connection is
/// protected, and with it where the stage's credentials go.
pub const CONNECTION_OPTIONS: &[&str] = &["HOST", "PORT", "URL", "TLS", "TLS_SERVER_NAME"];

/// Whether `option` may come from the configuration file only ([`FILE_ONLY_OPTIONS`]).
pub fn is_file_only_option(option: &str) -> bool {
    let upper = option.trim().to_ascii_uppercase();
    FILE_ONLY_OPTIONS.contains(&upper.as_str())
}

/// Whether `option` is one of the [`CONNECTION_OPTIONS`].
pub fn is_connection_option(option: &str) -> bool {
    let upper = option.trim().to_ascii_uppercase();
    CONNECTION_OPTIONS.contains(&upper.as_str())
}

impl Config {
    /// A copy of this configuration with the rows that apply to `scope` layered on top:
    /// `global`, then the domain's, then the address's, each later layer winning. Rows for
    /// other scopes are ignored; rows for protected sections are ignored with a warning, rows
    /// for file-only options with an error.
    pub fn with_overrides(&self, rows: &[OverrideRow], scope: &Scope) -> Config {
        let mut applicable: Vec<(u8, &OverrideRow)> = rows
            .iter()
            .filter_map(|row| scope.layer_of(&row.scope).map(|layer| (layer, row)))
            .collect();
        // Stable, so rows of one layer keep the order the caller (the query) gave them.
        applicable.sort_by_key(|(layer, _)| *layer);
        let mut config = self.clone();
        for (_, row) in applicable {
            if is_protected_section(&row.section) {
                tracing::warn!(
                    scope = %row.scope,
                    section = %row.section,
                    option = %row.option,
                    "ignoring database override of a protected section; set it in the configuration file"
                );
                continue;
            }
            if is_file_only_option(&row.option) {
                tracing::error!(
                    scope = %row.scope,
                    section = %row.section,
                    option = %row.option,
                    "ignoring database override of an option that names a program, file, key, \
                     trust anchor or where a stage connects; set it in the configuration file"
                );
                continue;
            }
            if row.section.trim().is_empty() || row.option.trim().is_empty() {
                tracing::warn!(scope = %row.scope, section = %row.section, option = %row.option,
                    "ignoring database override without a section or option name");
                continue;
            }
            config.set(
                row.section.trim(),
                row.option.trim(),
                &row.value,
                Origin::Override {
                    description: format!("database override scope={}", row.scope),
                },
            );
        }
        config
    }
}

impl From<(String, String, String, String)> for OverrideRow {
    /// A row as selected: scope, section, option, value.
    fn from((scope, section, option, value): (String, String, String, String)) -> Self {
        OverrideRow {
            scope,
            section,
            option,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "\
[PATHS]
ROOT = /srv/pepsi
[database]
URL = postgres:///pepsi
[listener-smtp]
ADDRESS = 127.0.0.1:25
[stage-spam]
THRESHOLD = 5
MODE = tag
";

    fn row(scope: &str, section: &str, option: &str, value: &str) -> OverrideRow {
        OverrideRow {
            scope: scope.to_owned(),
            section: section.to_owned(),
            option: option.to_owned(),
            value: value.to_owned(),
        }
    }

    fn rows() -> Vec<OverrideRow> {
        vec![
            // Deliberately most specific first: precedence must not depend on row order.
            row("address:Boss@Example.test", "stage-spam", "threshold", "9"),
            row("domain:example.test", "stage-spam", "THRESHOLD", "7"),
            row("domain:example.test", "stage-spam", "MODE", "reject"),
            row("global", "stage-spam", "threshold", "6"),
            row("global", "stage-spam", "NEW", "$ROOT/x"),
            row("domain:other.test", "stage-spam", "THRESHOLD", "1"),
            row(
                "address:someone@example.test",
                "stage-spam",
                "THRESHOLD",
                "2",
            ),
            row("global", "database", "URL", "postgres://evil/pepsi"),
            row("global", "PATHS", "ROOT", "/tmp/evil"),
            row("global", "Listener-Submission", "ADDRESS", "0.0.0.0:587"),
            row("global", "listener", "ADDRESS", "0.0.0.0:25"),
            row("bogus", "stage-spam", "MODE", "off"),
            row("domain", "stage-spam", "MODE", "off"),
        ]
    }

    /// Applies the rows for `scope` and renders what the spam section and the protected
    /// sections then hold, with origins.
    fn check(scope: Scope, expected: &str) {
        let config = Config::from_str_named(BASE, "base.conf")
            .unwrap()
            .with_overrides(&rows(), &scope);
        let mut out = String::new();
        for section in [
            "stage-spam",
            "database",
            "PATHS",
            "listener-smtp",
            "listener-submission",
            "listener",
        ] {
            let section = config.section(section);
            for option in section.options() {
                out.push_str(&format!(
                    "[{}] {} = {} ({})\n",
                    section.name(),
                    option,
                    section.string(option).unwrap(),
                    section.origin(option).unwrap()
                ));
            }
        }
        assert_eq!(out, expected, "scope {scope}");
    }

    #[test]
    fn overlay_precedence_table() {
        check(
            Scope::Global,
            "\
[stage-spam] MODE = tag (base.conf:9)
[stage-spam] NEW = /srv/pepsi/x (database override scope=global)
[stage-spam] threshold = 6 (database override scope=global)
[database] URL = postgres:///pepsi (base.conf:4)
[PATHS] ROOT = /srv/pepsi (base.conf:2)
[listener-smtp] ADDRESS = 127.0.0.1:25 (base.conf:6)
",
        );
        check(
            Scope::Domain("EXAMPLE.test".to_owned()),
            "\
[stage-spam] MODE = reject (database override scope=domain:example.test)
[stage-spam] NEW = /srv/pepsi/x (database override scope=global)
[stage-spam] THRESHOLD = 7 (database override scope=domain:example.test)
[database] URL = postgres:///pepsi (base.conf:4)
[PATHS] ROOT = /srv/pepsi (base.conf:2)
[listener-smtp] ADDRESS = 127.0.0.1:25 (base.conf:6)
",
        );
        check(
            Scope::Address("boss@example.TEST".to_owned()),
            "\
[stage-spam] MODE = reject (database override scope=domain:example.test)
[stage-spam] NEW = /srv/pepsi/x (database override scope=global)
[stage-spam] threshold = 9 (database override scope=address:Boss@Example.test)
[database] URL = postgres:///pepsi (base.conf:4)
[PATHS] ROOT = /srv/pepsi (base.conf:2)
[listener-smtp] ADDRESS = 127.0.0.1:25 (base.conf:6)
",
        );
        check(
            Scope::Address("nobody@elsewhere.test".to_owned()),
            "\
[stage-spam] MODE = tag (base.conf:9)
[stage-spam] NEW = /srv/pepsi/x (database override scope=global)
[stage-spam] threshold = 6 (database override scope=global)
[database] URL = postgres:///pepsi (base.conf:4)
[PATHS] ROOT = /srv/pepsi (base.conf:2)
[listener-smtp] ADDRESS = 127.0.0.1:25 (base.conf:6)
",
        );
    }

    #[test]
    fn overlay_leaves_the_original_untouched() {
        let base = Config::from_str_named(BASE, "base.conf").unwrap();
        let _ = base.with_overrides(&rows(), &Scope::Global);
        assert_eq!(
            base.section("stage-spam")
                .number::<u32>("THRESHOLD")
                .unwrap(),
            5
        );
        assert!(!base.section("stage-spam").has("NEW"));
    }

    #[test]
    fn protected_sections() {
        let cases = [
            ("PATHS", true),
            ("paths", true),
            ("database", true),
            ("Database", true),
            ("listener", true),
            ("listener-smtp", true),
            ("LISTENER.submission", true),
            ("listeners", true),
            (" paths ", true),
            ("stage-spam", false),
            ("database-extra", false),
            ("smtp-listener", false),
            ("pathsx", false),
            ("", false),
        ];
        for (name, expected) in cases {
            assert_eq!(is_protected_section(name), expected, "section {name:?}");
        }
    }

    #[test]
    fn scope_rendering_and_matching() {
        let cases: &[(Scope, &str, &[&str])] = &[
            (Scope::Global, "global", &["global"]),
            (
                Scope::Domain("Example.Test".into()),
                "domain:example.test",
                &["global", "domain:example.test"],
            ),
            (
                Scope::Address("Bob@Example.Test".into()),
                "address:bob@example.test",
                &["global", "domain:example.test", "address:bob@example.test"],
            ),
            (
                Scope::Address("local-only".into()),
                "address:local-only",
                &["global", "address:local-only"],
            ),
        ];
        for (scope, rendered, scopes) in cases {
            assert_eq!(scope.to_db_string(), *rendered);
            assert_eq!(scope.to_string(), *rendered);
            assert_eq!(scope.db_scopes(), *scopes, "scope {scope}");
        }
        let bob = Scope::Address("bob@example.test".into());
        assert_eq!(bob.layer_of("GLOBAL"), Some(0));
        assert_eq!(bob.layer_of("Domain:EXAMPLE.test"), Some(1));
        assert_eq!(bob.layer_of("address:BOB@example.test"), Some(2));
        assert_eq!(bob.layer_of("address:alice@example.test"), None);
        assert_eq!(bob.layer_of("domain:test"), None);
        assert_eq!(bob.layer_of("host:example.test"), None);
        assert_eq!(Scope::Global.layer_of("domain:example.test"), None);
    }

    #[test]
    fn override_values_cannot_read_the_environment() {
        // PATH is set in every test environment; a file value may use it, an override may not.
        let config = Config::from_str_named("[s]\nFROM_FILE = $PATH\n", "env.conf")
            .unwrap()
            .with_overrides(&[row("global", "s", "FROM_DB", "$PATH")], &Scope::Global);
        let section = config.section("s");
        assert_eq!(
            section.string("FROM_FILE").unwrap(),
            std::env::var("PATH").unwrap()
        );
        assert_eq!(
            section.string("FROM_DB").unwrap_err().to_string(),
            "database override scope=global: [s] FROM_DB: variable PATH is not set in [PATHS] \
             (a database override cannot read the environment or secrets.d) and has no default"
        );
    }

    #[test]
    fn bad_override_value_names_its_scope() {
        let config = Config::from_str_named(BASE, "base.conf")
            .unwrap()
            .with_overrides(
                &[row(
                    "domain:example.test",
                    "stage-spam",
                    "THRESHOLD",
                    "lots",
                )],
                &Scope::Domain("example.test".into()),
            );
        assert_eq!(
            config
                .section("stage-spam")
                .number::<u32>("threshold")
                .unwrap_err()
                .to_string(),
            "database override scope=domain:example.test: [stage-spam] THRESHOLD = \"lots\": \
             expected a whole number"
        );
    }
}
