//! Errors as the API answers them: a status and `{"error": "..."}`, the message naming what
//! was wrong. An internal failure is logged with its cause and answered with a generic
//! message, so database details never reach a client.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds for `Retry-After` (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    pub fn throttled(wait_secs: u64) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("too many failed logins: try again in {wait_secs} seconds"),
            retry_after: Some(wait_secs),
        }
    }
    /// 503 with `Retry-After`: the server is saturated, the request was not acted on.
    pub fn busy(message: impl Into<String>, retry_secs: u64) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            retry_after: Some(retry_secs),
        }
    }
    /// Logs `cause` and answers 500 without it.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!("request failed: {cause}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error (the server log has the cause)",
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::internal(format!("database: {e}"))
    }
}

impl From<pepsi_admin::admin::AdminError> for ApiError {
    fn from(e: pepsi_admin::admin::AdminError) -> Self {
        use pepsi_admin::admin::AdminError as E;
        match e {
            E::Invalid(m) => ApiError::bad_request(m),
            E::Exists(m) => ApiError::conflict(m),
            E::NotFound(m) => ApiError::not_found(m),
            E::Database(e) => e.into(),
        }
    }
}

impl From<pepsi_conf::config::Refusal> for ApiError {
    /// An override a program would refuse is 422 (the request was understood, its value is
    /// wrong); one the files own, nothing reads or that cannot be scoped is 400.
    fn from(e: pepsi_conf::config::Refusal) -> Self {
        use pepsi_conf::config::Refusal as R;
        match e {
            R::Breaks(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m),
            R::FileOnly(m) | R::Unread(m) | R::Unscoped(m) => ApiError::bad_request(m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(json!({"error": self.message}))).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
