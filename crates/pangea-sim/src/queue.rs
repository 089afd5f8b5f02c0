//! A deterministic event queue: a min-heap ordered by (time, insertion sequence).
//!
//! Ties are the whole difficulty of a discrete-event simulator: many events fall on
//! the same microsecond (a replica broadcasting to its region, timers armed together),
//! and a plain binary heap pops equal keys in an order that depends on its internal
//! layout. Stamping every push with a sequence number makes equal-time events pop in
//! the order they were pushed, so a run depends only on its seed and its inputs.
//!
//! Bound: the queue holds whatever its owner pushes; each owner documents its bound.
//!
//! The network ([`crate::net`]) keys its deliveries the same way but keeps them in
//! per-connection FIFOs under a heap of connection heads, which stays small however
//! many messages are in flight; this queue is for everything else a driver
//! schedules (timers, client requests, fault timelines).

use crate::time::SimTime;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One queued event. Ordered by `(at, seq)` only, reversed so that `BinaryHeap`, a
/// max-heap, pops the earliest first; the item never takes part in comparisons.
#[derive(Debug)]
struct Entry<T> {
    at: SimTime,
    /// Insertion order, unique per queue: breaks ties between equal times.
    seq: u64,
    item: T,
}

impl<T> Entry<T> {
    /// `(at, seq)` as one integer, time in the high half: ordered as the pair.
    fn key(&self) -> u128 {
        (u128::from(self.at.as_us()) << 64) | u128::from(self.seq)
    }
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}

impl<T> Eq for Entry<T> {}

impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: the smallest (at, seq) is the heap's maximum.
        other.key().cmp(&self.key())
    }
}

/// A place in an [`EventQueue`]'s tie order ([`EventQueue::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place(u64);

/// A min-heap of `(time, item)`; equal times pop in insertion order.
#[derive(Debug)]
pub struct EventQueue<T> {
    heap: BinaryHeap<Entry<T>>,
    /// The next insertion sequence number. A `u64` does not wrap in any run: at a
    /// billion pushes per second it lasts 584 years.
    next_seq: u64,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> EventQueue<T> {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Pre-allocates room for `capacity` events, so a queue that stays below it never
    /// reallocates.
    pub fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(capacity),
            next_seq: 0,
        }
    }

    /// Queues `item` at `at`. Pushing into the past is allowed: it pops next.
    pub fn push(&mut self, at: SimTime, item: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { at, seq, item });
    }

    /// Takes a place in the tie order now for an event that may be queued later
    /// ([`EventQueue::push_at_place`]): among equal times it pops as if pushed now.
    /// A place not used leaves no trace.
    pub fn reserve(&mut self) -> Place {
        let seq = self.next_seq;
        self.next_seq += 1;
        Place(seq)
    }

    /// Queues `item` at `at` in the tie order of `place` (each place once).
    pub fn push_at_place(&mut self, at: SimTime, place: Place, item: T) {
        self.heap.push(Entry {
            at,
            seq: place.0,
            item,
        });
    }

    /// The earliest event if it is due (its time ≤ `now`).
    pub fn pop_due(&mut self, now: SimTime) -> Option<(SimTime, T)> {
        if self.peek_time()? > now {
            return None;
        }
        self.pop()
    }

    /// The earliest event, due or not.
    pub fn pop(&mut self) -> Option<(SimTime, T)> {
        self.heap.pop().map(|e| (e.at, e.item))
    }

    /// The time of the earliest event.
    pub fn peek_time(&self) -> Option<SimTime> {
        self.heap.peek().map(|e| e.at)
    }

    /// The earliest event without removing it.
    pub fn peek(&self) -> Option<(SimTime, &T)> {
        self.heap.peek().map(|e| (e.at, &e.item))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Keeps only the events for which `keep` returns true. O(n): meant for rare
    /// events such as faults, not for the hot path. The relative order of the kept
    /// events does not change, since it lives in their (time, sequence) keys.
    pub fn retain(&mut self, mut keep: impl FnMut(SimTime, &T) -> bool) {
        self.heap.retain(|e| keep(e.at, &e.item));
    }

    /// Removes every event.
    pub fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_place_pops_as_if_pushed_when_reserved() {
        let mut q = EventQueue::new();
        q.push(SimTime::from_us(10), "a");
        let place = q.reserve();
        q.push(SimTime::from_us(10), "c");
        q.push(SimTime::from_us(5), "first");
        q.push_at_place(SimTime::from_us(10), place, "b");
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, x)| x)).collect();
        assert_eq!(order, ["first", "a", "b", "c"]);
    }

    #[test]
    fn pops_in_time_order_and_equal_times_in_insertion_order() {
        let mut q = EventQueue::new();
        q.push(SimTime::from_us(30), "c");
        q.push(SimTime::from_us(10), "a1");
        q.push(SimTime::from_us(20), "b");
        q.push(SimTime::from_us(10), "a2");
        q.push(SimTime::from_us(10), "a3");
        assert_eq!(q.len(), 5);
        assert_eq!(q.peek_time(), Some(SimTime::from_us(10)));
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, x)| x)).collect();
        assert_eq!(order, ["a1", "a2", "a3", "b", "c"]);
        assert!(q.is_empty());
    }

    #[test]
    fn pop_due_respects_now() {
        let mut q = EventQueue::new();
        q.push(SimTime::from_us(10), 1);
        q.push(SimTime::from_us(20), 2);
        assert_eq!(q.pop_due(SimTime::from_us(9)), None);
        assert_eq!(
            q.pop_due(SimTime::from_us(10)),
            Some((SimTime::from_us(10), 1))
        );
        assert_eq!(q.pop_due(SimTime::from_us(15)), None);
        assert_eq!(q.pop_due(SimTime::MAX), Some((SimTime::from_us(20), 2)));
        assert_eq!(q.pop_due(SimTime::MAX), None);
    }

    #[test]
    fn retain_keeps_order() {
        let mut q = EventQueue::new();
        for i in 0..100u32 {
            q.push(SimTime::from_us(u64::from(i % 7)), i);
        }
        q.retain(|_, &i| i % 3 != 0);
        let mut last = (SimTime::ZERO, 0u32);
        let mut n = 0;
        while let Some((t, i)) = q.pop() {
            assert!(i % 3 != 0);
            assert!(t > last.0 || (t == last.0 && i > last.1) || n == 0);
            last = (t, i);
            n += 1;
        }
        assert_eq!(n, 66);
    }

    proptest::proptest! {
        #[test]
        fn matches_a_stable_sort(times in proptest::collection::vec(0u64..50, 0..300)) {
            let mut q = EventQueue::new();
            for (i, &t) in times.iter().enumerate() {
                q.push(SimTime::from_us(t), i);
            }
            let mut expected: Vec<(u64, usize)> =
                times.iter().enumerate().map(|(i, &t)| (t, i)).collect();
            expected.sort_by_key(|&(t, _)| t); // stable: equal times keep push order
            let got: Vec<(u64, usize)> =
                std::iter::from_fn(|| q.pop().map(|(t, i)| (t.as_us(), i))).collect();
            proptest::prop_assert_eq!(got, expected);
        }
    }
}
