//! `POST /tlsrpt`: TLS reports (RFC 8460 §5.4) other senders POST about our domains, when
//! `[pepsi-httpd] TLSRPT_UPLOAD = yes` and our `_smtp._tls` record names this URL. A report
//! is read as `pepsi-tlsrpt import` reads one (`pepsi_tlsrpt::report::parse`: gzip'ed or
//! plain JSON, bounded, checked against RFC 8460) and kept once per organisation and report
//! id in `pepsi.tls_report_received`; at most `TLSRPT_MAX_PER_DAY` are taken a day, since
//! anyone may post.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, ClientAddr};

pub async fn upload(
    State(state): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let Some(max_per_day) = state.options.tlsrpt_upload else {
        return Err(ApiError::not_found(
            "this server takes no TLS reports over HTTPS ([pepsi-httpd] TLSRPT_UPLOAD)",
        ));
    };
    let kind = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if kind != "application/tlsrpt+gzip" && kind != "application/tlsrpt+json" {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "a TLS report is application/tlsrpt+gzip or application/tlsrpt+json, not {kind:?}"
            ),
        ));
    }
    let report = pepsi_tlsrpt::report::parse(&body).map_err(ApiError::bad_request)?;
    let today: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.tls_report_received WHERE received_at > now() - interval '1 day'",
    )
    .fetch_one(&state.pool)
    .await?;
    if today >= i64::from(max_per_day) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "as many TLS reports as this server takes in a day have come (TLSRPT_MAX_PER_DAY)",
        ));
    }
    let source = format!("https from {}", client.ip());
    let added = pepsi_tlsrpt::store::receive(&state.pool, &report, &source)
        .await
        .map_err(ApiError::internal)?;
    tracing::info!(
        organization = report.organization_name,
        report_id = report.report_id,
        client = %client.ip(),
        added,
        "TLS report posted"
    );
    Ok((
        if added {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        axum::Json(serde_json::json!({
            "report_id": report.report_id,
            "organization": report.organization_name,
            "new": added,
        })),
    )
        .into_response())
}
