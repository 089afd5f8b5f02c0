//! The network model, as a specification: latency, jitter, FIFO, bandwidth, loss,
//! faults, accounting and determinism.

use anyhow::{Context, Result, bail};
use pangea_sim::net::{
    Delivery, DropReason, LinkOverride, NetConfig, Network, ReplicaIdx, SendOutcome,
};
use pangea_sim::{SimDuration, SimRng, SimTime};
use pangea_topology::{LinkClass, RegionId, ReplicaId, Topology};
use proptest::prelude::*;
use std::path::Path;

const FOUR_CONTINENTS: &str = include_str!("../../../topology/four-continents.toml");
const LOCAL_3: &str = include_str!("../../../topology/local-3-regions.toml");

/// Two regions on two continents joined by a 100 Mbps link with 20% loss.
const NARROW_LOSSY: &str = r#"
name = "narrow-lossy"
intra_region_rtt_ms = 1.0

[[continents]]
name = "east"
  [[continents.regions]]
  name = "e1"
    [[continents.regions.replicas]]
    id = "e1-a"
    role = "serving"
    [[continents.regions.replicas]]
    id = "e1-b"
    role = "serving"

[[continents]]
name = "west"
  [[continents.regions]]
  name = "w1"
    [[continents.regions.replicas]]
    id = "w1-a"
    role = "serving"

[[links]]
a = "e1"
b = "w1"
rtt_ms = 40.0
bandwidth_mbps = 100
loss = 0.2
"#;

fn four_continents() -> Result<Topology> {
    Ok(Topology::parse(
        Path::new("four-continents.toml"),
        FOUR_CONTINENTS,
    )?)
}

fn topo(name: &str, text: &str) -> Result<Topology> {
    Ok(Topology::parse(Path::new(name), text)?)
}

fn idx<M>(net: &Network<M>, id: &str) -> Result<ReplicaIdx> {
    net.replica_idx(&ReplicaId::from(id))
        .with_context(|| format!("no replica {id}"))
}

fn region(name: &str) -> RegionId {
    RegionId::from(name)
}

fn scheduled(outcome: SendOutcome) -> Result<SimTime> {
    match outcome {
        SendOutcome::Scheduled { deliver_at } => Ok(deliver_at),
        SendOutcome::Dropped { reason } => bail!("dropped: {reason:?}"),
    }
}

/// Delivers everything in flight, advancing time to each delivery.
fn drain<M>(net: &mut Network<M>) -> Vec<Delivery<M>> {
    let mut out = Vec::new();
    while let Some(now) = net.next_delivery() {
        while let Some(d) = net.pop_delivery(now) {
            out.push(d);
        }
    }
    out
}

#[test]
fn one_way_delay_is_half_the_round_trip() -> Result<()> {
    let topology = four_continents()?;
    let mut net = Network::new(&topology, NetConfig::without_jitter(), 7)?;
    let (use1, euw1) = (idx(&net, "use1-a")?, idx(&net, "euw1-b")?);
    let at = scheduled(net.send_idx(SimTime::from_ms(5), use1, euw1, (), 1000))?;
    // 69.6 ms round trip between us-east-1 and eu-west-1.
    assert_eq!(at, SimTime::from_ms(5) + SimDuration::from_us(34_800));
    let at = scheduled(net.send(SimTime::ZERO, &"use1-a".into(), &"use1-b".into(), (), 1000))?;
    assert_eq!(at, SimTime::from_us(500), "intra-region: 1 ms round trip");

    // Every pair: exactly rtt/2, rounded to the microsecond.
    let mut net = Network::new(&topology, NetConfig::without_jitter(), 7)?;
    let ids: Vec<(ReplicaIdx, ReplicaId)> = net.replicas().map(|(i, id)| (i, id.clone())).collect();
    assert_eq!(ids.len(), 27);
    let t0 = SimTime::from_secs(1);
    for (fi, f) in &ids {
        for (ti, t) in &ids {
            let at = scheduled(net.send_idx(t0, *fi, *ti, (), 100))?;
            let rtt_ms = topology.rtt_ms(f, t).context("rtt")?;
            assert_eq!(
                at - t0,
                SimDuration::from_ms_f64(rtt_ms / 2.0),
                "{f} -> {t}"
            );
        }
    }
    assert_eq!(drain(&mut net).len(), 27 * 27);
    Ok(())
}

#[test]
fn jitter_stays_within_its_fraction() -> Result<()> {
    let topology = four_continents()?;
    let config = NetConfig::default();
    let frac = config.jitter_fraction;
    let mut net = Network::new(&topology, config, 11)?;
    let mut rng = SimRng::new(3);
    let n = net.replica_count();
    let mut extra_max = 0.0f64;
    for i in 0..20_000u64 {
        let (f, t) = (rng.next_below(n), rng.next_below(n));
        let (f, t) = (
            net.replicas().nth(f).unwrap().0,
            net.replicas().nth(t).unwrap().0,
        );
        let base = net.one_way_latency(f, t).unwrap();
        // Each send starts a fresh connection time far after the last, so FIFO
        // never holds a message back and the delay is latency + jitter alone.
        let now = SimTime::from_secs(i);
        let at = scheduled(net.send_idx(now, f, t, (), 10))?;
        let delay = at - now;
        assert!(delay >= base);
        let allowed = (base.as_us() as f64 * frac) as u64;
        assert!(delay.as_us() - base.as_us() <= allowed, "{delay} vs {base}");
        if base.as_us() > 0 {
            extra_max = extra_max.max((delay.as_us() - base.as_us()) as f64 / base.as_us() as f64);
        }
    }
    assert!(
        extra_max > frac * 0.9,
        "jitter should use its range: {extra_max}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the sends, every connection delivers in send order, and no message
    /// arrives before its one-way latency.
    #[test]
    fn fifo_per_connection_under_jitter(
        seed in any::<u64>(),
        sends in prop::collection::vec((0usize..27, 0usize..27, 0u64..3_000, 0usize..200_000), 1..1000),
        jitter_fraction in 0.0f64..2.0,
    ) {
        let topology = four_continents().unwrap();
        let config = NetConfig { jitter_fraction, ..NetConfig::default() };
        let mut net: Network<u64> = Network::new(&topology, config, seed).unwrap();
        let replicas: Vec<ReplicaIdx> = net.replicas().map(|(i, _)| i).collect();
        // Narrow links make serialization matter too.
        net.degrade_link(&region("us-east-1"), &region("eu-west-1"), LinkOverride {
            bandwidth_mbps: Some(50.0), loss: Some(0.3), ..LinkOverride::default()
        }).unwrap();
        let mut now = SimTime::ZERO;
        let mut latencies = Vec::new();
        let mut scheduled_at = Vec::new();
        for (seq, (f, t, gap_us, bytes)) in sends.into_iter().enumerate() {
            now += SimDuration::from_us(gap_us);
            let (f, t) = (replicas[f], replicas[t]);
            latencies.push(net.one_way_latency(f, t).unwrap());
            let outcome = net.send_idx(now, f, t, seq as u64, bytes);
            let SendOutcome::Scheduled { deliver_at } = outcome else {
                return Err(TestCaseError::fail(format!("refused: {outcome:?}")));
            };
            scheduled_at.push((deliver_at, seq as u64));
        }
        let deliveries = drain(&mut net);
        prop_assert_eq!(deliveries.len(), latencies.len());
        // Exactly the order of one global queue keyed by (deliver_at, send order).
        let mut expected: Vec<(SimTime, u64)> = scheduled_at.clone();
        expected.sort();
        let got: Vec<(SimTime, u64)> = deliveries.iter().map(|d| (d.deliver_at, d.msg)).collect();
        prop_assert_eq!(got, expected);
        let mut last: std::collections::BTreeMap<(ReplicaIdx, ReplicaIdx), (u64, SimTime)> =
            Default::default();
        let mut prev_time = SimTime::ZERO;
        for d in &deliveries {
            prop_assert!(d.deliver_at >= prev_time, "deliveries come out in time order");
            prev_time = d.deliver_at;
            prop_assert!(d.deliver_at - d.sent_at >= latencies[d.msg as usize]);
            if let Some(&(seq, at)) = last.get(&(d.from, d.to)) {
                prop_assert!(d.msg > seq, "connection {:?} reordered {} after {}", (d.from, d.to), d.msg, seq);
                prop_assert!(d.deliver_at >= at);
            }
            last.insert((d.from, d.to), (d.msg, d.deliver_at));
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Send {
        from: usize,
        to: usize,
        bytes: usize,
    },
    Advance {
        us: u64,
    },
    Partition {
        a: usize,
        b: usize,
        one_way: bool,
    },
    HealAll,
    Down {
        replica: usize,
        down: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..27, 0usize..27, 0usize..50_000)
            .prop_map(|(from, to, bytes)| Op::Send { from, to, bytes }),
        3 => (0u64..100_000).prop_map(|us| Op::Advance { us }),
        1 => (0usize..13, 0usize..13, any::<bool>())
            .prop_map(|(a, b, one_way)| Op::Partition { a, b, one_way }),
        1 => Just(Op::HealAll),
        1 => (0usize..27, any::<bool>()).prop_map(|(replica, down)| Op::Down { replica, down }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With faults and deliveries interleaved: every accepted message is delivered
    /// exactly once or counted as dropped in flight; deliveries come in
    /// (deliver_at, send order), never early, never to or from a down replica that
    /// went down after the send; and each connection stays FIFO.
    #[test]
    fn faults_interleaved_with_traffic(seed in any::<u64>(), ops in prop::collection::vec(op(), 1..600)) {
        let topology = four_continents().unwrap();
        let mut net: Network<u64> = Network::new(&topology, NetConfig::default(), seed).unwrap();
        let replicas: Vec<ReplicaIdx> = net.replicas().map(|(i, _)| i).collect();
        let regions: Vec<RegionId> = topology.regions.keys().cloned().collect();
        let mut now = SimTime::ZERO;
        let mut accepted = std::collections::BTreeMap::new(); // seq -> (deliver_at, from, to)
        let mut delivered = Vec::new();
        let mut seq = 0u64;
        for op in ops {
            match op {
                Op::Send { from, to, bytes } => {
                    let (f, t) = (replicas[from], replicas[to]);
                    if let SendOutcome::Scheduled { deliver_at } = net.send_idx(now, f, t, seq, bytes) {
                        prop_assert!(deliver_at >= now);
                        accepted.insert(seq, (deliver_at, f, t));
                    }
                    seq += 1;
                }
                Op::Advance { us } => {
                    now += SimDuration::from_us(us);
                    while let Some(d) = net.pop_delivery(now) {
                        prop_assert!(d.deliver_at <= now);
                        prop_assert!(!net.is_down(d.to));
                        delivered.push(d);
                    }
                }
                Op::Partition { a, b, one_way } => {
                    if a != b {
                        net.partition(
                            std::slice::from_ref(&regions[a]),
                            std::slice::from_ref(&regions[b]),
                            one_way,
                        ).unwrap();
                    }
                }
                Op::HealAll => net.heal_all(),
                Op::Down { replica, down } => net.set_down_idx(replicas[replica], down).unwrap(),
            }
            prop_assert_eq!(net.stats().in_flight, net.in_flight());
        }
        delivered.extend(drain(&mut net));
        let stats = net.stats();
        prop_assert_eq!(
            delivered.len() as u64 + stats.dropped_in_flight.total_messages(),
            accepted.len() as u64
        );
        let mut seen = std::collections::BTreeSet::new();
        let mut last_key = (SimTime::ZERO, 0u64);
        let mut last_on_conn = std::collections::BTreeMap::new();
        for d in &delivered {
            prop_assert!(seen.insert(d.msg), "delivered twice");
            let &(at, f, t) = accepted.get(&d.msg).unwrap();
            prop_assert_eq!((at, f, t), (d.deliver_at, d.from, d.to));
            let key = (d.deliver_at, d.msg);
            prop_assert!(key > last_key || d.msg == 0, "{:?} after {:?}", key, last_key);
            last_key = key;
            if let Some(prev) = last_on_conn.insert((d.from, d.to), d.msg) {
                prop_assert!(prev < d.msg);
            }
        }
    }
}

#[test]
fn equal_times_pop_in_send_order() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::without_jitter(), 1)?;
    let (a, b, c, d) = (
        idx(&net, "use1-a")?,
        idx(&net, "use1-b")?,
        idx(&net, "use1-c")?,
        idx(&net, "use1-batch")?,
    );
    // Six messages all due at 500 µs on three connections, interleaved.
    for (i, (f, t)) in [(c, b), (a, b), (c, b), (d, b), (a, b), (c, b)]
        .into_iter()
        .enumerate()
    {
        let at = scheduled(net.send_idx(SimTime::ZERO, f, t, i as u32, 10))?;
        assert_eq!(at, SimTime::from_us(500));
    }
    let got: Vec<u32> = drain(&mut net).into_iter().map(|d| d.msg).collect();
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    Ok(())
}

#[test]
fn different_connections_reorder_with_jitter() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::default(), 5)?;
    // Two connections into euw1-a from the same region, same latency: sent
    // alternately 100 µs apart, jitter (up to 1.7 ms here) lets later ones overtake.
    let (a, b, to) = (
        idx(&net, "use1-a")?,
        idx(&net, "use1-b")?,
        idx(&net, "euw1-a")?,
    );
    for i in 0..1000u32 {
        let from = if i % 2 == 0 { a } else { b };
        let _ = scheduled(net.send_idx(SimTime::from_us(u64::from(i) * 100), from, to, i, 100))?;
    }
    let order: Vec<u32> = drain(&mut net).into_iter().map(|d| d.msg).collect();
    let inversions = order.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(
        inversions > 50,
        "expected cross-connection reordering, got {inversions}"
    );

    // Without jitter the same sends arrive in send order.
    let mut net: Network<u32> = Network::new(&topology, NetConfig::without_jitter(), 5)?;
    for i in 0..1000u32 {
        let from = if i % 2 == 0 { a } else { b };
        let _ = scheduled(net.send_idx(SimTime::from_us(u64::from(i) * 100), from, to, i, 100))?;
    }
    let order: Vec<u32> = drain(&mut net).into_iter().map(|d| d.msg).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]));
    Ok(())
}

#[test]
fn bandwidth_serializes_a_burst() -> Result<()> {
    // From the topology file: 100 Mbps between e1 and w1 (loss disabled here).
    let topology = topo("narrow-lossy.toml", NARROW_LOSSY)?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::without_jitter(), 1)?;
    let (e1, w1) = (region("e1"), region("w1"));
    net.degrade_link(
        &e1,
        &w1,
        LinkOverride {
            loss: Some(0.0),
            ..LinkOverride::default()
        },
    )?;
    let (a, b, w) = (idx(&net, "e1-a")?, idx(&net, "e1-b")?, idx(&net, "w1-a")?);
    const MB: usize = 1_000_000;
    let mut last = SimTime::ZERO;
    for i in 0..10 {
        // Two connections share the region pair's pipe.
        let from = if i % 2 == 0 { a } else { b };
        last = scheduled(net.send_idx(SimTime::ZERO, from, w, i, MB))?;
    }
    // 8 Mbit / 100 Mbps = 80 ms each; the last finishes transmitting at 800 ms and
    // then crosses the 20 ms one-way latency.
    assert!(last >= SimTime::from_ms(800));
    assert_eq!(last, SimTime::from_ms(820));
    // The reverse direction is a separate pipe and is idle.
    let back = scheduled(net.send_idx(SimTime::ZERO, w, a, 99, MB))?;
    assert_eq!(back, SimTime::from_ms(100));
    // Intra-region traffic is not limited by default.
    let local = scheduled(net.send_idx(SimTime::ZERO, a, b, 98, MB))?;
    assert_eq!(local, SimTime::from_us(500));
    drain(&mut net);

    // The same through a runtime override on a topology without bandwidths.
    let topology = topo("local-3-regions.toml", LOCAL_3)?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::default(), 1)?;
    net.degrade_link(
        &region("eu-west-1"),
        &region("us-east-1"),
        LinkOverride {
            bandwidth_mbps: Some(100.0),
            ..LinkOverride::default()
        },
    )?;
    let (a, w) = (idx(&net, "use1-a")?, idx(&net, "euw1-a")?);
    let mut last = SimTime::ZERO;
    for i in 0..10 {
        last = scheduled(net.send_idx(SimTime::ZERO, a, w, i, MB))?;
    }
    assert!(last >= SimTime::from_ms(800), "{last}");
    // Restored: no limit again (only latency and up to 5% jitter).
    net.restore_link(&region("eu-west-1"), &region("us-east-1"))?;
    let t = SimTime::from_secs(10);
    let at = scheduled(net.send_idx(t, a, w, 10, MB))?;
    assert!(at - t <= SimDuration::from_us(34_800 + 1_740));

    // Intra-region bandwidth when configured.
    let config = NetConfig {
        intra_region_bandwidth_mbps: Some(1000.0),
        ..NetConfig::without_jitter()
    };
    let mut net: Network<u32> = Network::new(&topology, config, 1)?;
    let (a, b) = (idx(&net, "use1-a")?, idx(&net, "use1-b")?);
    let at = scheduled(net.send_idx(SimTime::ZERO, a, b, 0, MB))?;
    assert_eq!(at, SimTime::from_us(8_000 + 500));
    Ok(())
}

#[test]
fn loss_delays_but_never_drops() -> Result<()> {
    // 20% loss from the file, 40 ms round trip: rto = max(1.5 × 40, 10) = 60 ms.
    let topology = topo("narrow-lossy.toml", NARROW_LOSSY)?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::without_jitter(), 9)?;
    let (a, w) = (idx(&net, "e1-a")?, idx(&net, "w1-a")?);
    let n = 2_000u32;
    for i in 0..n {
        // 1 s apart, 125 bytes (10 µs on the wire): no FIFO or queueing effects.
        let _ = scheduled(net.send_idx(SimTime::from_secs(u64::from(i)), a, w, i, 125))?;
    }
    let deliveries = drain(&mut net);
    assert_eq!(deliveries.len(), n as usize, "loss must not drop anything");
    let mut delayed = 0;
    for d in &deliveries {
        let extra_us = (d.deliver_at - d.sent_at).as_us() - 20_010;
        assert_eq!(extra_us % 60_000, 0, "whole retransmission timeouts");
        delayed += usize::from(extra_us > 0);
    }
    let stats = net.stats();
    // Expect 20% of messages to be delayed, and 0.25 retransmissions per message.
    assert!((300..500).contains(&delayed), "{delayed} of {n} delayed");
    assert!(
        (350..650).contains(&stats.retransmissions),
        "{}",
        stats.retransmissions
    );
    assert_eq!(stats.delivered.messages, u64::from(n));
    assert_eq!(stats.dropped_in_flight.total_messages(), 0);

    // Loss 1 by override: every message hits the retransmission cap, still arrives.
    let config = NetConfig {
        retransmissions_max: 3,
        ..NetConfig::without_jitter()
    };
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, config, 9)?;
    net.degrade_link(
        &region("us-east-1"),
        &region("us-east-1"),
        LinkOverride {
            loss: Some(1.0),
            ..LinkOverride::default()
        },
    )?;
    let (a, b) = (idx(&net, "use1-a")?, idx(&net, "use1-b")?);
    let at = scheduled(net.send_idx(SimTime::ZERO, a, b, 0, 10))?;
    // rto = max(1.5 × 1 ms, 10 ms) = 10 ms, three times.
    assert_eq!(at, SimTime::from_us(500 + 30_000));
    assert_eq!(drain(&mut net).len(), 1);
    Ok(())
}

#[test]
fn two_way_partition_drops_both_directions_and_heals() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::default(), 3)?;
    let (us, eu, ap) = (
        idx(&net, "use1-a")?,
        idx(&net, "euw1-a")?,
        idx(&net, "apne1-a")?,
    );
    // In flight before the partition: dropped when it starts.
    let _ = scheduled(net.send_idx(SimTime::ZERO, us, eu, 1, 100))?;
    let _ = scheduled(net.send_idx(SimTime::ZERO, us, ap, 2, 100))?;
    let p = net.partition(
        &[region("us-east-1"), region("us-east-2")],
        &[region("eu-west-1")],
        false,
    )?;
    assert_eq!(net.in_flight(), 1);
    assert!(net.is_cut(&region("eu-west-1"), &region("us-east-1"))?);
    assert!(!net.is_cut(&region("us-east-1"), &region("ap-northeast-1"))?);
    let t = SimTime::from_ms(1);
    for (f, to) in [(us, eu), (eu, us)] {
        assert_eq!(
            net.send_idx(t, f, to, 3, 100),
            SendOutcome::Dropped {
                reason: DropReason::Partitioned
            }
        );
    }
    // Unrelated paths still work.
    let _ = scheduled(net.send_idx(t, eu, ap, 4, 100))?;
    let got: Vec<u32> = drain(&mut net).into_iter().map(|d| d.msg).collect();
    // us-east-1 -> ap-northeast-1 takes 74.65 ms, eu-west-1 -> there 100.5 ms.
    assert_eq!(got, [2, 4]);

    assert!(net.heal(p));
    assert!(!net.heal(p), "healing twice is a no-op");
    let _ = scheduled(net.send_idx(SimTime::from_secs(1), us, eu, 5, 100))?;
    let _ = scheduled(net.send_idx(SimTime::from_secs(1), eu, us, 6, 100))?;
    assert_eq!(drain(&mut net).len(), 2);

    let stats = net.stats();
    assert_eq!(stats.dropped_at_send.partitioned.messages, 2);
    assert_eq!(stats.dropped_in_flight.partitioned.messages, 1);
    assert_eq!(stats.dropped_in_flight.partitioned.bytes, 100);
    Ok(())
}

#[test]
fn one_way_partition_cuts_one_direction() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::default(), 3)?;
    let (us, eu) = (idx(&net, "use1-a")?, idx(&net, "euw1-a")?);
    let _ = scheduled(net.send_idx(SimTime::ZERO, eu, us, 1, 10))?; // survives
    let _ = scheduled(net.send_idx(SimTime::ZERO, us, eu, 2, 10))?; // dropped in flight
    net.partition(&[region("us-east-1")], &[region("eu-west-1")], true)?;
    assert_eq!(
        net.send_idx(SimTime::ZERO, us, eu, 3, 10),
        SendOutcome::Dropped {
            reason: DropReason::Partitioned
        }
    );
    let _ = scheduled(net.send_idx(SimTime::ZERO, eu, us, 4, 10))?;
    let got: Vec<u32> = drain(&mut net).into_iter().map(|d| d.msg).collect();
    assert_eq!(got, [1, 4]);
    net.heal_all();
    assert_eq!(net.partitions().count(), 0);
    let _ = scheduled(net.send_idx(SimTime::from_secs(1), us, eu, 5, 10))?;
    Ok(())
}

#[test]
fn overlapping_partitions_compose() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::default(), 3)?;
    let (us, eu) = (region("us-east-1"), region("eu-west-1"));
    let p1 = net.partition(std::slice::from_ref(&us), std::slice::from_ref(&eu), false)?;
    let p2 = net.isolate_region(&eu)?;
    assert!(net.heal(p1));
    assert!(net.is_cut(&us, &eu)?, "still cut by the isolation");
    assert!(net.is_cut(&region("eu-west-1"), &region("ap-south-1"))?);
    assert!(!net.is_cut(&us, &region("ap-south-1"))?);
    assert!(net.heal(p2));
    assert!(!net.is_cut(&us, &eu)?);
    // Bad requests are errors, not panics.
    assert!(
        net.partition(std::slice::from_ref(&us), std::slice::from_ref(&us), false)
            .is_err()
    );
    assert!(net.partition(&[region("mars-1")], &[us], false).is_err());
    assert_eq!(net.partitions().count(), 0);
    Ok(())
}

#[test]
fn down_replicas_send_and_receive_nothing() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::default(), 3)?;
    let (a, b, c) = (
        idx(&net, "use1-a")?,
        idx(&net, "euw1-a")?,
        idx(&net, "apne1-a")?,
    );
    let _ = scheduled(net.send_idx(SimTime::ZERO, a, b, 1, 10))?; // to b: dropped when b dies
    let _ = scheduled(net.send_idx(SimTime::ZERO, b, c, 2, 10))?; // from b: already left
    net.set_down(&"euw1-a".into(), true)?;
    assert!(net.is_down(b));
    for (f, t) in [(a, b), (b, c)] {
        assert_eq!(
            net.send_idx(SimTime::from_ms(1), f, t, 3, 10),
            SendOutcome::Dropped {
                reason: DropReason::ReplicaDown
            }
        );
    }
    let got: Vec<u32> = drain(&mut net).into_iter().map(|d| d.msg).collect();
    assert_eq!(got, [2]);
    net.set_down(&"euw1-a".into(), false)?;
    let _ = scheduled(net.send_idx(SimTime::from_secs(1), a, b, 4, 10))?;
    assert_eq!(drain(&mut net).len(), 1);
    let stats = net.stats();
    assert_eq!(stats.dropped_at_send.replica_down.messages, 2);
    assert_eq!(stats.dropped_in_flight.replica_down.messages, 1);
    assert!(net.set_down(&"nobody".into(), true).is_err());
    assert_eq!(
        net.send(SimTime::ZERO, &"nobody".into(), &"use1-a".into(), 0, 1),
        SendOutcome::Dropped {
            reason: DropReason::UnknownReplica
        }
    );
    Ok(())
}

#[test]
fn extra_latency_applies_both_ways_until_restored() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<u32> = Network::new(&topology, NetConfig::without_jitter(), 3)?;
    let (us, eu) = (idx(&net, "use1-a")?, idx(&net, "euw1-a")?);
    net.degrade_link(
        &region("eu-west-1"),
        &region("us-east-1"),
        LinkOverride {
            extra_latency_ms: 100.0,
            ..LinkOverride::default()
        },
    )?;
    assert_eq!(
        scheduled(net.send_idx(SimTime::ZERO, us, eu, 0, 1))?,
        SimTime::from_us(134_800)
    );
    assert_eq!(
        scheduled(net.send_idx(SimTime::ZERO, eu, us, 1, 1))?,
        SimTime::from_us(134_800)
    );
    net.restore_all_links();
    let t = SimTime::from_secs(1);
    assert_eq!(
        scheduled(net.send_idx(t, us, eu, 2, 1))?,
        t + SimDuration::from_us(34_800)
    );
    assert!(
        net.degrade_link(
            &region("eu-west-1"),
            &region("us-east-1"),
            LinkOverride {
                loss: Some(2.0),
                ..LinkOverride::default()
            },
        )
        .is_err()
    );
    Ok(())
}

#[test]
fn accounting_by_class_and_pair_serializes() -> Result<()> {
    let topology = four_continents()?;
    let mut net: Network<()> = Network::new(&topology, NetConfig::default(), 3)?;
    let id = |s: &str| ReplicaId::from(s);
    let _ = scheduled(net.send(SimTime::ZERO, &id("use1-a"), &id("use1-b"), (), 100))?;
    let _ = scheduled(net.send(SimTime::ZERO, &id("use1-a"), &id("use2-a"), (), 200))?;
    let _ = scheduled(net.send(SimTime::ZERO, &id("use1-a"), &id("use2-a"), (), 200))?;
    let _ = scheduled(net.send(SimTime::ZERO, &id("use1-a"), &id("euw1-a"), (), 400))?;
    let (a, b) = (idx(&net, "use1-a")?, idx(&net, "euw1-a")?);
    assert_eq!(net.link_class(a, b), Some(LinkClass::InterContinent));
    drain(&mut net);
    let s = net.stats();
    assert_eq!(
        (s.sent.intra_region.messages, s.sent.intra_region.bytes),
        (1, 100)
    );
    assert_eq!(
        (s.sent.inter_region.messages, s.sent.inter_region.bytes),
        (2, 400)
    );
    assert_eq!(
        (
            s.sent.inter_continent.messages,
            s.sent.inter_continent.bytes
        ),
        (1, 400)
    );
    assert_eq!(s.sent.total().bytes, 900);
    assert_eq!(s.delivered.messages, 4);
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.in_flight_max, 4);
    let pairs: Vec<(&str, &str, u64, u64)> = s
        .pairs
        .iter()
        .map(|p| (p.from.as_str(), p.to.as_str(), p.messages, p.bytes))
        .collect();
    assert_eq!(
        pairs,
        [
            ("use1-a", "euw1-a", 1, 400),
            ("use1-a", "use1-b", 1, 100),
            ("use1-a", "use2-a", 2, 400),
        ]
    );
    let json = serde_json::to_value(&s)?;
    assert_eq!(json["sent"]["inter_continent"]["bytes"], 400);
    assert_eq!(json["pairs"][0]["class"], "inter_continent");
    assert_eq!(json["dropped_at_send"]["partitioned"]["messages"], 0);
    Ok(())
}

/// Deliveries as (from, to, msg, sent_at µs, deliver_at µs).
type Trace = Vec<(u32, u32, u64, u64, u64)>;

/// A run of random traffic with faults, returning every delivery.
fn random_run(seed: u64) -> Result<Trace> {
    let topology = four_continents()?;
    let mut net: Network<u64> = Network::new(&topology, NetConfig::default(), seed)?;
    net.degrade_link(
        &region("us-east-1"),
        &region("eu-west-1"),
        LinkOverride {
            loss: Some(0.1),
            bandwidth_mbps: Some(200.0),
            ..LinkOverride::default()
        },
    )?;
    let replicas: Vec<ReplicaIdx> = net.replicas().map(|(i, _)| i).collect();
    // The workload is fixed (its own seed) so only the network's seed varies.
    let mut workload = SimRng::new(99);
    let mut out = Vec::new();
    let mut now = SimTime::ZERO;
    for i in 0..5_000u64 {
        now += SimDuration::from_us(workload.next_u64_inclusive(500));
        if i == 2_000 {
            net.partition(&[region("ap-south-1")], &[region("eu-west-1")], false)?;
        }
        if i == 3_000 {
            net.heal_all();
        }
        let (f, t) = (
            replicas[workload.next_below(replicas.len())],
            replicas[workload.next_below(replicas.len())],
        );
        let _ = net.send_idx(now, f, t, i, workload.next_below(100_000));
        while let Some(d) = net.pop_delivery(now) {
            out.push((
                d.from.index() as u32,
                d.to.index() as u32,
                d.msg,
                d.sent_at.as_us(),
                d.deliver_at.as_us(),
            ));
        }
    }
    for d in drain(&mut net) {
        out.push((
            d.from.index() as u32,
            d.to.index() as u32,
            d.msg,
            d.sent_at.as_us(),
            d.deliver_at.as_us(),
        ));
    }
    Ok(out)
}

#[test]
fn same_seed_same_deliveries_different_seed_different() -> Result<()> {
    let a = random_run(1)?;
    let b = random_run(1)?;
    assert!(a.len() > 4_000, "{}", a.len());
    assert_eq!(a, b);
    let c = random_run(2)?;
    assert_ne!(a, c);
    Ok(())
}

/// A split run's networks hand frames to each other (`hand_out`, `hand_in`): the
/// receiver's network delivers exactly what, when and in the order the sender's
/// would have, whatever it holds of its own.
#[test]
fn handed_over_messages_arrive_as_they_would_have() -> Result<()> {
    let t = topo("narrow-lossy", NARROW_LOSSY)?;
    let cfg = NetConfig::default();
    let (mut whole, mut sender, mut receiver) = (
        Network::<u32>::new(&t, cfg.clone(), 3)?,
        Network::<u32>::new(&t, cfg.clone(), 3)?,
        Network::<u32>::new(&t, cfg, 9)?,
    );
    let (e1a, e1b, w1a) = (
        idx(&whole, "e1-a")?,
        idx(&whole, "e1-b")?,
        idx(&whole, "w1-a")?,
    );
    sender.hand_to(|to| to == w1a);
    let mut now = SimTime::ZERO;
    for i in 0..60u32 {
        now += SimDuration::from_us(300);
        let from = if i % 2 == 0 { e1a } else { e1b };
        let _ = whole.send_idx(now, from, w1a, i, 1_000 + i as usize);
        let _ = sender.send_idx(now, from, w1a, i, 1_000 + i as usize);
        // The receiver's own traffic, to the other side.
        let _ = receiver.send_idx(now, w1a, e1a, 1_000 + i, 200);
    }
    let handed = sender.hand_out();
    assert_eq!(handed.len(), 60);
    assert_eq!(sender.in_flight(), 0);
    assert!(handed.iter().all(|h| h.to() == w1a));
    receiver.hand_in(handed);
    let drain = |net: &mut Network<u32>| {
        let mut out = Vec::new();
        while let Some(d) = net.pop_delivery(SimTime::MAX) {
            out.push((d.deliver_at, d.from, d.to, d.msg, d.bytes));
        }
        out
    };
    let expected = drain(&mut whole);
    let got: Vec<_> = drain(&mut receiver)
        .into_iter()
        .filter(|d| d.2 == w1a)
        .collect();
    assert_eq!(got, expected);
    Ok(())
}
