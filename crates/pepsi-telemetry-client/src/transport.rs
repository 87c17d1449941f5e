//! The HTTP client the OTLP exporters send through (`opentelemetry_http::HttpClient`): the
//! workspace's reqwest over rustls, with the receiver's trust anchor (`CA_FILE`), the
//! export deadline, no redirects, HTTPS only unless the endpoint is a loopback `http://`,
//! and the bearer token set on every request here, so no environment variable
//! (`OTEL_EXPORTER_OTLP_HEADERS`) can replace or leak it.
//!
//! The metric exporter runs on the SDK's own reader thread, outside any Tokio runtime:
//! each request is spawned onto the runtime the transport was made on and its `JoinHandle`
//! awaited, which any executor can do. A failure's whole story (the connection refused,
//! the receiver's status and answer) is kept (`Failure`), since the exporter reports only
//! "network error" or a text: the log tells it, and the span export decides by its status
//! whether a batch is worth sending again.

use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http::header::{AUTHORIZATION, HeaderValue};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

use crate::options::{Credentials, Options};

/// The largest answer read from the receiver (an OTLP response is a few bytes).
const MAX_RESPONSE: usize = 1 << 20;
/// The most of a refusal's text kept for the log.
const MAX_SHOWN: usize = 200;

/// What the last failed request met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The receiver's status; none when no answer came (no connection, a timeout, a broken
    /// answer).
    pub status: Option<StatusCode>,
    /// The whole story, for the log: the URL and the cause, or the status and what the
    /// receiver said.
    pub text: String,
}

/// One signal's way to the receiver. Clones share the connections and the failure record.
#[derive(Clone)]
pub struct Transport {
    http: reqwest::Client,
    authorization: HeaderValue,
    runtime: tokio::runtime::Handle,
    last_failure: Arc<Mutex<Option<Failure>>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transport")
    }
}

impl Transport {
    /// The client for `options`' endpoint with `credentials`; requests run on `runtime`.
    pub fn new(
        options: &Options,
        credentials: &Credentials,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Transport> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(options.export_timeout)
            .connect_timeout(options.export_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .https_only(options.endpoint.is_https())
            .user_agent(concat!(
                "pepsi-telemetry-client/",
                env!("CARGO_PKG_VERSION")
            ));
        for cert in &credentials.roots {
            builder = builder.add_root_certificate(cert.clone());
        }
        let http = builder.build().context("cannot set up the HTTPS client")?;
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", credentials.token))
            .context("the token of TOKEN_FILE cannot be sent in an HTTP header")?;
        authorization.set_sensitive(true);
        Ok(Transport {
            http,
            authorization,
            runtime,
            last_failure: Arc::new(Mutex::new(None)),
        })
    }

    /// Another signal's transport over the same connections, with its own failure record.
    pub fn sibling(&self) -> Transport {
        Transport {
            last_failure: Arc::new(Mutex::new(None)),
            ..self.clone()
        }
    }

    /// What the last failed request met, taken (none after a success, and none when no
    /// request was made since the last time it was taken).
    pub fn take_failure(&self) -> Option<Failure> {
        self.last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn note(&self, failure: Option<Failure>) {
        *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) = failure;
    }
}

/// An error and its causes in one line, each cause once.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let t = cause.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = cause.source();
    }
    text
}

/// One request and its whole answer, on the runtime.
async fn exchange(
    http: reqwest::Client,
    request: Request<Bytes>,
) -> Result<Response<Bytes>, String> {
    let url = request.uri().to_string();
    let request =
        reqwest::Request::try_from(request).map_err(|e| format!("{url}: {}", chain(&e)))?;
    let mut response = http.execute(request).await.map_err(|e| chain(&e))?;
    let status = response.status();
    let headers = std::mem::take(response.headers_mut());
    let mut body = BytesMut::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("{url}: reading the answer: {}", chain(&e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE {
            return Err(format!("{url}: the answer is over {MAX_RESPONSE} octets"));
        }
        body.extend_from_slice(&chunk);
    }
    let mut out = Response::new(body.freeze());
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

#[async_trait]
impl HttpClient for Transport {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (mut parts, body) = request.into_parts();
        parts
            .headers
            .insert(AUTHORIZATION, self.authorization.clone());
        let url = parts.uri.to_string();
        let request = Request::from_parts(parts, body);
        let task = self.runtime.spawn(exchange(self.http.clone(), request));
        let outcome = match task.await {
            Ok(outcome) => outcome,
            Err(e) => Err(format!("{url}: the request was cut off: {e}")),
        };
        match outcome {
            Ok(response) if response.status().is_success() => {
                self.note(None);
                Ok(response)
            }
            Ok(response) => {
                let said = pepsi_conf::text::one_line(&String::from_utf8_lossy(response.body()));
                let said = pepsi_conf::text::clip(&said, MAX_SHOWN);
                self.note(Some(Failure {
                    status: Some(response.status()),
                    text: format!(
                        "the receiver answered {} to {url}{}{said}",
                        response.status(),
                        if said.is_empty() { "" } else { ": " }
                    ),
                }));
                Ok(response)
            }
            Err(text) => {
                self.note(Some(Failure {
                    status: None,
                    text: text.clone(),
                }));
                Err(text.into())
            }
        }
    }
}
