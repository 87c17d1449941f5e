//! The spans waiting for export: a queue that never holds more than its bound. A span that
//! arrives at a full queue pushes the oldest out; a batch whose export failed goes back to
//! the front, and what no longer fits is again the oldest to go. Every span pushed out is
//! counted, so the memory bound shows as a number rather than as the process growing.
//! Pure: no I/O, no clock.

use std::collections::VecDeque;

/// A bounded first-in first-out queue that drops its oldest entries when full.
#[derive(Debug)]
pub struct Bounded<T> {
    items: VecDeque<T>,
    max: usize,
}

impl<T> Bounded<T> {
    /// A queue of at most `max` entries (at least one).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Bounded {
            items: VecDeque::with_capacity(max.min(4096)),
            max,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds `item` at the back; returns how many of the oldest were dropped for it (0 or 1).
    pub fn push(&mut self, item: T) -> usize {
        let dropped = self.trim_to(self.max - 1);
        self.items.push_back(item);
        dropped
    }

    /// Takes up to `n` of the oldest entries.
    pub fn take(&mut self, n: usize) -> Vec<T> {
        let n = n.min(self.items.len());
        self.items.drain(..n).collect()
    }

    /// Puts `batch` (taken earlier, oldest first) back at the front, ahead of what arrived
    /// since; returns how many of the oldest were dropped to stay within the bound.
    pub fn requeue_front(&mut self, batch: Vec<T>) -> usize {
        for item in batch.into_iter().rev() {
            self.items.push_front(item);
        }
        self.trim_to(self.max)
    }

    /// Drops the oldest entries until at most `len` remain; returns how many went.
    fn trim_to(&mut self, len: usize) -> usize {
        let excess = self.items.len().saturating_sub(len);
        self.items.drain(..excess);
        excess
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step on a queue of bound 3 and what it leaves: the entries oldest first and the
    /// drops so far.
    enum Step {
        Push(u32),
        Take(usize, &'static [u32]),
        Requeue(&'static [u32]),
    }

    fn check(steps: &[Step], want: &[u32], want_dropped: usize) {
        let mut q = Bounded::new(3);
        let mut dropped = 0;
        for step in steps {
            match step {
                Step::Push(v) => dropped += q.push(*v),
                Step::Take(n, taken) => assert_eq!(q.take(*n), *taken),
                Step::Requeue(batch) => dropped += q.requeue_front(batch.to_vec()),
            }
            assert!(q.len() <= 3);
        }
        assert_eq!(q.take(usize::MAX), want);
        assert_eq!(dropped, want_dropped);
        assert!(q.is_empty());
    }

    #[test]
    fn the_oldest_go_first_and_are_counted() {
        use Step::*;
        check(&[Push(1), Push(2)], &[1, 2], 0);
        check(
            &[Push(1), Push(2), Push(3), Push(4), Push(5)],
            &[3, 4, 5],
            2,
        );
        check(&[Push(1), Push(2), Take(5, &[1, 2]), Push(3)], &[3], 0);
        check(&[Push(1), Push(2), Push(3), Take(2, &[1, 2])], &[3], 0);
        // A failed batch goes back ahead of what came meanwhile.
        check(
            &[
                Push(1),
                Push(2),
                Take(2, &[1, 2]),
                Push(3),
                Requeue(&[1, 2]),
            ],
            &[1, 2, 3],
            0,
        );
        // Back at the front of a queue that filled meanwhile: the batch's oldest go.
        check(
            &[
                Push(1),
                Push(2),
                Take(2, &[1, 2]),
                Push(3),
                Push(4),
                Requeue(&[1, 2]),
            ],
            &[2, 3, 4],
            1,
        );
        check(
            &[
                Push(1),
                Push(2),
                Push(3),
                Take(3, &[1, 2, 3]),
                Push(4),
                Push(5),
                Push(6),
                Requeue(&[1, 2, 3]),
            ],
            &[4, 5, 6],
            3,
        );
        check(&[Take(3, &[]), Requeue(&[])], &[], 0);
    }

    #[test]
    fn a_bound_of_zero_holds_one() {
        let mut q = Bounded::new(0);
        assert_eq!(q.push(1), 0);
        assert_eq!(q.push(2), 1);
        assert_eq!(q.take(9), vec![2]);
    }
}
