//! What the set-user-id Maildir writer and its callers share beside the wire format (the
//! writer's `protocol`): how the writer is started, and a mailbox's quota arithmetic. The
//! database side of quotas (`pepsi_contract::quota`) builds on these types; they are here,
//! below it, so the writer links no database client.

use std::path::PathBuf;

use serde::Serialize;

/// The most directories the writer's index of keyed copies may hold
/// (`--key-index-dirs`, the Maildir stage's `KEY_INDEX_DIRS`).
pub const MAX_KEY_INDEX_DIRS: usize = 65_536;

/// How the Maildir writer is started; a running writer is reused while these stay the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterArgs {
    pub program: PathBuf,
    pub root: PathBuf,
    pub create: bool,
    pub allow_root_owner: bool,
    /// `--key-index-dirs`: `None` leaves the writer's default.
    pub key_index_dirs: Option<usize>,
    pub log_level: String,
}

/// Limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Octets.
    pub bytes: Option<u64>,
    pub messages: Option<u64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.bytes.is_some() || self.messages.is_some()
    }

    /// Whether a message of `size` octets fits beside `used`.
    pub fn fits(&self, used: Usage, size: u64) -> bool {
        self.bytes
            .is_none_or(|q| used.bytes.saturating_add(size) <= q)
            && self
                .messages
                .is_none_or(|q| used.messages.saturating_add(1) <= q)
    }

    /// These limits, or `other` when these limit nothing.
    pub fn or(self, other: Limits) -> Limits {
        if self.any() { self } else { other }
    }

    /// Whether `used` leaves no room for any message at all.
    pub fn exhausted(&self, used: Usage) -> bool {
        self.bytes.is_some_and(|q| used.bytes >= q)
            || self.messages.is_some_and(|q| used.messages >= q)
    }

    /// Limits as stored (`pepsi.quota_limit`): a value that is not positive is no limit.
    pub fn from_row(bytes: Option<i64>, messages: Option<i64>) -> Limits {
        let positive = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).filter(|&v| v > 0);
        Limits {
            bytes: positive(bytes),
            messages: positive(messages),
        }
    }
}

/// What a mailbox (or a domain's mailboxes together) holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub bytes: u64,
    pub messages: u64,
}
