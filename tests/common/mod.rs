//! Helpers shared by the root-level tests that run stage programs as processes.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `program worker -c config`, feeds it `input` and returns its stdout lines; the
/// worker must exit 0 at end of input.
pub fn stage_worker(program: &str, config: &Path, input: &str) -> Vec<String> {
    let mut child = Command::new(program)
        .args(["worker", "-c"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "worker exited {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The test stage example, built by `cargo test` beside the test binaries.
pub fn test_stage() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("pepsi-test-stage");
    assert!(
        path.is_file(),
        "{} is missing: cargo test builds the examples",
        path.display()
    );
    path
}

/// Feeds `ids` to `program worker -c config` (off the async runtime) and returns its status
/// lines.
pub async fn run_ids(program: &str, config: &Path, ids: &[i64]) -> Vec<String> {
    let input: String = ids.iter().map(|i| format!("{i}\n")).collect();
    let (program, config) = (program.to_owned(), config.to_owned());
    tokio::task::spawn_blocking(move || stage_worker(&program, &config, &input))
        .await
        .unwrap()
}

/// Marks row `id` running at `stage`, as the dispatcher's claim would.
pub async fn claim(pool: &sqlx::PgPool, id: i64, stage: &str) {
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = $2 WHERE workqueue_id = $1",
    )
    .bind(id)
    .bind(stage)
    .execute(pool)
    .await
    .unwrap();
}

/// A queue row as the tests compare it: (id, stage, status, rcpt_to, state).
pub type QueueRow = (i64, String, String, Vec<String>, serde_json::Value);

/// Every queued row, oldest first.
pub async fn rows(pool: &sqlx::PgPool) -> Vec<QueueRow> {
    sqlx::query_as(
        "SELECT workqueue_id, stage, status::text, rcpt_to, state FROM pepsi.workqueue \
         ORDER BY workqueue_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}
