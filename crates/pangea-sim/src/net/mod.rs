//! The WAN between replicas, in virtual time.
//!
//! [`Network`] carries messages of any type `M` between the replicas of a
//! [`Topology`], as QUIC connections over the WAN would, and hands them back at
//! their delivery time. It never looks inside a message; the caller says how many
//! bytes it weighs.
//!
//! # The model, per message from replica A (region RA) to replica B (region RB)
//!
//! 1. **Refusal.** If A or B is down, or a partition cuts RA → RB, the message is
//!    dropped at once ([`SendOutcome::Dropped`]); nothing is queued.
//! 2. **Serialization.** If the RA → RB link has a bandwidth (file or override;
//!    [`NetConfig::intra_region_bandwidth_mbps`] when RA = RB), each *directed
//!    region pair* is one queue shared by all its connections: transmission starts
//!    at `max(now, link_free_at)` and takes `bytes × 8 / bandwidth` (1 Mbps = 1 bit
//!    per µs). Links without a bandwidth serialize instantly. Region pairs without a
//!    direct link in the file (traffic routed over several links) have no bandwidth
//!    or loss unless overridden: the topology gives their latency, not their path.
//! 3. **Latency.** One way = the topology's replica-to-replica round trip / 2, plus
//!    [`LinkOverride::extra_latency_ms`], plus jitter drawn per message uniformly
//!    from `[0, jitter_fraction × that latency]`.
//! 4. **Loss.** QUIC retransmits, so loss delays and never drops: with the link's
//!    loss probability a transmission is lost and costs one retransmission timeout
//!    `max(rto_rtt_factor × rtt, rto_min_ms)`; losses repeat independently, at most
//!    [`NetConfig::retransmissions_max`] times. A message is one unit here, not
//!    packets: a large message is as likely to need a retransmission as a small one,
//!    and retransmissions do not consume bandwidth again.
//! 5. **Per-connection FIFO.** A QUIC stream delivers in order, so a message never
//!    overtakes an earlier one on the same (A, B) connection: `deliver_at =
//!    max(previous deliver_at on (A, B), departure + latency + jitter + loss delay)`
//!    (equal times, on any connections, pop in send order). Different connections,
//!    even between the same two regions, may reorder relative to each other.
//!
//! # Faults
//!
//! - [`Network::partition`] cuts region pairs (both ways, or one way), until
//!   [`Network::heal`] or [`Network::heal_all`]; overlapping partitions compose, a
//!   pair is cut while any partition cuts it. **Messages in flight on a path when a
//!   partition cuts it are dropped** (counted in
//!   [`NetStats::dropped_in_flight`]): QUIC would keep retransmitting them until
//!   its idle timeout closed the connection, and a new connection starts empty.
//! - [`Network::set_down`] crashes a replica: everything sent to or by it is
//!   refused while it is down, and **messages in flight to it are dropped** when it
//!   goes down (its connections die with the process; a restarted replica must not
//!   receive what its previous life was sent). **Messages in flight from it are
//!   still delivered**: they had left the host.
//! - Dropping in-flight messages also resets the affected connections' FIFO and
//!   serialization state, since nothing is left queued on them. Reconnection costs
//!   (a handshake round trip) are not modelled.
//! - [`Network::degrade_link`] / [`Network::restore_link`] change the latency, loss
//!   and bandwidth between two regions in both directions. Only messages sent
//!   afterwards see the change; messages in flight keep their delivery time.
//!
//! # Bounds
//!
//! The network holds every accepted, undelivered message; it does not cap them,
//! because a real WAN does not drop on a busy healthy connection either. The bound
//! is the senders': the replication state machine bounds in-flight replication per
//! link (DESIGN principle 6), and [`NetStats::in_flight_max`] reports the
//! high-water mark so a drill can check it. Per-pair tables are dense:
//! `replicas² + regions²` entries, hence [`REPLICAS_MAX`].
//!
//! # Speed
//!
//! Replicas and regions are interned to dense indices when the network is built,
//! and [`Network::send`] adds only a `BTreeMap` lookup per end to
//! [`Network::send_idx`]. Messages wait in their connection's FIFO (a `VecDeque`,
//! reused without allocating once grown); because a connection delivers in order,
//! a binary heap of connection *heads* (at most one entry per busy connection, a
//! few hundred for the reference topology) finds the next delivery, however many
//! messages are in flight. Equal delivery times still pop in global send order:
//! heads are keyed by `(deliver_at, send sequence)`, the same key as a single
//! global queue ([`crate::queue::EventQueue`]) would use.

mod config;
mod stats;

pub use config::{LinkOverride, NetConfig, RETRANSMISSIONS_LIMIT};
pub use stats::{ClassTraffic, Drops, NetStats, PairTraffic, Traffic};

use crate::error::NetError;
use crate::rng::SimRng;
use crate::time::{SimDuration, SimTime};
use pangea_topology::{LinkClass, RegionId, ReplicaId, Topology};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::binary_heap::PeekMut;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

/// The most replicas a network accepts. Per-connection state is a dense
/// `replicas × replicas` table of 72-byte entries (before any message is queued):
/// 1,024 replicas take 72 MiB, and Pangea deployments have tens.
pub const REPLICAS_MAX: usize = 1024;

/// A replica's dense index in a [`Network`]: its position in replica-id order.
/// Cheap to copy and compare, unlike a [`ReplicaId`], so the hot path uses these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ReplicaIdx(u32);

impl ReplicaIdx {
    /// The index of the `i`-th replica in id order; meaningful only below
    /// [`Network::replica_count`] (others are refused like unknown replicas).
    pub fn new(i: usize) -> Self {
        // Callers pass indices below REPLICAS_MAX, which fit in u32.
        ReplicaIdx(u32::try_from(i).unwrap_or(u32::MAX))
    }

    pub fn index(self) -> usize {
        // u32 → usize is lossless on every supported (≥ 32-bit) target.
        self.0 as usize
    }
}

/// Why a message was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// A partition cut the path between the two regions.
    Partitioned,
    /// The sender or the receiver is down.
    ReplicaDown,
    /// The sender or the receiver is not in the topology.
    UnknownReplica,
}

/// What [`Network::send`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SendOutcome {
    /// Queued; it will be delivered at `deliver_at` unless a fault drops it first.
    Scheduled { deliver_at: SimTime },
    /// Not queued.
    Dropped { reason: DropReason },
}

/// A message arriving at its receiver. The ends are dense indices (no id clone per
/// message); [`Network::replica_id`] names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<M> {
    pub from: ReplicaIdx,
    pub to: ReplicaIdx,
    pub msg: M,
    pub bytes: usize,
    pub sent_at: SimTime,
    pub deliver_at: SimTime,
}

/// A message accepted earlier and dropped in flight by a fault (a partition or its
/// receiver going down). Drivers learn of it from [`Network::take_dropped`], to
/// release what the sender counts as in flight (`Replica::handle_sent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub from: ReplicaIdx,
    pub to: ReplicaIdx,
    pub bytes: usize,
    pub reason: DropReason,
}

/// What [`Network::path_state`] reports about one directed region pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathState {
    /// A partition cuts this direction.
    pub cut: bool,
    /// Added to the one-way latency by a link override.
    pub extra_latency_us: u64,
    /// The loss probability in effect (file or override).
    pub loss: f64,
}

/// Names an active partition, to heal it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct PartitionId(u64);

/// An active partition, as it was requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    pub regions_a: BTreeSet<RegionId>,
    pub regions_b: BTreeSet<RegionId>,
    /// Only messages from `regions_a` to `regions_b` are cut.
    pub one_way: bool,
    /// The directed region pairs it cuts, as `region_pairs` indices.
    #[serde(skip)]
    cuts: Vec<usize>,
}

#[derive(Debug)]
struct ReplicaInfo {
    id: ReplicaId,
    /// Index into `Network::regions`.
    region: u32,
    /// Continent number, only compared for equality (link classes).
    continent: u32,
    down: bool,
}

/// One directed replica pair: a QUIC connection.
#[derive(Debug)]
struct Conn<M> {
    /// Half the topology's round trip, fixed at construction (overrides are added
    /// per send from the region pair).
    base_latency_us: u64,
    /// The latest delivery time scheduled on this connection: the FIFO floor.
    last_deliver_at: SimTime,
    class: LinkClass,
    /// Accepted messages (accounting).
    sent: Traffic,
    /// Messages in flight on this connection, in send order, which is also
    /// delivery order (the FIFO rule): sorted by `(deliver_at, seq)`.
    in_flight: VecDeque<InFlight<M>>,
}

/// A connection's next delivery, as the heap of [`Network::heads`] orders it:
/// by `(at, seq)`, reversed so that `BinaryHeap`, a max-heap, pops the earliest.
#[derive(Debug, Clone, Copy)]
struct Head {
    at: SimTime,
    seq: u64,
    /// Index into `Network::conns`.
    conn: u32,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Head {}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// One directed region pair: the shared WAN pipe and its faults.
#[derive(Debug, Clone)]
struct RegionPair {
    /// From the topology file (0 without a direct link).
    file_loss: f64,
    /// From the topology file, or the config for a region with itself.
    file_bandwidth_mbps: Option<f64>,
    link_override: Option<LinkOverride>,
    // Effective values, recomputed when the override changes, so `send` does not.
    extra_latency_us: u64,
    loss: f64,
    /// 8 / bandwidth in Mbps; `None` = no bandwidth limit.
    us_per_byte: Option<f64>,
    /// When the pipe finishes transmitting what is queued on it.
    link_free_at: SimTime,
    /// How many active partitions cut this direction.
    cuts: u32,
}

impl RegionPair {
    fn refresh(&mut self) {
        let ov = self.link_override.unwrap_or_default();
        self.extra_latency_us = SimDuration::from_ms_f64(ov.extra_latency_ms).as_us();
        self.loss = ov.loss.unwrap_or(self.file_loss);
        self.us_per_byte = ov
            .bandwidth_mbps
            .or(self.file_bandwidth_mbps)
            .map(|mbps| 8.0 / mbps);
    }
}

/// A message in flight from one shard's network to another's
/// ([`Network::hand_out`], [`Network::hand_in`]).
#[derive(Debug)]
pub struct HandOff<M> {
    conn: u32,
    to: ReplicaIdx,
    m: InFlight<M>,
}

impl<M> HandOff<M> {
    /// Its receiver.
    pub fn to(&self) -> ReplicaIdx {
        self.to
    }

    /// When it arrives.
    pub fn deliver_at(&self) -> SimTime {
        self.m.deliver_at
    }

    /// The message, for the receiving shard to make its own (`Simulation::take_over`).
    pub fn msg_mut(&mut self) -> &mut M {
        &mut self.m.msg
    }
}

/// A message on the wire (its connection knows both ends).
#[derive(Debug)]
struct InFlight<M> {
    deliver_at: SimTime,
    /// Send order across the whole network: breaks ties between equal times.
    seq: u64,
    sent_at: SimTime,
    bytes: usize,
    msg: M,
}

/// The WAN between a topology's replicas. See the module documentation for the
/// model. Deterministic: the same topology, config, seed and sequence of calls give
/// the same deliveries at the same times.
#[derive(Debug)]
pub struct Network<M> {
    config: NetConfig,
    rng: SimRng,
    /// By [`ReplicaIdx`]: replica-id order.
    replicas: Vec<ReplicaInfo>,
    index: BTreeMap<ReplicaId, ReplicaIdx>,
    /// Region names in id order; a region's position is its index.
    regions: Vec<RegionId>,
    region_index: BTreeMap<RegionId, u32>,
    /// `from × replicas.len() + to`.
    conns: Vec<Conn<M>>,
    /// `from_region × regions.len() + to_region`.
    region_pairs: Vec<RegionPair>,
    partitions: BTreeMap<PartitionId, Partition>,
    next_partition: u64,
    rto_min_us: u64,
    /// The front of every connection with messages in flight, and nothing else:
    /// at most one entry per connection. Since each connection delivers in order,
    /// the earliest head is the earliest message of all.
    heads: BinaryHeap<Head>,
    /// The next send sequence number (a u64 never wraps in a run).
    next_seq: u64,
    /// Messages in flight over all connections.
    in_flight: usize,
    sent: ClassTraffic,
    delivered: Traffic,
    dropped_at_send: Drops,
    dropped_in_flight: Drops,
    retransmissions: u64,
    in_flight_max: usize,
    /// For a split run ([`Network::hand_to`]): by receiver, whether it lives in
    /// another shard; empty otherwise.
    elsewhere: Vec<bool>,
    /// Connections to another shard that took a message while empty since the
    /// last [`Network::hand_out`]: the only ones it looks at, rather than every
    /// connection at every barrier. Bound: one entry per connection, and one more
    /// per fault that empties it.
    outward: Vec<u32>,
    /// Messages dropped in flight since the last [`Network::take_dropped`]. Bound:
    /// at most the messages in flight when a fault strikes; drivers drain it after
    /// every fault call (tests that never do hold what their faults dropped).
    dropped: Vec<Dropped>,
}

impl<M> Network<M> {
    /// Builds the network of `topology`'s replicas, drawing jitter and loss from
    /// `seed`. Fails on an invalid config, a topology over [`REPLICAS_MAX`], or a
    /// replica pair the topology has no round trip for.
    pub fn new(topology: &Topology, config: NetConfig, seed: u64) -> Result<Self, NetError> {
        config.validate()?;
        let n = topology.replicas.len();
        if n > REPLICAS_MAX {
            return Err(NetError::TooManyReplicas {
                count: n,
                max: REPLICAS_MAX,
            });
        }
        let regions: Vec<RegionId> = topology.regions.keys().cloned().collect();
        let region_index: BTreeMap<RegionId, u32> = (0u32..)
            .zip(&regions)
            .map(|(i, r)| (r.clone(), i))
            .collect();
        let continent_index: BTreeMap<&str, u32> = (0u32..)
            .zip(&topology.continents)
            .map(|(i, c)| (c.as_str(), i))
            .collect();
        let mut replicas = Vec::with_capacity(n);
        let mut index = BTreeMap::new();
        for (i, (id, r)) in (0u32..).zip(&topology.replicas) {
            let region = *region_index
                .get(&r.region)
                .ok_or_else(|| NetError::UnknownRegion(r.region.to_string()))?;
            // A validated topology lists every replica's continent; an unknown one
            // still gets a number of its own so link classes stay meaningful.
            let continent = continent_index
                .get(r.continent.as_str())
                .copied()
                .unwrap_or(u32::MAX);
            replicas.push(ReplicaInfo {
                id: id.clone(),
                region,
                continent,
                down: false,
            });
            index.insert(id.clone(), ReplicaIdx(i));
        }

        let mut conns = Vec::with_capacity(n * n);
        for a in &replicas {
            for b in &replicas {
                let rtt_ms = topology
                    .rtt_ms(&a.id, &b.id)
                    .ok_or_else(|| NetError::NoRoute {
                        from: a.id.to_string(),
                        to: b.id.to_string(),
                    })?;
                let class = if a.region == b.region {
                    LinkClass::IntraRegion
                } else if a.continent == b.continent {
                    LinkClass::InterRegion
                } else {
                    LinkClass::InterContinent
                };
                conns.push(Conn {
                    base_latency_us: SimDuration::from_ms_f64(rtt_ms / 2.0).as_us(),
                    last_deliver_at: SimTime::ZERO,
                    class,
                    sent: Traffic::default(),
                    in_flight: VecDeque::new(),
                });
            }
        }

        let mut region_pairs = Vec::with_capacity(regions.len() * regions.len());
        for ra in &regions {
            for rb in &regions {
                let (file_loss, file_bandwidth_mbps) = if ra == rb {
                    (0.0, config.intra_region_bandwidth_mbps)
                } else {
                    topology
                        .link(ra, rb)
                        .map_or((0.0, None), |l| (l.loss, l.bandwidth_mbps))
                };
                let mut pair = RegionPair {
                    file_loss,
                    file_bandwidth_mbps,
                    link_override: None,
                    extra_latency_us: 0,
                    loss: 0.0,
                    us_per_byte: None,
                    link_free_at: SimTime::ZERO,
                    cuts: 0,
                };
                pair.refresh();
                region_pairs.push(pair);
            }
        }

        Ok(Network {
            rto_min_us: SimDuration::from_ms_f64(config.rto_min_ms).as_us(),
            heads: BinaryHeap::with_capacity(n * n),
            next_seq: 0,
            in_flight: 0,
            config,
            rng: SimRng::new(seed),
            replicas,
            index,
            regions,
            region_index,
            conns,
            region_pairs,
            partitions: BTreeMap::new(),
            next_partition: 0,
            sent: ClassTraffic::default(),
            delivered: Traffic::default(),
            dropped_at_send: Drops::default(),
            dropped_in_flight: Drops::default(),
            retransmissions: 0,
            in_flight_max: 0,
            elsewhere: Vec::new(),
            outward: Vec::new(),
            dropped: Vec::new(),
        })
    }

    // ---- Replicas -------------------------------------------------------------

    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// The dense index of a replica, to use with [`Network::send_idx`].
    pub fn replica_idx(&self, id: &ReplicaId) -> Option<ReplicaIdx> {
        self.index.get(id).copied()
    }

    pub fn replica_id(&self, idx: ReplicaIdx) -> Option<&ReplicaId> {
        self.replicas.get(idx.index()).map(|r| &r.id)
    }

    /// Every replica with its index, in id order.
    pub fn replicas(&self) -> impl Iterator<Item = (ReplicaIdx, &ReplicaId)> + '_ {
        (0u32..)
            .zip(&self.replicas)
            .map(|(i, r)| (ReplicaIdx(i), &r.id))
    }

    pub fn region_of(&self, idx: ReplicaIdx) -> Option<&RegionId> {
        let r = self.replicas.get(idx.index())?;
        self.regions.get(r.region as usize)
    }

    pub fn link_class(&self, from: ReplicaIdx, to: ReplicaIdx) -> Option<LinkClass> {
        self.conn_index(from, to).map(|c| self.conns[c].class)
    }

    /// The one-way latency a message would see now before jitter, serialization and
    /// loss: half the round trip plus any override.
    pub fn one_way_latency(&self, from: ReplicaIdx, to: ReplicaIdx) -> Option<SimDuration> {
        let c = self.conn_index(from, to)?;
        let rp = self.region_pair_index(from.index(), to.index());
        Some(SimDuration::from_us(
            self.conns[c].base_latency_us + self.region_pairs[rp].extra_latency_us,
        ))
    }

    /// Region names in id order; a region's position is the index the `*_idx`
    /// methods take.
    pub fn regions(&self) -> &[RegionId] {
        &self.regions
    }

    /// The dense index of a region.
    pub fn region_idx(&self, id: &RegionId) -> Option<usize> {
        self.region_index.get(id).map(|&i| i as usize)
    }

    /// The dense region index of a replica.
    pub fn region_idx_of(&self, idx: ReplicaIdx) -> Option<usize> {
        self.replicas.get(idx.index()).map(|r| r.region as usize)
    }

    /// The state of the path from region `from` to region `to` (dense indices) as
    /// traffic that is not replication sees it (clients of the simulator): whether a
    /// partition cuts it, the override's extra one-way latency, and its loss.
    /// `None` for an unknown index.
    pub fn path_state(&self, from: usize, to: usize) -> Option<PathState> {
        let nr = self.regions.len();
        if from >= nr || to >= nr {
            return None;
        }
        let rp = &self.region_pairs[from * nr + to];
        Some(PathState {
            cut: rp.cuts > 0,
            extra_latency_us: rp.extra_latency_us,
            loss: rp.loss,
        })
    }

    fn conn_index(&self, from: ReplicaIdx, to: ReplicaIdx) -> Option<usize> {
        let n = self.replicas.len();
        (from.index() < n && to.index() < n).then(|| from.index() * n + to.index())
    }

    /// Both replica indices must be valid.
    fn region_pair_index(&self, from: usize, to: usize) -> usize {
        self.replicas[from].region as usize * self.regions.len() + self.replicas[to].region as usize
    }

    fn region(&self, id: &RegionId) -> Result<usize, NetError> {
        self.region_index
            .get(id)
            .map(|&i| i as usize)
            .ok_or_else(|| NetError::UnknownRegion(id.to_string()))
    }

    // ---- Sending and delivering -----------------------------------------------

    /// Sends `msg`, weighing `bytes`, from `from` to `to` at time `now`. `now` should
    /// not go backwards between calls (it may: the FIFO rule still holds).
    pub fn send(
        &mut self,
        now: SimTime,
        from: &ReplicaId,
        to: &ReplicaId,
        msg: M,
        bytes: usize,
    ) -> SendOutcome {
        match (self.index.get(from), self.index.get(to)) {
            (Some(&f), Some(&t)) => self.send_idx(now, f, t, msg, bytes),
            _ => self.refuse(DropReason::UnknownReplica, bytes),
        }
    }

    /// [`Network::send`] by dense indices: the hot path.
    pub fn send_idx(
        &mut self,
        now: SimTime,
        from: ReplicaIdx,
        to: ReplicaIdx,
        msg: M,
        bytes: usize,
    ) -> SendOutcome {
        let Some(c) = self.conn_index(from, to) else {
            return self.refuse(DropReason::UnknownReplica, bytes);
        };
        let (f, t) = (from.index(), to.index());
        if self.replicas[f].down || self.replicas[t].down {
            return self.refuse(DropReason::ReplicaDown, bytes);
        }
        let rp_index = self.region_pair_index(f, t);
        let rp = &mut self.region_pairs[rp_index];
        if rp.cuts > 0 {
            return self.refuse(DropReason::Partitioned, bytes);
        }
        let conn = &mut self.conns[c];

        // 2. Serialization on the shared region-pair pipe.
        let departs_at = match rp.us_per_byte {
            None => now,
            Some(us_per_byte) => {
                let start = now.max(rp.link_free_at);
                // f64 → u64 saturates; a message would need 2^53 bytes to lose precision.
                let tx_us = (bytes as f64 * us_per_byte).ceil() as u64;
                rp.link_free_at = start + SimDuration::from_us(tx_us);
                rp.link_free_at
            }
        };

        // 3. Latency and jitter.
        let latency_us = conn.base_latency_us + rp.extra_latency_us;
        let jitter_us = if self.config.jitter_fraction > 0.0 && latency_us > 0 {
            let jitter_max_us = (latency_us as f64 * self.config.jitter_fraction) as u64;
            self.rng.next_u64_inclusive(jitter_max_us)
        } else {
            0
        };

        // 4. Loss: one retransmission timeout per lost transmission.
        let mut loss_delay_us = 0;
        if rp.loss > 0.0 {
            let mut lost = 0u32;
            while lost < self.config.retransmissions_max && self.rng.chance(rp.loss) {
                lost += 1;
            }
            if lost > 0 {
                let rtt_us = 2 * latency_us;
                let rto_us =
                    ((rtt_us as f64 * self.config.rto_rtt_factor) as u64).max(self.rto_min_us);
                loss_delay_us = rto_us.saturating_mul(u64::from(lost));
                self.retransmissions += u64::from(lost);
            }
        }

        // 5. Per-connection FIFO.
        let arrives_at = departs_at
            + SimDuration::from_us(
                latency_us
                    .saturating_add(jitter_us)
                    .saturating_add(loss_delay_us),
            );
        let deliver_at = arrives_at.max(conn.last_deliver_at);
        conn.last_deliver_at = deliver_at;
        conn.sent.add(bytes);
        self.sent.get_mut(conn.class).add(bytes);

        let seq = self.next_seq;
        self.next_seq += 1;
        if conn.in_flight.is_empty() {
            self.heads.push(Head {
                at: deliver_at,
                seq,
                // c < REPLICAS_MAX² fits in u32.
                conn: c as u32,
            });
            if self.elsewhere.get(t) == Some(&true) {
                self.outward.push(c as u32);
            }
        }
        conn.in_flight.push_back(InFlight {
            deliver_at,
            seq,
            sent_at: now,
            bytes,
            msg,
        });
        self.in_flight += 1;
        self.in_flight_max = self.in_flight_max.max(self.in_flight);
        SendOutcome::Scheduled { deliver_at }
    }

    fn refuse(&mut self, reason: DropReason, bytes: usize) -> SendOutcome {
        drops_mut(&mut self.dropped_at_send, reason).add(bytes);
        SendOutcome::Dropped { reason }
    }

    /// When the next message arrives, if any is in flight: the time to advance to.
    pub fn next_delivery(&self) -> Option<SimTime> {
        self.heads.peek().map(|h| h.at)
    }

    /// The next message due at or before `now`. Messages due at the same time come
    /// out in the order they were sent.
    pub fn pop_delivery(&mut self, now: SimTime) -> Option<Delivery<M>> {
        let mut head = self.heads.peek_mut()?;
        if head.at > now {
            return None;
        }
        let c = head.conn as usize;
        let conn = &mut self.conns[c];
        // A connection has a head exactly when its queue is non-empty (pushed on
        // the first message, removed with the last, dropped with the queue).
        let m = conn
            .in_flight
            .pop_front()
            .expect("a connection with a head has a message in flight");
        match conn.in_flight.front() {
            // Replacing the top in place costs one sift instead of a pop and a push.
            Some(next) => {
                *head = Head {
                    at: next.deliver_at,
                    seq: next.seq,
                    conn: head.conn,
                };
            }
            None => {
                PeekMut::pop(head);
            }
        }
        self.in_flight -= 1;
        self.delivered.add(m.bytes);
        let n = self.replicas.len();
        Some(Delivery {
            // Both < REPLICAS_MAX, so they fit in u32.
            from: ReplicaIdx((c / n) as u32),
            to: ReplicaIdx((c % n) as u32),
            msg: m.msg,
            bytes: m.bytes,
            sent_at: m.sent_at,
            deliver_at: m.deliver_at,
        })
    }

    /// Messages accepted and not yet delivered or dropped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    // ---- Shards -----------------------------------------------------------------

    /// Names the replicas that live in another shard: when a run is split into
    /// shards, each shard's network sends (its links, its pipes, its random draws)
    /// and the receiver's shard delivers, so what is sent to those replicas is
    /// taken out by [`Network::hand_out`]. Call before the first send.
    pub fn hand_to(&mut self, elsewhere: impl Fn(ReplicaIdx) -> bool) {
        debug_assert!(self.in_flight == 0, "hand_to after a send");
        self.elsewhere = self.replicas().map(|(i, _)| elsewhere(i)).collect();
    }

    /// Takes out every message in flight to a replica in another shard
    /// ([`Network::hand_to`]). Comes out in connection order, each connection's
    /// messages in delivery order; hand them over with [`Network::hand_in`].
    pub fn hand_out(&mut self) -> Vec<HandOff<M>> {
        let n = self.replicas.len();
        // A connection a fault emptied is listed again by its next message.
        self.outward.sort_unstable();
        self.outward.dedup();
        // Sized at once: grown message by message, its reallocations were most of
        // a barrier's cost.
        let total = (self.outward.iter())
            .map(|&c| self.conns[c as usize].in_flight.len())
            .sum();
        let mut out = Vec::with_capacity(total);
        for c in self.outward.drain(..) {
            let conn = &mut self.conns[c as usize];
            out.extend(conn.in_flight.drain(..).map(|m| HandOff {
                conn: c,
                to: ReplicaIdx(c % n as u32),
                m,
            }));
        }
        debug_assert!(
            self.conns.iter().enumerate().all(|(c, conn)| {
                conn.in_flight.is_empty() || self.elsewhere.get(c % n) != Some(&true)
            }),
            "a message to another shard was not listed for hand-out"
        );
        if !out.is_empty() {
            let conns = &self.conns;
            self.heads
                .retain(|h| !conns[h.conn as usize].in_flight.is_empty());
            self.in_flight -= out.len();
        }
        out
    }

    /// Takes over messages another shard's network sent ([`Network::hand_out`]),
    /// to deliver them at their times. A connection's messages must come in order.
    pub fn hand_in(&mut self, messages: Vec<HandOff<M>>) {
        for HandOff { conn, m, .. } in messages {
            let c = &mut self.conns[conn as usize];
            debug_assert!(
                c.in_flight
                    .back()
                    .is_none_or(|b| b.deliver_at <= m.deliver_at)
            );
            if c.in_flight.is_empty() {
                self.heads.push(Head {
                    at: m.deliver_at,
                    seq: m.seq,
                    conn,
                });
            }
            c.in_flight.push_back(m);
            self.in_flight += 1;
            self.in_flight_max = self.in_flight_max.max(self.in_flight);
        }
    }

    // ---- Faults ---------------------------------------------------------------

    /// Cuts traffic from every region of `regions_a` to every region of `regions_b`,
    /// and back unless `one_way`. Messages in flight on a cut path are dropped.
    /// Returns the id that [`Network::heal`] takes.
    pub fn partition(
        &mut self,
        regions_a: &[RegionId],
        regions_b: &[RegionId],
        one_way: bool,
    ) -> Result<PartitionId, NetError> {
        let a: BTreeSet<RegionId> = regions_a.iter().cloned().collect();
        let b: BTreeSet<RegionId> = regions_b.iter().cloned().collect();
        if let Some(both) = a.intersection(&b).next() {
            return Err(NetError::RegionOnBothSides(both.to_string()));
        }
        let nr = self.regions.len();
        let ia = a
            .iter()
            .map(|r| self.region(r))
            .collect::<Result<Vec<_>, _>>()?;
        let ib = b
            .iter()
            .map(|r| self.region(r))
            .collect::<Result<Vec<_>, _>>()?;
        let mut cuts = Vec::with_capacity(ia.len() * ib.len() * 2);
        for &x in &ia {
            for &y in &ib {
                cuts.push(x * nr + y);
                if !one_way {
                    cuts.push(y * nr + x);
                }
            }
        }
        for &p in &cuts {
            self.region_pairs[p].cuts += 1;
        }
        let id = PartitionId(self.next_partition);
        self.next_partition += 1;
        tracing::debug!(?id, regions_a = ?a, regions_b = ?b, one_way, "partition");
        self.partitions.insert(
            id,
            Partition {
                regions_a: a,
                regions_b: b,
                one_way,
                cuts,
            },
        );
        self.drop_cut_in_flight();
        Ok(id)
    }

    /// Cuts a region off from every other region, both ways (losing a region).
    pub fn isolate_region(&mut self, region: &RegionId) -> Result<PartitionId, NetError> {
        self.region(region)?;
        let others: Vec<RegionId> = self
            .regions
            .iter()
            .filter(|r| *r != region)
            .cloned()
            .collect();
        self.partition(std::slice::from_ref(region), &others, false)
    }

    /// Ends one partition; returns whether it was active.
    pub fn heal(&mut self, id: PartitionId) -> bool {
        let Some(p) = self.partitions.remove(&id) else {
            return false;
        };
        for &pair in &p.cuts {
            // Every cut was counted in when the partition started.
            self.region_pairs[pair].cuts -= 1;
        }
        tracing::debug!(?id, "heal");
        true
    }

    /// Ends every partition.
    pub fn heal_all(&mut self) {
        let ids: Vec<PartitionId> = self.partitions.keys().copied().collect();
        for id in ids {
            self.heal(id);
        }
    }

    /// The active partitions, oldest first.
    pub fn partitions(&self) -> impl Iterator<Item = (PartitionId, &Partition)> + '_ {
        self.partitions.iter().map(|(id, p)| (*id, p))
    }

    /// Whether messages from region `from` to region `to` are cut now.
    pub fn is_cut(&self, from: &RegionId, to: &RegionId) -> Result<bool, NetError> {
        let p = self.region(from)? * self.regions.len() + self.region(to)?;
        Ok(self.region_pairs[p].cuts > 0)
    }

    /// Drops in-flight messages whose path is now cut, and resets those paths'
    /// FIFO and serialization state (nothing is left queued on them).
    fn drop_cut_in_flight(&mut self) {
        let n = self.replicas.len();
        for f in 0..n {
            for t in 0..n {
                if self.region_pairs[self.region_pair_index(f, t)].cuts > 0 {
                    self.reset_conn(f * n + t, DropReason::Partitioned);
                }
            }
        }
        for rp in &mut self.region_pairs {
            if rp.cuts > 0 {
                rp.link_free_at = SimTime::ZERO;
            }
        }
        self.drop_stale_heads();
    }

    /// Drops everything in flight on a connection and clears its FIFO floor.
    /// The caller must then call [`Network::drop_stale_heads`].
    fn reset_conn(&mut self, c: usize, reason: DropReason) {
        let n = self.replicas.len();
        let conn = &mut self.conns[c];
        conn.last_deliver_at = SimTime::ZERO;
        let dropped = drops_mut(&mut self.dropped_in_flight, reason);
        for m in conn.in_flight.drain(..) {
            dropped.add(m.bytes);
            self.in_flight -= 1;
            self.dropped.push(Dropped {
                // Both < REPLICAS_MAX, so they fit in u32.
                from: ReplicaIdx((c / n) as u32),
                to: ReplicaIdx((c % n) as u32),
                bytes: m.bytes,
                reason,
            });
        }
    }

    /// The messages dropped in flight since the last call, in the order they were
    /// dropped (connection order, then send order).
    pub fn take_dropped(&mut self) -> Vec<Dropped> {
        std::mem::take(&mut self.dropped)
    }

    /// Removes the heads of emptied connections. Connections are only ever emptied
    /// whole, so the heads that remain still name their connection's front.
    fn drop_stale_heads(&mut self) {
        let conns = &self.conns;
        self.heads
            .retain(|h| !conns[h.conn as usize].in_flight.is_empty());
    }

    /// Takes a replica down (a crash) or brings it back. While down, everything to
    /// or from it is refused; going down drops the messages in flight to it (not
    /// those from it: they had left).
    pub fn set_down(&mut self, replica: &ReplicaId, down: bool) -> Result<(), NetError> {
        let idx = self
            .replica_idx(replica)
            .ok_or_else(|| NetError::UnknownReplica(replica.to_string()))?;
        self.set_down_idx(idx, down)
    }

    /// [`Network::set_down`] by index.
    pub fn set_down_idx(&mut self, replica: ReplicaIdx, down: bool) -> Result<(), NetError> {
        let r = replica.index();
        let info = self
            .replicas
            .get_mut(r)
            .ok_or_else(|| NetError::UnknownReplica(format!("#{r}")))?;
        let was_down = std::mem::replace(&mut info.down, down);
        tracing::debug!(replica = %info.id, down, "set_down");
        if down && !was_down {
            let n = self.replicas.len();
            for f in 0..n {
                self.reset_conn(f * n + r, DropReason::ReplicaDown);
            }
            self.drop_stale_heads();
        }
        Ok(())
    }

    pub fn is_down(&self, replica: ReplicaIdx) -> bool {
        self.replicas.get(replica.index()).is_some_and(|r| r.down)
    }

    /// Changes the link between two regions, both directions (`a` = `b` changes a
    /// region's traffic with itself). Replaces any earlier override of that pair.
    pub fn degrade_link(
        &mut self,
        region_a: &RegionId,
        region_b: &RegionId,
        link: LinkOverride,
    ) -> Result<(), NetError> {
        link.validate()?;
        self.set_override(region_a, region_b, Some(link))
    }

    /// Returns the link between two regions to what the topology file says.
    pub fn restore_link(
        &mut self,
        region_a: &RegionId,
        region_b: &RegionId,
    ) -> Result<(), NetError> {
        self.set_override(region_a, region_b, None)
    }

    /// Returns every link to what the topology file says.
    pub fn restore_all_links(&mut self) {
        for rp in &mut self.region_pairs {
            rp.link_override = None;
            rp.refresh();
        }
    }

    fn set_override(
        &mut self,
        region_a: &RegionId,
        region_b: &RegionId,
        link: Option<LinkOverride>,
    ) -> Result<(), NetError> {
        let (a, b) = (self.region(region_a)?, self.region(region_b)?);
        let nr = self.regions.len();
        tracing::debug!(%region_a, %region_b, ?link, "link override");
        for p in [a * nr + b, b * nr + a] {
            self.region_pairs[p].link_override = link;
            self.region_pairs[p].refresh();
        }
        Ok(())
    }

    // ---- Accounting -----------------------------------------------------------

    /// A snapshot of the counters.
    pub fn stats(&self) -> NetStats {
        let n = self.replicas.len();
        let pairs = self
            .conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.sent.messages > 0)
            .map(|(i, c)| PairTraffic {
                from: self.replicas[i / n].id.clone(),
                to: self.replicas[i % n].id.clone(),
                class: c.class,
                messages: c.sent.messages,
                bytes: c.sent.bytes,
            })
            .collect();
        NetStats {
            sent: self.sent,
            delivered: self.delivered,
            dropped_at_send: self.dropped_at_send,
            dropped_in_flight: self.dropped_in_flight,
            retransmissions: self.retransmissions,
            in_flight: self.in_flight,
            in_flight_max: self.in_flight_max,
            pairs,
        }
    }

    /// Traffic accepted on one connection.
    pub fn pair_traffic(&self, from: ReplicaIdx, to: ReplicaIdx) -> Option<Traffic> {
        self.conn_index(from, to).map(|c| self.conns[c].sent)
    }
}

fn drops_mut(drops: &mut Drops, reason: DropReason) -> &mut Traffic {
    match reason {
        DropReason::Partitioned => &mut drops.partitioned,
        DropReason::ReplicaDown => &mut drops.replica_down,
        DropReason::UnknownReplica => &mut drops.unknown_replica,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const TWO_REGIONS: &str = r#"
name = "two"
intra_region_rtt_ms = 1.0

[[continents]]
name = "x"
  [[continents.regions]]
  name = "r1"
    [[continents.regions.replicas]]
    id = "a1"
    role = "serving"
    [[continents.regions.replicas]]
    id = "a2"
    role = "serving"
  [[continents.regions]]
  name = "r2"
    [[continents.regions.replicas]]
    id = "b1"
    role = "serving"

[[links]]
a = "r1"
b = "r2"
rtt_ms = 20.0
"#;

    fn net() -> Network<u32> {
        let topo = Topology::parse(Path::new("two.toml"), TWO_REGIONS).unwrap();
        Network::new(&topo, NetConfig::without_jitter(), 1).unwrap()
    }

    #[test]
    fn interning_follows_id_order() {
        let n = net();
        let ids: Vec<&str> = n.replicas().map(|(_, id)| id.as_str()).collect();
        assert_eq!(ids, ["a1", "a2", "b1"]);
        let b1 = n.replica_idx(&"b1".into()).unwrap();
        assert_eq!(b1.index(), 2);
        assert_eq!(n.region_of(b1).unwrap().as_str(), "r2");
        let a1 = n.replica_idx(&"a1".into()).unwrap();
        assert_eq!(n.link_class(a1, b1), Some(LinkClass::InterRegion));
        assert_eq!(n.one_way_latency(a1, b1), Some(SimDuration::from_ms(10)));
        assert_eq!(n.one_way_latency(a1, a1), Some(SimDuration::ZERO));
    }

    #[test]
    fn dropping_in_flight_resets_the_fifo_floor() {
        let mut n = net();
        let (a1, b1) = (
            n.replica_idx(&"a1".into()).unwrap(),
            n.replica_idx(&"b1".into()).unwrap(),
        );
        let r2: RegionId = "r2".into();
        n.degrade_link(
            &"r1".into(),
            &r2,
            LinkOverride {
                extra_latency_ms: 990.0,
                ..LinkOverride::default()
            },
        )
        .unwrap();
        assert_eq!(
            n.send_idx(SimTime::ZERO, a1, b1, 1, 10),
            SendOutcome::Scheduled {
                deliver_at: SimTime::from_ms(1000)
            }
        );
        n.restore_link(&"r1".into(), &r2).unwrap();
        n.set_down_idx(b1, true).unwrap();
        n.set_down_idx(b1, false).unwrap();
        // The slow message died with the connection; the next one is not held back.
        assert_eq!(
            n.send_idx(SimTime::from_ms(1), a1, b1, 2, 10),
            SendOutcome::Scheduled {
                deliver_at: SimTime::from_ms(11)
            }
        );
    }

    #[test]
    fn unknown_indices_are_refused() {
        let mut n = net();
        let bad = ReplicaIdx(99);
        let a1 = n.replica_idx(&"a1".into()).unwrap();
        assert_eq!(
            n.send_idx(SimTime::ZERO, a1, bad, 0, 1),
            SendOutcome::Dropped {
                reason: DropReason::UnknownReplica
            }
        );
        assert!(n.set_down_idx(bad, true).is_err());
        assert_eq!(n.one_way_latency(bad, a1), None);
        assert_eq!(n.stats().dropped_at_send.unknown_replica.messages, 1);
    }
}
