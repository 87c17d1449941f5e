//! `pepsi-setup dns`: a domain's DKIM key and the DNS records an operator publishes for it
//! (MX, SPF, DKIM, DMARC, MTA-STS, TLS-RPT, and with a certificate the DANE TLSA record of
//! the MX), as zone-file lines or JSON. The MTA-STS record and policy are written by
//! `pepsi_smtp::sts`, the one definition the relay stage reads them with.
//!
//! The records are a pure function of a [`Plan`] ([`records`]); making the key and storing
//! it (a PEM file, or a row of `pepsi.signing_key`) is the I/O at the edge.

use std::fmt;

use serde::Serialize;

/// DKIM key algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algorithm {
    /// RSA 2048 bits: what every verifier accepts.
    Rsa,
    /// Ed25519 (RFC 8463): short, but not yet verified everywhere; publish it beside an RSA
    /// key.
    Ed25519,
}

/// DMARC policy (`p=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DmarcPolicy {
    None,
    Quarantine,
    Reject,
}

/// MTA-STS mode (RFC 8461), or no MTA-STS records at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MtaSts {
    Off,
    Testing,
    Enforce,
}

/// Everything the records depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The mail domain, lower case.
    pub domain: String,
    /// The host that receives its mail.
    pub mx: String,
    pub selector: String,
    pub algorithm: Algorithm,
    /// The DKIM `p=` value: base64 of the public key.
    pub public_key: String,
    /// Where DMARC aggregate and TLS reports go (an address).
    pub reports: String,
    pub dmarc: DmarcPolicy,
    pub mta_sts: MtaSts,
    /// The MTA-STS policy id (changes whenever the policy does): a timestamp.
    pub policy_id: String,
    /// SHA-256 of the MX certificate's public key (SubjectPublicKeyInfo), hex: the
    /// `3 1 1` TLSA record of `_25._tcp.<mx>` (RFC 7672 §3.1, DANE-EE).
    pub tlsa: Option<String>,
}

/// One DNS record to publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    /// Fully qualified, without the trailing dot.
    pub name: String,
    /// `MX`, `TXT` or `TLSA`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// MX: `preference host`; TXT: the text, unquoted.
    pub value: String,
}

/// What `pepsi-setup dns` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Output {
    pub records: Vec<Record>,
    /// The MTA-STS policy, served as `https://mta-sts.<domain>/.well-known/mta-sts.txt`;
    /// None when MTA-STS is off.
    pub mta_sts_policy: Option<String>,
    /// Where the private key went.
    pub key: String,
}

/// A domain or host name as DNS takes it (the setup model's one definition).
pub use pepsi_setup_model::name::check_name;

/// The records of `plan`, in the order an operator would publish them.
pub fn records(plan: &Plan) -> Vec<Record> {
    let d = &plan.domain;
    let txt = |name: String, value: String| Record {
        name,
        kind: "TXT",
        value,
    };
    let k = match plan.algorithm {
        Algorithm::Rsa => "rsa",
        Algorithm::Ed25519 => "ed25519",
    };
    let p = match plan.dmarc {
        DmarcPolicy::None => "none",
        DmarcPolicy::Quarantine => "quarantine",
        DmarcPolicy::Reject => "reject",
    };
    let mut out = vec![
        Record {
            name: d.clone(),
            kind: "MX",
            value: format!("10 {}", plan.mx),
        },
        txt(d.clone(), "v=spf1 mx -all".into()),
        txt(
            format!("{}._domainkey.{d}", plan.selector),
            format!("v=DKIM1; k={k}; p={}", plan.public_key),
        ),
        txt(
            format!("_dmarc.{d}"),
            format!("v=DMARC1; p={p}; rua=mailto:{}", plan.reports),
        ),
    ];
    if plan.mta_sts != MtaSts::Off {
        out.push(txt(
            format!("_mta-sts.{d}"),
            pepsi_smtp::sts::Record {
                id: plan.policy_id.clone(),
            }
            .to_text(),
        ));
        out.push(txt(
            format!("_smtp._tls.{d}"),
            format!("v=TLSRPTv1; rua=mailto:{}", plan.reports),
        ));
    }
    if let Some(hash) = &plan.tlsa {
        out.push(Record {
            name: format!("_25._tcp.{}", plan.mx),
            kind: "TLSA",
            value: format!("3 1 1 {hash}"),
        });
    }
    out
}

/// The MTA-STS policy file (RFC 8461 §3.2), one week's max_age.
pub fn mta_sts_policy(plan: &Plan) -> Option<String> {
    use pepsi_smtp::sts::{Mode, Policy};
    let mode = match plan.mta_sts {
        MtaSts::Off => return None,
        MtaSts::Testing => Mode::Testing,
        MtaSts::Enforce => Mode::Enforce,
    };
    Some(
        Policy {
            mode,
            max_age: 604_800,
            mx: vec![plan.mx.clone()],
        }
        .to_text(),
    )
}

/// A TXT value as zone-file strings: quoted, in pieces of at most 255 octets (a 2048-bit
/// RSA key does not fit one).
fn quoted(value: &str) -> String {
    value
        .as_bytes()
        .chunks(255)
        .map(|c| format!("\"{}\"", String::from_utf8_lossy(c)))
        .collect::<Vec<_>>()
        .join(" ")
}

impl fmt::Display for Output {
    /// Zone-file lines, then the MTA-STS policy and where the key is, as comments.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .records
            .iter()
            .map(|r| r.name.len() + 1)
            .max()
            .unwrap_or(0);
        for r in &self.records {
            let value = match r.kind {
                "MX" => {
                    let (pref, host) = r.value.split_once(' ').unwrap_or(("10", &r.value));
                    format!("{pref} {host}.")
                }
                "TLSA" => r.value.clone(),
                _ => quoted(&r.value),
            };
            writeln!(
                f,
                "{:<width$} 3600 IN {:<3} {value}",
                format!("{}.", r.name),
                r.kind
            )?;
        }
        if let Some(policy) = &self.mta_sts_policy {
            writeln!(f, ";")?;
            writeln!(
                f,
                "; MTA-STS: serve this as https://mta-sts.{}/.well-known/mta-sts.txt",
                self.records[0].name
            )?;
            writeln!(
                f,
                "; (a certificate valid for mta-sts.{}), and change the id above whenever it changes:",
                self.records[0].name
            )?;
            for line in policy.lines() {
                writeln!(f, ";   {line}")?;
            }
        }
        writeln!(f, ";")?;
        writeln!(f, "; DKIM private key: {}", self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            domain: "example.org".into(),
            mx: "mx.example.org".into(),
            selector: "s202612".into(),
            algorithm: Algorithm::Rsa,
            public_key: "MIIB".into(),
            reports: "postmaster@example.org".into(),
            dmarc: DmarcPolicy::None,
            mta_sts: MtaSts::Testing,
            policy_id: "20261201T000000".into(),
            tlsa: None,
        }
    }

    #[test]
    fn records_table() {
        let got: Vec<(String, &str, String)> = records(&plan())
            .into_iter()
            .map(|r| (r.name, r.kind, r.value))
            .collect();
        let want = [
            ("example.org", "MX", "10 mx.example.org"),
            ("example.org", "TXT", "v=spf1 mx -all"),
            (
                "s202612._domainkey.example.org",
                "TXT",
                "v=DKIM1; k=rsa; p=MIIB",
            ),
            (
                "_dmarc.example.org",
                "TXT",
                "v=DMARC1; p=none; rua=mailto:postmaster@example.org",
            ),
            (
                "_mta-sts.example.org",
                "TXT",
                "v=STSv1; id=20261201T000000;",
            ),
            (
                "_smtp._tls.example.org",
                "TXT",
                "v=TLSRPTv1; rua=mailto:postmaster@example.org",
            ),
        ];
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0.as_str(), g.1, g.2.as_str()), w);
        }

        let off = Plan {
            mta_sts: MtaSts::Off,
            dmarc: DmarcPolicy::Reject,
            algorithm: Algorithm::Ed25519,
            ..plan()
        };
        let r = records(&off);
        assert_eq!(r.len(), 4, "no MTA-STS or TLS-RPT records when off");
        assert!(r[2].value.starts_with("v=DKIM1; k=ed25519;"));
        assert!(r[3].value.contains("p=reject"));
        assert_eq!(mta_sts_policy(&off), None);
        assert_eq!(
            mta_sts_policy(&Plan {
                mta_sts: MtaSts::Enforce,
                ..plan()
            })
            .unwrap(),
            "version: STSv1\r\nmode: enforce\r\nmx: mx.example.org\r\nmax_age: 604800\r\n"
        );
        let dane = records(&Plan {
            tlsa: Some("ab12".into()),
            ..plan()
        });
        let last = dane.last().unwrap();
        assert_eq!(
            (last.name.as_str(), last.kind, last.value.as_str()),
            ("_25._tcp.mx.example.org", "TLSA", "3 1 1 ab12")
        );
    }

    #[test]
    fn zone_text_splits_long_txt_values() {
        let long = Plan {
            public_key: "A".repeat(400),
            ..plan()
        };
        let out = Output {
            records: records(&long),
            mta_sts_policy: mta_sts_policy(&long),
            key: "/k.pem".into(),
        };
        let text = out.to_string();
        let dkim = text
            .lines()
            .find(|l| l.starts_with("s202612._domainkey.example.org."))
            .unwrap();
        assert!(dkim.contains("IN TXT \"v=DKIM1; k=rsa; p=AAA"), "{dkim}");
        assert_eq!(dkim.matches('"').count(), 4, "two strings: {dkim}");
        assert!(text.contains("example.org.") && text.contains("IN MX  10 mx.example.org."));
        assert!(text.contains(";   mode: testing"));
        assert!(text.ends_with("; DKIM private key: /k.pem\n"));
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name("domain", "Example.ORG.").unwrap(), "example.org");
        for bad in ["localhost", "a..b", "-a.b", "a_b.c", "a b.c", ""] {
            let e = check_name("domain", bad).unwrap_err();
            assert!(e.contains("is not a domain name"), "{bad}: {e}");
        }
    }
}
