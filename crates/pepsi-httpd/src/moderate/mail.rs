//! The mail the moderation pages send: a moderator's link, and the welcome of a subscription
//! a moderator approved. Each is written with mail-builder as the list stage writes the
//! list's own messages (from `<list>-request@`, `Auto-Submitted: auto-replied`, the list's
//! `List-Id`) and queued with `pepsi.list_queue_mail` at the list stage's `DELIVER_STAGE`,
//! with `<list>-bounces@` as envelope sender, in the caller's transaction (the httpd role
//! may not write the queue itself: `docs/setup.md`).
//!
//! Where the mail starts is read from the configuration (`Route`); the base of the links is
//! `[pepsi] LIST_WEB_URL` (`web_url`).

use chrono::Utc;
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use pepsi_conf::config::Config;
use sqlx::PgConnection;

/// The list stage's default `DELIVER_STAGE` (pepsi-stage-list's).
const DEFAULT_DELIVER_STAGE: &str = "aliases";

/// The longest `LIST_WEB_URL`: a link with its token stays a line of a mail.
const MAX_WEB_URL: usize = 200;

/// `[pepsi] LIST_WEB_URL` as stored text: `None` when it is unset or empty, an error naming
/// the value when it is not an `https://` URL without a path, query or trailing slash.
pub fn web_url(value: Option<&str>) -> Result<Option<String>, String> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Err(format!(
            "[pepsi] LIST_WEB_URL = {v}: {why} (the public base of the list pages, as \
             https://lists.example.org)"
        ))
    };
    let Some(rest) = v.strip_prefix("https://") else {
        return bad("it must start with https://");
    };
    if v.len() > MAX_WEB_URL {
        return bad("it is longer than 200 characters");
    }
    if rest.is_empty() || rest.ends_with('/') {
        return bad("a host is needed, without a trailing slash");
    }
    if rest
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '?' | '#' | '"' | '<' | '>'))
    {
        return bad("no spaces, query or fragment");
    }
    Ok(Some(v.to_owned()))
}

/// `[pepsi] LIST_WEB_URL` of `cfg`.
pub fn configured_web_url(cfg: &Config) -> Result<Option<String>, String> {
    let v = cfg
        .section("pepsi")
        .string_opt("LIST_WEB_URL")
        .map_err(|e| e.to_string())?;
    web_url(v.as_deref())
}

/// Where a list's own mail starts, and the domain of its Message-IDs: the list stage's
/// `DELIVER_STAGE` and `HOSTNAME`.
#[derive(Debug, Clone)]
pub struct Route {
    pub deliver_stage: String,
    pub hostname: String,
}

impl Route {
    /// Read from the list stage of `cfg` (the only stage running pepsi-stage-list).
    pub fn from_config(cfg: &Config) -> Result<Route, String> {
        let stage = pepsi_list::moderation::list_stage(cfg, None).map_err(|e| match e {
            pepsi_list::moderation::NoStage::Usage(m)
            | pepsi_list::moderation::NoStage::Missing(m) => m,
        })?;
        let s = cfg.stage_section_named(&stage);
        let deliver_stage = s
            .string_opt("DELIVER_STAGE")
            .map_err(|e| e.to_string())?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_DELIVER_STAGE.to_owned());
        if cfg.stage(&deliver_stage).is_none() {
            return Err(format!(
                "[stage-{stage}] DELIVER_STAGE = {deliver_stage}: there is no \
                 [stage-{deliver_stage}]"
            ));
        }
        let hostname = cfg.name_option(&s, "HOSTNAME").map_err(|e| e.to_string())?;
        Ok(Route {
            deliver_stage,
            hostname,
        })
    }
}

/// `<name>-<suffix>@<domain>` of list `list`.
pub fn command_address(list: &str, suffix: &str) -> String {
    let local = pepsi_conf::address::local_part(list);
    match pepsi_conf::address::domain_part(list) {
        Some(domain) => format!("{local}{suffix}@{domain}"),
        None => format!("{list}{suffix}"),
    }
}

/// A message of list `list` to `to`; replies go to `reply_to` when given (a confirmation's
/// `<list>-confirm+<token>@`, so that answering it confirms).
pub fn compose(
    route: &Route,
    list: &str,
    to: &str,
    subject: &str,
    text: &str,
    reply_to: Option<&str>,
) -> Result<Vec<u8>, String> {
    let now = Utc::now();
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| format!("random bytes: {e}"))?;
    let mut message = MessageBuilder::new()
        .from(command_address(list, "-request"))
        .to(to)
        .subject(subject)
        .date(Date::new(now.timestamp()))
        .message_id(format!(
            "{}.{}.list-web@{}",
            now.timestamp_micros(),
            crate::credentials::hex(&random),
            route.hostname
        ))
        .header("Auto-Submitted", Raw::new("auto-replied"))
        .header("List-Id", Raw::new(format!("<{}>", list.replace('@', "."))));
    if let Some(r) = reply_to {
        message = message.reply_to(r);
    }
    message
        // Written as it is (7bit, or 8bit for UTF-8): a link must stay one line that a
        // person can copy, not be cut by quoted-printable's soft line breaks.
        .body(
            MimePart::new("text/plain", text).transfer_encoding(if text.is_ascii() {
                "7bit"
            } else {
                "8bit"
            }),
        )
        .write_to_vec()
        .map_err(|e| format!("writing a message: {e}"))
}

/// Queues `raw` (a whole message) to `to` at the route's `DELIVER_STAGE`, in `tx`; the
/// caller wakes the dispatcher after its commit. Returns the queue row.
pub async fn queue(
    tx: &mut PgConnection,
    route: &Route,
    list: &str,
    to: &str,
    raw: &[u8],
) -> Result<i64, sqlx::Error> {
    let (headers, body) = pepsi_smtp::message::split(raw);
    let id: Option<i64> =
        sqlx::query_scalar("SELECT pepsi.list_queue_mail($1, $2, $3, ARRAY[$4], $5, $6)")
            .bind(list)
            .bind(&route.deliver_stage)
            .bind(command_address(list, "-bounces"))
            .bind(to)
            .bind(headers)
            .bind(body)
            .fetch_one(tx)
            .await?;
    Ok(id.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_web_url_is_an_https_base() {
        let long = format!("https://{}", "a".repeat(200));
        // (LIST_WEB_URL, the value kept, or a part of the error)
        type Case<'a> = (Option<&'a str>, Result<Option<&'a str>, &'a str>);
        let cases: [Case; 9] = [
            (None, Ok(None)),
            (Some("  "), Ok(None)),
            (
                Some("https://lists.example.org"),
                Ok(Some("https://lists.example.org")),
            ),
            (
                Some("https://example.org/lists"),
                Ok(Some("https://example.org/lists")),
            ),
            (Some("http://lists.example.org"), Err("https://")),
            (Some("https://lists.example.org/"), Err("trailing slash")),
            (Some("https://"), Err("a host")),
            (Some("https://a.example?x=1"), Err("query")),
            (Some(&long), Err("200 characters")),
        ];
        for (given, want) in cases {
            match (web_url(given), want) {
                (Ok(got), Ok(w)) => assert_eq!(got.as_deref(), w, "{given:?}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{given:?}: {e}"),
                (got, want) => panic!("{given:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_lists_message_comes_from_its_request_address() {
        let route = Route {
            deliver_stage: "aliases".into(),
            hostname: "mx.example.org".into(),
        };
        let raw = compose(
            &route,
            "team@example.org",
            "olga@example.org",
            "Moderate team@example.org",
            "Open https://lists.example.org/moderate/link/abc\r\n",
            None,
        )
        .unwrap();
        let text = String::from_utf8(raw).unwrap();
        assert!(
            text.contains("From: <team-request@example.org>\r\n"),
            "{text}"
        );
        assert!(text.contains("To: <olga@example.org>\r\n"), "{text}");
        assert!(text.contains("Auto-Submitted: auto-replied\r\n"), "{text}");
        assert!(text.contains("List-Id: <team.example.org>\r\n"), "{text}");
        assert!(text.contains("@mx.example.org>"), "{text}");
        assert!(
            text.contains("Content-Transfer-Encoding: 7bit\r\n"),
            "{text}"
        );
        assert!(
            text.contains("\r\nOpen https://lists.example.org/moderate/link/abc\r\n"),
            "{text}"
        );
        assert_eq!(
            command_address("team@example.org", "-bounces"),
            "team-bounces@example.org"
        );
    }
}
