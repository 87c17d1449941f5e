//! What a stage's passes learn between two commits of its worker (a round): answers to
//! lookups that the next pass of the round may reuse, so that a round of messages between the
//! same people asks the database once. The stage forgets them at every commit
//! (`Stage::before_commit`); they also expire after [`RoundMemo::MEMORY`], since a round
//! whose passes all failed never reaches the commit. Expiry happens only when a pass asks for
//! it (`expire`, at the start of its lookups), never between an answer's learning and its
//! reading in one pass.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Answers by key, and when the first was learnt. Keep one in a `RefCell` in the stage:
/// passes of a worker run one at a time.
#[derive(Debug)]
pub struct RoundMemo<K, V> {
    since: Option<Instant>,
    answers: HashMap<K, V>,
}

impl<K, V> Default for RoundMemo<K, V> {
    fn default() -> Self {
        RoundMemo {
            since: None,
            answers: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, V> RoundMemo<K, V> {
    /// How long an answer is used at most.
    pub const MEMORY: Duration = Duration::from_secs(1);

    /// Forgets everything once the first answer is older than [`Self::MEMORY`]. Call it once
    /// per pass, before its lookups.
    pub fn expire(&mut self) {
        if self.since.is_some_and(|t| t.elapsed() > Self::MEMORY) {
            self.clear();
        }
    }

    /// The answer for `key`, when the round has one.
    pub fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.answers.get(key)
    }

    /// True when the round has an answer for `key`.
    pub fn knows<Q>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Records the answer for `key`.
    pub fn insert(&mut self, key: K, answer: V) {
        self.since.get_or_insert_with(Instant::now);
        self.answers.insert(key, answer);
    }

    /// Forgets every answer: at a commit, or when a pass changed what they describe.
    pub fn clear(&mut self) {
        self.since = None;
        self.answers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_last_until_cleared_or_too_old() {
        let mut m: RoundMemo<String, bool> = RoundMemo::default();
        assert_eq!(m.get("a"), None);
        m.insert("a".into(), true);
        assert_eq!(m.get("a"), Some(&true));
        assert!(m.knows("a") && !m.knows("b"));
        m.clear();
        assert!(!m.knows("a"));
        m.insert("a".into(), false);
        m.since = Some(Instant::now() - RoundMemo::<String, bool>::MEMORY * 2);
        assert!(
            m.knows("a"),
            "a pass's answers stay until it asks for expiry"
        );
        m.expire();
        assert!(!m.knows("a"), "an answer older than MEMORY is forgotten");
    }
}
