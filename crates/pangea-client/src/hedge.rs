//! Hedging: `pangea_core::frontend::Hedger` (shared with the simulator) behind a
//! lock, on this process's monotonic clock.

use pangea_core::frontend::{HedgePolicy, Hedger as Core};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct Hedger {
    epoch: Instant,
    state: Mutex<Core>,
}

impl Hedger {
    pub(crate) fn new() -> Self {
        Hedger {
            epoch: Instant::now(),
            state: Mutex::new(Core::new(0)),
        }
    }

    fn us_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Core> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the latency of an answer that came in at `at`.
    pub(crate) fn record(&self, at: Instant, latency: Duration) {
        let now = self.us_at(at);
        self.state().record(now, latency);
    }

    /// The delay before hedging one request, and earns this request's share of the
    /// hedge budget.
    pub(crate) fn delay(&self, policy: &HedgePolicy, deadline: Duration) -> Duration {
        self.state().delay(policy, deadline)
    }

    /// Spends one hedge from the budget, if there is one.
    pub(crate) fn try_spend(&self) -> bool {
        self.state().try_spend()
    }
}
