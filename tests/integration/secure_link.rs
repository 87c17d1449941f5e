//! `pepsi_secure_link::store` against a real database: the whole flow from a sealed message
//! to reading it, codes that lock after five wrong tries and are sent a bounded number of
//! times, links refused for being expired, revoked, purged or superseded by a resend, each
//! with its reason, and the guarantee the design rests on: the stored row alone reads nothing.

use chrono::{TimeDelta, Utc};
use pepsi_secure_link::seal::{self, LinkHalf, SealError, Sealed};
use pepsi_secure_link::store::{self, Created, Error, Refusal, SessionToken};
use pepsi_testkit::TestDb;
use sqlx::Row as _;
use sqlx::postgres::PgPoolOptions;

const MARKER: &str = "SECRET-MARKER-a91c";
const CLIENT: &str = "198.51.100.7";

fn message() -> Vec<u8> {
    format!(
        "From: ceo@example.test\r\nTo: partner@example.net\r\nSubject: {MARKER} figures\r\n\
         \r\nThe {MARKER} figures are attached.\r\n"
    )
    .into_bytes()
}

async fn create(db: &TestDb) -> Created {
    let mut tx = db.pool.begin().await.unwrap();
    let created = store::create(
        &mut tx,
        "ceo@example.test",
        "partner@example.net",
        &message(),
        TimeDelta::days(7),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    created
}

async fn send_code(db: &TestDb, link: &Created, generation: i32) -> Result<String, Error> {
    let mut tx = db.pool.begin().await.unwrap();
    let code = store::send_code(&mut tx, &link.link_id, generation, CLIENT).await?;
    tx.commit().await.unwrap();
    Ok(code.as_str().to_owned())
}

async fn session(db: &TestDb, link: &Created, generation: i32) -> SessionToken {
    let code = send_code(db, link, generation).await.unwrap();
    store::check_code(&db.pool, &link.link_id, generation, &code, CLIENT)
        .await
        .unwrap()
}

async fn open(
    db: &TestDb,
    link: &Created,
    half: &LinkHalf,
    session: &SessionToken,
) -> Result<Vec<u8>, Error> {
    store::open(&db.pool, &link.link_id, half, session, CLIENT).await
}

fn refusal<T: std::fmt::Debug>(r: Result<T, Error>) -> Refusal {
    match r {
        Err(Error::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A code that is not `code`.
fn other_code(code: &str) -> String {
    let n: u32 = code.parse().unwrap();
    format!("{:08}", (n + 1) % 100_000_000)
}

async fn events(db: &TestDb, link: &Created) -> Vec<String> {
    store::access_log(&db.pool, &link.link_id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.event)
        .collect()
}

async fn set(db: &TestDb, link: &Created, sql: &'static str) {
    sqlx::query(sql)
        .bind(&link.link_id)
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_recipient_reads_the_message_after_a_code_and_the_sender_sees_each_step() {
    let db = TestDb::new().await;
    let link = create(&db).await;
    assert_eq!(link.generation, 1);
    assert!(link.expires > Utc::now());
    let token = session(&db, &link, 1).await;
    assert_eq!(
        open(&db, &link, &link.link_half, &token).await.unwrap(),
        message()
    );
    // A session of this link opens nothing with another key, and a made-up token nothing.
    let zero = LinkHalf::from_bytes([0; 32]);
    assert_eq!(
        refusal(open(&db, &link, &zero, &token).await),
        Refusal::WrongKey
    );
    let forged = SessionToken("A".repeat(43));
    assert_eq!(
        refusal(open(&db, &link, &link.link_half, &forged).await),
        Refusal::NoSession
    );
    // A spent code opens no second session.
    assert_eq!(
        refusal(store::check_code(&db.pool, &link.link_id, 1, "00000000", CLIENT).await),
        Refusal::NoCode
    );
    assert_eq!(
        events(&db, &link).await,
        ["created", "code_sent", "session_opened", "opened"]
    );
    let log = store::access_log(&db.pool, &link.link_id).await.unwrap();
    assert_eq!(log[1].client_key.as_deref(), Some(CLIENT));
}

#[tokio::test]
async fn five_wrong_codes_lock_the_code_even_for_the_right_one() {
    let db = TestDb::new().await;
    let link = create(&db).await;
    let code = send_code(&db, &link, 1).await.unwrap();
    let wrong = other_code(&code);
    for left in (1..=4).rev() {
        assert_eq!(
            refusal(store::check_code(&db.pool, &link.link_id, 1, &wrong, CLIENT).await),
            Refusal::WrongCode { left }
        );
    }
    assert_eq!(
        refusal(store::check_code(&db.pool, &link.link_id, 1, &wrong, CLIENT).await),
        Refusal::Locked
    );
    assert_eq!(
        refusal(store::check_code(&db.pool, &link.link_id, 1, &code, CLIENT).await),
        Refusal::Locked
    );
    let wrongs = events(&db, &link).await;
    assert_eq!(wrongs.iter().filter(|e| *e == "code_wrong").count(), 5);
    assert_eq!(wrongs.last().map(String::as_str), Some("code_locked"));
    // A new code works again, and a correct one with tries left opens a session.
    let code = send_code(&db, &link, 1).await.unwrap();
    let token = store::check_code(&db.pool, &link.link_id, 1, &code, CLIENT)
        .await
        .unwrap();
    assert_eq!(
        open(&db, &link, &link.link_half, &token).await.unwrap(),
        message()
    );
}

#[tokio::test]
async fn codes_per_link_are_bounded_per_hour_and_an_older_code_is_replaced() {
    let db = TestDb::new().await;
    let link = create(&db).await;
    let first = send_code(&db, &link, 1).await.unwrap();
    for _ in 1..store::CODES_PER_HOUR {
        send_code(&db, &link, 1).await.unwrap();
    }
    assert_eq!(
        refusal(send_code(&db, &link, 1).await),
        Refusal::TooManyCodes
    );
    // Only the latest code counts: the first one is a wrong try now (unless it happens to be
    // the same eight digits as the latest, one chance in 10^8).
    assert!(matches!(
        refusal(store::check_code(&db.pool, &link.link_id, 1, &first, CLIENT).await),
        Refusal::WrongCode { .. }
    ));
}

#[tokio::test]
async fn expired_revoked_and_superseded_links_are_refused_with_their_reason() {
    let db = TestDb::new().await;

    let expired = create(&db).await;
    let token = session(&db, &expired, 1).await;
    set(
        &db,
        &expired,
        "UPDATE pepsi.secure_link_message SET expires_at = now() - interval '1 minute' WHERE link_id = $1",
    )
    .await;
    assert_eq!(refusal(send_code(&db, &expired, 1).await), Refusal::Expired);
    assert_eq!(
        refusal(open(&db, &expired, &expired.link_half, &token).await),
        Refusal::Expired
    );

    let revoked = create(&db).await;
    let token = session(&db, &revoked, 1).await;
    let code = send_code(&db, &revoked, 1).await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    store::revoke(&mut tx, &revoked.link_id, "ceo@example.test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        refusal(open(&db, &revoked, &revoked.link_half, &token).await),
        Refusal::Revoked
    );
    assert_eq!(
        refusal(store::check_code(&db.pool, &revoked.link_id, 1, &code, CLIENT).await),
        Refusal::Revoked
    );
    assert_eq!(refusal(send_code(&db, &revoked, 1).await), Refusal::Revoked);
    let mut tx = db.pool.begin().await.unwrap();
    let until = Utc::now() + TimeDelta::days(30);
    assert_eq!(
        refusal(store::extend(&mut tx, &revoked.link_id, until).await),
        Refusal::Revoked
    );
    drop(tx);
    let log = store::access_log(&db.pool, &revoked.link_id).await.unwrap();
    let last = log.last().unwrap();
    assert_eq!(
        (last.event.as_str(), last.detail.as_deref()),
        ("revoked", Some("ceo@example.test"))
    );

    // A resend: the old link's half, generation, codes and sessions all stop working.
    let resent = create(&db).await;
    let old_token = session(&db, &resent, 1).await;
    let old_code = send_code(&db, &resent, 1).await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let new = store::resend(&mut tx, &resent.link_id, &resent.link_half)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(new.generation, 2);
    assert_ne!(new.link_half, resent.link_half);
    assert_eq!(
        refusal(send_code(&db, &resent, 1).await),
        Refusal::Superseded
    );
    assert_eq!(
        refusal(store::check_code(&db.pool, &resent.link_id, 1, &old_code, CLIENT).await),
        Refusal::Superseded
    );
    assert_eq!(
        refusal(open(&db, &resent, &resent.link_half, &old_token).await),
        Refusal::Superseded
    );
    let new_token = session(&db, &resent, 2).await;
    assert_eq!(
        refusal(open(&db, &resent, &resent.link_half, &new_token).await),
        Refusal::WrongKey,
        "the old link's half must not open the re-sealed message"
    );
    assert_eq!(
        open(&db, &resent, &new.link_half, &new_token)
            .await
            .unwrap(),
        message()
    );
    // A resend needs the current link: the old one cannot make another.
    let mut tx = db.pool.begin().await.unwrap();
    assert_eq!(
        refusal(store::resend(&mut tx, &resent.link_id, &resent.link_half).await),
        Refusal::WrongKey
    );
    drop(tx);

    let mut tx = db.pool.begin().await.unwrap();
    assert_eq!(
        refusal(store::send_code(&mut tx, "AAAAAAAAAAAAAAAAAAAAAA", 1, CLIENT).await),
        Refusal::Unknown
    );
}

#[tokio::test]
async fn an_extended_link_works_again_and_bad_values_are_named() {
    let db = TestDb::new().await;
    let link = create(&db).await;
    set(
        &db,
        &link,
        "UPDATE pepsi.secure_link_message SET expires_at = now() - interval '1 minute' WHERE link_id = $1",
    )
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    store::extend(&mut tx, &link.link_id, Utc::now() + TimeDelta::days(3))
        .await
        .unwrap();
    let too_far = store::extend(&mut tx, &link.link_id, Utc::now() + TimeDelta::days(400)).await;
    assert!(
        matches!(&too_far, Err(Error::Invalid(m)) if m.contains("365 days")),
        "{too_far:?}"
    );
    let no_sender =
        store::create(&mut tx, "", "partner@example.net", b"x", TimeDelta::days(1)).await;
    assert!(
        matches!(&no_sender, Err(Error::Invalid(m)) if m.contains("sender")),
        "{no_sender:?}"
    );
    let forever = store::create(
        &mut tx,
        "ceo@example.test",
        "partner@example.net",
        b"x",
        TimeDelta::days(366),
    )
    .await;
    assert!(matches!(forever, Err(Error::Invalid(_))), "{forever:?}");
    tx.commit().await.unwrap();
    let token = session(&db, &link, 1).await;
    assert_eq!(
        open(&db, &link, &link.link_half, &token).await.unwrap(),
        message()
    );
    assert!(events(&db, &link).await.contains(&"extended".to_owned()));
}

#[tokio::test]
async fn a_purged_link_has_no_ciphertext_left_and_keeps_its_access_log() {
    let db = TestDb::new().await;
    let old = create(&db).await;
    let live = create(&db).await;
    let token = session(&db, &old, 1).await;
    set(
        &db,
        &old,
        "UPDATE pepsi.secure_link_message SET expires_at = now() - interval '1 minute' WHERE link_id = $1",
    )
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    assert_eq!(store::purge_expired(&mut tx, Utc::now()).await.unwrap(), 1);
    tx.commit().await.unwrap();
    let row = sqlx::query(
        "SELECT nonce IS NULL AND ciphertext IS NULL AND db_half IS NULL AS gone, \
                purged_at IS NOT NULL AS purged \
           FROM pepsi.secure_link_message WHERE link_id = $1",
    )
    .bind(&old.link_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(row.get::<bool, _>("gone") && row.get::<bool, _>("purged"));
    assert_eq!(
        refusal(open(&db, &old, &old.link_half, &token).await),
        Refusal::Purged
    );
    assert_eq!(
        events(&db, &old).await,
        ["created", "code_sent", "session_opened", "purged"]
    );
    // The live link is untouched.
    let token = session(&db, &live, 1).await;
    assert_eq!(
        open(&db, &live, &live.link_half, &token).await.unwrap(),
        message()
    );
}

#[tokio::test]
async fn a_dump_of_the_stored_row_alone_does_not_decrypt() {
    let db = TestDb::new().await;
    let link = create(&db).await;
    let code = send_code(&db, &link, 1).await.unwrap();
    store::check_code(&db.pool, &link.link_id, 1, &code, CLIENT)
        .await
        .unwrap();
    let row = sqlx::query(
        "SELECT nonce, ciphertext, db_half FROM pepsi.secure_link_message WHERE link_id = $1",
    )
    .bind(&link.link_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let stored = Sealed {
        nonce: row.get::<Vec<u8>, _>("nonce").try_into().unwrap(),
        ciphertext: row.get("ciphertext"),
        db_half: row.get::<Vec<u8>, _>("db_half").try_into().unwrap(),
    };
    // A random half: the link half of another seal.
    let (_, random) = seal::seal(&link.link_id, b"another message").unwrap();
    for half in [LinkHalf::from_bytes([0; 32]), random] {
        assert_eq!(
            seal::open(&link.link_id, &stored, &half),
            Err(SealError::DoesNotOpen)
        );
    }
    // The db half used as the link half (all a dump has) opens nothing either.
    assert_eq!(
        seal::open(
            &link.link_id,
            &stored,
            &LinkHalf::from_bytes(stored.db_half)
        ),
        Err(SealError::DoesNotOpen)
    );
    // Every stored byte of every secure-link table: no plaintext, no link half, no code.
    let half = link.link_half.encode();
    let marker_hex: String = MARKER.bytes().map(|b| format!("{b:02x}")).collect();
    for table in [
        "secure_link_message",
        "secure_link_code",
        "secure_link_session",
        "secure_link_access",
    ] {
        let dump: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT t::text FROM pepsi.{table} t"
        )))
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert!(!dump.is_empty(), "{table} holds rows");
        for text in dump {
            for needle in [MARKER, &marker_hex, &half, &code] {
                assert!(!text.contains(needle), "{table} holds {needle:?}: {text}");
            }
        }
    }
    for bytes in [&stored.nonce[..], &stored.ciphertext, &stored.db_half] {
        assert!(!bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()));
    }
    // With the link's half the very same bytes open: the test above is not vacuous.
    assert_eq!(
        seal::open(&link.link_id, &stored, &link.link_half).unwrap(),
        message()
    );
}

/// Each role does its part under its own grants: the pipeline seals, revokes and purges, the
/// portal sends and checks codes and opens, and neither strays into the other's.
#[tokio::test]
async fn the_pipeline_and_portal_roles_each_do_their_part() {
    let db = TestDb::new().await;
    let as_role = |role: &'static str| {
        PgPoolOptions::new()
            .max_connections(2)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET ROLE \"{role}\"")))
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            .connect(&db.url)
    };
    let pipeline = as_role("pepsi").await.unwrap();
    let portal = as_role("pepsi-httpd").await.unwrap();
    let mut tx = pipeline.begin().await.unwrap();
    let link = store::create(
        &mut tx,
        "ceo@example.test",
        "partner@example.net",
        &message(),
        TimeDelta::days(7),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // The pipeline cannot issue a code.
    let mut tx = pipeline.begin().await.unwrap();
    let denied = store::send_code(&mut tx, &link.link_id, 1, CLIENT).await;
    assert!(matches!(denied, Err(Error::Db(_))), "{denied:?}");
    drop(tx);
    let mut tx = portal.begin().await.unwrap();
    let code = store::send_code(&mut tx, &link.link_id, 1, CLIENT)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let token = store::check_code(&portal, &link.link_id, 1, code.as_str(), CLIENT)
        .await
        .unwrap();
    let read = store::open(&portal, &link.link_id, &link.link_half, &token, CLIENT)
        .await
        .unwrap();
    assert_eq!(read, message());
    let mut tx = portal.begin().await.unwrap();
    let resent = store::resend(&mut tx, &link.link_id, &link.link_half)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(resent.generation, 2);
    // The portal cannot make a link.
    let mut tx = portal.begin().await.unwrap();
    let planted = store::create(
        &mut tx,
        "ceo@example.test",
        "partner@example.net",
        b"x",
        TimeDelta::days(1),
    )
    .await;
    assert!(matches!(planted, Err(Error::Db(_))), "{planted:?}");
    drop(tx);
    let mut tx = pipeline.begin().await.unwrap();
    store::revoke(&mut tx, &link.link_id, "operator")
        .await
        .unwrap();
    assert_eq!(store::purge_expired(&mut tx, Utc::now()).await.unwrap(), 1);
    tx.commit().await.unwrap();
    let log = store::access_log(&pipeline, &link.link_id).await.unwrap();
    assert_eq!(log.last().map(|a| a.event.as_str()), Some("purged"));
}
