//! The `auto_pay` setting (`pepsi.settings`): a user's consent to pay the postage that a
//! recipient's secretary asks of their outgoing mail, and its limits, as stored. Its shape
//! and its check only: validated where it enters (`admin::setting_value`) and by
//! `pepsi-stage-auto-pay` when it reads it (docs/auto-pay.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::secretary::Amount;

/// The settings name of a user's auto-pay consent (`pepsi.settings`).
pub const AUTO_PAY_SETTING: &str = "auto_pay";

/// A user's `auto_pay` setting, as stored (a JSON object; unknown fields refused). Both
/// limits are in one currency; a request in another is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoPay {
    /// The most one payment may be (`CURRENCY:VALUE`).
    pub per_payment: String,
    /// The most the payments of one calendar month (UTC) may add up to.
    pub per_month: String,
}

impl AutoPay {
    /// The setting in `value`, checked: the error names the field and what it must be.
    pub fn from_value(value: &Value) -> Result<AutoPay, String> {
        if !value.is_object() {
            return Err(format!(
                "auto_pay setting: a JSON object is needed, not {value}"
            ));
        }
        let a: AutoPay =
            serde_json::from_value(value.clone()).map_err(|e| format!("auto_pay setting: {e}"))?;
        let (one, month) = a.limits()?;
        if one.currency() != month.currency() {
            return Err(format!(
                "auto_pay setting: per_payment ({one}) and per_month ({month}) must be in one currency"
            ));
        }
        if one > month {
            return Err(format!(
                "auto_pay setting: per_payment ({one}) is above per_month ({month})"
            ));
        }
        Ok(a)
    }

    /// The two limits, parsed.
    pub fn limits(&self) -> Result<(Amount, Amount), String> {
        let one = Amount::parse(&self.per_payment)
            .map_err(|e| format!("auto_pay setting: per_payment: {e}"))?;
        let month = Amount::parse(&self.per_month)
            .map_err(|e| format!("auto_pay setting: per_month: {e}"))?;
        Ok((one, month))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn auto_pay_settings_are_checked_where_they_enter() {
        let a = AutoPay::from_value(&json!({"per_payment": "KUDOS:1", "per_month": "KUDOS:10"}))
            .unwrap();
        let (one, month) = a.limits().unwrap();
        assert_eq!(
            (one.to_string(), month.to_string()),
            ("KUDOS:1".into(), "KUDOS:10".into())
        );
        for (value, error) in [
            (
                json!({"per_payment": "KUDOS:1"}),
                "missing field `per_month`",
            ),
            (
                json!({"per_payment": "KUDOS:1", "per_month": "EUR:10"}),
                "must be in one currency",
            ),
            (
                json!({"per_payment": "KUDOS:11", "per_month": "KUDOS:10"}),
                "is above per_month",
            ),
            (
                json!({"per_payment": "lots", "per_month": "KUDOS:10"}),
                "per_payment: amount \"lots\"",
            ),
            (
                json!({"per_payment": "KUDOS:1", "per_month": "KUDOS:10", "wallet": "x"}),
                "unknown field `wallet`",
            ),
        ] {
            let e = AutoPay::from_value(&value).unwrap_err();
            assert!(e.contains(error), "{value}: {e}");
        }
    }
}
