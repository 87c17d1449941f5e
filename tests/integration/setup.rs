//! `pepsi-setup`'s schema work against a real PostgreSQL: idempotence, the privilege matrix
//! as the live server enforces it, the overlay's structural rules and config_changed. Here,
//! not in pepsi-setup, because the fresh database comes from pepsi-testkit, which links
//! pepsi-setup: as pepsi-setup's own test it made a dependency cycle.

use pepsi_setup::schema::{self, Roles};
use pepsi_testkit::TestDb;
use sqlx::{Connection as _, PgConnection};

async fn conn(db: &TestDb) -> PgConnection {
    PgConnection::connect(&db.url).await.unwrap()
}

/// Runs `sql` as `role` in a rolled-back transaction; returns the SQLSTATE on failure.
async fn as_role(db: &TestDb, role: &str, sql: &'static str) -> Result<(), String> {
    let mut c = conn(db).await;
    let mut tx = c.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE \"{role}\"")))
        .execute(&mut *tx)
        .await
        .unwrap();
    let r = sqlx::raw_sql(sql).execute(&mut *tx).await;
    tx.rollback().await.ok();
    r.map(|_| ()).map_err(|e| match e {
        sqlx::Error::Database(d) => d.code().unwrap_or_default().into_owned(),
        other => other.to_string(),
    })
}

#[tokio::test]
async fn a_second_run_changes_nothing_and_check_reports_current() {
    let db = TestDb::new().await;
    let report = schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    assert!(!report.changed_anything(), "second run changed: {report:?}");
    assert!(report.patches_applied.is_empty());
    assert_eq!(
        report.patch_level.as_deref(),
        schema::PATCHES.last().map(|p| p.name)
    );
    assert!(
        report.render().contains("nothing to change"),
        "{}",
        report.render()
    );
    let check = schema::check(&db.url, &Roles::default()).await.unwrap();
    assert!(check.is_current(), "{check:?}");
}

#[tokio::test]
async fn setup_creates_a_missing_database_and_reports_the_patches_it_applied() {
    let db = TestDb::new().await;
    let fresh = format!("{}_fresh", db.name);
    let url = db.url.replace(&db.name, &fresh);
    let report = schema::setup_url(&url, &Roles::default()).await.unwrap();
    assert!(report.database_created);
    let all: Vec<_> = schema::PATCHES.iter().map(|p| p.name).collect();
    assert_eq!(report.patches_applied, all);
    assert!(report.is_current());
    let mut c = conn(&db).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE \"{fresh}\" WITH (FORCE)"
    )))
    .execute(&mut c)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_tampered_grant_is_reported_by_check_and_repaired_by_setup() {
    let db = TestDb::new().await;
    let mut c = conn(&db).await;
    sqlx::raw_sql("GRANT UPDATE ON pepsi.config_override TO pepsi; REVOKE INSERT ON pepsi.event_log FROM \"pepsi-ingress\"")
        .execute(&mut c)
        .await
        .unwrap();
    let check = schema::check(&db.url, &Roles::default()).await.unwrap();
    assert!(!check.is_current());
    assert!(
        check
            .privileges_wrong
            .iter()
            .any(|w| w == "pepsi must not have UPDATE on pepsi.config_override"),
        "{check:?}"
    );
    assert!(
        check
            .privileges_wrong
            .iter()
            .any(|w| w == "pepsi-ingress lacks INSERT on pepsi.event_log")
    );
    let fixed = schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    assert_eq!(fixed.privileges_changed.len(), 2, "{fixed:?}");
    assert!(
        schema::check(&db.url, &Roles::default())
            .await
            .unwrap()
            .is_current()
    );
}

#[tokio::test]
async fn the_pipeline_role_reads_but_cannot_write_the_configuration_overlay() {
    let db = TestDb::new().await;
    let insert = "INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'stage-init', 'PARALLELISM', '4')";
    assert_eq!(as_role(&db, "pepsi", insert).await, Err("42501".into()));
    assert_eq!(
        as_role(&db, "pepsi-ingress", insert).await,
        Err("42501".into())
    );
    assert_eq!(
        as_role(&db, "pepsi", "SELECT * FROM pepsi.config_override").await,
        Ok(())
    );
    assert_eq!(as_role(&db, "pepsi-config", insert).await, Ok(()));
    assert_eq!(
        as_role(&db, "pepsi", "DELETE FROM pepsi.config_override").await,
        Err("42501".into())
    );
}

#[tokio::test]
async fn the_logs_are_insert_only_for_mail_processing_roles() {
    let db = TestDb::new().await;
    for role in ["pepsi", "pepsi-ingress", "pepsi-config"] {
        let insert = "INSERT INTO pepsi.event_log (action) VALUES ('test')";
        assert_eq!(
            as_role(&db, role, insert).await,
            Ok(()),
            "{role} inserts into event_log"
        );
        let insert = "INSERT INTO pepsi.mail_log (event) VALUES ('delivered')";
        assert_eq!(
            as_role(&db, role, insert).await,
            Ok(()),
            "{role} inserts into mail_log"
        );
        for forbidden in [
            "UPDATE pepsi.event_log SET action = 'x'",
            "DELETE FROM pepsi.event_log",
            "UPDATE pepsi.mail_log SET event = 'x'",
            "DELETE FROM pepsi.mail_log",
        ] {
            assert_eq!(
                as_role(&db, role, forbidden).await,
                Err("42501".into()),
                "{role}: {forbidden}"
            );
        }
    }
}

#[tokio::test]
async fn the_ingress_role_admits_mail_and_nothing_more() {
    let db = TestDb::new().await;
    let add = "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'Subject: x\r\n'::bytea, 'y'::bytea)";
    assert_eq!(as_role(&db, "pepsi-ingress", add).await, Ok(()));
    assert_eq!(
        as_role(
            &db,
            "pepsi-ingress",
            "UPDATE pepsi.workqueue SET status = 'running'"
        )
        .await,
        Err("42501".into())
    );
    assert_eq!(
        as_role(&db, "pepsi-ingress", "DELETE FROM pepsi.workqueue").await,
        Err("42501".into())
    );
    assert_eq!(
        as_role(&db, "pepsi", add).await,
        Ok(()),
        "the pipeline may inject too"
    );
}

/// The dispatcher's queue functions run with the caller's rights: the pipeline role (which
/// runs the dispatcher) may call every one of them, the ingress none that writes.
#[tokio::test]
async fn the_dispatcher_functions_serve_the_pipeline_role_and_not_the_ingress() {
    let db = TestDb::new().await;
    let writers = [
        "SELECT * FROM pepsi.dispatch_claim(ARRAY['init'], ARRAY[1], ARRAY[1], ARRAY[1.0]::float8[], '{}', '{}', '{}', 16)",
        "SELECT pepsi.dispatch_requeue_due()",
        "SELECT pepsi.dispatch_take_over(ARRAY[1::bigint])",
        "SELECT pepsi.dispatch_reconcile(ARRAY[1::bigint], 60, 60)",
        "SELECT pepsi.dispatch_hand_back(ARRAY[1::bigint], 'init')",
        "SELECT pepsi.dispatch_force(ARRAY[1::bigint], 'init', 'failed', 'stage crashed')",
    ];
    for sql in writers
        .into_iter()
        .chain(["SELECT pepsi.dispatch_next_due()"])
    {
        assert_eq!(as_role(&db, "pepsi", sql).await, Ok(()), "{sql}");
    }
    for sql in writers {
        assert_eq!(
            as_role(&db, "pepsi-ingress", sql).await,
            Err("42501".into()),
            "{sql}"
        );
    }
}

#[tokio::test]
async fn bootstrap_and_listener_sections_cannot_be_stored_in_the_overlay() {
    let db = TestDb::new().await;
    for section in ["database", "PATHS", "listener-mx", "Listener-Submission"] {
        let r = sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', $1, 'X', 'y')")
            .bind(section)
            .execute(&db.pool)
            .await;
        let code = match r {
            Err(sqlx::Error::Database(d)) => d.code().unwrap_or_default().into_owned(),
            other => panic!("{section} was accepted: {other:?}"),
        };
        assert_eq!(code, "23514", "{section}: check violation");
    }
    let bad_scope = sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('planet:mars', 's', 'X', 'y')")
        .execute(&db.pool)
        .await;
    assert!(bad_scope.is_err());
}

#[tokio::test]
async fn changing_the_overlay_notifies_config_changed() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener.listen("config_changed").await.unwrap();
    sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('domain:example.test', 'stage-init', 'PARALLELISM', '2')")
        .execute(&db.pool)
        .await
        .unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification within 10 s")
        .unwrap();
    assert_eq!((n.channel(), n.payload()), ("config_changed", "INSERT"));
}

/// PEM armour around nothing usable: the table checks the armour, the stage the key.
const ARMOURED: &str = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";

#[tokio::test]
async fn only_the_config_role_writes_signing_keys_and_the_ingress_cannot_read_them() {
    let db = TestDb::new().await;
    let insert = "INSERT INTO pepsi.signing_key (domain, selector, private_key) \
                  VALUES ('example.test', 'sel1', '-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n')";
    assert_eq!(as_role(&db, "pepsi", insert).await, Err("42501".into()));
    assert_eq!(
        as_role(&db, "pepsi-ingress", insert).await,
        Err("42501".into())
    );
    assert_eq!(as_role(&db, "pepsi-config", insert).await, Ok(()));
    let read = "SELECT * FROM pepsi.signing_key";
    assert_eq!(as_role(&db, "pepsi", read).await, Ok(()));
    assert_eq!(
        as_role(&db, "pepsi-ingress", read).await,
        Err("42501".into())
    );
    for write in [
        "UPDATE pepsi.signing_key SET enabled = false",
        "DELETE FROM pepsi.signing_key",
    ] {
        assert_eq!(
            as_role(&db, "pepsi", write).await,
            Err("42501".into()),
            "{write}"
        );
        assert_eq!(as_role(&db, "pepsi-config", write).await, Ok(()), "{write}");
    }
}

#[tokio::test]
async fn a_signing_key_row_must_name_a_domain_a_selector_and_hold_pem() {
    let db = TestDb::new().await;
    let insert = |domain: &'static str, selector: &'static str, pem: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO pepsi.signing_key (domain, selector, private_key) VALUES ($1, $2, $3)",
            )
            .bind(domain)
            .bind(selector)
            .bind(pem)
            .execute(&pool)
            .await
            .map(|_| ())
            .map_err(|e| match e {
                sqlx::Error::Database(d) => d.code().unwrap_or_default().into_owned(),
                other => other.to_string(),
            })
        }
    };
    assert_eq!(
        insert("mail.example.test", "s_2026.a", ARMOURED).await,
        Ok(())
    );
    assert_eq!(
        insert(
            "example.test",
            "rsa1",
            "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----"
        )
        .await,
        Ok(())
    );
    for (domain, selector, pem) in [
        ("Example.test", "s1", ARMOURED),
        ("example.test.", "s1", ARMOURED),
        ("localhost", "s1", ARMOURED),
        ("", "s1", ARMOURED),
        ("exa mple.test", "s1", ARMOURED),
        ("a..b.test", "s1", ARMOURED),
        ("example.test", "", ARMOURED),
        ("example.test", "s 1", ARMOURED),
        ("example.test", "s;1", ARMOURED),
        ("example.test", "s1", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
        (
            "example.test",
            "s1",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ),
        ("example.test", "s1", "-----BEGIN PRIVATE KEY-----\nAAAA\n"),
    ] {
        assert_eq!(
            insert(domain, selector, pem).await,
            Err("23514".into()),
            "{domain:?} {selector:?} {pem:?}: check violation"
        );
    }
    let enabled: bool = sqlx::query_scalar(
        "SELECT enabled FROM pepsi.signing_key WHERE domain = 'mail.example.test'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(enabled, "a key is enabled unless said otherwise");
}

#[tokio::test]
async fn changing_the_signing_keys_notifies_config_changed() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener.listen("config_changed").await.unwrap();
    for (sql, op) in [
        (
            "INSERT INTO pepsi.signing_key (domain, selector, private_key) VALUES ('example.test', 'sel1', $1)",
            "INSERT",
        ),
        (
            "UPDATE pepsi.signing_key SET enabled = false WHERE $1 <> ''",
            "UPDATE",
        ),
        ("DELETE FROM pepsi.signing_key WHERE $1 <> ''", "DELETE"),
    ] {
        sqlx::query(sql)
            .bind(ARMOURED)
            .execute(&db.pool)
            .await
            .unwrap();
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
            .await
            .unwrap_or_else(|_| panic!("a notification for {op} within 10 s"))
            .unwrap();
        assert_eq!((n.channel(), n.payload()), ("config_changed", op));
    }
}

#[tokio::test]
async fn admission_does_not_notify_the_workqueue_channel() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener.listen("workqueue").await.unwrap();
    sqlx::query("SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'S: x\r\n'::bytea, 'y'::bytea)")
        .execute(&db.pool)
        .await
        .unwrap();
    pepsi_contract::db::notify_workqueue(&db.pool)
        .await
        .unwrap();
    // The first notification to arrive must be the explicit one: payload "" from notify_workqueue.
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("the explicit notification arrives")
        .unwrap();
    assert_eq!((n.channel(), n.payload()), ("workqueue", ""));
    let extra = tokio::time::timeout(std::time::Duration::from_millis(300), listener.recv()).await;
    assert!(
        extra.is_err(),
        "admission sent a notification of its own: {extra:?}"
    );
}

#[test]
fn the_matrix_keeps_the_overlay_out_of_reach_of_mail_processing() {
    use schema::{RoleKind, privilege_matrix};
    let check = |kind, table, expected: &[&str]| {
        assert_eq!(
            privilege_matrix(kind, table),
            expected,
            "{kind:?} on {table}"
        )
    };
    check(RoleKind::Pipeline, "config_override", &["SELECT"]);
    check(RoleKind::Ingress, "config_override", &["SELECT"]);
    check(
        RoleKind::Config,
        "config_override",
        &["SELECT", "INSERT", "UPDATE", "DELETE"],
    );
    check(RoleKind::Pipeline, "event_log", &["INSERT"]);
    check(RoleKind::Ingress, "mail_log", &["INSERT"]);
    check(
        RoleKind::Pipeline,
        "workqueue",
        &["SELECT", "INSERT", "UPDATE", "DELETE"],
    );
    check(RoleKind::Ingress, "workqueue", &["SELECT", "INSERT"]);
    check(RoleKind::Ingress, "stage_stats", &[]);
    check(RoleKind::Config, "workqueue", &[]);
    check(RoleKind::Ingress, "mailbox_password", &["SELECT"]);
    check(RoleKind::Pipeline, "mailbox_password", &[]);
    check(RoleKind::Pipeline, "mailbox_account", &["SELECT"]);
    check(RoleKind::Config, "mailbox_password", &[]);
    check(RoleKind::Pipeline, "signing_key", &["SELECT"]);
    check(RoleKind::Ingress, "signing_key", &[]);
    check(
        RoleKind::Config,
        "signing_key",
        &["SELECT", "INSERT", "UPDATE", "DELETE"],
    );
    let all = &["SELECT", "INSERT", "UPDATE", "DELETE"][..];
    for table in schema::CREDENTIAL_TABLES {
        check(RoleKind::Httpd, table, all);
        for kind in [RoleKind::Pipeline, RoleKind::Ingress, RoleKind::Config] {
            check(kind, table, &[]);
        }
    }
    check(RoleKind::Httpd, "mail_log", &["SELECT", "INSERT"]);
    // The queue actions and the lists' own mail go through definer functions, so the
    // internet-facing API writes no queue row, body or token itself.
    check(RoleKind::Httpd, "workqueue", &["SELECT"]);
    check(RoleKind::Httpd, "workqueue_body", &["SELECT"]);
    check(RoleKind::Httpd, "clone_token", &[]);
    check(RoleKind::Httpd, "list_held_message", &["SELECT", "DELETE"]);
    check(RoleKind::Httpd, "list_member", all);
    check(RoleKind::Httpd, "signing_key", &[]);
    check(RoleKind::Httpd, "config_override", &["SELECT"]);
    // The archive: written by the list stage and the operator tool (pipeline role); the
    // pages read it and write the private archives' login links; the admin API purges (a
    // post's row goes, its thread and month are counted down, a purged placeholder may
    // stay, the purge is logged) but never adds or changes a post, its bytes or parts.
    check(RoleKind::Pipeline, "archive_message", all);
    check(RoleKind::Crypto, "archive_body", all);
    check(RoleKind::Httpd, "archive_message", &["SELECT", "DELETE"]);
    check(RoleKind::Httpd, "archive_body", &["SELECT"]);
    check(RoleKind::Httpd, "archive_part", &["SELECT"]);
    check(
        RoleKind::Httpd,
        "archive_placeholder",
        &["SELECT", "INSERT"],
    );
    check(
        RoleKind::Httpd,
        "archive_thread",
        &["SELECT", "UPDATE", "DELETE"],
    );
    check(
        RoleKind::Httpd,
        "archive_month",
        &["SELECT", "UPDATE", "DELETE"],
    );
    check(RoleKind::Httpd, "archive_reader", all);
    check(RoleKind::Httpd, "archive_event_log", &["INSERT"]);
    check(RoleKind::Httpd, "archive_import", &["SELECT"]);
    check(RoleKind::Ingress, "archive_message", &[]);
    check(RoleKind::Config, "archive_body", &[]);
    check(RoleKind::Sendmail, "archive_message", &[]);
    // Secure links: the stage and the operator tool keep sealed messages; the portal reads
    // them, and alone touches codes and sessions (a code's hash is as good as the code).
    check(RoleKind::Pipeline, "secure_link_message", all);
    check(RoleKind::Crypto, "secure_link_message", all);
    check(RoleKind::Pipeline, "secure_link_code", &[]);
    check(RoleKind::Pipeline, "secure_link_session", &[]);
    check(
        RoleKind::Pipeline,
        "secure_link_access",
        &["SELECT", "INSERT"],
    );
    check(RoleKind::Pipeline, "secure_link_policy", &["SELECT"]);
    check(RoleKind::Config, "secure_link_policy", all);
    check(RoleKind::Config, "secure_link_message", &[]);
    check(
        RoleKind::Httpd,
        "secure_link_message",
        &["SELECT", "UPDATE"],
    );
    check(
        RoleKind::Httpd,
        "secure_link_code",
        &["SELECT", "INSERT", "UPDATE"],
    );
    check(
        RoleKind::Httpd,
        "secure_link_session",
        &["SELECT", "INSERT", "DELETE"],
    );
    check(RoleKind::Httpd, "secure_link_access", &["SELECT", "INSERT"]);
    check(RoleKind::Httpd, "secure_link_policy", &[]);
    check(RoleKind::Ingress, "secure_link_message", &[]);
    check(RoleKind::Sendmail, "secure_link_access", &[]);
    // Telemetry: the receiver (its own host, facing the network) adds, reads and expires
    // its spans and points and reaches nothing else; pepsi-httpd reads them.
    for table in schema::TELEMETRY_TABLES {
        check(RoleKind::Telemetry, table, &["SELECT", "INSERT", "DELETE"]);
        check(RoleKind::Httpd, table, &["SELECT"]);
        for kind in [
            RoleKind::Pipeline,
            RoleKind::Ingress,
            RoleKind::Config,
            RoleKind::Sendmail,
            RoleKind::Crypto,
        ] {
            check(kind, table, &[]);
        }
    }
    check(RoleKind::Telemetry, "schema_patch", &["SELECT"]);
    for table in [
        "workqueue",
        "workqueue_body",
        "crypto_identity",
        "config_override",
    ]
    .into_iter()
    .chain(schema::CREDENTIAL_TABLES)
    {
        check(RoleKind::Telemetry, table, &[]);
    }
}

/// The live grants of the secure-link tables: the portal cannot plant a message or rewrite
/// the access log, the pipeline cannot read a code's hash, the ingress reads nothing.
#[tokio::test]
async fn the_secure_link_tables_hold_each_role_to_its_part() {
    let db = TestDb::new().await;
    let plant = "INSERT INTO pepsi.secure_link_message (link_id, sender, recipient, expires_at, nonce, ciphertext, db_half, size) VALUES ('AAAAAAAAAAAAAAAAAAAAAA', 'a@example.test', 'b@example.net', now(), '\\x000000000000000000000000', '\\x00', decode(repeat('00', 32), 'hex'), 1)";
    assert_eq!(as_role(&db, "pepsi", plant).await, Ok(()));
    for (role, sql, expected) in [
        ("pepsi-httpd", plant, Err("42501")),
        (
            "pepsi-httpd",
            "UPDATE pepsi.secure_link_message SET revoked_at = now()",
            Ok(()),
        ),
        (
            "pepsi-httpd",
            "DELETE FROM pepsi.secure_link_message",
            Err("42501"),
        ),
        (
            "pepsi-httpd",
            "SELECT * FROM pepsi.secure_link_code",
            Ok(()),
        ),
        (
            "pepsi-httpd",
            "DELETE FROM pepsi.secure_link_access",
            Err("42501"),
        ),
        (
            "pepsi-httpd",
            "UPDATE pepsi.secure_link_access SET detail = ''",
            Err("42501"),
        ),
        (
            "pepsi-httpd",
            "SELECT * FROM pepsi.secure_link_policy",
            Err("42501"),
        ),
        (
            "pepsi",
            "SELECT * FROM pepsi.secure_link_code",
            Err("42501"),
        ),
        (
            "pepsi",
            "SELECT * FROM pepsi.secure_link_session",
            Err("42501"),
        ),
        (
            "pepsi",
            "DELETE FROM pepsi.secure_link_access",
            Err("42501"),
        ),
        (
            "pepsi",
            "INSERT INTO pepsi.secure_link_policy (scope, domain, mode) VALUES ('recipient_domain', 'example.net', 'always')",
            Err("42501"),
        ),
        (
            "pepsi-config",
            "INSERT INTO pepsi.secure_link_policy (scope, domain, mode) VALUES ('recipient_domain', 'example.net', 'always')",
            Ok(()),
        ),
        (
            "pepsi-ingress",
            "SELECT * FROM pepsi.secure_link_message",
            Err("42501"),
        ),
        (
            "pepsi-sendmail",
            "SELECT * FROM pepsi.secure_link_access",
            Err("42501"),
        ),
    ] {
        assert_eq!(
            as_role(&db, role, sql).await,
            expected.map_err(String::from),
            "{role}: {sql}"
        );
    }
}

/// The overlay cannot name a program, a key, a trust anchor or a directory: the table refuses
/// every file-only option, in any section and letter case, and its CHECK lists exactly the
/// options the loader ignores (`pepsi_conf::config::FILE_ONLY_OPTIONS`).
#[tokio::test]
async fn options_naming_programs_keys_or_trust_anchors_cannot_be_stored_in_the_overlay() {
    let db = TestDb::new().await;
    let attempts = [
        ("stage-init", "PROGRAM", "/tmp/x"),
        ("pepsi-dispatch", "LIBEXEC_DIR", "/tmp"),
        ("stage-local", "helper", "/tmp/x"),
        ("pepsi-ingress", " DNS_SERVERS ", "192.0.2.53:53"),
        ("stage-dkim", "KEYS", "evil.test:s:/tmp/key.pem"),
        ("stage-relay", "TLS_CA_FILE", "/tmp/ca.pem"),
        ("stage-local", "ALLOW_ROOT_OWNER", "yes"),
    ];
    for (section, option, value) in attempts {
        let r = sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', $1, $2, $3)")
            .bind(section)
            .bind(option)
            .bind(value)
            .execute(&db.pool)
            .await;
        let code = match r {
            Err(sqlx::Error::Database(d)) => d.code().unwrap_or_default().into_owned(),
            other => panic!("[{section}] {option} was accepted: {other:?}"),
        };
        assert_eq!(code, "23514", "[{section}] {option}: check violation");
    }
    // An ordinary option is still accepted, and cannot be turned into a file-only one.
    sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'stage-init', 'PARALLELISM', '4')")
        .execute(&db.pool)
        .await
        .unwrap();
    let renamed = sqlx::query(
        "UPDATE pepsi.config_override SET option = 'PROGRAM' WHERE option = 'PARALLELISM'",
    )
    .execute(&db.pool)
    .await;
    assert!(renamed.is_err(), "an update is checked too");

    let definition: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'config_override_file_only'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut in_db: Vec<String> = definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    in_db.sort();
    let mut in_code: Vec<String> = pepsi_conf::config::FILE_ONLY_OPTIONS
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    in_code.sort();
    assert_eq!(
        in_db, in_code,
        "pepsi-0004.sql and FILE_ONLY_OPTIONS list the same options"
    );
}

/// The sendmail role's whole privilege is one function: it reads and writes no table, may
/// not call the admission function the ingress uses, and its function stores a validated
/// message at init; no other role may call that function.
#[tokio::test]
async fn the_sendmail_role_may_only_submit_through_its_function() {
    let db = TestDb::new().await;
    let submit = "SELECT pepsi.sendmail_submit('alice@example.test', ARRAY['bob@example.org'], \
                  'Subject: x\r\n'::bytea, 'y'::bytea, '{}', 1000, 'alice', 'direct')";
    assert_eq!(as_role(&db, "pepsi-sendmail", submit).await, Ok(()));
    for sql in [
        "SELECT * FROM pepsi.workqueue",
        "INSERT INTO pepsi.event_log (action) VALUES ('x')",
        "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'S: x\r\n'::bytea, 'y'::bytea)",
        "SELECT * FROM pepsi.schema_patch",
    ] {
        assert_eq!(
            as_role(&db, "pepsi-sendmail", sql).await,
            Err("42501".into()),
            "{sql}"
        );
    }
    for role in ["pepsi", "pepsi-ingress", "pepsi-config"] {
        assert_eq!(
            as_role(&db, role, submit).await,
            Err("42501".into()),
            "{role} calls sendmail_submit"
        );
    }
    // What the function refuses, whoever calls it.
    for bad in [
        "SELECT pepsi.sendmail_submit('a b@example.test', ARRAY['bob@example.org'], ''::bytea, 'y'::bytea, '{}', 1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', ARRAY['<bob@example.org>'], ''::bytea, 'y'::bytea, '{}', 1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', '{}', ''::bytea, 'y'::bytea, '{}', 1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', ARRAY['b@x.test'], 'S: x\r\n\r\nT: y\r\n'::bytea, 'y'::bytea, '{}', 1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', ARRAY['b@x.test'], ''::bytea, 'y'::bytea, '{\"ret\": \"ALL\"}', 1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', ARRAY['b@x.test'], ''::bytea, 'y'::bytea, '{\"rcpt\": [{\"notify\": [\"NEVER\", \"DELAY\"]}]}', 1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', ARRAY['b@x.test'], ''::bytea, 'y'::bytea, '{}', -1, NULL, 'direct')",
        "SELECT pepsi.sendmail_submit('', ARRAY['b@x.test'], ''::bytea, 'y'::bytea, '{}', 1, NULL, 'smtp')",
    ] {
        assert_eq!(
            as_role(&db, "pepsi-sendmail", bad).await,
            Err("22023".into()),
            "{bad}"
        );
    }
    // A grant to another role is found by check and taken back by setup.
    let mut c = conn(&db).await;
    sqlx::raw_sql(
        "GRANT EXECUTE ON FUNCTION pepsi.sendmail_submit(text, text[], bytea, bytea, jsonb, bigint, text, text, text) TO pepsi; \
         GRANT SELECT ON pepsi.workqueue TO \"pepsi-sendmail\"",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let check = schema::check(&db.url, &Roles::default()).await.unwrap();
    let wrong = check.privileges_wrong.join("; ");
    assert!(
        wrong.contains("pepsi must not have EXECUTE on pepsi.sendmail_submit"),
        "{wrong}"
    );
    assert!(
        wrong.contains("pepsi-sendmail must not have SELECT on pepsi.workqueue"),
        "{wrong}"
    );
    schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    assert!(
        schema::check(&db.url, &Roles::default())
            .await
            .unwrap()
            .is_current()
    );
}

/// Regression: setup took EXECUTE on every other SECURITY DEFINER function from every role;
/// it governs only what the sendmail role may execute (and who may call its function).
#[tokio::test]
async fn other_definer_functions_keep_their_grants_but_not_for_the_sendmail_role() {
    let db = TestDb::new().await;
    let mut c = conn(&db).await;
    sqlx::raw_sql(
        "CREATE FUNCTION pepsi.other_definer() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'; \
         REVOKE ALL ON FUNCTION pepsi.other_definer() FROM PUBLIC; \
         GRANT EXECUTE ON FUNCTION pepsi.other_definer() TO pepsi, \"pepsi-sendmail\"",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let report = schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    assert_eq!(
        report.privileges_changed,
        ["REVOKE EXECUTE ON FUNCTION pepsi.other_definer() FROM \"pepsi-sendmail\""]
    );
    let call = "SELECT pepsi.other_definer()";
    assert_eq!(as_role(&db, "pepsi", call).await, Ok(()));
    assert_eq!(
        as_role(&db, "pepsi-sendmail", call).await,
        Err("42501".into())
    );
}

/// The credential tables of the administrative API belong to the httpd role alone: no role
/// that processes mail (nor the config role) may read a session or token digest.
#[tokio::test]
async fn only_the_httpd_role_touches_the_credential_tables() {
    let db = TestDb::new().await;
    let reads = [
        "SELECT * FROM pepsi.admin_account",
        "SELECT * FROM pepsi.admin_session",
        "SELECT * FROM pepsi.api_token",
    ];
    for role in ["pepsi", "pepsi-ingress", "pepsi-config"] {
        for sql in reads {
            assert_eq!(
                as_role(&db, role, sql).await,
                Err("42501".into()),
                "{role}: {sql}"
            );
        }
    }
    for sql in reads {
        assert_eq!(as_role(&db, "pepsi-httpd", sql).await, Ok(()), "{sql}");
    }
    let add =
        "INSERT INTO pepsi.admin_account (name, password_hash) VALUES ('root', '$argon2id$x')";
    assert_eq!(as_role(&db, "pepsi-httpd", add).await, Ok(()));
    assert_eq!(as_role(&db, "pepsi", add).await, Err("42501".into()));
    // The API searches the logs and appends to the audit log, and changes neither.
    assert_eq!(
        as_role(&db, "pepsi-httpd", "SELECT * FROM pepsi.mail_log").await,
        Ok(())
    );
    assert_eq!(
        as_role(&db, "pepsi-httpd", "DELETE FROM pepsi.event_log").await,
        Err("42501".into())
    );
    // It reads the queue and writes nothing there itself: not a row, a body or an
    // at-most-once token, directly or through workqueue_inject (the queue actions go
    // through their definer functions).
    for sql in [
        "SELECT * FROM pepsi.workqueue",
        "SELECT * FROM pepsi.workqueue_body",
    ] {
        assert_eq!(as_role(&db, "pepsi-httpd", sql).await, Ok(()), "{sql}");
    }
    for sql in [
        "UPDATE pepsi.workqueue SET updated_at = now()",
        "UPDATE pepsi.workqueue SET stage = 'relay', mail_from = 'ceo@example.test', rcpt_to = ARRAY['b@example.test'], state = '{}'",
        "DELETE FROM pepsi.workqueue",
        "UPDATE pepsi.workqueue_body SET body = 'y'::bytea",
        "DELETE FROM pepsi.workqueue_body",
        "INSERT INTO pepsi.workqueue_body (body) VALUES ('y'::bytea)",
        "INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to, headers, body_id) VALUES ('relay', 'a@example.test', ARRAY['b@example.test'], ''::bytea, 1)",
        "INSERT INTO pepsi.clone_token (token) VALUES ('list-approve:1')",
        "DELETE FROM pepsi.clone_token",
        "SELECT pepsi.workqueue_inject('relay', 'ceo@example.test', ARRAY['b@example.test'], 'S: x\r\n'::bytea, 'y'::bytea, '{}')",
        "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'S: x\r\n'::bytea, 'y'::bytea)",
    ] {
        assert_eq!(
            as_role(&db, "pepsi-httpd", sql).await,
            Err("42501".into()),
            "{sql}"
        );
    }
}

/// A database set up when the httpd role could queue mail itself loses those grants on the
/// next `pepsi-setup db`, which names each revoke.
#[tokio::test]
async fn setup_takes_the_old_queue_grants_from_the_httpd_role() {
    let db = TestDb::new().await;
    let mut c = conn(&db).await;
    sqlx::raw_sql(
        "GRANT INSERT ON pepsi.workqueue, pepsi.workqueue_body, pepsi.clone_token, \
         pepsi.list_held_message TO \"pepsi-httpd\"; \
         GRANT SELECT, UPDATE ON pepsi.clone_token, pepsi.list_held_message TO \"pepsi-httpd\"; \
         GRANT UPDATE, DELETE ON pepsi.workqueue, pepsi.workqueue_body TO \"pepsi-httpd\"; \
         GRANT EXECUTE ON FUNCTION pepsi.workqueue_retry(bigint, boolean) TO \"pepsi-ingress\"; \
         REVOKE EXECUTE ON FUNCTION pepsi.workqueue_hold(bigint, boolean, text) FROM \"pepsi-httpd\"",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let report = schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    let mut changed = report.privileges_changed.clone();
    changed.sort();
    assert_eq!(
        changed,
        [
            "GRANT EXECUTE ON FUNCTION pepsi.workqueue_hold(bigint,boolean,text) TO \"pepsi-httpd\"",
            "REVOKE DELETE ON pepsi.\"workqueue\" FROM \"pepsi-httpd\"",
            "REVOKE DELETE ON pepsi.\"workqueue_body\" FROM \"pepsi-httpd\"",
            "REVOKE EXECUTE ON FUNCTION pepsi.workqueue_retry(bigint,boolean) FROM \"pepsi-ingress\"",
            "REVOKE INSERT ON pepsi.\"clone_token\" FROM \"pepsi-httpd\"",
            "REVOKE INSERT ON pepsi.\"list_held_message\" FROM \"pepsi-httpd\"",
            "REVOKE INSERT ON pepsi.\"workqueue\" FROM \"pepsi-httpd\"",
            "REVOKE INSERT ON pepsi.\"workqueue_body\" FROM \"pepsi-httpd\"",
            "REVOKE SELECT ON pepsi.\"clone_token\" FROM \"pepsi-httpd\"",
            "REVOKE UPDATE ON pepsi.\"clone_token\" FROM \"pepsi-httpd\"",
            "REVOKE UPDATE ON pepsi.\"list_held_message\" FROM \"pepsi-httpd\"",
            "REVOKE UPDATE ON pepsi.\"workqueue\" FROM \"pepsi-httpd\"",
            "REVOKE UPDATE ON pepsi.\"workqueue_body\" FROM \"pepsi-httpd\"",
        ]
    );
    assert_eq!(
        as_role(
            &db,
            "pepsi-httpd",
            "UPDATE pepsi.workqueue SET stage = 'relay'"
        )
        .await,
        Err("42501".into())
    );
    assert_eq!(
        as_role(
            &db,
            "pepsi-httpd",
            "INSERT INTO pepsi.workqueue_body (body) VALUES ('y'::bytea)"
        )
        .await,
        Err("42501".into())
    );
}

/// Runs `sql` as `role` and commits; the one value it returns, or the SQLSTATE.
async fn value_as_role(db: &TestDb, role: &str, sql: String) -> Result<serde_json::Value, String> {
    let mut c = conn(db).await;
    let mut tx = c.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE \"{role}\"")))
        .execute(&mut *tx)
        .await
        .unwrap();
    let r: Result<serde_json::Value, _> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut *tx)
        .await;
    match r {
        Ok(v) => {
            tx.commit().await.unwrap();
            Ok(v)
        }
        Err(sqlx::Error::Database(d)) => Err(d.code().unwrap_or_default().into_owned()),
        Err(other) => Err(other.to_string()),
    }
}

/// The queue actions of pepsi-queue and the API run as their owner, executable by the
/// pipeline and httpd roles alone: the httpd role holds, releases, retries, bounces and
/// deletes a row through them (recorded as itself) though it may not write the queue, and
/// every other role is refused.
#[tokio::test]
async fn the_queue_actions_are_the_pipeline_and_httpd_roles_alone() {
    let db = TestDb::new().await;
    let add = "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], \
               'Subject: x\r\n'::bytea, 'y'::bytea)";
    let id = id_as_role(&db, "pepsi", add).await.unwrap().unwrap();
    let other = id_as_role(&db, "pepsi", add).await.unwrap().unwrap();
    let httpd = "pepsi-httpd";
    let held = value_as_role(
        &db,
        httpd,
        format!("SELECT pepsi.workqueue_hold({id}, false, 'abuse report')"),
    )
    .await
    .unwrap();
    assert_eq!(held["changed"], true, "{held}");
    let state: serde_json::Value =
        sqlx::query_scalar("SELECT state FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        state["held"]["by"], httpd,
        "the caller, not the owner: {state}"
    );
    assert_eq!(state["held"]["reason"], "abuse report");
    let released = value_as_role(&db, httpd, format!("SELECT pepsi.workqueue_release({id})"))
        .await
        .unwrap();
    assert_eq!(released["to_status"], "pending", "{released}");
    let retried = value_as_role(
        &db,
        httpd,
        format!("SELECT pepsi.workqueue_retry({id}, false)"),
    )
    .await
    .unwrap();
    assert_eq!(retried["changed"], false, "already pending: {retried}");
    let bounced = value_as_role(
        &db,
        httpd,
        format!("SELECT pepsi.workqueue_bounce({id}, 'init', 'bounce', 'retired', false)"),
    )
    .await
    .unwrap();
    assert_eq!(bounced["to_stage"], "bounce", "{bounced}");
    // The bounce stage must be a stage name, the reason bounded.
    for sql in [
        format!("SELECT pepsi.workqueue_bounce({other}, 'init', 'a]b', 'x', false)"),
        format!(
            "SELECT pepsi.workqueue_bounce({other}, 'init', 'bounce', repeat('x', 1001), false)"
        ),
        format!("SELECT pepsi.workqueue_hold({other}, false, repeat('x', 1001))"),
    ] {
        assert_eq!(
            value_as_role(&db, httpd, sql.clone()).await,
            Err("22023".into()),
            "{sql}"
        );
    }
    for role in [
        "pepsi-ingress",
        "pepsi-config",
        "pepsi-sendmail",
        "pepsi-crypto",
    ] {
        for sql in [
            format!("SELECT pepsi.workqueue_retry({other}, false)"),
            format!("SELECT pepsi.workqueue_hold({other}, false, NULL)"),
            format!("SELECT pepsi.workqueue_release({other})"),
            format!("SELECT pepsi.workqueue_delete({other}, false)"),
            format!("SELECT pepsi.workqueue_bounce({other}, 'init', 'bounce', 'x', false)"),
        ] {
            assert_eq!(
                value_as_role(&db, role, sql.clone()).await,
                Err("42501".into()),
                "{role}: {sql}"
            );
        }
    }
    let deleted = value_as_role(
        &db,
        httpd,
        format!("SELECT pepsi.workqueue_delete({id}, false)"),
    )
    .await
    .unwrap();
    assert_eq!(deleted["changed"], true, "{deleted}");
    let left: Vec<i64> = sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, [other]);
    // The pipeline role (pepsi-queue) keeps them.
    let r = value_as_role(
        &db,
        "pepsi",
        format!("SELECT pepsi.workqueue_delete({other}, false)"),
    )
    .await
    .unwrap();
    assert_eq!(r["changed"], true, "{r}");
}

/// The mail log's retention runs through one function only the pipeline role (the
/// dispatcher) may call; it deletes nothing younger than an hour.
#[tokio::test]
async fn only_the_pipeline_role_expires_the_mail_log() {
    let db = TestDb::new().await;
    let expire = "SELECT pepsi.mail_log_expire('1 day')";
    assert_eq!(as_role(&db, "pepsi", expire).await, Ok(()));
    for role in ["pepsi-ingress", "pepsi-config", "pepsi-httpd"] {
        assert_eq!(
            as_role(&db, role, expire).await,
            Err("42501".into()),
            "{role}"
        );
    }
    assert_eq!(
        as_role(&db, "pepsi", "SELECT pepsi.mail_log_expire('5 minutes')").await,
        Err("22023".into())
    );
    sqlx::raw_sql(
        "INSERT INTO pepsi.mail_log (at, event) VALUES (now() - interval '3 days', 'delivered'), (now(), 'delivered')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let gone: i32 = sqlx::query_scalar("SELECT pepsi.mail_log_expire('2 days')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(gone, 1);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.mail_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 1);
}

/// `pepsi.autoreply_claim`: one reply per owner and sender per period, granted again to the
/// same queue row (a pass run again), one winner among concurrent claims; the pipeline role
/// may claim, the ingress may not.
#[tokio::test]
async fn an_automatic_reply_is_claimed_once_per_sender_and_period() {
    let db = TestDb::new().await;
    let claim = |owner: &'static str, sender: &'static str, id: i64, period: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<bool>>(
                "SELECT pepsi.autoreply_claim($1, $2, $3, $4::interval)",
            )
            .bind(owner)
            .bind(sender)
            .bind(id)
            .bind(period)
            .fetch_one(&pool)
            .await
            .unwrap()
            .unwrap_or(false)
        }
    };
    let a = "alice@example.test";
    // (what, owner, sender, queue row, period, granted)
    let steps = [
        (
            "first message from bob",
            a,
            "bob@remote.test",
            1,
            "7 days",
            true,
        ),
        (
            "bob again, another message",
            a,
            "bob@remote.test",
            2,
            "7 days",
            false,
        ),
        (
            "bob in other letter case",
            "Alice@Example.test",
            "BOB@remote.test",
            3,
            "7 days",
            false,
        ),
        (
            "the first message's pass run again",
            a,
            "bob@remote.test",
            1,
            "7 days",
            true,
        ),
        ("another sender", a, "carol@remote.test", 4, "7 days", true),
        (
            "another owner, same sender",
            "dave@example.test",
            "bob@remote.test",
            5,
            "7 days",
            true,
        ),
        (
            "bob after a period of nothing",
            a,
            "bob@remote.test",
            6,
            "0 seconds",
            true,
        ),
        (
            "and the row is bob's newest",
            a,
            "bob@remote.test",
            1,
            "7 days",
            false,
        ),
    ];
    for (what, owner, sender, id, period, want) in steps {
        assert_eq!(claim(owner, sender, id, period).await, want, "{what}");
    }
    let (owner, sender, id): (String, String, i64) = sqlx::query_as(
        "SELECT owner, sender, workqueue_id FROM pepsi.autoreply_sent WHERE sender = 'bob@remote.test' AND owner = $1",
    )
    .bind(a)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (owner.as_str(), sender.as_str(), id),
        (a, "bob@remote.test", 6)
    );

    // Eight messages from one sender claimed at once: one reply.
    let racers: Vec<_> = (100..108)
        .map(|id| tokio::spawn(claim(a, "erin@remote.test", id, "7 days")))
        .collect();
    let mut granted = 0;
    for r in racers {
        granted += usize::from(r.await.unwrap());
    }
    assert_eq!(granted, 1, "concurrent claims for one sender");

    let call = "SELECT pepsi.autoreply_claim('a@example.test', 'b@remote.test', 1, '1 day')";
    assert_eq!(as_role(&db, "pepsi", call).await, Ok(()));
    assert_eq!(
        as_role(&db, "pepsi-ingress", call).await,
        Err("42501".into())
    );

    // The dispatcher's GC forgets what no period can still refuse: older than 366 days.
    sqlx::raw_sql(
        "INSERT INTO pepsi.autoreply_sent (owner, sender, sent_at, workqueue_id) VALUES \
         ('old@example.test', 'x@remote.test', now() - interval '367 days', 1), \
         ('old@example.test', 'y@remote.test', now() - interval '365 days', 2)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.autoreply_sent")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // The dispatcher's role may call it (as_role rolls its work back); then it runs.
    assert_eq!(
        as_role(&db, "pepsi", "SELECT pepsi.autoreply_gc()").await,
        Ok(())
    );
    let gone: i32 = sqlx::query_scalar("SELECT pepsi.autoreply_gc()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(gone, 1);
    let senders: Vec<String> = sqlx::query_scalar(
        "SELECT sender FROM pepsi.autoreply_sent WHERE owner = 'old@example.test' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        senders,
        ["y@remote.test"],
        "only the row past 366 days goes"
    );
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.autoreply_sent")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, before - 1);
}

#[tokio::test]
async fn only_the_crypto_role_reads_the_wrapped_private_keys() {
    let db = TestDb::new().await;
    let insert = "INSERT INTO pepsi.crypto_identity \
                  (address, scheme, fingerprint, public_key, private_wrapped, kek_id) \
                  VALUES ('alice@example.test', 'openpgp', 'ABCDEF0123456789', '\\x01', '\\x02', 'k1')";
    for role in ["pepsi", "pepsi-ingress", "pepsi-httpd", "pepsi-config"] {
        assert_eq!(
            as_role(&db, role, insert).await,
            Err("42501".into()),
            "{role}"
        );
    }
    assert_eq!(as_role(&db, "pepsi-crypto", insert).await, Ok(()));
    sqlx::raw_sql(insert)
        .execute(&mut conn(&db).await)
        .await
        .unwrap();
    let public = "SELECT address, scheme, fingerprint, public_key, status, is_primary \
                  FROM pepsi.crypto_identity";
    let secret = "SELECT private_wrapped FROM pepsi.crypto_identity";
    let everything = "SELECT * FROM pepsi.crypto_identity";
    for role in ["pepsi", "pepsi-ingress", "pepsi-httpd", "pepsi-config"] {
        assert_eq!(as_role(&db, role, public).await, Ok(()), "{role}");
        assert_eq!(
            as_role(&db, role, secret).await,
            Err("42501".into()),
            "{role}"
        );
        assert_eq!(
            as_role(&db, role, everything).await,
            Err("42501".into()),
            "{role}"
        );
    }
    assert_eq!(
        as_role(&db, "pepsi-sendmail", public).await,
        Err("42501".into())
    );
    assert_eq!(as_role(&db, "pepsi-crypto", secret).await, Ok(()));
    // The crypto stages are stage workers too: the queue is theirs as the pipeline's.
    assert_eq!(
        as_role(
            &db,
            "pepsi-crypto",
            "UPDATE pepsi.workqueue SET state = state"
        )
        .await,
        Ok(())
    );
    // A hand-made table grant is reported and taken back by the next run.
    sqlx::raw_sql("GRANT SELECT ON pepsi.crypto_identity TO pepsi")
        .execute(&mut conn(&db).await)
        .await
        .unwrap();
    let report = schema::check(&db.url, &Roles::default()).await.unwrap();
    assert!(
        report
            .privileges_wrong
            .iter()
            .any(|w| w.contains("private_wrapped")),
        "{:?}",
        report.privileges_wrong
    );
    schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    assert_eq!(as_role(&db, "pepsi", secret).await, Err("42501".into()));
    assert_eq!(as_role(&db, "pepsi", public).await, Ok(()));
    // A column grant of another kind is found and taken back too.
    sqlx::raw_sql("GRANT UPDATE (address) ON pepsi.crypto_identity TO pepsi")
        .execute(&mut conn(&db).await)
        .await
        .unwrap();
    let report = schema::check(&db.url, &Roles::default()).await.unwrap();
    assert!(
        report
            .privileges_wrong
            .iter()
            .any(|w| w.contains("UPDATE") && w.contains("address")),
        "{:?}",
        report.privileges_wrong
    );
    schema::setup_url(&db.url, &Roles::default()).await.unwrap();
    let rename = "UPDATE pepsi.crypto_identity SET address = 'mallory@example.test'";
    assert_eq!(as_role(&db, "pepsi", rename).await, Err("42501".into()));
    // Trust anchors are the crypto role's to set; stages only read them.
    let anchor = "INSERT INTO pepsi.ca_trust (fingerprint, subject, certificate) \
                  VALUES (repeat('A', 64), 'CN=x', '\\x00')";
    assert_eq!(as_role(&db, "pepsi", anchor).await, Err("42501".into()));
    assert_eq!(as_role(&db, "pepsi-crypto", anchor).await, Ok(()));
    assert_eq!(
        as_role(&db, "pepsi", "SELECT * FROM pepsi.ca_trust").await,
        Ok(())
    );
}

#[tokio::test]
async fn a_parked_message_is_released_when_its_key_request_settles() {
    let db = TestDb::new().await;
    let mut c = conn(&db).await;
    let st: String =
        sqlx::query_scalar("SELECT pepsi.crypto_request_key('Bob@Example.test', '{wkd}')")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(st, "pending");
    // Settled without a key: answered from the negative cache until negative_until.
    sqlx::raw_sql(
        "UPDATE pepsi.key_request SET status = 'none', settled_at = now(), \
         negative_until = now() + interval '1 hour' WHERE address = 'bob@example.test'",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let st: String =
        sqlx::query_scalar("SELECT pepsi.crypto_request_key('bob@example.test', '{wkd}')")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(st, "none");
    sqlx::raw_sql("UPDATE pepsi.key_request SET negative_until = now() - interval '1 second'")
        .execute(&mut c)
        .await
        .unwrap();
    let st: String =
        sqlx::query_scalar("SELECT pepsi.crypto_request_key('bob@example.test', '{wkd}')")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(
        st, "pending",
        "an expired negative answer starts a new lookup"
    );
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('a@x.test', ARRAY['bob@example.test'], \
         '\\x00'::bytea, '\\x00'::bytea, '{}'::jsonb)",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour', \
         stage = 'encrypt', \
         state = '{{\"keydisc\": {{\"waiting\": [\"bob@example.test\"], \"stage\": \"encrypt\"}}}}' \
         WHERE workqueue_id = {id}"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    // A row that waits at another stage (it left encrypt with its keydisc state) is not
    // woken.
    let elsewhere: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('a@x.test', ARRAY['bob@example.test'], \
         '\\x00'::bytea, '\\x00'::bytea, '{}'::jsonb)",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 hour', \
         stage = 'relay', \
         state = '{{\"keydisc\": {{\"waiting\": [\"bob@example.test\"], \"stage\": \"encrypt\"}}}}' \
         WHERE workqueue_id = {elsewhere}"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    let n: i32 = sqlx::query_scalar("SELECT pepsi.keydisc_release('carol@example.test')")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let n: i32 = sqlx::query_scalar("SELECT pepsi.keydisc_release('BOB@example.test')")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let status: String =
        sqlx::query_scalar("SELECT status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(id)
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(status, "pending");
}

/// Runs `sql`, which returns one bigint or NULL, as `role` and commits; the SQLSTATE on
/// failure.
async fn id_as_role(db: &TestDb, role: &str, sql: &'static str) -> Result<Option<i64>, String> {
    let mut c = conn(db).await;
    let mut tx = c.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE \"{role}\"")))
        .execute(&mut *tx)
        .await
        .unwrap();
    let r: Result<Option<i64>, _> = sqlx::query_scalar(sql).fetch_one(&mut *tx).await;
    match r {
        Ok(id) => {
            tx.commit().await.unwrap();
            Ok(id)
        }
        Err(sqlx::Error::Database(d)) => Err(d.code().unwrap_or_default().into_owned()),
        Err(other) => Err(other.to_string()),
    }
}

/// The queue row `id`: (stage, envelope sender, recipients, header block, body, state).
async fn queued(
    db: &TestDb,
    id: i64,
) -> (
    String,
    String,
    Vec<String>,
    String,
    String,
    serde_json::Value,
) {
    sqlx::query_as(
        "SELECT w.stage, w.mail_from, w.rcpt_to, convert_from(w.headers, 'UTF8'), \
                convert_from(b.body, 'UTF8'), w.state \
           FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
          WHERE w.workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// What pepsi-httpd may queue, it queues through the list functions alone: a list's own mail
/// (from its -bounces address, to one person, with an empty state) and a held post approved
/// or rejected (the held message as it was, with the state the function writes, once). Any
/// other sender, a second recipient, an unknown list or held post is refused.
#[tokio::test]
async fn the_httpd_role_queues_only_a_lists_own_mail_and_its_held_posts() {
    let db = TestDb::new().await;
    let mut c = conn(&db).await;
    sqlx::raw_sql(
        "INSERT INTO pepsi.mailing_list (address) VALUES ('team@example.test'); \
         INSERT INTO pepsi.list_held_message \
             (held_id, list_id, sender, mail_from, reason, headers, body, expires_at) \
         OVERRIDING SYSTEM VALUE \
         SELECT h, list_id, 'x@else.test', 'x@else.test', 'nonmember', \
                'Subject: hi\r\n'::bytea, 'the post'::bytea, now() + interval '1 day' \
           FROM pepsi.mailing_list, unnest(ARRAY[7, 8]) AS h",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let httpd = "pepsi-httpd";

    let mail = "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', \
                'team-bounces@example.test', ARRAY['b@example.test'], \
                'Subject: welcome\r\nX-Pepsi-Decrypted: forged\r\n'::bytea, 'hello'::bytea)";
    let id = id_as_role(&db, httpd, mail).await.unwrap().unwrap();
    let (stage, from, rcpt, headers, body, state) = queued(&db, id).await;
    assert_eq!(
        (stage.as_str(), from.as_str(), rcpt, body.as_str()),
        (
            "aliases",
            "team-bounces@example.test",
            vec!["b@example.test".to_owned()],
            "hello"
        )
    );
    assert_eq!(
        headers, "Subject: welcome\r\n",
        "the forged field is dropped"
    );
    assert_eq!(state, serde_json::json!({}));
    assert_eq!(
        id_as_role(&db, "pepsi", mail).await.map(|i| i.is_some()),
        Ok(true)
    );
    for role in [
        "pepsi-ingress",
        "pepsi-config",
        "pepsi-sendmail",
        "pepsi-crypto",
    ] {
        assert_eq!(
            id_as_role(&db, role, mail).await,
            Err("42501".into()),
            "{role}"
        );
    }
    let refused: [(&'static str, &str); 8] = [
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', 'ceo@example.test', ARRAY['b@example.test'], ''::bytea, 'y'::bytea)",
            "22023",
        ),
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', 'team@example.test', ARRAY['b@example.test'], ''::bytea, 'y'::bytea)",
            "22023",
        ),
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', 'team-bounces@example.test', ARRAY['b@example.test', 'c@example.test'], ''::bytea, 'y'::bytea)",
            "22023",
        ),
        (
            "SELECT pepsi.list_queue_mail('other@example.test', 'aliases', 'other-bounces@example.test', ARRAY['b@example.test'], ''::bytea, 'y'::bytea)",
            "22023",
        ),
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'a]b', 'team-bounces@example.test', ARRAY['b@example.test'], ''::bytea, 'y'::bytea)",
            "22023",
        ),
        // The approval's at-most-once token is not for this function to spend.
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', 'team-bounces@example.test', ARRAY['b@example.test'], ''::bytea, 'y'::bytea, 'list-approve:7')",
            "22023",
        ),
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', 'team-bounces@example.test', ARRAY['b@example.test'], 'no line end'::bytea, 'y'::bytea)",
            "22023",
        ),
        (
            "SELECT pepsi.list_queue_mail('team@example.test', 'aliases', 'team-bounces@example.test', ARRAY['b@example.test'], ''::bytea, decode(repeat('78', 1048577), 'hex'))",
            "54000",
        ),
    ];
    for (sql, code) in refused {
        assert_eq!(id_as_role(&db, httpd, sql).await, Err(code.into()), "{sql}");
    }

    // Approved: the held post as it was, at the list stage, with list_approval; once.
    let approve = "SELECT pepsi.list_held_approve(7, 'lists', 'mod@example.test')";
    let id = id_as_role(&db, httpd, approve).await.unwrap().unwrap();
    let (stage, from, rcpt, headers, body, state) = queued(&db, id).await;
    assert_eq!(
        (
            stage.as_str(),
            from.as_str(),
            rcpt,
            headers.as_str(),
            body.as_str()
        ),
        (
            "lists",
            "x@else.test",
            vec!["team@example.test".to_owned()],
            "Subject: hi\r\n",
            "the post"
        )
    );
    let list_id: i64 = sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        state,
        serde_json::json!({"list_approval": {
            "list": "team@example.test", "list_id": list_id, "held_id": 7,
            "moderator": "mod@example.test"}})
    );
    let approval: pepsi_contract::state::ListApproval =
        serde_json::from_value(state["list_approval"].clone()).unwrap();
    assert!(approval.approves(list_id));
    assert_eq!(
        id_as_role(&db, httpd, approve).await,
        Ok(None),
        "a second time"
    );
    assert_eq!(
        id_as_role(
            &db,
            httpd,
            "SELECT pepsi.list_held_approve(99, 'lists', 'mod@example.test')"
        )
        .await,
        Err("22023".into())
    );
    assert_eq!(
        id_as_role(&db, httpd, "SELECT pepsi.list_held_approve(8, 'lists', '')").await,
        Err("22023".into())
    );

    // Rejected: returned from the bounce stage with a permanent 5.7.1 for the list; once.
    let reject = "SELECT pepsi.list_held_reject(8, 'bounced', 'lists', 'off topic')";
    let id = id_as_role(&db, httpd, reject).await.unwrap().unwrap();
    let (stage, from, rcpt, _, _, state) = queued(&db, id).await;
    assert_eq!(
        (stage.as_str(), from.as_str(), rcpt),
        (
            "bounced",
            "x@else.test",
            vec!["team@example.test".to_owned()]
        )
    );
    assert_eq!(
        state,
        serde_json::json!({"bounce": {
            "kind": "permanent",
            "stage": "lists",
            "diagnostic": "rejected by the list's moderator: off topic",
            "enhanced_status": "5.7.1",
            "recipients": {"team@example.test": {
                "diagnostic": "rejected by the list's moderator: off topic",
                "enhanced_status": "5.7.1"}}}})
    );
    let bounce: pepsi_contract::state::Bounce =
        serde_json::from_value(state["bounce"].clone()).unwrap();
    assert_eq!(bounce.stage.as_deref(), Some("lists"));
    assert_eq!(
        id_as_role(&db, httpd, reject).await,
        Ok(None),
        "a second time"
    );
    assert_eq!(
        id_as_role(
            &db,
            httpd,
            "SELECT pepsi.list_held_reject(99, 'bounced', 'lists', '')"
        )
        .await,
        Err("22023".into())
    );
    // Nor can the role make a held post of its own to release.
    assert_eq!(
        as_role(&db, httpd, "INSERT INTO pepsi.list_held_message (list_id, sender, mail_from, reason, headers, body, expires_at) SELECT list_id, 'a@b.test', 'a@b.test', 'x', ''::bytea, ''::bytea, now() FROM pepsi.mailing_list").await,
        Err("42501".into())
    );
}
