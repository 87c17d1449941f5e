use pepsi_testkit::keys::{self, openssl_key};

use super::*;

/// The sections a worker builds at start.
fn stages(cfg: &Config) -> anyhow::Result<HashMap<String, SignStage>> {
    pepsi_contract::stage::sections(&DkimSign::default(), cfg)
}

/// The key files themselves are pepsi_outbound::keys's test; here, through the
/// configuration: the error names the section, the option and the file.
#[test]
fn key_file_errors_name_the_section_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let cfg = Config::from_str_named(
        &format!(
            "[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{}\n",
            missing.display()
        ),
        "test.conf",
    )
    .unwrap();
    let err = format!("{:#}", stages(&cfg).err().unwrap());
    assert!(err.contains("[stage-dkim] KEYS"), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

#[test]
fn headers_and_domains() {
    let dir = tempfile::tempdir().unwrap();
    let ed = openssl_key(dir.path(), "ed.pem", keys::ED25519);
    let cfg = Config::from_str_named(
        &format!(
            "[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{0}\n\
             HEADERS = to, From, Subject, to\nPARENT_DOMAINS = yes\n\
             [stage-plain]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{0}\n",
            ed.display()
        ),
        "test.conf",
    )
    .unwrap();
    let sign = stages(&cfg).unwrap();
    let dkim = &sign["dkim"];
    assert_eq!(dkim.headers, ["From", "From", "to", "Subject"]);
    assert_eq!(dkim.keys_for("Example.test").unwrap().0, "example.test");
    assert_eq!(dkim.keys_for("a.b.example.test").unwrap().0, "example.test");
    assert!(dkim.keys_for("other.test").is_none());
    let plain = &sign["plain"];
    assert_eq!(&plain.headers[..3], ["From", "From", "Reply-To"]);
    assert!(plain.keys_for("a.example.test").is_none());

    assert_eq!(
        from_domain(b"To: x@y.test\r\nFrom: \"A, B\" <A@Mail.Example.TEST>\r\n").as_deref(),
        Some("mail.example.test")
    );
    assert_eq!(from_domain(b"To: x@y.test\r\n"), None);
}

#[test]
fn section_errors_name_the_option() {
    for (options, want) in [
        ("", "[stage-dkim] KEYS is required (or DATABASE_KEYS = yes"),
        ("DATABASE_KEYS = perhaps\n", "DATABASE_KEYS"),
        ("KEYS = example.test:sel1\n", "KEYS"),
        (
            "KEYS = example.test:s1:/k.pem\nHEADERS = From, Bad:Name\n",
            "HEADERS",
        ),
        (
            "KEYS = example.test:s1:/k.pem\nPARENT_DOMAINS = maybe\n",
            "PARENT_DOMAINS",
        ),
    ] {
        let cfg = Config::from_str_named(
            &format!("[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\n{options}"),
            "test.conf",
        )
        .unwrap();
        let err = format!("{:#}", stages(&cfg).err().unwrap());
        assert!(err.contains(want), "{options:?}: {err}");
    }
    // A section running another program is not read.
    let cfg = Config::from_str_named(
        "[stage-other]\nPROGRAM = pepsi-stage-discard\nKEYS = nonsense\n",
        "test.conf",
    )
    .unwrap();
    assert!(stages(&cfg).unwrap().is_empty());
}

/// DATABASE_KEYS: which rows sign, which are skipped and why, and how they merge with KEYS.
#[test]
fn stored_keys_merge_with_the_key_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = openssl_key(dir.path(), "file.pem", keys::ED25519);
    let ed = std::fs::read_to_string(openssl_key(dir.path(), "ed.pem", keys::ED25519)).unwrap();
    let ec = std::fs::read_to_string(openssl_key(dir.path(), "ec.pem", keys::EC_P256)).unwrap();
    let cfg = Config::from_str_named(
        &format!(
            "[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:file1:{}\n\
             DATABASE_KEYS = yes\nPARENT_DOMAINS = yes\n\
             [stage-db]\nPROGRAM = pepsi-stage-dkim-sign\nDATABASE_KEYS = yes\n",
            file.display()
        ),
        "test.conf",
    )
    .unwrap();
    let mut sign = stages(&cfg).unwrap();
    assert!(sign["db"].domains.is_empty(), "KEYS is optional");
    let dkim = sign.remove("dkim").unwrap();
    assert!(dkim.database_keys);

    let row = |domain: &str, selector: &str, pem: &str| StoredKey {
        domain: domain.into(),
        selector: selector.into(),
        private_key: pem.into(),
    };
    let (usable, mut skipped) = usable_rows(vec![
        row("example.test", "db1", &ed),
        row("example.test", "file1", &ed),
        row("example.test", "ec1", &ec),
        row(
            "example.test",
            "junk1",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ),
        row("Upper.test", "s1", &ed),
        row("other.test", "s 1", &ed),
        row("other.test", "s1", &ed),
    ]);
    let (keys, shadowed) = dkim.stored_keys(&usable);
    skipped.extend(shadowed);
    let selectors = |d: &str| -> Vec<&str> {
        keys.get(d)
            .map(|k| k.iter().map(|k| k.selector.as_str()).collect())
            .unwrap_or_default()
    };
    assert_eq!(selectors("example.test"), ["db1"]);
    assert_eq!(selectors("other.test"), ["s1"]);
    assert_eq!(keys.len(), 2);
    let skipped: Vec<(String, String)> = skipped
        .into_iter()
        .map(|s| match s {
            Skipped::Shadowed { domain, selector } => {
                (format!("{selector}.{domain}"), "shadowed".into())
            }
            Skipped::Unusable {
                domain,
                selector,
                why,
            } => (format!("{selector}.{domain}"), why),
        })
        .collect();
    let expect = [
        ("ec1.example.test", "neither an RSA nor an Ed25519 key"),
        ("junk1.example.test", "not a usable private key"),
        ("s1.Upper.test", "not a lower-case domain name"),
        ("s 1.other.test", "not a selector"),
        ("file1.example.test", "shadowed"),
    ];
    assert_eq!(skipped.len(), expect.len(), "{skipped:?}");
    for ((name, why), (want_name, want_why)) in skipped.iter().zip(expect) {
        assert_eq!(name, want_name);
        assert!(why.contains(want_why), "{name}: {why}");
    }

    // Before the rows are read only the file signs; afterwards both, file first, and a
    // subdomain takes its parent's keys from either source.
    let names = |found: Option<(&str, Vec<&DomainKey>)>| {
        found.map(|(d, keys)| {
            let s: Vec<String> = keys.iter().map(|k| format!("{}.{d}", k.selector)).collect();
            s.join(",")
        })
    };
    assert_eq!(
        names(dkim.keys_for("example.test")).as_deref(),
        Some("file1.example.test")
    );
    assert_eq!(names(dkim.keys_for("other.test")), None);
    dkim.stored.set(keys).ok().unwrap();
    for (from, want) in [
        ("example.test", Some("file1.example.test,db1.example.test")),
        (
            "a.b.Example.Test",
            Some("file1.example.test,db1.example.test"),
        ),
        ("other.test", Some("s1.other.test")),
        ("news.other.test", Some("s1.other.test")),
        ("nokey.test", None),
    ] {
        assert_eq!(names(dkim.keys_for(from)).as_deref(), want, "{from}");
    }
}

#[test]
fn signing_policy_table() {
    use serde_json::json;
    let submitted =
        json!({"origin": {"client_addr": "192.0.2.1", "auth_user": "alice@example.test"}});
    let received = json!({"origin": {"client_addr": "192.0.2.1", "helo": "mx.example.org"}});
    let generated = json!({});
    let broken = json!({"origin": "not an object"});
    let cases = [
        (SignPolicy::Authenticated, &submitted, Ok(true)),
        (SignPolicy::Authenticated, &received, Ok(false)),
        (SignPolicy::Authenticated, &generated, Ok(true)),
        (SignPolicy::All, &submitted, Ok(true)),
        (SignPolicy::All, &received, Ok(true)),
        (SignPolicy::All, &broken, Ok(true)),
    ];
    for (policy, state, want) in cases {
        let got = policy.signs(state.as_object().unwrap());
        assert_eq!(got, want, "{policy:?} {state}");
    }
    assert!(
        SignPolicy::Authenticated
            .signs(broken.as_object().unwrap())
            .is_err()
    );
    assert_eq!(SignPolicy::parse(" All "), Ok(SignPolicy::All));
    let err = SignPolicy::parse("yes").unwrap_err();
    assert!(err.contains("authenticated"), "{err}");
}
