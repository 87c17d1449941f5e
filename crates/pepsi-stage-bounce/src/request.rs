//! What the delivery stage asked for: `state.bounce`, `state.dsn` and the recipients, read
//! into a [`Request`], and the RFC 3461 NOTIFY filter. Pure: no I/O.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// What the notification reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Delivery failed for good (`Action: failed`).
    Permanent,
    /// Delivery has not succeeded yet and is being retried (`Action: delayed`).
    Delay,
    /// Delivered (`Action: delivered`, or `relayed`/`expanded` when the state says so).
    Success,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "permanent" => Some(Kind::Permanent),
            "delay" => Some(Kind::Delay),
            "success" => Some(Kind::Success),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Permanent => "permanent",
            Kind::Delay => "delay",
            Kind::Success => "success",
        }
    }

    /// The RFC 3463 class digit a Status of this kind must have.
    pub fn class(self) -> char {
        match self {
            Kind::Permanent => '5',
            Kind::Delay => '4',
            Kind::Success => '2',
        }
    }

    /// The RFC 3464 Action when the state names none.
    pub fn action(self) -> &'static str {
        match self {
            Kind::Permanent => "failed",
            Kind::Delay => "delayed",
            Kind::Success => "delivered",
        }
    }
}

/// The message-level RET of RFC 3461.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ret {
    Full,
    Headers,
}

/// One recipient the notification reports on, with the per-recipient overrides applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipient {
    /// The envelope recipient (`Final-Recipient`).
    pub address: String,
    /// `dsn.rcpt[i].orcpt`: `addr-type;address`, xtext-decoded.
    pub orcpt: Option<String>,
    /// `dsn.rcpt[i].notify`: None when the client gave no NOTIFY.
    pub notify: Option<Vec<String>>,
    /// `Status`, already forced into the kind's class.
    pub status: String,
    pub action: &'static str,
    pub remote_mta: Option<String>,
    pub smtp_code: Option<u16>,
    pub reply_text: Option<String>,
    pub diagnostic: Option<String>,
    pub phase: Option<String>,
    pub will_retry_until: Option<DateTime<Utc>>,
}

/// Everything the state says about the notification to build.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub kind: Kind,
    pub ret: Option<Ret>,
    pub envid: Option<String>,
    /// The stage that routed the message here.
    pub stage: Option<String>,
    pub recipients: Vec<Recipient>,
}

/// Reads the request from the row's state and recipients. An error names the state key that
/// is missing or malformed (a delivery stage's bug, for an operator).
pub fn parse(state: &Map<String, Value>, rcpt_to: &[String]) -> Result<Request, String> {
    let bounce = match state.get("bounce") {
        Some(Value::Object(b)) => b,
        Some(other) => return Err(format!("state.bounce is {other}, expected an object")),
        None => return Err("state.bounce is missing: nothing says what to report".into()),
    };
    let kind = match bounce.get("kind") {
        Some(Value::String(k)) => Kind::parse(k).ok_or_else(|| {
            format!("state.bounce.kind is {k:?}, expected \"permanent\", \"delay\" or \"success\"")
        })?,
        Some(other) => {
            return Err(format!(
                "state.bounce.kind is {other}, expected \"permanent\", \"delay\" or \"success\""
            ));
        }
        None => return Err("state.bounce.kind is missing".into()),
    };
    let dsn = state.get("dsn").and_then(Value::as_object);
    let ret = match dsn.and_then(|d| d.get("ret")) {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if r.eq_ignore_ascii_case("FULL") => Some(Ret::Full),
        Some(Value::String(r)) if r.eq_ignore_ascii_case("HDRS") => Some(Ret::Headers),
        Some(other) => {
            return Err(format!(
                "state.dsn.ret is {other}, expected \"FULL\", \"HDRS\" or null"
            ));
        }
    };
    let envid = opt_string(dsn.and_then(|d| d.get("envid")), "state.dsn.envid")?;
    let dsn_rcpt = dsn.and_then(|d| d.get("rcpt")).and_then(Value::as_array);
    let overrides = match bounce.get("recipients") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => {
            return Err(format!(
                "state.bounce.recipients is {other}, expected an object keyed by recipient"
            ));
        }
    };
    let last_error = state.get("last_error").and_then(Value::as_str);
    let mut recipients = Vec::with_capacity(rcpt_to.len());
    for (i, address) in rcpt_to.iter().enumerate() {
        let entry = dsn_rcpt.and_then(|r| r.get(i)).and_then(Value::as_object);
        let notify = match entry.and_then(|e| e.get("notify")) {
            None | Some(Value::Null) => None,
            Some(Value::Array(n)) => Some(
                n.iter()
                    .map(|v| v.as_str().map(str::to_ascii_uppercase))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        format!("state.dsn.rcpt[{i}].notify has a non-text entry: {n:?}")
                    })?,
            ),
            Some(other) => {
                return Err(format!(
                    "state.dsn.rcpt[{i}].notify is {other}, expected a list or null"
                ));
            }
        };
        let orcpt = opt_string(
            entry.and_then(|e| e.get("orcpt")),
            &format!("state.dsn.rcpt[{i}].orcpt"),
        )?;
        let own = overrides.and_then(|m| {
            m.get(address).or_else(|| {
                m.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(address))
                    .map(|(_, v)| v)
            })
        });
        let own = match own {
            None => None,
            Some(Value::Object(o)) => Some(o),
            Some(other) => {
                return Err(format!(
                    "state.bounce.recipients[{address:?}] is {other}, expected an object"
                ));
            }
        };
        let field = |name: &str| -> Result<Option<&Value>, String> {
            Ok(own
                .and_then(|o| o.get(name))
                .filter(|v| !v.is_null())
                .or_else(|| bounce.get(name).filter(|v| !v.is_null())))
        };
        let key = |name: &str| match own.and_then(|o| o.get(name)).filter(|v| !v.is_null()) {
            Some(_) => format!("state.bounce.recipients[{address:?}].{name}"),
            None => format!("state.bounce.{name}"),
        };
        let text = |name: &str| opt_string(field(name)?, &key(name));
        let smtp_code = match field("smtp_code")? {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|c| (200..=599).contains(c))
                    .map(|c| c as u16)
                    .ok_or_else(|| {
                        format!(
                            "{} is {v}, expected an SMTP reply code 200..599",
                            key("smtp_code")
                        )
                    })?,
            ),
        };
        let status = match text("enhanced_status")? {
            Some(s) => status_of_kind(&s, kind).ok_or_else(|| {
                format!(
                    "{} is {s:?}, expected an RFC 3463 status such as 5.1.1",
                    key("enhanced_status")
                )
            })?,
            None => format!("{}.0.0", kind.class()),
        };
        let action = match text("action")? {
            None => kind.action(),
            Some(a) => action_of_kind(&a, kind).ok_or_else(|| {
                format!(
                    "{} is {a:?}, which a {} notification cannot report",
                    key("action"),
                    kind.name()
                )
            })?,
        };
        let will_retry_until = match text("will_retry_until")? {
            None => None,
            Some(t) => Some(
                DateTime::parse_from_rfc3339(&t)
                    .map_err(|e| {
                        format!(
                            "{} is {t:?}, expected an RFC 3339 time: {e}",
                            key("will_retry_until")
                        )
                    })?
                    .with_timezone(&Utc),
            ),
        };
        let mut diagnostic = text("diagnostic")?;
        if diagnostic.is_none() && kind == Kind::Delay {
            diagnostic = last_error.map(str::to_owned);
        }
        recipients.push(Recipient {
            address: address.clone(),
            orcpt,
            notify,
            status,
            action,
            remote_mta: text("remote_mta")?,
            smtp_code,
            reply_text: text("reply_text")?,
            diagnostic,
            phase: text("phase")?,
            will_retry_until,
        });
    }
    Ok(Request {
        kind,
        ret,
        envid,
        stage: bounce
            .get("stage")
            .and_then(Value::as_str)
            .map(str::to_owned),
        recipients,
    })
}

fn opt_string(v: Option<&Value>, key: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{key} is {other}, expected text")),
    }
}

/// An RFC 3463 status `class.subject.detail`, its class forced to the kind's: a permanent
/// failure after a run of 4.4.1 deferrals is reported as 5.4.1, as the delivery stage meant
/// "failed for good" whatever the last reply's class. None when it is not a status at all.
pub fn status_of_kind(status: &str, kind: Kind) -> Option<String> {
    let parts: Vec<&str> = status.trim().split('.').collect();
    let digits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    match parts.as_slice() {
        [class, subject, detail]
            if matches!(*class, "2" | "4" | "5") && digits(subject, 3) && digits(detail, 3) =>
        {
            Some(format!("{}.{subject}.{detail}", kind.class()))
        }
        _ => None,
    }
}

fn action_of_kind(action: &str, kind: Kind) -> Option<&'static str> {
    let a = action.to_ascii_lowercase();
    match (kind, a.as_str()) {
        (Kind::Permanent, "failed") => Some("failed"),
        (Kind::Delay, "delayed") => Some("delayed"),
        (Kind::Success, "delivered") => Some("delivered"),
        (Kind::Success, "relayed") => Some("relayed"),
        (Kind::Success, "expanded") => Some("expanded"),
        _ => None,
    }
}

/// RFC 3461 §4.1: does a recipient with this NOTIFY get a notification of this kind?
///
/// - `NEVER` never does.
/// - A permanent failure is reported when NOTIFY was not given or lists FAILURE.
/// - A delay is reported when NOTIFY lists DELAY, or when NOTIFY was not given and
///   `delay_without_notify` (the `DELAY_WITHOUT_NOTIFY` option) is on.
/// - A success is reported only when NOTIFY lists SUCCESS.
pub fn wanted(kind: Kind, notify: Option<&[String]>, delay_without_notify: bool) -> bool {
    let has = |k: &str| notify.is_some_and(|n| n.iter().any(|v| v.eq_ignore_ascii_case(k)));
    if has("NEVER") {
        return false;
    }
    let given = notify.is_some_and(|n| !n.is_empty());
    match kind {
        Kind::Permanent => !given || has("FAILURE"),
        Kind::Delay => has("DELAY") || (!given && delay_without_notify),
        Kind::Success => has("SUCCESS"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn n(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn notify_filter_table() {
        use Kind::*;
        let cases: &[(Kind, Option<&[&str]>, bool, bool)] = &[
            // kind, NOTIFY, DELAY_WITHOUT_NOTIFY, wanted
            (Permanent, None, true, true),
            (Permanent, Some(&[]), true, true),
            (Permanent, Some(&["FAILURE"]), true, true),
            (Permanent, Some(&["SUCCESS", "FAILURE"]), true, true),
            (Permanent, Some(&["SUCCESS"]), true, false),
            (Permanent, Some(&["DELAY"]), true, false),
            (Permanent, Some(&["NEVER"]), true, false),
            (Permanent, Some(&["never"]), true, false),
            (Delay, None, true, true),
            (Delay, None, false, false),
            (Delay, Some(&["DELAY"]), false, true),
            (Delay, Some(&["FAILURE"]), true, false),
            (Delay, Some(&["NEVER"]), true, false),
            (Success, None, true, false),
            (Success, Some(&["FAILURE"]), true, false),
            (Success, Some(&["SUCCESS"]), true, true),
            (Success, Some(&["success", "delay"]), true, true),
            (Success, Some(&["NEVER"]), true, false),
        ];
        for &(kind, notify, delay_default, want) in cases {
            let notify = notify.map(n);
            assert_eq!(
                wanted(kind, notify.as_deref(), delay_default),
                want,
                "{kind:?} NOTIFY={notify:?} DELAY_WITHOUT_NOTIFY={delay_default}"
            );
        }
    }

    #[test]
    fn status_table() {
        let cases = [
            ("5.1.1", Kind::Permanent, Some("5.1.1")),
            ("4.4.1", Kind::Permanent, Some("5.4.1")),
            ("5.7.1", Kind::Delay, Some("4.7.1")),
            ("2.0.0", Kind::Success, Some("2.0.0")),
            (" 5.1.10 ", Kind::Permanent, Some("5.1.10")),
            ("550", Kind::Permanent, None),
            ("3.1.1", Kind::Permanent, None),
            ("5.1", Kind::Permanent, None),
            ("5.x.1", Kind::Permanent, None),
            ("5.1.1234", Kind::Permanent, None),
        ];
        for (input, kind, want) in cases {
            assert_eq!(
                status_of_kind(input, kind).as_deref(),
                want,
                "{input:?} {kind:?}"
            );
        }
    }

    fn state(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn rcpt(list: &[&str]) -> Vec<String> {
        n(list)
    }

    #[test]
    fn per_recipient_values_come_from_dsn_rcpt_and_the_recipients_map() {
        let st = state(json!({
            "dsn": {"ret": "full", "envid": "ENV-1", "rcpt": [
                {"notify": ["failure"], "orcpt": "rfc822;B@example.org"},
                {"notify": null, "orcpt": null}]},
            "bounce": {"kind": "permanent", "diagnostic": "mailbox unavailable",
                "enhanced_status": "5.0.0", "remote_mta": "mx.example.org", "smtp_code": 550,
                "reply_text": "no", "phase": "RCPT", "stage": "relay",
                "recipients": {"C@example.org": {"enhanced_status": "5.2.2", "smtp_code": 552,
                    "reply_text": "mailbox full"}}}
        }));
        let r = parse(&st, &rcpt(&["b@example.org", "c@example.org"])).unwrap();
        assert_eq!(r.kind, Kind::Permanent);
        assert_eq!(r.ret, Some(Ret::Full));
        assert_eq!(r.envid.as_deref(), Some("ENV-1"));
        assert_eq!(r.stage.as_deref(), Some("relay"));
        let (b, c) = (&r.recipients[0], &r.recipients[1]);
        assert_eq!(b.notify, Some(n(&["FAILURE"])));
        assert_eq!(b.orcpt.as_deref(), Some("rfc822;B@example.org"));
        assert_eq!(
            (b.status.as_str(), b.smtp_code, b.reply_text.as_deref()),
            ("5.0.0", Some(550), Some("no"))
        );
        assert_eq!(c.notify, None);
        assert_eq!(
            (c.status.as_str(), c.smtp_code, c.reply_text.as_deref()),
            ("5.2.2", Some(552), Some("mailbox full")),
            "the recipients map overrides, matching the address in any case"
        );
        assert_eq!(c.remote_mta.as_deref(), Some("mx.example.org"));
        assert_eq!(c.action, "failed");
    }

    #[test]
    fn defaults_when_the_state_says_little() {
        let st = state(json!({"bounce": {"kind": "delay"}, "last_error": "connection refused"}));
        let r = parse(&st, &rcpt(&["b@example.org"])).unwrap();
        assert_eq!((r.ret, r.envid.clone()), (None, None));
        let b = &r.recipients[0];
        assert_eq!((b.status.as_str(), b.action), ("4.0.0", "delayed"));
        assert_eq!(b.diagnostic.as_deref(), Some("connection refused"));
        assert_eq!(b.notify, None);

        let st = state(json!({"bounce": {"kind": "success", "action": "relayed",
            "will_retry_until": "2030-01-02T03:04:05Z"}}));
        let b = parse(&st, &rcpt(&["b@example.org"])).unwrap().recipients[0].clone();
        assert_eq!((b.status.as_str(), b.action), ("2.0.0", "relayed"));
        assert!(b.will_retry_until.is_some());
    }

    #[test]
    fn malformed_state_is_an_error_naming_the_key() {
        let cases = [
            (json!({}), "state.bounce is missing"),
            (json!({"bounce": {}}), "state.bounce.kind is missing"),
            (
                json!({"bounce": {"kind": "soft"}}),
                "state.bounce.kind is \"soft\"",
            ),
            (
                json!({"bounce": {"kind": "permanent", "smtp_code": "550"}}),
                "state.bounce.smtp_code",
            ),
            (
                json!({"bounce": {"kind": "permanent", "enhanced_status": "550"}}),
                "state.bounce.enhanced_status is \"550\"",
            ),
            (
                json!({"bounce": {"kind": "permanent", "action": "delivered"}}),
                "cannot report",
            ),
            (
                json!({"bounce": {"kind": "permanent", "recipients": {"b@example.org": {"smtp_code": 99}}}}),
                "state.bounce.recipients[\"b@example.org\"].smtp_code",
            ),
            (
                json!({"bounce": {"kind": "permanent"}, "dsn": {"ret": "BODY"}}),
                "state.dsn.ret",
            ),
            (
                json!({"bounce": {"kind": "delay", "will_retry_until": "tomorrow"}}),
                "will_retry_until",
            ),
        ];
        for (st, want) in cases {
            let err = parse(&state(st.clone()), &rcpt(&["b@example.org"])).unwrap_err();
            assert!(err.contains(want), "{st}: {err:?} should contain {want:?}");
        }
    }
}
