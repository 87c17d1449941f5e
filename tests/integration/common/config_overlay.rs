//! The database overlay against a real PostgreSQL with the real schema: which rows one query
//! fetches for a scope, how they layer over the file, and that a change is announced on
//! `config_changed`.

use std::time::Duration;

use pepsi_conf::config::{Config, Origin, Scope};
use pepsi_contract::overlay::DbOverlay;
use pepsi_contract::overlay::{CONFIG_CHANGED_CHANNEL, listen_config_changed, load_overrides};
use pepsi_testkit::TestDb;

const FILE: &str = "\
[database]
URL = postgres:///pepsi
[stage-spam]
THRESHOLD = 5
MODE = tag
KEEP = from file
";

async fn insert(db: &TestDb, scope: &str, section: &str, option: &str, value: &str) {
    sqlx::query(
        "INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ($1, $2, $3, $4)",
    )
    .bind(scope)
    .bind(section)
    .bind(option)
    .bind(value)
    .execute(&db.pool)
    .await
    .expect("insert override");
}

#[tokio::test]
async fn overlay_from_the_database_layers_global_domain_address() {
    let db = TestDb::new().await;
    insert(&db, "global", "stage-spam", "THRESHOLD", "6").await;
    insert(&db, "global", "stage-spam", "MODE", "quarantine").await;
    insert(&db, "domain:example.test", "stage-spam", "THRESHOLD", "7").await;
    insert(
        &db,
        "address:boss@example.test",
        "stage-spam",
        "THRESHOLD",
        "9",
    )
    .await;
    insert(&db, "domain:other.test", "stage-spam", "MODE", "reject").await;
    insert(
        &db,
        "address:someone@example.test",
        "stage-spam",
        "MODE",
        "off",
    )
    .await;
    // Quote characters reach the database as data, never as SQL.
    let hostile = Scope::Address("x'); DROP TABLE pepsi.config_override; --@example.test".into());

    let boss = Scope::Address("Boss@Example.TEST".into());
    let mut fetched: Vec<(String, String)> = load_overrides(&db.pool, &boss)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.scope, row.option))
        .collect();
    fetched.sort();
    assert_eq!(
        fetched,
        [
            (
                "address:boss@example.test".to_owned(),
                "THRESHOLD".to_owned()
            ),
            ("domain:example.test".to_owned(), "THRESHOLD".to_owned()),
            ("global".to_owned(), "MODE".to_owned()),
            ("global".to_owned(), "THRESHOLD".to_owned()),
        ],
        "only the rows for global, the address's domain and the address itself"
    );

    let file = Config::from_str_named(FILE, "pepsi.conf").unwrap();
    let cases: &[(&Scope, u32, &str, &str)] = &[
        (
            &Scope::Global,
            6,
            "quarantine",
            "database override scope=global",
        ),
        (
            &Scope::Domain("example.test".into()),
            7,
            "quarantine",
            "database override scope=domain:example.test",
        ),
        (
            &boss,
            9,
            "quarantine",
            "database override scope=address:boss@example.test",
        ),
        (
            &hostile,
            7,
            "quarantine",
            "database override scope=domain:example.test",
        ),
    ];
    for (scope, threshold, mode, origin) in cases {
        let config = file.with_db_overlay(&db.pool, scope).await.unwrap();
        let spam = config.section("stage-spam");
        assert_eq!(
            spam.number::<u32>("threshold").unwrap(),
            *threshold,
            "scope {scope}"
        );
        assert_eq!(spam.string("mode").unwrap(), *mode, "scope {scope}");
        assert_eq!(spam.string("keep").unwrap(), "from file", "scope {scope}");
        assert_eq!(
            spam.origin("THRESHOLD"),
            Some(&Origin::Override {
                description: (*origin).to_owned()
            }),
            "scope {scope}"
        );
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.config_override")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(count, 6, "the hostile scope changed nothing");
}

#[tokio::test]
async fn a_change_is_announced_on_config_changed() {
    let db = TestDb::new().await;
    let mut listener = listen_config_changed(&db.pool).await.unwrap();
    insert(&db, "global", "stage-spam", "MODE", "reject").await;
    // The bound only keeps a broken trigger from hanging the suite; it is not a timing check.
    let notification = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("a notification after INSERT into pepsi.config_override")
        .unwrap();
    assert_eq!(notification.channel(), CONFIG_CHANGED_CHANNEL);
}

/// A file-only option stored before the table refused it (the CHECK is NOT VALID for old
/// rows) is ignored by the loader: the file's value stays.
#[tokio::test]
async fn a_stored_row_naming_a_program_is_ignored_and_the_file_value_kept() {
    let db = TestDb::new().await;
    sqlx::query("ALTER TABLE pepsi.config_override DROP CONSTRAINT config_override_file_only")
        .execute(&db.pool)
        .await
        .unwrap();
    insert(&db, "global", "stage-spam", "program", "/tmp/evil").await;
    insert(&db, "global", "stage-spam", "DNS_SERVERS", "192.0.2.53:53").await;
    insert(&db, "global", "stage-spam", "MODE", "reject").await;
    let file =
        Config::from_str_named(&format!("{FILE}PROGRAM = pepsi-stage-spam\n"), "t.conf").unwrap();
    let cfg = file
        .with_db_overlay(&db.pool, &Scope::Global)
        .await
        .unwrap();
    let spam = cfg.section("stage-spam");
    assert_eq!(spam.string("PROGRAM").unwrap(), "pepsi-stage-spam");
    assert!(!spam.has("DNS_SERVERS"));
    assert_eq!(
        spam.string("MODE").unwrap(),
        "reject",
        "other rows still apply"
    );
}
