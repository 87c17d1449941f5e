//! `[pepsi-sendmail]`, read once at start, and the facts about the process the program acts
//! on: who runs it and whether it runs with another group's (or user's) privilege.

use std::path::PathBuf;
use std::time::Duration;

use pepsi_conf::config::Config;
use pepsi_conf::privilege;
use pepsi_contract::db::pinned_options;
use sqlx::postgres::PgConnectOptions;

use crate::message::Limits;

const SECTION: &str = "pepsi-sendmail";

/// The drop directory when the configuration names none.
pub const DEFAULT_SPOOL_DIR: &str = "/var/spool/pepsi/sendmail";

/// Everything pepsi-sendmail reads from the configuration.
#[derive(Debug, Clone)]
pub struct Options {
    /// The default sender's domain and that of unqualified addresses.
    pub domain: String,
    /// This host's name, in the Received field and the SMTP greeting.
    pub hostname: String,
    pub spool_dir: PathBuf,
    pub database: PgConnectOptions,
    pub connect_timeout: Duration,
    pub limits: Limits,
}

impl Options {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section(SECTION);
        let hostname = cfg.name_option(&cfg.section("pepsi"), "HOSTNAME")?;
        let domain = cfg.name_option(&s, "DOMAIN")?;
        pepsi_smtp::address::check_domain(&domain)
            .map_err(|e| anyhow::anyhow!("[{SECTION}] DOMAIN = {domain}: {e}"))?;
        // A URL without a host is pinned to [database] SOCKET_DIR: every user's sendmail
        // would otherwise talk to whatever listens at /tmp/.s.PGSQL.5432 while the server
        // is down (security review 2026-12-04 #3).
        let socket_dir = pepsi_contract::db::socket_dir(cfg)?;
        let database = match s.string_opt("DATABASE_URL")? {
            Some(url) => pinned_options(&url, &socket_dir).map_err(|e| {
                anyhow::anyhow!("[{SECTION}] DATABASE_URL is not a PostgreSQL URL: {e}")
            })?,
            None => {
                let url = cfg.section("database").string("URL")?;
                let role = cfg
                    .section("pepsi-setup")
                    .string_opt("SENDMAIL_ROLE")?
                    .unwrap_or_else(|| "pepsi-sendmail".into());
                pinned_options(&url, &socket_dir)
                    .map_err(|e| anyhow::anyhow!("[database] URL is not a PostgreSQL URL: {e}"))?
                    .username(&role)
            }
        };
        let ingress = cfg.section("pepsi-ingress");
        let max_size = match s.size_opt("MAX_MESSAGE_SIZE")? {
            Some(n) => n,
            None => ingress.size_opt("MAX_MESSAGE_SIZE")?.unwrap_or(25 << 20),
        };
        let limits = Limits {
            max_size,
            max_line: s.number_opt("MAX_LINE_LENGTH")?.unwrap_or(1000),
            max_recipients: s.number_opt("MAX_RECIPIENTS")?.unwrap_or(100),
        };
        if limits.max_line < 80 {
            anyhow::bail!(
                "[{SECTION}] MAX_LINE_LENGTH = {}: must be at least 80",
                limits.max_line
            );
        }
        if limits.max_recipients == 0 || limits.max_recipients > 1000 {
            anyhow::bail!(
                "[{SECTION}] MAX_RECIPIENTS = {}: must be 1 to 1000 (the database function's ceiling)",
                limits.max_recipients
            );
        }
        if limits.max_size == 0 || limits.max_size > 100 << 20 {
            anyhow::bail!(
                "[{SECTION}] MAX_MESSAGE_SIZE = {}: must be more than 0 and at most 100M (the database function's ceiling)",
                limits.max_size
            );
        }
        Ok(Options {
            domain,
            hostname,
            spool_dir: s
                .path_opt("SPOOL_DIR")?
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SPOOL_DIR)),
            database: database.application_name("pepsi-sendmail"),
            connect_timeout: s
                .duration_opt("CONNECT_TIMEOUT")?
                .unwrap_or(Duration::from_secs(5)),
            limits,
        })
    }
}

/// Who runs the program, from the system's user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub login: Option<String>,
    /// The first comma-separated part of the GECOS field.
    pub gecos_name: Option<String>,
}

/// The user `uid` is (name and GECOS name when the system knows them; neither when the
/// password database cannot be read).
pub fn user(uid: u32) -> User {
    let account = privilege::account_by_uid(uid).ok().flatten();
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    User {
        uid,
        login: account.as_ref().and_then(|a| non_empty(&a.name)),
        gecos_name: account
            .as_ref()
            .and_then(|a| a.gecos.split(',').next().map(str::trim).and_then(non_empty)),
    }
}

/// The real uid: the user who ran the program, set-group-id or not.
pub fn real_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// True when the process runs with a group or user other than its caller's (installed
/// set-group-id): the caller must then not choose the configuration or the environment.
pub fn privileged() -> bool {
    // SAFETY: these calls cannot fail.
    unsafe { libc::getegid() != libc::getgid() || libc::geteuid() != libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_comes_from_the_password_database() {
        let root = user(0);
        assert_eq!(root.login.as_deref(), Some("root"));
        let gecos = pepsi_conf::privilege::account("root")
            .unwrap()
            .unwrap()
            .gecos;
        let full = gecos.split(',').next().unwrap_or("").trim();
        assert_eq!(
            root.gecos_name.as_deref(),
            (!full.is_empty()).then_some(full)
        );
        let unknown = user(3_999_999_999);
        assert_eq!((unknown.login, unknown.gecos_name), (None, None));
    }
}
