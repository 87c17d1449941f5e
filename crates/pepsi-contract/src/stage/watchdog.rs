//! A worker a dispatcher started watches itself (docs/ha.md): it ends at once when that
//! dispatcher is gone, and when a pass runs past its stage's MAX_RUNTIME with nobody left to
//! stop it (a dispatcher stopped or cut off, another one taking over). A dispatcher that takes
//! over re-queues an earlier one's rows only once MAX_RUNTIME and a margin have passed, so by
//! then no worker of the earlier one can still be delivering them.
//!
//! The parent-death signal covers most of this, but not a set-user-id worker (the kernel
//! clears it on such an exec) nor a dispatcher that is stopped rather than dead.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::epoch::Inherited;

/// How often the watch looks.
const EVERY: Duration = Duration::from_millis(100);
/// How far past MAX_RUNTIME a pass may run before the worker ends itself: the dispatcher,
/// when it is there, kills it at MAX_RUNTIME first and records a timeout.
const SLACK: Duration = Duration::from_secs(2);

/// Milliseconds since `base()` when the current pass began, plus one; 0 while idle.
static BUSY_SINCE: AtomicU64 = AtomicU64::new(0);

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A pass (or a round of them) begins.
pub(crate) fn busy() {
    let ms = base().elapsed().as_millis() as u64 + 1;
    BUSY_SINCE.store(ms, Ordering::Release);
}

/// The worker waits for its next id.
pub(crate) fn idle() {
    BUSY_SINCE.store(0, Ordering::Release);
}

/// Starts the watch when a dispatcher started this worker (it named its epoch).
pub(crate) fn start(program: &'static str, inherited: &Inherited) {
    if inherited.epoch.is_none() {
        return;
    }
    let parent = inherited.parent;
    let limit = inherited.pass_limit.map(|l| l + SLACK);
    base();
    let spawned = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EVERY);
                // SAFETY: no arguments, cannot fail.
                if unsafe { libc::getppid() } != parent {
                    end(program, "its dispatcher is gone", 1);
                }
                let since = BUSY_SINCE.load(Ordering::Acquire);
                if let Some(limit) = limit
                    && since > 0
                    && base().elapsed() > Duration::from_millis(since - 1) + limit
                {
                    end(
                        program,
                        &format!("a pass ran past MAX_RUNTIME ({limit:?} with slack) and nobody stopped it"),
                        crate::epoch::PASS_LIMIT_EXIT,
                    );
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the worker's watchdog: {e}");
    }
}

/// Ends the process at once, mid-pass if need be: nothing it would still commit may count.
fn end(program: &str, why: &str, status: i32) -> ! {
    eprintln!("{program}: ending: {why}");
    // SAFETY: terminates the process without running anything else.
    unsafe { libc::_exit(status) }
}
