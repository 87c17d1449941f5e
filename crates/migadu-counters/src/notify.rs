//! Web-app notifications on a limit crossing: per-level URL templates, query-escaped values,
//! a background sender bounded by a semaphore, retries with doubling backoff.
//!
//! TLS trust for `https://` targets: the Mozilla roots built into the binary (webpki-roots)
//! plus the system trust store, or instead of the system store the PEM certificates named by
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` when either is set (rustls-native-certs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::config::NotifyConfig;
use crate::counting::{Crossing, Event};
use crate::domains::Level;
use crate::metrics::Metrics;
use crate::txlog::TxLog;

/// Attempts per notification before it is given up.
pub const ATTEMPTS: u32 = 5;
/// Concurrent notifications, so a burst of crossings cannot flood the web app.
pub const CONCURRENCY: usize = 8;
const MAX_BACKOFF: Duration = Duration::from_secs(16);

/// Escapes like a form query value: unreserved characters stay, space becomes `+`.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Replaces `$LEVEL $ID $FLOW $PERIOD $ADDRESS $COUNT $LIMIT` with escaped values in one pass,
/// so a value can never be taken for a variable.
pub fn expand(template: &str, c: &Crossing) -> String {
    let vars: [(&str, String); 7] = [
        ("$LEVEL", c.level.as_str().to_string()),
        ("$ID", c.id.clone()),
        ("$FLOW", c.flow.as_str().to_string()),
        ("$PERIOD", "d".to_string()),
        ("$ADDRESS", c.by.clone()),
        ("$COUNT", c.count.to_string()),
        ("$LIMIT", c.limit.to_string()),
    ];
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    'outer: while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        for (name, value) in &vars {
            if let Some(after) = tail.strip_prefix(name) {
                out.push_str(&query_escape(value));
                rest = after;
                continue 'outer;
            }
        }
        out.push('$');
        rest = &tail[1..];
    }
    out.push_str(rest);
    out
}

/// A notification queued or being sent, kept so that shutdown can name what it abandons.
struct InFlight {
    trace_id: String,
    level: Level,
    url: String,
    /// Attempts started so far (0 while waiting for a concurrency slot).
    attempts: AtomicU32,
    last_error: Mutex<String>,
}

/// Removes its entry from the in-flight table when the notification ends, however it ends.
struct InFlightGuard<'a> {
    table: &'a Mutex<HashMap<u64, Arc<InFlight>>>,
    id: u64,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        lock(self.table).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An error with its chain of causes, e.g. `error sending request: client error (Connect):
/// tcp connect error: Connection refused (os error 111)`; a cause that repeats its parent's
/// text is left out.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut prev = out.clone();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !prev.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        prev = text;
        cur = c.source();
    }
    out
}

/// Where the extra trust anchors come from and what loading them found; logged at start-up.
pub struct TrustReport {
    /// `SSL_CERT_FILE=…`, `SSL_CERT_DIR=…` or `system store`.
    pub source: String,
    pub certificates: usize,
    pub errors: Vec<String>,
}

/// Loads the trust anchors the notification client will add to the built-in roots, the same
/// way the client does, to report them (and their errors) at start-up.
pub fn trust_report() -> TrustReport {
    let vars: Vec<String> = ["SSL_CERT_FILE", "SSL_CERT_DIR"]
        .into_iter()
        .filter_map(|v| std::env::var_os(v).map(|p| format!("{v}={}", p.to_string_lossy())))
        .collect();
    let loaded = rustls_native_certs::load_native_certs();
    TrustReport {
        source: if vars.is_empty() {
            "system store".into()
        } else {
            vars.join(" ")
        },
        certificates: loaded.certs.len(),
        errors: loaded.errors.iter().map(|e| e.to_string()).collect(),
    }
}

pub struct Notifier {
    client: reqwest::Client,
    cfg: NotifyConfig,
    sem: Arc<Semaphore>,
    tracker: TaskTracker,
    backoff: Duration,
    metrics: Arc<Metrics>,
    txlog: TxLog,
    inflight: Mutex<HashMap<u64, Arc<InFlight>>>,
    next_id: AtomicU64,
}

impl Notifier {
    /// `backoff` is the first retry delay; it doubles up to 16 s. Fails when the TLS trust
    /// anchors cannot be used (e.g. `SSL_CERT_FILE` holds no valid certificate).
    pub fn new(
        cfg: NotifyConfig,
        backoff: Duration,
        metrics: Arc<Metrics>,
        txlog: TxLog,
    ) -> Result<Arc<Notifier>, String> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(Duration::from_secs(cfg.timeout_seconds))
            .build()
            .map_err(|e| format!("notification HTTP client: {}", error_chain(&e)))?;
        Ok(Arc::new(Notifier {
            client,
            cfg,
            sem: Arc::new(Semaphore::new(CONCURRENCY)),
            tracker: TaskTracker::new(),
            backoff,
            metrics,
            txlog,
            inflight: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        }))
    }

    pub fn url_for(&self, level: Level) -> &str {
        match level {
            Level::A => &self.cfg.address_url,
            Level::D => &self.cfg.domain_url,
            Level::O => &self.cfg.org_url,
        }
    }

    /// Queues a notification in the background; an empty URL for the level sends nothing.
    pub fn spawn(self: &Arc<Self>, c: Crossing, trace_id: String, route: &'static str) {
        let template = self.url_for(c.level);
        if template.is_empty() {
            return;
        }
        let url = expand(template, &c);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(InFlight {
            trace_id: trace_id.clone(),
            level: c.level,
            url: url.clone(),
            attempts: AtomicU32::new(0),
            last_error: Mutex::new(String::new()),
        });
        lock(&self.inflight).insert(id, entry.clone());
        let me = self.clone();
        self.tracker.spawn(async move {
            let _gone = InFlightGuard {
                table: &me.inflight,
                id,
            };
            let _permit = me.sem.acquire().await;
            let (event, result) = match me.deliver(&url, &entry).await {
                Ok(()) => (Event::NotificationSent { url }, "sent"),
                Err(error) => {
                    tracing::error!(
                        trace_id,
                        level = c.level.as_str(),
                        url,
                        error,
                        "limit notification failed"
                    );
                    (
                        Event::NotificationFailed {
                            url,
                            attempts: ATTEMPTS,
                            error,
                        },
                        "failed",
                    )
                }
            };
            me.metrics
                .notifications
                .with_label_values(&[c.level.as_str(), result])
                .inc();
            me.txlog.block(&trace_id, route, &[(Utc::now(), event)]);
        });
    }

    async fn deliver(&self, url: &str, entry: &InFlight) -> Result<(), String> {
        let mut delay = self.backoff;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            entry.attempts.store(attempt, Ordering::Relaxed);
            let mut req = self.client.get(url);
            if !self.cfg.user.is_empty() || !self.cfg.password.is_empty() {
                req = req.basic_auth(&self.cfg.user, Some(&self.cfg.password));
            }
            match req.send().await {
                Ok(resp) if resp.status().is_success() => return Ok(()),
                Ok(resp) => last = format!("status {}", resp.status().as_u16()),
                // The URL is already in the log line; the causes say what went wrong.
                Err(e) => last = error_chain(&e.without_url()),
            }
            lock(&entry.last_error).clone_from(&last);
            if attempt < ATTEMPTS {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
        Err(last)
    }

    /// Notifications queued or being sent right now.
    pub fn in_flight(&self) -> usize {
        lock(&self.inflight).len()
    }

    /// Waits for notifications in flight, at most `limit`. Returns how many were abandoned;
    /// each of them is logged as an error (trace id, level, URL, attempts, last error).
    pub async fn wait(&self, limit: Duration) -> usize {
        self.tracker.close();
        if tokio::time::timeout(limit, self.tracker.wait())
            .await
            .is_ok()
        {
            return 0;
        }
        let mut left: Vec<Arc<InFlight>> = lock(&self.inflight).values().cloned().collect();
        left.sort_by(|a, b| (&a.trace_id, &a.url).cmp(&(&b.trace_id, &b.url)));
        for n in &left {
            let attempts = n.attempts.load(Ordering::Relaxed);
            let last_error = lock(&n.last_error).clone();
            tracing::error!(
                trace_id = %n.trace_id,
                level = n.level.as_str(),
                url = %n.url,
                attempts,
                last_error = %if last_error.is_empty() { "none (attempt in progress or not started)" } else { &last_error },
                "limit notification abandoned at shutdown"
            );
        }
        left.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domains::Flow;
    use crate::logging::LogWriter;

    fn crossing(level: Level) -> Crossing {
        Crossing {
            level,
            flow: Flow::Out,
            id: "x y@example.com".into(),
            by: "noah@wearemiraclesnow.com".into(),
            count: 2200,
            limit: 2200,
        }
    }

    #[test]
    fn templates() {
        let t = "https://a/api/limits?level=$LEVEL&id=$ID&flow=$FLOW&period=$PERIOD&by=$ADDRESS&count=$COUNT&l=$LIMIT&x=$OTHER$";
        assert_eq!(
            expand(t, &crossing(Level::O)),
            "https://a/api/limits?level=O&id=x+y%40example.com&flow=o&period=d&by=noah%40wearemiraclesnow.com&count=2200&l=2200&x=$OTHER$"
        );
        assert_eq!(query_escape("a&b=c/d~e_f.g-h"), "a%26b%3Dc%2Fd~e_f.g-h");
        assert_eq!(query_escape("é$"), "%C3%A9%24");
    }

    #[tokio::test]
    async fn each_level_uses_its_url_and_failures_retry() {
        let target = migadu_counters_testkit::HttpTarget::start(200).await;
        let failing = migadu_counters_testkit::HttpTarget::start(500).await;
        let cfg = NotifyConfig {
            org_url: format!("{}/org?id=$ID&by=$ADDRESS", target.base()),
            address_url: format!("{}/addr?id=$ID", failing.base()),
            domain_url: String::new(),
            user: "web".into(),
            password: "secret".into(),
            timeout_seconds: 5,
        };
        let metrics = Arc::new(Metrics::new());
        let n = Notifier::new(
            cfg,
            Duration::from_millis(10),
            metrics.clone(),
            TxLog::new(Arc::new(LogWriter::Off), false),
        )
        .unwrap();
        n.spawn(crossing(Level::O), "t1".into(), "out");
        n.spawn(crossing(Level::A), "t1".into(), "out");
        n.spawn(crossing(Level::D), "t1".into(), "out");
        assert_eq!(n.wait(Duration::from_secs(30)).await, 0);
        assert_eq!(n.in_flight(), 0);
        let got = target.requests();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].path_and_query,
            "/org?id=x+y%40example.com&by=noah%40wearemiraclesnow.com"
        );
        assert_eq!(
            got[0].authorization.as_deref(),
            Some("Basic d2ViOnNlY3JldA==")
        );
        assert_eq!(failing.requests().len(), ATTEMPTS as usize);
        assert_eq!(
            metrics
                .notifications
                .with_label_values(&["O", "sent"])
                .get(),
            1
        );
        assert_eq!(
            metrics
                .notifications
                .with_label_values(&["A", "failed"])
                .get(),
            1
        );
        assert_eq!(
            metrics
                .notifications
                .with_label_values(&["D", "sent"])
                .get(),
            0
        );
    }
}
