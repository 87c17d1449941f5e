//! Login throttling: login attempts counted per key (a client address, an administrator
//! name) in a fixed window; once a key reaches its limit, further attempts are refused
//! until the window that began with its first counted attempt has passed. An attempt is
//! counted (`reserve`) before its password is checked, in the same critical section as the
//! check of the limit, so concurrent attempts cannot all pass the check; one that succeeds
//! or is never checked gives its count back (`release`). Pure (the caller passes the clock)
//! and bounded: at most `capacity` keys are remembered, the oldest forgotten first, so a
//! flood of distinct addresses cannot grow it without end.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// An attempt `Throttle::reserve` counted: the window it was counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Reservation {
    window: Instant,
}

/// Login-attempt counters for one kind of key.
#[derive(Debug)]
pub struct Throttle {
    window: Duration,
    max: u32,
    capacity: usize,
    entries: HashMap<String, (Instant, u32)>,
}

impl Throttle {
    pub fn new(window: Duration, max: u32, capacity: usize) -> Self {
        Self {
            window,
            max: max.max(1),
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    /// How long `key` must still wait, when it has reached the limit.
    pub fn blocked(&self, key: &str, now: Instant) -> Option<Duration> {
        let (start, n) = self.entries.get(key)?;
        let end = *start + self.window;
        (*n >= self.max && now < end).then(|| end - now)
    }

    /// Counts one attempt for `key` (before it is verified): what `release` needs to give
    /// it back.
    pub fn reserve(&mut self, key: &str, now: Instant) -> Reservation {
        if let Some((start, n)) = self.entries.get_mut(key) {
            if now >= *start + self.window {
                *start = now;
                *n = 0;
            }
            *n += 1;
            return Reservation { window: *start };
        }
        if self.entries.len() >= self.capacity {
            let window = self.window;
            self.entries.retain(|_, (start, _)| now < *start + window);
            if self.entries.len() >= self.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (start, _))| *start)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key.to_owned(), (now, 1));
        Reservation { window: now }
    }

    /// Gives back an attempt `reserve` counted (it succeeded, or was never verified); nothing
    /// when its window has ended or the key was forgotten meanwhile.
    pub fn release(&mut self, key: &str, r: Reservation) {
        if let Some((start, n)) = self.entries.get_mut(key)
            && *start == r.window
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.entries.remove(key);
            }
        }
    }

    /// Forgets `key` (a successful login).
    pub fn clear(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

/// The key a client address counts under: IPv4 as it is, IPv6 by its /64 (one host
/// usually holds a whole /64). The form the list stage counts SMTP clients under too
/// (`pepsi_contract::list::client_key`), so a host counts once by mail and on the web.
pub fn address_key(ip: IpAddr) -> String {
    pepsi_contract::list::client_key(ip)
}

/// The key an administrator name's failures count under: the name and the client's
/// network (IPv4 /24, IPv6 /48), so that a client locks the name out only for its own
/// network, not for every administrator everywhere (security review #13).
pub fn account_key(name: &str, ip: IpAddr) -> String {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{name} from {}.{}.{}.0/24", o[0], o[1], o[2])
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{name} from {:x}:{:x}:{:x}::/48", s[0], s[1], s[2])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_refused_after_its_limit_until_the_window_ends() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Throttle::new(s(60), 3, 100);
        // (seconds after t0, action, expected wait after it: None = allowed)
        let steps: [(u64, &str, Option<u64>); 7] = [
            (0, "fail", None),
            (1, "fail", None),
            (2, "fail", Some(58)),
            (30, "check", Some(30)),
            (60, "check", None),
            (61, "fail", None), // a new window
            (62, "clear", None),
        ];
        for (at, action, want) in steps {
            let now = t0 + s(at);
            match action {
                "fail" => {
                    let _ = t.reserve("k", now);
                }
                "clear" => t.clear("k"),
                _ => {}
            }
            assert_eq!(t.blocked("k", now), want.map(s), "at {at}s after {action}");
        }
        assert_eq!(t.blocked("other", t0), None);
    }

    #[test]
    fn it_remembers_at_most_its_capacity() {
        let t0 = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(60), 1, 2);
        let _ = t.reserve("a", t0);
        let _ = t.reserve("b", t0 + Duration::from_secs(1));
        let _ = t.reserve("c", t0 + Duration::from_secs(2));
        assert_eq!(t.entries.len(), 2);
        assert!(t.blocked("a", t0).is_none(), "the oldest was forgotten");
        assert!(t.blocked("c", t0 + Duration::from_secs(2)).is_some());
    }

    #[test]
    fn a_released_attempt_is_given_back_only_in_its_own_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Throttle::new(s(60), 2, 100);
        let a = t.reserve("k", t0);
        let b = t.reserve("k", t0 + s(1));
        assert!(
            t.blocked("k", t0 + s(1)).is_some(),
            "two reserved: at the limit"
        );
        t.release("k", b);
        assert_eq!(t.blocked("k", t0 + s(2)), None, "one given back");
        t.release("k", a);
        assert!(t.entries.is_empty(), "nothing counted: forgotten");
        // A reservation of an ended window does not take from the next one.
        let old = t.reserve("k", t0);
        let _ = t.reserve("k", t0 + s(61));
        let _ = t.reserve("k", t0 + s(62));
        t.release("k", old);
        assert!(t.blocked("k", t0 + s(62)).is_some());
    }

    #[test]
    fn an_account_counts_per_client_network() {
        let cases = [
            ("ops", "192.0.2.1", "ops from 192.0.2.0/24"),
            ("ops", "192.0.2.250", "ops from 192.0.2.0/24"),
            ("ops", "192.0.3.1", "ops from 192.0.3.0/24"),
            ("ops", "::ffff:192.0.2.9", "ops from 192.0.2.0/24"),
            ("ops", "2001:db8:1:2:3::1", "ops from 2001:db8:1::/48"),
            ("ops", "2001:db8:1:ffff::1", "ops from 2001:db8:1::/48"),
        ];
        for (name, ip, want) in cases {
            assert_eq!(account_key(name, ip.parse().unwrap()), want);
        }
    }

    #[test]
    fn ipv6_clients_count_by_their_64() {
        let cases = [
            ("192.0.2.1", "192.0.2.1"),
            ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
            ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
            ("::ffff:192.0.2.9", "192.0.2.9"),
        ];
        for (ip, want) in cases {
            assert_eq!(address_key(ip.parse().unwrap()), want);
        }
    }
}
