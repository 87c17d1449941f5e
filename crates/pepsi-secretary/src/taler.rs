//! Postage through a GNU Taler merchant backend: the two endpoints of its HTTP API that a
//! secretary needs, spoken directly with the workspace's HTTP client (the Taler libraries
//! are not reachable from this project's registries):
//!
//! - `POST {base}private/orders` with `{"order": {"amount", "summary"}, "create_token":
//!   false}` creates an order and answers its `order_id`;
//! - `GET {base}private/orders/{order_id}` answers its `order_status` (`unpaid` with the
//!   `taler_pay_uri` a wallet pays, `claimed`, or `paid`).
//!
//! `base` is the instance's base URL (`[stage-<name>] TALER_MERCHANT_URL`, ending in `/`),
//! and the backend's access token, when configured, goes in `Authorization: Bearer`. Every
//! request has a deadline and every answer a size bound. Errors tell a temporary failure
//! (the backend away or failing: try again later) from a permanent one (it refused the
//! request or answered something that is not the API).

use std::time::Duration;

use pepsi_contract::settings::secretary::Amount;
use serde::Deserialize;
use serde_json::json;

/// The most a backend's answer may hold.
pub const MAX_ANSWER: usize = 64 * 1024;
/// The longest order id kept (the table's bound).
pub const MAX_ORDER_ID: usize = 200;
/// The longest pay URI kept (the table's bound).
pub const MAX_PAY_URI: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum TalerError {
    /// The backend could not be reached, timed out, or failed (5xx, 429): later.
    #[error("merchant backend {url}: {reason}")]
    Temporary { url: String, reason: String },
    /// It refused the request or answered something else than its API.
    #[error("merchant backend {url}: {reason}")]
    Permanent { url: String, reason: String },
}

impl TalerError {
    pub fn is_temporary(&self) -> bool {
        matches!(self, TalerError::Temporary { .. })
    }
}

/// An order's state as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderStatus {
    /// Not paid; a wallet pays it through `pay_uri` (`taler://pay/…`).
    Unpaid {
        pay_uri: String,
    },
    /// A wallet claimed it and may be paying.
    Claimed,
    Paid,
}

/// A merchant backend: its instance's base URL, its token and a client.
#[derive(Debug, Clone)]
pub struct Merchant {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct Created {
    order_id: String,
}

#[derive(Deserialize)]
struct Status {
    order_status: String,
    #[serde(default)]
    taler_pay_uri: Option<String>,
}

/// The base URL as configured, checked: `http://` or `https://`, a host, ending in `/`
/// (added when missing), at most 300 characters; the error says what is wrong.
pub fn base_url(text: &str) -> Result<String, String> {
    let t = text.trim();
    let rest = t
        .strip_prefix("https://")
        .or_else(|| t.strip_prefix("http://"))
        .ok_or_else(|| format!("merchant URL {t:?} must start with https:// or http://"))?;
    if rest.is_empty() || rest.starts_with('/') || t.len() > 300 {
        return Err(format!(
            "merchant URL {t:?} needs a host and at most 300 characters"
        ));
    }
    if t.chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '?' | '#' | '"'))
    {
        return Err(format!(
            "merchant URL {t:?} may not hold spaces, a query or a fragment"
        ));
    }
    Ok(if t.ends_with('/') {
        t.to_owned()
    } else {
        format!("{t}/")
    })
}

impl Merchant {
    /// A client of the backend at `base` (checked by [`base_url`]), with `token` and a
    /// deadline of `timeout` on every request.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Merchant, String> {
        let base = base_url(base)?;
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Merchant {
            base,
            token: token.filter(|t| !t.trim().is_empty()),
            client,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn answer<T: serde::de::DeserializeOwned>(
        &self,
        url: String,
        sent: reqwest::RequestBuilder,
    ) -> Result<T, TalerError> {
        let temporary = |reason: String| TalerError::Temporary {
            url: url.clone(),
            reason,
        };
        let permanent = |reason: String| TalerError::Permanent {
            url: url.clone(),
            reason,
        };
        let mut response = sent.send().await.map_err(|e| temporary(e.to_string()))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| temporary(e.to_string()))?
        {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(permanent(format!("answer above {MAX_ANSWER} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        let said = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(temporary(format!("HTTP {status}: {}", said())));
        }
        if !status.is_success() {
            return Err(permanent(format!("HTTP {status}: {}", said())));
        }
        serde_json::from_slice(&body)
            .map_err(|e| permanent(format!("answer is not the API's: {e}: {}", said())))
    }

    /// Creates an order of `amount` with `summary` (what the payer's wallet shows) and
    /// answers its id.
    pub async fn create_order(&self, amount: &Amount, summary: &str) -> Result<String, TalerError> {
        let path = "private/orders";
        let body = json!({
            "order": {"amount": amount.to_string(), "summary": summary},
            "create_token": false,
        });
        let sent = self
            .request(reqwest::Method::POST, path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        let created: Created = self.answer(format!("{}{path}", self.base), sent).await?;
        check_order_id(&created.order_id).map_err(|reason| TalerError::Permanent {
            url: format!("{}{path}", self.base),
            reason,
        })?;
        Ok(created.order_id)
    }

    /// The state of order `order_id`.
    pub async fn order_status(&self, order_id: &str) -> Result<OrderStatus, TalerError> {
        let url = format!("{}private/orders/{order_id}", self.base);
        let permanent = |reason: String| TalerError::Permanent {
            url: url.clone(),
            reason,
        };
        check_order_id(order_id).map_err(permanent)?;
        let sent = self.request(reqwest::Method::GET, &format!("private/orders/{order_id}"));
        let status: Status = self.answer(url.clone(), sent).await?;
        match status.order_status.as_str() {
            "paid" => Ok(OrderStatus::Paid),
            "claimed" => Ok(OrderStatus::Claimed),
            "unpaid" => {
                let pay_uri = status
                    .taler_pay_uri
                    .filter(|u| is_pay_uri(u))
                    .ok_or_else(|| permanent("unpaid order without a taler://pay/ URI".into()))?;
                Ok(OrderStatus::Unpaid { pay_uri })
            }
            other => Err(permanent(format!(
                "order status {other:?} is not the API's"
            ))),
        }
    }
}

/// An order id as the backend may name one: 1 to 200 characters of letters, digits and
/// `-_.~` (it goes into a URL path and a table).
pub fn check_order_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ORDER_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "order id {id:?} is not 1 to {MAX_ORDER_ID} letters, digits or -_.~"
        ))
    }
}

/// Whether `uri` is a `taler://pay/` URI fit to mail: at most 2000 printable ASCII
/// characters without spaces.
pub fn is_pay_uri(uri: &str) -> bool {
    let lower = uri.get(..12).map(str::to_ascii_lowercase);
    lower.as_deref() == Some("taler://pay/")
        && uri.len() <= MAX_PAY_URI
        && uri.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merchant_urls_table() {
        for (text, want) in [
            ("https://backend.example/", Some("https://backend.example/")),
            (
                " http://127.0.0.1:9966/instances/mail ",
                Some("http://127.0.0.1:9966/instances/mail/"),
            ),
            ("ftp://backend.example/", None),
            ("https://", None),
            ("https:///x", None),
            ("https://backend.example/?token=x", None),
            ("https://back end.example/", None),
        ] {
            assert_eq!(base_url(text).ok().as_deref(), want, "{text}");
        }
    }

    #[test]
    fn order_ids_and_pay_uris_table() {
        for (id, ok) in [
            ("2026.340-01XYZ", true),
            ("a", true),
            ("", false),
            ("../admin", false),
            ("a b", false),
            (&"x".repeat(201), false),
        ] {
            assert_eq!(check_order_id(id).is_ok(), ok, "{id}");
        }
        for (uri, ok) in [
            ("taler://pay/backend.example/2026-01/?c=ABC", true),
            ("TALER://PAY/backend.example/x/", true),
            ("taler://refund/backend.example/x/", false),
            ("taler://pay/backend.example/x y/", false),
            ("https://backend.example/", false),
            ("taler://pay/\r\nBcc: x", false),
        ] {
            assert_eq!(is_pay_uri(uri), ok, "{uri}");
        }
    }
}
