//! `pepsi_archive::store` against a real database: posts archived with their thread (in
//! order, a reply before its parent, a missing middle post, threads merged), once per
//! Message-ID; their parts and decoded text; search by words, phrases, author, subject and
//! dates; purges that leave nothing of a post but, under replies, a placeholder.

use chrono::{DateTime, TimeZone as _, Utc};
use pepsi_archive::store::{self, ArchivedId};
use pepsi_testkit::TestDb;

async fn list(db: &TestDb, address: &str) -> i64 {
    sqlx::query_scalar("INSERT INTO pepsi.mailing_list (address) VALUES ($1) RETURNING list_id")
        .bind(address)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

fn at(day: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, day, 12, 0, 0).unwrap()
}

/// Archives a plain post `id` with `extra` header fields in its own transaction.
async fn post(db: &TestDb, list_id: i64, id: &str, extra: &str, text: &str) -> Option<ArchivedId> {
    let headers = format!(
        "From: Alice Example <alice@example.test>\r\nSubject: lunch plans\r\n\
         Date: Tue, 3 Mar 2026 10:00:00 +0000\r\nMessage-ID: <{id}>\r\n{extra}"
    );
    archive(db, list_id, &headers, text).await
}

async fn archive(db: &TestDb, list_id: i64, headers: &str, body: &str) -> Option<ArchivedId> {
    let mut tx = db.pool.begin().await.unwrap();
    let got = store::archive_post(&mut tx, list_id, headers.as_bytes(), body.as_bytes(), at(5))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    got
}

/// (url_id, thread_id, parent_url_id) of every post, in archive order.
async fn messages(db: &TestDb, list_id: i64) -> Vec<(String, i64, Option<String>)> {
    sqlx::query_as(
        "SELECT url_id, thread_id, parent_url_id FROM pepsi.archive_message \
         WHERE list_id = $1 ORDER BY archive_id",
    )
    .bind(list_id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// (url_id, thread_id, parent_url_id) of every placeholder, by url id.
async fn placeholders(db: &TestDb, list_id: i64) -> Vec<(String, i64, Option<String>)> {
    sqlx::query_as(
        "SELECT url_id, thread_id, parent_url_id FROM pepsi.archive_placeholder \
         WHERE list_id = $1 ORDER BY url_id",
    )
    .bind(list_id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// (thread_id, root_url_id, message_count) of every thread.
async fn threads(db: &TestDb, list_id: i64) -> Vec<(i64, String, i32)> {
    sqlx::query_as(
        "SELECT thread_id, root_url_id, message_count FROM pepsi.archive_thread \
         WHERE list_id = $1 ORDER BY thread_id",
    )
    .bind(list_id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

fn u(id: &str) -> String {
    pepsi_archive::url::url_id(id).unwrap()
}

/// A thread built out of order: a reply before its parent (the parent a placeholder at
/// the root), the parent arriving (replacing it), a reply naming a post never received (a
/// placeholder in the middle), and a second thread merged in when the post its root
/// placeholder waited for arrives as a reply in the first; the same Message-ID archived
/// twice is archived once.
#[tokio::test]
async fn posts_are_threaded_by_their_references_in_any_order() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    // b answers a, which has not arrived.
    let b = post(&db, l, "b@x.test", "In-Reply-To: <a@X.test>\r\n", "b\r\n")
        .await
        .unwrap();
    assert_eq!(
        placeholders(&db, l).await,
        vec![(u("a@x.test"), b.thread_id, None)]
    );
    assert_eq!(threads(&db, l).await, vec![(b.thread_id, u("a@x.test"), 1)]);
    // a arrives: it takes its placeholder's place in b's thread.
    let a = post(&db, l, "a@x.test", "", "a\r\n").await.unwrap();
    assert_eq!(a.thread_id, b.thread_id);
    assert_eq!(a.url_id, u("a@x.test"));
    assert!(placeholders(&db, l).await.is_empty());
    // d names a, then c (never received): c is a placeholder under a, d's parent.
    let d = post(
        &db,
        l,
        "d@x.test",
        "References: <a@x.test> <c@x.test>\r\nIn-Reply-To: <c@x.test>\r\n",
        "d\r\n",
    )
    .await
    .unwrap();
    assert_eq!(d.thread_id, a.thread_id);
    assert_eq!(
        placeholders(&db, l).await,
        vec![(u("c@x.test"), a.thread_id, Some(u("a@x.test")))]
    );
    // A second thread, e (answering g, not arrived) then its reply f; g arrives answering
    // d: one thread, counted.
    let e = post(&db, l, "e@x.test", "In-Reply-To: <g@x.test>\r\n", "e\r\n")
        .await
        .unwrap();
    let f = post(&db, l, "f@x.test", "References: <e@x.test>\r\n", "f\r\n")
        .await
        .unwrap();
    assert_eq!(e.thread_id, f.thread_id);
    assert_ne!(e.thread_id, a.thread_id);
    let g = post(
        &db,
        l,
        "g@x.test",
        "References: <a@x.test> <d@x.test>\r\n",
        "g\r\n",
    )
    .await
    .unwrap();
    assert_eq!(g.thread_id, a.thread_id);
    assert_eq!(threads(&db, l).await, vec![(a.thread_id, u("a@x.test"), 6)]);
    assert_eq!(
        placeholders(&db, l).await,
        vec![(u("c@x.test"), a.thread_id, Some(u("a@x.test")))]
    );
    let parents: Vec<(String, Option<String>)> = messages(&db, l)
        .await
        .into_iter()
        .map(|(id, t, p)| {
            assert_eq!(t, a.thread_id);
            (id, p)
        })
        .collect();
    assert_eq!(
        parents,
        vec![
            (u("b@x.test"), Some(u("a@x.test"))),
            (u("a@x.test"), None),
            (u("d@x.test"), Some(u("c@x.test"))),
            (u("e@x.test"), Some(u("g@x.test"))),
            (u("f@x.test"), Some(u("e@x.test"))),
            (u("g@x.test"), Some(u("d@x.test"))),
        ]
    );
    // The same Message-ID again (another spelling of it): nothing archived.
    assert_eq!(post(&db, l, "b@X.TEST", "", "again\r\n").await, None);
    assert_eq!(messages(&db, l).await.len(), 6);
    // In another list the same Message-ID is a post of its own.
    let other = list(&db, "other@example.test").await;
    assert!(post(&db, other, "b@x.test", "", "b\r\n").await.is_some());
    let months: Vec<(chrono::NaiveDate, i32)> =
        sqlx::query_as("SELECT month, message_count FROM pepsi.archive_month WHERE list_id = $1")
            .bind(l)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        months,
        vec![(chrono::NaiveDate::from_ymd_opt(2026, 3, 1).unwrap(), 6)]
    );
}

/// A post without a Message-ID gets one made from its hash, marked as made, so the same
/// post again is recognised; a post without a Date is dated when archived.
#[tokio::test]
async fn a_post_without_message_id_or_date_is_archived_once() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let headers = "From: bob@example.test\r\nSubject: no id\r\n";
    let first = archive(&db, l, headers, "text\r\n").await.unwrap();
    assert_eq!(archive(&db, l, headers, "text\r\n").await, None);
    let (id, made, date): (String, bool, DateTime<Utc>) = sqlx::query_as(
        "SELECT message_id, message_id_made, date FROM pepsi.archive_message WHERE url_id = $1",
    )
    .bind(&first.url_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(made && id.ends_with("@archive.invalid"), "{id}");
    assert_eq!(date, at(5));
}

/// A multipart post: its parts are recorded with types, names and sizes; the text of its
/// text/plain part is decoded (quoted-printable, ISO-8859-1) for search; the raw bytes kept.
#[tokio::test]
async fn parts_are_recorded_and_the_text_is_decoded_for_search() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let headers = "From: =?utf-8?q?Zo=C3=AB?= <zoe@example.test>\r\n\
        Subject: =?utf-8?q?R=C3=A9union?= agenda\r\nMessage-ID: <m1@x.test>\r\n\
        MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b1\"\r\n";
    let body = "--b1\r\nContent-Type: text/plain; charset=iso-8859-1\r\n\
        Content-Transfer-Encoding: quoted-printable\r\n\r\nLe caf=E9 est pr=EAt.\r\n\
        --b1\r\nContent-Type: application/pdf\r\n\
        Content-Disposition: attachment; filename=\"agenda.pdf\"\r\n\
        Content-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQK\r\n--b1--\r\n";
    let a = archive(&db, l, headers, body).await.unwrap();
    let parts: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT content_type, file_name, size FROM pepsi.archive_part WHERE archive_id = $1 \
         ORDER BY part_index",
    )
    .bind(a.archive_id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        parts,
        vec![
            ("text/plain".to_owned(), None, 19),
            (
                "application/pdf".to_owned(),
                Some("agenda.pdf".to_owned()),
                9
            ),
        ]
    );
    let (from_name, subject, raw): (String, String, Vec<u8>) = sqlx::query_as(
        "SELECT m.from_name, m.subject, b.raw FROM pepsi.archive_message m \
         JOIN pepsi.archive_body b USING (archive_id) WHERE archive_id = $1",
    )
    .bind(a.archive_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (from_name.as_str(), subject.as_str()),
        ("Zoë", "Réunion agenda")
    );
    assert_eq!(raw, format!("{headers}\r\n{body}").into_bytes());
    let hits = store::search(&db.pool, l, "café", 10, true).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].url_id, a.url_id);
    assert!(
        store::search(&db.pool, l, "JVBERi0xLjQK", 10, true)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Search: words anywhere (the subject ranked above the text), phrases, `from:`,
/// `subject:`, `after:` and `before:`; a bad query is refused with its reason.
#[tokio::test]
async fn search_ranks_and_filters() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let mail = |id: &str, from: &str, subject: &str, date: &str, text: &str| {
        (
            format!("From: {from}\r\nSubject: {subject}\r\nDate: {date}\r\nMessage-ID: <{id}>\r\n"),
            text.to_owned(),
        )
    };
    for (h, b) in [
        mail(
            "p1@x",
            "Alice <alice@example.test>",
            "pizza friday",
            "Mon, 2 Feb 2026 10:00:00 +0000",
            "who comes\r\n",
        ),
        mail(
            "p2@x",
            "Bob <bob@example.test>",
            "weekend",
            "Mon, 2 Mar 2026 10:00:00 +0000",
            "pizza or pasta on friday\r\n",
        ),
        mail(
            "p3@x",
            "Carol <carol@remote.test>",
            "minutes",
            "Tue, 3 Mar 2026 10:00:00 +0000",
            "the friday pizza was cold\r\n",
        ),
    ] {
        archive(&db, l, &h, &b).await.unwrap();
    }
    let ids =
        |hits: Vec<store::Hit>| -> Vec<String> { hits.into_iter().map(|h| h.url_id).collect() };
    let q = |s: &'static str| {
        let pool = db.pool.clone();
        async move { ids(store::search(&pool, l, s, 10, true).await.unwrap()) }
    };
    assert_eq!(q("pizza").await[0], u("p1@x"), "the subject ranks first");
    assert_eq!(q("pizza").await.len(), 3);
    assert_eq!(q("\"friday pizza\"").await, vec![u("p3@x")]);
    assert_eq!(q("pizza -cold").await.len(), 2);
    assert_eq!(q("from:bob pizza").await, vec![u("p2@x")]);
    assert_eq!(q("from:Carol").await, vec![u("p3@x")]);
    assert_eq!(q("from:example.test").await, vec![u("p2@x"), u("p1@x")]);
    assert_eq!(q("subject:pizza").await, vec![u("p1@x")]);
    // A reader who does not see addresses: `from:` matches a name or a whole address.
    let hidden = |s: &'static str| {
        let pool = db.pool.clone();
        async move { ids(store::search(&pool, l, s, 10, false).await.unwrap()) }
    };
    assert!(hidden("from:example.test").await.is_empty());
    assert!(hidden("from:carol@remote").await.is_empty());
    assert_eq!(hidden("from:carol@REMOTE.test").await, vec![u("p3@x")]);
    assert_eq!(hidden("from:Carol").await, vec![u("p3@x")]);
    assert_eq!(q("after:2026-03-01 pizza").await.len(), 2);
    assert_eq!(q("before:2026-03-03").await, vec![u("p2@x"), u("p1@x")]);
    assert_eq!(
        q("after:2026-03-03 before:2026-03-04").await,
        vec![u("p3@x")]
    );
    assert!(q("sushi").await.is_empty());
    let other = list(&db, "other@example.test").await;
    assert!(
        store::search(&db.pool, other, "pizza", 10, true)
            .await
            .unwrap()
            .is_empty()
    );
    let err = store::search(&db.pool, l, "after:soon", 10, true)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "after:\"soon\" is not a date: expected YYYY-MM-DD"
    );
    assert_eq!(
        store::search(&db.pool, l, "pizza", 1, true)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// A purged post leaves no message, body, part or search text; under replies it leaves a
/// placeholder (its Message-ID only), a leaf nothing; a thread without posts goes; a purge
/// by address takes every post of that author in every list, and the log names no address.
#[tokio::test]
async fn purges_leave_only_placeholders_under_replies() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let a = post(&db, l, "a@x.test", "", "secret words\r\n")
        .await
        .unwrap();
    let _b = post(
        &db,
        l,
        "b@x.test",
        "References: <a@x.test>\r\n",
        "reply\r\n",
    )
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    assert!(
        store::purge_message(&mut tx, l, &a.url_id, "ops")
            .await
            .unwrap()
    );
    assert!(
        !store::purge_message(&mut tx, l, &a.url_id, "ops")
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let count = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_body").await, 1);
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_part").await, 1);
    assert!(
        store::search(&db.pool, l, "secret", 10, true)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        placeholders(&db, l).await,
        vec![(a.url_id.clone(), a.thread_id, None)]
    );
    assert_eq!(
        threads(&db, l).await,
        vec![(a.thread_id, a.url_id.clone(), 1)]
    );
    // The reply purged by its author's address: nothing of the thread remains.
    let other = list(&db, "other@example.test").await;
    post(&db, other, "o@x.test", "", "elsewhere\r\n")
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pepsi.archive_reader (list_id, address, token_hash, expires_at) \
         VALUES ($1, 'ALICE@example.test', sha256('t'), now() + interval '1 day')",
    )
    .bind(l)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    assert_eq!(
        store::purge_address(&mut tx, "Alice@Example.test", "ops")
            .await
            .unwrap(),
        2
    );
    tx.commit().await.unwrap();
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_message").await, 0);
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_body").await, 0);
    assert_eq!(
        count("SELECT count(*) FROM pepsi.archive_placeholder").await,
        0
    );
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_thread").await, 0);
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_month").await, 0);
    assert_eq!(count("SELECT count(*) FROM pepsi.archive_reader").await, 0);
    let log: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT event, detail FROM pepsi.archive_event_log ORDER BY event_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        log,
        vec![
            (
                "purge.message".to_owned(),
                serde_json::json!({"url_id": a.url_id})
            ),
            ("purge.address".to_owned(), serde_json::json!({"posts": 1})),
            ("purge.address".to_owned(), serde_json::json!({"posts": 1})),
        ]
    );
}

/// A NUL in a post's text or its ids (which PostgreSQL's text refuses) does not fail the
/// post: it is left out of the search text and the ids.
#[tokio::test]
async fn a_nul_in_the_text_or_the_ids_is_left_out() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let got = archive(
        &db,
        l,
        "From: a@example.test\r\nSubject: nul\r\nMessage-ID: <n\0ul@x.test>\r\n\
         In-Reply-To: <pa\0rent@x.test>\r\nReferences: <gr\0and@x.test> <pa\0rent@x.test>\r\n",
        "before\0after marker\r\n",
    )
    .await
    .expect("archived");
    assert_eq!(got.url_id, u("nul@x.test"));
    let (message_id, in_reply_to, refs): (String, Option<String>, Vec<String>) = sqlx::query_as(
        "SELECT message_id, in_reply_to, message_references FROM pepsi.archive_message",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(message_id, "nul@x.test");
    assert_eq!(in_reply_to.as_deref(), Some("parent@x.test"));
    assert_eq!(refs, ["grand@x.test", "parent@x.test"]);
    assert_eq!(placeholders(&db, l).await.len(), 2);
    let hits = store::search(&db.pool, l, "marker", 10, true)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
}

/// Only the newest `MAX_RANKED` matches of a search are ranked: an older match, however
/// well it ranks, is not found.
#[tokio::test]
async fn search_ranks_only_the_newest_matches() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    // The oldest post says the word most often: it would rank first.
    archive(
        &db,
        l,
        "From: a@example.test\r\nSubject: kiwi kiwi\r\nMessage-ID: <old@x.test>\r\n\
         Date: Sun, 1 Feb 2026 10:00:00 +0000\r\n",
        &"kiwi ".repeat(50),
    )
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..store::MAX_RANKED {
        let h = format!(
            "From: b@example.test\r\nSubject: fruit\r\nMessage-ID: <{i}@x.test>\r\n\
             Date: Mon, 2 Mar 2026 10:00:00 +0000\r\n"
        );
        store::archive_post(&mut tx, l, h.as_bytes(), b"one kiwi\r\n", at(5))
            .await
            .unwrap()
            .unwrap();
    }
    tx.commit().await.unwrap();
    let hits = store::search(&db.pool, l, "kiwi", 200, true).await.unwrap();
    assert_eq!(hits.len(), 200);
    assert!(
        hits.iter().all(|h| h.url_id != u("old@x.test")),
        "the oldest match is beyond the ranked ones"
    );
    // Narrowed by date, it is among the newest matches again, and found.
    let old = store::search(&db.pool, l, "kiwi before:2026-03-01", 10, true)
        .await
        .unwrap();
    assert_eq!(old.len(), 1);
    assert_eq!(old[0].url_id, u("old@x.test"));
}

/// One post whose References name posts of other threads joins its parent's thread alone:
/// the other threads stay as they were, not merged.
#[tokio::test]
async fn references_naming_other_threads_merge_nothing() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let one = post(&db, l, "one@x.test", "", "x\r\n").await.unwrap();
    let two = post(&db, l, "two@x.test", "", "x\r\n").await.unwrap();
    let three = post(&db, l, "three@x.test", "", "x\r\n").await.unwrap();
    let z = post(
        &db,
        l,
        "z@x.test",
        "References: <one@x.test> <two@x.test> <three@x.test>\r\n",
        "x\r\n",
    )
    .await
    .unwrap();
    assert_eq!(z.thread_id, three.thread_id, "the parent's thread");
    let t = threads(&db, l).await;
    assert_eq!(
        t,
        [
            (one.thread_id, u("one@x.test"), 1),
            (two.thread_id, u("two@x.test"), 1),
            (three.thread_id, u("three@x.test"), 2),
        ]
    );
    let m = messages(&db, l).await;
    assert_eq!(
        m[3],
        (u("z@x.test"), three.thread_id, Some(u("three@x.test")))
    );
}

/// A purged post under replies leaves nothing in its thread's row (the subject and dates
/// are the posts' left), and its placeholder, marked purged, keeps its Message-ID from
/// being archived again in its place.
#[tokio::test]
async fn a_purged_root_leaves_no_subject_and_its_id_is_not_taken_again() {
    let db = TestDb::new().await;
    let l = list(&db, "team@example.test").await;
    let root = archive(
        &db,
        l,
        "From: a@example.test\r\nSubject: my secret diagnosis\r\nMessage-ID: <root@x.test>\r\n\
         Date: Sun, 1 Mar 2026 10:00:00 +0000\r\n",
        "x\r\n",
    )
    .await
    .unwrap();
    for (id, day) in [("r1@x.test", 2), ("r2@x.test", 4)] {
        archive(
            &db,
            l,
            &format!(
                "From: b@example.test\r\nSubject: Re: something else\r\nMessage-ID: <{id}>\r\n\
                 Date: {day} Mar 2026 10:00:00 +0000\r\nReferences: <root@x.test>\r\n"
            ),
            "y\r\n",
        )
        .await
        .unwrap();
    }
    let mut tx = db.pool.begin().await.unwrap();
    assert!(
        store::purge_message(&mut tx, l, &root.url_id, "test")
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let (subject, first, last, n): (String, DateTime<Utc>, DateTime<Utc>, i32) = sqlx::query_as(
        "SELECT subject, first_date, last_date, message_count FROM pepsi.archive_thread \
             WHERE thread_id = $1",
    )
    .bind(root.thread_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(subject, "Re: something else");
    assert_eq!(
        (first, last, n),
        (
            Utc.with_ymd_and_hms(2026, 3, 2, 10, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(2026, 3, 4, 10, 0, 0).unwrap(),
            2
        )
    );
    let purged: bool =
        sqlx::query_scalar("SELECT purged FROM pepsi.archive_placeholder WHERE url_id = $1")
            .bind(&root.url_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(purged);
    // The same Message-ID again: a duplicate, not a post at the purged one's URL.
    let again = archive(
        &db,
        l,
        "From: c@example.test\r\nSubject: replaced\r\nMessage-ID: <root@x.test>\r\n",
        "z\r\n",
    )
    .await;
    assert_eq!(again, None);
    assert_eq!(messages(&db, l).await.len(), 2);
    // A reply naming it is archived as ever, under the placeholder.
    let r3 = post(
        &db,
        l,
        "r3@x.test",
        "References: <root@x.test>\r\n",
        "w\r\n",
    )
    .await
    .unwrap();
    assert_eq!(r3.thread_id, root.thread_id);
}
