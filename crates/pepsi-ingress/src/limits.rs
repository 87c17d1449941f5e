//! Per-client connection counting and the budget of message bytes held in memory. A guard
//! holds what it took and gives it back when dropped, so an early return or a panicking
//! session cannot leak a slot or a byte.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The network a client address counts under: an IPv4 address (or an IPv4-mapped IPv6
/// one) masked to `v4` bits, an IPv6 address to `v6` bits. One host with a /64 of its own
/// is then one client however many of its addresses it uses.
pub fn client_network(ip: IpAddr, v4: u8, v6: u8) -> IpAddr {
    let ip = match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = u32::MAX
                .checked_shl(32 - u32::from(v4.min(32)))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6.min(128)))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

/// A map from keys to values stamped with when they were set, forgotten `ttl` later, and
/// bounded: once `max` keys are held, a new key first drops the expired ones, then the
/// oldest tenth of those not pinned (never an entry the caller pins, such as a lockout);
/// when every entry is pinned, the new key is not taken.
#[derive(Debug)]
struct Expiring<V> {
    ttl: Duration,
    max: usize,
    entries: Mutex<HashMap<String, (V, Instant)>>,
}

impl<V: Copy> Expiring<V> {
    fn new(ttl: Duration, max: usize) -> Self {
        Expiring {
            ttl,
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The value of `key` and when it was set, unless it has expired.
    fn get(&self, key: &str) -> Option<(V, Instant)> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .copied()
            .filter(|(_, at)| at.elapsed() < self.ttl)
    }

    /// Sets `key` to what `f` makes of its unexpired entry, under one lock.
    fn set(&self, key: &str, f: impl FnOnce(Option<(V, Instant)>) -> (V, Instant)) {
        self.update(key, |_| false, |current| (Some(f(current)), ()));
    }

    /// Runs `f` on the unexpired entry of `key` under one lock and stores the entry it
    /// returns (None: leaves the map as it is), giving back `f`'s answer. A new key in a full
    /// map first makes room (see the type); None, and `f` not run, when there is none.
    fn update<R>(
        &self,
        key: &str,
        pinned: impl Fn(&V) -> bool,
        f: impl FnOnce(Option<(V, Instant)>) -> (Option<(V, Instant)>, R),
    ) -> Option<R> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= self.max && !entries.contains_key(key) {
            let ttl = self.ttl;
            entries.retain(|_, (_, at)| at.elapsed() < ttl);
            if entries.len() >= self.max {
                // The oldest tenth at once, so a full map costs one pass per max / 10 new
                // keys rather than one per key.
                let mut evictable: Vec<(Instant, String)> = entries
                    .iter()
                    .filter(|(_, (v, _))| !pinned(v))
                    .map(|(k, (_, at))| (*at, k.clone()))
                    .collect();
                let n = (self.max / 10).clamp(1, evictable.len().max(1));
                if evictable.len() > n {
                    evictable.select_nth_unstable(n - 1);
                    evictable.truncate(n);
                }
                for (_, k) in evictable {
                    entries.remove(&k);
                }
                if entries.len() >= self.max {
                    return None;
                }
            }
        }
        let current = entries
            .get(key)
            .copied()
            .filter(|(_, at)| at.elapsed() < self.ttl);
        let (entry, answer) = f(current);
        if let Some(entry) = entry {
            entries.insert(key.to_owned(), entry);
        }
        Some(answer)
    }
}

/// Answers of the settings layer about domains the configuration does not list, reused for
/// a while so a flood of RCPTs to unlisted domains costs one query per domain and period.
#[derive(Debug)]
pub struct DomainCache(Expiring<bool>);

/// Most domains a [`DomainCache`] remembers.
const DOMAIN_CACHE_ENTRIES: usize = 10_000;

impl DomainCache {
    /// A cache keeping answers for `ttl` (zero: none kept).
    pub fn new(ttl: Duration) -> DomainCache {
        DomainCache(Expiring::new(ttl, DOMAIN_CACHE_ENTRIES))
    }

    /// The answer for `domain` (lower case) if one younger than the TTL is kept.
    pub fn get(&self, domain: &str) -> Option<bool> {
        self.0.get(domain).map(|(local, _)| local)
    }

    pub fn put(&self, domain: &str, local: bool) {
        if !self.0.ttl.is_zero() {
            self.0.set(domain, |_| (local, Instant::now()));
        }
    }
}

/// Recipients CHECK_RECIPIENTS found to exist, reused for a while: the usual mail to the
/// same mailboxes costs one lookup per address and period instead of one per RCPT. Only
/// "exists" is kept, so a mailbox or alias made a moment ago is accepted at once; one
/// removed is still accepted for up to the TTL (its delivery then fails with a DSN).
#[derive(Debug)]
pub struct RecipientCache(Expiring<()>);

/// Most recipients a [`RecipientCache`] remembers.
const RECIPIENT_CACHE_ENTRIES: usize = 50_000;

impl RecipientCache {
    /// A cache keeping findings for `ttl` (zero: none kept).
    pub fn new(ttl: Duration) -> RecipientCache {
        RecipientCache(Expiring::new(ttl, RECIPIENT_CACHE_ENTRIES))
    }

    /// Whether `address` (lower case) was found to exist within the TTL.
    pub fn known(&self, address: &str) -> bool {
        self.0.get(address).is_some()
    }

    pub fn put(&self, address: &str) {
        if !self.0.ttl.is_zero() {
            self.0.set(address, |_| ((), Instant::now()));
        }
    }
}

/// Lookups whose DNS failed (a timeout, SERVFAIL: `temperror`), remembered for a while so
/// the next message naming the same domain or address gets `temperror` at once instead of
/// waiting out the same failure: a domain whose name servers are down costs one wait per
/// period, not one per message. Keys name the check and what it was about
/// (`spf:example.org`, `iprev:192.0.2.1`).
#[derive(Debug)]
pub struct DnsFailures(Expiring<()>);

/// Most failed lookups a [`DnsFailures`] remembers.
const DNS_FAILURE_ENTRIES: usize = 10_000;

impl DnsFailures {
    /// Remembers failures for `ttl` (zero: none).
    pub fn new(ttl: Duration) -> DnsFailures {
        DnsFailures(Expiring::new(ttl, DNS_FAILURE_ENTRIES))
    }

    /// True when the lookup of `key` failed less than the TTL ago.
    pub fn recent(&self, key: &str) -> bool {
        self.0.get(key).is_some()
    }

    pub fn record(&self, key: &str) {
        if !self.0.ttl.is_zero() {
            self.0.set(key, |_| ((), Instant::now()));
        }
    }
}

/// Failed logins counted per key (a client network, an account) over a fixed window that
/// starts at the key's first failure: once a key has `limit` failures in its window, its
/// logins are refused without a password check until the window ends.
///
/// An attempt is counted as a failure before its password is checked ([`reserve`]), under
/// the same lock as the test against the limit, so sessions checking passwords at the same
/// time cannot all pass the test together; a login that succeeds gives its count back.
/// A key at its limit is never dropped to make room for another while its window lasts.
///
/// [`reserve`]: FailureCounter::reserve
#[derive(Debug)]
pub struct FailureCounter {
    limit: u32,
    counts: Expiring<u32>,
}

/// Most keys a [`FailureCounter`] remembers.
const FAILURE_KEYS: usize = 100_000;

/// One attempt counted as a failure of its key until it is known not to be one: dropping
/// it gives the count back (a login that succeeded, a lookup that failed); [`failed`]
/// keeps it.
///
/// [`failed`]: Attempt::failed
#[must_use = "dropping an attempt gives its count back"]
#[derive(Debug)]
pub struct Attempt<'a> {
    counter: &'a FailureCounter,
    key: String,
    /// The start of the window the attempt was counted in (None: nothing was counted).
    window: Option<Instant>,
}

impl FailureCounter {
    /// `limit` failures per `window` (a limit of 0 counts nothing and never refuses).
    pub fn new(limit: u32, window: Duration) -> FailureCounter {
        FailureCounter::with_capacity(limit, window, FAILURE_KEYS)
    }

    fn with_capacity(limit: u32, window: Duration, keys: usize) -> FailureCounter {
        FailureCounter {
            limit,
            counts: Expiring::new(window, keys),
        }
    }

    /// True when `key` has reached its limit in the current window.
    pub fn blocked(&self, key: &str) -> bool {
        self.limit > 0 && self.counts.get(key).is_some_and(|(n, _)| n >= self.limit)
    }

    /// Counts one attempt for `key` as a failure unless `key` has reached its limit (then
    /// None: refuse it without checking a password). None too when the counter is full of
    /// keys at their limit, so a flood of those cannot make room for guessing.
    pub fn reserve(&self, key: &str) -> Option<Attempt<'_>> {
        if self.limit == 0 {
            return Some(Attempt {
                counter: self,
                key: key.to_owned(),
                window: None,
            });
        }
        let limit = self.limit;
        let window = self
            .counts
            .update(
                key,
                |n| *n >= limit,
                |current| match current {
                    Some((n, _)) if n >= limit => (None, None),
                    Some((n, since)) => (Some((n + 1, since)), Some(since)),
                    None => {
                        let now = Instant::now();
                        (Some((1, now)), Some(now))
                    }
                },
            )
            .flatten()?;
        Some(Attempt {
            counter: self,
            key: key.to_owned(),
            window: Some(window),
        })
    }

    /// Counts one failure for `key`.
    pub fn fail(&self, key: &str) {
        if let Some(attempt) = self.reserve(key) {
            attempt.failed();
        }
    }
}

impl Attempt<'_> {
    /// The attempt failed: its count stays.
    pub fn failed(mut self) {
        self.window = None;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let Some(window) = self.window else {
            return;
        };
        // Only from the window it was counted in: a window that ended meanwhile took it.
        self.counter.counts.update(
            &self.key,
            |_| true,
            |current| match current {
                Some((n, since)) if since == window => (Some((n.saturating_sub(1), since)), ()),
                _ => (None, ()),
            },
        );
    }
}

/// Message bytes all sessions hold in memory while receiving, against a limit.
#[derive(Debug)]
pub struct MemoryBudget {
    used: AtomicU64,
    limit: u64,
}

/// Bytes one session holds; returned to the budget when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl MemoryBudget {
    pub fn new(limit: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// An empty holding, to grow as a message arrives.
    pub fn hold(self: &Arc<Self>) -> Held {
        Held {
            budget: self.clone(),
            bytes: 0,
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

impl Held {
    /// Grows the holding to `total` bytes; false (nothing taken) when the budget has no
    /// room for the difference.
    pub fn grow_to(&mut self, total: u64) -> bool {
        let Some(more) = total.checked_sub(self.bytes).filter(|m| *m > 0) else {
            return true;
        };
        let b = &self.budget;
        let taken = b
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(more).filter(|n| *n <= b.limit)
            })
            .is_ok();
        if taken {
            self.bytes = total;
        }
        taken
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Open connections per client address.
#[derive(Debug, Default)]
pub struct ClientLimiter {
    open: Mutex<HashMap<IpAddr, u32>>,
}

/// One connection's slot.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<ClientLimiter>,
    ip: IpAddr,
}

impl ClientLimiter {
    /// Takes a slot for `ip`, or None when it already has `max` connections open.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr, max: u32) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot {
            limiter: self.clone(),
            ip,
        })
    }

    #[cfg(test)]
    fn count(&self, ip: IpAddr) -> u32 {
        self.open.lock().unwrap().get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_networks_table() {
        let cases = [
            ("192.0.2.77", 32, 64, "192.0.2.77"),
            ("192.0.2.77", 24, 64, "192.0.2.0"),
            ("192.0.2.77", 0, 64, "0.0.0.0"),
            ("::ffff:192.0.2.77", 24, 64, "192.0.2.0"),
            ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32, 64, "2001:db8:1:2::"),
            ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32, 48, "2001:db8:1::"),
            (
                "2001:db8:1:2:aaaa:bbbb:cccc:dddd",
                32,
                128,
                "2001:db8:1:2:aaaa:bbbb:cccc:dddd",
            ),
            ("2001:db8::1", 32, 0, "::"),
        ];
        for (ip, v4, v6, want) in cases {
            let got = client_network(ip.parse().unwrap(), v4, v6);
            assert_eq!(got, want.parse::<IpAddr>().unwrap(), "{ip} /{v4} /{v6}");
        }
    }

    #[test]
    fn the_memory_budget_is_shared_and_returned() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.hold();
        let mut b = budget.hold();
        assert!(a.grow_to(60));
        assert!(!b.grow_to(41), "60 + 41 is over 100");
        assert_eq!(budget.used(), 60);
        assert!(b.grow_to(40));
        assert!(a.grow_to(50), "shrinking asks for nothing");
        drop(a);
        assert_eq!(budget.used(), 40);
        assert!(b.grow_to(100));
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn domain_answers_are_kept_for_the_ttl_only() {
        let cache = DomainCache::new(Duration::from_millis(200));
        assert_eq!(cache.get("a.example"), None);
        cache.put("a.example", true);
        cache.put("b.example", false);
        assert_eq!(cache.get("a.example"), Some(true));
        assert_eq!(cache.get("b.example"), Some(false));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(cache.get("a.example"), None);
        let off = DomainCache::new(Duration::ZERO);
        off.put("a.example", true);
        assert_eq!(off.get("a.example"), None);
    }

    #[test]
    fn failures_block_a_key_until_its_window_ends() {
        let c = FailureCounter::new(2, Duration::from_millis(200));
        assert!(!c.blocked("a"));
        c.fail("a");
        assert!(!c.blocked("a"));
        c.fail("a");
        assert!(c.blocked("a"));
        assert!(!c.blocked("b"), "keys are counted apart");
        std::thread::sleep(Duration::from_millis(250));
        assert!(!c.blocked("a"), "a new window");
        c.fail("a");
        assert!(!c.blocked("a"), "the count started again");
        let off = FailureCounter::new(0, Duration::from_secs(60));
        for _ in 0..10 {
            off.fail("a");
        }
        assert!(!off.blocked("a"));
    }

    /// Security review #10: filling the counter with fresh keys (names a client typed)
    /// makes room by dropping the oldest keys below their limit, never a lockout; the map
    /// stays bounded, and when only lockouts are left a new key is refused, not counted.
    #[test]
    fn a_locked_key_survives_the_counter_filling_up() {
        let c = FailureCounter::with_capacity(3, Duration::from_secs(600), 100);
        for _ in 0..3 {
            c.fail("victim@example.test");
        }
        assert!(c.blocked("victim@example.test"));
        for i in 0..1000 {
            c.fail(&format!("fresh{i}@example.test"));
        }
        assert!(
            c.blocked("victim@example.test"),
            "the lockout outlived 1000 fresh keys"
        );
        assert!(c.counts.entries.lock().unwrap().len() <= 100, "bounded");

        // Only lockouts left: a new key gets no attempt (refused), the lockouts stay.
        let full = FailureCounter::with_capacity(1, Duration::from_secs(600), 10);
        for i in 0..10 {
            full.fail(&format!("locked{i}"));
        }
        assert!(full.reserve("newcomer").is_none());
        assert!((0..10).all(|i| full.blocked(&format!("locked{i}"))));
    }

    /// Security review #10: an attempt is counted before its password check, so attempts
    /// under way together cannot pass the limit together; one that does not fail (a login
    /// that succeeded) gives its count back.
    #[test]
    fn attempts_are_counted_before_the_password_check() {
        let c = FailureCounter::new(2, Duration::from_secs(600));
        let first = c.reserve("a").expect("first");
        let second = c.reserve("a").expect("second");
        assert!(c.reserve("a").is_none(), "two under way reach the limit");
        drop(second);
        let third = c.reserve("a").expect("a success gave its count back");
        first.failed();
        third.failed();
        assert!(c.blocked("a"));
        assert!(c.reserve("a").is_none());
        let off = FailureCounter::new(0, Duration::from_secs(600));
        let held: Vec<_> = (0..10).map(|_| off.reserve("a").unwrap()).collect();
        assert_eq!(held.len(), 10, "a limit of 0 refuses nothing");
    }

    #[test]
    fn caches_drop_their_oldest_entries_when_full() {
        let cache = DomainCache(Expiring::new(Duration::from_secs(600), 10));
        for i in 0..10 {
            cache.put(&format!("d{i}.example"), true);
            std::thread::sleep(Duration::from_millis(1));
        }
        cache.put("new.example", true);
        assert_eq!(cache.get("new.example"), Some(true));
        assert_eq!(cache.get("d0.example"), None, "the oldest made room");
        assert_eq!(cache.get("d9.example"), Some(true), "the rest stayed");
    }

    #[test]
    fn slots_are_counted_and_returned() {
        let limiter = Arc::new(ClientLimiter::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let s1 = limiter.acquire(a, 2).unwrap();
        let _s2 = limiter.acquire(a, 2).unwrap();
        assert!(limiter.acquire(a, 2).is_none());
        assert!(limiter.acquire(b, 2).is_some());
        drop(s1);
        assert_eq!(limiter.count(a), 1);
        assert!(limiter.acquire(a, 2).is_some());
    }
}
