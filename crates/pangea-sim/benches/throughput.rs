//! Network throughput: send + deliver pairs per second of wall time.
//!
//! `cargo bench -p pangea-sim --bench throughput`
//!
//! A closed loop on the four-continents topology (27 replicas): `window` messages
//! are kept in flight; every delivery makes its receiver send one message to a
//! random replica at the delivery time, as replicas answering each other would.
//! Each scenario runs 5 million send + deliver pairs after a warm-up and prints the
//! rate. Wall time is read here only; the network itself never reads a clock.

use pangea_sim::net::{LinkOverride, NetConfig, Network, ReplicaIdx, SendOutcome};
use pangea_sim::{SimRng, SimTime};
use pangea_topology::{RegionId, Topology};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

const FOUR_CONTINENTS: &str = include_str!("../../../topology/four-continents.toml");
const PAIRS: u64 = 5_000_000;

/// A message the size of a small replication frame header: the network moves it,
/// never looks inside.
#[derive(Debug, Clone, Copy)]
struct Msg {
    seq: u64,
    origin: u32,
}

struct Scenario {
    name: &'static str,
    window: usize,
    config: NetConfig,
    /// Bandwidth and loss on every inter-region link.
    wan: Option<LinkOverride>,
    /// Look replicas up by id (`send`) instead of by index (`send_idx`).
    by_id: bool,
}

fn run(topology: &Topology, s: &Scenario) -> f64 {
    let mut net: Network<Msg> = Network::new(topology, s.config.clone(), 42).expect("valid config");
    if let Some(link) = s.wan {
        let regions: Vec<&RegionId> = topology.regions.keys().collect();
        for (i, a) in regions.iter().enumerate() {
            for b in &regions[i + 1..] {
                net.degrade_link(a, b, link).expect("valid override");
            }
        }
    }
    let replicas: Vec<ReplicaIdx> = net.replicas().map(|(i, _)| i).collect();
    let ids: Vec<_> = net.replicas().map(|(_, id)| id.clone()).collect();
    let mut rng = SimRng::new(7);
    let mut seq = 0u64;
    for _ in 0..s.window {
        let (f, t) = (
            rng.next_below(replicas.len()),
            rng.next_below(replicas.len()),
        );
        let _ = net.send_idx(
            SimTime::ZERO,
            replicas[f],
            replicas[t],
            Msg { seq, origin: 0 },
            1024,
        );
        seq += 1;
    }
    let step = |net: &mut Network<Msg>, rng: &mut SimRng, seq: &mut u64| {
        let now = net
            .next_delivery()
            .expect("the window keeps messages in flight");
        let d = net.pop_delivery(now).expect("a message is due");
        black_box(d.msg.seq);
        let t = rng.next_below(replicas.len());
        let msg = Msg {
            seq: *seq,
            origin: d.msg.origin,
        };
        *seq += 1;
        let outcome = if s.by_id {
            net.send(now, &ids[d.to.index()], &ids[t], msg, 1024)
        } else {
            net.send_idx(now, d.to, replicas[t], msg, 1024)
        };
        debug_assert!(matches!(outcome, SendOutcome::Scheduled { .. }));
    };
    for _ in 0..PAIRS / 10 {
        step(&mut net, &mut rng, &mut seq);
    }
    let start = Instant::now();
    for _ in 0..PAIRS {
        step(&mut net, &mut rng, &mut seq);
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = PAIRS as f64 / secs;
    let stats = net.stats();
    println!(
        "{:<40} window {:>7}  {:>6.2} M pairs/s  ({:.0} ns/pair; virtual {:.1} s, {} retransmissions)",
        s.name,
        s.window,
        rate / 1e6,
        secs * 1e9 / PAIRS as f64,
        net.next_delivery().unwrap_or(SimTime::ZERO).as_secs_f64(),
        stats.retransmissions,
    );
    rate
}

fn main() {
    let topology = Topology::parse(Path::new("four-continents.toml"), FOUR_CONTINENTS)
        .expect("reference topology");
    let lossy_wan = Some(LinkOverride {
        extra_latency_ms: 0.0,
        loss: Some(0.01),
        bandwidth_mbps: Some(10_000.0),
    });
    let scenarios = [
        Scenario {
            name: "jitter, send_idx",
            window: 1_000,
            config: NetConfig::default(),
            wan: None,
            by_id: false,
        },
        Scenario {
            name: "jitter, send_idx",
            window: 10_000,
            config: NetConfig::default(),
            wan: None,
            by_id: false,
        },
        Scenario {
            name: "jitter, send_idx",
            window: 100_000,
            config: NetConfig::default(),
            wan: None,
            by_id: false,
        },
        Scenario {
            name: "jitter, send_idx",
            window: 1_000_000,
            config: NetConfig::default(),
            wan: None,
            by_id: false,
        },
        Scenario {
            name: "no jitter, send_idx",
            window: 10_000,
            config: NetConfig::without_jitter(),
            wan: None,
            by_id: false,
        },
        Scenario {
            name: "jitter + 10 Gbps + 1% loss, send_idx",
            window: 10_000,
            config: NetConfig::default(),
            wan: lossy_wan,
            by_id: false,
        },
        Scenario {
            name: "jitter, send by ReplicaId",
            window: 10_000,
            config: NetConfig::default(),
            wan: None,
            by_id: true,
        },
    ];
    for s in &scenarios {
        run(&topology, s);
    }
}
