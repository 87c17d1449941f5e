//! Secure links through the real pepsi-httpd's admin API, as its own database role
//! (`pepsi-httpd`), over links made by `pepsi_secure_link::store::create`: the listing with
//! its filters, one link with its access log, revoke (a second one 409) and extend (by days
//! and to a time; 409 once revoked or purged), 404 for a link that is not there, 400 naming
//! bad input, 401 without a credential, and the event_log row of each change with the
//! administrator as actor.

use chrono::{DateTime, TimeDelta, Utc};
use pepsi_secure_link::store;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support::httpd::{AsRole, Auth, Httpd};

const CEO: &str = "ceo@example.test";
const PARTNER: &str = "partner@example.net";
const OTHER: &str = "other@example.org";
const NO_LINK: &str = "AAAAAAAAAAAAAAAAAAAAAA";

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    auth: Auth,
}

async fn fixture() -> Fixture {
    let site =
        AsRole::new("[pepsi]\nLOCAL_DOMAINS = example.test\nHOSTNAME = mx.example.test\n").await;
    let (httpd, session) = site.start().await;
    Fixture {
        db: site.db,
        _dir: site.dir,
        httpd,
        auth: Auth::Session(session),
    }
}

impl Fixture {
    async fn link(&self, sender: &str, recipient: &str) -> String {
        let mut tx = self.db.pool.begin().await.unwrap();
        let created = store::create(
            &mut tx,
            sender,
            recipient,
            b"Subject: figures\r\n\r\nThe figures.\r\n",
            TimeDelta::days(7),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        created.link_id
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let a = self.httpd.get(path, &self.auth).await;
        (a.status, a.json)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let a = self.httpd.post(path, &self.auth, &body).await;
        (a.status, a.json)
    }

    async fn ids(&self, query: &str) -> Vec<String> {
        let (status, v) = self.get(&format!("/api/secure-links{query}")).await;
        assert_eq!(status, 200, "{query}: {v}");
        v["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["link_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn time(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("not a time: {v}")))
        .unwrap()
        .with_timezone(&Utc)
}

/// A 400, 404 or 409 answer whose error names `says`.
fn refused(got: (u16, Value), status: u16, says: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    let e = got.1["error"].as_str().unwrap_or_default();
    assert!(e.contains(says), "should say {says:?}: {}", got.1);
}

#[tokio::test]
async fn the_api_lists_shows_revokes_and_extends_secure_links() {
    let f = fixture().await;
    let a = &*f.link(CEO, PARTNER).await;
    let b = &*f.link(CEO, OTHER).await;
    let c = &*f.link("cfo@example.test", PARTNER).await;

    // The listing, newest first, with its filters.
    assert_eq!(f.ids("").await, [c, b, a]);
    assert_eq!(f.ids("?sender=CEO@example.test").await, [b, a]);
    assert_eq!(f.ids(&format!("?recipient={PARTNER}&limit=1")).await, [c]);
    assert!(f.ids("?state=revoked").await.is_empty());
    let (_, v) = f.get("/api/secure-links?limit=2").await;
    assert_eq!(v["limit"], 2);
    assert_eq!(v["links"][0]["state"], "active");
    assert_eq!(v["links"][0]["size"], 34);
    refused(
        f.get("/api/secure-links?state=open").await,
        400,
        "state \"open\" is not a link state",
    );
    refused(
        f.get("/api/secure-links?page=2").await,
        400,
        "unknown parameter \"page\"",
    );
    refused(f.get("/api/secure-links?limit=0").await, 400, "limit 0");
    refused(
        f.get("/api/secure-links?sender=nobody").await,
        400,
        "is not an address",
    );

    // One link with its access log; 404 for none, 400 for what is no link id.
    let (status, v) = f.get(&format!("/api/secure-links/{a}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["link"]["link_id"], a);
    assert_eq!(v["link"]["recipient"], PARTNER);
    assert_eq!(v["access"][0]["event"], "created");
    refused(
        f.get(&format!("/api/secure-links/{NO_LINK}")).await,
        404,
        &format!("no link {NO_LINK}"),
    );
    refused(
        f.get("/api/secure-links/nope").await,
        400,
        "is not a link id",
    );

    // Revoke: by the administrator unless the body names someone; a second time 409.
    let (status, v) = f
        .post(&format!("/api/secure-links/{a}/revoke"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "revoked");
    assert_eq!(v["revoked_by"], "root");
    refused(
        f.post(&format!("/api/secure-links/{a}/revoke"), json!({}))
            .await,
        409,
        "is revoked already (by root)",
    );
    let (status, v) = f
        .post(
            &format!("/api/secure-links/{b}/revoke"),
            json!({"by": "abuse desk"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["revoked_by"], "abuse desk");
    refused(
        f.post(&format!("/api/secure-links/{NO_LINK}/revoke"), json!({}))
            .await,
        404,
        "no link",
    );
    refused(
        f.post(
            &format!("/api/secure-links/{c}/revoke"),
            json!({"who": "x"}),
        )
        .await,
        400,
        "unknown field",
    );
    assert_eq!(f.ids("?state=revoked").await, [b, a]);

    // Extend by days, then to a time.
    let before = time(&f.get(&format!("/api/secure-links/{c}")).await.1["link"]["expires"]);
    let (status, v) = f
        .post(
            &format!("/api/secure-links/{c}/extend"),
            json!({"days": 30}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(time(&v["expires"]) > before, "{v}");
    let until =
        (Utc::now() + TimeDelta::days(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (status, v) = f
        .post(
            &format!("/api/secure-links/{c}/extend"),
            json!({"until": until}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(time(&v["expires"]), time(&json!(until)));
    for (body, says) in [
        (json!({}), "give the new expiry"),
        (json!({"days": 3, "until": until}), "not both"),
        (json!({"days": 0}), "days 0 is not valid: 1 to 365"),
        (json!({"days": 366}), "days 366 is not valid"),
        (json!({"until": "soon"}), "is not an RFC 3339 time"),
        (
            json!({"until": "2001-01-01T00:00:00Z"}),
            "is not between now and 365 days from now",
        ),
        (json!({"weeks": 2}), "unknown field"),
    ] {
        refused(
            f.post(&format!("/api/secure-links/{c}/extend"), body).await,
            400,
            says,
        );
    }
    refused(
        f.post(&format!("/api/secure-links/{a}/extend"), json!({"days": 3}))
            .await,
        409,
        "is revoked already",
    );
    refused(
        f.post(
            &format!("/api/secure-links/{NO_LINK}/extend"),
            json!({"days": 3}),
        )
        .await,
        404,
        "no link",
    );
    // A purged link (the operator tool's doing) stays purged.
    let mut tx = f.db.pool.begin().await.unwrap();
    store::purge_one(&mut tx, c).await.unwrap();
    tx.commit().await.unwrap();
    refused(
        f.post(&format!("/api/secure-links/{c}/extend"), json!({"days": 3}))
            .await,
        409,
        "the message was purged",
    );
    refused(
        f.post(&format!("/api/secure-links/{c}/revoke"), json!({}))
            .await,
        409,
        "the message was purged",
    );
    let (_, v) = f.get(&format!("/api/secure-links/{c}")).await;
    let events: Vec<&str> = v["access"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["created", "extended", "extended", "purged"]);
    assert_eq!(v["link"]["state"], "purged");

    // Each change is one event_log row with the administrator as actor.
    let rows: Vec<(String, String, Value)> = sqlx::query_as(
        "SELECT actor, action, detail FROM pepsi.event_log \
          WHERE action LIKE 'secure_link.%' ORDER BY event_id",
    )
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    let actions: Vec<(&str, &str)> = rows
        .iter()
        .map(|(actor, action, _)| (actor.as_str(), action.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("root", "secure_link.revoke"),
            ("root", "secure_link.revoke"),
            ("root", "secure_link.extend"),
            ("root", "secure_link.extend"),
        ]
    );
    assert_eq!(rows[0].2["link_id"], a);
    assert_eq!(rows[0].2["tool"], "pepsi-httpd");

    // Without a credential, nothing.
    let a401 = f.httpd.get("/api/secure-links", &Auth::None).await;
    assert_eq!(a401.status, 401, "{a401:?}");
    let a401 = f
        .httpd
        .post(
            &format!("/api/secure-links/{b}/extend"),
            &Auth::None,
            &json!({"days": 3}),
        )
        .await;
    assert_eq!(a401.status, 401, "{a401:?}");
}
