//! What a frontend remembers between requests, and the constants it runs by: shared
//! by `pangea-client` (real time) and the simulator's clients (virtual time), so a
//! drill's frontends hedge, fail over and refresh exactly as the library does.
//!
//! Time comes in as microseconds on the caller's own monotonic clock (`now_us`), as
//! everywhere in this crate.
//!
//! - Round trips: an EWMA per replica ([`rtt_ewma`]), raised by requests that lost a
//!   race ([`rtt_raised`]).
//! - Failures: a replica that failed is tried last for [`DOWN_FOR`]; one a probe
//!   could not reach, for [`PROBE_DOWN_FOR`]; one that let a request run out a budget
//!   of several round trips is taken for gone ([`looks_gone`]).
//! - Background refresh: every [`WATERMARK_REFRESH`], each usable replica is asked
//!   for its watermarks, each probe bounded by [`PROBE_TIMEOUT`].
//! - Hedging ([`Hedger`], The Tail at Scale): after a delay taken from recent
//!   latency ([`HedgePolicy`]), a second request, within a token-bucket budget.
//! - One call ([`call`]): a read's or a write's decisions — hedge, fail over, race
//!   the fallbacks, give up — as a sans-IO state machine both drivers run.

pub mod call;

use hdrhistogram::Histogram;
use std::time::Duration;

/// How long a replica that failed a request stays last in line.
pub const DOWN_FOR: Duration = Duration::from_secs(1);
/// Weight of a new sample in the round-trip average.
pub const RTT_EWMA_ALPHA: f64 = 0.2;
/// How often known watermarks and round trips are refreshed in the background (the
/// pause between the end of one round of probes and the next).
pub const WATERMARK_REFRESH: Duration = Duration::from_secs(1);
/// Timeout of one background probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// A replica a background probe could not reach is tried last until a later probe
/// reaches it, or for this long.
pub const PROBE_DOWN_FOR: Duration = Duration::from_secs(3);
/// The resolution of a frontend's timers (tokio's timer wheel): a call's
/// deadlines and hedge timers fire on the first tick at or after their time. The
/// simulator rounds its frontends' timers to it; load generators aim half a tick
/// early to send on time.
pub const TIMER_TICK: Duration = Duration::from_millis(1);

/// Most rows one scan page holds, whatever the client asks (replicas cap it;
/// a client merging pages of many processes cuts to it too).
pub const SCAN_ROWS_MAX: usize = 1_000;
/// Rows a scan page holds when the client does not say.
pub const SCAN_ROWS_DEFAULT: usize = 100;

/// How often a call refreshes location metadata and plans again after replicas
/// refused its row. More than once: the replica answering the refresh (the one
/// holding the client's cursor) may not yet have applied the change the refusing
/// replica already acts on; it applies it milliseconds later — or, on a loaded
/// machine or over a slow link, a few hundred: the waits double up to 320 ms
/// (630 ms in all), and the call's deadline ends them first.
pub const POLICY_REFRESH_ROUNDS: u32 = 7;
/// The wait before the second and later refreshes (doubled each time).
pub const POLICY_REFRESH_BACKOFF: Duration = Duration::from_millis(10);

/// The wait before refresh `round` (0-based) after a refusal, or `None` past
/// [`POLICY_REFRESH_ROUNDS`].
pub fn policy_refresh_wait(round: u32) -> Option<Duration> {
    match round {
        r if r >= POLICY_REFRESH_ROUNDS => None,
        0 => Some(Duration::ZERO),
        r => Some(POLICY_REFRESH_BACKOFF * (1 << (r - 1))),
    }
}

/// The round-trip average after a new sample (the first sample is taken as is).
pub fn rtt_ewma(current: Option<f64>, sample_ms: f64) -> f64 {
    match current {
        Some(e) => e * (1.0 - RTT_EWMA_ALPHA) + sample_ms * RTT_EWMA_ALPHA,
        None => sample_ms,
    }
}

/// A request outstanding for `at_least_ms` lost the race: the raised average, if
/// that is above the current one (a slow replica always beaten by a hedge would
/// otherwise look fast forever).
pub fn rtt_raised(current: f64, at_least_ms: f64) -> Option<f64> {
    (current < at_least_ms).then(|| rtt_ewma(Some(current), at_least_ms))
}

/// Whether a replica that let a request use up `budget_ms` without an answer is
/// likely gone rather than slow: the budget was several of its round trips. (A
/// killed process keeps a QUIC connection open until its idle timeout, so silence is
/// the only sign.)
pub fn looks_gone(budget_ms: f64, rtt_ms: Option<f64>) -> bool {
    let rtt_ms = rtt_ms.unwrap_or(f64::INFINITY).min(1e9);
    budget_ms > 4.0 * rtt_ms + 20.0
}

/// What a request left `silent_ms` without an answer (its call stopped waiting
/// for it) says about its replica, judged on the round-trip estimate as it was:
/// gone after several round trips ([`looks_gone`]), else slower than estimated
/// ([`rtt_raised`]). Gone is judged before raising: judged after, a silence long
/// enough to mark a replica gone could raise its estimate so far that it no
/// longer looks gone.
pub fn after_silence(rtt_ms: Option<f64>, silent_ms: f64) -> Silence {
    if looks_gone(silent_ms, rtt_ms) {
        return Silence::Gone;
    }
    match rtt_ms.and_then(|r| rtt_raised(r, silent_ms)) {
        Some(raised) => Silence::Slower(raised),
        None => Silence::AsExpected,
    }
}

/// See [`after_silence`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Silence {
    /// Mark it down and drop its connection.
    Gone,
    /// Its round-trip estimate, raised.
    Slower(f64),
    AsExpected,
}

/// How long a read that may not be hedged ([`crate::read::Consistency::may_hedge`])
/// waits on a silent replica before it counts as gone and the next candidate is
/// asked: the budget after which [`looks_gone`] says so (four of its round trips
/// and 20 ms; 100 ms while its round trip is unknown). A failover, not a hedge.
pub fn gone_after(rtt_ms: Option<f64>) -> std::time::Duration {
    let ms = rtt_ms.map_or(100.0, |r| 4.0 * r.min(1e9) + 20.0);
    std::time::Duration::from_micros((ms * 1_000.0).ceil() as u64)
}

/// When to hedge a read: after the `percentile` of recent latencies, clamped to
/// [`floor`, `ceiling`] (and to half the deadline), within a budget of
/// `budget_fraction` extra requests.
///
/// [`floor`]: HedgePolicy::floor
/// [`ceiling`]: HedgePolicy::ceiling
#[derive(Debug, Clone, PartialEq)]
pub struct HedgePolicy {
    pub percentile: f64,
    pub floor: Duration,
    pub ceiling: Duration,
    /// At most this fraction of requests may be hedged (token bucket; default 5 %).
    pub budget_fraction: f64,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        HedgePolicy {
            percentile: 0.95,
            floor: Duration::from_millis(2),
            ceiling: Duration::from_millis(50),
            budget_fraction: 0.05,
        }
    }
}

/// Recent latencies are kept over two windows of this length.
const WINDOW_US: u64 = 10_000_000;
/// Fewer samples than this: hedge at the ceiling.
const SAMPLES_MIN: u64 = 20;
/// Most saved-up hedges.
const TOKENS_MAX: f64 = 10.0;
/// The percentile is recomputed after this many new samples rather than on every
/// request: the delay is at most 16 samples stale, which no p95 over the hundreds of
/// samples a window holds shows.
const REFRESH_SAMPLES: u64 = 16;
/// Histogram bounds: 1 µs to 60 s, 2 significant digits (a few KiB).
const HISTOGRAM_MAX_US: u64 = 60_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_US, 2).expect("static bounds are valid")
}

/// Hedging state of one frontend: recent latencies and the hedge budget.
#[derive(Debug, Clone)]
pub struct Hedger {
    /// Latencies of the current window.
    current: Histogram<u64>,
    /// The previous window plus the current one, kept up to date as samples come.
    recent: Histogram<u64>,
    window_start_us: u64,
    tokens: f64,
    /// The last computed percentile: (percentile, samples at the time, value in µs).
    cached: Option<(f64, u64, u64)>,
}

impl Hedger {
    pub fn new(now_us: u64) -> Self {
        Hedger {
            current: histogram(),
            recent: histogram(),
            window_start_us: now_us,
            tokens: 1.0,
            cached: None,
        }
    }

    /// One answered request took `latency`.
    pub fn record(&mut self, now_us: u64, latency: Duration) {
        if now_us.saturating_sub(self.window_start_us) > WINDOW_US {
            // The current window becomes the previous one: it is all `recent` keeps.
            self.recent = std::mem::replace(&mut self.current, histogram());
            self.window_start_us = now_us;
            self.cached = None;
        }
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, HISTOGRAM_MAX_US);
        // In bounds, so recording cannot fail.
        let _ = self.current.record(us);
        let _ = self.recent.record(us);
    }

    /// The delay before hedging one request with `deadline`; earns this request's
    /// share of the hedge budget.
    pub fn delay(&mut self, policy: &HedgePolicy, deadline: Duration) -> Duration {
        self.tokens = (self.tokens + policy.budget_fraction).min(TOKENS_MAX);
        let ceiling = policy.ceiling.min(deadline / 2);
        let n = self.recent.len();
        let d = if n >= SAMPLES_MIN {
            let fresh = self
                .cached
                .filter(|&(p, at, _)| p == policy.percentile && n < at + REFRESH_SAMPLES);
            let us = match fresh {
                Some((_, _, us)) => us,
                None => {
                    let us = self.recent.value_at_quantile(policy.percentile);
                    self.cached = Some((policy.percentile, n, us));
                    us
                }
            };
            Duration::from_micros(us)
        } else {
            ceiling
        };
        d.clamp(policy.floor.min(ceiling), ceiling)
    }

    /// Spends one hedge from the budget, if there is one.
    pub fn try_spend(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    #[test]
    fn refusal_refreshes_back_off_to_a_bounded_total() {
        let waits: Vec<_> = (0..10).map_while(policy_refresh_wait).collect();
        assert_eq!(waits.len(), POLICY_REFRESH_ROUNDS as usize);
        assert_eq!(waits[0], Duration::ZERO, "the first refresh is at once");
        assert_eq!(waits[1], POLICY_REFRESH_BACKOFF);
        assert!(waits.windows(2).skip(1).all(|w| w[1] == w[0] * 2));
        let total: Duration = waits.iter().sum();
        assert_eq!(
            total,
            Duration::from_millis(630),
            "below a read's 1 s default deadline"
        );
    }

    #[test]
    fn delay_follows_recent_latency_within_bounds() {
        let p = HedgePolicy::default();
        let deadline = Duration::from_millis(20);
        let mut h = Hedger::new(0);
        assert_eq!(
            h.delay(&p, deadline),
            Duration::from_millis(10),
            "no samples: the ceiling (half the deadline)"
        );
        for i in 0..100 {
            h.record(i * MS, Duration::from_millis(4));
        }
        let d = h.delay(&p, deadline);
        assert!(
            d >= Duration::from_millis(3) && d <= Duration::from_millis(5),
            "{d:?}"
        );
        let mut fast = Hedger::new(0);
        for i in 0..100 {
            fast.record(i * MS, Duration::from_micros(100));
        }
        assert_eq!(
            fast.delay(&p, deadline),
            Duration::from_millis(2),
            "clamped to the floor"
        );
    }

    #[test]
    fn old_windows_are_forgotten() {
        let p = HedgePolicy::default();
        let deadline = Duration::from_secs(1);
        let mut h = Hedger::new(0);
        for i in 0..200 {
            h.record(i * MS, Duration::from_millis(40));
        }
        assert!(h.delay(&p, deadline) >= Duration::from_millis(39));
        // Two windows later, only fast answers are remembered.
        for i in 0..200 {
            h.record(11_000 * MS + i * MS, Duration::from_millis(3));
        }
        for i in 0..200 {
            h.record(22_000 * MS + i * MS, Duration::from_millis(3));
        }
        let d = h.delay(&p, deadline);
        assert!(d <= Duration::from_millis(4), "{d:?}");
    }

    #[test]
    fn budget_allows_about_five_percent() {
        let mut h = Hedger::new(0);
        let p = HedgePolicy::default();
        let mut hedges = 0;
        for _ in 0..1_000 {
            let _ = h.delay(&p, Duration::from_millis(20));
            if h.try_spend() {
                hedges += 1;
            }
        }
        assert!(
            (50..=52).contains(&hedges),
            "{hedges} hedges for 1000 requests"
        );
    }

    #[test]
    fn round_trips_and_gone_replicas() {
        assert_eq!(rtt_ewma(None, 10.0), 10.0);
        assert!((rtt_ewma(Some(10.0), 20.0) - 12.0).abs() < 1e-9);
        assert_eq!(
            rtt_raised(30.0, 20.0),
            None,
            "a faster loss changes nothing"
        );
        assert!(rtt_raised(10.0, 20.0).is_some_and(|e| (e - 12.0).abs() < 1e-9));
        assert!(
            looks_gone(100.0, Some(5.0)),
            "100 ms is many 5 ms round trips"
        );
        assert!(!looks_gone(30.0, Some(5.0)));
        assert!(!looks_gone(1_000.0, None), "unknown round trip: never gone");
    }

    /// A request silent past [`gone_after`] says its replica is gone, judged on
    /// the estimate before the silence (not one raised by it).
    #[test]
    fn a_replica_silent_past_gone_after_is_gone_not_slower() {
        for rtt in [0.2, 5.0, 80.0] {
            let waited = gone_after(Some(rtt)).as_secs_f64() * 1e3 + 0.5;
            assert_eq!(after_silence(Some(rtt), waited), Silence::Gone, "rtt {rtt}");
        }
        assert!(matches!(after_silence(Some(10.0), 30.0), Silence::Slower(r) if r > 10.0));
        assert_eq!(after_silence(Some(10.0), 5.0), Silence::AsExpected);
        assert_eq!(after_silence(None, 5_000.0), Silence::AsExpected);
    }
}
