//! The simulated frontends: what `pangea-client` keeps per process, in virtual time.
//!
//! Nothing here is a copy of the library. Every read and write is planned by
//! `pangea_core::read` over a [`View`] of this state, exactly as the client library
//! plans over its `Snapshot` (through an `OrderCache`, which gives the same order
//! and checks so in debug builds), and run by `pangea_core::frontend::call`'s state
//! machines, which the library drives too; the round-trip average, how long a
//! failed replica stays last in line, the refresh cadence and the hedger are
//! `pangea_core::frontend`. What lives here is only the state those functions
//! keep, indexed densely.

use crate::ids::Interner;
use crate::time::{SimDuration, SimTime};
use bytes::Bytes;
use pangea_core::frontend;
use pangea_core::read::{OrderCache, PeerView, freshness_now};
use pangea_core::{ReplicaId, ScopeId, ScopeWatermarks, Timestamp, Token};
use std::sync::Arc;

/// How long a replica that failed stays last in line (`frontend::DOWN_FOR`).
pub(crate) const DOWN_FOR: SimDuration = SimDuration::from_secs(frontend::DOWN_FOR.as_secs());
/// The pause between two rounds of background probes (`WATERMARK_REFRESH`).
pub(crate) const PROBE_INTERVAL: SimDuration =
    SimDuration::from_secs(frontend::WATERMARK_REFRESH.as_secs());
/// Timeout of one background probe (`frontend::PROBE_TIMEOUT`).
pub(crate) const PROBE_TIMEOUT: SimDuration =
    SimDuration::from_secs(frontend::PROBE_TIMEOUT.as_secs());
/// How long a replica a probe could not reach stays last (`PROBE_DOWN_FOR`).
const PROBE_DOWN_FOR: SimDuration = SimDuration::from_secs(frontend::PROBE_DOWN_FOR.as_secs());

/// The period of a frontend's timer wheel (`frontend::TIMER_TICK`), µs.
const TIMER_TICK_US: u64 = frontend::TIMER_TICK.as_micros() as u64;

/// One frontend process.
#[derive(Debug)]
pub(crate) struct Client {
    /// Dense region index (the network's).
    pub(crate) region: usize,
    pub(crate) region_id: pangea_core::ids::RegionId,
    /// Round-trip EWMA per replica (ms), by replica index.
    rtt_ms: Vec<Option<f64>>,
    /// Marked down until, by replica index.
    down_until: Vec<SimTime>,
    /// Down marks not known to have run out yet: (until, replica), at most one per
    /// replica (its newest).
    down_marks: Vec<(SimTime, usize)>,
    /// The library's read orders kept between reads, told of every change to
    /// `rtt_ms` and `down_until` (by rank: `rank_of`).
    pub(crate) orders: OrderCache,
    /// The rank (`PeerView::rtt_ms_ranked`) of each replica index.
    rank_of: Arc<[usize]>,
    /// Last-known watermarks, `[scope][replica]`, with their freshness computed
    /// once when learnt (planning a bounded read asks it of every candidate).
    known: Vec<Vec<Option<Known>>>,
    /// The library's hedger, on virtual time (µs).
    pub(crate) hedger: frontend::Hedger,
    /// The key and token of this frontend's last acknowledged write.
    pub(crate) last_write: Option<(Bytes, Token)>,
    /// Background probes in flight, by replica: when each was sent.
    pub(crate) probe_sent: Vec<Option<SimTime>>,
    /// Probes of the current round not yet answered or timed out.
    pub(crate) probes_pending: usize,
    /// Location metadata as this frontend last read it, and the replica it reads
    /// it from (the first row-storing replica of its region).
    pub(crate) location: pangea_core::location::Location,
    pub(crate) location_source: Option<usize>,
    /// Where in the millisecond this frontend's timer ticks fall (µs, < 1,000):
    /// see [`Client::timer_fires`].
    timer_phase_us: u64,
}

impl Client {
    pub(crate) fn new(
        region: usize,
        region_id: pangea_core::ids::RegionId,
        rank_of: Arc<[usize]>,
        scopes: usize,
        now: SimTime,
        timer_phase_us: u64,
    ) -> Self {
        let replicas = rank_of.len();
        Client {
            region,
            region_id,
            rtt_ms: vec![None; replicas],
            down_until: vec![SimTime::ZERO; replicas],
            down_marks: Vec::new(),
            orders: OrderCache::new(),
            rank_of,
            known: vec![vec![None; replicas]; scopes],
            hedger: frontend::Hedger::new(now.as_us()),
            last_write: None,
            probe_sent: vec![None; replicas],
            probes_pending: 0,
            location: pangea_core::location::Location::default(),
            location_source: None,
            timer_phase_us: timer_phase_us % TIMER_TICK_US,
        }
    }

    /// When a timer this frontend sets for `at_us` fires. The library waits on
    /// tokio's timers, which fire on the first tick of the runtime's 1 ms wheel at
    /// or after their deadline, so a hedge due after 2 ms goes out 2–3 ms after
    /// its read: modelled exactly, a frontend hedged several times as often as a
    /// live one (docs/drills.md, "Fidelity"). Each frontend's ticks fall at its own
    /// point in the millisecond, as runtimes started at different moments do.
    pub(crate) fn timer_fires(&self, at_us: u64) -> u64 {
        let phase = self.timer_phase_us;
        if at_us <= phase {
            return phase;
        }
        phase + (at_us - phase).div_ceil(TIMER_TICK_US) * TIMER_TICK_US
    }

    /// The round-trip estimate of replica `r`, in ms.
    pub(crate) fn rtt_ms_of(&self, r: usize) -> Option<f64> {
        self.rtt_ms[r]
    }

    /// `Inner::note_rtt`.
    pub(crate) fn note_rtt(&mut self, r: usize, elapsed: SimDuration) {
        self.rtt_ms[r] = Some(frontend::rtt_ewma(self.rtt_ms[r], elapsed.as_ms_f64()));
        self.orders.invalidate(self.rank_of[r]);
    }

    /// `Inner::note_slower`: a request to `r` has been out `at_least` and lost
    /// the race: raise its estimate toward that.
    pub(crate) fn note_slower(&mut self, r: usize, at_least: SimDuration) {
        if let Some(raised) =
            self.rtt_ms[r].and_then(|e| frontend::rtt_raised(e, at_least.as_ms_f64()))
        {
            self.rtt_ms[r] = Some(raised);
            self.orders.invalidate(self.rank_of[r]);
        }
    }

    /// `Inner::no_answer`: a request to `r` got no answer in `waited`: gone
    /// (marked down), or slower than its estimate (`frontend::after_silence`,
    /// judged on the estimate as it was).
    pub(crate) fn no_answer(&mut self, r: usize, waited: SimDuration, now: SimTime) {
        match frontend::after_silence(self.rtt_ms[r], waited.as_ms_f64()) {
            frontend::Silence::Gone => self.mark_down(r, now),
            frontend::Silence::Slower(raised) => {
                self.rtt_ms[r] = Some(raised);
                self.orders.invalidate(self.rank_of[r]);
            }
            frontend::Silence::AsExpected => {}
        }
    }

    pub(crate) fn mark_down(&mut self, r: usize, now: SimTime) {
        self.set_down_until(r, now + DOWN_FOR);
    }

    /// A background probe of `r` failed or timed out.
    pub(crate) fn mark_unreachable(&mut self, r: usize, now: SimTime) {
        self.set_down_until(r, now + PROBE_DOWN_FOR);
    }

    /// A background probe of `r` answered: it is up.
    pub(crate) fn mark_up(&mut self, r: usize) {
        self.set_down_until(r, SimTime::ZERO);
    }

    fn set_down_until(&mut self, r: usize, until: SimTime) {
        self.down_until[r] = until;
        self.orders.invalidate(self.rank_of[r]);
        // A newer mark replaces the replica's older one: the replica stays down
        // past the older one's end.
        self.down_marks.retain(|&(_, x)| x != r);
        if until > SimTime::ZERO {
            self.down_marks.push((until, r));
        }
    }

    /// Tells the read orders of the down marks that ran out by `now` (a replica
    /// is down while `now < down_until`). Before every plan.
    pub(crate) fn expire_down_marks(&mut self, now: SimTime) {
        let mut i = 0;
        while i < self.down_marks.len() {
            let (until, r) = self.down_marks[i];
            if until <= now {
                self.orders.invalidate(self.rank_of[r]);
                self.down_marks.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Keeps what replica `r` said, at `now_ms` on the frontends' clock, of its
    /// watermarks in `scope`.
    pub(crate) fn learn(&mut self, r: usize, scope: usize, wm: ScopeWatermarks, now_ms: u64) {
        if let Some(row) = self.known.get_mut(scope) {
            let fresh = wm.freshness();
            row[r] = Some(Known {
                watermarks: wm,
                fresh,
                learned_ms: now_ms,
            });
        }
    }
}

/// A replica's watermarks for one scope as its last answer gave them (the
/// library's `Known`).
#[derive(Debug, Clone)]
struct Known {
    watermarks: ScopeWatermarks,
    /// `watermarks.freshness()`, computed once (planning a bounded read asks it
    /// of every candidate).
    fresh: Timestamp,
    /// The frontends' wall clock when the answer arrived, ms.
    learned_ms: u64,
}

/// What `plan_read` sees: the client's state for one scope at one instant (the
/// library's `Snapshot`).
pub(crate) struct View<'a> {
    pub(crate) client: &'a Client,
    pub(crate) replicas: &'a Interner,
    /// The replica index of each of the deployment's replicas, in id order.
    pub(crate) ranked: &'a [Option<usize>],
    pub(crate) scope: usize,
    pub(crate) now: SimTime,
    /// `now` on the frontends' wall clock, ms.
    pub(crate) now_ms: u64,
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

    fn covers(&self, replica: &ReplicaId, token: &Token) -> bool {
        self.known(replica)
            .is_some_and(|k| k.watermarks.covers(token))
    }

    fn freshness(&self, replica: &ReplicaId, _scope: &ScopeId) -> Option<Timestamp> {
        self.known(replica)
            .map(|k| freshness_now(k.fresh, k.learned_ms, self.now_ms))
    }

    fn rtt_ms_ranked(&self, rank: usize, replica: &ReplicaId) -> Option<f64> {
        match self.ranked.get(rank) {
            Some(r) => self.client.rtt_ms[(*r)?],
            None => self.rtt_ms(replica),
        }
    }

    fn is_down_ranked(&self, rank: usize, replica: &ReplicaId) -> bool {
        match self.ranked.get(rank) {
            Some(r) => r.is_some_and(|r| self.client.down_until[r] > self.now),
            None => self.is_down(replica),
        }
    }

    fn covers_ranked(&self, rank: usize, replica: &ReplicaId, token: &Token) -> bool {
        self.known_ranked(rank, replica)
            .is_some_and(|k| k.watermarks.covers(token))
    }

    fn freshness_ranked(
        &self,
        rank: usize,
        replica: &ReplicaId,
        _scope: &ScopeId,
    ) -> Option<Timestamp> {
        self.known_ranked(rank, replica)
            .map(|k| freshness_now(k.fresh, k.learned_ms, self.now_ms))
    }
}

impl View<'_> {
    /// The client's last-known watermarks of `replica` for this view's scope.
    fn known(&self, replica: &ReplicaId) -> Option<&Known> {
        let r = self.replicas.get(replica.as_str())?;
        self.client.known.get(self.scope)?.get(r)?.as_ref()
    }

    /// [`View::known`] by rank.
    fn known_ranked(&self, rank: usize, replica: &ReplicaId) -> Option<&Known> {
        match self.ranked.get(rank) {
            Some(r) => self.client.known.get(self.scope)?.get((*r)?)?.as_ref(),
            None => self.known(replica),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frontend(phase_us: u64) -> Client {
        let rank_of: Arc<[usize]> = vec![0].into();
        Client::new(0, "r1".into(), rank_of, 1, SimTime::ZERO, phase_us)
    }

    #[test]
    fn timers_fire_on_the_first_tick_at_or_after_their_deadline() {
        let c = frontend(250);
        // Ticks at 250, 1,250, 2,250 … µs.
        assert_eq!(c.timer_fires(0), 250);
        assert_eq!(c.timer_fires(250), 250);
        assert_eq!(c.timer_fires(251), 1_250);
        assert_eq!(c.timer_fires(1_250), 1_250);
        assert_eq!(c.timer_fires(2_000), 2_250);
        // A hedge due 2 ms after a read sent just after a tick goes out almost
        // 3 ms after it.
        assert_eq!(c.timer_fires(1_251 + 2_000) - 1_251, 2_999);
        // The phase is taken within the millisecond.
        assert_eq!(frontend(3_700).timer_fires(5_000), 5_700);
    }
}
