use std::collections::HashMap;
use std::path::Path;

use serde_json::json;

use pepsi_testkit::keys::{self, openssl_key};

use super::*;
use crate::seal::{Cv, Field, fields};

#[test]
fn header_blocks_split_into_fields_or_name_the_bad_line() {
    let block = b"From: a@b.test\r\nSubject: one\r\n\ttwo\r\nX-Empty:\r\nTo : c@d.test\r\n";
    let f = fields(block).unwrap();
    let got: Vec<(&[u8], &[u8])> = f.iter().map(|f| (f.name, f.value)).collect();
    assert_eq!(
        got,
        [
            (&b"From"[..], &b" a@b.test\r\n"[..]),
            (b"Subject", b" one\r\n\ttwo\r\n"),
            (b"X-Empty", b"\r\n"),
            (b"To", b" c@d.test\r\n"),
        ]
    );
    assert_eq!(fields(b"").unwrap(), []);
    for (bad, want) in [
        (&b" folded: first\r\n"[..], "starts with a continuation"),
        (
            b"From: a\r\nnot a field\r\n",
            "header line 2 is not a field",
        ),
        (b"From: a\r\n\r\nTo: b\r\n", "header line 2 is not a field"),
        (b": no name\r\n", "no valid field name"),
        (b"Bad Name: x\r\n", "no valid field name"),
    ] {
        let err = fields(bad).unwrap_err();
        assert!(err.contains(want), "{bad:?}: {err}");
    }
}

/// An ARC set of instance `i` as another hop would write it (signatures not checked here).
fn set(i: u32, cv: &str) -> String {
    format!(
        "ARC-Seal: i={i}; a=rsa-sha256; cv={cv}; d=fwd.test; s=s;\r\n\tb=AAAA\r\n\
         ARC-Message-Signature: i={i}; a=rsa-sha256; c=relaxed/relaxed; d=fwd.test; s=s;\r\n\
         \th=from; bh=AAAA; b=AAAA\r\n\
         ARC-Authentication-Results: i={i}; fwd.test; spf=pass smtp.mailfrom=a.test\r\n"
    )
}

#[test]
fn plan_table() {
    use seal::{Plan::Seal, Plan::Skip as S, SealMode::*, Skip::*, plan};
    let one = set(1, "none");
    let two = format!("{}{}", set(2, "pass"), set(1, "none"));
    let ended = format!("{}{}", set(2, "fail"), set(1, "none"));
    let full: String = (1..=50)
        .rev()
        .map(|i| set(i, if i == 1 { "none" } else { "pass" }))
        .collect();
    let gap = format!("{}{}", set(3, "pass"), set(1, "none"));
    let missing_seal = one.replacen("ARC-Seal: i=1", "X-Was-Seal: i=1", 1);
    let base = "From: a@b.test\r\n";
    let cases: &[(&str, &str, Option<&str>, seal::SealMode, seal::Plan)] = &[
        (
            "no chain, verified",
            "",
            Some("none"),
            Forwarded,
            Seal {
                instance: 1,
                cv: Cv::None,
            },
        ),
        (
            "no chain, not verified",
            "",
            None,
            Forwarded,
            S(NotForwarded),
        ),
        (
            "no chain, SEAL = all",
            "",
            None,
            All,
            Seal {
                instance: 1,
                cv: Cv::None,
            },
        ),
        (
            "chain passed",
            &one,
            Some("pass"),
            Forwarded,
            Seal {
                instance: 2,
                cv: Cv::Pass,
            },
        ),
        (
            "two sets passed",
            &two,
            Some("pass"),
            All,
            Seal {
                instance: 3,
                cv: Cv::Pass,
            },
        ),
        (
            "chain failed",
            &one,
            Some("fail"),
            Forwarded,
            Seal {
                instance: 2,
                cv: Cv::Fail,
            },
        ),
        (
            "chain temperror",
            &one,
            Some("temperror"),
            Forwarded,
            Seal {
                instance: 2,
                cv: Cv::Fail,
            },
        ),
        (
            "chain, verdict missing",
            &one,
            Some("none"),
            Forwarded,
            Seal {
                instance: 2,
                cv: Cv::Fail,
            },
        ),
        (
            "pass, but a set lost its seal",
            &missing_seal,
            Some("pass"),
            All,
            Seal {
                instance: 2,
                cv: Cv::Fail,
            },
        ),
        (
            "pass, but an instance missing",
            &gap,
            Some("pass"),
            All,
            Seal {
                instance: 4,
                cv: Cv::Fail,
            },
        ),
        (
            "last seal cv=fail",
            &ended,
            Some("fail"),
            Forwarded,
            S(ChainEnded),
        ),
        (
            "last seal cv=fail, verdict pass",
            &ended,
            Some("pass"),
            All,
            S(ChainEnded),
        ),
        ("50 sets", &full, Some("pass"), Forwarded, S(ChainFull)),
        ("chain without a verdict", &one, None, All, S(NoVerdict)),
        (
            "chain, not verified",
            &one,
            None,
            Forwarded,
            S(NotForwarded),
        ),
    ];
    for (what, arc, verdict, mode, want) in cases {
        let block = format!("{arc}{base}");
        let f = fields(block.as_bytes()).unwrap();
        let chain = Chain::read(&f).unwrap();
        assert_eq!(&plan(&chain, &f, *verdict, *mode), want, "{what}");
    }
    for bad in [
        "ARC-Seal: a=rsa-sha256; cv=none\r\n",
        "ARC-Seal: i=x; cv=none\r\n",
        "ARC-Authentication-Results: fwd.test; i=1\r\n",
        "ARC-Message-Signature: i=0; a=x\r\n",
    ] {
        let f = fields(bad.as_bytes()).unwrap();
        let err = Chain::read(&f).unwrap_err();
        assert!(err.contains("without a valid i= tag"), "{bad}: {err}");
    }
}

fn origin(state: &Map<String, Value>) -> pepsi_contract::state::Origin {
    pepsi_contract::state::Origin::from_state(state)
        .unwrap()
        .unwrap_or_default()
}

#[test]
fn results_from_the_ingress_state() {
    let state = json!({
        "origin": {"client_addr": "192.0.2.7", "helo": "mail.example.org",
                   "iprev": {"result": "pass", "name": "mail.example.org"},
                   "authserv_id": "mx.example.test", "auth_user": null},
        "auth": {
            "spf": {"result": "pass", "domain": "example.org",
                    "helo": {"result": "none", "domain": "mail.example.org"}},
            "dkim": [{"result": "pass", "domain": "example.org", "selector": "sel"},
                     {"result": "fail", "reason": "signature \"bad\"", "domain": "x.test",
                      "selector": "s1"}],
            "dmarc": {"result": "pass", "domain": "example.org", "policy": "reject"},
            "arc": {"result": "none"}
        }
    });
    let state = state.as_object().unwrap();
    assert_eq!(
        aar::results(&origin(state), state),
        [
            "iprev=pass policy.iprev=192.0.2.7",
            "spf=none smtp.helo=mail.example.org",
            "spf=pass smtp.mailfrom=example.org",
            "dkim=pass header.d=example.org header.s=sel",
            "dkim=fail reason=\"signature \\\"bad\\\"\" header.d=x.test header.s=s1",
            "dmarc=pass header.from=example.org policy.dmarc=reject",
            "arc=none smtp.remote-ip=192.0.2.7",
        ]
    );
    assert_eq!(
        aar::authserv_id(&origin(state), "fallback.test"),
        "mx.example.test"
    );
    assert_eq!(
        aar::payload("mx.example.test", &aar::results(&origin(state), state)[..2]),
        "mx.example.test;\r\n\tiprev=pass policy.iprev=192.0.2.7;\r\n\tspf=none smtp.helo=mail.example.org"
    );

    // Locally submitted: no auth, an authenticated user; an IPv6 client is quoted.
    let local = json!({"origin": {"client_addr": "2001:db8::1", "iprev": null,
                                  "auth_user": "alice@example.test"}});
    let local = local.as_object().unwrap();
    assert_eq!(
        aar::results(&origin(local), local),
        ["auth=pass smtp.auth=alice@example.test"]
    );
    assert_eq!(
        aar::authserv_id(&origin(local), "fallback.test"),
        "fallback.test"
    );
    assert_eq!(aar::payload("h.test", &[]), "h.test; none");

    // Nothing unchecked reaches the field: a bad result name is dropped, a bad
    // authserv-id replaced, odd values quoted.
    let odd = json!({
        "origin": {"authserv_id": "evil; dkim=pass", "client_addr": "2001:db8::1"},
        "auth": {"spf": {"result": "pass\r\nX-Injected: 1", "domain": "a.test"},
                 "dmarc": {"result": "fail", "domain": "a b;c.test", "policy": "none"},
                 "arc": {"result": "pass"}}
    });
    let odd = odd.as_object().unwrap();
    assert_eq!(
        aar::results(&origin(odd), odd),
        [
            "dmarc=fail header.from=\"a b;c.test\" policy.dmarc=none",
            "arc=pass smtp.remote-ip=\"2001:db8::1\"",
        ]
    );
    assert_eq!(
        aar::authserv_id(&origin(odd), "fallback.test"),
        "fallback.test"
    );
    assert_eq!(verdict(odd).as_deref(), Some("pass"));
    assert_eq!(verdict(local), None);
    let no_arc = json!({"auth": {"spf": {"result": "pass"}}});
    assert_eq!(
        verdict(no_arc.as_object().unwrap()).as_deref(),
        Some("none")
    );
}

/// The sections a worker builds at start.
fn stage(dir: &Path, options: &str) -> anyhow::Result<HashMap<String, ArcStage>> {
    let cfg = Config::from_str_named(
        &format!(
            "[pepsi]\nHOSTNAME = host.example.test\n\
             [stage-arc]\nPROGRAM = pepsi-stage-arc\n{options}"
        ),
        dir.join("test.conf").to_str().unwrap(),
    )
    .unwrap();
    pepsi_contract::stage::sections(&ArcSealer, &cfg)
}

#[test]
fn configuration_errors_name_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let ed = openssl_key(dir.path(), "ed.pem", keys::ED25519);
    let ec = openssl_key(dir.path(), "ec.pem", keys::EC_P256);
    let missing = dir.path().join("missing.pem");
    let key = |p: &Path| {
        format!(
            "DOMAIN = example.test\nSELECTOR = arc1\nKEY_FILE = {}\n",
            p.display()
        )
    };
    let ok = key(&ed);
    let arc = stage(dir.path(), &ok).unwrap();
    let s = &arc["arc"];
    assert_eq!(s.authserv_id, "host.example.test");
    assert_eq!(s.mode, SealMode::Forwarded);
    assert_eq!(&s.sealer.headers[..3], ["From", "From", "Reply-To"]);
    assert_eq!(s.sealer.headers.last().unwrap(), "DKIM-Signature");
    let s = stage(
        dir.path(),
        &format!("{ok}HEADERS = Subject, from\nAUTHSERV_ID = auth.example.test\nSEAL = all\n"),
    )
    .unwrap();
    let s = &s["arc"];
    assert_eq!(s.sealer.headers, ["From", "From", "Subject"]);
    assert_eq!(
        (s.authserv_id.as_str(), s.mode),
        ("auth.example.test", SealMode::All)
    );

    for (options, want) in [
        (String::new(), "[stage-arc] DOMAIN is required".to_owned()),
        (
            "DOMAIN = localhost\nSELECTOR = a\n".into(),
            "[stage-arc] DOMAIN: \"localhost\"".into(),
        ),
        (
            "DOMAIN = example.test\n".into(),
            "[stage-arc] SELECTOR is required".into(),
        ),
        (
            "DOMAIN = example.test\nSELECTOR = a b\n".into(),
            "[stage-arc] SELECTOR".into(),
        ),
        (
            "DOMAIN = example.test\nSELECTOR = a\n".into(),
            "[stage-arc] KEY_FILE is required".into(),
        ),
        (
            key(&missing),
            format!(
                "[stage-arc] KEY_FILE: key file {}: cannot read",
                missing.display()
            ),
        ),
        (
            key(&ec),
            format!(
                "[stage-arc] KEY_FILE: key file {}: not a usable private key",
                ec.display()
            ),
        ),
        (
            format!("{ok}HEADERS = From, ARC-Seal\n"),
            "[stage-arc] HEADERS: \"ARC-Seal\" cannot be listed".into(),
        ),
        (
            format!("{ok}HEADERS = From, Bad:Name\n"),
            "[stage-arc] HEADERS".into(),
        ),
        (
            format!("{ok}AUTHSERV_ID = a b\n"),
            "[stage-arc] AUTHSERV_ID".into(),
        ),
        (format!("{ok}SEAL = sometimes\n"), "SEAL".into()),
    ] {
        let err = format!("{:#}", stage(dir.path(), &options).err().unwrap());
        assert!(err.contains(&want), "{options:?}: {err}");
    }
}

/// The tags of a field value, unfolded.
fn tags(value: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(value)
        .split_ascii_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .split(';')
        .filter_map(|t| t.split_once('='))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn a_sealed_set_has_the_right_instances_and_folds_under_78_columns() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = openssl_key(dir.path(), "rsa.pem", keys::RSA);
    let arc = stage(
        dir.path(),
        &format!(
            "DOMAIN = fwd.example.test\nSELECTOR = arc-2026\nKEY_FILE = {}\n",
            rsa.display()
        ),
    )
    .unwrap();
    let sealer = &arc["arc"].sealer;
    let headers = format!("{}From: a@b.test\r\nSubject: s\r\n", set(1, "none"));
    let f = fields(headers.as_bytes()).unwrap();
    let chain = Chain::read(&f).unwrap();
    for cv in [Cv::Pass, Cv::Fail] {
        let out = sealer
            .seal(
                &f,
                &chain,
                b"body\r\n",
                2,
                cv,
                "mx.example.test; none",
                1_700_000_000,
            )
            .unwrap();
        let new = fields(out.as_bytes()).unwrap();
        let names: Vec<&[u8]> = new.iter().map(|f: &Field<'_>| f.name).collect();
        assert_eq!(
            names,
            [
                &b"ARC-Seal"[..],
                b"ARC-Message-Signature",
                b"ARC-Authentication-Results"
            ]
        );
        for line in out.split("\r\n") {
            assert!(line.len() <= 78, "{line:?}");
        }
        let seal = tags(new[0].value);
        let ams = tags(new[1].value);
        assert_eq!(seal[0], ("i".into(), "2".into()));
        assert_eq!(ams[0], ("i".into(), "2".into()));
        assert!(
            seal.contains(&("cv".into(), cv.as_str().into())),
            "{seal:?}"
        );
        assert!(seal.contains(&("d".into(), "fwd.example.test".into())));
        assert!(ams.contains(&("a".into(), "rsa-sha256".into())));
        assert!(ams.contains(&("c".into(), "relaxed/relaxed".into())));
        let h = &ams.iter().find(|(n, _)| n == "h").unwrap().1;
        assert!(h.replace(' ', "").starts_with("From:From:Reply-To:"), "{h}");
        assert_eq!(seal.last().unwrap().0, "b");
        assert_eq!(ams.last().unwrap().0, "b");
        assert_eq!(
            String::from_utf8_lossy(new[2].value),
            " i=2; mx.example.test; none\r\n"
        );
        // The new set reads back as instance 2 of a complete chain.
        let whole = format!("{out}{headers}");
        let wf = fields(whole.as_bytes()).unwrap();
        let wc = Chain::read(&wf).unwrap();
        assert_eq!(wc.last_instance(), 2);
        assert!(wc.is_complete());
    }
}
