//! The `secretary` setting (`pepsi.settings`): a mailbox's confirm-to-send secretary, as
//! stored. Its shape and its check only: validated where it enters (`admin::setting_value`)
//! and by `pepsi-stage-secretary` when it reads it, which alone decides what is held and who
//! is asked (docs/secretary.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The settings name of a mailbox's secretary (`pepsi.settings`).
pub const SECRETARY_SETTING: &str = "secretary";
/// The longest a held message may wait, in days.
pub const MAX_EXPIRE_DAYS: u32 = 90;
/// The longest period between two challenges to one sender, in days.
pub const MAX_CHALLENGE_DAYS: u32 = 90;
/// The longest period between two digests, in days.
pub const MAX_DIGEST_DAYS: u32 = 30;
/// `expire_days` when the setting gives none.
pub const DEFAULT_EXPIRE_DAYS: u32 = 14;
/// `challenge_days` when the setting gives none.
pub const DEFAULT_CHALLENGE_DAYS: u32 = 7;
/// `digest_days` when the setting gives none.
pub const DEFAULT_DIGEST_DAYS: u32 = 1;

/// What becomes of mail that is not challenged: from a sender whose domain did not
/// authenticate it, or a list's, bulk or automatic message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unasked {
    /// Kept with the held mail, in the owner's digest, without a word to the sender.
    #[default]
    Hold,
    /// Delivered to the Junk folder (the stage's JUNK_STAGE).
    Junk,
    /// Delivered as if the sender were trusted.
    Deliver,
}

impl Unasked {
    pub fn as_str(self) -> &'static str {
        match self {
            Unasked::Hold => "hold",
            Unasked::Junk => "junk",
            Unasked::Deliver => "deliver",
        }
    }
}

/// A mailbox's `secretary` setting, as stored (a JSON object; unknown fields refused). Its
/// presence turns the secretary on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secretary {
    /// Mail whose From domain neither SPF nor DKIM vouched for.
    #[serde(default)]
    pub unauthenticated: Unasked,
    /// A list's, bulk or automatic message (RFC 3834, `List-*`, `Precedence`).
    #[serde(default)]
    pub automated: Unasked,
    /// Days a held message waits for a confirmation or the owner before it expires.
    #[serde(default = "default_expire_days")]
    pub expire_days: u32,
    /// Days before the same sender is asked again.
    #[serde(default = "default_challenge_days")]
    pub challenge_days: u32,
    /// Days between two digests of held mail to the owner; 0 sends none.
    #[serde(default = "default_digest_days")]
    pub digest_days: u32,
    /// Postage: a sender may pay this amount (`CURRENCY:VALUE`, as GNU Taler writes it)
    /// instead of confirming. Needs the stage's TALER_MERCHANT_URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postage: Option<String>,
}

fn default_expire_days() -> u32 {
    DEFAULT_EXPIRE_DAYS
}
fn default_challenge_days() -> u32 {
    DEFAULT_CHALLENGE_DAYS
}
fn default_digest_days() -> u32 {
    DEFAULT_DIGEST_DAYS
}

impl Secretary {
    /// The setting in `value`, checked: the error names the field and what it must be.
    pub fn from_value(value: &Value) -> Result<Secretary, String> {
        if !value.is_object() {
            return Err(format!(
                "secretary setting: a JSON object is needed, not {value}"
            ));
        }
        let s: Secretary =
            serde_json::from_value(value.clone()).map_err(|e| format!("secretary setting: {e}"))?;
        if !(1..=MAX_EXPIRE_DAYS).contains(&s.expire_days) {
            return Err(format!(
                "secretary setting: expire_days must be 1 to {MAX_EXPIRE_DAYS}, not {}",
                s.expire_days
            ));
        }
        if !(1..=MAX_CHALLENGE_DAYS).contains(&s.challenge_days) {
            return Err(format!(
                "secretary setting: challenge_days must be 1 to {MAX_CHALLENGE_DAYS}, not {}",
                s.challenge_days
            ));
        }
        if s.digest_days > MAX_DIGEST_DAYS {
            return Err(format!(
                "secretary setting: digest_days must be 0 to {MAX_DIGEST_DAYS}, not {}",
                s.digest_days
            ));
        }
        if let Some(p) = &s.postage {
            Amount::parse(p).map_err(|e| format!("secretary setting: postage: {e}"))?;
        }
        Ok(s)
    }

    /// The postage asked, parsed (checked by `from_value`).
    pub fn postage_amount(&self) -> Option<Amount> {
        self.postage.as_deref().and_then(|p| Amount::parse(p).ok())
    }
}

/// An amount as GNU Taler writes it, `CURRENCY:VALUE` (`KUDOS:0.5`, `EUR:1.20`): a currency
/// of 1 to 12 capital letters or digits (a letter first) and a value with at most 8
/// fractional digits, kept as integer units of 10⁻⁸ so that sums are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount {
    currency: [u8; 12],
    currency_len: u8,
    /// The value in units of 10⁻⁸.
    pub units: u64,
}

/// Units of 10⁻⁸ in one.
pub const AMOUNT_SCALE: u64 = 100_000_000;
/// The largest value an amount may have (Taler's own bound is 2⁵²).
pub const MAX_AMOUNT_VALUE: u64 = 1 << 52;

impl Amount {
    /// `CURRENCY:VALUE`, checked; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Amount, String> {
        let text = text.trim();
        let (currency, value) = text
            .split_once(':')
            .ok_or_else(|| format!("amount {text:?} is not CURRENCY:VALUE"))?;
        let ok_currency = !currency.is_empty()
            && currency.len() <= 12
            && currency.as_bytes()[0].is_ascii_uppercase()
            && currency
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
        if !ok_currency {
            return Err(format!(
                "amount {text:?}: the currency must be 1 to 12 capital letters or digits"
            ));
        }
        let (whole, frac) = value.split_once('.').unwrap_or((value, ""));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || (value.contains('.') && !digits(frac)) || frac.len() > 8 {
            return Err(format!(
                "amount {text:?}: the value must be digits with at most 8 after the point"
            ));
        }
        let whole: u64 = whole
            .parse()
            .ok()
            .filter(|w| *w <= MAX_AMOUNT_VALUE)
            .ok_or_else(|| format!("amount {text:?}: the value is above {MAX_AMOUNT_VALUE}"))?;
        let frac_units: u64 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<8}").parse().unwrap_or(0)
        };
        let mut c = [0u8; 12];
        c[..currency.len()].copy_from_slice(currency.as_bytes());
        Ok(Amount {
            currency: c,
            currency_len: currency.len() as u8,
            units: whole * AMOUNT_SCALE + frac_units,
        })
    }

    /// An amount of `units` (10⁻⁸) of `currency` (checked as `parse` checks it).
    pub fn of(currency: &str, units: u64) -> Result<Amount, String> {
        let mut a = Amount::parse(&format!("{currency}:0"))?;
        a.units = units;
        Ok(a)
    }

    pub fn currency(&self) -> &str {
        std::str::from_utf8(&self.currency[..self.currency_len as usize]).unwrap_or("")
    }

    /// The value as a decimal (`0.5`, `12`), for a database numeric and for display.
    pub fn value_text(&self) -> String {
        let whole = self.units / AMOUNT_SCALE;
        let frac = self.units % AMOUNT_SCALE;
        if frac == 0 {
            whole.to_string()
        } else {
            let f = format!("{frac:08}");
            format!("{whole}.{}", f.trim_end_matches('0'))
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.currency(), self.value_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn amounts_table() {
        for (text, want) in [
            ("KUDOS:1", Some(("KUDOS", 100_000_000, "KUDOS:1"))),
            ("KUDOS:0.5", Some(("KUDOS", 50_000_000, "KUDOS:0.5"))),
            (" EUR:1.20 ", Some(("EUR", 120_000_000, "EUR:1.2"))),
            (
                "TESTKUDOS:0.00000001",
                Some(("TESTKUDOS", 1, "TESTKUDOS:0.00000001")),
            ),
            ("KUDOS:0", Some(("KUDOS", 0, "KUDOS:0"))),
            ("KUDOS", None),
            ("kudos:1", None),
            ("1EUR:1", None),
            (":1", None),
            ("EUR:", None),
            ("EUR:1.", None),
            ("EUR:.5", None),
            ("EUR:-1", None),
            ("EUR:1.123456789", None),
            ("EUR:4503599627370497", None),
            ("ABCDEFGHIJKLM:1", None),
        ] {
            let got = Amount::parse(text)
                .ok()
                .map(|a| (a.currency().to_owned(), a.units, a.to_string()));
            let want = want.map(|(c, u, s)| (c.to_owned(), u, s.to_owned()));
            assert_eq!(got, want, "{text}");
        }
        assert!(Amount::parse("KUDOS:0.5").unwrap() < Amount::parse("KUDOS:1").unwrap());
        assert_eq!(Amount::of("EUR", 5).unwrap().to_string(), "EUR:0.00000005");
    }

    #[test]
    fn secretary_settings_are_checked_where_they_enter() {
        let s = Secretary::from_value(&json!({})).unwrap();
        assert_eq!(
            (
                s.unauthenticated,
                s.automated,
                s.expire_days,
                s.challenge_days,
                s.digest_days
            ),
            (Unasked::Hold, Unasked::Hold, 14, 7, 1)
        );
        let s = Secretary::from_value(&json!({
            "unauthenticated": "junk", "automated": "deliver", "expire_days": 3,
            "challenge_days": 1, "digest_days": 0, "postage": "KUDOS:0.5"
        }))
        .unwrap();
        assert_eq!(s.postage_amount().unwrap().to_string(), "KUDOS:0.5");
        assert_eq!(
            (s.unauthenticated, s.automated, s.digest_days),
            (Unasked::Junk, Unasked::Deliver, 0)
        );
        for (value, error) in [
            (json!({"colour": "red"}), "unknown field `colour`"),
            (
                json!({"unauthenticated": "bounce"}),
                "unknown variant `bounce`",
            ),
            (json!({"expire_days": 0}), "expire_days must be 1 to 90"),
            (json!({"expire_days": 91}), "expire_days must be 1 to 90"),
            (
                json!({"challenge_days": 0}),
                "challenge_days must be 1 to 90",
            ),
            (json!({"digest_days": 31}), "digest_days must be 0 to 30"),
            (
                json!({"postage": "5 euros"}),
                "postage: amount \"5 euros\" is not CURRENCY:VALUE",
            ),
            (json!([]), "secretary setting"),
        ] {
            let e = Secretary::from_value(&value).unwrap_err();
            assert!(e.contains(error), "{value}: {e}");
        }
    }
}
