//! `db::admit_batch` against a real PostgreSQL: several messages in one statement, each row
//! as `db::admit` would store it, in order, in one transaction; a batch with a row the
//! database refuses stores nothing.

use pepsi_contract::db::{Admission, admit, admit_batch};
use pepsi_testkit::TestDb;
use sqlx::Row as _;

fn message<'a>(
    from: &'a str,
    rcpts: &'a [String],
    headers: &'a [u8],
    body: &'a [u8],
    state: &'a serde_json::Value,
    auth_user: Option<&'a str>,
    addr: &str,
) -> Admission<'a> {
    Admission {
        mail_from: from,
        rcpt_to: rcpts,
        headers,
        body,
        state,
        auth_user,
        client_addr: addr.parse().unwrap(),
    }
}

async fn stored(db: &TestDb, id: i64) -> sqlx::postgres::PgRow {
    sqlx::query(
        "SELECT w.mail_from, w.rcpt_to, w.headers, b.body, w.state, w.auth_user, \
                host(w.client_addr) AS addr, w.sender_key, w.stage, w.status::text AS status, \
                w.xmin::text AS xmin \
         FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
         WHERE w.workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_batch_stores_each_message_as_admit_would_in_one_transaction() {
    let db = TestDb::new().await;
    let one = vec!["alice@example.test".to_owned()];
    let three = vec![
        "a@example.test".to_owned(),
        "b@example.test".to_owned(),
        "c@example.test".to_owned(),
    ];
    let two = vec!["x@example.test".to_owned(), "y@example.test".to_owned()];
    let s1 = serde_json::json!({"origin": {"helo": "one"}});
    let s2 = serde_json::json!({});
    let s3 = serde_json::json!({"dsn": {"rcpt": [{}, {}]}});
    let batch = [
        message(
            "bob@example.org",
            &three,
            b"Subject: 1\r\n",
            b"first\r\n",
            &s1,
            None,
            "192.0.2.1",
        ),
        message(
            "",
            &one,
            b"Subject: 2\r\n",
            b"",
            &s2,
            Some("Carol@Example.test"),
            "192.0.2.2",
        ),
        message(
            "dan@example.org",
            &two,
            b"Subject: 3\r\n",
            b"third\r\n",
            &s3,
            None,
            "2001:db8::1",
        ),
    ];
    let ids = admit_batch(&db.pool, &batch).await.unwrap();
    assert_eq!(ids.len(), 3);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids in the order given: {ids:?}"
    );
    let mut xmins = Vec::new();
    for (id, m) in ids.iter().zip(&batch) {
        let r = stored(&db, *id).await;
        assert_eq!(r.get::<String, _>("mail_from"), m.mail_from);
        assert_eq!(r.get::<Vec<String>, _>("rcpt_to"), m.rcpt_to);
        assert_eq!(r.get::<Vec<u8>, _>("headers"), m.headers);
        assert_eq!(r.get::<Vec<u8>, _>("body"), m.body);
        assert_eq!(&r.get::<serde_json::Value, _>("state"), m.state);
        assert_eq!(
            r.get::<Option<String>, _>("auth_user").as_deref(),
            m.auth_user
        );
        assert_eq!(r.get::<String, _>("addr"), m.client_addr.to_string());
        assert_eq!(
            (r.get::<String, _>("stage"), r.get::<String, _>("status")),
            ("init".into(), "pending".into())
        );
        xmins.push(r.get::<String, _>("xmin"));
    }
    assert_eq!(
        stored(&db, ids[1]).await.get::<String, _>("sender_key"),
        "auth:carol@example.test"
    );
    assert_eq!(
        stored(&db, ids[2]).await.get::<String, _>("sender_key"),
        "net:2001:db8::/64"
    );
    xmins.dedup();
    assert_eq!(xmins.len(), 1, "one transaction for the batch");

    // The same message through admit: the same row but for the id.
    let alone = admit(&db.pool, &batch[0], None).await.unwrap();
    let (a, b) = (stored(&db, alone).await, stored(&db, ids[0]).await);
    for column in ["mail_from", "addr", "sender_key"] {
        assert_eq!(
            a.get::<String, _>(column),
            b.get::<String, _>(column),
            "{column}"
        );
    }
    assert_eq!(
        a.get::<Vec<String>, _>("rcpt_to"),
        b.get::<Vec<String>, _>("rcpt_to")
    );
}

#[tokio::test]
async fn a_batch_with_a_row_the_database_refuses_stores_nothing() {
    let db = TestDb::new().await;
    let one = vec!["alice@example.test".to_owned()];
    let none: Vec<String> = Vec::new();
    let state = serde_json::json!({});
    let batch = [
        message(
            "bob@example.org",
            &one,
            b"Subject: ok\r\n",
            b"ok\r\n",
            &state,
            None,
            "192.0.2.1",
        ),
        // No recipient: the queue's CHECK refuses the row.
        message(
            "bob@example.org",
            &none,
            b"Subject: bad\r\n",
            b"bad\r\n",
            &state,
            None,
            "192.0.2.1",
        ),
    ];
    let err = admit_batch(&db.pool, &batch).await.unwrap_err();
    match &err {
        sqlx::Error::Database(d) => assert_eq!(d.code().as_deref(), Some("23514"), "{err}"),
        other => panic!("expected the CHECK violation, got {other}"),
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing of the batch committed");
    let bodies: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue_body")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(bodies, 0);

    // Arrays that do not describe the same messages are refused by the function itself.
    let err = sqlx::query(
        "SELECT pepsi.workqueue_add_batch(ARRAY['a'], ARRAY['b@example.test'], ARRAY[2], \
         ARRAY['S: x\r\n'::bytea], ARRAY['y'::bytea], ARRAY['{}'::jsonb], ARRAY[NULL::text], \
         ARRAY[NULL::inet])",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    match &err {
        sqlx::Error::Database(d) => assert_eq!(d.code().as_deref(), Some("22023"), "{err}"),
        other => panic!("expected 22023, got {other}"),
    }
    assert!(admit_batch(&db.pool, &[]).await.unwrap().is_empty());
}
