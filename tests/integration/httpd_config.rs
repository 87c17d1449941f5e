//! pepsi-httpd's configuration and settings routes, the real program against a real
//! PostgreSQL over HTTP: overrides checked by every program's parser before they are stored
//! (422 quoting a value a program refuses or that breaks the stage graph, 400 for a
//! malformed scope or an option nothing reads), stored through the CONFIG_DATABASE_URL pool with their event_log rows (409
//! without it), the effective values with their origin and secrets hidden, and every
//! per-address setting set, listed, shown with the row it comes from and deleted.

use pepsi_testkit::TestDb;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support;
use crate::support::free_port;
use crate::support::httpd::{Answer, Auth, Httpd, Session, write_config};

struct Fixture {
    db: TestDb,
    _dir: tempfile::TempDir,
    httpd: Httpd,
    session: Session,
}

/// A database and pepsi-httpd on it, administrator `root` logged in. With `config_url`, the
/// test database's URL is CONFIG_DATABASE_URL, in a secrets.d/ fragment as docs/httpd.md
/// advises.
async fn fixture(config_url: bool) -> Fixture {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        &db.url,
        port,
        "[pepsi]\nLOCAL_DOMAINS = example.test\n\n[stage-relay]\nPROGRAM = pepsi-stage-discard\n",
    );
    if config_url {
        use std::os::unix::fs::PermissionsExt as _;
        let secrets = dir.path().join("secrets.d");
        std::fs::create_dir(&secrets).unwrap();
        let fragment = secrets.join("httpd.conf");
        std::fs::write(
            &fragment,
            format!("[pepsi-httpd]\nCONFIG_DATABASE_URL = {}\n", db.url),
        )
        .unwrap();
        std::fs::set_permissions(&fragment, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let (httpd, _, session) = support::httpd::started_as_root(config, port).await;
    Fixture {
        db,
        _dir: dir,
        httpd,
        session,
    }
}

impl Fixture {
    fn auth(&self) -> Auth {
        Auth::Session(self.session.clone())
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        self.httpd
            .call(method, path, &self.auth(), body.as_ref())
            .await
    }

    async fn put_override(&self, body: Value) -> Answer {
        self.call(Method::PUT, "/api/config/overrides", Some(body))
            .await
    }

    async fn override_rows(&self) -> Vec<(String, String, String, String)> {
        sqlx::query_as(
            "SELECT scope, section, option, value FROM pepsi.config_override ORDER BY 1, 2, 3",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn events(&self, action: &str) -> Vec<(String, Value)> {
        sqlx::query_as(
            "SELECT actor, detail FROM pepsi.event_log WHERE action = $1 ORDER BY event_id",
        )
        .bind(action)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

fn error_of(a: &Answer) -> &str {
    a.json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no JSON error: {a:?}"))
}

/// (method, path, body) of every new route.
fn routes() -> Vec<(Method, &'static str, Option<Value>)> {
    let set = json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "5"});
    let unset = json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS"});
    vec![
        (Method::GET, "/api/config/overrides", None),
        (
            Method::GET,
            "/api/config/effective?program=pepsi-ingress",
            None,
        ),
        (Method::PUT, "/api/config/overrides", Some(set)),
        (Method::DELETE, "/api/config/overrides", Some(unset)),
        (Method::GET, "/api/settings", None),
        (Method::GET, "/api/settings/names", None),
        (Method::GET, "/api/settings/alice@example.test", None),
        (
            Method::PUT,
            "/api/settings/alice@example.test/alias",
            Some(json!({"value": ["bob@example.net"]})),
        ),
        (
            Method::DELETE,
            "/api/settings/alice@example.test/alias",
            None,
        ),
    ]
}

#[tokio::test]
async fn the_new_routes_need_a_session_and_their_changes_the_csrf_token() {
    let f = fixture(true).await;
    for (method, path, body) in routes() {
        let a = f
            .httpd
            .call(method.clone(), path, &Auth::None, body.as_ref())
            .await;
        assert_eq!(a.status, 401, "{method} {path}: {a:?}");
        assert!(error_of(&a).contains("authentication required"), "{a:?}");
        if method != Method::GET {
            let forged = f
                .httpd
                .call(
                    method.clone(),
                    path,
                    &Auth::CookieOnly(f.session.clone()),
                    body.as_ref(),
                )
                .await;
            assert_eq!(forged.status, 403, "{method} {path}: {forged:?}");
            assert!(error_of(&forged).contains("X-CSRF-Token"), "{forged:?}");
        }
    }
    assert!(f.override_rows().await.is_empty(), "nothing was stored");
    let settings: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.settings")
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
    assert_eq!(settings, 0);
    // With the token the same session may read and change.
    let ok = f.call(Method::GET, "/api/config/overrides", None).await;
    assert_eq!((ok.status, &ok.json), (200, &json!({"overrides": []})));
}

#[tokio::test]
async fn an_override_is_refused_with_the_reason_a_program_or_the_files_give() {
    let f = fixture(true).await;
    let cases = [
        (
            json!({"scope": "planet:mars", "section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "5"}),
            400,
            "scope \"planet:mars\" is not global, domain:DOMAIN or address:ADDRESS",
        ),
        (
            json!({"scope": "domain:localhost", "section": "stage-relay", "option": "RETRY", "value": "5"}),
            400,
            "scope \"localhost\" is not a domain name",
        ),
        (
            json!({"section": "pepsi httpd", "option": "MAX_RECIPIENTS", "value": "5"}),
            400,
            "section \"pepsi httpd\" is not a section name",
        ),
        (
            json!({"section": "pepsi-ingress", "option": "MAX/RECIPIENTS", "value": "5"}),
            400,
            "option \"MAX/RECIPIENTS\" is not an option name",
        ),
        (
            json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "5\nUSER = root"}),
            400,
            "a configuration value is one line",
        ),
        (
            json!({"section": "database", "option": "URL", "value": "postgres://elsewhere/db"}),
            400,
            "[database] is read from the configuration file only",
        ),
        (
            json!({"section": "stage-relay", "option": "PROGRAM", "value": "/bin/sh"}),
            400,
            "PROGRAM names a program, file, key or trust anchor",
        ),
        (
            json!({"scope": "domain:example.org", "section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "5"}),
            400,
            "[pepsi-ingress] is read once for the whole deployment",
        ),
        (
            json!({"section": "pepsi-ingress", "option": "MAX_RECIPENTS", "value": "5"}),
            400,
            "no Pepsi program reads [pepsi-ingress] MAX_RECIPENTS (the options read from [pepsi-ingress]: ",
        ),
        (
            json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "lots"}),
            422,
            "[pepsi-ingress] MAX_RECIPIENTS = \"lots\" would stop pepsi-ingress: ",
        ),
        (
            json!({"section": "stage-relay", "option": "NEXT_STAGE", "value": "nowhere"}),
            422,
            "[stage-relay] NEXT_STAGE = \"nowhere\" would break the stage graph: [stage-relay] \
             NEXT_STAGE = nowhere: no [stage-nowhere] section",
        ),
        (
            json!({"section": "pepsi-httpd", "option": "BULK_LIMIT", "value": "5"}),
            400,
            "[pepsi-httpd] is read from the configuration file only",
        ),
        (
            json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS"}),
            400,
            "missing field `value`",
        ),
        (
            json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "5", "colour": 1}),
            400,
            "unknown field `colour`",
        ),
    ];
    for (body, status, want) in cases {
        let a = f.put_override(body.clone()).await;
        assert_eq!(a.status, status, "{body}: {a:?}");
        assert!(error_of(&a).contains(want), "{body}: {a:?}");
    }
    // The refusal of an unread option names the options that are read.
    let a = f
        .put_override(json!({"section": "pepsi-ingress", "option": "MAX_RECIPENTS", "value": "5"}))
        .await;
    let e = error_of(&a);
    assert!(
        e.contains("MAX_RECIPIENTS") && e.contains("MAX_MESSAGE_SIZE"),
        "{e}"
    );
    assert!(f.override_rows().await.is_empty(), "nothing was stored");
    assert!(f.events("config.set").await.is_empty());
}

#[tokio::test]
async fn an_override_is_stored_listed_shown_as_effective_and_deleted_with_its_events() {
    let f = fixture(true).await;
    let set = f
        .put_override(
            json!({"section": "Pepsi-Ingress", "option": "max_recipients", "value": "50"}),
        )
        .await;
    assert_eq!(set.status, 200, "{set:?}");
    assert_eq!(
        set.json,
        json!({"scope": "global", "section": "pepsi-ingress", "option": "MAX_RECIPIENTS",
               "value": "50", "previous": null})
    );
    let again = f
        .put_override(json!({"scope": "GLOBAL", "section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "60"}))
        .await;
    assert_eq!((again.status, &again.json["previous"]), (200, &json!("50")));
    // An option read only per message needs force; a stage section takes a domain scope.
    let unread = json!({"scope": "domain:Example.ORG", "section": "stage-relay",
                        "option": "COLOUR", "value": "blue"});
    assert_eq!(f.put_override(unread.clone()).await.status, 400);
    let mut forced = unread.clone();
    forced["force"] = json!(true);
    let a = f.put_override(forced).await;
    assert_eq!(
        (a.status, &a.json["scope"]),
        (200, &json!("domain:example.org")),
        "{a:?}"
    );
    assert_eq!(
        f.override_rows().await,
        vec![
            (
                "domain:example.org".into(),
                "stage-relay".into(),
                "COLOUR".into(),
                "blue".into()
            ),
            (
                "global".into(),
                "pepsi-ingress".into(),
                "MAX_RECIPIENTS".into(),
                "60".into()
            ),
        ]
    );

    // The listing, whole and by scope.
    let all = f.call(Method::GET, "/api/config/overrides", None).await;
    assert_eq!(all.status, 200);
    let rows = all.json["overrides"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{all:?}");
    assert_eq!(
        (&rows[1]["scope"], &rows[1]["option"], &rows[1]["value"]),
        (&json!("global"), &json!("MAX_RECIPIENTS"), &json!("60"))
    );
    assert!(rows[1]["updated_at"].is_string() && rows[1]["updated_by"].is_string());
    let global = f
        .call(Method::GET, "/api/config/overrides?scope=global", None)
        .await;
    assert_eq!(global.json["overrides"].as_array().unwrap().len(), 1);
    let domain = f
        .call(
            Method::GET,
            "/api/config/overrides?scope=domain:EXAMPLE.org",
            None,
        )
        .await;
    assert_eq!(domain.json["overrides"][0]["option"], "COLOUR");
    for (path, want) in [
        (
            "/api/config/overrides?scope=planet:mars",
            "\"planet:mars\" is not global",
        ),
        (
            "/api/config/overrides?section=x",
            "unknown parameter \"section\"",
        ),
    ] {
        let a = f.call(Method::GET, path, None).await;
        assert_eq!(a.status, 400, "{path}");
        assert!(error_of(&a).contains(want), "{path}: {a:?}");
    }

    // Each change is a config.set row with the administrator as its actor.
    let events = f.events("config.set").await;
    assert_eq!(events.len(), 3, "{events:?}");
    let (actor, detail) = &events[1];
    assert_eq!(actor, "root");
    assert_eq!(detail["tool"], "pepsi-httpd");
    assert_eq!(
        (&detail["option"], &detail["value"], &detail["previous"]),
        (&json!("MAX_RECIPIENTS"), &json!("60"), &json!("50"))
    );

    // The effective values: as written, with their origin, the secret never shown.
    let eff = f
        .call(
            Method::GET,
            "/api/config/effective?program=pepsi-ingress",
            None,
        )
        .await;
    assert_eq!(eff.status, 200, "{eff:?}");
    assert_eq!(eff.json["scope"], "global");
    // This configuration has no listener: the ingress's own parser says so.
    assert_eq!(eff.json["problems"][0]["program"], "pepsi-ingress");
    let value = |doc: &Value, option: &str| -> Value {
        doc["values"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["option"] == option)
            .cloned()
            .unwrap_or_else(|| panic!("no {option} in {doc}"))
    };
    let bulk = value(&eff.json, "MAX_RECIPIENTS");
    assert_eq!(bulk["value"], "60");
    assert_eq!(bulk["origin"], "database override scope=global");
    let eff = f
        .call(
            Method::GET,
            "/api/config/effective?program=pepsi-httpd",
            None,
        )
        .await;
    assert_eq!(eff.status, 200, "{eff:?}");
    assert_eq!(eff.json["problems"], json!([]));
    let address = value(&eff.json, "ADDRESS");
    assert!(
        address["origin"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}:", f.httpd.config.display())),
        "{address}"
    );
    let unset = value(&eff.json, "SESSION_MAX_AGE");
    assert_eq!(
        (&unset["set"], &unset["value"]),
        (&json!(false), &Value::Null)
    );
    let url = value(&eff.json, "CONFIG_DATABASE_URL");
    assert_eq!(
        (&url["secret"], &url["value"]),
        (&json!(true), &Value::Null)
    );
    assert!(!eff.text.contains(&f.db.url), "the URL is never shown");
    // Without a program: what is set, in the sections asked for; a scope's own rows.
    let set_only = f
        .call(
            Method::GET,
            "/api/config/effective?section=stage-relay&scope=domain:example.org",
            None,
        )
        .await;
    let options: Vec<&str> = set_only.json["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["option"].as_str().unwrap())
        .collect();
    assert_eq!(options, ["COLOUR", "PROGRAM"], "{set_only:?}");
    assert_eq!(
        value(&set_only.json, "COLOUR")["origin"],
        "database override scope=domain:example.org"
    );
    for (path, want) in [
        (
            "/api/config/effective?program=pepsi-nothing",
            "\"pepsi-nothing\" is not a Pepsi program whose configuration is known (known: ",
        ),
        (
            "/api/config/effective?scope=everywhere",
            "\"everywhere\" is not global",
        ),
        (
            "/api/config/effective?programme=x",
            "unknown parameter \"programme\"",
        ),
    ] {
        let a = f.call(Method::GET, path, None).await;
        assert_eq!(a.status, 400, "{path}: {a:?}");
        assert!(error_of(&a).contains(want), "{path}: {a:?}");
    }

    // DELETE: 204 with its config.unset row, then 404.
    let body = json!({"section": "pepsi-ingress", "option": "max_recipients"});
    let gone = f
        .call(Method::DELETE, "/api/config/overrides", Some(body.clone()))
        .await;
    assert_eq!(gone.status, 204, "{gone:?}");
    let twice = f
        .call(Method::DELETE, "/api/config/overrides", Some(body))
        .await;
    assert_eq!(twice.status, 404, "{twice:?}");
    assert!(
        error_of(&twice)
            .contains("there is no override of [pepsi-ingress] MAX_RECIPIENTS for scope global"),
        "{twice:?}"
    );
    let unset = f.events("config.unset").await;
    assert_eq!(unset.len(), 1);
    assert_eq!(
        (&unset[0].0, &unset[0].1["previous"]),
        (&"root".to_owned(), &json!("60"))
    );
    assert_eq!(f.override_rows().await.len(), 1, "the domain's row stays");
}

#[tokio::test]
async fn without_config_database_url_override_writes_answer_409_naming_it() {
    let f = fixture(false).await;
    let set = f
        .put_override(json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS", "value": "5"}))
        .await;
    assert_eq!(set.status, 409, "{set:?}");
    assert!(
        error_of(&set).contains("[pepsi-httpd] CONFIG_DATABASE_URL"),
        "{set:?}"
    );
    let unset = f
        .call(
            Method::DELETE,
            "/api/config/overrides",
            Some(json!({"section": "pepsi-ingress", "option": "MAX_RECIPIENTS"})),
        )
        .await;
    assert_eq!(unset.status, 409, "{unset:?}");
    assert!(f.override_rows().await.is_empty());
    // Reading needs only the httpd pool.
    sqlx::query(
        "INSERT INTO pepsi.config_override (scope, section, option, value) \
         VALUES ('global', 'pepsi-ingress', 'MAX_RECIPIENTS', '7')",
    )
    .execute(&f.db.pool)
    .await
    .unwrap();
    let list = f.call(Method::GET, "/api/config/overrides", None).await;
    assert_eq!(
        (list.status, &list.json["overrides"][0]["value"]),
        (200, &json!("7"))
    );
}

#[tokio::test]
async fn settings_are_set_listed_shown_with_their_row_and_deleted_like_pepsi_settings() {
    let f = fixture(false).await;
    let put = |path: &'static str, value: Value| {
        let f = &f;
        async move {
            f.call(Method::PUT, path, Some(json!({ "value": value })))
                .await
        }
    };
    let a = put(
        "/api/settings/Alice@Example.TEST/alias",
        json!(["Bob@example.net"]),
    )
    .await;
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(
        a.json,
        json!({"address": "alice@example.test", "name": "alias", "value": ["bob@example.net"]})
    );
    let a = put(
        "/api/settings/alice@example.test/alias",
        json!("bob@example.net, carol@example.net"),
    )
    .await;
    assert_eq!(
        (a.status, &a.json["value"]),
        (200, &json!(["bob@example.net", "carol@example.net"]))
    );
    let a = put(
        "/api/settings/@example.test/catchall",
        json!(["postmaster@example.test"]),
    )
    .await;
    assert_eq!(a.status, 201, "{a:?}");
    let a = put(
        "/api/settings/alice@example.test/send_as",
        json!(["@example.org", "sales@example.test"]),
    )
    .await;
    assert_eq!(a.status, 201, "{a:?}");
    let a = put("/api/settings/@example.org/local_domain", json!(true)).await;
    assert_eq!((a.status, &a.json["value"]), (201, &json!(true)), "{a:?}");

    for (path, value, want) in [
        (
            "/api/settings/alice@example.test/colour",
            json!("x"),
            "setting \"colour\" is not one Pepsi reads (known: ",
        ),
        (
            "/api/settings/@example.test/alias",
            json!(["a@example.net"]),
            "setting alias belongs to an address, not to a domain",
        ),
        (
            "/api/settings/alice@example.test/local_domain",
            json!(true),
            "belongs to a domain, written @domain",
        ),
        (
            "/api/settings/@example.net/local_domain",
            json!(false),
            "takes the value yes",
        ),
        (
            "/api/settings/alice@example.test/alias",
            json!(7),
            "value: expected true, a list of addresses",
        ),
        (
            "/api/settings/alice@example.test/alias",
            json!(["not an address"]),
            "alias value 1",
        ),
        (
            "/api/settings/alice/alias",
            json!(["a@example.net"]),
            "key \"alice\" is not an address",
        ),
        // An automatic reply's object reaches the same checks as pepsi-settings's.
        (
            "/api/settings/alice@example.test/vacation",
            json!({"text": "Away.", "days": 0}),
            "vacation setting: days must be 1 to 365, not 0",
        ),
        (
            "/api/settings/alice@example.test/vacation",
            json!({"text": "Away.", "until": "Monday"}),
            "unknown field `until`",
        ),
        (
            "/api/settings/@example.test/vacation",
            json!({"text": "Away."}),
            "belongs to an address, not to a domain",
        ),
    ] {
        let a = put(path, value.clone()).await;
        assert_eq!(a.status, 400, "{path} {value}: {a:?}");
        assert!(error_of(&a).contains(want), "{path} {value}: {a:?}");
    }

    // Listing: every known setting, or those named.
    let all = f.call(Method::GET, "/api/settings", None).await;
    assert_eq!(all.status, 200);
    let keys: Vec<(&str, &str)> = all.json["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["address"].as_str().unwrap(), r["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        keys,
        [
            ("@example.org", "local_domain"),
            ("@example.test", "catchall"),
            ("alice@example.test", "alias"),
            ("alice@example.test", "send_as"),
        ]
    );
    let named = f
        .call(
            Method::GET,
            "/api/settings?name=alias,catchall&limit=1",
            None,
        )
        .await;
    assert_eq!(named.json["limit"], 1);
    assert_eq!(named.json["settings"][0]["name"], "catchall");
    assert_eq!(named.json["settings"].as_array().unwrap().len(), 1);
    let bad = f.call(Method::GET, "/api/settings?name=colour", None).await;
    assert_eq!(bad.status, 400);
    assert!(
        error_of(&bad).contains("\"colour\" is not one Pepsi reads"),
        "{bad:?}"
    );
    let names = f.call(Method::GET, "/api/settings/names", None).await;
    let alias = names.json["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "alias")
        .cloned()
        .unwrap();
    assert_eq!(
        (&alias["key"], &alias["value"]),
        (&json!("address"), &json!("addresses"))
    );

    // What applies to an address, each value with the row it comes from.
    let made = f
        .call(
            Method::POST,
            "/api/accounts",
            Some(json!({"address": "alice@example.test"})),
        )
        .await;
    assert_eq!(made.status, 201);
    let shown = f
        .call(Method::GET, "/api/settings/Alice@example.test", None)
        .await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert_eq!(shown.json["address"], "alice@example.test");
    assert_eq!(shown.json["account"]["address"], "alice@example.test");
    let from: Vec<(&str, &str)> = shown.json["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["from"].as_str().unwrap()))
        .collect();
    assert_eq!(
        from,
        [
            ("alias", "alice@example.test"),
            ("catchall", "@example.test"),
            ("send_as", "alice@example.test"),
        ]
    );
    let other = f
        .call(Method::GET, "/api/settings/bob@example.test", None)
        .await;
    assert_eq!(other.json["account"], Value::Null);
    assert_eq!(
        other.json["settings"],
        json!([{"name": "catchall", "value": ["postmaster@example.test"], "from": "@example.test"}])
    );
    let domain = f
        .call(Method::GET, "/api/settings/@example.org", None)
        .await;
    assert_eq!(domain.json["settings"][0]["from"], "@example.org");
    let bad = f.call(Method::GET, "/api/settings/nobody", None).await;
    assert_eq!(bad.status, 400);
    assert!(
        error_of(&bad).contains("address \"nobody\" is not an address"),
        "{bad:?}"
    );

    // Each change is a settings.set row by root; DELETE twice is 204 then 404.
    let events = f.events("settings.set").await;
    assert_eq!(events.len(), 5);
    assert_eq!(events[1].0, "root");
    assert_eq!(events[1].1["previous"], json!(["bob@example.net"]));
    let path = "/api/settings/ALICE@example.test/alias";
    assert_eq!(f.call(Method::DELETE, path, None).await.status, 204);
    let twice = f.call(Method::DELETE, path, None).await;
    assert_eq!(twice.status, 404);
    assert!(
        error_of(&twice).contains("alice@example.test has no alias setting"),
        "{twice:?}"
    );
    let wrong = f
        .call(Method::DELETE, "/api/settings/@example.test/send_as", None)
        .await;
    assert_eq!(wrong.status, 400, "a key of the wrong kind: {wrong:?}");
    let deleted = f.events("settings.delete").await;
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].0, "root");
}
