//! The database layer against a real PostgreSQL: `with_retry` (serialization failures and
//! deadlocks are retried, other errors are not) and the sessions' `synchronous_commit`.

use std::sync::atomic::{AtomicU32, Ordering};

use pepsi_contract::db::{SERIALIZATION_RETRIES, is_serialization_failure, with_retry};
use pepsi_testkit::TestDb;

/// A statement that fails with SQLSTATE `code` while `fail_first` attempts remain.
async fn attempt(
    db: &TestDb,
    calls: &AtomicU32,
    fail_first: u32,
    code: &str,
) -> Result<i32, sqlx::Error> {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    if n < fail_first {
        sqlx::query_scalar("SELECT pepsi_test_raise($1)")
            .bind(code)
            .fetch_one(&db.pool)
            .await
    } else {
        sqlx::query_scalar("SELECT 42").fetch_one(&db.pool).await
    }
}

async fn db_with_raiser() -> TestDb {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE FUNCTION pepsi_test_raise(code text) RETURNS integer LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'injected %', code USING ERRCODE = code; END $$",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

#[tokio::test]
async fn serialization_failures_and_deadlocks_are_retried_until_success() {
    let db = db_with_raiser().await;
    for code in ["40001", "40P01"] {
        let calls = AtomicU32::new(0);
        let before = SERIALIZATION_RETRIES.load(Ordering::Relaxed);
        let v = with_retry(|| attempt(&db, &calls, 2, code)).await.unwrap();
        assert_eq!(v, 42);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "{code}: two failures, then success"
        );
        assert!(SERIALIZATION_RETRIES.load(Ordering::Relaxed) >= before + 2);
    }
}

#[tokio::test]
async fn other_errors_are_returned_at_once_and_retries_are_bounded() {
    let db = db_with_raiser().await;
    let calls = AtomicU32::new(0);
    let err = with_retry(|| attempt(&db, &calls, 10, "22023"))
        .await
        .unwrap_err();
    assert!(!is_serialization_failure(&err));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let calls = AtomicU32::new(0);
    let err = with_retry(|| attempt(&db, &calls, 100, "40001"))
        .await
        .unwrap_err();
    assert!(is_serialization_failure(&err));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "gives up after five attempts"
    );
}

/// The sessions that move rows along the queue plan with `PASS_PLAN_CACHE_MODE`
/// (`force_generic_plan` unless configured); every other program's keep the server's setting.
#[tokio::test]
async fn pass_sessions_plan_with_pass_plan_cache_mode_and_the_others_with_the_servers() {
    use pepsi_conf::config::Config;
    use pepsi_contract::db::DbOptions;
    let db = TestDb::new().await;
    let setting = "SELECT current_setting('plan_cache_mode')";
    let server: String = sqlx::query_scalar(setting)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let cases = [
        ("", "force_generic_plan"),
        ("PASS_PLAN_CACHE_MODE = auto\n", "auto"),
        (
            "PASS_PLAN_CACHE_MODE = Force_Custom_Plan\n",
            "force_custom_plan",
        ),
        ("PASS_PLAN_CACHE_MODE = server\n", server.as_str()),
    ];
    for (option, want) in cases {
        let cfg =
            Config::from_str_named(&format!("[database]\nURL = {}\n{option}", db.url), "t.conf")
                .unwrap();
        let settings = DbOptions::from_config(&cfg).unwrap();
        let passes = settings.connect_for_passes().await.unwrap();
        let got: String = sqlx::query_scalar(setting)
            .fetch_one(&passes)
            .await
            .unwrap();
        assert_eq!(got, want, "{option:?}");
        let other = settings.connect().await.unwrap();
        let got: String = sqlx::query_scalar(setting).fetch_one(&other).await.unwrap();
        assert_eq!(got, server, "{option:?}: a program that admits mail");
        passes.close().await;
        other.close().await;
    }
    let cfg = Config::from_str_named(
        &format!(
            "[database]\nURL = {}\nPASS_PLAN_CACHE_MODE = always\n",
            db.url
        ),
        "t.conf",
    )
    .unwrap();
    let err = format!("{:#}", DbOptions::from_config(&cfg).unwrap_err());
    assert!(
        err.contains("PASS_PLAN_CACHE_MODE")
            && err.contains("always")
            && err.contains("force_generic_plan"),
        "{err}"
    );
}

/// The sessions that move rows along the queue commit with `PASS_SYNCHRONOUS_COMMIT` (off
/// unless configured); every other program's keep the server's setting.
#[tokio::test]
async fn pass_sessions_commit_with_pass_synchronous_commit_and_the_others_with_the_servers() {
    use pepsi_conf::config::Config;
    use pepsi_contract::db::DbOptions;
    let db = TestDb::new().await;
    let server: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let cases = [
        ("", "off"),
        ("PASS_SYNCHRONOUS_COMMIT = remote_apply\n", "remote_apply"),
        ("PASS_SYNCHRONOUS_COMMIT = On\n", "on"),
        ("PASS_SYNCHRONOUS_COMMIT = server\n", server.as_str()),
    ];
    for (option, want) in cases {
        let cfg =
            Config::from_str_named(&format!("[database]\nURL = {}\n{option}", db.url), "t.conf")
                .unwrap();
        let settings = DbOptions::from_config(&cfg).unwrap();
        let passes = settings.connect_for_passes().await.unwrap();
        let got: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&passes)
            .await
            .unwrap();
        assert_eq!(got, want, "{option:?}");
        let other = settings.connect().await.unwrap();
        let got: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&other)
            .await
            .unwrap();
        assert_eq!(got, server, "{option:?}: a program that admits mail");
        passes.close().await;
        other.close().await;
    }
    let cfg = Config::from_str_named(
        &format!(
            "[database]\nURL = {}\nPASS_SYNCHRONOUS_COMMIT = sometimes\n",
            db.url
        ),
        "t.conf",
    )
    .unwrap();
    let err = format!("{:#}", DbOptions::from_config(&cfg).unwrap_err());
    assert!(
        err.contains("PASS_SYNCHRONOUS_COMMIT")
            && err.contains("sometimes")
            && err.contains("remote_apply"),
        "{err}"
    );
}
