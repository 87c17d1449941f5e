//! The auto-pay stage's decisions, apart from the database and the helper: what a challenge
//! asks (its postage request), who the payee and the merchant are, and whether a payment
//! fits the user's limits. Pure; tested as tables.

use pepsi_contract::settings::auto_pay::AutoPay;
use pepsi_contract::settings::secretary::Amount;
use pepsi_secretary::mail::{POSTAGE_AMOUNT_FIELD, POSTAGE_FIELD};
use pepsi_secretary::taler::is_pay_uri;

/// A challenge's postage request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Postage {
    pub uri: String,
    pub amount: Amount,
    /// The merchant backend's host (and path) and the order, from the URI.
    pub merchant: String,
    pub order_id: String,
}

/// The postage request a message carries: `None` when it has no `X-Pepsi-Postage` field,
/// an error (said in words for the user) when it has one that is not a request.
pub fn postage(headers: &[u8]) -> Result<Option<Postage>, String> {
    let values = pepsi_contract::message::field_values(headers, POSTAGE_FIELD);
    let Some(uri) = values.first().map(|v| v.trim().to_owned()) else {
        return Ok(None);
    };
    if values.len() > 1 {
        return Err(format!(
            "the challenge has {} {POSTAGE_FIELD} fields",
            values.len()
        ));
    }
    if !is_pay_uri(&uri) {
        return Err(format!("{POSTAGE_FIELD} is not a taler://pay/ URI"));
    }
    let (merchant, order_id) =
        merchant_and_order(&uri).ok_or_else(|| format!("{POSTAGE_FIELD} names no order"))?;
    let amount = pepsi_contract::message::field_values(headers, POSTAGE_AMOUNT_FIELD)
        .first()
        .ok_or_else(|| format!("the challenge has no {POSTAGE_AMOUNT_FIELD}"))
        .and_then(|a| Amount::parse(a).map_err(|e| format!("{POSTAGE_AMOUNT_FIELD}: {e}")))?;
    Ok(Some(Postage {
        uri,
        amount,
        merchant,
        order_id,
    }))
}

/// The merchant and the order of `taler://pay/{merchant host[/instance path]}/{order
/// id}/{session id}[?query]`: the order is the second segment from the end.
pub fn merchant_and_order(uri: &str) -> Option<(String, String)> {
    let rest = uri.get(12..)?;
    let path = rest.split(['?', '#']).next()?;
    let segments: Vec<&str> = path.split('/').collect();
    if segments.len() < 3 {
        return None;
    }
    let order = segments[segments.len() - 2];
    let merchant = segments[..segments.len() - 2].join("/");
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b'/')
            })
    };
    (ok(order) && !order.contains(['/', ':']) && ok(&merchant) && !merchant.starts_with('/'))
        .then(|| (merchant.to_ascii_lowercase(), order.to_owned()))
}

/// Why a payment is not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The request is not one (said in words).
    Malformed(String),
    /// The payee is not someone the user wrote to lately.
    UnknownPayee(String),
    /// Neither SPF nor DKIM vouched for the payee's domain: the challenge may be forged.
    Unauthenticated(String),
    /// The request is in another currency than the limits.
    Currency { asked: Amount, limit: Amount },
    /// Above the limit of one payment.
    OverPayment { asked: Amount, limit: Amount },
    /// The month's payments would pass the monthly limit.
    OverMonth {
        asked: Amount,
        spent: Amount,
        limit: Amount,
    },
}

impl Refusal {
    /// The reason, for the user's notice and the payments' table.
    pub fn reason(&self) -> String {
        match self {
            Refusal::Malformed(why) => format!("malformed request: {why}"),
            Refusal::UnknownPayee(p) => {
                format!("unknown payee: you have not written to {p} lately")
            }
            Refusal::Unauthenticated(p) => format!(
                "the request may be forged: neither SPF nor DKIM vouched that it comes from {p}"
            ),
            Refusal::Currency { asked, limit } => {
                format!("{asked} is not in the currency of your limits ({limit})")
            }
            Refusal::OverPayment { asked, limit } => {
                format!("{asked} is above your limit of {limit} a payment")
            }
            Refusal::OverMonth {
                asked,
                spent,
                limit,
            } => format!(
                "{asked} would take this month's payments ({spent} so far) above your limit of {limit}"
            ),
        }
    }
}

/// Whether `asked` fits `setting`'s limits, `spent` (in the limits' currency) being what the
/// month's payments add up to.
pub fn budget(setting: &AutoPay, asked: &Amount, spent_units: u64) -> Result<(), Refusal> {
    let (one, month) = setting.limits().map_err(Refusal::Malformed)?;
    if asked.currency() != one.currency() {
        return Err(Refusal::Currency {
            asked: *asked,
            limit: one,
        });
    }
    if asked.units > one.units {
        return Err(Refusal::OverPayment {
            asked: *asked,
            limit: one,
        });
    }
    if spent_units.saturating_add(asked.units) > month.units {
        let spent = Amount::of(month.currency(), spent_units).map_err(Refusal::Malformed)?;
        return Err(Refusal::OverMonth {
            asked: *asked,
            spent,
            limit: month,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn postage_requests_table() {
        let h = |s: &str| s.replace('\n', "\r\n");
        let ok = postage(
            h("X-Pepsi-Postage: taler://pay/127.0.0.1:9966/o-1/\nX-Pepsi-Postage-Amount: KUDOS:0.5\n")
                .as_bytes(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                ok.merchant.as_str(),
                ok.order_id.as_str(),
                ok.amount.to_string()
            ),
            ("127.0.0.1:9966", "o-1", "KUDOS:0.5".to_owned())
        );
        assert_eq!(postage(b"Subject: hi\r\n"), Ok(None));
        for (headers, error) in [
            (
                "X-Pepsi-Postage: https://x/\nX-Pepsi-Postage-Amount: KUDOS:1\n",
                "is not a taler://pay/ URI",
            ),
            (
                "X-Pepsi-Postage: taler://pay/m.test/o-1/\n",
                "has no X-Pepsi-Postage-Amount",
            ),
            (
                "X-Pepsi-Postage: taler://pay/m.test/o-1/\nX-Pepsi-Postage-Amount: lots\n",
                "X-Pepsi-Postage-Amount: amount",
            ),
            (
                "X-Pepsi-Postage: taler://pay/o-1\nX-Pepsi-Postage-Amount: KUDOS:1\n",
                "names no order",
            ),
            (
                "X-Pepsi-Postage: taler://pay/a.test/o/\nX-Pepsi-Postage: taler://pay/b.test/o/\nX-Pepsi-Postage-Amount: KUDOS:1\n",
                "has 2 X-Pepsi-Postage fields",
            ),
        ] {
            let e = postage(h(headers).as_bytes()).unwrap_err();
            assert!(e.contains(error), "{headers}: {e}");
        }
    }

    #[test]
    fn merchants_and_orders_table() {
        for (uri, want) in [
            (
                "taler://pay/backend.test/2026.1-AB/",
                Some(("backend.test", "2026.1-AB")),
            ),
            (
                "taler://pay/backend.test/instances/mail/o-7/sess?c=TOKEN",
                Some(("backend.test/instances/mail", "o-7")),
            ),
            (
                "taler://pay/Backend.Test:8443/o/",
                Some(("backend.test:8443", "o")),
            ),
            ("taler://pay/backend.test/", None),
            ("taler://pay//o/", None),
            ("taler://pay/backend.test/o%2F/", None),
        ] {
            let got = merchant_and_order(uri);
            assert_eq!(
                got.as_ref().map(|(m, o)| (m.as_str(), o.as_str())),
                want,
                "{uri}"
            );
        }
    }

    #[test]
    fn budget_table() {
        let setting =
            AutoPay::from_value(&json!({"per_payment": "KUDOS:1", "per_month": "KUDOS:2"}))
                .unwrap();
        let a = |s: &str| Amount::parse(s).unwrap();
        let units = |s: &str| a(s).units;
        assert_eq!(budget(&setting, &a("KUDOS:0.5"), 0), Ok(()));
        assert_eq!(budget(&setting, &a("KUDOS:1"), units("KUDOS:1")), Ok(()));
        let cases = [
            (
                a("EUR:0.5"),
                0,
                "is not in the currency of your limits (KUDOS:1)",
            ),
            (
                a("KUDOS:1.5"),
                0,
                "KUDOS:1.5 is above your limit of KUDOS:1 a payment",
            ),
            (
                a("KUDOS:1"),
                units("KUDOS:1.5"),
                "KUDOS:1 would take this month's payments (KUDOS:1.5 so far) above your limit of KUDOS:2",
            ),
        ];
        for (asked, spent, reason) in cases {
            let r = budget(&setting, &asked, spent).unwrap_err().reason();
            assert!(r.contains(reason), "{asked}: {r}");
        }
        assert!(
            Refusal::UnknownPayee("bob@b.test".into())
                .reason()
                .contains("not written to bob@b.test")
        );
    }
}
