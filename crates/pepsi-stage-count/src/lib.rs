//! pepsi-stage-count: reports every recipient of a message to the migadu_counters service,
//! exactly as its upstream caller does: `POST /out` when the session was authenticated
//! (`auth_user`), `POST /in` otherwise (with the junk verdict when one exists), one request
//! per recipient, `trace_id` = the queue id, bearer token from the stage section.
//!
//! Reads: envelope, `auth_user`, `state.origin.auth_user`, `state.junk` (`Load::Metadata`).
//! Writes: nothing. Terminal helper: `advance`, always — the counting service is
//! fire-and-forget and never delays or fails mail, whatever it answers.

use std::process::ExitCode;
use std::time::Duration;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{Junk, Origin};
use serde_json::{Value, json};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-count",
        exec: "pepsi-stage-count",
    };
    pub const PROGRAM: &str = "pepsi-stage-count";
}

/// One request to the counting service.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `/in` or `/out`.
    pub route: &'static str,
    pub body: Value,
}

/// The requests for one message: pure, so the rules read as a table in the tests.
pub fn reports(
    id: i64,
    mail_from: &str,
    rcpt_to: &[String],
    auth_user: Option<&str>,
    state: &serde_json::Map<String, Value>,
) -> Vec<Report> {
    let auth = auth_user
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .or_else(|| match Origin::from_state(state) {
            Ok(origin) => origin?.auth_user.filter(|u| !u.is_empty()),
            // Counting never fails or holds a message: report it as inbound, and say why.
            Err(e) => {
                tracing::warn!(id, "{e}: counted without the authenticated user");
                None
            }
        });
    // Counting never fails mail: a `junk` that is not a boolean counts as false.
    let junk = Junk::from_state(state).ok().flatten().is_some_and(|j| j.0);
    rcpt_to
        .iter()
        .map(|recipient| match &auth {
            Some(user) => Report {
                route: "/out",
                body: json!({"trace_id": id.to_string(), "auth_user": user, "mail_from": mail_from, "recipient": recipient}),
            },
            None => Report {
                route: "/in",
                body: json!({"trace_id": id.to_string(), "mail_from": mail_from, "recipient": recipient, "junk": junk}),
            },
        })
        .collect()
}

/// The stage, with its HTTP client.
pub struct Count {
    client: reqwest::Client,
}

/// One `[stage-<name>]` section: where the counting service is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountSection {
    /// The service's base URL, without a trailing slash.
    pub base: String,
    pub token: String,
    pub timeout: Duration,
}

impl Stage for Count {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = CountSection;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client: {e}"))?;
        Ok(Count { client })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<CountSection> {
        let section = cfg.stage_section_named(name);
        Ok(CountSection {
            base: section.string("URL")?.trim_end_matches('/').to_owned(),
            token: section.string("AUTH_TOKEN")?,
            timeout: section
                .duration_opt("TIMEOUT")?
                .unwrap_or(Duration::from_secs(2)),
        })
    }

    async fn process(
        &self,
        section: &CountSection,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let CountSection {
            base,
            token,
            timeout,
        } = section;
        let timeout = *timeout;
        let reports = reports(
            ctx.id(),
            ctx.mail_from(),
            ctx.rcpt_to(),
            ctx.auth_user(),
            ctx.state(),
        );
        let sends = reports.into_iter().map(|r| {
            let request = self
                .client
                .post(format!("{base}{}", r.route))
                .bearer_auth(token)
                .timeout(timeout)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(r.body.to_string());
            async move {
                match request.send().await {
                    Ok(resp) if resp.status().is_success() => {}
                    Ok(resp) => tracing::warn!(route = r.route, status = %resp.status(), "counting service refused a report"),
                    Err(e) => tracing::warn!(route = r.route, "counting service unreachable: {e}"),
                }
            }
        });
        // All of a message's reports go out together; none can hold the message longer than
        // the timeout, and none can fail it.
        let handles: Vec<_> = sends.map(tokio::spawn).collect();
        for handle in handles {
            let _ = handle.await;
        }
        ctx.advance()
    }
}

const ABOUT: &str = "Pepsi stage that reports every recipient to migadu_counters";

/// The command line of `pepsi-stage-count`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-count` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Count>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn routes_follow_the_authenticated_user() {
        let rcpt = vec!["y@example.com".to_owned(), "s@gmail.com".to_owned()];
        let out = reports(
            7,
            "x@example.com",
            &rcpt,
            Some("x@example.com"),
            &state(json!({})),
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].route, "/out");
        assert_eq!(
            out[1].body,
            json!({"trace_id": "7", "auth_user": "x@example.com", "mail_from": "x@example.com", "recipient": "s@gmail.com"})
        );
        let from_origin = reports(
            7,
            "x@example.com",
            &rcpt[..1],
            None,
            &state(json!({"origin": {"auth_user": "x@example.com"}})),
        );
        assert_eq!(from_origin[0].route, "/out");
        let inbound = reports(
            8,
            "s@gmail.com",
            &rcpt[..1],
            Some(""),
            &state(json!({"junk": true})),
        );
        assert_eq!(
            inbound,
            vec![Report {
                route: "/in",
                body: json!({"trace_id": "8", "mail_from": "s@gmail.com", "recipient": "y@example.com", "junk": true})
            }]
        );
        let clean = reports(8, "s@gmail.com", &rcpt[..1], None, &state(json!({})));
        assert_eq!(clean[0].body["junk"], false);
    }
}
