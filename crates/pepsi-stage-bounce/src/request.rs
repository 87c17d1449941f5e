//! What the delivery stage asked for: `state.bounce`, `state.dsn` and the recipients, read
//! into a [`Request`], and the RFC 3461 NOTIFY filter. Pure: no I/O.

use chrono::{DateTime, Utc};
use pepsi_contract::state::{Bounce, BounceDetail, DeliveryScratch, Dsn};
use serde_json::{Map, Value};

/// What the notification reports: `bounce.kind`.
pub use pepsi_contract::state::BounceKind as Kind;
/// The message-level RET of RFC 3461: `dsn.ret`.
pub use pepsi_contract::state::Ret;

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
    let bounce = Bounce::from_state(state)
        .map_err(|e| e.to_string())?
        .ok_or("state.bounce is missing: nothing says what to report")?;
    let kind = bounce.kind;
    let dsn = Dsn::from_state(state)
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let last_error = DeliveryScratch::read_last_error(state).map_err(|e| e.to_string())?;
    let top = bounce.detail();
    let mut recipients = Vec::with_capacity(rcpt_to.len());
    for (i, address) in rcpt_to.iter().enumerate() {
        let entry = dsn.rcpt(i);
        let notify = entry
            .and_then(|e| e.notify.as_ref())
            .map(|n| n.iter().map(|k| k.to_ascii_uppercase()).collect());
        let orcpt = entry.and_then(|e| nonblank(e.orcpt.clone()));
        let own = bounce.recipient(address);
        // A recipient's own value wins over the top level's; the error names where it came
        // from.
        let key = |name: &str, own_has: bool| match own {
            Some((addr, _)) if own_has => format!("state.bounce.recipients[{addr:?}].{name}"),
            _ => format!("state.bounce.{name}"),
        };
        let text = |name: &str, f: fn(&BounceDetail) -> &Option<String>| match own
            .and_then(|(_, o)| f(o).clone())
        {
            Some(v) => (nonblank(Some(v)), key(name, true)),
            None => (nonblank(f(&top).clone()), key(name, false)),
        };
        let (smtp_code, smtp_code_key) = match own.and_then(|(_, o)| o.smtp_code) {
            Some(c) => (Some(c), key("smtp_code", true)),
            None => (top.smtp_code, key("smtp_code", false)),
        };
        if let Some(c) = smtp_code.filter(|c| !(200..=599).contains(c)) {
            return Err(format!(
                "{smtp_code_key} is {c}, expected an SMTP reply code 200..599"
            ));
        }
        let status = match text("enhanced_status", |d| &d.enhanced_status) {
            (Some(s), key) => status_of_kind(&s, kind).ok_or_else(|| {
                format!("{key} is {s:?}, expected an RFC 3463 status such as 5.1.1")
            })?,
            (None, _) => format!("{}.0.0", kind.class()),
        };
        let action = match text("action", |d| &d.action) {
            (None, _) => kind.action(),
            (Some(a), key) => action_of_kind(&a, kind).ok_or_else(|| {
                format!(
                    "{key} is {a:?}, which a {} notification cannot report",
                    kind.name()
                )
            })?,
        };
        let will_retry_until = match text("will_retry_until", |d| &d.will_retry_until) {
            (None, _) => None,
            (Some(t), key) => Some(
                DateTime::parse_from_rfc3339(&t)
                    .map_err(|e| format!("{key} is {t:?}, expected an RFC 3339 time: {e}"))?
                    .with_timezone(&Utc),
            ),
        };
        let mut diagnostic = text("diagnostic", |d| &d.diagnostic).0;
        if diagnostic.is_none() && kind == Kind::Delay {
            diagnostic = nonblank(last_error.clone());
        }
        recipients.push(Recipient {
            address: address.clone(),
            orcpt,
            notify,
            status,
            action,
            remote_mta: text("remote_mta", |d| &d.remote_mta).0,
            smtp_code,
            reply_text: text("reply_text", |d| &d.reply_text).0,
            diagnostic,
            phase: text("phase", |d| &d.phase).0,
            will_retry_until,
        });
    }
    Ok(Request {
        kind,
        ret: dsn.ret,
        envid: nonblank(dsn.envid),
        stage: bounce.stage,
        recipients,
    })
}

/// Text that says something: blank text counts as not given.
fn nonblank(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
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
            (
                json!({"bounce": "permanent"}),
                "state.bounce: invalid type: string",
            ),
            (json!({"bounce": {}}), "state.bounce: missing field `kind`"),
            (
                json!({"bounce": {"kind": "soft"}}),
                "state.bounce.kind: unknown variant `soft`",
            ),
            (
                json!({"bounce": {"kind": "permanent", "smtp_code": "550"}}),
                "state.bounce.smtp_code: invalid type: string",
            ),
            (
                json!({"bounce": {"kind": "permanent", "smtp_code": 99}}),
                "state.bounce.smtp_code is 99, expected an SMTP reply code",
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
                "state.bounce.recipients[\"b@example.org\"].smtp_code is 99",
            ),
            (
                json!({"bounce": {"kind": "permanent", "recipients": {"B@example.org": {"action": "x"}}}}),
                "state.bounce.recipients[\"B@example.org\"].action is \"x\"",
            ),
            (
                json!({"bounce": {"kind": "permanent", "recipients": {"b@example.org": 5}}}),
                "state.bounce.recipients[\"b@example.org\"]: invalid type: integer",
            ),
            (
                json!({"bounce": {"kind": "permanent"}, "dsn": {"ret": "BODY"}}),
                "state.dsn.ret: invalid value: string \"BODY\"",
            ),
            (
                json!({"bounce": {"kind": "permanent"}, "dsn": {"rcpt": [{"notify": "NEVER"}]}}),
                "state.dsn.rcpt[0].notify: invalid type: string",
            ),
            (
                json!({"bounce": {"kind": "delay"}, "last_error": 4}),
                "state.last_error: invalid type: integer",
            ),
            (
                json!({"bounce": {"kind": "delay", "will_retry_until": "tomorrow"}}),
                "state.bounce.will_retry_until is \"tomorrow\", expected an RFC 3339 time",
            ),
        ];
        for (st, want) in cases {
            let err = parse(&state(st.clone()), &rcpt(&["b@example.org"])).unwrap_err();
            assert!(err.contains(want), "{st}: {err:?} should contain {want:?}");
        }
    }
}
