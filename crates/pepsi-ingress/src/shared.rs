//! What every session of the ingress shares, and what each listener holds: built by
//! `server` at start, read by `session`. Below both, so neither reaches up into the other.

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::{Semaphore, watch};

use crate::config::{ListenerConfig, Options};
use crate::limits::ClientLimiter;
use crate::tls::TlsHandle;
use crate::verify::Verifier;

/// What every session shares.
pub struct Shared {
    /// The options now in force: replaced when `config_changed` announces new overrides;
    /// a session keeps the ones it started with ([`Shared::options`]).
    pub(crate) live: std::sync::RwLock<Arc<Options>>,
    pub pool: PgPool,
    /// Stores accepted messages, grouping concurrent ones, and wakes the dispatcher for
    /// them (`admission`).
    pub admitter: crate::admission::Admitter,
    /// Holds a message back while the queue's backlog is over INFLOW_BACKLOG (`inflow`).
    pub inflow: crate::inflow::Inflow,
    pub verifier: Option<Verifier>,
    pub limiter: Arc<ClientLimiter>,
    pub memory: Arc<crate::limits::MemoryBudget>,
    pub domains: crate::limits::DomainCache,
    /// Recipients found to exist (RECIPIENT_CACHE_TTL).
    pub recipients: crate::limits::RecipientCache,
    /// Mailboxes found full or not (QUOTA_CACHE_TTL).
    pub quota_full: crate::limits::DomainCache,
    /// What is counted for `pepsi.ingress_stats`.
    pub stats: crate::stats::Stats,
    /// The aliases stages' alias files, for CHECK_RECIPIENTS.
    pub alias_files: pepsi_contract::alias_file::AliasFile,
    /// Failed logins per client network and per account (AUTH_FAILURES_PER_*).
    pub auth_client_failures: crate::limits::FailureCounter,
    pub auth_account_failures: crate::limits::FailureCounter,
    /// Password checks running at once (AUTH_CONCURRENCY).
    pub auth_checks: Arc<Semaphore>,
    pub connections: Arc<Semaphore>,
    /// Where each stored message's transaction span goes (`[pepsi-telemetry-client]
    /// SOCKET`); off when no client is configured.
    pub telemetry: pepsi_contract::telemetry::Emitter,
    pub shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// The settings in force now.
    pub fn options(&self) -> Arc<Options> {
        match self.live.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn replace_settings(&self, new: Options) {
        let new = Arc::new(new);
        match self.live.write() {
            Ok(mut s) => *s = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }
}

/// A listener's configuration and its certificate, if any.
pub struct Listener {
    pub config: ListenerConfig,
    pub tls: Option<Arc<TlsHandle>>,
}
