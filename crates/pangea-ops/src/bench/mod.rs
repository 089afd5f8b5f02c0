//! Benchmark harnesses, one clock for all: every figure is the whole call as its
//! caller sees it, recorded in an HDR histogram (µs, 3 significant digits).
//!
//! - [`load`]: closed- or open-loop load from one region against a running cluster
//!   (`pangea bench`);
//! - [`echo`]: the same request and response sizes over a bare quinn echo server,
//!   the floor any QUIC service on this machine sees (`pangea bench-echo`);
//! - [`redis`]: Redis GET through the same harness, the baseline of
//!   docs/benchmarks.md (`pangea bench-redis`);
//! - [`ceilings`]: this machine's limits for one core — AEAD seals, memcpy,
//!   loopback UDP datagrams with GSO — that serving figures are fractions of
//!   (`pangea bench-ceilings`).

pub mod ceilings;
pub mod echo;
pub mod load;
pub mod redis;

use hdrhistogram::Histogram;
use std::time::Duration;

/// Latency figures of one kind of operation (the bulk loader's, as it reports them).
pub use pangea_client::bulk::Latency as Figures;

/// A histogram of latencies in µs, from 1 µs to 60 s.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds are valid")
}

/// `h`'s figures over `elapsed`, with `errors` failed operations beside them.
pub fn figures(h: &Histogram<u64>, errors: u64, elapsed: Duration) -> Figures {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Figures {
        count: h.len(),
        errors,
        ops_per_s: h.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: h.max() as f64 / 1e3,
    }
}

/// One line of figures: `ops/s p50 p99 p999 max errors`.
pub fn line(f: &Figures) -> String {
    format!(
        "{:>10.0} ops/s  p50 {:>7.3} ms  p99 {:>7.3} ms  p999 {:>7.3} ms  max {:>8.3} ms  errors {}",
        f.ops_per_s, f.p50_ms, f.p99_ms, f.p999_ms, f.max_ms, f.errors
    )
}

/// A worker's draws: which key it reads next and, in a mix, whether it writes.
/// [`load`] and [`redis`] ask for the same sequence. The preload draws its
/// value sizes as workers counted down from `usize::MAX`, the first of which
/// wraps to seed 0.
pub(crate) fn draws(worker: usize) -> pangea_core::rng::Rng {
    pangea_core::rng::Rng::new((worker as u64).wrapping_add(1))
}

/// The machine figures come from: cores and CPU model.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}
