//! What a stage worker inherits from the dispatcher that started it, for fencing (docs/ha.md):
//! the dispatcher's epoch, which every session of the worker names (`pepsi.epoch`) so the
//! database refuses its writes once another dispatcher has taken over, and the longest a pass
//! may run, which the worker enforces on itself when no dispatcher is left to.
//!
//! Read once, before a set-user-id program empties its environment.

use std::sync::OnceLock;
use std::time::Duration;

/// The epoch of the dispatcher that started this worker.
pub const EPOCH_ENV: &str = "PEPSI_DISPATCH_EPOCH";
/// The worker's stage's MAX_RUNTIME in milliseconds.
pub const PASS_LIMIT_ENV: &str = "PEPSI_PASS_LIMIT_MS";
/// The dispatcher's pid: the worker's parent, which it must not outlive.
pub const PARENT_ENV: &str = "PEPSI_DISPATCH_PID";
/// The exit status of a worker that ended a pass itself past MAX_RUNTIME: the dispatcher
/// records the message as timed out, as when it kills the worker itself.
pub const PASS_LIMIT_EXIT: i32 = 124;

/// What the environment said at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inherited {
    /// The dispatcher's epoch; `None` for a process no dispatcher started (or an older one).
    pub epoch: Option<i64>,
    /// The longest one pass may run.
    pub pass_limit: Option<Duration>,
    /// The dispatcher that started this process (as it said, else the parent at start).
    pub parent: i32,
}

impl Inherited {
    /// Parses the two variables as they were found (`None` where absent or not a number).
    pub fn parse(
        epoch: Option<&str>,
        pass_limit: Option<&str>,
        named_parent: Option<&str>,
        parent: i32,
    ) -> Self {
        Self {
            epoch: epoch
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|e| *e > 0),
            pass_limit: pass_limit
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            parent: named_parent
                .and_then(|v| v.trim().parse::<i32>().ok())
                .filter(|p| *p > 1)
                .unwrap_or(parent),
        }
    }
}

/// The values this process inherited, read on the first call.
pub fn inherited() -> &'static Inherited {
    static ONCE: OnceLock<Inherited> = OnceLock::new();
    ONCE.get_or_init(|| {
        let epoch = std::env::var(EPOCH_ENV).ok();
        let limit = std::env::var(PASS_LIMIT_ENV).ok();
        let named = std::env::var(PARENT_ENV).ok();
        // SAFETY: no arguments, cannot fail.
        let parent = unsafe { libc::getppid() };
        Inherited::parse(epoch.as_deref(), limit.as_deref(), named.as_deref(), parent)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_numbers_count() {
        let cases = [
            (
                Some("7"),
                Some("300000"),
                Some(7),
                Some(Duration::from_secs(300)),
            ),
            (Some(" 12 "), None, Some(12), None),
            (Some("0"), Some("0"), None, None),
            (Some("-3"), Some("-1"), None, None),
            (Some("x"), Some("5m"), None, None),
            (None, None, None, None),
        ];
        for (epoch, limit, want_epoch, want_limit) in cases {
            let got = Inherited::parse(epoch, limit, None, 1);
            assert_eq!(got.epoch, want_epoch, "{epoch:?}");
            assert_eq!(got.pass_limit, want_limit, "{limit:?}");
        }
        // The dispatcher named in the environment counts over the parent found at start
        // (which is init when the dispatcher died before the worker looked).
        assert_eq!(Inherited::parse(None, None, Some("4242"), 1).parent, 4242);
        assert_eq!(Inherited::parse(None, None, Some("1"), 77).parent, 77);
        assert_eq!(Inherited::parse(None, None, Some("x"), 77).parent, 77);
    }
}
