//! The PostgreSQL sessions of a running system: each names its program and process
//! (`application_name`), and a stage worker, which runs one pass at a time, holds no more
//! backends than `[database] WORKER_CONNECTIONS` (plus a LISTEN session where its stage
//! keeps a directory), however many statements its passes run.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::system::System;

const WAIT: Duration = Duration::from_secs(60);

/// `application_name` → backends, for the test's database.
async fn sessions(sys: &System) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT application_name, count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

#[tokio::test]
async fn a_stage_worker_holds_worker_connections_backends_and_every_session_names_its_process() {
    let mut sys = System::new(
        "[database]\nWORKER_CONNECTIONS = 1\nIDLE_CHECK = 0\n",
        &["alice"],
    )
    .await;
    sys.start().await;
    let n = 30;
    for i in 0..n {
        let message = format!(
            "From: bob@example.test\r\nTo: alice@example.test\r\nSubject: {i}\r\n\
             Message-ID: <sessions-{i}@example.test>\r\n\r\nbody {i}\r\n"
        );
        let reply = sys
            .send(
                "bob@example.test",
                &["alice@example.test"],
                message.as_bytes(),
            )
            .await;
        assert!(reply.starts_with("250"), "{reply}");
    }
    sys.wait_messages("alice", n, WAIT).await;
    sys.wait_empty(WAIT).await;
    let seen = sessions(&sys).await;
    let ingress = sys.procs.iter().find(|p| p.name == "ingress").unwrap();
    let named = |program: &str, pid: u32| format!("{program} pid {pid}");
    assert!(
        seen.contains_key(&named("pepsi-ingress", ingress.child.id())),
        "the ingress's sessions name it: {seen:?}"
    );
    assert!(
        seen.contains_key(&named("pepsi-dispatch", sys.dispatcher_pid())),
        "the dispatcher's sessions name it: {seen:?}"
    );
    let workers: Vec<(&String, &i64)> = seen
        .iter()
        .filter(|(name, _)| name.starts_with("pepsi-stage-"))
        .collect();
    assert!(!workers.is_empty(), "no stage worker session: {seen:?}");
    for (name, backends) in workers {
        let pid: u32 = name.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{name}: no such process"
        );
        // One for the passes, one LISTEN where the stage keeps a directory (the list
        // stage, fused or not).
        assert!(
            *backends <= 2,
            "{name} holds {backends} backends with WORKER_CONNECTIONS = 1: {seen:?}"
        );
    }
}
