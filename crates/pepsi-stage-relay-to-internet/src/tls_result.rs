//! The TLS result of each outbound session, in the classes of TLS reporting (RFC 8460
//! §4.3), counted per day in `pepsi.tls_report_result` for the daily reports. What a
//! session's opening means is decided here, purely ([`of_session`], [`of_open_error`]);
//! [`record`] is the one write, and a failed write is logged, never holds mail.

use std::net::IpAddr;

use pepsi_smtp::{CertCheck, ClientError, TlsInfo};
use sqlx::PgPool;

use crate::sts::Applied;

const ADD: &str = "SELECT pepsi.tls_result_add($1, $2, $3, $4, $5, $6, $7)";

/// The policy a result is counted under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// `sts` or `no-policy-found` (`tlsa` once DANE is in).
    pub policy_type: &'static str,
    /// The policy's lines; empty without one.
    pub policy_string: Vec<String>,
}

impl Counted {
    pub fn of(applied: &Applied) -> Counted {
        match applied {
            Applied::Policy(p) => Counted {
                policy_type: "sts",
                policy_string: p.lines(),
            },
            // A policy announced but not had is reported under sts, as RFC 8460 §4.3.2.2
            // wants the fetch errors.
            Applied::Unavailable { .. } => Counted {
                policy_type: "sts",
                policy_string: Vec::new(),
            },
            Applied::NoPolicy => Counted {
                policy_type: "no-policy-found",
                policy_string: Vec::new(),
            },
        }
    }
}

/// A result: `success` or an RFC 8460 result type, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Result {
    pub result_type: &'static str,
    pub detail: String,
}

impl Result {
    fn success() -> Result {
        Result {
            result_type: "success",
            detail: String::new(),
        }
    }

    pub fn failure(result_type: &'static str, detail: impl Into<String>) -> Result {
        Result {
            result_type,
            detail: detail.into(),
        }
    }

    pub fn is_success(&self) -> bool {
        self.result_type == "success"
    }
}

/// What an open session says: no TLS at all, or a certificate the audit found wanting, is
/// a failure; TLS with a certificate that was checked and passed, or was not to be
/// checked, is a success.
pub fn of_session(tls: Option<&TlsInfo>) -> Result {
    match tls {
        None => Result::failure("starttls-not-supported", "the session went on without TLS"),
        Some(TlsInfo {
            checked: Some(CertCheck::Invalid { problem, detail }),
            ..
        }) => Result::failure(problem.result_type(), detail.clone()),
        Some(_) => Result::success(),
    }
}

/// What a session that did not open says about TLS; `None` when its failure had nothing
/// to do with TLS (no connection, a refused greeting).
pub fn of_open_error(e: &ClientError) -> Option<Result> {
    match e {
        ClientError::Tls {
            detail,
            problem: Some(p),
        } => Some(Result::failure(p.result_type(), detail.clone())),
        ClientError::Tls {
            detail,
            problem: None,
        } => Some(Result::failure("validation-failure", detail.clone())),
        ClientError::Policy {
            status: "4.7.4",
            detail,
            ..
        } => Some(Result::failure("starttls-not-supported", detail.clone())),
        _ => None,
    }
}

/// Counts one result for `domain`'s report.
pub async fn record(
    pool: &PgPool,
    domain: &str,
    counted: &Counted,
    mx_host: &str,
    address: Option<IpAddr>,
    result: &Result,
) {
    let outcome = sqlx::query(ADD)
        .bind(domain)
        .bind(counted.policy_type)
        .bind(&counted.policy_string)
        .bind(mx_host)
        .bind(address.map(|a| a.to_string()).unwrap_or_default())
        .bind(result.result_type)
        .bind(&result.detail)
        .execute(pool)
        .await;
    if let Err(e) = outcome {
        tracing::warn!(
            domain,
            "cannot count the TLS result in pepsi.tls_report_result: {e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_smtp::CertProblem;
    use pepsi_smtp::client::Phase;

    fn info(checked: Option<CertCheck>) -> TlsInfo {
        TlsInfo {
            version: "TLSv1.3".into(),
            cipher: "TLS13_AES_256_GCM_SHA384".into(),
            verified: false,
            checked,
        }
    }

    #[test]
    fn sessions_and_their_results() {
        let invalid = |problem| {
            Some(CertCheck::Invalid {
                problem,
                detail: "x".into(),
            })
        };
        let table = [
            (None, "starttls-not-supported"),
            (Some(info(None)), "success"),
            (Some(info(Some(CertCheck::Valid))), "success"),
            (
                Some(info(invalid(CertProblem::HostMismatch))),
                "certificate-host-mismatch",
            ),
            (
                Some(info(invalid(CertProblem::Expired))),
                "certificate-expired",
            ),
            (
                Some(info(invalid(CertProblem::NotTrusted))),
                "certificate-not-trusted",
            ),
            (
                Some(info(invalid(CertProblem::Invalid))),
                "validation-failure",
            ),
        ];
        for (tls, want) in table {
            assert_eq!(of_session(tls.as_ref()).result_type, want, "{tls:?}");
        }
    }

    #[test]
    fn open_errors_and_their_results() {
        let tls = |problem| ClientError::Tls {
            detail: "d".into(),
            problem,
        };
        let table = [
            (
                tls(Some(CertProblem::HostMismatch)),
                Some("certificate-host-mismatch"),
            ),
            (tls(None), Some("validation-failure")),
            (
                ClientError::Policy {
                    phase: Phase::StartTls,
                    status: "4.7.4",
                    detail: "no STARTTLS".into(),
                },
                Some("starttls-not-supported"),
            ),
            (
                ClientError::Closed {
                    phase: Phase::Greeting,
                },
                None,
            ),
        ];
        for (e, want) in table {
            assert_eq!(of_open_error(&e).map(|r| r.result_type), want, "{e:?}");
        }
    }

    #[test]
    fn the_policy_a_result_counts_under() {
        let p = pepsi_smtp::sts::Policy {
            mode: pepsi_smtp::sts::Mode::Testing,
            max_age: 60,
            mx: vec!["mx.a.test".into()],
        };
        let c = Counted::of(&Applied::Policy(p));
        assert_eq!(c.policy_type, "sts");
        assert!(c.policy_string.contains(&"mode: testing".to_owned()));
        assert_eq!(
            Counted::of(&Applied::NoPolicy).policy_type,
            "no-policy-found"
        );
    }
}
