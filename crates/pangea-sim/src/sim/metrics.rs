//! What a run measures, and the JSON report it produces.
//!
//! Latencies are HDR histograms in microseconds (3 significant digits), reported in
//! milliseconds, so a drill's `p99_ms` reads like a real cluster's benchmark output
//! and the two compare field by field. Per-cell and per-time-bucket distributions
//! (the lag heatmap, latency over time) use [`LogBins`], a fixed-size log histogram
//! of ~9 % resolution, so hundreds of them stay small.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;

/// Microseconds, 1 µs to 1 hour: anything longer is clamped to an hour.
pub(crate) const HIST_MAX_US: u64 = 3_600_000_000;

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("static bounds are valid")
}

pub(crate) fn record(h: &mut Histogram<u64>, us: u64) {
    // Clamped into the bounds, so `record` cannot fail.
    let _ = h.record(us.clamp(1, HIST_MAX_US));
}

fn ms(us: u64) -> f64 {
    // Rounded to the microsecond, printed as ms.
    us as f64 / 1_000.0
}

/// Latency summary of one class of operations.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Operations issued.
    pub count: u64,
    /// Operations that failed (deadline, not covered, too stale, unavailable, policy).
    pub errors: u64,
    /// Over answered operations.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Counts and latencies of one class of operations.
#[derive(Debug, Clone)]
pub(crate) struct OpStats {
    pub(crate) count: u64,
    pub(crate) errors: u64,
    pub(crate) ok: Histogram<u64>,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            count: 0,
            errors: 0,
            ok: histogram(),
        }
    }
}

impl OpStats {
    /// Adds another shard's counts and latencies.
    pub(crate) fn absorb(&mut self, o: &OpStats) {
        self.count += o.count;
        self.errors += o.errors;
        self.ok.add(&o.ok).expect("same histogram bounds");
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        let q = |p: f64| {
            if self.ok.is_empty() {
                0.0
            } else {
                ms(self.ok.value_at_quantile(p))
            }
        };
        LatencySummary {
            count: self.count,
            errors: self.errors,
            p50_ms: q(0.50),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: if self.ok.is_empty() {
                0.0
            } else {
                ms(self.ok.max())
            },
        }
    }
}

/// A log-scale histogram with 8 bins per power of two from 1 µs up (2^40 µs is 12
/// days): fixed 1.3 KiB, ~9 % resolution.
#[derive(Debug, Clone)]
pub(crate) struct LogBins {
    bins: Box<[u32; LOG_BINS]>,
    count: u64,
    max: u64,
}

const LOG_BINS: usize = 320;
const SUB: f64 = 8.0;

impl Default for LogBins {
    fn default() -> Self {
        LogBins {
            bins: Box::new([0; LOG_BINS]),
            count: 0,
            max: 0,
        }
    }
}

/// `LOWER[b]`: the least number of µs in bin `b`, the least `us` with
/// `log2(us) * SUB >= b` (bin 0 also takes 0 and 1).
static LOWER: std::sync::LazyLock<[u64; LOG_BINS]> = std::sync::LazyLock::new(|| {
    let mut lower = [0; LOG_BINS];
    for (b, l) in lower.iter_mut().enumerate().skip(1) {
        *l = ((b as f64) / SUB).exp2().ceil() as u64;
    }
    lower
});

impl LogBins {
    /// `floor(log2(us) * SUB)`, from the bins' bounds: the power of two's first
    /// bin, then at most `SUB - 1` steps (a `log2` per recorded lag cost more).
    fn bin(us: u64) -> usize {
        if us <= 1 {
            return 0;
        }
        let lower = &*LOWER;
        let mut b = (us.ilog2() as usize * SUB as usize).min(LOG_BINS - 1);
        while b + 1 < LOG_BINS && us >= lower[b + 1] {
            b += 1;
        }
        b
    }

    /// The upper edge of a bin, in µs.
    fn upper(bin: usize) -> u64 {
        (((bin + 1) as f64) / SUB).exp2() as u64
    }

    pub(crate) fn record(&mut self, us: u64) {
        let b = Self::bin(us);
        self.bins[b] = self.bins[b].saturating_add(1);
        self.count += 1;
        self.max = self.max.max(us);
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Adds another histogram's counts (a shard's, at the end of a split run).
    pub(crate) fn absorb(&mut self, o: &LogBins) {
        for (a, b) in self.bins.iter_mut().zip(o.bins.iter()) {
            *a = a.saturating_add(*b);
        }
        self.count += o.count;
        self.max = self.max.max(o.max);
    }

    pub(crate) fn max_us(&self) -> u64 {
        self.max
    }

    /// The `q` quantile in µs (the upper edge of its bin, capped at the maximum).
    pub(crate) fn quantile_us(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &n) in self.bins.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return Self::upper(i).min(self.max);
            }
        }
        self.max
    }
}

/// Replication lag summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LagSummary {
    /// Applies measured (one per write per replica that stores its scope).
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// WAN bytes of replication traffic by link class (messages accepted by the network).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WanBytes {
    pub intra_region: u64,
    pub inter_region: u64,
    pub inter_continent: u64,
    /// Client request and response bytes crossing regions (not in the three above).
    pub client_cross_region: u64,
}

/// One point of a time series: a bucket of virtual time.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Start of the bucket, seconds of virtual time.
    pub t_s: f64,
    pub reads: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Writes that failed (ended in this bucket).
    pub write_errors: u64,
    /// Hedges and failovers the region's frontends sent in this bucket.
    pub hedges: u64,
    pub failovers: u64,
}

/// A fault as reports show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultMarker {
    pub label: String,
    pub start_s: f64,
    /// `None`: lasted until the end of the safety phase.
    pub end_s: Option<f64>,
}

/// Counters from the replicas and the network worth seeing in a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counters {
    pub writes_acknowledged: u64,
    pub entries_applied: u64,
    pub gap_requests: u64,
    pub snapshots_installed: u64,
    pub peer_suspicions: u64,
    pub frames_rejected: BTreeMap<String, u64>,
    pub hedges: u64,
    pub fallback_races: u64,
    pub failovers: u64,
    /// Affinity reads of a write just acknowledged (`workload.read_back`), and
    /// those a replica answered before applying the write.
    pub read_backs: u64,
    pub read_backs_stale: u64,
    /// Of the stale ones, those answered by a replica other than the one that
    /// took the write (the read failed over, or the write had).
    pub read_backs_stale_elsewhere: u64,
    pub messages_delivered: u64,
    pub messages_dropped: u64,
    pub network_in_flight_max: usize,
    /// Read errors by kind (deadline, not_covered, too_stale, unavailable, policy).
    pub read_errors: BTreeMap<String, u64>,
    /// Simulator events processed (deliveries, timers, client messages).
    pub events: u64,
    /// Replication frames replicas sent, by kind (`mutations`, `heartbeats`, ...):
    /// frames, the entries or heartbeats they carried, and bytes on the wire.
    pub frames_sent: BTreeMap<&'static str, FrameCount>,
    /// Rows replicas purged after a migration's flip moved them away.
    pub rows_purged: u64,
    /// Calls that refreshed location metadata and planned again after replicas
    /// refused their row (a stale placement).
    pub policy_refreshes: u64,
    /// Operations in flight at frontends of a region when it was lost: they end
    /// with their process, counted neither answered nor failed.
    pub ops_lost_with_frontends: u64,
    /// Counter increments acknowledged to frontends (C8 holds every replica to
    /// them).
    pub increments_acknowledged: u64,
    /// Rows of batch writes acknowledged, and rows replicas refused (each row
    /// of a batch is taken or refused alone).
    pub batch_rows_acknowledged: u64,
    pub batch_rows_refused: u64,
}

impl Counters {
    /// Adds another shard's counters (`network_in_flight_max` is set by the report).
    pub(crate) fn absorb(&mut self, o: Counters) {
        self.writes_acknowledged += o.writes_acknowledged;
        self.entries_applied += o.entries_applied;
        self.gap_requests += o.gap_requests;
        self.snapshots_installed += o.snapshots_installed;
        self.peer_suspicions += o.peer_suspicions;
        self.rows_purged += o.rows_purged;
        self.policy_refreshes += o.policy_refreshes;
        self.ops_lost_with_frontends += o.ops_lost_with_frontends;
        self.increments_acknowledged += o.increments_acknowledged;
        self.batch_rows_acknowledged += o.batch_rows_acknowledged;
        self.batch_rows_refused += o.batch_rows_refused;
        for (k, v) in o.frames_rejected {
            *self.frames_rejected.entry(k).or_default() += v;
        }
        self.hedges += o.hedges;
        self.fallback_races += o.fallback_races;
        self.failovers += o.failovers;
        self.read_backs += o.read_backs;
        self.read_backs_stale += o.read_backs_stale;
        self.read_backs_stale_elsewhere += o.read_backs_stale_elsewhere;
        self.messages_delivered += o.messages_delivered;
        self.messages_dropped += o.messages_dropped;
        for (k, v) in o.read_errors {
            *self.read_errors.entry(k).or_default() += v;
        }
        self.events += o.events;
        for (k, v) in o.frames_sent {
            let c = self.frames_sent.entry(k).or_default();
            c.frames += v.frames;
            c.items += v.items;
            c.bytes += v.bytes;
        }
    }
}

/// Frames of one kind: how many, the items they carried, their wire bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FrameCount {
    pub frames: u64,
    pub items: u64,
    pub bytes: u64,
}

/// What became of one migration job (`RunReport::migrations`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigrationSummary {
    pub label: String,
    pub job: String,
    pub runner: String,
    /// `done` or `failed` once finished; else the phase it stood at when the run
    /// ended.
    pub phase: String,
    pub rows_total: u64,
    pub rows_copied: u64,
    /// Virtual seconds: started, and finished (`None`: still running at the end).
    pub start_s: f64,
    pub end_s: Option<f64>,
    pub error: String,
}

/// What became of one `backup` fault (`RunReport::backups`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackupSummary {
    pub label: String,
    /// The region the tool ran in.
    pub region: String,
    /// Virtual seconds: started, and finished (`None`: still running at the end).
    pub start_s: f64,
    pub end_s: Option<f64>,
    pub scopes: Vec<ScopeBackupSummary>,
    /// Scopes left out, and why (residency).
    pub skipped: Vec<String>,
}

/// One scope of a backup.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScopeBackupSummary {
    pub scope: String,
    /// The replica it was read from in the end.
    pub replica: String,
    /// Why each replica tried before it gave the scope up.
    pub failovers: Vec<String>,
    pub rows: u64,
    /// Changes of the tail (start to cut).
    pub changes: u64,
    /// The cut: each origin's last sequence.
    pub cut: BTreeMap<String, u64>,
    pub exact: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// `done` (C10 held), `failed: …`, `wrong: …` (C10 failed), or empty
    /// while it runs.
    pub state: String,
    /// Rows C10 compared with the oracle.
    pub rows_checked: u64,
    pub end_s: Option<f64>,
}

/// The key of the frontends' share in `RunReport::hosts`, when they run on the
/// replicas' machine (`Hosts::frontend_us`).
pub const FRONTENDS: &str = "(frontends)";

/// The key of the shared machine's unitemized work in `RunReport::hosts`
/// (`HostModel::background`, with `Hosts::machine_cores`).
pub const BACKGROUND: &str = "(background)";

/// How busy one replica's host was (`RunReport::hosts`).
#[derive(Debug, Clone, Serialize)]
pub struct HostLoad {
    pub cpu: f64,
    /// The share of one core the replication driver kept busy (proposing client
    /// writes, applying frames, reading snapshots): the driver runs on one
    /// thread, so near 1 it bounds
    /// the host however many cores are idle.
    pub driver: f64,
    pub disk: f64,
    pub fsyncs: u64,
    /// `cpu` by kind of work (`host::Work`): each kind's share of the host's
    /// cores (the rest of `cpu` is unitemized background work), and how many
    /// pieces of it there were (requests; frames of entries for `apply`).
    pub work: BTreeMap<&'static str, (f64, u64)>,
}

/// The result of one run; `pangea sim run --json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub drill: String,
    pub seed: u64,
    pub topology: String,
    pub placement: Option<String>,
    pub replicas: usize,
    /// Virtual seconds simulated: the workload phase plus the drain.
    pub virtual_s: f64,
    /// Wall-clock seconds the run took on this machine.
    pub wall_s: f64,
    /// `virtual_s / wall_s`.
    pub speedup: f64,
    /// CPU seconds the simulating thread used (Linux `/proc/thread-self/schedstat`):
    /// unlike `wall_s`, not inflated when other processes share the cores.
    pub cpu_s: Option<f64>,
    /// `virtual_s / cpu_s`.
    pub speedup_cpu: Option<f64>,
    /// xxh3 over every transmit, replica event and client outcome: equal for equal
    /// (drill, seed) on any machine (C6).
    pub trace_hash: String,
    pub operations: u64,
    /// Every read, whatever its mode and region.
    pub reads: LatencySummary,
    pub reads_by_mode: BTreeMap<String, LatencySummary>,
    pub reads_by_region: BTreeMap<String, LatencySummary>,
    /// By the client's region, then mode.
    pub reads_by_region_mode: BTreeMap<String, BTreeMap<String, LatencySummary>>,
    pub writes: LatencySummary,
    /// Batch writes (`mix.batch`), one per request whatever its rows; their rows
    /// are in `counters.batch_rows_acknowledged`.
    pub batches: LatencySummary,
    /// Each replica's host: the share of its cores' and its disk's time it was
    /// busy over the run (`crate::host`), and its fsyncs.
    pub hosts: BTreeMap<String, HostLoad>,
    /// Fraction of reads answered correctly within their deadline.
    pub availability: f64,
    /// Apply time at each replica storing the scope minus the write's proposal time
    /// at its origin (virtual ms).
    pub replication_lag_ms: LagSummary,
    pub wan_bytes: WanBytes,
    /// After the last heal inside the workload phase (or, without one, after the
    /// final heal), until every replica has durably applied every write that existed
    /// at the heal (virtual ms); `None` if that never happened.
    pub convergence_ms: Option<f64>,
    /// After the workload stopped and everything healed, until every replica's
    /// content digest per scope was equal to the oracle's (virtual ms); `None` if
    /// not within the drain limit (a C5 failure).
    pub final_convergence_ms: Option<f64>,
    /// Acknowledged writes not applied everywhere after the drain, plus any
    /// sequence carrying two different writes (C1).
    pub lost_writes: u64,
    /// Acknowledged counter increments some replica holding the counter does not
    /// count after the drain (C8).
    pub lost_increments: u64,
    /// C2 and C3 violations: a watermark advertised beyond what was applied, out of
    /// order applies, or a watermark going backwards (across restarts too).
    pub watermark_violations: u64,
    /// C4 violations: a watermark read served by a replica that had not applied the
    /// token's write.
    pub token_violations: u64,
    /// C7 violations: a bounded-staleness read answered by a replica that lacked a
    /// write of an origin gone quiet which a replica it heard had applied more
    /// than the bound (plus the clocks' allowed offset) before.
    pub staleness_violations: u64,
    /// Bytes of a restricted scope's frames delivered to a replica outside its
    /// policy. Must be 0.
    pub residency_leak_bytes: u64,
    /// The first violations of each checker, in words.
    pub violations: Vec<String>,
    pub slo_failures: Vec<String>,
    pub faults: Vec<FaultMarker>,
    /// The placement migration jobs `migrate` faults started, in start order.
    pub migrations: Vec<MigrationSummary>,
    /// The backups `backup` faults ran, in start order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<BackupSummary>,
    pub counters: Counters,
    /// Latency of answered reads over time, per client region.
    pub series_by_region: BTreeMap<String, Vec<SeriesPoint>>,
    /// Replication lag over time: p99 and max per bucket (ms).
    pub lag_series: Vec<(f64, f64, f64)>,
    /// p99 replication lag (ms) from origin (row) to replica (column); replica ids in
    /// `lag_matrix_ids` order; `None` where nothing was measured.
    pub lag_matrix_ids: Vec<String>,
    pub lag_matrix_p99_ms: Vec<Vec<Option<f64>>>,
    /// The same matrix at the median.
    pub lag_matrix_p50_ms: Vec<Vec<Option<f64>>>,
    /// Peak resident memory of the process (from /proc, Linux only), MiB.
    pub peak_rss_mib: Option<f64>,
    /// Shards the run was split into (1: whole; docs/drills.md, "Two cores").
    pub shards: u32,
    /// A split run's window: the shortest latency between its shards, ms.
    pub lookahead_ms: Option<f64>,
    /// The records of the first `Workload::record_reads` reads' calls (a whole
    /// run's only), for replay; not in the JSON.
    #[serde(skip)]
    pub recorded_reads: Vec<pangea_core::frontend::call::ReadLog>,
}

impl RunReport {
    /// Whether the run passed: no SLO failure and no violation of any checker.
    pub fn passed(&self) -> bool {
        self.slo_failures.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds give the bins `log2` gives.
    #[test]
    fn log_bins_are_log2_bins() {
        let by_log2 = |us: u64| {
            if us <= 1 {
                0
            } else {
                (((us as f64).log2() * SUB) as usize).min(LOG_BINS - 1)
            }
        };
        let mut rng = crate::rng::SimRng::new(7);
        let edges = (1..LOG_BINS).flat_map(|b| {
            let l = LOWER[b];
            [l - 1, l, l + 1]
        });
        let random = (0..100_000).map(|_| rng.next_u64() >> rng.next_below(64));
        for us in (0..100_000).chain(edges).chain(random).chain([u64::MAX]) {
            assert_eq!(LogBins::bin(us), by_log2(us), "{us} µs");
        }
    }

    #[test]
    fn log_bins_quantiles_are_within_a_bin() {
        let mut b = LogBins::default();
        for us in 1..=10_000u64 {
            b.record(us);
        }
        let p50 = b.quantile_us(0.5) as f64;
        let p99 = b.quantile_us(0.99) as f64;
        assert!((p50 / 5_000.0 - 1.0).abs() < 0.1, "{p50}");
        assert!((p99 / 9_900.0 - 1.0).abs() < 0.1, "{p99}");
        assert_eq!(b.quantile_us(1.0), 10_000);
        assert_eq!(b.count(), 10_000);
        assert_eq!(LogBins::default().quantile_us(0.99), 0);
    }
}
