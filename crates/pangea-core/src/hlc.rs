//! Hybrid logical clock (Kulkarni et al., "Logical Physical Clocks", 2014).
//!
//! A [`Timestamp`] packs Unix milliseconds into its upper 48 bits and a logical counter
//! into the lower 16, so timestamps compare as plain integers and stay close to wall
//! time. The clock never reads time itself: every call takes the caller's physical
//! time, so the simulator can skew and jump it.
//!
//! Guarantees (docs/invariants.md, I1):
//! - timestamps a clock issues strictly increase, whatever physical time does;
//! - a remote timestamp more than `max_offset` ahead of local physical time is refused
//!   with [`ClockError::RemoteAhead`] and never adopted, so one replica with a runaway
//!   clock cannot drag the others into the future.

use std::fmt;

/// Bits of a [`Timestamp`] given to the logical counter.
pub const LOGICAL_BITS: u32 = 16;
const LOGICAL_MASK: u64 = (1 << LOGICAL_BITS) - 1;

/// A hybrid-logical-clock timestamp: `wall_ms << 16 | logical`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// `wall_ms` is truncated to 48 bits (year 10889), `logical` to 16.
    pub const fn new(wall_ms: u64, logical: u16) -> Self {
        Timestamp((wall_ms << LOGICAL_BITS) | logical as u64)
    }

    pub const fn from_u64(raw: u64) -> Self {
        Timestamp(raw)
    }

    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Unix milliseconds.
    pub const fn wall_ms(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    pub const fn logical(self) -> u16 {
        (self.0 & LOGICAL_MASK) as u16
    }

    /// The next timestamp after this one (logical + 1, carrying into the wall part).
    pub const fn successor(self) -> Self {
        Timestamp(self.0.saturating_add(1))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.wall_ms(), self.logical())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why a remote timestamp was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error(
        "remote timestamp {remote} is {ahead_ms} ms ahead of local physical time {physical_ms} ms; max offset {max_offset_ms} ms"
    )]
    RemoteAhead {
        remote: Timestamp,
        physical_ms: u64,
        ahead_ms: u64,
        max_offset_ms: u64,
    },
    /// This replica's own clock disagrees with most of its peers by more than the
    /// max offset: it is the odd one out, and refuses writes (it would stamp them in
    /// the past or the future of everyone else) until its clock agrees again.
    #[error(
        "clock fenced: this replica's clock is {offset_ms} ms off {peers_off} of the {peers_heard} peers heard in the last {window_s} s (max offset {max_offset_ms} ms); writes are refused until it agrees"
    )]
    Fenced {
        /// This replica's clock minus the peers' (median of those off): negative when
        /// it is behind.
        offset_ms: i64,
        peers_off: usize,
        peers_heard: usize,
        window_s: u64,
        max_offset_ms: u64,
    },
}

/// Default bound on how far a remote clock may run ahead of ours.
pub const MAX_OFFSET_MS_DEFAULT: u64 = 500;

/// A hybrid logical clock. Not thread-safe by design: one replica state machine owns it.
#[derive(Debug, Clone)]
pub struct HybridClock {
    /// The largest timestamp issued or observed; everything issued later is above it.
    last: Timestamp,
    /// Remote timestamps further ahead of local physical time than this are refused.
    max_offset_ms: u64,
}

impl Default for HybridClock {
    fn default() -> Self {
        Self::new(MAX_OFFSET_MS_DEFAULT)
    }
}

impl HybridClock {
    pub fn new(max_offset_ms: u64) -> Self {
        HybridClock {
            last: Timestamp::ZERO,
            max_offset_ms,
        }
    }

    pub fn max_offset_ms(&self) -> u64 {
        self.max_offset_ms
    }

    /// The largest timestamp issued or observed so far.
    pub fn last(&self) -> Timestamp {
        self.last
    }

    /// A new timestamp for a local event at physical time `physical_ms`: above every
    /// timestamp issued or observed before, and at least `physical_ms`.
    pub fn now(&mut self, physical_ms: u64) -> Timestamp {
        let physical = Timestamp::new(physical_ms, 0);
        self.last = if physical > self.last {
            physical
        } else {
            self.last.successor()
        };
        self.last
    }

    /// Takes a timestamp seen in a message into account, so that later local events
    /// order after it. Refuses (and ignores) timestamps beyond `max_offset`.
    pub fn observe(&mut self, physical_ms: u64, remote: Timestamp) -> Result<(), ClockError> {
        let limit_ms = physical_ms.saturating_add(self.max_offset_ms);
        if remote.wall_ms() > limit_ms {
            return Err(ClockError::RemoteAhead {
                remote,
                physical_ms,
                ahead_ms: remote.wall_ms() - physical_ms,
                max_offset_ms: self.max_offset_ms,
            });
        }
        self.last = self.last.max(remote);
        Ok(())
    }

    /// After a restart: never issue anything at or below `floor` (the largest
    /// timestamp this replica wrote before), even if the wall clock went backwards.
    pub fn restore(&mut self, floor: Timestamp) {
        self.last = self.last.max(floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn packs_wall_and_logical() {
        let t = Timestamp::new(1_700_000_000_123, 7);
        assert_eq!(t.wall_ms(), 1_700_000_000_123);
        assert_eq!(t.logical(), 7);
        assert!(Timestamp::new(5, 0xffff) < Timestamp::new(6, 0));
        assert_eq!(Timestamp::new(5, 0xffff).successor(), Timestamp::new(6, 0));
    }

    #[test]
    fn follows_physical_time_and_ticks_when_it_stalls() {
        let mut c = HybridClock::default();
        assert_eq!(c.now(1000), Timestamp::new(1000, 0));
        assert_eq!(c.now(1000), Timestamp::new(1000, 1));
        assert_eq!(c.now(999), Timestamp::new(1000, 2), "wall clock went back");
        assert_eq!(c.now(1001), Timestamp::new(1001, 0));
    }

    #[test]
    fn adopts_remote_within_offset_and_refuses_beyond() {
        let mut c = HybridClock::new(500);
        c.observe(1000, Timestamp::new(1400, 3)).unwrap();
        assert_eq!(c.now(1000), Timestamp::new(1400, 4));
        let err = c.observe(1000, Timestamp::new(1600, 0)).unwrap_err();
        assert_eq!(
            err,
            ClockError::RemoteAhead {
                remote: Timestamp::new(1600, 0),
                physical_ms: 1000,
                ahead_ms: 600,
                max_offset_ms: 500
            }
        );
        assert_eq!(
            c.last(),
            Timestamp::new(1400, 4),
            "a refused timestamp is not adopted"
        );
    }

    #[test]
    fn restore_keeps_issuing_above_the_floor() {
        let mut c = HybridClock::default();
        c.restore(Timestamp::new(5000, 9));
        assert_eq!(c.now(10), Timestamp::new(5000, 10));
    }

    #[derive(Debug, Clone)]
    enum Event {
        Local(u64),
        Remote(u64, u64),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u64..10_000).prop_map(Event::Local),
            (0u64..10_000, 0u64..11_000).prop_map(|(p, r)| Event::Remote(p, r)),
        ]
    }

    proptest! {
        /// The clock never goes backwards, and each issued timestamp is above all seen.
        #[test]
        fn never_goes_backwards(events in prop::collection::vec(event(), 1..200)) {
            let mut c = HybridClock::new(500);
            let mut issued_max = Timestamp::ZERO;
            let mut last = c.last();
            for e in events {
                match e {
                    Event::Local(p) => {
                        let t = c.now(p);
                        prop_assert!(t > issued_max);
                        prop_assert!(t.wall_ms() >= p);
                        issued_max = t;
                    }
                    Event::Remote(p, r) => {
                        let remote = Timestamp::new(r, 0);
                        match c.observe(p, remote) {
                            Ok(()) => prop_assert!(c.last() >= remote),
                            Err(_) => prop_assert!(r > p + 500),
                        }
                    }
                }
                prop_assert!(c.last() >= last);
                last = c.last();
            }
        }
    }
}
