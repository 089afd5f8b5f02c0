//! The driver end to end on the reference deployment.

use anyhow::Result;
use pangea_sim::SimDuration;
use pangea_sim::scenario::Scenario;
use pangea_sim::sim::Simulation;
use pangea_topology::Deployment;
use std::path::Path;
use std::sync::Arc;

fn reference() -> Result<Arc<Deployment>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Ok(Arc::new(Deployment::load(
        &root.join("topology/four-continents.toml"),
        Some(&root.join("topology/placement.toml")),
    )?))
}

#[test]
fn a_quiet_run_converges_with_no_violation() -> Result<()> {
    let sc = Scenario::new("quiet", reference()?, 7, SimDuration::from_secs(5));
    let report = Simulation::new(sc)?.run()?;
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.final_convergence_ms.is_some());
    assert!(report.availability > 0.99, "{}", report.availability);
    // Every region's frontends read, and the JSON carries what the brief lists.
    assert_eq!(report.reads_by_region.len(), 13);
    let json = serde_json::to_value(&report)?;
    for key in [
        "seed",
        "virtual_s",
        "wall_s",
        "trace_hash",
        "reads_by_mode",
        "reads_by_region",
        "availability",
        "replication_lag_ms",
        "wan_bytes",
        "convergence_ms",
        "lost_writes",
        "watermark_violations",
        "token_violations",
        "residency_leak_bytes",
        "slo_failures",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert!(
        json["reads_by_mode"]["eventual"]["p99_ms"]
            .as_f64()
            .is_some()
    );
    assert!(report.wan_bytes.inter_continent > 0);
    Ok(())
}

/// `cargo test --release -p pangea-sim --test drive speed_probe -- --ignored --nocapture`
#[test]
#[ignore]
fn speed_probe() -> Result<()> {
    let secs: u64 = std::env::var("SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let rate: f64 = std::env::var("RATE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000.0);
    let hb: u64 = std::env::var("HB_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let mut sc = Scenario::new("speed", reference()?, 1, SimDuration::from_secs(secs));
    sc.workload = pangea_sim::scenario::Workload::ad_serving(&sc.deployment, rate);
    sc.replica.heartbeat_interval_ms = hb;
    let report = Simulation::new(sc)?.run()?;
    println!(
        "virtual {:.1}s wall {:.2}s speedup {:.1}x ops {} events {} delivered {} lag p99 {} errors {:?} modes {:?}",
        report.virtual_s,
        report.wall_s,
        report.speedup,
        report.operations,
        report.counters.events,
        report.counters.messages_delivered,
        report.replication_lag_ms.p99,
        report.counters.read_errors,
        report
            .reads_by_mode
            .iter()
            .map(|(m, s)| (m.clone(), s.errors))
            .collect::<Vec<_>>()
    );
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    Ok(())
}
