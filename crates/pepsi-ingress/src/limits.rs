//! Per-client-address connection counting. A guard holds one slot and gives it back when
//! dropped, so an early return or a panicking session cannot leak a slot.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

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
