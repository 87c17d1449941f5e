//! The database layer against a real PostgreSQL: `with_retry` (serialization failures and
//! deadlocks are retried, other errors are not) and the server parameters of the sessions.

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

/// Checks one `[database]` option that sets a server parameter on the sessions that move rows
/// along the queue, `setting` the query that reads it: each `(option value, expected
/// parameter)` of `cases` (the value `None`:
/// the option left out; the expected `None`: the server's own), every other program's
/// sessions keeping the server's value, and `bad` refused with an error naming the option,
/// the value and `named` (one of the accepted values).
async fn check_pass_parameter(
    option: &str,
    setting: &'static str,
    cases: &[(Option<&str>, Option<&str>)],
    bad: &str,
    named: &str,
) {
    use pepsi_conf::config::Config;
    use pepsi_contract::db::DbOptions;
    let db = TestDb::new().await;
    let server: String = sqlx::query_scalar(setting)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let conf = |value: Option<&str>| {
        let line = value.map_or(String::new(), |v| format!("{option} = {v}\n"));
        Config::from_str_named(&format!("[database]\nURL = {}\n{line}", db.url), "t.conf").unwrap()
    };
    for &(value, want) in cases {
        let settings = DbOptions::from_config(&conf(value)).unwrap();
        let passes = settings.connect_for_passes().await.unwrap();
        let got: String = sqlx::query_scalar(setting)
            .fetch_one(&passes)
            .await
            .unwrap();
        assert_eq!(got, want.unwrap_or(&server), "{option} = {value:?}");
        let other = settings.connect().await.unwrap();
        let got: String = sqlx::query_scalar(setting).fetch_one(&other).await.unwrap();
        assert_eq!(
            got, server,
            "{option} = {value:?}: a program that admits mail"
        );
        passes.close().await;
        other.close().await;
    }
    let err = format!(
        "{:#}",
        DbOptions::from_config(&conf(Some(bad))).unwrap_err()
    );
    assert!(
        err.contains(option) && err.contains(bad) && err.contains(named),
        "{err}"
    );
}

/// The sessions that move rows along the queue plan with `PASS_PLAN_CACHE_MODE`
/// (`force_generic_plan` unless configured); every other program's keep the server's setting.
#[tokio::test]
async fn pass_sessions_plan_with_pass_plan_cache_mode_and_the_others_with_the_servers() {
    check_pass_parameter(
        "PASS_PLAN_CACHE_MODE",
        "SELECT current_setting('plan_cache_mode')",
        &[
            (None, Some("force_generic_plan")),
            (Some("auto"), Some("auto")),
            (Some("Force_Custom_Plan"), Some("force_custom_plan")),
            (Some("server"), None),
        ],
        "always",
        "force_generic_plan",
    )
    .await;
}

/// The sessions that move rows along the queue commit with `PASS_SYNCHRONOUS_COMMIT` (off
/// unless configured); every other program's keep the server's setting.
#[tokio::test]
async fn pass_sessions_commit_with_pass_synchronous_commit_and_the_others_with_the_servers() {
    check_pass_parameter(
        "PASS_SYNCHRONOUS_COMMIT",
        "SELECT current_setting('synchronous_commit')",
        &[
            (None, Some("off")),
            (Some("remote_apply"), Some("remote_apply")),
            (Some("On"), Some("on")),
            (Some("server"), None),
        ],
        "sometimes",
        "remote_apply",
    )
    .await;
}
