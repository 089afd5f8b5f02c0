//! Hedging: how long to wait before a second request, and a budget that turns
//! hedging off when everything is slow (so hedges cannot double the load).

use crate::options::HedgePolicy;
use hdrhistogram::Histogram;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Recent latencies are kept over two windows of this length.
const WINDOW: Duration = Duration::from_secs(10);
/// Fewer samples than this: use the ceiling.
const SAMPLES_MIN: u64 = 20;
/// Most saved-up hedges.
const TOKENS_MAX: f64 = 10.0;

#[derive(Debug)]
struct State {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    window_start: Instant,
    tokens: f64,
}

#[derive(Debug)]
pub(crate) struct Hedger {
    state: Mutex<State>,
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 µs to 60 s, 2 significant digits: a few KiB.
    Histogram::new_with_bounds(1, 60_000_000, 2).expect("static bounds are valid")
}

impl Hedger {
    pub(crate) fn new() -> Self {
        Hedger {
            state: Mutex::new(State {
                current: histogram(),
                previous: histogram(),
                window_start: Instant::now(),
                tokens: 1.0,
            }),
        }
    }

    pub(crate) fn record(&self, latency: Duration) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.window_start.elapsed() > WINDOW {
            s.previous = std::mem::replace(&mut s.current, histogram());
            s.window_start = Instant::now();
        }
        let _ = s.current.record((latency.as_micros() as u64).max(1));
    }

    /// The delay before hedging one request, and earns this request's share of the
    /// hedge budget.
    pub(crate) fn delay(&self, policy: &HedgePolicy, deadline: Duration) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.tokens = (s.tokens + policy.budget_fraction).min(TOKENS_MAX);
        let ceiling = policy.ceiling.min(deadline / 2);
        let mut merged = s.previous.clone();
        let _ = merged.add(&s.current);
        let d = if merged.len() >= SAMPLES_MIN {
            Duration::from_micros(merged.value_at_quantile(policy.percentile))
        } else {
            ceiling
        };
        d.clamp(policy.floor.min(ceiling), ceiling)
    }

    /// Spends one hedge from the budget, if there is one.
    pub(crate) fn try_spend(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_follows_recent_latency_within_bounds() {
        let h = Hedger::new();
        let p = HedgePolicy::default();
        assert_eq!(
            h.delay(&p, Duration::from_millis(20)),
            Duration::from_millis(10),
            "no samples: the ceiling (half the deadline)"
        );
        for _ in 0..100 {
            h.record(Duration::from_millis(4));
        }
        let d = h.delay(&p, Duration::from_millis(20));
        assert!(
            d >= Duration::from_millis(3) && d <= Duration::from_millis(5),
            "{d:?}"
        );
        let fast = Hedger::new();
        for _ in 0..100 {
            fast.record(Duration::from_micros(100));
        }
        assert_eq!(
            fast.delay(&p, Duration::from_millis(20)),
            Duration::from_millis(2),
            "clamped to the floor"
        );
    }

    #[test]
    fn budget_allows_about_five_percent() {
        let h = Hedger::new();
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
}
