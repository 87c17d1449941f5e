//! `pepsi-setup check-dns` against a real authoritative DNS server: an nsd on a free
//! loopback port serving `example.test` and the reverse zone of its MX's address
//! (192.0.2.25, TEST-NET-1), its records those `pepsi-setup dns` printed for a key stored
//! in a test database's `pepsi.signing_key` — all but one, deliberately wrong or missing.
//! The check must name exactly that record, give the line to publish, and once that line
//! is published as given, find everything ok.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::free_udp_tcp_port;

const SETUP: &str = env!("CARGO_BIN_EXE_pepsi-setup");

/// Runs pepsi-setup off the runtime's threads: (exit status, stdout, stderr).
async fn setup(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(SETUP).args(&args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// One zone-file line as the operator would publish it (and as check-dns prints it): a
/// TXT value in quoted strings of at most 255 octets, MX and PTR targets with their dot.
pub(crate) fn line(name: &str, kind: &str, value: &str) -> String {
    let value = match kind {
        "TXT" => value
            .as_bytes()
            .chunks(255)
            .map(|c| format!("\"{}\"", std::str::from_utf8(c).unwrap()))
            .collect::<Vec<_>>()
            .join(" "),
        _ => format!("{value}."),
    };
    format!("{name}. 3600 IN {kind} {value}")
}

/// An nsd serving `zones` (name, zone-file text) on a free loopback port, stopped when
/// dropped.
pub(crate) struct Nsd {
    child: Child,
    pub(crate) port: u16,
}

impl Nsd {
    pub(crate) fn start(dir: &Path, zones: &[(&str, String)]) -> Nsd {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_udp_tcp_port();
        let d = dir.display();
        let mut conf = format!(
            "server:\n  ip-address: 127.0.0.1@{port}\n  port: {port}\n  username: \"\"\n\
             chroot: \"\"\n  zonesdir: \"{d}\"\n  database: \"\"\n  pidfile: \"{d}/nsd.pid\"\n\
             logfile: \"{d}/nsd.log\"\n  xfrdfile: \"{d}/xfrd.state\"\n  zonelistfile: \"{d}/zone.list\"\n\
             xfrdir: \"{d}\"\n  do-ip6: no\nremote-control:\n  control-enable: no\n"
        );
        for (name, text) in zones {
            let soa = format!(
                "$ORIGIN {name}.\n$TTL 600\n@ IN SOA ns.example.test. hostmaster.example.test. 1 3600 600 86400 600\n\
                 @ IN NS ns.example.test.\n"
            );
            std::fs::write(dir.join(format!("{name}.zone")), soa + text).unwrap();
            conf.push_str(&format!("zone:\n  name: {name}\n  zonefile: {name}.zone\n"));
        }
        std::fs::write(dir.join("nsd.conf"), conf).unwrap();
        let child = Command::new("nsd")
            .args(["-d", "-c"])
            .arg(dir.join("nsd.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nsd is installed (nsd in scripts/apt-packages.txt)");
        let mut nsd = Nsd { child, port };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return nsd;
            }
            if let Ok(Some(status)) = nsd.child.try_wait() {
                let log = std::fs::read_to_string(dir.join("nsd.log")).unwrap_or_default();
                panic!("nsd exited ({status}) before listening on {port}: {log}");
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("nsd did not listen on {port}");
    }
}

impl Drop for Nsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The check's row of `kind`.
fn row<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} row: {report:#}"))
}

/// Every row's (kind, status), in order.
fn statuses(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, s)| (k.to_string(), s.to_string()))
        .collect()
}

#[tokio::test]
async fn check_dns_names_the_one_wrong_or_missing_record_and_the_line_that_mends_it() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("pepsi.conf");
    std::fs::write(&conf, "[pepsi]\nDNS_TIMEOUT = 2s\n").unwrap();

    // The key of selector s1 into pepsi.signing_key, and the records to publish for it.
    let (code, out, err) = setup(args(&[
        "dns",
        "example.test",
        "--mx",
        "mx.example.test",
        "--selector",
        "s1",
        "--database-url",
        &db.url,
        "--json",
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    let printed: Value = serde_json::from_str(&out).unwrap();
    let records: Vec<(String, String, String)> = printed["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["type"].as_str().unwrap().to_owned(),
                r["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(records.len(), 6, "{out}");
    let dkim_name = "s1._domainkey.example.test";
    let good_dkim = records.iter().find(|r| r.0 == dkim_name).unwrap();
    let good_dkim_line = line(dkim_name, "TXT", &good_dkim.2);
    // Another key's record, as a stale or mistyped zone would hold it.
    let other_pem = dir.path().join("other.pem");
    let (code, out, err) = setup(args(&[
        "dns",
        "example.test",
        "--mx",
        "mx.example.test",
        "--selector",
        "s1",
        "--key-file",
        other_pem.to_str().unwrap(),
        "--json",
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    let other: Value = serde_json::from_str(&out).unwrap();
    let other_dkim = other["records"][2]["value"].as_str().unwrap().to_owned();
    assert!(other_dkim.starts_with("v=DKIM1; k=rsa; p="), "{other_dkim}");
    assert_ne!(other_dkim, good_dkim.2);

    // The zone as printed, with `dkim` at s1 and without the records `leave_out` names.
    let zone = |dkim: &str, leave_out: &str| {
        let mut text = String::from("ns IN A 127.0.0.1\nmx IN A 192.0.2.25\n");
        for (name, kind, value) in &records {
            if name == leave_out {
                continue;
            }
            if name == dkim_name {
                text.push_str(dkim);
            } else if kind == "MX" {
                let (pref, host) = value.split_once(' ').unwrap();
                text.push_str(&line(name, "MX", &format!("{pref} {host}")));
            } else {
                text.push_str(&line(name, kind, value));
            }
            text.push('\n');
        }
        text
    };
    let reverse = "25 IN PTR mx.example.test.\n".to_owned();
    let check = |port: u16, json: bool| {
        let mut a = args(&[
            "check-dns",
            "example.test",
            "--mx",
            "mx.example.test",
            "--selector",
            "s1",
            "--dns-server",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            &db.url,
            "-c",
            conf.to_str().unwrap(),
        ]);
        if json {
            a.push("--json".into());
        }
        setup(a)
    };

    // 1. Every record right but the DKIM key: another key's p=.
    let nsd = Nsd::start(
        &dir.path().join("nsd1"),
        &[
            (
                "example.test",
                zone(&line(dkim_name, "TXT", &other_dkim), ""),
            ),
            ("2.0.192.in-addr.arpa", reverse.clone()),
        ],
    );
    let (code, out, err) = check(nsd.port, true).await;
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        statuses(&report),
        expect(&[
            ("mx", "ok"),
            ("spf", "ok"),
            ("dkim", "wrong"),
            ("dmarc", "ok"),
            ("mta-sts", "ok"),
            ("tls-rpt", "ok"),
            ("address", "ok"),
            ("ptr", "ok"),
        ]),
        "{report:#}"
    );
    let dkim = row(&report, "dkim");
    assert_eq!(dkim["name"], dkim_name);
    assert_eq!(dkim["found"], serde_json::json!([other_dkim]));
    assert_eq!(dkim["publish"], good_dkim_line.as_str(), "{dkim:#}");
    assert!(
        dkim["reason"]
            .as_str()
            .unwrap()
            .contains("another public key"),
        "{dkim:#}"
    );
    assert_eq!(
        row(&report, "address")["found"],
        serde_json::json!(["192.0.2.25"])
    );
    assert_eq!(row(&report, "ptr")["name"], "25.2.0.192.in-addr.arpa");
    assert_eq!(row(&report, "spf")["publish"], Value::Null);
    // The table names the wrong record first, then the line to publish.
    let (code, text, _) = check(nsd.port, false).await;
    assert_eq!(code, 1);
    let table_row = text
        .lines()
        .find(|l| l.starts_with("DKIM "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        table_row.contains(dkim_name) && table_row.ends_with(" wrong"),
        "{text}"
    );
    assert!(
        text.contains(&format!("  publish: {good_dkim_line}\n")),
        "{text}"
    );
    assert!(
        text.ends_with("7 of 8 records of example.test are as they should be\n"),
        "{text}"
    );
    drop(nsd);

    // 2. The DKIM line published as given; DMARC left out.
    let publish = dkim["publish"].as_str().unwrap();
    let nsd = Nsd::start(
        &dir.path().join("nsd2"),
        &[
            ("example.test", zone(publish, "_dmarc.example.test")),
            ("2.0.192.in-addr.arpa", reverse.clone()),
        ],
    );
    let (code, out, err) = check(nsd.port, true).await;
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        statuses(&report),
        expect(&[
            ("mx", "ok"),
            ("spf", "ok"),
            ("dkim", "ok"),
            ("dmarc", "missing"),
            ("mta-sts", "ok"),
            ("tls-rpt", "ok"),
            ("address", "ok"),
            ("ptr", "ok"),
        ]),
        "{report:#}"
    );
    let dmarc = row(&report, "dmarc");
    assert_eq!(
        dmarc["publish"],
        "_dmarc.example.test. 3600 IN TXT \"v=DMARC1; p=none; rua=mailto:postmaster@example.test\""
    );
    assert_eq!(dmarc["found"], serde_json::json!([]));
    drop(nsd);

    // 3. That line published too: everything is ok, exit 0.
    let dmarc_line = dmarc["publish"].as_str().unwrap();
    let nsd = Nsd::start(
        &dir.path().join("nsd3"),
        &[
            (
                "example.test",
                zone(publish, "_dmarc.example.test") + dmarc_line + "\n",
            ),
            ("2.0.192.in-addr.arpa", reverse.clone()),
        ],
    );
    let (code, text, err) = check(nsd.port, false).await;
    assert_eq!(code, 0, "{text}{err}");
    assert!(
        text.ends_with("8 of 8 records of example.test are as they should be\n"),
        "{text}"
    );

    // 4. A domain the server refuses to answer for: failed lookups, never "missing"; and
    // no key for it, so DKIM is unchecked.
    let (code, out, err) = setup(args(&[
        "check-dns",
        "other.test",
        "--mx",
        "mx.other.test",
        "--dns-server",
        &format!("127.0.0.1:{}", nsd.port),
        "--database-url",
        &db.url,
        "-c",
        conf.to_str().unwrap(),
        "--json",
    ]))
    .await;
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        statuses(&report),
        expect(&[
            ("mx", "failed"),
            ("spf", "failed"),
            ("dkim", "unchecked"),
            ("dmarc", "failed"),
            ("mta-sts", "failed"),
            ("tls-rpt", "failed"),
            ("address", "failed"),
        ]),
        "{report:#}"
    );
    assert!(
        row(&report, "dkim")["reason"]
            .as_str()
            .unwrap()
            .contains("no enabled key for other.test"),
        "{report:#}"
    );
}
