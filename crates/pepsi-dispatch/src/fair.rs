//! Fair share among senders, in memory: each sender accrues the worker time its messages use
//! at a stage, and the claim prefers the senders with the smallest lead over the least-served
//! one. Leads halve every `half_life`; a sender not seen for a while and back at the
//! minimum is forgotten, so a newcomer (absent from the table) starts level with the
//! least-served sender and quiet time banks no credit. Forgotten on restart by design.
//!
//! Pure bookkeeping, no I/O; the claim statement receives `leads()` as arrays.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Leads below this many seconds count as level with the minimum.
const LEVEL: f64 = 1e-6;

#[derive(Debug, Clone)]
struct Entry {
    /// Seconds of worker time ahead of the least-served sender.
    lead: f64,
    last_seen: Instant,
}

/// One stage's accounting.
#[derive(Debug, Clone)]
pub struct FairShare {
    half_life: Duration,
    senders: HashMap<String, Entry>,
    last_decay: Instant,
    /// Running estimate of one message's worker time at this stage (seconds).
    cost: f64,
    /// Fractional FIFO slots carried between claims.
    fifo_credit: f64,
}

impl FairShare {
    pub fn new(half_life: Duration, now: Instant) -> Self {
        Self {
            half_life,
            senders: HashMap::new(),
            last_decay: now,
            cost: 0.001,
            fifo_credit: 0.0,
        }
    }

    /// A message of `sender` used `worker_time` at this stage.
    pub fn charge(&mut self, sender: &str, worker_time: Duration, now: Instant) {
        let secs = worker_time.as_secs_f64();
        let floor = self.min_lead();
        let entry = self.senders.entry(sender.to_owned()).or_insert(Entry {
            lead: floor,
            last_seen: now,
        });
        entry.lead += secs;
        entry.last_seen = now;
        // An exponential moving average is enough to space a sender's queued rows apart.
        self.cost = 0.9 * self.cost + 0.1 * secs.max(1e-6);
    }

    /// `sender` has messages waiting at this stage: a sender not yet known joins level with
    /// the least-served one and stays remembered while it waits, so the others' progress
    /// moves ahead of it.
    pub fn waiting(&mut self, sender: &str, now: Instant) {
        let floor = self.min_lead();
        self.senders
            .entry(sender.to_owned())
            .or_insert(Entry {
                lead: floor,
                last_seen: now,
            })
            .last_seen = now;
    }

    fn min_lead(&self) -> f64 {
        self.senders
            .values()
            .map(|e| e.lead)
            .reduce(f64::min)
            .unwrap_or(0.0)
    }

    /// Decays leads, re-levels them so the least-served sender is at 0, and forgets senders
    /// back at the minimum and idle for a half-life.
    pub fn settle(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last_decay).as_secs_f64();
        self.last_decay = now;
        if self.senders.is_empty() {
            return;
        }
        let floor = self
            .senders
            .values()
            .map(|e| e.lead)
            .fold(f64::INFINITY, f64::min);
        let factor = if self.half_life.is_zero() {
            0.0
        } else {
            0.5f64.powf(elapsed / self.half_life.as_secs_f64())
        };
        let idle = self.half_life;
        self.senders.retain(|_, e| {
            e.lead = (e.lead - floor) * factor;
            e.lead > LEVEL || now.saturating_duration_since(e.last_seen) < idle
        });
    }

    /// Senders with a lead worth telling the claim about, and their leads.
    pub fn leads(&self) -> impl Iterator<Item = (&str, f64)> {
        self.senders
            .iter()
            .filter(|(_, e)| e.lead > LEVEL)
            .map(|(k, e)| (k.as_str(), e.lead))
    }

    /// The estimated worker time of one message, spacing a sender's rows in the ranking.
    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// Splits `slots` into (oldest-first, fair) so that `percent` of all slots over time go
    /// oldest-first.
    pub fn split_slots(&mut self, slots: usize, percent: u32) -> (usize, usize) {
        self.fifo_credit += slots as f64 * f64::from(percent) / 100.0;
        let fifo = (self.fifo_credit.floor() as usize).min(slots);
        self.fifo_credit -= fifo as f64;
        (fifo, slots - fifo)
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn leads(f: &FairShare) -> Vec<(String, f64)> {
        let mut v: Vec<_> = f
            .leads()
            .map(|(k, l)| (k.to_owned(), (l * 1000.0).round() / 1000.0))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn the_heavy_sender_leads_and_a_lone_sender_stays_level() {
        let t = Instant::now();
        let mut f = FairShare::new(secs(60.0), t);
        for _ in 0..10 {
            f.charge("a", secs(1.0), t);
        }
        f.settle(t);
        assert!(
            leads(&f).is_empty(),
            "a sender alone is the least-served: {:?}",
            leads(&f)
        );
        f.charge("b", secs(0.5), t);
        f.settle(t);
        assert_eq!(leads(&f), vec![("b".to_owned(), 0.5)]);
    }

    #[test]
    fn a_newcomer_starts_level_with_the_least_served() {
        let t = Instant::now();
        let mut f = FairShare::new(secs(60.0), t);
        f.charge("a", secs(3.0), t);
        f.charge("b", secs(5.0), t);
        f.settle(t);
        // b arrived level with a (which had used 3 s), then used 5 s: 5 s ahead of a.
        assert_eq!(leads(&f), vec![("b".to_owned(), 5.0)]);
        f.charge("c", secs(1.0), t);
        f.settle(t);
        assert_eq!(
            leads(&f),
            vec![("b".to_owned(), 5.0), ("c".to_owned(), 1.0)]
        );
    }

    #[test]
    fn a_waiting_sender_overtakes_a_sender_that_keeps_being_served() {
        let t = Instant::now();
        let mut f = FairShare::new(secs(60.0), t);
        f.charge("bulk", secs(1.0), t);
        f.settle(t);
        f.waiting("late", t);
        f.charge("bulk", secs(1.0), t);
        f.settle(t);
        // late waited at the level bulk had when it arrived; bulk has moved on since.
        assert_eq!(leads(&f), vec![("bulk".to_owned(), 1.0)]);
    }

    #[test]
    fn leads_halve_every_half_life_and_idle_level_senders_are_forgotten() {
        let t = Instant::now();
        let mut f = FairShare::new(secs(10.0), t);
        f.charge("a", secs(0.0), t);
        f.charge("b", secs(8.0), t);
        f.charge("a", secs(0.0), t + secs(5.0));
        f.settle(t + secs(10.0));
        assert_eq!(leads(&f), vec![("b".to_owned(), 4.0)]);
        assert_eq!(f.tracked(), 2, "a was seen within the half-life");
        f.settle(t + secs(15.0));
        // a, at the minimum and idle for a half-life, is forgotten; b is then the least served.
        assert_eq!(f.tracked(), 1);
        f.settle(t + secs(16.0));
        assert!(leads(&f).is_empty(), "b alone is level: {:?}", leads(&f));
        f.settle(t + secs(30.0));
        assert_eq!(f.tracked(), 0, "b is level and idle");
    }

    #[test]
    fn fifo_slots_add_up_to_the_percentage_over_time() {
        let mut f = FairShare::new(secs(60.0), Instant::now());
        let mut fifo = 0;
        for _ in 0..100 {
            let (a, b) = f.split_slots(1, 20);
            assert_eq!(a + b, 1);
            fifo += a;
        }
        assert_eq!(fifo, 20);
        assert_eq!(f.split_slots(10, 0), (0, 10));
        assert_eq!(f.split_slots(10, 100), (10, 0));
    }
}
