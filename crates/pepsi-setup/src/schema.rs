//! The database schema: numbered patches, the re-creatable procedures, the roles and the
//! exact privilege matrix each role holds.
//!
//! Patches in `db/` are embedded at build time and applied in order, each recorded in
//! `pepsi.schema_patch` in the same transaction. Nothing here formats input into SQL except
//! role names from the operator's configuration, which are quoted as identifiers.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::Context as _;
use pepsi_conf::config::Config;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, Row as _};

/// One numbered schema patch. Released patches are never edited.
#[derive(Debug, Clone, Copy)]
pub struct Patch {
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every patch, in the order it applies.
pub const PATCHES: &[Patch] = &[
    Patch {
        name: "pepsi-0001",
        sql: include_str!("../db/pepsi-0001.sql"),
    },
    Patch {
        name: "pepsi-0002",
        sql: include_str!("../db/pepsi-0002.sql"),
    },
    Patch {
        name: "pepsi-0003",
        sql: include_str!("../db/pepsi-0003.sql"),
    },
    Patch {
        name: "pepsi-0004",
        sql: include_str!("../db/pepsi-0004.sql"),
    },
    Patch {
        name: "pepsi-0005",
        sql: include_str!("../db/pepsi-0005.sql"),
    },
    Patch {
        name: "pepsi-0006",
        sql: include_str!("../db/pepsi-0006.sql"),
    },
    Patch {
        name: "pepsi-0007",
        sql: include_str!("../db/pepsi-0007.sql"),
    },
    Patch {
        name: "pepsi-0008",
        sql: include_str!("../db/pepsi-0008.sql"),
    },
    Patch {
        name: "pepsi-0009",
        sql: include_str!("../db/pepsi-0009.sql"),
    },
    Patch {
        name: "pepsi-0010",
        sql: include_str!("../db/pepsi-0010.sql"),
    },
    Patch {
        name: "pepsi-0011",
        sql: include_str!("../db/pepsi-0011.sql"),
    },
    Patch {
        name: "pepsi-0012",
        sql: include_str!("../db/pepsi-0012.sql"),
    },
    Patch {
        name: "pepsi-0013",
        sql: include_str!("../db/pepsi-0013.sql"),
    },
    Patch {
        name: "pepsi-0014",
        sql: include_str!("../db/pepsi-0014.sql"),
    },
    Patch {
        name: "pepsi-0015",
        sql: include_str!("../db/pepsi-0015.sql"),
    },
    Patch {
        name: "pepsi-0016",
        sql: include_str!("../db/pepsi-0016.sql"),
    },
    Patch {
        name: "pepsi-0017",
        sql: include_str!("../db/pepsi-0017.sql"),
    },
    Patch {
        name: "pepsi-0018",
        sql: include_str!("../db/pepsi-0018.sql"),
    },
    Patch {
        name: "pepsi-0019",
        sql: include_str!("../db/pepsi-0019.sql"),
    },
    Patch {
        name: "pepsi-0020",
        sql: include_str!("../db/pepsi-0020.sql"),
    },
    Patch {
        name: "pepsi-0021",
        sql: include_str!("../db/pepsi-0021.sql"),
    },
    Patch {
        name: "pepsi-0022",
        sql: include_str!("../db/pepsi-0022.sql"),
    },
    Patch {
        name: "pepsi-0023",
        sql: include_str!("../db/pepsi-0023.sql"),
    },
    Patch {
        name: "pepsi-0024",
        sql: include_str!("../db/pepsi-0024.sql"),
    },
    Patch {
        name: "pepsi-0025",
        sql: include_str!("../db/pepsi-0025.sql"),
    },
    Patch {
        name: "pepsi-0026",
        sql: include_str!("../db/pepsi-0026.sql"),
    },
    Patch {
        name: "pepsi-0027",
        sql: include_str!("../db/pepsi-0027.sql"),
    },
];

/// The one function the sendmail role may execute (procedures.sql, LOCAL SUBMISSION), by
/// its signature; no other role may.
pub const SENDMAIL_FUNCTION: &str =
    "pepsi.sendmail_submit(text, text[], bytea, bytea, jsonb, bigint, text, text, text)";

/// Stored functions and triggers; re-applied on every run.
pub const PROCEDURES: &str = include_str!("../db/procedures.sql");

/// Table privileges the matrix governs; anything else is never granted by setup.
const TABLE_PRIVILEGES: [&str; 5] = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"];

/// The PostgreSQL roles of an installation, named in `[pepsi-setup]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles {
    /// Stage workers and the dispatcher.
    pub pipeline: String,
    /// The SMTP ingress: admission only.
    pub ingress: String,
    /// The only role that may write the configuration overlay.
    pub config: String,
    /// Local submission (pepsi-sendmail): no table privilege at all, EXECUTE on
    /// `SENDMAIL_FUNCTION` alone.
    pub sendmail: String,
    /// pepsi-httpd, the administrative API: the only role that may touch the credential
    /// tables (`admin_account`, `admin_session`, `api_token`).
    pub httpd: String,
    /// The crypto stages (setuid to the user of the same name, so peer authentication gives
    /// them this role) and pepsi-keys: the pipeline's privileges plus the one column no
    /// other role may read, `crypto_identity.private_wrapped`.
    pub crypto: String,
    /// pepsi-telemetry, the traces' and metrics' receiver: its own tables
    /// (`TELEMETRY_TABLES`) and nothing else, neither the queue nor the key store.
    pub telemetry: String,
    /// The limits of the sendmail role, which every local user may connect as.
    pub sendmail_limits: RoleLimits,
    /// The limits of the telemetry role, whose daemon faces the network from another host:
    /// a compromised receiver may not take the mail database's connection slots or hold a
    /// statement forever.
    pub telemetry_limits: RoleLimits,
}

/// Server-side limits of a role that every local user can reach (the sendmail role, through
/// `pg_ident.conf`): how many sessions it may hold at once and how long a statement, an
/// idle session or an idle transaction may last, so that no local user can use up the
/// server's connection slots or keep a session (and its locks) forever (security review
/// 2026-12-04 #4). Set with `ALTER ROLE`; a value of 0 means no limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleLimits {
    /// `CONNECTION LIMIT`; `None` for none (-1).
    pub connection_limit: Option<u32>,
    pub statement_timeout: std::time::Duration,
    pub idle_session_timeout: std::time::Duration,
    pub idle_in_transaction_session_timeout: std::time::Duration,
}

impl Default for RoleLimits {
    /// 20 sessions (`max_connections` is 100 by default), 60 s per statement (a 100 MB
    /// message takes a few), 60 s idle, 10 s idle in a transaction.
    fn default() -> Self {
        Self {
            connection_limit: Some(20),
            statement_timeout: std::time::Duration::from_secs(60),
            idle_session_timeout: std::time::Duration::from_secs(60),
            idle_in_transaction_session_timeout: std::time::Duration::from_secs(10),
        }
    }
}

impl RoleLimits {
    /// The telemetry role's: 8 sessions (the receiver's pool and a check), 60 s per
    /// statement, 10 s idle in a transaction; idle sessions are its pool's and stay.
    pub const TELEMETRY: RoleLimits = RoleLimits {
        connection_limit: Some(8),
        statement_timeout: std::time::Duration::from_secs(60),
        idle_session_timeout: std::time::Duration::ZERO,
        idle_in_transaction_session_timeout: std::time::Duration::from_secs(10),
    };

    /// The role settings, as `pg_db_role_setting` stores them after `ALTER ROLE .. SET`
    /// (milliseconds).
    pub fn settings(&self) -> [(&'static str, String); 3] {
        let ms = |d: std::time::Duration| d.as_millis().to_string();
        [
            ("statement_timeout", ms(self.statement_timeout)),
            ("idle_session_timeout", ms(self.idle_session_timeout)),
            (
                "idle_in_transaction_session_timeout",
                ms(self.idle_in_transaction_session_timeout),
            ),
        ]
    }
}

impl Default for Roles {
    fn default() -> Self {
        Self {
            pipeline: "pepsi".into(),
            ingress: "pepsi-ingress".into(),
            config: "pepsi-config".into(),
            sendmail: "pepsi-sendmail".into(),
            httpd: "pepsi-httpd".into(),
            crypto: "pepsi-crypto".into(),
            telemetry: "pepsi-telemetry".into(),
            sendmail_limits: RoleLimits::default(),
            telemetry_limits: RoleLimits::TELEMETRY,
        }
    }
}

impl Roles {
    /// Reads `[pepsi-setup] PIPELINE_ROLE`, `INGRESS_ROLE`, `CONFIG_ROLE`, `SENDMAIL_ROLE`,
    /// `HTTPD_ROLE`, `CRYPTO_ROLE` and `TELEMETRY_ROLE`, and the sendmail role's limits
    /// `SENDMAIL_CONNECTION_LIMIT`, `SENDMAIL_STATEMENT_TIMEOUT`,
    /// `SENDMAIL_IDLE_SESSION_TIMEOUT` and `SENDMAIL_IDLE_IN_TRANSACTION_TIMEOUT`.
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        let section = cfg.section("pepsi-setup");
        let default = Self::default();
        let limits = default.sendmail_limits.clone();
        let sendmail_limits = RoleLimits {
            connection_limit: match section.number_opt::<u32>("SENDMAIL_CONNECTION_LIMIT")? {
                Some(0) => None,
                Some(n) => Some(n),
                None => limits.connection_limit,
            },
            statement_timeout: section
                .duration_opt("SENDMAIL_STATEMENT_TIMEOUT")?
                .unwrap_or(limits.statement_timeout),
            idle_session_timeout: section
                .duration_opt("SENDMAIL_IDLE_SESSION_TIMEOUT")?
                .unwrap_or(limits.idle_session_timeout),
            idle_in_transaction_session_timeout: section
                .duration_opt("SENDMAIL_IDLE_IN_TRANSACTION_TIMEOUT")?
                .unwrap_or(limits.idle_in_transaction_session_timeout),
        };
        let telemetry_limits = RoleLimits {
            connection_limit: match section.number_opt::<u32>("TELEMETRY_CONNECTION_LIMIT")? {
                Some(0) => None,
                Some(n) => Some(n),
                None => RoleLimits::TELEMETRY.connection_limit,
            },
            statement_timeout: section
                .duration_opt("TELEMETRY_STATEMENT_TIMEOUT")?
                .unwrap_or(RoleLimits::TELEMETRY.statement_timeout),
            ..RoleLimits::TELEMETRY
        };
        Ok(Self {
            sendmail_limits,
            telemetry_limits,
            pipeline: section
                .string_opt("PIPELINE_ROLE")?
                .unwrap_or(default.pipeline),
            ingress: section
                .string_opt("INGRESS_ROLE")?
                .unwrap_or(default.ingress),
            config: section.string_opt("CONFIG_ROLE")?.unwrap_or(default.config),
            sendmail: section
                .string_opt("SENDMAIL_ROLE")?
                .unwrap_or(default.sendmail),
            httpd: section.string_opt("HTTPD_ROLE")?.unwrap_or(default.httpd),
            crypto: section.string_opt("CRYPTO_ROLE")?.unwrap_or(default.crypto),
            telemetry: section
                .string_opt("TELEMETRY_ROLE")?
                .unwrap_or(default.telemetry),
        })
    }

    fn all(&self) -> [(RoleKind, &str); 7] {
        [
            (RoleKind::Pipeline, self.pipeline.as_str()),
            (RoleKind::Ingress, self.ingress.as_str()),
            (RoleKind::Config, self.config.as_str()),
            (RoleKind::Sendmail, self.sendmail.as_str()),
            (RoleKind::Httpd, self.httpd.as_str()),
            (RoleKind::Crypto, self.crypto.as_str()),
            (RoleKind::Telemetry, self.telemetry.as_str()),
        ]
    }
}

/// What a role is for, which decides its privileges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    Pipeline,
    Ingress,
    Config,
    Sendmail,
    Httpd,
    Crypto,
    Telemetry,
}

/// Columns no role but the crypto role may read, by table: every other role that reads the
/// table gets a column-level SELECT on the rest instead of a table-level one.
pub const SECRET_COLUMNS: &[(&str, &[&str])] = &[("crypto_identity", &["private_wrapped"])];

/// The key store of end-to-end encryption (pepsi-0013.sql), which the crypto role writes.
pub const KEY_STORE_TABLES: [&str; 5] = [
    "crypto_identity",
    "peer_key",
    "peer_has_own_key",
    "ca_trust",
    "key_request",
];

/// The credential tables of the administrative surface: the httpd role's alone.
pub const CREDENTIAL_TABLES: [&str; 3] = ["admin_account", "admin_session", "api_token"];

/// The online setup's intent queue and its progress (pepsi-0026.sql).
pub const SETUP_TABLES: [&str; 2] = ["setup_task", "setup_task_log"];

/// What pepsi-telemetry keeps (pepsi-0027.sql): spans and metric points.
pub const TELEMETRY_TABLES: [&str; 2] = ["telemetry_span", "telemetry_metric"];

/// Stored functions whose EXECUTE is not for everyone: `procedures.sql` revokes each from
/// PUBLIC, and setup grants it to exactly the roles listed (and verifies that).
pub const FUNCTION_GRANTS: &[(&str, &[RoleKind])] = &[
    ("pepsi.mail_log_expire(interval)", &[RoleKind::Pipeline]),
    // The lists' own mail and the release of held posts (procedures.sql, THE LISTS' OWN MAIL
    // FROM OUTSIDE THE PIPELINE): pepsi-httpd, and pepsi-list under the pipeline role.
    (
        "pepsi.list_queue_mail(text,text,text,text[],bytea,bytea,text)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.list_held_approve(bigint,text,text)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.list_held_reject(bigint,text,text,text)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    // The operator actions on a queue row (procedures.sql, OPERATOR ACTIONS): pepsi-httpd's
    // queue API, and pepsi-queue and pepsi-failure-bouncer under the pipeline role.
    (
        "pepsi.workqueue_retry(bigint,boolean)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.workqueue_hold(bigint,boolean,text)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.workqueue_release(bigint)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.workqueue_delete(bigint,boolean)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.workqueue_bounce(bigint,text,text,text,boolean)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    // The secure-link portal's codes, new links and replies (procedures.sql, THE
    // SECURE-LINK PORTAL'S MAIL): pepsi-httpd alone.
    (
        "pepsi.secure_link_queue_mail(text,text,text,bytea,bytea,bytea)",
        &[RoleKind::Httpd],
    ),
    // The secretary's decisions (procedures.sql, THE SECRETARY'S DECISIONS): the
    // confirmation page and the owner's page in pepsi-httpd; the secretary stage (a reply,
    // postage) and pepsi-whitelist under the pipeline role.
    (
        "pepsi.secretary_confirm(bytea,text)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    (
        "pepsi.secretary_decide(bigint,text,text,text)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
    // Fresh statistics after an import or a reindex (procedures.sql): pepsi-archive.
    ("pepsi.archive_analyze()", &[RoleKind::Pipeline]),
    // The lock of one list's archive writes (procedures.sql, THE ARCHIVE'S LOCK): the list
    // stage and pepsi-archive under the pipeline role, the admin API's purge.
    (
        "pepsi.archive_lock(bigint)",
        &[RoleKind::Pipeline, RoleKind::Httpd],
    ),
];

/// The mailing lists' tables (pepsi-0016.sql): `mailing_list` and every `list_*`.
pub fn is_list_table(table: &str) -> bool {
    table == "mailing_list" || table.starts_with("list_")
}

/// The lists' archive (pepsi-0019.sql): every `archive_*`.
pub fn is_archive_table(table: &str) -> bool {
    table.starts_with("archive_")
}

/// The secure-link portal (pepsi-0020.sql): every `secure_link_*`.
pub fn is_secure_link_table(table: &str) -> bool {
    table.starts_with("secure_link_")
}

/// The table privileges `kind` must hold on `pepsi.<table>`, and no others.
pub fn privilege_matrix(kind: RoleKind, table: &str) -> &'static [&'static str] {
    const ALL: &[&str] = &["SELECT", "INSERT", "UPDATE", "DELETE"];
    const READ: &[&str] = &["SELECT"];
    const APPEND: &[&str] = &["INSERT"];
    const ADMIT: &[&str] = &["SELECT", "INSERT"];
    const NONE: &[&str] = &[];
    const READ_APPEND: &[&str] = &["SELECT", "INSERT"];
    const READ_DELETE: &[&str] = &["SELECT", "DELETE"];
    const COUNT: &[&str] = &["SELECT", "INSERT", "UPDATE"];
    const READ_CHANGE: &[&str] = &["SELECT", "UPDATE"];
    const READ_APPEND_DELETE: &[&str] = &["SELECT", "INSERT", "DELETE"];
    const READ_CHANGE_DELETE: &[&str] = &["SELECT", "UPDATE", "DELETE"];
    if kind == RoleKind::Crypto {
        // The crypto stages are stage workers (the pipeline's queue privileges) that also
        // unseal our private keys; pepsi-keys, under the same role, writes the key store.
        return if KEY_STORE_TABLES.contains(&table) {
            ALL
        } else {
            privilege_matrix(RoleKind::Pipeline, table)
        };
    }
    if kind == RoleKind::Telemetry {
        // The receiver runs on another host and faces the network: it adds what its clients
        // send, reads it and deletes what is past its RETENTION, and reaches nothing that
        // carries mail, a key or a credential.
        return match table {
            t if TELEMETRY_TABLES.contains(&t) => READ_APPEND_DELETE,
            "schema_patch" => READ,
            _ => NONE,
        };
    }
    if TELEMETRY_TABLES.contains(&table) {
        // A message's journey and the pipeline page's latencies; only the receiver writes.
        return if kind == RoleKind::Httpd { READ } else { NONE };
    }
    if SECRET_COLUMNS.iter().any(|(t, _)| *t == table) {
        // Read through a column grant without the secret columns (column_matrix); never
        // written by anyone but the crypto role.
        return NONE;
    }
    if SETUP_TABLES.contains(&table) {
        // A setup task is a request to a program running as root: only the configuration
        // role adds one (pepsi-httpd through its configuration connection), pepsi-httpd
        // follows them, and nothing that processes mail may read or write either table.
        // The applier, as the schema's owner, needs no grant.
        return match (kind, table) {
            (RoleKind::Config, "setup_task") => READ_APPEND,
            (RoleKind::Config | RoleKind::Httpd, _) => READ,
            _ => NONE,
        };
    }
    if CREDENTIAL_TABLES.contains(&table) {
        // A component that could read admin_session could mint itself an administrative
        // session: the credential tables are the httpd role's alone.
        return if kind == RoleKind::Httpd { ALL } else { NONE };
    }
    match (kind, table) {
        // Local submission reaches the queue through SENDMAIL_FUNCTION only, whose owner's
        // rights it runs with: the role itself may not read or write anything, the logs
        // included.
        (RoleKind::Sendmail, _) => NONE,
        // The API searches both logs and appends to the audit log; it changes neither.
        (RoleKind::Httpd, "event_log" | "mail_log") => READ_APPEND,
        // The audit and mail logs are append-only for everyone who processes mail.
        (_, "event_log" | "mail_log") => APPEND,
        (_, "schema_patch") => READ,
        (RoleKind::Pipeline, "config_override") => READ,
        // Password hashes are for the ingress's AUTH alone; stages may learn which
        // mailboxes exist, not how to log in as one.
        (RoleKind::Pipeline, "mailbox_account") => READ,
        (RoleKind::Pipeline, "mailbox_password") => NONE,
        // The signing stages read the keys; nothing that processes mail may plant or swap one.
        (RoleKind::Pipeline, "signing_key") => READ,
        // Trust anchors of S/MIME signatures are the crypto role's (pepsi-keys) to set; a
        // stage that could add one could make any signature pass.
        (RoleKind::Pipeline, "ca_trust") => READ,
        // Secure links: the stage seals messages and the operator tool revokes, extends and
        // purges them (ALL on secure_link_message). A code's hash is as good as the code (8
        // digits hash in a blink), and the pipeline has no use for codes or sessions: none.
        // The access log is append-only; the tool shows it. Policies are the
        // configuration role's to set; the stage reads them.
        (RoleKind::Pipeline, "secure_link_code" | "secure_link_session") => NONE,
        (RoleKind::Pipeline, "secure_link_access") => READ_APPEND,
        (RoleKind::Pipeline, "secure_link_policy") => READ,
        (RoleKind::Pipeline, _) => ALL,
        (RoleKind::Ingress, "workqueue" | "workqueue_body") => ADMIT,
        (RoleKind::Ingress, "config_override" | "settings") => READ,
        (RoleKind::Ingress, "mailbox_account" | "mailbox_password") => READ,
        // Its own counters: added to (an upsert reads the row it adds to), never deleted.
        (RoleKind::Ingress, "ingress_stats") => COUNT,
        // A full mailbox is refused at RCPT.
        (RoleKind::Ingress, "quota_limit" | "quota_usage") => READ,
        // A list address (and its command addresses) is accepted at RCPT for existing
        // lists only.
        (RoleKind::Ingress, "mailing_list") => READ,
        (RoleKind::Ingress, _) => NONE,
        (RoleKind::Config, "config_override" | "signing_key") => ALL,
        (RoleKind::Config, "settings") => READ,
        // pepsi-quota sets limits and records what it recounts from disk.
        (RoleKind::Config, "quota_limit" | "quota_usage") => ALL,
        (RoleKind::Config, "secure_link_policy") => ALL,
        (RoleKind::Config, _) => NONE,
        // The internet-facing API reads the queue (its page shows a row's body) and writes no
        // queue row, body or token itself: with UPDATE it could rewrite a row's envelope,
        // headers, state and body and so queue anything. The queue actions of pepsi-queue
        // (retry, hold, release, delete, bounce), the lists' mail (a confirmation, a link, a
        // welcome) and the approved or rejected held posts go through the SECURITY DEFINER
        // functions of FUNCTION_GRANTS, each of which makes one kind of change only.
        (RoleKind::Httpd, "workqueue" | "workqueue_body") => READ,
        // Accounts, aliases and local domains are the API's to change; it reads the overlay
        // (BOUNCE_STAGE) and the statistics (/metrics).
        (RoleKind::Httpd, "mailbox_account" | "mailbox_password" | "settings") => ALL,
        // Held posts are the list stage's to add and keep as held: a moderator reads one and
        // decides it (deleting the row). One the API could write, list_held_approve would
        // queue at the list stage and list_held_reject return to any sender.
        (RoleKind::Httpd, "list_held_message") => READ_DELETE,
        // The list pages and the list API: subscriptions, preferences, moderation, settings.
        (RoleKind::Httpd, t) if is_list_table(t) => ALL,
        // The archive's pages read what the list stage archived, and write the login links
        // of private archives (issued, used, expired). The admin API purges as the operator
        // tool does (pepsi_archive::store::purge_posts, purge_author): a post's row goes
        // (its bytes and parts by ON DELETE CASCADE, which runs with the table owner's
        // rights), a purged placeholder may stay, its thread and month are counted down or
        // go, and the purge is logged. It never adds or changes a post, bytes or parts,
        // nor adds a month, so it cannot plant anything in an archive. It reads the imports
        // (the summary); imports and reindexing stay the tool's, under the pipeline role.
        (RoleKind::Httpd, "archive_reader") => ALL,
        (RoleKind::Httpd, "archive_message") => READ_DELETE,
        (RoleKind::Httpd, "archive_placeholder") => READ_APPEND,
        (RoleKind::Httpd, "archive_thread" | "archive_month") => READ_CHANGE_DELETE,
        (RoleKind::Httpd, "archive_event_log") => APPEND,
        (RoleKind::Httpd, t) if is_archive_table(t) => READ,
        // The portal reads sealed messages and changes one only to revoke it for its sender
        // or to re-seal it on a resend (UPDATE); it never makes or deletes one, so a
        // compromised portal cannot plant a message under a link. It issues and spends codes
        // (attempts, used_at), opens and ends sessions, and appends to the access log, which
        // no role may change. Policies are not its business.
        (RoleKind::Httpd, "secure_link_message") => READ_CHANGE,
        (RoleKind::Httpd, "secure_link_code") => COUNT,
        (RoleKind::Httpd, "secure_link_session") => READ_APPEND_DELETE,
        (RoleKind::Httpd, "secure_link_access") => READ_APPEND,
        (RoleKind::Httpd, t) if is_secure_link_table(t) => NONE,
        // The secretary's confirmation page and the owner's page read held mail, challenges
        // and payments; every change goes through secretary_confirm and secretary_decide,
        // which wake only the held rows' own queue rows.
        // The owner's page reads its link (secretary_owner_link), which the digest issues.
        (
            RoleKind::Httpd,
            "secretary_challenge" | "secretary_held" | "secretary_owner_link" | "auto_pay_payment",
        ) => READ,
        // TLS reports other senders POST (/tlsrpt) are added, never changed; /metrics
        // reads them.
        (RoleKind::Httpd, "tls_report_received") => READ_APPEND,
        (
            RoleKind::Httpd,
            "config_override" | "stage_stats" | "dispatch_stats" | "ingress_stats" | "quota_limit"
            | "quota_usage",
        ) => READ,
        (RoleKind::Httpd, _) => NONE,
        (RoleKind::Crypto | RoleKind::Telemetry, _) => {
            unreachable!("the crypto and telemetry roles are decided above")
        }
    }
}

/// The columns of `pepsi.<table>` `kind` may SELECT through a column-level grant (the tables
/// of [`SECRET_COLUMNS`] only): every column but the secret ones for a role that reads the
/// key store, none for the sendmail role. The crypto role reads the whole table.
pub fn column_readers(kind: RoleKind, table: &str) -> bool {
    SECRET_COLUMNS.iter().any(|(t, _)| *t == table)
        && matches!(
            kind,
            RoleKind::Pipeline | RoleKind::Ingress | RoleKind::Httpd | RoleKind::Config
        )
}

/// What a setup or check run found and did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub check_only: bool,
    pub database_created: bool,
    pub patches_applied: Vec<String>,
    pub patches_pending: Vec<String>,
    pub patch_level: Option<String>,
    pub procedures_applied: bool,
    pub roles_created: Vec<String>,
    pub roles_missing: Vec<String>,
    pub privileges_changed: Vec<String>,
    pub privileges_wrong: Vec<String>,
}

impl Report {
    /// True when nothing is pending or wrong.
    pub fn is_current(&self) -> bool {
        self.patches_pending.is_empty()
            && self.roles_missing.is_empty()
            && self.privileges_wrong.is_empty()
    }

    /// True when the run changed the database's schema, roles or grants.
    pub fn changed_anything(&self) -> bool {
        self.database_created
            || !self.patches_applied.is_empty()
            || !self.roles_created.is_empty()
            || !self.privileges_changed.is_empty()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "check_only": self.check_only,
            "database_created": self.database_created,
            "patch_level": self.patch_level,
            "patches_applied": self.patches_applied,
            "patches_pending": self.patches_pending,
            "procedures_applied": self.procedures_applied,
            "roles_created": self.roles_created,
            "roles_missing": self.roles_missing,
            "privileges_changed": self.privileges_changed,
            "privileges_wrong": self.privileges_wrong,
            "current": self.is_current(),
        })
    }

    /// A summary for people, most important line first.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let level = self.patch_level.as_deref().unwrap_or("none");
        let _ = writeln!(
            out,
            "patch level: {level} ({})",
            if self.is_current() {
                "current, grants verified"
            } else {
                "NOT current"
            }
        );
        if self.database_created {
            let _ = writeln!(out, "created the database");
        }
        let lists = [
            ("applied patch", &self.patches_applied),
            ("pending patch", &self.patches_pending),
            ("created role", &self.roles_created),
            ("missing role", &self.roles_missing),
            ("changed", &self.privileges_changed),
            ("wrong privilege", &self.privileges_wrong),
        ];
        for (label, items) in lists {
            for item in items {
                let _ = writeln!(out, "{label}: {item}");
            }
        }
        if self.procedures_applied {
            let _ = writeln!(out, "procedures: re-applied");
        }
        if !self.check_only && !self.changed_anything() {
            let _ = writeln!(out, "nothing to change");
        }
        out
    }
}

/// Quotes an identifier; the only input ever placed in SQL text here (role and database
/// names from the operator's configuration), hence the `AssertSqlSafe` at each use.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The options of `url`, a URL that names no host pinned to `pepsi_contract::db::SOCKET_DIR`:
/// never a socket some local user put in /tmp while the server is down (security review
/// 2026-12-04 #3). A server whose socket is elsewhere is named in the URL (`host=`).
pub fn connect_options(url: &str) -> anyhow::Result<PgConnectOptions> {
    pepsi_contract::db::pinned_options(url, std::path::Path::new(pepsi_contract::db::SOCKET_DIR))
        .with_context(|| format!("not a PostgreSQL URL: {url}"))
}

/// Creates the database named in `url` when it does not exist yet (connecting to the
/// `postgres` maintenance database to do so); returns whether it did.
pub async fn ensure_database(url: &str) -> anyhow::Result<bool> {
    let options = connect_options(url)?;
    match PgConnection::connect_with(&options).await {
        Ok(conn) => {
            conn.close().await.ok();
            Ok(false)
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
            let name = options
                .get_database()
                .context("the database URL names no database")?
                .to_owned();
            let mut admin = PgConnection::connect_with(&options.clone().database("postgres"))
                .await
                .context(
                    "cannot connect to the postgres maintenance database to create the database",
                )?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE DATABASE {}",
                quote_ident(&name)
            )))
            .execute(&mut admin)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
            admin.close().await.ok();
            Ok(true)
        }
        Err(e) => Err(anyhow::Error::new(e).context("cannot connect to the database")),
    }
}

/// Brings the database at `url` up to date (creating it if needed).
pub async fn setup_url(url: &str, roles: &Roles) -> anyhow::Result<Report> {
    let created = ensure_database(url).await?;
    let mut conn = PgConnection::connect_with(&connect_options(url)?)
        .await
        .context("cannot connect to the database")?;
    let mut report = setup(&mut conn, roles).await?;
    report.database_created = created;
    conn.close().await.ok();
    Ok(report)
}

/// Applies missing patches, the procedures, roles and privileges in one transaction, then
/// verifies the privileges. Concurrent runs on one database serialise on an advisory lock.
pub async fn setup(conn: &mut PgConnection, roles: &Roles) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('pepsi-setup'))")
        .execute(&mut *tx)
        .await?;
    let applied = applied_patches(&mut tx).await?;
    for patch in PATCHES.iter().filter(|p| !applied.contains(p.name)) {
        sqlx::raw_sql(patch.sql)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("patch {} failed", patch.name))?;
        sqlx::query("INSERT INTO pepsi.schema_patch (patch_name) VALUES ($1)")
            .bind(patch.name)
            .execute(&mut *tx)
            .await?;
        report.patches_applied.push(patch.name.to_owned());
    }
    sqlx::raw_sql(PROCEDURES)
        .execute(&mut *tx)
        .await
        .context("procedures.sql failed")?;
    report.procedures_applied = true;
    for (_, role) in roles.all() {
        if !role_exists(&mut tx, role).await? {
            // Roles are cluster-wide: a concurrent setup of another database may create the
            // same role first, which is as good as creating it here.
            let sql = format!(
                "DO $$ BEGIN CREATE ROLE {} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
                quote_ident(role)
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await?;
            report.roles_created.push(role.to_owned());
        }
    }
    // Roles and their settings are shared by every database of the server, and two
    // transactions altering one role collide ("tuple concurrently updated"): setups of
    // other databases wait here for this one (the advisory lock above is per database).
    if !role_limit_diff(&mut tx, roles).await?.is_empty() {
        sqlx::raw_sql(
            "LOCK TABLE pg_catalog.pg_authid, pg_catalog.pg_db_role_setting IN SHARE ROW EXCLUSIVE MODE",
        )
        .execute(&mut *tx)
        .await
        .context("cannot lock the role catalogs to set the sendmail role's limits (is pepsi-setup running as a superuser?)")?;
        for fix in role_limit_diff(&mut tx, roles).await? {
            sqlx::raw_sql(sqlx::AssertSqlSafe(fix.sql.clone()))
                .execute(&mut *tx)
                .await
                .with_context(|| format!("cannot apply {}", fix.sql))?;
            report.privileges_changed.push(fix.sql);
        }
    }
    // Two rounds: revoking a table-level grant can take away column privileges a column
    // grant must then give back (SECRET_COLUMNS).
    for _ in 0..2 {
        let fixes = privilege_diff(&mut tx, roles).await?;
        if fixes.is_empty() {
            break;
        }
        for fix in fixes {
            sqlx::raw_sql(sqlx::AssertSqlSafe(fix.sql.clone()))
                .execute(&mut *tx)
                .await
                .with_context(|| format!("cannot apply {}", fix.sql))?;
            report.privileges_changed.push(fix.sql);
        }
    }
    let wrong = privilege_diff(&mut tx, roles).await?;
    if !wrong.is_empty() {
        let list: Vec<_> = wrong.iter().map(|f| f.describe.clone()).collect();
        anyhow::bail!(
            "privileges still wrong after granting (inherited from PUBLIC, a group role, or a superuser role?): {}",
            list.join("; ")
        );
    }
    report.patch_level = applied_patches(&mut tx).await?.into_iter().max();
    tx.commit().await?;
    Ok(report)
}

/// Reports pending patches, missing roles and wrong privileges without changing anything.
pub async fn check(url: &str, roles: &Roles) -> anyhow::Result<Report> {
    let mut conn = PgConnection::connect_with(&connect_options(url)?)
        .await
        .context("cannot connect to the database")?;
    let mut report = Report {
        check_only: true,
        ..Report::default()
    };
    let applied = applied_patches(&mut conn).await?;
    report.patches_pending = PATCHES
        .iter()
        .filter(|p| !applied.contains(p.name))
        .map(|p| p.name.to_owned())
        .collect();
    report.patch_level = applied.iter().max().cloned();
    for (_, role) in roles.all() {
        if !role_exists(&mut conn, role).await? {
            report.roles_missing.push(role.to_owned());
        }
    }
    if report.patches_pending.is_empty() && report.roles_missing.is_empty() {
        report.privileges_wrong = privilege_diff(&mut conn, roles)
            .await?
            .into_iter()
            .map(|f| f.describe)
            .collect();
    }
    conn.close().await.ok();
    Ok(report)
}

async fn applied_patches(conn: &mut PgConnection) -> anyhow::Result<BTreeSet<String>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('pepsi.schema_patch') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(BTreeSet::new());
    }
    let names: Vec<String> = sqlx::query_scalar("SELECT patch_name FROM pepsi.schema_patch")
        .fetch_all(&mut *conn)
        .await?;
    Ok(names.into_iter().collect())
}

async fn role_exists(conn: &mut PgConnection, role: &str) -> anyhow::Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(role)
            .fetch_one(&mut *conn)
            .await?,
    )
}

/// One difference between the live privileges and the matrix, and the statement fixing it.
struct Fix {
    sql: String,
    describe: String,
}

/// Compares every role's schema, sequence and table privileges with the matrix.
async fn privilege_diff(conn: &mut PgConnection, roles: &Roles) -> anyhow::Result<Vec<Fix>> {
    let mut fixes = Vec::new();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'pepsi' ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await?;
    let sequences: Vec<String> = sqlx::query_scalar(
        "SELECT sequencename::text FROM pg_sequences WHERE schemaname = 'pepsi' ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (kind, role) in roles.all() {
        let q = quote_ident(role);
        let usage: bool = sqlx::query_scalar("SELECT has_schema_privilege($1, 'pepsi', 'USAGE')")
            .bind(role)
            .fetch_one(&mut *conn)
            .await?;
        if !usage {
            fixes.push(Fix {
                sql: format!("GRANT USAGE ON SCHEMA pepsi TO {q}"),
                describe: format!("{role} lacks USAGE on schema pepsi"),
            });
        }
        // Identity columns draw from sequences; every role that inserts anywhere needs them.
        // The sendmail role inserts nowhere itself (its function runs as the owner), and the
        // telemetry role only into its own tables: it may not even draw queue ids.
        let needs = |seq: &String| match kind {
            RoleKind::Sendmail => false,
            RoleKind::Telemetry => TELEMETRY_TABLES.iter().any(|t| seq.starts_with(t)),
            _ => true,
        };
        for seq in sequences.iter().filter(|s| needs(s)) {
            let ok: bool = sqlx::query_scalar(
                "SELECT has_sequence_privilege($1, 'pepsi.' || quote_ident($2), 'USAGE')",
            )
            .bind(role)
            .bind(seq)
            .fetch_one(&mut *conn)
            .await?;
            if !ok {
                fixes.push(Fix {
                    sql: format!("GRANT USAGE ON SEQUENCE pepsi.{} TO {q}", quote_ident(seq)),
                    describe: format!("{role} lacks USAGE on sequence pepsi.{seq}"),
                });
            }
        }
        let rows = sqlx::query(
            "SELECT t, p, has_table_privilege($1, 'pepsi.' || quote_ident(t), p) \
             FROM unnest($2::text[]) AS t, unnest($3::text[]) AS p ORDER BY t, p",
        )
        .bind(role)
        .bind(&tables)
        .bind(TABLE_PRIVILEGES)
        .fetch_all(&mut *conn)
        .await?;
        for row in rows {
            let table: String = row.get(0);
            let privilege: String = row.get(1);
            let has: bool = row.get(2);
            let wanted = privilege_matrix(kind, &table).contains(&privilege.as_str());
            let target = format!("pepsi.{}", quote_ident(&table));
            if wanted && !has {
                fixes.push(Fix {
                    sql: format!("GRANT {privilege} ON {target} TO {q}"),
                    describe: format!("{role} lacks {privilege} on pepsi.{table}"),
                });
            } else if has && !wanted {
                fixes.push(Fix {
                    sql: format!("REVOKE {privilege} ON {target} FROM {q}"),
                    describe: format!("{role} must not have {privilege} on pepsi.{table}"),
                });
            }
        }
        fixes.extend(column_diff(conn, kind, role).await?);
        for (function, kinds) in FUNCTION_GRANTS {
            let has: bool =
                sqlx::query_scalar("SELECT has_function_privilege($1, $2::text, 'EXECUTE')")
                    .bind(role)
                    .bind(function)
                    .fetch_one(&mut *conn)
                    .await?;
            let wanted = kinds.contains(&kind);
            if wanted && !has {
                fixes.push(Fix {
                    sql: format!("GRANT EXECUTE ON FUNCTION {function} TO {q}"),
                    describe: format!("{role} lacks EXECUTE on {function}"),
                });
            } else if has && !wanted {
                fixes.push(Fix {
                    sql: format!("REVOKE EXECUTE ON FUNCTION {function} FROM {q}"),
                    describe: format!("{role} must not have EXECUTE on {function}"),
                });
            }
        }
        fixes.extend(definer_diff(conn, kind, role).await?);
    }
    fixes.extend(advisory_diff(conn, roles).await?);
    fixes.extend(role_limit_diff(conn, roles).await?);
    if public_executes_sendmail(conn).await? {
        fixes.push(Fix {
            sql: format!("REVOKE EXECUTE ON FUNCTION {SENDMAIL_FUNCTION} FROM PUBLIC"),
            describe: format!("PUBLIC must not have EXECUTE on {SENDMAIL_FUNCTION}"),
        });
    }
    Ok(fixes)
}

/// Compares `role`'s column-level SELECT on the tables of [`SECRET_COLUMNS`] with
/// [`column_readers`]: the public columns readable, the secret ones not (for every role but
/// the crypto role, whose table-level grant the matrix checks).
async fn column_diff(
    conn: &mut PgConnection,
    kind: RoleKind,
    role: &str,
) -> anyhow::Result<Vec<Fix>> {
    let mut fixes = Vec::new();
    if kind == RoleKind::Crypto {
        return Ok(fixes);
    }
    let q = quote_ident(role);
    for (table, secret) in SECRET_COLUMNS {
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT attname::text FROM pg_attribute \
             WHERE attrelid = ('pepsi.' || quote_ident($1))::regclass AND attnum > 0 AND NOT attisdropped \
             ORDER BY attnum",
        )
        .bind(table)
        .fetch_all(&mut *conn)
        .await?;
        let readers = column_readers(kind, table);
        for column in columns {
            // SELECT on the public columns for the readers; nothing else, column by column
            // (a column grant is invisible to the table-level matrix).
            for privilege in ["SELECT", "INSERT", "UPDATE", "REFERENCES"] {
                let has: bool = sqlx::query_scalar(
                    "SELECT has_column_privilege($1, ('pepsi.' || quote_ident($2))::regclass, $3, $4)",
                )
                .bind(role)
                .bind(table)
                .bind(&column)
                .bind(privilege)
                .fetch_one(&mut *conn)
                .await?;
                let wanted = privilege == "SELECT" && readers && !secret.contains(&column.as_str());
                let target = format!("pepsi.{} ({})", quote_ident(table), quote_ident(&column));
                if wanted && !has {
                    fixes.push(Fix {
                        sql: format!(
                            "GRANT {privilege} ({}) ON pepsi.{} TO {q}",
                            quote_ident(&column),
                            quote_ident(table)
                        ),
                        describe: format!("{role} lacks {privilege} on {target}"),
                    });
                } else if has && !wanted {
                    fixes.push(Fix {
                        sql: format!(
                            "REVOKE {privilege} ({}) ON pepsi.{} FROM {q}",
                            quote_ident(&column),
                            quote_ident(table)
                        ),
                        describe: format!("{role} must not have {privilege} on {target}"),
                    });
                }
            }
        }
    }
    Ok(fixes)
}

/// The roles that may take advisory locks: the dispatcher's singleton lock and epoch
/// membership, and pepsi-whitelist's per-list lock, are the pipeline role's; the crypto
/// stages are stage workers of the same pipeline.
pub const ADVISORY_LOCK_ROLES: &[RoleKind] = &[RoleKind::Pipeline, RoleKind::Crypto];

/// EXECUTE on PostgreSQL's advisory lock functions (`pg_advisory_*`, `pg_try_advisory_*`)
/// in this database: revoked from PUBLIC, granted to [`ADVISORY_LOCK_ROLES`] alone. Every
/// local user reaches the sendmail role, and an advisory lock taken under the dispatcher's
/// key would hold every dispatcher in standby, one under the next epoch's membership key
/// would hang its registration (security review 2026-12-04 #4). Function privileges belong
/// to the database, so this changes nothing elsewhere on the server; changing them needs a
/// superuser, which pepsi-setup runs as.
async fn advisory_diff(conn: &mut PgConnection, roles: &Roles) -> anyhow::Result<Vec<Fix>> {
    let names: Vec<&str> = roles.all().iter().map(|(_, role)| *role).collect();
    // Per function: whether PUBLIC may execute it, and which of our roles may.
    let rows = sqlx::query(
        "SELECT p.oid::regprocedure::text, \
           EXISTS (SELECT 1 FROM aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a \
                   WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'), \
           ARRAY(SELECT r FROM unnest($1::text[]) AS r \
                 WHERE has_function_privilege(r, p.oid, 'EXECUTE')) \
         FROM pg_proc p \
         WHERE p.pronamespace = 'pg_catalog'::regnamespace \
           AND p.proname ~ '^pg_(try_)?advisory_' ORDER BY 1",
    )
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    let mut fixes = Vec::new();
    for row in rows {
        let function: String = row.get(0);
        let public: bool = row.get(1);
        let holders: Vec<String> = row.get(2);
        if public {
            fixes.push(Fix {
                sql: format!("REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC"),
                describe: format!("PUBLIC must not have EXECUTE on {function}"),
            });
        }
        for (kind, role) in roles.all() {
            let has = holders.iter().any(|h| h == role);
            let wanted = ADVISORY_LOCK_ROLES.contains(&kind);
            let q = quote_ident(role);
            if wanted && !has {
                fixes.push(Fix {
                    sql: format!("GRANT EXECUTE ON FUNCTION {function} TO {q}"),
                    describe: format!("{role} lacks EXECUTE on {function}"),
                });
            } else if has && !wanted && !public {
                // While PUBLIC has it every role does; the revoke from PUBLIC comes first.
                fixes.push(Fix {
                    sql: format!("REVOKE EXECUTE ON FUNCTION {function} FROM {q}"),
                    describe: format!("{role} must not have EXECUTE on {function}"),
                });
            }
        }
    }
    Ok(fixes)
}

/// The connection limits and session settings of the roles that have them, the sendmail
/// role's ([`Roles::sendmail_limits`]) and the telemetry role's ([`Roles::telemetry_limits`]).
async fn role_limit_diff(conn: &mut PgConnection, roles: &Roles) -> anyhow::Result<Vec<Fix>> {
    let mut fixes = one_role_limit_diff(conn, &roles.sendmail, &roles.sendmail_limits).await?;
    fixes.extend(one_role_limit_diff(conn, &roles.telemetry, &roles.telemetry_limits).await?);
    Ok(fixes)
}

/// `role`'s connection limit and session settings against `limits`. A role setting for every
/// database (`ALTER ROLE .. SET`), so it holds whichever database the role connects to.
async fn one_role_limit_diff(
    conn: &mut PgConnection,
    role: &str,
    limits: &RoleLimits,
) -> anyhow::Result<Vec<Fix>> {
    let row = sqlx::query(
        "SELECT r.rolconnlimit, COALESCE(s.setconfig, '{}') FROM pg_roles r \
         LEFT JOIN pg_db_role_setting s ON s.setrole = r.oid AND s.setdatabase = 0 \
         WHERE r.rolname = $1",
    )
    .bind(role)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        // A missing role is reported as such.
        return Ok(Vec::new());
    };
    let limit: i32 = row.get(0);
    let config: Vec<String> = row.get(1);
    let q = quote_ident(role);
    let mut fixes = Vec::new();
    let wanted_limit = limits
        .connection_limit
        .map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX));
    if limit != wanted_limit {
        fixes.push(Fix {
            sql: format!("ALTER ROLE {q} CONNECTION LIMIT {wanted_limit}"),
            describe: format!("{role} has CONNECTION LIMIT {limit}, not {wanted_limit}"),
        });
    }
    for (name, value) in limits.settings() {
        let want = format!("{name}={value}");
        if !config.contains(&want) {
            let now = config
                .iter()
                .find(|c| c.starts_with(&format!("{name}=")))
                .map_or("unset", String::as_str);
            fixes.push(Fix {
                // Both are digits and a name of ours: nothing from input.
                sql: format!("ALTER ROLE {q} SET {name} = {value}"),
                describe: format!("{role} has {now}, not {want}"),
            });
        }
    }
    Ok(fixes)
}

/// Whether PUBLIC may execute `SENDMAIL_FUNCTION` (procedures.sql revokes it; a hand-made
/// grant would open the boundary to every role).
async fn public_executes_sendmail(conn: &mut PgConnection) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_proc p, aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a \
         WHERE p.oid = $1::regprocedure AND a.grantee = 0 AND a.privilege_type = 'EXECUTE')",
    )
    .bind(SENDMAIL_FUNCTION)
    .fetch_one(&mut *conn)
    .await?)
}

/// The SECURITY DEFINER functions of schema pepsi `role` may execute against what it must:
/// `SENDMAIL_FUNCTION` for the sendmail role and for no other role; no other definer
/// function for the sendmail role (whose whole privilege is that one function). Who else
/// may execute another definer function is not decided here.
async fn definer_diff(
    conn: &mut PgConnection,
    kind: RoleKind,
    role: &str,
) -> anyhow::Result<Vec<Fix>> {
    let rows = sqlx::query(
        "SELECT p.oid::regprocedure::text, has_function_privilege($1, p.oid, 'EXECUTE') \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'pepsi' AND p.prosecdef ORDER BY 1",
    )
    .bind(role)
    .fetch_all(&mut *conn)
    .await?;
    let sendmail_function: String = sqlx::query_scalar("SELECT $1::regprocedure::text")
        .bind(SENDMAIL_FUNCTION)
        .fetch_one(&mut *conn)
        .await?;
    let q = quote_ident(role);
    let mut fixes = Vec::new();
    for row in rows {
        let function: String = row.get(0);
        let has: bool = row.get(1);
        let is_submit = function == sendmail_function;
        // FUNCTION_GRANTS decides the functions it lists, for every role.
        if FUNCTION_GRANTS.iter().any(|(f, _)| *f == function) {
            continue;
        }
        // Other definer functions belong to other roles' matrices: only the sendmail role
        // is kept from them here.
        if !is_submit && kind != RoleKind::Sendmail {
            continue;
        }
        let wanted = kind == RoleKind::Sendmail && is_submit;
        if wanted && !has {
            fixes.push(Fix {
                sql: format!("GRANT EXECUTE ON FUNCTION {function} TO {q}"),
                describe: format!("{role} lacks EXECUTE on {function}"),
            });
        } else if has && !wanted {
            fixes.push(Fix {
                sql: format!("REVOKE EXECUTE ON FUNCTION {function} FROM {q}"),
                describe: format!("{role} must not have EXECUTE on {function}"),
            });
        }
    }
    Ok(fixes)
}
