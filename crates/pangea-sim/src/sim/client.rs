//! The simulated frontends: what `pangea-client` keeps per process, in virtual time.
//!
//! Routing is not reimplemented here: every read and write is planned by
//! `pangea_core::read::plan_read` over a [`View`] of this state, exactly as the
//! client library plans over its `Snapshot`. What lives here is the client's memory
//! (round-trip EWMA, replicas marked down, last-known watermarks from responses and
//! probes, the hedge budget) and its constants, copied from `pangea-client`
//! (`DOWN_FOR`, `RTT_EWMA_ALPHA`, `WATERMARK_REFRESH`, the `HedgePolicy` defaults).

use crate::ids::Interner;
use crate::sim::metrics::{histogram, record};
use crate::time::{SimDuration, SimTime};
use bytes::Bytes;
use hdrhistogram::Histogram;
use pangea_core::read::PeerView;
use pangea_core::{ReplicaId, ScopeId, ScopeWatermarks, Token};

/// How long a replica that failed stays last in line (pangea-client `DOWN_FOR`).
pub(crate) const DOWN_FOR: SimDuration = SimDuration::from_secs(1);
/// Weight of a new sample in the round-trip average (`RTT_EWMA_ALPHA`).
const RTT_EWMA_ALPHA: f64 = 0.2;
/// How often known watermarks and round trips are refreshed (`WATERMARK_REFRESH`).
pub(crate) const PROBE_INTERVAL: SimDuration = SimDuration::from_secs(2);
/// Timeout of one background probe (the client's refresh uses 1 s).
pub(crate) const PROBE_TIMEOUT: SimDuration = SimDuration::from_secs(1);

/// The client library's `HedgePolicy::default()`: p95 of recent latencies, clamped
/// to [2 ms, 50 ms] and to half the deadline, at most 5 % extra requests.
const HEDGE_PERCENTILE: f64 = 0.95;
const HEDGE_FLOOR: SimDuration = SimDuration::from_ms(2);
const HEDGE_CEILING: SimDuration = SimDuration::from_ms(50);
const HEDGE_BUDGET_FRACTION: f64 = 0.05;
/// Recent latencies are kept over two windows of this length (hedge.rs `WINDOW`).
const HEDGE_WINDOW: SimDuration = SimDuration::from_secs(10);
/// Fewer samples than this: hedge at the ceiling (hedge.rs `SAMPLES_MIN`).
const HEDGE_SAMPLES_MIN: u64 = 20;
/// Most saved-up hedges (hedge.rs `TOKENS_MAX`).
const HEDGE_TOKENS_MAX: f64 = 10.0;
/// The simulator recomputes the percentile after this many new samples instead of
/// on every request (the library merges two histograms per request): the delay is
/// at most 16 samples stale, a difference no p95 over thousands of samples shows.
const HEDGE_REFRESH_SAMPLES: u64 = 16;

/// hedge.rs, in virtual time.
#[derive(Debug)]
pub(crate) struct Hedger {
    current: Histogram<u64>,
    /// `previous + current`, maintained incrementally.
    merged: Histogram<u64>,
    window_start: SimTime,
    tokens: f64,
    /// The p95 of `merged` as of `merged_len_at`.
    cached_p: Option<SimDuration>,
    merged_len_at: u64,
}

impl Hedger {
    pub(crate) fn new(now: SimTime) -> Self {
        Hedger {
            current: histogram(),
            merged: histogram(),
            window_start: now,
            tokens: 1.0,
            cached_p: None,
            merged_len_at: 0,
        }
    }

    pub(crate) fn record(&mut self, now: SimTime, latency: SimDuration) {
        if now.saturating_since(self.window_start) > HEDGE_WINDOW {
            let previous = std::mem::replace(&mut self.current, histogram());
            self.merged = previous;
            self.window_start = now;
            self.cached_p = None;
        }
        let us = latency.as_us().max(1);
        record(&mut self.current, us);
        record(&mut self.merged, us);
    }

    /// The delay before hedging one request; earns the request's share of budget.
    pub(crate) fn delay(&mut self, deadline: SimDuration) -> SimDuration {
        self.tokens = (self.tokens + HEDGE_BUDGET_FRACTION).min(HEDGE_TOKENS_MAX);
        let ceiling = HEDGE_CEILING.min(SimDuration::from_us(deadline.as_us() / 2));
        let n = self.merged.len();
        let d = if n >= HEDGE_SAMPLES_MIN {
            if self.cached_p.is_none() || n >= self.merged_len_at + HEDGE_REFRESH_SAMPLES {
                self.cached_p = Some(SimDuration::from_us(
                    self.merged.value_at_quantile(HEDGE_PERCENTILE),
                ));
                self.merged_len_at = n;
            }
            self.cached_p.unwrap_or(ceiling)
        } else {
            ceiling
        };
        let floor = HEDGE_FLOOR.min(ceiling);
        d.max(floor).min(ceiling)
    }

    pub(crate) fn try_spend(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One frontend process.
#[derive(Debug)]
pub(crate) struct Client {
    /// Dense region index (the network's).
    pub(crate) region: usize,
    pub(crate) region_id: pangea_core::ids::RegionId,
    /// Round-trip EWMA per replica (ms), by replica index.
    pub(crate) rtt_ms: Vec<Option<f64>>,
    /// Marked down until, by replica index.
    pub(crate) down_until: Vec<SimTime>,
    /// Last-known watermarks, `[scope][replica]`.
    pub(crate) known: Vec<Vec<Option<ScopeWatermarks>>>,
    pub(crate) hedger: Hedger,
    /// The key and token of this frontend's last acknowledged write.
    pub(crate) last_write: Option<(Bytes, Token)>,
    /// Background probes in flight, by replica: when each was sent.
    pub(crate) probe_sent: Vec<Option<SimTime>>,
}

impl Client {
    pub(crate) fn new(
        region: usize,
        region_id: pangea_core::ids::RegionId,
        replicas: usize,
        scopes: usize,
        now: SimTime,
    ) -> Self {
        Client {
            region,
            region_id,
            rtt_ms: vec![None; replicas],
            down_until: vec![SimTime::ZERO; replicas],
            known: vec![vec![None; replicas]; scopes],
            hedger: Hedger::new(now),
            last_write: None,
            probe_sent: vec![None; replicas],
        }
    }

    /// `Inner::note_rtt`.
    pub(crate) fn note_rtt(&mut self, r: usize, elapsed: SimDuration) {
        let ms = elapsed.as_ms_f64();
        let e = self.rtt_ms[r].get_or_insert(ms);
        *e = *e * (1.0 - RTT_EWMA_ALPHA) + ms * RTT_EWMA_ALPHA;
    }

    pub(crate) fn mark_down(&mut self, r: usize, now: SimTime) {
        self.down_until[r] = now + DOWN_FOR;
    }

    pub(crate) fn learn(&mut self, r: usize, scope: usize, wm: ScopeWatermarks) {
        if let Some(row) = self.known.get_mut(scope) {
            row[r] = Some(wm);
        }
    }
}

/// What `plan_read` sees: the client's state for one scope at one instant (the
/// library's `Snapshot`).
pub(crate) struct View<'a> {
    pub(crate) client: &'a Client,
    pub(crate) replicas: &'a Interner,
    pub(crate) scope: usize,
    pub(crate) now: SimTime,
}

impl PeerView for View<'_> {
    fn rtt_ms(&self, replica: &ReplicaId) -> Option<f64> {
        let r = self.replicas.get(replica.as_str())?;
        self.client.rtt_ms[r]
    }

    fn is_down(&self, replica: &ReplicaId) -> bool {
        self.replicas
            .get(replica.as_str())
            .is_some_and(|r| self.client.down_until[r] > self.now)
    }

    fn watermarks(&self, replica: &ReplicaId, _scope: &ScopeId) -> Option<&ScopeWatermarks> {
        let r = self.replicas.get(replica.as_str())?;
        self.client.known.get(self.scope)?.get(r)?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hedge_delay_follows_recent_latency_within_bounds() {
        let mut h = Hedger::new(SimTime::ZERO);
        let deadline = SimDuration::from_ms(20);
        assert_eq!(h.delay(deadline), SimDuration::from_ms(10), "no samples");
        for _ in 0..100 {
            h.record(SimTime::ZERO, SimDuration::from_ms(4));
        }
        let d = h.delay(deadline);
        assert!(d >= SimDuration::from_ms(3) && d <= SimDuration::from_ms(5));
        let mut fast = Hedger::new(SimTime::ZERO);
        for _ in 0..100 {
            fast.record(SimTime::ZERO, SimDuration::from_us(100));
        }
        assert_eq!(fast.delay(deadline), SimDuration::from_ms(2), "the floor");
    }

    #[test]
    fn hedge_budget_allows_about_five_percent() {
        let mut h = Hedger::new(SimTime::ZERO);
        let mut hedges = 0;
        for _ in 0..1_000 {
            let _ = h.delay(SimDuration::from_ms(20));
            if h.try_spend() {
                hedges += 1;
            }
        }
        assert!((50..=52).contains(&hedges), "{hedges}");
    }
}
