//! Whether a signal's exports get through, so the log says when they stop and when they
//! work again, once each, however many retries lie between. Pure: the caller logs.

use std::sync::Mutex;

/// What an export's result changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The first failure after a success (or at start): say why.
    Failing,
    /// One more failure in a run of them: nothing to say.
    StillFailing,
    /// A success after `failures` failed attempts: say so.
    Recovered { failures: u64 },
    /// A success after a success.
    Well,
}

/// The run of failures of one signal's exports.
#[derive(Debug, Default)]
pub struct Health {
    failures: Mutex<u64>,
}

impl Health {
    pub fn failed(&self) -> Change {
        let mut n = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        if *n == 1 {
            Change::Failing
        } else {
            Change::StillFailing
        }
    }

    pub fn succeeded(&self) -> Change {
        let mut n = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let failures = std::mem::take(&mut *n);
        if failures == 0 {
            Change::Well
        } else {
            Change::Recovered { failures }
        }
    }

    /// Failed attempts since the last success.
    pub fn failures(&self) -> u64 {
        *self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_word_for_a_run_of_failures_and_one_for_the_end_of_it() {
        let h = Health::default();
        let steps = [
            (true, Change::Well),
            (false, Change::Failing),
            (false, Change::StillFailing),
            (false, Change::StillFailing),
            (true, Change::Recovered { failures: 3 }),
            (true, Change::Well),
            (false, Change::Failing),
            (true, Change::Recovered { failures: 1 }),
        ];
        for (ok, want) in steps {
            let got = if ok { h.succeeded() } else { h.failed() };
            assert_eq!(got, want);
        }
        assert_eq!(h.failures(), 0);
    }
}
