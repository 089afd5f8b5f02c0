//! Swarm testing, after TigerBeetle's VOPR and FoundationDB's simulator: every seed
//! draws its own deployment (2–7 regions on two continents, 1–4 replicas each,
//! relays, a restricted placement policy), its own workload, and its own fault
//! rates; a safety phase runs the workload under faults, then a liveness phase heals
//! everything and must converge. The checkers C1–C5 watch every run (see
//! `docs/invariants.md`); C6 (determinism) reruns a share of the seeds and compares
//! trace hashes. A failing seed prints the command that replays it.

use crate::net::{LinkOverride, NetConfig};
use crate::rng::SimRng;
use crate::scenario::{
    Fault, FaultKind, KeyDistribution, ModeMix, RegionLoad, Scenario, Slo, ValueSize, Workload,
};
use crate::time::SimDuration;
use pangea_core::replica::Config as ReplicaConfig;
use pangea_topology::{Deployment, RegionId, ReplicaId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The command that replays one seed.
pub fn replay_command(seed: u64) -> String {
    format!("pangea sim swarm --seeds 1 --start {seed}")
}

/// A random deployment for a seed, from the generator the core's cluster harness
/// shares (`pangea_topology::generate`).
fn deployment(seed: u64, rng: &mut SimRng, alt_rtt: bool) -> Deployment {
    let shape = pangea_topology::generate::Shape {
        name: "swarm",
        regions: 2 + rng.next_below(6),
        replicas_per_region_max: 1 + rng.next_below(4),
        relays: rng.chance(0.5),
        restricted: rng.chance(0.6),
        shard_groups: 1,
        processes_max: 1,
    };
    let mut below = |n: u64| rng.next_u64_inclusive(n.saturating_sub(1));
    if alt_rtt {
        let mut rtt_rng = SimRng::new(seed ^ 0x77);
        let mut scale = |n: u64| rtt_rng.next_u64_inclusive(n.saturating_sub(1));
        pangea_topology::generate::random_deployment(&shape, &mut below, Some(&mut scale))
    } else {
        pangea_topology::generate::random_deployment(&shape, &mut below, None)
    }
}

/// Everything one seed runs.
pub fn scenario_for_seed(seed: u64) -> Scenario {
    let mut rng = SimRng::new(seed ^ 0x5EED_5EED);
    let d = Arc::new(deployment(seed, &mut rng, false));
    let safety = SimDuration::from_ms(3_000 + rng.next_below(9_000) as u64);
    let mut sc = Scenario::new(&format!("swarm-{seed}"), d.clone(), seed, safety);
    sc.topology_path = "(generated)".into();
    sc.drain_max = SimDuration::from_secs(60);
    // Half the seeds keep almost no log, so laggards need snapshots.
    sc.replica = ReplicaConfig {
        log_entries_retained_max: if rng.chance(0.5) {
            1 + rng.next_below(6) as u64
        } else {
            50 + rng.next_below(200) as u64
        },
        gap_entries_max: 16 + rng.next_below(64),
        batch_bytes_max: 512 + rng.next_below(8 << 10),
        ..ReplicaConfig::default()
    };
    sc.net = NetConfig {
        jitter_fraction: rng.next_below(20) as f64 / 100.0,
        ..NetConfig::default()
    };
    sc.clock_skew_ms_max = rng.next_below(150) as u64;
    let regions: Vec<RegionId> = d.topology.regions.keys().cloned().collect();
    let restricted = d
        .placement
        .policy(&pangea_core::ScopeId::new("restricted"))
        .map(|p| p.regions.clone());
    let rate = 50.0 + rng.next_below(350) as f64;
    let w = rng.next_below(30) as f64 / 100.0 + 0.05;
    sc.workload = Workload {
        table: "t".into(),
        family: ["f", "g", "h"][rng.next_below(3)].into(),
        columns: 1 + rng.next_below(3) as u32,
        keys: 5 + rng.next_below(300) as u64,
        key_distribution: if rng.chance(0.5) {
            KeyDistribution::Uniform
        } else {
            KeyDistribution::Zipf {
                theta: 0.5 + rng.next_f64(),
            }
        },
        value_size: ValueSize::Uniform {
            min: 1,
            max: 1 + rng.next_below(4096),
        },
        read: 1.0 - w,
        write: w * 0.85,
        delete: w * 0.15,
        // +1 to counters of the generated counter family (C8), a fifth as
        // often as the other writes.
        increment: w * 0.2,
        // Batch writes of up to 8 rows (MutateRows), a tenth as often: their
        // rows are checked as any write's (C1, C4, convergence).
        batch: w * 0.1,
        batch_rows: 1 + rng.next_below(8) as u32,
        counter_family: "n".into(),
        modes: ModeMix {
            eventual: rng.next_f64(),
            affinity: rng.next_f64(),
            watermark: 0.5 + rng.next_f64(),
            bounded: rng.next_f64() * 0.5,
            as_of: rng.next_f64() * 0.3,
        },
        bounded_ms: 500 + rng.next_below(3_000) as u64,
        as_of_ms: 500 + rng.next_below(3_000) as u64,
        read_back: 0.0,
        write_ack: crate::scenario::WriteAck::Origin,
        deadline: SimDuration::from_ms(20 + rng.next_below(200) as u64),
        write_deadline: SimDuration::from_ms(200),
        hedge: rng.chance(0.7),
        record_reads: 0,
        app_profile: "frontend".into(),
        prefixes: BTreeMap::new(),
        global_prefix: "k/".into(),
        local_fraction: 0.0,
        regions: regions
            .iter()
            .map(|r| RegionLoad {
                fill: false,
                region: r.clone(),
                clients: 1 + rng.next_below(2) as u32,
                rate: rate / regions.len() as f64,
            })
            .collect(),
    };
    // Regions of the restricted policy read and write its rows ("r/" keys) too.
    if restricted.is_some() {
        sc.workload.local_fraction = 0.4;
        sc.workload.global_prefix = "k/".into();
    }
    sc.faults = faults(&mut rng, &d, safety, seed, sc.clock_skew_ms_max);
    if let Some(rs) = restricted {
        // Per-region prefixes: regions inside the policy use r/ keys as their own.
        for region in rs {
            let c = d.topology.regions[&region].continent.clone();
            sc.workload.prefixes.entry(c).or_insert_with(|| "r/".into());
        }
    }
    sc.slo = Slo::default();
    sc
}

/// Each seed draws which faults happen and how often.
fn faults(
    rng: &mut SimRng,
    d: &Arc<Deployment>,
    safety: SimDuration,
    seed: u64,
    skew_ms_max: u64,
) -> Vec<Fault> {
    let replicas: Vec<ReplicaId> = d.topology.replicas.keys().cloned().collect();
    let regions: Vec<RegionId> = d.topology.regions.keys().cloned().collect();
    let crash_rate = if rng.chance(0.6) {
        rng.next_f64() * 1.5
    } else {
        0.0
    };
    let partition_rate = if rng.chance(0.5) {
        rng.next_f64() * 0.8
    } else {
        0.0
    };
    let degrade_rate = if rng.chance(0.4) {
        rng.next_f64() * 0.8
    } else {
        0.0
    };
    let pause_rate = if rng.chance(0.3) {
        rng.next_f64() * 0.8
    } else {
        0.0
    };
    let skew_rate = if rng.chance(0.3) {
        rng.next_f64() * 0.5
    } else {
        0.0
    };
    let view_change = rng.chance(0.3);
    let mut out = Vec::new();
    let secs = safety.as_secs_f64();
    let draw = |rng: &mut SimRng, rate: f64| -> Vec<SimDuration> {
        let mut times = Vec::new();
        if rate <= 0.0 {
            return times;
        }
        let mut t = 0.0;
        loop {
            t += -(1.0 - rng.next_f64()).ln() / rate;
            if t >= secs {
                return times;
            }
            times.push(SimDuration::from_ms((t * 1000.0) as u64));
        }
    };
    let side = |rng: &mut SimRng| -> (Vec<RegionId>, Vec<RegionId>) {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for r in &regions {
            if rng.chance(0.5) {
                a.push(r.clone());
            } else {
                b.push(r.clone());
            }
        }
        if a.is_empty() {
            a.push(b.pop().expect("two regions at least"));
        }
        if b.is_empty() {
            b.push(a.pop().expect("two regions at least"));
        }
        (a, b)
    };
    for at in draw(rng, crash_rate) {
        let r = replicas[rng.next_below(replicas.len())].clone();
        // A crashed process (refused at once) or a lost host (silence).
        let silent = rng.chance(0.5);
        out.push(Fault {
            at,
            duration: Some(SimDuration::from_ms(50 + rng.next_below(3_000) as u64)),
            label: format!("{} {r}", if silent { "lose" } else { "crash" }),
            kind: FaultKind::Lose {
                replicas: vec![r],
                regions: Vec::new(),
                silent,
            },
        });
    }
    for at in draw(rng, partition_rate) {
        let (a, b) = side(rng);
        let one_way = rng.chance(0.3);
        out.push(Fault {
            at,
            duration: Some(SimDuration::from_ms(100 + rng.next_below(3_000) as u64)),
            label: format!("partition{}", if one_way { " one-way" } else { "" }),
            kind: FaultKind::Partition { a, b, one_way },
        });
    }
    for at in draw(rng, degrade_rate) {
        let (a, b) = side(rng);
        out.push(Fault {
            at,
            duration: Some(SimDuration::from_ms(100 + rng.next_below(4_000) as u64)),
            label: "degrade".into(),
            kind: FaultKind::DegradeLink {
                a,
                b,
                link: LinkOverride {
                    extra_latency_ms: rng.next_below(200) as f64,
                    loss: Some(rng.next_below(30) as f64 / 100.0),
                    bandwidth_mbps: rng.chance(0.5).then(|| 1.0 + rng.next_below(100) as f64),
                },
            },
        });
    }
    for at in draw(rng, pause_rate) {
        let r = replicas[rng.next_below(replicas.len())].clone();
        out.push(Fault {
            at,
            duration: Some(SimDuration::from_ms(50 + rng.next_below(2_500) as u64)),
            label: format!("pause {r}"),
            kind: FaultKind::Pause { replicas: vec![r] },
        });
    }
    // Transient skews may go far beyond max_offset (500 ms): the liveness phase
    // heals them. At most one permanent jump per seed, small enough that no two
    // clocks end up more than 480 ms apart: a replica whose clock stays further
    // behind than max_offset refuses the others' writes for good (I1), and no
    // healing can change that (see tests/known_limits.rs).
    let jump_max = 480u64.saturating_sub(2 * skew_ms_max);
    let mut jumped = false;
    for at in draw(rng, skew_rate) {
        let r = replicas[rng.next_below(replicas.len())].clone();
        let permanent = !jumped && jump_max > 0 && rng.chance(0.3);
        jumped |= permanent;
        let offset_ms = if permanent {
            rng.next_u64_inclusive(2 * jump_max) as i64 - jump_max as i64
        } else {
            rng.next_below(1_400) as i64 - 700
        };
        out.push(Fault {
            at,
            duration: (!permanent)
                .then(|| SimDuration::from_ms(100 + rng.next_below(3_000) as u64)),
            label: format!("clock {offset_ms:+} ms {r}"),
            kind: FaultKind::ClockSkew {
                replicas: vec![r],
                offset_ms,
            },
        });
    }
    if view_change {
        // A different view of the deployment (other round trips, so other trees),
        // rolled out to replicas one by one: views disagree for a while (I8).
        let mut alt_rng = SimRng::new(seed ^ 0x5EED_5EED);
        let alt = Arc::new(deployment(seed, &mut alt_rng, true));
        let at = SimDuration::from_ms((secs * 1000.0 * rng.next_f64()) as u64);
        out.push(Fault {
            at,
            duration: None,
            label: "view change".into(),
            kind: FaultKind::ChangePlacement {
                deployment: alt,
                path: "(generated)".into(),
                rollout: SimDuration::from_ms(rng.next_below(3_000) as u64),
            },
        });
    }
    out.sort_by_key(|f| f.at);
    out
}

/// One seed's verdict.
#[derive(Debug, Clone)]
pub struct SeedOutcome {
    pub seed: u64,
    pub failures: Vec<String>,
    pub trace_hash: String,
    pub wall_s: f64,
    pub replicas: usize,
    pub faults: usize,
    pub operations: u64,
    /// 2 when the run was split between two cores (`sim::shard`).
    pub shards: u32,
}

impl SeedOutcome {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs one seed; with `twice`, runs it again and checks the trace hash (C6).
pub fn run_seed(seed: u64, twice: bool) -> SeedOutcome {
    let started = Instant::now();
    let sc = scenario_for_seed(seed);
    let (replicas, faults) = (sc.deployment.topology.replicas.len(), sc.faults.len());
    // Split into shards where the topology allows (`sim::run_scenario`); the second
    // run of C6 takes one thread, so it also checks that threads change nothing.
    let run = |sc: Scenario, threads: usize| crate::sim::run_scenario(sc, threads);
    let mut out = SeedOutcome {
        seed,
        failures: Vec::new(),
        trace_hash: String::new(),
        wall_s: 0.0,
        replicas,
        faults,
        operations: 0,
        shards: 1,
    };
    match run(sc.clone(), crate::sim::default_threads()) {
        Ok(r) => {
            out.failures = r.slo_failures.clone();
            out.failures.extend(r.violations.iter().take(3).cloned());
            out.failures.dedup();
            out.trace_hash = r.trace_hash.clone();
            out.operations = r.operations;
            out.shards = r.shards;
            if twice {
                match run(sc, 1) {
                    Ok(again) if again.trace_hash != r.trace_hash => out.failures.push(format!(
                        "C6: trace hash {} then {}",
                        r.trace_hash, again.trace_hash
                    )),
                    Ok(_) => {}
                    Err(e) => out.failures.push(format!("second run: {e:#}")),
                }
            }
        }
        Err(e) => out.failures.push(format!("run: {e:#}")),
    }
    out.wall_s = started.elapsed().as_secs_f64();
    out
}

/// Options of a swarm.
#[derive(Debug, Clone)]
pub struct SwarmOptions {
    pub seeds: u64,
    pub start: u64,
    /// Stop starting new seeds after this much wall time.
    pub time_limit: Option<Duration>,
    /// Run every n-th seed twice to check determinism (C6); 0: never.
    pub determinism_every: u64,
}

/// What a swarm did.
#[derive(Debug, Clone, Default)]
pub struct SwarmSummary {
    pub seeds_run: u64,
    pub failed: Vec<SeedOutcome>,
    pub wall_s: f64,
}

/// Runs seeds `start..start + seeds` (until the time limit), calling `each` after
/// every seed.
pub fn swarm(opts: &SwarmOptions, mut each: impl FnMut(&SeedOutcome)) -> SwarmSummary {
    let started = Instant::now();
    let mut summary = SwarmSummary::default();
    for seed in opts.start..opts.start.saturating_add(opts.seeds) {
        if opts.time_limit.is_some_and(|l| started.elapsed() >= l) {
            break;
        }
        let twice = opts.determinism_every > 0
            && (seed - opts.start).is_multiple_of(opts.determinism_every);
        let o = run_seed(seed, twice);
        each(&o);
        summary.seeds_run += 1;
        if !o.passed() {
            summary.failed.push(o);
        }
    }
    summary.wall_s = started.elapsed().as_secs_f64();
    summary
}
