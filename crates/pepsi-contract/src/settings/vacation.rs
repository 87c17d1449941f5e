//! The `vacation` setting (`pepsi.settings`): an address's automatic reply, as stored. Its
//! shape and its check only: validated where it enters (`admin::setting_value`) and by
//! `pepsi-stage-vacation` when it reads it, which alone decides when and how it replies.

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The settings name of an address's automatic reply (`pepsi.settings`).
pub const VACATION_SETTING: &str = "vacation";
/// The longest reply text, in bytes.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;
/// The longest subject, in characters.
pub const MAX_SUBJECT_CHARS: usize = 200;
/// The longest period between two replies to one sender, in days.
pub const MAX_DAYS: u32 = 365;
/// The most further addresses one reply setting may answer for.
pub const MAX_ADDRESSES: usize = 32;
/// `days` when the setting gives none: a sender hears at most once a week.
pub const DEFAULT_DAYS: u32 = 7;
/// An address's `vacation` setting, as stored (a JSON object; unknown fields refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vacation {
    /// The reply's text (UTF-8).
    pub text: String,
    /// The reply's subject; without it, `Auto: ` and the original's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The first day answered (UTC), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<NaiveDate>,
    /// The last day answered (UTC), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<NaiveDate>,
    /// Days before the same sender is answered again.
    #[serde(default = "default_days")]
    pub days: u32,
    /// Further addresses of the owner that count as addressed in To or Cc (the address
    /// the setting belongs to always does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

fn default_days() -> u32 {
    DEFAULT_DAYS
}

impl Vacation {
    /// The setting in `value`, checked: the error names the field and what it must be.
    pub fn from_value(value: &Value) -> Result<Vacation, String> {
        let v: Vacation =
            serde_json::from_value(value.clone()).map_err(|e| format!("vacation setting: {e}"))?;
        if v.text.trim().is_empty() || v.text.len() > MAX_TEXT_BYTES {
            return Err(format!(
                "vacation setting: text must have 1 to {MAX_TEXT_BYTES} bytes, not {}",
                v.text.len()
            ));
        }
        if v.text.contains('\0') {
            return Err("vacation setting: text must not contain NUL".into());
        }
        if let Some(subject) = &v.subject
            && (subject.chars().count() > MAX_SUBJECT_CHARS
                || subject.chars().any(char::is_control))
        {
            return Err(format!(
                "vacation setting: subject must be one line of at most {MAX_SUBJECT_CHARS} characters"
            ));
        }
        if !(1..=MAX_DAYS).contains(&v.days) {
            return Err(format!(
                "vacation setting: days must be 1 to {MAX_DAYS}, not {}",
                v.days
            ));
        }
        if let (Some(start), Some(end)) = (v.start, v.end)
            && end < start
        {
            return Err(format!(
                "vacation setting: end {end} is before start {start}"
            ));
        }
        if v.addresses.len() > MAX_ADDRESSES {
            return Err(format!(
                "vacation setting: at most {MAX_ADDRESSES} addresses, not {}",
                v.addresses.len()
            ));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vacation_settings_are_checked_where_they_enter() {
        use serde_json::json;
        let day = |s: &str| s.parse::<NaiveDate>().unwrap();
        let v = Vacation::from_value(&json!({"text": "Away."})).unwrap();
        assert_eq!(
            (v.days, v.subject.clone(), v.start, v.end),
            (7, None, None, None)
        );
        let v = Vacation::from_value(&json!({
            "text": "Away.", "subject": "Out", "start": "2026-12-20", "end": "2026-12-31",
            "days": 1, "addresses": ["A.Smith@Example.test"]
        }))
        .unwrap();
        assert_eq!(
            (v.subject.as_deref(), v.start, v.end, v.days),
            (
                Some("Out"),
                Some(day("2026-12-20")),
                Some(day("2026-12-31")),
                1
            )
        );
        assert_eq!(v.addresses, ["A.Smith@Example.test"]);
        // Stored as it was given, defaults filled in.
        assert_eq!(serde_json::to_value(&v).unwrap()["days"], 1);
        let bad = [
            (json!({"subject": "x"}), "missing field `text`"),
            (json!({"text": "  "}), "text must have 1 to"),
            (
                json!({"text": "x", "colour": "red"}),
                "unknown field `colour`",
            ),
            (
                json!({"text": "x", "subject": "a\r\nBcc: e@x"}),
                "subject must be one line",
            ),
            (json!({"text": "x", "days": 0}), "days must be 1 to 365"),
            (json!({"text": "x", "days": 400}), "days must be 1 to 365"),
            (
                json!({"text": "x", "start": "2026-12-31", "end": "2026-12-01"}),
                "is before start",
            ),
            (
                json!({"text": "x", "start": "tomorrow"}),
                "vacation setting:",
            ),
            (
                json!({"text": "x", "addresses": vec!["a@b.test"; 33]}),
                "at most 32 addresses",
            ),
            (json!("away"), "vacation setting:"),
        ];
        for (value, wanted) in bad {
            let e = Vacation::from_value(&value).unwrap_err();
            assert!(e.contains(wanted), "{value}: {e}");
        }
    }
}
