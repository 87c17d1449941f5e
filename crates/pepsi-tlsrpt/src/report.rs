//! The aggregate report of RFC 8460 §4, one definition for both ends: the reports this
//! server makes from `pepsi.tls_report_result` ([`build`]) and the ones it reads from other
//! senders ([`parse`]). Pure: no database, no network.

use std::collections::BTreeMap;
use std::io::Read as _;

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

/// The largest report read, gzip'ed or not, and the largest it may inflate to.
pub const MAX_REPORT_BYTES: usize = 10 * 1024 * 1024;

/// The most policies, and failure details per policy, a report may hold.
pub const MAX_ENTRIES: usize = 10_000;

/// The RFC 8460 result types of a failed session, and `success`.
pub const RESULT_TYPES: [&str; 11] = [
    "starttls-not-supported",
    "certificate-host-mismatch",
    "certificate-expired",
    "certificate-not-trusted",
    "validation-failure",
    "tlsa-invalid",
    "dnssec-invalid",
    "dane-required",
    "sts-policy-fetch-error",
    "sts-policy-invalid",
    "sts-webpki-invalid",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Report {
    pub organization_name: String,
    pub date_range: DateRange,
    pub contact_info: String,
    pub report_id: String,
    pub policies: Vec<PolicyResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DateRange {
    pub start_datetime: DateTime<Utc>,
    pub end_datetime: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PolicyResult {
    pub policy: Policy,
    pub summary: Summary,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_details: Vec<FailureDetail>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Policy {
    /// `sts`, `tlsa` or `no-policy-found`.
    pub policy_type: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_string: Vec<String>,
    pub policy_domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mx_host: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Summary {
    pub total_successful_session_count: u64,
    pub total_failure_session_count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FailureDetail {
    pub result_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sending_mta_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiving_mx_hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiving_mx_helo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiving_ip: Option<String>,
    pub failed_session_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_information: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason_code: Option<String>,
}

/// One counted row of `pepsi.tls_report_result` for the domain and day being reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub policy_type: String,
    pub policy_string: Vec<String>,
    pub mx_host: String,
    pub receiving_ip: String,
    pub result_type: String,
    pub sessions: u64,
    pub detail: String,
}

/// Who sends a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitter {
    /// `organization-name`.
    pub organization: String,
    /// `contact-info`: an address or URI.
    pub contact: String,
    /// The host name that makes report ids unique.
    pub hostname: String,
}

/// The report of `day` (UTC) for `domain` from its counted rows: one policy entry per
/// policy (type and lines), with its MX hosts, its totals and a failure detail per result
/// type, MX host and address.
pub fn build(submitter: &Submitter, domain: &str, day: NaiveDate, rows: &[Counted]) -> Report {
    let mut policies: BTreeMap<(String, Vec<String>), PolicyResult> = BTreeMap::new();
    for r in rows {
        let entry = policies
            .entry((r.policy_type.clone(), r.policy_string.clone()))
            .or_insert_with(|| PolicyResult {
                policy: Policy {
                    policy_type: r.policy_type.clone(),
                    policy_string: r.policy_string.clone(),
                    policy_domain: domain.to_owned(),
                    mx_host: Vec::new(),
                },
                summary: Summary {
                    total_successful_session_count: 0,
                    total_failure_session_count: 0,
                },
                failure_details: Vec::new(),
            });
        if !r.mx_host.is_empty() && !entry.policy.mx_host.contains(&r.mx_host) {
            entry.policy.mx_host.push(r.mx_host.clone());
        }
        if r.result_type == "success" {
            entry.summary.total_successful_session_count += r.sessions;
        } else {
            entry.summary.total_failure_session_count += r.sessions;
            let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
            entry.failure_details.push(FailureDetail {
                result_type: r.result_type.clone(),
                sending_mta_ip: None,
                receiving_mx_hostname: some(&r.mx_host),
                receiving_mx_helo: None,
                receiving_ip: some(&r.receiving_ip),
                failed_session_count: r.sessions,
                additional_information: None,
                failure_reason_code: some(&r.detail),
            });
        }
    }
    let start = day.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
    let end = day
        .and_hms_opt(23, 59, 59)
        .expect("a second before midnight")
        .and_utc();
    Report {
        organization_name: submitter.organization.clone(),
        date_range: DateRange {
            start_datetime: start,
            end_datetime: end,
        },
        contact_info: submitter.contact.clone(),
        report_id: report_id(submitter, domain, day),
        policies: policies.into_values().collect(),
    }
}

/// A report id unique per sender, domain and day: `<day>.<domain>@<hostname>` (§4.4: an
/// identifier that is unique and stable across resends).
pub fn report_id(submitter: &Submitter, domain: &str, day: NaiveDate) -> String {
    format!("{}.{domain}@{}", day.format("%Y%m%d"), submitter.hostname)
}

/// The attachment's file name (§5.3):
/// `<submitter>!<policy-domain>!<begin-timestamp>!<end-timestamp>[!<unique-id>].json.gz`.
pub fn file_name(report: &Report, domain: &str) -> String {
    format!(
        "{}!{domain}!{}!{}.json.gz",
        report
            .contact_info
            .rsplit('@')
            .next()
            .unwrap_or(&report.organization_name),
        report.date_range.start_datetime.timestamp(),
        report.date_range.end_datetime.timestamp()
    )
}

/// Checks what RFC 8460 §4.4 requires of a report: every required field present and
/// non-empty where it must be, known policy and result types, a date range in order,
/// totals that agree with the details, and nothing past the bounds.
pub fn validate(report: &Report) -> Result<(), String> {
    let field = |name: &str, value: &str| {
        if value.trim().is_empty() {
            Err(format!("{name} is empty"))
        } else {
            Ok(())
        }
    };
    field("organization-name", &report.organization_name)?;
    field("contact-info", &report.contact_info)?;
    field("report-id", &report.report_id)?;
    if report.date_range.start_datetime > report.date_range.end_datetime {
        return Err("date-range ends before it starts".into());
    }
    if report.policies.len() > MAX_ENTRIES {
        return Err(format!("more than {MAX_ENTRIES} policies"));
    }
    for p in &report.policies {
        let domain = &p.policy.policy_domain;
        field("policy-domain", domain)?;
        if !["sts", "tlsa", "no-policy-found"].contains(&p.policy.policy_type.as_str()) {
            return Err(format!(
                "policy-type {:?} of {domain} is not sts, tlsa or no-policy-found",
                p.policy.policy_type
            ));
        }
        if p.failure_details.len() > MAX_ENTRIES {
            return Err(format!(
                "more than {MAX_ENTRIES} failure details for {domain}"
            ));
        }
        let mut failed = 0u64;
        for d in &p.failure_details {
            if !RESULT_TYPES.contains(&d.result_type.as_str()) {
                return Err(format!(
                    "result-type {:?} of {domain} is not one of RFC 8460's",
                    d.result_type
                ));
            }
            failed = failed.saturating_add(d.failed_session_count);
        }
        if failed > p.summary.total_failure_session_count {
            return Err(format!(
                "the failure details of {domain} count {failed} sessions, the summary {}",
                p.summary.total_failure_session_count
            ));
        }
    }
    Ok(())
}

/// gzip of the report's JSON: the `application/tlsrpt+gzip` body.
pub fn gzip(report: &Report) -> Vec<u8> {
    use std::io::Write as _;
    let json = serde_json::to_vec(report).expect("a report serializes");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&json).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

/// Reads a report: gzip'ed JSON (`application/tlsrpt+gzip`) or JSON, bounded by
/// [`MAX_REPORT_BYTES`] before and after inflating, then [`validate`]d.
pub fn parse(bytes: &[u8]) -> Result<Report, String> {
    if bytes.len() > MAX_REPORT_BYTES {
        return Err(format!(
            "the report is {} bytes, more than the {MAX_REPORT_BYTES} read",
            bytes.len()
        ));
    }
    let json = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(MAX_REPORT_BYTES as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("the report is not valid gzip: {e}"))?;
        if out.len() > MAX_REPORT_BYTES {
            return Err(format!(
                "the report inflates to more than {MAX_REPORT_BYTES} bytes"
            ));
        }
        out
    } else {
        bytes.to_vec()
    };
    let report: Report = serde_json::from_slice(&json)
        .map_err(|e| format!("the report is not RFC 8460 JSON: {e}"))?;
    validate(&report)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submitter() -> Submitter {
        Submitter {
            organization: "Example Mail".into(),
            contact: "postmaster@relay.example".into(),
            hostname: "relay.example".into(),
        }
    }

    fn row(policy: &str, mx: &str, result: &str, n: u64) -> Counted {
        Counted {
            policy_type: policy.into(),
            policy_string: if policy == "sts" {
                vec!["version: STSv1".into(), "mode: testing".into()]
            } else {
                vec![]
            },
            mx_host: mx.into(),
            receiving_ip: "192.0.2.1".into(),
            result_type: result.into(),
            sessions: n,
            detail: if result == "success" {
                "".into()
            } else {
                "why".into()
            },
        }
    }

    #[test]
    fn a_day_of_results_becomes_one_report() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 5).unwrap();
        let r = build(
            &submitter(),
            "b.test",
            day,
            &[
                row("sts", "mx1.b.test", "success", 7),
                row("sts", "mx2.b.test", "certificate-host-mismatch", 2),
                row("sts", "", "validation-failure", 1),
                row("no-policy-found", "mx1.b.test", "success", 3),
            ],
        );
        assert_eq!(r.report_id, "20261205.b.test@relay.example");
        assert_eq!(
            r.date_range.start_datetime.to_rfc3339(),
            "2026-12-05T00:00:00+00:00"
        );
        assert_eq!(
            r.date_range.end_datetime.to_rfc3339(),
            "2026-12-05T23:59:59+00:00"
        );
        assert_eq!(r.policies.len(), 2);
        let none = &r.policies[0];
        assert_eq!(none.policy.policy_type, "no-policy-found");
        assert_eq!(none.summary.total_successful_session_count, 3);
        let sts = &r.policies[1];
        assert_eq!(sts.policy.mx_host, ["mx1.b.test", "mx2.b.test"]);
        assert_eq!(
            (
                sts.summary.total_successful_session_count,
                sts.summary.total_failure_session_count
            ),
            (7, 3)
        );
        assert_eq!(sts.failure_details.len(), 2);
        assert_eq!(sts.failure_details[1].receiving_mx_hostname, None);
        assert_eq!(validate(&r), Ok(()));
        // The JSON carries RFC 8460's names, and reads back, gzip'ed or not.
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["policies"][1]["summary"]["total-failure-session-count"] == 3);
        assert_eq!(
            json["policies"][1]["failure-details"][0]["result-type"],
            "certificate-host-mismatch"
        );
        assert_eq!(parse(&gzip(&r)), Ok(r.clone()));
        assert_eq!(parse(&serde_json::to_vec(&r).unwrap()), Ok(r.clone()));
        assert_eq!(
            file_name(&r, "b.test"),
            "relay.example!b.test!1796428800!1796515199.json.gz"
        );
    }

    #[test]
    fn reports_that_are_not_rfc_8460_are_refused_naming_why() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 5).unwrap();
        let good = build(
            &submitter(),
            "b.test",
            day,
            &[row("sts", "mx", "success", 1)],
        );
        let mut bad_type = good.clone();
        bad_type.policies[0].policy.policy_type = "dane".into();
        let mut bad_result = build(
            &submitter(),
            "b.test",
            day,
            &[row("sts", "mx", "starttls-not-supported", 1)],
        );
        bad_result.policies[0].failure_details[0].result_type = "oops".into();
        let mut bad_sum = build(
            &submitter(),
            "b.test",
            day,
            &[row("sts", "mx", "starttls-not-supported", 1)],
        );
        bad_sum.policies[0].summary.total_failure_session_count = 0;
        let mut no_org = good.clone();
        no_org.organization_name = " ".into();
        for (r, why) in [
            (bad_type, "not sts, tlsa"),
            (bad_result, "not one of RFC 8460's"),
            (bad_sum, "the summary 0"),
            (no_org, "organization-name is empty"),
        ] {
            let err = parse(&serde_json::to_vec(&r).unwrap()).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        assert!(
            parse(b"{\"organization-name\": 1}")
                .unwrap_err()
                .contains("not RFC 8460 JSON")
        );
        assert!(parse(&[0x1f, 0x8b, 0, 1]).unwrap_err().contains("gzip"));
        let bomb = {
            use std::io::Write as _;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            gz.write_all(&vec![b' '; MAX_REPORT_BYTES + 10]).unwrap();
            gz.finish().unwrap()
        };
        assert!(parse(&bomb).unwrap_err().contains("inflates to more than"));
    }
}
