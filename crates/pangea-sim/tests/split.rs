//! Runs split into two shards (`sim::shard`): deterministic whatever the threads,
//! checked like whole runs, and the same in outcome.

use anyhow::Result;
use pangea_sim::SimDuration;
use pangea_sim::drill::Drill;
use pangea_sim::scenario::{Scenario, Workload};
use pangea_sim::sim::{Simulation, plan_split, run_scenario, run_split};
use pangea_topology::Deployment;
use std::path::Path;
use std::sync::Arc;

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reference() -> Result<Arc<Deployment>> {
    Ok(Arc::new(Deployment::load(
        &root().join("topology/four-continents.toml"),
        Some(&root().join("topology/placement.toml")),
    )?))
}

/// The ad-serving mix on the reference deployment, briefly.
fn steady(seed: u64) -> Result<Scenario> {
    let d = reference()?;
    let mut sc = Scenario::new("steady", d.clone(), seed, SimDuration::from_secs(3));
    sc.workload = Workload::ad_serving(&d, 1_000.0);
    Ok(sc)
}

#[test]
fn the_reference_deployment_splits_between_continents() -> Result<()> {
    let sc = steady(1)?;
    let split = plan_split(&sc).expect("a split");
    let regions: Vec<_> = sc.deployment.topology.regions.keys().collect();
    let shard_of = |name: &str| {
        let i = regions.iter().position(|r| r.as_str() == name).unwrap();
        split.region_shard[i]
    };
    // Each continent but one stays whole, and each side holds 12 to 15 replicas.
    assert_ne!(shard_of("us-east-1"), shard_of("eu-west-1"));
    assert_eq!(shard_of("us-east-1"), shard_of("us-west-2"));
    assert_eq!(shard_of("eu-west-1"), shard_of("eu-central-1"));
    let replicas_in_0: usize = regions
        .iter()
        .enumerate()
        .filter(|(i, _)| split.region_shard[*i] == 0)
        .map(|(_, r)| sc.deployment.topology.regions[*r].replicas.len())
        .sum();
    assert!((12..=15).contains(&replicas_in_0), "{replicas_in_0}");
    // The window: the shards are an ocean apart.
    assert!(
        split.lookahead >= SimDuration::from_ms(25),
        "{:?}",
        split.lookahead
    );
    Ok(())
}

#[test]
fn a_single_continent_is_not_split() -> Result<()> {
    let d = Arc::new(Deployment::load(
        &root().join("topology/local-3-regions.toml"),
        None,
    )?);
    let sc = Scenario::new("local", d, 1, SimDuration::from_secs(1));
    assert_eq!(plan_split(&sc), None);
    Ok(())
}

#[test]
fn a_split_run_is_the_same_on_one_thread_and_on_two() -> Result<()> {
    let sc = steady(5)?;
    let split = plan_split(&sc).expect("a split");
    let one = run_split(sc.clone(), &split, 1)?;
    let two = run_split(sc, &split, 2)?;
    assert_eq!(one.shards, 2);
    assert_eq!(one.trace_hash, two.trace_hash);
    assert_eq!(one.operations, two.operations);
    assert_eq!(one.counters.events, two.counters.events);
    assert_eq!(
        serde_json::to_value(&one.reads_by_region)?,
        serde_json::to_value(&two.reads_by_region)?
    );
    Ok(())
}

#[test]
fn a_split_run_is_checked_and_ends_as_a_whole_run_does() -> Result<()> {
    let sc = steady(9)?;
    let whole = Simulation::new(sc.clone())?.run()?;
    let split = run_scenario(sc, 2)?;
    assert_eq!((whole.shards, split.shards), (1, 2));
    for r in [&whole, &split] {
        assert!(r.slo_failures.is_empty(), "{:?}", r.slo_failures);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.lost_writes, 0);
        assert!(r.final_convergence_ms.is_some());
        assert!(r.availability > 0.99, "{}", r.availability);
        assert_eq!(r.reads_by_region.len(), 13);
    }
    // Other random draws, the same workload and network: counts and latencies agree
    // to within noise.
    let near = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol * a.max(b);
    assert!(near(whole.operations as f64, split.operations as f64, 0.05));
    assert!(near(
        whole.counters.entries_applied as f64,
        split.counters.entries_applied as f64,
        0.1
    ));
    assert!(
        near(
            whole.replication_lag_ms.p99,
            split.replication_lag_ms.p99,
            0.2
        ),
        "lag p99 {} vs {}",
        whole.replication_lag_ms.p99,
        split.replication_lag_ms.p99
    );
    let eventual = |r: &pangea_sim::sim::metrics::RunReport| r.reads_by_mode["eventual"].p99_ms;
    assert!(
        near(eventual(&whole), eventual(&split), 0.25),
        "eventual p99 {} vs {}",
        eventual(&whole),
        eventual(&split)
    );
    // Every write crossed the ocean: inter-continent bytes are of one size.
    assert!(near(
        whole.wan_bytes.inter_continent as f64,
        split.wan_bytes.inter_continent as f64,
        0.15
    ));
    Ok(())
}

/// Faults strike both shards at a barrier: a region lost and brought back, split,
/// on one thread and on two.
#[test]
fn a_split_drill_with_faults_is_the_same_on_one_thread_and_on_two() -> Result<()> {
    let drill = Drill::load(&root().join("sim/drills/region-outage.toml"))
        .map_err(|p| anyhow::anyhow!("{p}"))?;
    let mut sc = drill.scenario;
    // Shortened: eu-west-1 (shard of europe) lost from 3 s to 9 s of 12.
    sc.duration = SimDuration::from_secs(12);
    sc.drain_max = SimDuration::from_secs(20);
    sc.faults[0].at = SimDuration::from_secs(3);
    sc.faults[0].duration = Some(SimDuration::from_secs(6));
    // Without jitter, frames between the closest pair of regions are due exactly
    // one lookahead after they leave (debug builds assert that no frame is ever
    // delivered to another shard's replica).
    sc.net.jitter_fraction = 0.0;
    let split = plan_split(&sc).expect("the reference deployment splits");
    let one = run_split(sc.clone(), &split, 1)?;
    let two = run_scenario(sc, 2)?;
    assert_eq!(two.shards, 2);
    assert_eq!(one.trace_hash, two.trace_hash);
    for r in [&one, &two] {
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.lost_writes, 0);
        assert!(r.convergence_ms.is_some() && r.final_convergence_ms.is_some());
        // The lost region's replicas crashed and restarted: its peers suspected
        // them, and the others kept serving.
        assert!(r.counters.peer_suspicions > 0);
        assert!(r.availability > 0.95, "{}", r.availability);
    }
    Ok(())
}
