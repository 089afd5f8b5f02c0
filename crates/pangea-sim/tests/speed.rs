//! The speed target: the reference deployment (27 replicas), 10 minutes of virtual
//! time at 5,000 client operations per second, as `sim/reference.toml` says (so
//! `pangea sim run sim/reference.toml` runs the same: the same trace). Ignored by
//! default (it takes minutes); run it optimized and read the printed figures:
//!
//! `cargo test --release -p pangea-sim --test speed -- --ignored --nocapture`
//!
//! The run is split into two shards on two threads (`sim::shard`), as `pangea sim
//! run` splits a drill without faults on a machine with two cores, and with the
//! `pangea` binary's allocator (mimalloc): glibc's `malloc`, which the test used
//! before, costs 8 % more CPU here, and no user runs the simulator with it.
//!
//! `PANGEA_SPEED_SECS` shortens the virtual duration; `PANGEA_SPEED_RATE` changes
//! the load; `PANGEA_SPEED_HB_MS` the heartbeat interval (default 50 ms, as in
//! production) and `PANGEA_SPEED_HB_FWD_MS` how long relayed heartbeats wait to be
//! coalesced (default 5 ms, as in production); `PANGEA_SPEED_WRITE` the write
//! fraction (default 0.05; the rest are reads). `PANGEA_SPEED_COUNTERS` prints the
//! run's counters (events, frames sent by kind).

use anyhow::Result;
use pangea_sim::SimDuration;
use pangea_sim::drill::Drill;
use pangea_sim::runner::peak_rss_mib;
use pangea_sim::scenario::Workload;
use pangea_sim::sim::{Simulation, default_threads, run_scenario};
use std::path::Path;

// The allocator of the `pangea` binary, whose `sim run` this measures: mimalloc as
// `malloc` itself, reached through `System` (crates/pangea-cli/src/main.rs).
use mimalloc as _;

#[global_allocator]
static ALLOCATOR: std::alloc::System = std::alloc::System;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
#[ignore = "minutes of wall time; run with --release"]
fn reference_ten_minutes_at_5000_ops() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut sc = Drill::load(&root.join("sim/reference.toml"))
        .map_err(|p| anyhow::anyhow!("{p}"))?
        .scenario;
    if let Ok(secs) = std::env::var("PANGEA_SPEED_SECS") {
        sc.duration = SimDuration::from_secs(secs.parse()?);
    }
    if let Ok(rate) = std::env::var("PANGEA_SPEED_RATE") {
        sc.workload = Workload::ad_serving(&sc.deployment, rate.parse()?);
    }
    if let Ok(w) = std::env::var("PANGEA_SPEED_WRITE") {
        // The write fraction (the rest reads, no deletes), to split the cost.
        sc.workload.write = w.parse()?;
        sc.workload.read = 1.0 - sc.workload.write;
        sc.workload.delete = 0.0;
    }
    if let Ok(ms) = std::env::var("PANGEA_SPEED_HB_MS") {
        sc.replica.heartbeat_interval_ms = ms.parse()?;
    }
    if let Ok(ms) = std::env::var("PANGEA_SPEED_HB_FWD_MS") {
        sc.replica.heartbeat_forward_delay_ms = ms.parse()?;
    }
    // Split into two shards on this machine's cores, as `pangea sim run` does;
    // `PANGEA_SPEED_SHARDS=1` runs it whole, `PANGEA_SPEED_THREADS` sets the threads.
    let threads = env("PANGEA_SPEED_THREADS", default_threads() as u64) as usize;
    let r = match env("PANGEA_SPEED_SHARDS", 2) {
        1 => Simulation::new(sc)?.run()?,
        _ => run_scenario(sc, threads)?,
    };
    println!(
        "virtual_s {:.1} wall_s {:.1} speedup {:.2}x cpu_s {:.1} speedup_cpu {:.2}x operations {} events {} messages {} peak_rss_mib {:.0} lag_p99_ms {:.1} availability {:.5} trace_hash {} shards {} threads {}",
        r.virtual_s,
        r.wall_s,
        r.speedup,
        r.cpu_s.unwrap_or(0.0),
        r.speedup_cpu.unwrap_or(0.0),
        r.operations,
        r.counters.events,
        r.counters.messages_delivered,
        peak_rss_mib().unwrap_or(0.0),
        r.replication_lag_ms.p99,
        r.availability,
        r.trace_hash,
        r.shards,
        threads
    );
    if std::env::var_os("PANGEA_SPEED_COUNTERS").is_some() {
        println!("{:#?}", r.counters);
    }
    assert!(r.slo_failures.is_empty(), "{:?}", r.slo_failures);
    Ok(())
}
