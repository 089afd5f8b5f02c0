//! A time-boxed swarm: random deployments, workloads and fault rates per seed, a
//! safety phase then a healed liveness phase, checkers C1–C5 on every run and C6
//! on every fifth seed. `PANGEA_SWARM_SECS` (default 15) and `PANGEA_SWARM_START`
//! change the budget and the first seed; a failure names the seed and the command
//! that replays it.

use pangea_sim::swarm::{SwarmOptions, replay_command, swarm};
use std::time::Duration;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn time_boxed_swarm() {
    let opts = SwarmOptions {
        seeds: u64::MAX / 2,
        start: env("PANGEA_SWARM_START", 0),
        time_limit: Some(Duration::from_secs(env("PANGEA_SWARM_SECS", 15))),
        determinism_every: 5,
    };
    let summary = swarm(&opts, |_| {});
    let report: Vec<String> = summary
        .failed
        .iter()
        .map(|o| {
            format!(
                "seed {} failed ({}):\n    {}",
                o.seed,
                replay_command(o.seed),
                o.failures.join("\n    ")
            )
        })
        .collect();
    // A loaded machine runs fewer seeds in the same box; one is still a test.
    assert!(summary.seeds_run >= 1, "no seed ran");
    assert!(report.is_empty(), "{}", report.join("\n"));
    println!("{} seeds in {:.1} s", summary.seeds_run, summary.wall_s);
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    let a = pangea_sim::swarm::run_seed(24, false);
    let b = pangea_sim::swarm::run_seed(24, false);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert!(a.passed(), "{:?}", a.failures);
}
