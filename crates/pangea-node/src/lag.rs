//! Apply lag per origin: how long after its origin stamped an entry this replica
//! applied it (this replica's wall clock minus the entry's HLC wall time), over the
//! replica's lifetime, in HDR histograms. `GET /watermarks` reports it as
//! `apply_lag` ({origin: {count, p50_ms, p99_ms, max_ms}}); `pangea sim calibrate`
//! compares it with the simulator's replication lag.
//!
//! The entry's wall time has millisecond resolution, so each sample reads up to 1 ms
//! high; clock offset between the two replicas adds to it (none on a local cluster,
//! whose processes share one clock).

use hdrhistogram::Histogram;
use pangea_core::ReplicaId;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// 1 µs to 1 hour, 2 significant digits: a few KiB per origin.
const MAX_US: u64 = 3_600_000_000;

#[derive(Debug, Default)]
pub struct ApplyLag {
    by_origin: Mutex<BTreeMap<ReplicaId, Histogram<u64>>>,
}

impl ApplyLag {
    /// An entry of `origin` stamped at `origin_wall_ms` (Unix ms) applied at
    /// `now_unix_us`.
    pub fn record(&self, origin: &ReplicaId, origin_wall_ms: u64, now_unix_us: u64) {
        let lag_us = now_unix_us
            .saturating_sub(origin_wall_ms.saturating_mul(1_000))
            .clamp(1, MAX_US);
        let mut map = self.by_origin.lock().unwrap_or_else(|p| p.into_inner());
        let h = map.entry(origin.clone()).or_insert_with(|| {
            Histogram::new_with_bounds(1, MAX_US, 2).expect("static bounds are valid")
        });
        // In bounds, so recording cannot fail.
        let _ = h.record(lag_us);
    }

    /// `{origin: {count, p50_ms, p99_ms, max_ms}}`.
    pub fn summary(&self) -> serde_json::Value {
        let map = self.by_origin.lock().unwrap_or_else(|p| p.into_inner());
        let ms = |us: u64| us as f64 / 1_000.0;
        map.iter()
            .map(|(origin, h)| {
                (
                    origin.to_string(),
                    serde_json::json!({
                        "count": h.len(),
                        "p50_ms": ms(h.value_at_quantile(0.5)),
                        "p99_ms": ms(h.value_at_quantile(0.99)),
                        "max_ms": ms(h.max()),
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_now_minus_the_origin_stamp() {
        let lag = ApplyLag::default();
        let origin = ReplicaId::from("use1-a");
        for i in 0..100u64 {
            // Stamped at 1 000 ms, applied 40.0 ms .. 49.9 ms later.
            lag.record(&origin, 1_000, 1_040_000 + i * 100);
        }
        let s = lag.summary();
        let o = &s["use1-a"];
        assert_eq!(o["count"], 100);
        let p50 = o["p50_ms"].as_f64().unwrap_or(0.0);
        let p99 = o["p99_ms"].as_f64().unwrap_or(0.0);
        assert!((44.0..=46.0).contains(&p50), "{s}");
        assert!((49.0..=50.5).contains(&p99), "{s}");
        // A stamp from the future (clock offset) counts as the smallest lag.
        lag.record(&ReplicaId::from("euw1-a"), 2_000, 1_000_000);
        assert_eq!(lag.summary()["euw1-a"]["count"], 1);
    }
}
