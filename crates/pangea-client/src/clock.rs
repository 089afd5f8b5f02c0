//! The client's clocks: a microsecond clock from its epoch (what the calls' state
//! machines and the hedger run on), and the wall clock read through it.
//!
//! A read plans at the wall time (bounded staleness compares replicas' watermark
//! times with it) and notes the wall time its answer came in. Reading the system's
//! wall clock for each was two of a 1 KiB get's clock reads, a measurable share
//! of the client's CPU. The wall time of an instant the call has already read is
//! the monotonic clock plus the wall clock's offset from it, taken again at most
//! every [`REANCHOR`]: a step of the wall clock (NTP, an operator) shows within
//! that, and between steps the two clocks move together to within the slew
//! (at most 500 ppm: 25 µs over 50 ms).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long an offset between the wall clock and the monotonic one is used.
const REANCHOR: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub(crate) struct Clock {
    /// The zero of the microsecond clock.
    epoch: Instant,
    /// Wall-clock µs since the Unix epoch minus the microsecond clock, at the
    /// last anchoring (wrapping: the wall clock may be set before `epoch`'s
    /// time).
    offset_us: AtomicU64,
    /// The microsecond clock at the last anchoring.
    anchored_us: AtomicU64,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        let clock = Clock {
            epoch: Instant::now(),
            offset_us: AtomicU64::new(0),
            anchored_us: AtomicU64::new(0),
        };
        clock.anchor();
        clock
    }

    /// `at` on the microsecond clock.
    pub(crate) fn us(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// The instant `us` on the microsecond clock names.
    pub(crate) fn instant(&self, us: u64) -> Instant {
        crate::deadline_after(self.epoch, Duration::from_micros(us))
    }

    /// The wall clock at `at` (an instant read lately), in ms since the Unix epoch.
    pub(crate) fn wall_ms(&self, at: Instant) -> u64 {
        let us = self.us(at);
        let anchored = self.anchored_us.load(Ordering::Relaxed);
        if us.saturating_sub(anchored) >= REANCHOR.as_micros() as u64 {
            self.anchor();
        }
        us.wrapping_add(self.offset_us.load(Ordering::Relaxed)) / 1_000
    }

    /// Takes the wall clock's offset from the monotonic one.
    fn anchor(&self) {
        let us = self.us(Instant::now());
        let wall_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.offset_us
            .store(wall_us.wrapping_sub(us), Ordering::Relaxed);
        self.anchored_us.store(us, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The wall time read through the monotonic clock is the system's, to within
    /// the ms of truncation on either side, also after re-anchoring.
    #[test]
    fn wall_time_follows_the_system_clock() {
        let clock = Clock::new();
        for _ in 0..3 {
            let before = system_ms();
            let ms = clock.wall_ms(Instant::now());
            let after = system_ms();
            assert!(
                before.saturating_sub(1) <= ms && ms <= after + 1,
                "{before} <= {ms} <= {after}"
            );
            std::thread::sleep(REANCHOR + Duration::from_millis(5));
        }
    }

    /// Instants map to the microsecond clock and back.
    #[test]
    fn instants_round_trip() {
        let clock = Clock::new();
        let at = Instant::now() + Duration::from_millis(7);
        let us = clock.us(at);
        assert_eq!(clock.us(clock.instant(us)), us);
        assert_eq!(clock.us(clock.epoch), 0);
    }
}
