//! Dispatchers that take over from one another (docs/ha.md): fencing in the database, a
//! standby taking over from a killed and from a stopped dispatcher, and a worker that ends
//! itself when nobody is left to stop it. Real pepsi-dispatch processes, real test-stage
//! workers, a real PostgreSQL.

use std::process::Command;
use std::time::{Duration, Instant};

use sqlx::{ConnectOptions as _, PgConnection};

use crate::dispatch::{Harness, children, dispatch, hostname, signal, stop};

/// A session naming dispatcher epoch `epoch` (None: none), as a dispatcher's or a worker's.
async fn session(h: &Harness, epoch: Option<i64>) -> PgConnection {
    let options: sqlx::postgres::PgConnectOptions = h.db.url.parse().unwrap();
    let options = match epoch {
        Some(e) => options.options([("pepsi.epoch", e.to_string())]),
        None => options,
    };
    options.connect().await.unwrap()
}

async fn register(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT pepsi.dispatch_register('test', 'boot', 1, 1)")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn claim_one(conn: &mut PgConnection) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT workqueue_id FROM pepsi.dispatch_claim(ARRAY['init'], ARRAY[10], ARRAY[0], \
         ARRAY[1.0]::float8[], '{}', '{}', '{}', 16) WHERE workqueue_id IS NOT NULL",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

/// A worker's commit as the stage contract writes it (commit.rs's running-row condition).
async fn commit(conn: &mut PgConnection, id: i64) -> u64 {
    sqlx::query(
        "UPDATE pepsi.workqueue SET stage = 'done', status = 'pending' \
         WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch)",
    )
    .bind(id)
    .execute(conn)
    .await
    .unwrap()
    .rows_affected()
}

/// How many queue rows `conn`'s session holds, by `claim_held`'s one-row form, after checking
/// that the form for statements over many rows (the epoch's liveness asked once, as the
/// worker's batch load and commit write it) says the same of every row.
async fn rows_held(conn: &mut PgConnection) -> i64 {
    let (held, disagree): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE pepsi.claim_held(claim_epoch)), \
         count(*) FILTER (WHERE pepsi.claim_held(claim_epoch) IS DISTINCT FROM \
             pepsi.claim_held(claim_epoch, (SELECT NOT pepsi.epoch_fenced(pepsi.session_epoch())))) \
         FROM pepsi.workqueue WHERE status = 'running'",
    )
    .fetch_one(conn)
    .await
    .unwrap();
    assert_eq!(
        disagree, 0,
        "the two forms of claim_held disagree on {disagree} rows"
    );
    held
}

/// The database side alone: a claim stamps the epoch; a newer registration fences the older
/// one, whose claims, commits, hand-backs and stored-function writes are then refused, as are
/// another epoch's writes to its rows; its rows return to pending only after the fenced
/// wait, and at once when its dispatcher is known gone.
#[tokio::test]
async fn a_fenced_epoch_can_change_no_row_and_its_rows_wait_before_another_takes_them() {
    let h = Harness::new("[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n", "").await;
    h.add(3, "s", serde_json::json!({})).await;
    let mut first = session(&h, None).await;
    let one = register(&mut first).await;
    let mut a = session(&h, Some(one)).await;
    let ids = claim_one(&mut a).await;
    assert_eq!(ids.len(), 3);
    assert_eq!(
        h.count(&format!(
            "SELECT count(*) FROM pepsi.workqueue WHERE claim_epoch = {one} AND status = 'running'"
        ))
        .await,
        3
    );
    // Before any takeover the claiming epoch commits; a session without an epoch may not.
    let mut plain = session(&h, None).await;
    assert_eq!(rows_held(&mut a).await, 3);
    assert_eq!(rows_held(&mut plain).await, 0);
    assert_eq!(commit(&mut plain, ids[0]).await, 0);
    assert_eq!(commit(&mut a, ids[0]).await, 1);

    let two = register(&mut first).await;
    assert!(two > one);
    assert_eq!(
        h.count(&format!(
            "SELECT count(*) FROM pepsi.dispatcher WHERE epoch = {one} AND fenced_at IS NOT NULL"
        ))
        .await,
        1
    );
    let mut b = session(&h, Some(two)).await;
    assert_eq!(rows_held(&mut a).await, 0);
    assert_eq!(rows_held(&mut b).await, 0);
    // Neither the fenced epoch nor the new one changes the fenced epoch's rows.
    assert_eq!(commit(&mut a, ids[1]).await, 0);
    assert_eq!(commit(&mut b, ids[1]).await, 0);
    let handed: i32 = sqlx::query_scalar("SELECT pepsi.dispatch_hand_back($1, NULL)")
        .bind(&ids[1..])
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert_eq!(handed, 0);
    // Nor through the stored functions, from the fenced epoch or from a session naming none.
    for conn in [&mut a, &mut plain] {
        let err = sqlx::query("SELECT pepsi.workqueue_pause($1, '{}', 60)")
            .bind(ids[1])
            .execute(&mut *conn)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("fenced"), "{err}");
    }
    // A stage loads such a row as not running, so no pass starts on it.
    let status: String = sqlx::query_scalar(
        "SELECT CASE WHEN status = 'running' AND NOT COALESCE(pepsi.claim_held(claim_epoch), false) \
         THEN 'refused' ELSE status::text END FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(ids[1])
    .fetch_one(&mut a)
    .await
    .unwrap();
    assert_eq!(status, "refused");
    let err = sqlx::query("SELECT * FROM pepsi.dispatch_claim(ARRAY['init'], ARRAY[1], ARRAY[0], ARRAY[1.0]::float8[], '{}', '{}', '{}', 16)")
        .execute(&mut a)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("has been fenced"), "{err}");

    // The new epoch's reconcile leaves them while they are younger than the fenced wait...
    let reconcile = "SELECT pepsi.dispatch_reconcile('{}', 3600, $1)";
    let n: i32 = sqlx::query_scalar(reconcile)
        .bind(3600.0_f64)
        .fetch_one(&mut b)
        .await
        .unwrap();
    assert_eq!(n, 0);
    // ...and while the fence is younger than it, however old the rows (a pass that began
    // just before the fence may run its whole MAX_RUNTIME)...
    sqlx::query("UPDATE pepsi.workqueue SET updated_at = now() - interval '2 minutes' WHERE status = 'running'")
        .execute(&h.db.pool)
        .await
        .unwrap();
    let n: i32 = sqlx::query_scalar(reconcile)
        .bind(60.0_f64)
        .fetch_one(&mut b)
        .await
        .unwrap();
    assert_eq!(n, 0);
    // ...and returns them once both have passed.
    sqlx::query(
        "UPDATE pepsi.dispatcher SET fenced_at = now() - interval '2 minutes' WHERE epoch = $1",
    )
    .bind(one)
    .execute(&h.db.pool)
    .await
    .unwrap();
    let n: i32 = sqlx::query_scalar(reconcile)
        .bind(60.0_f64)
        .fetch_one(&mut b)
        .await
        .unwrap();
    assert_eq!(n, 2);
    let again = claim_one(&mut b).await;
    assert_eq!(again.len(), 2);
    assert_eq!(rows_held(&mut b).await, 2);
    assert_eq!(rows_held(&mut a).await, 0);
    // The stale epoch still cannot commit them; the new one can.
    assert_eq!(commit(&mut a, again[0]).await, 0);
    assert_eq!(commit(&mut b, again[0]).await, 1);

    // A dispatcher known gone: its rows return at once when the next one takes over.
    let three = register(&mut first).await;
    let taken: i32 = sqlx::query_scalar("SELECT pepsi.dispatch_take_over($1)")
        .bind(vec![two])
        .fetch_one(&mut session(&h, Some(three)).await)
        .await
        .unwrap();
    assert_eq!(taken, 1);
    assert_eq!(
        h.count(&format!(
            "SELECT count(*) FROM pepsi.dispatcher WHERE epoch = {two} AND stopped_at IS NOT NULL"
        ))
        .await,
        1
    );
}

async fn wait_log(h: &Harness, name: &str, needle: &str, limit: Duration) {
    let until = Instant::now() + limit;
    while !h.log(name).contains(needle) {
        assert!(
            Instant::now() < until,
            "{name} never said {needle:?}:\n{}",
            h.log(name)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn epochs(h: &Harness) -> Vec<(i64, i32, bool, bool)> {
    sqlx::query_as(
        "SELECT epoch, pid, fenced_at IS NOT NULL, stopped_at IS NOT NULL FROM pepsi.dispatcher ORDER BY epoch",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap()
}

/// Every row at `done` passed `stages` exactly once, as committed.
async fn each_stage_once(h: &Harness, n: i64, stages: &[&str]) {
    let states = h
        .states("SELECT state FROM pepsi.workqueue WHERE stage = 'done'")
        .await;
    assert_eq!(states.len() as i64, n);
    for s in states {
        for stage in stages {
            assert_eq!(s["passes"][stage], 1, "{stage}: {s}");
        }
    }
}

const TWO: &str = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nPARALLELISM = 2\nQUEUE_LIMIT = 4\nDELAY = 5ms\n\
                   [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 2\nQUEUE_LIMIT = 4\nDELAY = 5ms\n";

/// A second dispatcher stands by, naming the active one; kill -9 of the active one under
/// load frees its lock at once and the standby takes over (its takeover time is printed, and
/// docs/ha.md quotes it); every message is handled, each stage committed exactly once; the
/// killed one's epoch ends fenced and known gone.
#[tokio::test]
async fn a_standby_takes_over_from_a_killed_dispatcher_and_every_message_is_handled_once() {
    let h = Harness::new(TWO, "LOCK_CHECK_INTERVAL = 100ms\n").await;
    let a = h.start("a.log");
    wait_log(&h, "a.log", "dispatching", Duration::from_secs(30)).await;
    let mut b = h.start("b.log");
    wait_log(
        &h,
        "b.log",
        &format!("standing by: pepsi-dispatch {} pid {}", hostname(), a.id()),
        Duration::from_secs(30),
    )
    .await;
    assert!(!h.log("b.log").contains("dispatcher lock taken"));

    let n = 400;
    h.add(n, "sender", serde_json::json!({})).await;
    let until = Instant::now() + Duration::from_secs(60);
    while h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'")
        .await
        < 50
    {
        assert!(Instant::now() < until, "{}", h.log("a.log"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
        .await;
    let killed_at = Instant::now();
    signal(&a, "-KILL");
    wait_log(
        &h,
        "b.log",
        "dispatcher lock taken",
        Duration::from_secs(30),
    )
    .await;
    let took = killed_at.elapsed();
    println!("standby took over {took:?} after kill -9 ({running} rows running at the kill)");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        n,
        Duration::from_secs(120),
        &mut b,
    )
    .await;
    each_stage_once(&h, n, &["init", "b"]).await;
    let e = epochs(&h).await;
    assert_eq!(e.len(), 2, "{e:?}");
    assert_eq!(e[0].1 as u32, a.id());
    assert!(
        e[0].2 && e[0].3,
        "the killed one fenced and known gone: {e:?}"
    );
    assert!(!e[1].2 && !e[1].3, "{e:?}");
    drop(a);
    assert!(stop(b).success());
    assert!(
        epochs(&h).await[1].3,
        "a dispatcher that stops cleanly says so"
    );
}

/// The transitions of every queue row with the epoch of the session making them, for the
/// test to read.
async fn record_transitions(h: &Harness) {
    for sql in [
        "CREATE TABLE public.transition (workqueue_id bigint, old_stage text, new_stage text, \
         old_status text, new_status text, claim_epoch bigint, session_epoch bigint, \
         at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "GRANT ALL ON public.transition TO PUBLIC",
        "CREATE FUNCTION public.record_transition() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF TG_OP = 'DELETE' THEN \
             INSERT INTO public.transition (workqueue_id, old_stage, old_status, claim_epoch, session_epoch) \
             VALUES (OLD.workqueue_id, OLD.stage, OLD.status, OLD.claim_epoch, pepsi.session_epoch()); \
           ELSE \
             INSERT INTO public.transition VALUES (NEW.workqueue_id, OLD.stage, NEW.stage, OLD.status, \
               NEW.status, OLD.claim_epoch, pepsi.session_epoch()); \
           END IF; \
           RETURN NULL; \
         END $$",
        "CREATE TRIGGER record_transition AFTER UPDATE OR DELETE ON pepsi.workqueue \
         FOR EACH ROW EXECUTE FUNCTION public.record_transition()",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&h.db.pool)
            .await
            .unwrap();
    }
}

/// The worker processes of dispatcher `pid`, once there are `n` of them.
async fn workers_of(h: &Harness, pid: u32, n: usize) -> Vec<u32> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let workers = children(pid);
        if workers.len() == n {
            return workers;
        }
        assert!(Instant::now() < until, "{workers:?}\n{}", h.log("a.log"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
}

/// kill -STOP of the active dispatcher while its workers are in the middle of passes: the
/// server ends its lock session after LOCK_SESSION_TIMEOUT and the standby takes over,
/// fencing it. The stopped one's workers finish their passes after that and are refused
/// (no transition carrying its epoch lands after the fence: a trigger records each one);
/// after kill -CONT it kills its workers and exits; the standby runs its rows again once
/// MAX_RUNTIME and TAKEOVER_MARGIN have passed, each stage committed once.
#[tokio::test]
async fn a_stopped_dispatcher_is_fenced_and_nothing_of_its_epoch_lands_after_the_takeover() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nPARALLELISM = 2\nQUEUE_LIMIT = 2\nDELAY = 3s\nMAX_RUNTIME = 6s\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nMAX_RUNTIME = 6s\n";
    let h = Harness::new(
        stages,
        "LOCK_SESSION_TIMEOUT = 1s\nLOCK_CHECK_INTERVAL = 100ms\nTAKEOVER_MARGIN = 5s\n",
    )
    .await;
    record_transitions(&h).await;
    let mut a = h.start("a.log");
    wait_log(&h, "a.log", "dispatching", Duration::from_secs(30)).await;
    let mut b = h.start("b.log");
    wait_log(&h, "b.log", "standing by", Duration::from_secs(30)).await;
    let first: i64 = sqlx::query_scalar("SELECT max(epoch) FROM pepsi.dispatcher")
        .fetch_one(&h.db.pool)
        .await
        .unwrap();

    h.add(6, "sender", serde_json::json!({})).await;
    // Both of the first one's init workers are in their 3s pass, each with a second id
    // queued.
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running' AND stage = 'init'",
        4,
        Duration::from_secs(30),
        &mut a,
    )
    .await;
    let workers = workers_of(&h, a.id(), 2).await;
    signal(&a, "-STOP");
    wait_log(
        &h,
        "b.log",
        "dispatcher lock taken",
        Duration::from_secs(30),
    )
    .await;
    let fenced: i64 = h
        .count(&format!(
            "SELECT count(*) FROM pepsi.dispatcher WHERE epoch = {first} AND fenced_at IS NOT NULL"
        ))
        .await;
    assert_eq!(fenced, 1);
    // The stopped one's workers end their passes after the fence and are refused, and start
    // no pass on the ids still queued to them.
    wait_log(&h, "a.log", "fenced", Duration::from_secs(30)).await;
    wait_log(
        &h,
        "a.log",
        "claimed by another dispatcher epoch",
        Duration::from_secs(30),
    )
    .await;
    signal(&a, "-CONT");
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "{}", h.log("a.log"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!status.success());
    assert!(
        h.log("a.log").contains("workers killed"),
        "{}",
        h.log("a.log")
    );
    let until = Instant::now() + Duration::from_secs(10);
    while workers.iter().any(|w| alive(*w)) {
        assert!(Instant::now() < until, "workers outlived their dispatcher");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        6,
        Duration::from_secs(90),
        &mut b,
    )
    .await;
    each_stage_once(&h, 6, &["init", "b"]).await;
    let late = h
        .count(&format!(
            "SELECT count(*) FROM public.transition t, pepsi.dispatcher d \
             WHERE d.epoch = {first} AND t.session_epoch = {first} AND t.at >= d.fenced_at"
        ))
        .await;
    assert_eq!(late, 0, "a transition of the fenced epoch after the fence");
    let before = h
        .count(&format!(
            "SELECT count(*) FROM public.transition WHERE session_epoch = {first}"
        ))
        .await;
    assert!(
        before > 0,
        "the first dispatcher claimed before it was stopped"
    );
    assert!(stop(b).success());
}

/// A worker whose dispatcher is stopped (so nobody kills it at MAX_RUNTIME) ends itself once
/// its pass has run past MAX_RUNTIME, and says why.
#[tokio::test]
async fn a_worker_ends_a_pass_past_max_runtime_itself_when_no_dispatcher_stops_it() {
    let stages = "[stage-init]\nPROGRAM = test\nACTION = hang\nMAX_RUNTIME = 3s\n";
    let h = Harness::new(stages, "LOCK_SESSION_TIMEOUT = 30s\nSTANDBY = no\n").await;
    let mut a = h.start("a.log");
    h.add(1, "sender", serde_json::json!({})).await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'",
        1,
        Duration::from_secs(30),
        &mut a,
    )
    .await;
    // The row is claimed before its id reaches the worker: stopped in between, the
    // dispatcher would leave an idle worker with no pass to outlive. The pass has begun once
    // the worker loaded the row.
    h.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
         AND datname = current_database() AND query LIKE '%WHERE w.workqueue_id = $1%'",
        1,
        Duration::from_secs(30),
        &mut a,
    )
    .await;
    let worker = workers_of(&h, a.id(), 1).await[0];
    signal(&a, "-STOP");
    let until = Instant::now() + Duration::from_secs(20);
    while alive(worker) {
        assert!(Instant::now() < until, "the worker did not end itself");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&a, "-CONT");
    assert!(
        h.log("a.log").contains("ran past MAX_RUNTIME"),
        "{}",
        h.log("a.log")
    );
    let _ = stop(a);
}

/// With STANDBY = no a second dispatcher exits at once, naming the active one.
#[tokio::test]
async fn without_standby_a_second_dispatcher_refuses_to_start_and_names_the_first() {
    let h = Harness::new(
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n",
        "STANDBY = no\n",
    )
    .await;
    let d = h.start("first.log");
    wait_log(&h, "first.log", "dispatching", Duration::from_secs(20)).await;
    let out = Command::new(dispatch())
        .arg("-c")
        .arg(&h.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another dispatcher is already running"),
        "{err}"
    );
    assert!(
        err.contains(&format!("pepsi-dispatch {} pid {}", hostname(), d.id())),
        "{err}"
    );
    assert!(err.contains("STANDBY"), "{err}");
    assert!(stop(d).success());
}

/// Each claim (pending to running) of a queue row, with the claiming epoch.
async fn record_claims(h: &Harness) {
    for sql in [
        "CREATE TABLE public.claim (workqueue_id bigint, stage text, epoch bigint)",
        "GRANT ALL ON public.claim TO PUBLIC",
        "CREATE FUNCTION public.record_claim() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN INSERT INTO public.claim VALUES (NEW.workqueue_id, NEW.stage, NEW.claim_epoch); RETURN NULL; END $$",
        "CREATE TRIGGER record_claim AFTER UPDATE ON pepsi.workqueue FOR EACH ROW \
         WHEN (OLD.status = 'pending' AND NEW.status = 'running') EXECUTE FUNCTION public.record_claim()",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&h.db.pool)
            .await
            .unwrap();
    }
}

/// Three dispatchers in MODE shared on one database, 20,000 messages from 50 senders (one
/// sending half): each claims its own rows (no row is claimed twice, except those of the
/// killed one, claimed again after it was fenced), none runs more of a stage than its pools
/// hold, and after kill -9 of the maintenance leader mid-run another one leads, fences it and
/// takes its rows back: every message is handled, each stage committed exactly once.
/// bench/ha/run.sh measures the same with 100,000 messages.
#[tokio::test]
async fn three_shared_dispatchers_claim_disjoint_rows_and_survive_the_loss_of_one() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n";
    // Without handing forward, a running row is one a worker of its stage holds (or is about
    // to): handed forward, a row also waits running at its next stage between its worker's
    // commit and the dispatcher reading the status line, so the count would not measure the
    // pools.
    let h = Harness::new(
        stages,
        "MODE = shared\nLOCK_CHECK_INTERVAL = 100ms\nHAND_FORWARD = no\n",
    )
    .await;
    record_claims(&h).await;
    let mut ds = Vec::new();
    for name in ["d1.log", "d2.log", "d3.log"] {
        ds.push(h.start(name));
        wait_log(&h, name, "dispatcher lock taken", Duration::from_secs(30)).await;
    }
    wait_log(
        &h,
        "d1.log",
        "leads the maintenance",
        Duration::from_secs(30),
    )
    .await;
    let n: i64 = 20_000;
    h.add(n / 2, "heavy", serde_json::json!({})).await;
    for s in 0..49_i64 {
        let share = n / 2 / 49 + i64::from(s < n / 2 % 49);
        h.add(share, &format!("s{s}"), serde_json::json!({})).await;
    }
    assert_eq!(h.count("SELECT count(*) FROM pepsi.workqueue").await, n);

    // Sample the running rows per dispatcher and stage while the run goes.
    let pool = h.db.pool.clone();
    let stop_sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampling = {
        let stop = stop_sampling.clone();
        tokio::spawn(async move {
            let mut most = (0_i64, 0_i64, String::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let top: Option<(i64, i64, String)> = sqlx::query_as(
                    "SELECT count(*), claim_epoch, stage FROM pepsi.workqueue \
                     WHERE status = 'running' GROUP BY claim_epoch, stage ORDER BY 1 DESC LIMIT 1",
                )
                .fetch_optional(&pool)
                .await
                .unwrap();
                if let Some(top) = top
                    && top.0 > most.0
                {
                    most = top;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            most
        })
    };
    let until = Instant::now() + Duration::from_secs(120);
    while h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'")
        .await
        < n / 3
    {
        assert!(Instant::now() < until, "{}", h.log("d1.log"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed: i64 = sqlx::query_scalar("SELECT epoch FROM pepsi.dispatcher WHERE pid = $1")
        .bind(ds[0].id() as i32)
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
    signal(&ds[0], "-KILL");
    let until = Instant::now() + Duration::from_secs(30);
    while !(h.log("d2.log").contains("leads the maintenance")
        || h.log("d3.log").contains("leads the maintenance"))
    {
        assert!(Instant::now() < until, "nobody took over the maintenance");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut survivor = ds.pop().unwrap();
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        n,
        Duration::from_secs(300),
        &mut survivor,
    )
    .await;
    stop_sampling.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = sampling.await.unwrap();
    assert!(
        most.0 <= 16,
        "a dispatcher ran {most:?} rows of one stage at once (pools hold 16; epoch {killed} was killed)"
    );
    each_stage_once(&h, n, &["init", "b"]).await;

    let twice = h
        .count(&format!(
            "SELECT count(*) FROM (SELECT workqueue_id, stage FROM public.claim GROUP BY 1, 2 \
             HAVING count(*) > 1 AND NOT bool_or(epoch = {killed})) x"
        ))
        .await;
    assert_eq!(twice, 0, "rows claimed twice without the killed dispatcher");
    let claimers = h
        .count("SELECT count(DISTINCT epoch) FROM public.claim")
        .await;
    assert_eq!(claimers, 3, "every dispatcher claimed");
    assert_eq!(
        h.count(&format!(
            "SELECT count(*) FROM pepsi.dispatcher WHERE epoch = {killed} AND fenced_at IS NOT NULL AND stopped_at IS NOT NULL"
        ))
        .await,
        1
    );
    assert!(stop(survivor).success());
    assert!(stop(ds.pop().unwrap()).success());
}
