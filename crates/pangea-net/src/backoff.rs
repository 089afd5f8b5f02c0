//! Reconnect delays: exponential backoff with full jitter, seeded.
//!
//! Why jitter: when a region comes back, every replica and frontend that lost it
//! reconnects; without jitter they all retry in lockstep and the returning replica
//! sees synchronized handshake storms. "Full jitter" (draw uniformly below the
//! exponential cap) spreads them best (AWS Architecture Blog, "Exponential Backoff
//! and Jitter", 2015). We keep a floor under the draw so a retry is never immediate.
//!
//! Why seeded: the simulator and tests replay a run from its seed.

use std::time::Duration;

use pangea_core::rng::Rng;

/// Exponential backoff with full jitter between a floor and a ceiling.
///
/// Attempt `n` (from 0) waits a uniform draw in `[floor, min(ceiling, floor * 2^(n+1))]`.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// Shortest delay: a failing peer is never retried in a tight loop.
    floor: Duration,
    /// Longest delay: bounds how long a recovered peer waits to be noticed.
    ceiling: Duration,
    /// Failed attempts since the last success (saturates; only the cap depends on it).
    attempt: u32,
    /// Draws the jitter.
    rng: Rng,
}

impl Backoff {
    /// A backoff whose delays lie in `[floor, ceiling]`. A ceiling below the floor
    /// is raised to the floor (constant delay) rather than rejected. The floor
    /// also sets the growth (`floor * 2^n`), so it should be positive: a zero floor
    /// gives zero delays.
    pub fn new(floor: Duration, ceiling: Duration, seed: u64) -> Self {
        Self {
            floor,
            ceiling: ceiling.max(floor),
            attempt: 0,
            rng: Rng::new(seed),
        }
    }

    /// The delay before the next attempt; each call counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        // floor * 2^(attempt+1), saturating: past 2^31 the cap is the ceiling anyway.
        let factor = 1u32
            .checked_shl(self.attempt.saturating_add(1))
            .unwrap_or(u32::MAX);
        let cap = self.floor.saturating_mul(factor).min(self.ceiling);
        self.attempt = self.attempt.saturating_add(1).min(31);
        let span_ns = u64::try_from((cap - self.floor).as_nanos()).unwrap_or(u64::MAX);
        self.floor + Duration::from_nanos(self.rng.next_u64_inclusive(span_ns))
    }

    /// Call after a success: the next failure starts again from the floor.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Failures counted since the last reset (capped at 31).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: Duration = Duration::from_millis(100);
    const CEILING: Duration = Duration::from_secs(10);

    #[test]
    fn delays_stay_within_the_exponential_cap() {
        let mut backoff = Backoff::new(FLOOR, CEILING, 42);
        for attempt in 0..40u32 {
            let delay = backoff.next_delay();
            let cap = FLOOR
                .saturating_mul(1u32.checked_shl(attempt + 1).unwrap_or(u32::MAX))
                .min(CEILING);
            assert!(delay >= FLOOR, "attempt {attempt}: {delay:?} below floor");
            assert!(
                delay <= cap,
                "attempt {attempt}: {delay:?} above cap {cap:?}"
            );
        }
    }

    #[test]
    fn delays_grow_then_reset() {
        let mut backoff = Backoff::new(FLOOR, CEILING, 7);
        for _ in 0..20 {
            backoff.next_delay();
        }
        // At the ceiling, draws are spread over [floor, ceiling]: the mean of many
        // is far above the first attempt's cap (2 * floor).
        let late: Duration = (0..100).map(|_| backoff.next_delay()).sum::<Duration>() / 100;
        assert!(late > Duration::from_secs(3), "mean late delay {late:?}");
        backoff.reset();
        assert_eq!(backoff.attempt(), 0);
        assert!(backoff.next_delay() <= FLOOR * 2);
    }

    #[test]
    fn same_seed_same_delays() {
        let mut a = Backoff::new(FLOOR, CEILING, 99);
        let mut b = Backoff::new(FLOOR, CEILING, 99);
        let mut c = Backoff::new(FLOOR, CEILING, 100);
        let da: Vec<_> = (0..10).map(|_| a.next_delay()).collect();
        let db: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        let dc: Vec<_> = (0..10).map(|_| c.next_delay()).collect();
        assert_eq!(da, db);
        assert_ne!(da, dc);
    }

    #[test]
    fn degenerate_bounds() {
        let mut constant = Backoff::new(FLOOR, Duration::ZERO, 1);
        for _ in 0..5 {
            assert_eq!(constant.next_delay(), FLOOR);
        }
        let mut zero = Backoff::new(Duration::ZERO, Duration::ZERO, 1);
        assert_eq!(zero.next_delay(), Duration::ZERO);
    }
}
