//! The spans the sending processes dropped before they reached the client: each span
//! carries its process's count so far (`SpanRecord::sender_dropped`), so the client keeps
//! the highest count seen of each process and reports only what it adds. Drops the client
//! never saw (it was stopped, its socket was full) are counted this way with the next span
//! that gets through. Pure: no I/O, no clock.
//!
//! The memory it holds is bounded: at most `max` processes, and only those that reported a
//! drop; when full, the process heard from longest ago is forgotten (should it report
//! again, its whole count is taken as new).

use std::collections::HashMap;

/// How many sending processes are remembered at most.
pub const MAX_SENDERS: usize = 4096;

/// What is known of one sending process.
#[derive(Debug)]
struct Sender {
    program: String,
    /// The highest count it reported.
    dropped: u64,
    /// When it was last heard from, in reports.
    heard: u64,
}

/// The highest drop count of each sending process, by pid.
#[derive(Debug)]
pub struct SenderDrops {
    senders: HashMap<u32, Sender>,
    max: usize,
    reports: u64,
}

impl SenderDrops {
    /// Remembers at most `max` processes (at least one).
    pub fn new(max: usize) -> SenderDrops {
        SenderDrops {
            senders: HashMap::new(),
            max: max.max(1),
            reports: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.senders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }

    /// The drops not counted yet of the process `pid` running `program`, which reports
    /// `dropped` so far. Another program under a known pid is a new process (the pid was
    /// reused): its whole count is new. A lower count from the same program is taken for a
    /// span that overtook an earlier one (a process sending from several threads) and adds
    /// nothing; so a pid reused by the same program counts only beyond its predecessor's
    /// count, an undercount rather than a double count.
    pub fn report(&mut self, pid: u32, program: &str, dropped: u64) -> u64 {
        self.reports += 1;
        let heard = self.reports;
        if let Some(s) = self.senders.get_mut(&pid) {
            s.heard = heard;
            if s.program != program {
                s.program = program.to_owned();
                s.dropped = dropped;
                return dropped;
            }
            let new = dropped.saturating_sub(s.dropped);
            s.dropped = s.dropped.max(dropped);
            return new;
        }
        // Nothing dropped is the same as never heard of: no need to remember it.
        if dropped == 0 {
            return 0;
        }
        if self.senders.len() >= self.max
            && let Some(oldest) = self
                .senders
                .iter()
                .min_by_key(|(_, s)| s.heard)
                .map(|(pid, _)| *pid)
        {
            self.senders.remove(&oldest);
        }
        self.senders.insert(
            pid,
            Sender {
                program: program.to_owned(),
                dropped,
                heard,
            },
        );
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reports `(pid, program, dropped)` in order to a memory of 2 processes; each with
    /// the drops it adds.
    fn check(reports: &[(u32, &str, u64, u64)]) {
        let mut drops = SenderDrops::new(2);
        for (i, &(pid, program, dropped, want)) in reports.iter().enumerate() {
            assert_eq!(
                drops.report(pid, program, dropped),
                want,
                "report {i}: {pid} {program} {dropped}"
            );
            assert!(drops.len() <= 2);
        }
    }

    #[test]
    fn only_what_a_process_adds_is_counted() {
        // The first word of a process counts whole; then only its increases.
        check(&[
            (7, "a", 5, 5),
            (7, "a", 9, 4),
            (7, "a", 9, 0),
            (7, "a", 12, 3),
        ]);
        // Nothing dropped, then drops.
        check(&[(7, "a", 0, 0), (7, "a", 0, 0), (7, "a", 2, 2)]);
        // A span overtaken by a later one adds nothing.
        check(&[(7, "a", 5, 5), (7, "a", 3, 0), (7, "a", 6, 1)]);
        // Processes are kept apart.
        check(&[
            (7, "a", 5, 5),
            (8, "a", 1, 1),
            (7, "a", 6, 1),
            (8, "a", 4, 3),
        ]);
        // A pid reused by another program is a new process.
        check(&[
            (7, "a", 5, 5),
            (7, "b", 2, 2),
            (7, "b", 3, 1),
            (7, "a", 1, 1),
        ]);
    }

    #[test]
    fn the_process_heard_from_longest_ago_is_forgotten() {
        check(&[
            (1, "a", 5, 5),
            (2, "a", 5, 5),
            (1, "a", 6, 1),
            // Full: 2 was heard from longest ago.
            (3, "a", 1, 1),
            (1, "a", 7, 1),
            // 2 comes back as new.
            (2, "a", 6, 6),
        ]);
        let mut drops = SenderDrops::new(0);
        assert_eq!(drops.report(1, "a", 3), 3);
        assert_eq!(drops.report(2, "a", 3), 3);
        assert_eq!(drops.len(), 1);
        assert!(!drops.is_empty());
    }
}
