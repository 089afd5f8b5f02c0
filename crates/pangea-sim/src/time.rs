//! Virtual time.
//!
//! The simulator never reads a clock: [`SimTime`] is a count of microseconds since the
//! start of a run, and [`SimDuration`] a span of them. Microseconds are fine enough
//! for a WAN (the shortest delay we model, a 1 ms intra-region round trip, is 1,000
//! of them) and a `u64` of them lasts 584,000 years, so arithmetic saturates instead
//! of checking: a saturated time only appears after a bug that a test would see.
//!
//! Integers rather than `f64` so that times compare exactly and a run replays
//! bit-for-bit; conversions from milliseconds as `f64` (the unit of topology files)
//! round to the nearest microsecond.

use serde::Serialize;
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

const US_PER_MS: u64 = 1_000;
const US_PER_SEC: u64 = 1_000_000;

/// Converts milliseconds (`f64`, as topology files give them) to whole microseconds,
/// rounding to nearest. Negative and NaN give 0; huge values saturate (`as` does).
fn ms_f64_to_us(ms: f64) -> u64 {
    if ms.is_nan() || ms <= 0.0 {
        return 0;
    }
    // `as` from f64 saturates at u64::MAX, which is the documented behaviour.
    (ms * 1_000.0).round() as u64
}

/// A point in virtual time: microseconds since the start of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SimTime(u64);

/// A span of virtual time in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SimDuration(u64);

impl SimTime {
    /// The start of every run.
    pub const ZERO: SimTime = SimTime(0);
    /// The end of time; additions saturate here.
    pub const MAX: SimTime = SimTime(u64::MAX);

    pub const fn from_us(us: u64) -> Self {
        SimTime(us)
    }

    pub const fn from_ms(ms: u64) -> Self {
        SimTime(ms.saturating_mul(US_PER_MS))
    }

    pub const fn from_secs(secs: u64) -> Self {
        SimTime(secs.saturating_mul(US_PER_SEC))
    }

    /// Rounds to the nearest microsecond; negative or NaN gives [`SimTime::ZERO`].
    pub fn from_ms_f64(ms: f64) -> Self {
        SimTime(ms_f64_to_us(ms))
    }

    pub const fn as_us(self) -> u64 {
        self.0
    }

    pub fn as_ms_f64(self) -> f64 {
        // Exact below 2^53 µs (285 years).
        self.0 as f64 / 1_000.0
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }

    /// Time elapsed since `earlier`, or zero if `earlier` is later (as `std::time::Instant`).
    pub const fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }

    /// Time elapsed since `earlier`, or `None` if `earlier` is later.
    pub const fn checked_since(self, earlier: SimTime) -> Option<SimDuration> {
        match self.0.checked_sub(earlier.0) {
            Some(us) => Some(SimDuration(us)),
            None => None,
        }
    }
}

impl SimDuration {
    pub const ZERO: SimDuration = SimDuration(0);
    pub const MAX: SimDuration = SimDuration(u64::MAX);

    pub const fn from_us(us: u64) -> Self {
        SimDuration(us)
    }

    pub const fn from_ms(ms: u64) -> Self {
        SimDuration(ms.saturating_mul(US_PER_MS))
    }

    pub const fn from_secs(secs: u64) -> Self {
        SimDuration(secs.saturating_mul(US_PER_SEC))
    }

    /// Rounds to the nearest microsecond; negative or NaN gives zero.
    pub fn from_ms_f64(ms: f64) -> Self {
        SimDuration(ms_f64_to_us(ms))
    }

    pub const fn as_us(self) -> u64 {
        self.0
    }

    pub fn as_ms_f64(self) -> f64 {
        self.0 as f64 / 1_000.0
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub const fn saturating_mul(self, n: u64) -> SimDuration {
        SimDuration(self.0.saturating_mul(n))
    }
}

impl From<std::time::Duration> for SimDuration {
    /// Truncates to whole microseconds; saturates beyond `u64::MAX` µs.
    fn from(d: std::time::Duration) -> Self {
        SimDuration(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

impl From<SimDuration> for std::time::Duration {
    fn from(d: SimDuration) -> Self {
        std::time::Duration::from_micros(d.0)
    }
}

impl Add<SimDuration> for SimTime {
    type Output = SimTime;
    /// Saturates at [`SimTime::MAX`].
    fn add(self, d: SimDuration) -> SimTime {
        SimTime(self.0.saturating_add(d.0))
    }
}

impl AddAssign<SimDuration> for SimTime {
    fn add_assign(&mut self, d: SimDuration) {
        *self = *self + d;
    }
}

impl Sub<SimTime> for SimTime {
    type Output = SimDuration;
    /// Saturates at zero, as `std::time::Instant` does.
    fn sub(self, earlier: SimTime) -> SimDuration {
        self.saturating_since(earlier)
    }
}

impl Add for SimDuration {
    type Output = SimDuration;
    fn add(self, d: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(d.0))
    }
}

impl AddAssign for SimDuration {
    fn add_assign(&mut self, d: SimDuration) {
        *self = *self + d;
    }
}

impl Sub for SimDuration {
    type Output = SimDuration;
    /// Saturates at zero.
    fn sub(self, d: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_sub(d.0))
    }
}

/// Seconds with microsecond precision, e.g. `t=12.034500s`.
impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}.{:06}s", self.0 / US_PER_SEC, self.0 % US_PER_SEC)
    }
}

/// Milliseconds with microsecond precision, e.g. `34.800ms`.
impl fmt::Display for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}ms", self.0 / US_PER_MS, self.0 % US_PER_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_to_the_microsecond() {
        assert_eq!(SimTime::from_ms(3).as_us(), 3_000);
        assert_eq!(SimTime::from_secs(2).as_us(), 2_000_000);
        assert_eq!(SimDuration::from_ms_f64(69.6 / 2.0).as_us(), 34_800);
        assert_eq!(SimDuration::from_ms_f64(0.0004).as_us(), 0);
        assert_eq!(SimDuration::from_ms_f64(0.0005).as_us(), 1);
        assert_eq!(SimDuration::from_ms_f64(-5.0), SimDuration::ZERO);
        assert_eq!(SimDuration::from_ms_f64(f64::NAN), SimDuration::ZERO);
        assert_eq!(SimTime::from_us(1_500).as_ms_f64(), 1.5);
        assert_eq!(SimTime::from_ms(2_500).as_secs_f64(), 2.5);
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(SimTime::MAX + SimDuration::from_us(1), SimTime::MAX);
        assert_eq!(SimTime::from_us(5) - SimTime::from_us(9), SimDuration::ZERO);
        assert_eq!(SimTime::from_us(5).checked_since(SimTime::from_us(9)), None);
        assert_eq!(
            SimTime::from_us(9) - SimTime::from_us(5),
            SimDuration::from_us(4)
        );
        let mut t = SimTime::ZERO;
        t += SimDuration::from_ms(1);
        assert_eq!(t, SimTime::from_us(1_000));
    }

    #[test]
    fn display() {
        assert_eq!(SimTime::from_us(12_034_500).to_string(), "t=12.034500s");
        assert_eq!(SimDuration::from_us(34_800).to_string(), "34.800ms");
    }
}
