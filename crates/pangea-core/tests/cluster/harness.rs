//! An in-memory cluster in the style of quinn-proto's `Pair`: N replicas of the real
//! state machine, per-link delays, virtual time that jumps to the next event, no
//! sockets and no sleeps. Faults: dropped and duplicated frames, partitions that heal,
//! crashes (unsynced writes lost) and restarts from the store, and tree changes
//! mid-stream (replicas handed different views of the topology).
//!
//! Checkers (docs/invariants.md):
//! - C1 no acknowledged write lost (and no sequence ever reused for another write);
//! - C2 watermark soundness: a watermark never covers an entry not applied;
//! - C3 watermarks monotonic, across restarts too;
//! - C4 no watermark-checked read served below its token;
//! - C5 identical content digests per scope once healed and quiet, equal to the
//!   digest of every durable write applied to empty rows (an oracle);
//! - C6 the same seed gives the same trace hash;
//! - C8 every counter equals the increments acknowledged to it, at every replica.

use bytes::Bytes;
use pangea_core::digest::ContentDigest;
use pangea_core::frame::Frame;
use pangea_core::read::{Consistency, Decision, decide};
use pangea_core::replica::{Config, Event, Now, Replica};
use pangea_core::storage::{LogEntry, Storage};
use pangea_core::{
    Limits, MemStorage, Mutation, ReadFilter, RowMutation, RowState, ScopeId, TimeRange, Timestamp,
    Token, Version,
};
use pangea_topology::{Deployment, ReplicaId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// The harness's only randomness: the project's generator
/// (`pangea_core::rng::Rng`), with the draws the harness names. `below` and
/// `chance` map its output as the harness always has (a modulo; `<=`), so the
/// seeds pinned in `main.rs` for the bugs they found still replay those runs.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pangea_core::rng::Rng);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(pangea_core::rng::Rng::new(seed ^ 0x5851_f42d_4c95_7f2d))
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// In `[0, n)` (0 when `n` is 0); the modulo's bias is below 2^-50 here.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub(crate) fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// What one seed draws: topology size, fault rates, workload.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) seed: u64,
    pub(crate) regions: usize,
    pub(crate) replicas_per_region_max: usize,
    pub(crate) relays: bool,
    pub(crate) restricted: bool,
    pub(crate) writes: usize,
    pub(crate) drop_p: f64,
    pub(crate) dup_p: f64,
    pub(crate) partitions: bool,
    pub(crate) crashes: bool,
    pub(crate) view_changes: bool,
    pub(crate) safety_ms: u64,
    pub(crate) config: Config,
    /// The deployment's shard groups: every policy replicates as this many
    /// scopes (docs/sharding.md).
    pub(crate) shard_groups: u32,
    /// Most processes a replica runs, each hosting a range of the groups
    /// (`generate::Shape::processes_max`).
    pub(crate) processes_max: u32,
}

impl Scenario {
    /// Each seed draws its own fault rates (as TigerBeetle's VOPR does).
    pub(crate) fn random(seed: u64) -> Scenario {
        let mut r = Rng::new(seed);
        // Smaller logs than production so that snapshots happen in short runs.
        let config = Config {
            // Half the seeds keep almost no log, so that laggards need snapshots.
            log_entries_retained_max: if r.chance(0.5) {
                1 + r.below(6)
            } else {
                50 + r.below(200)
            },
            gap_entries_max: 16 + r.below(64) as usize,
            batch_bytes_max: 512 + r.below(8 << 10) as usize,
            ..Config::default()
        };
        Scenario {
            seed,
            regions: 2 + r.below(7) as usize,
            replicas_per_region_max: 1 + r.below(4) as usize,
            relays: r.chance(0.5),
            restricted: r.chance(0.6),
            writes: 20 + r.below(120) as usize,
            drop_p: if r.chance(0.5) {
                r.below(15) as f64 / 100.0
            } else {
                0.0
            },
            dup_p: if r.chance(0.3) {
                r.below(10) as f64 / 100.0
            } else {
                0.0
            },
            partitions: r.chance(0.4),
            crashes: r.chance(0.5),
            view_changes: r.chance(0.4),
            safety_ms: 1_500 + r.below(2_000),
            config: Config {
                // Half the seeds ship snapshots in chunks smaller than many rows,
                // which then travel in parts (`RowState::split`). Drawn last, so
                // the draws above are those of the seeds before it.
                snapshot_chunk_bytes_max: if r.chance(0.5) {
                    64 + r.below(192) as usize
                } else {
                    config.snapshot_chunk_bytes_max
                },
                ..config
            },
            shard_groups: 1,
            processes_max: 1,
        }
    }

    /// [`Scenario::random`] with rows spread over 2, 4 or 8 shard groups, and on
    /// odd seeds replicas of up to 4 processes each hosting part of them (by
    /// seed, drawing nothing: the rest of the seed's scenario is the same).
    pub(crate) fn random_sharded(seed: u64) -> Scenario {
        let shard_groups = 2 << (seed % 3);
        Scenario {
            shard_groups,
            processes_max: if seed % 2 == 1 {
                shard_groups.min(4)
            } else {
                1
            },
            ..Scenario::random(seed)
        }
    }
}

/// The seed's deployment, from the generator the swarm shares
/// (`pangea_topology::generate`).
pub(crate) fn deployment(s: &Scenario, rtt_scale: Option<&mut Rng>) -> Deployment {
    let mut r = Rng::new(s.seed.wrapping_mul(31) ^ 0xabcdef);
    let shape = pangea_topology::generate::Shape {
        name: "sim",
        regions: s.regions,
        replicas_per_region_max: s.replicas_per_region_max,
        relays: s.relays,
        restricted: s.restricted && s.regions >= 2,
        shard_groups: s.shard_groups,
        processes_max: s.processes_max,
    };
    match rtt_scale {
        Some(sr) => pangea_topology::generate::random_deployment(
            &shape,
            &mut |n| r.below(n),
            Some(&mut |n| sr.below(n)),
        ),
        None => pangea_topology::generate::random_deployment(&shape, &mut |n| r.below(n), None),
    }
}

#[derive(Debug)]
struct Delivery {
    from: ReplicaId,
    to: ReplicaId,
    frame: Frame,
    bytes: usize,
}

struct Node {
    replica: Option<Replica<MemStorage>>,
    /// The store while the replica is down.
    parked: Option<MemStorage>,
    restart_at_us: Option<u64>,
    /// Wall-clock skew of this replica, in ms (static).
    skew_ms: i64,
}

/// Checker state.
#[derive(Default)]
struct Checks {
    /// (replica, scope, origin) -> highest sequence applied, from `Applied` events.
    applied: BTreeMap<(ReplicaId, ScopeId, ReplicaId), u64>,
    /// (replica, scope, origin) -> highest watermark advertised.
    advertised: BTreeMap<(ReplicaId, ScopeId, ReplicaId), (u64, Timestamp)>,
    /// Every durable write: (scope, origin, seq) -> entry.
    writes: BTreeMap<(ScopeId, ReplicaId, u64), LogEntry>,
    /// Proposed, not yet known durable.
    proposed: BTreeMap<(ScopeId, ReplicaId, u64), LogEntry>,
    acked: Vec<Token>,
    violations: Vec<String>,
    watermark_reads: u64,
    watermark_reads_served: u64,
}

pub(crate) struct Report {
    pub(crate) trace_hash: u64,
    pub(crate) violations: Vec<String>,
    pub(crate) acked: usize,
    pub(crate) replicas: usize,
    pub(crate) converged_at_ms: Option<u64>,
    pub(crate) watermark_reads_served: u64,
    pub(crate) snapshots: u64,
    pub(crate) rows_split: u64,
    pub(crate) gap_requests: u64,
}

pub(crate) struct Cluster {
    s: Scenario,
    rng: Rng,
    deployment: Arc<Deployment>,
    nodes: BTreeMap<ReplicaId, Node>,
    now_us: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    in_flight: BTreeMap<u64, Delivery>,
    /// Per-connection FIFO: the last delivery time on (from, to).
    conn_last_us: BTreeMap<(ReplicaId, ReplicaId), u64>,
    /// Pairs of regions cut off from each other.
    partition: Option<BTreeSet<String>>,
    checks: Checks,
    trace: Xxh3,
    base_wall_ms: u64,
}

const DAY_MS: u64 = 1_700_000_000_000;

impl Cluster {
    pub(crate) fn new(s: Scenario) -> Cluster {
        let deployment = Arc::new(deployment(&s, None));
        let mut rng = Rng::new(s.seed);
        let mut nodes = BTreeMap::new();
        let ids: Vec<ReplicaId> = deployment.topology.replicas.keys().cloned().collect();
        for (i, id) in ids.iter().enumerate() {
            let skew_ms = rng.below(200) as i64 - 100;
            let now = Now {
                mono_us: 0,
                wall_ms: (DAY_MS as i64 + skew_ms) as u64,
            };
            let replica = Replica::new(
                id.clone(),
                deployment.clone(),
                s.config.clone(),
                MemStorage::new(),
                s.seed + i as u64,
                now,
            )
            .expect("replica starts");
            nodes.insert(
                id.clone(),
                Node {
                    replica: Some(replica),
                    parked: None,
                    restart_at_us: None,
                    skew_ms,
                },
            );
        }
        Cluster {
            rng,
            deployment,
            nodes,
            now_us: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            in_flight: BTreeMap::new(),
            conn_last_us: BTreeMap::new(),
            partition: None,
            checks: Checks::default(),
            trace: Xxh3::new(),
            base_wall_ms: DAY_MS,
            s,
        }
    }

    fn now_for(&self, skew_ms: i64) -> Now {
        Now {
            mono_us: self.now_us,
            wall_ms: (self.base_wall_ms as i64 + (self.now_us / 1_000) as i64 + skew_ms) as u64,
        }
    }

    fn region(&self, id: &ReplicaId) -> String {
        self.deployment.topology.replicas[id].region.to_string()
    }

    fn cut(&self, a: &ReplicaId, b: &ReplicaId) -> bool {
        match &self.partition {
            Some(side) => side.contains(&self.region(a)) != side.contains(&self.region(b)),
            None => false,
        }
    }

    fn trace(&mut self, what: &str) {
        self.trace.update(&self.now_us.to_le_bytes());
        self.trace.update(what.as_bytes());
    }

    /// After any input to `id`: flush, then collect its transmits and events.
    fn settle(&mut self, id: &ReplicaId) {
        let Some(node) = self.nodes.get(id) else {
            return;
        };
        let now = self.now_for(node.skew_ms);
        let mut transmits = Vec::new();
        let mut events = Vec::new();
        {
            let node = self.nodes.get_mut(id).expect("exists");
            let Some(r) = node.replica.as_mut() else {
                return;
            };
            r.flush(now).expect("memory storage does not fail");
            while let Some(t) = r.poll_transmit() {
                transmits.push(t);
            }
            while let Some(e) = r.poll_event() {
                events.push(e);
            }
        }
        for e in events {
            self.check_event(id, &e);
            self.trace(&format!("{id} {e:?}"));
        }
        for t in transmits {
            self.trace(&format!("{id}->{} {} {}", t.to, t.frame.kind(), t.bytes));
            self.note_wire(&t.frame);
            let to = t.to.clone();
            let drop = self.cut(id, &to)
                || self.rng.chance(self.s.drop_p)
                || self.nodes.get(&to).is_none_or(|n| n.replica.is_none());
            let copies = if drop {
                0
            } else if self.rng.chance(self.s.dup_p) {
                2
            } else {
                1
            };
            if copies == 0 {
                if let Some(r) = self.nodes.get_mut(id).and_then(|n| n.replica.as_mut()) {
                    r.handle_sent(&to, t.bytes);
                }
                continue;
            }
            let one_way_us =
                (self.deployment.topology.rtt_ms(id, &to).unwrap_or(100.0) * 500.0) as u64;
            for _ in 0..copies {
                let jitter = self.rng.below(one_way_us / 10 + 50);
                let last = self
                    .conn_last_us
                    .get(&(id.clone(), to.clone()))
                    .copied()
                    .unwrap_or(0);
                let at = (self.now_us + one_way_us + jitter).max(last);
                self.conn_last_us.insert((id.clone(), to.clone()), at);
                self.seq += 1;
                self.queue.push(Reverse((at, self.seq)));
                self.in_flight.insert(
                    self.seq,
                    Delivery {
                        from: id.clone(),
                        to: to.clone(),
                        frame: t.frame.clone(),
                        bytes: t.bytes,
                    },
                );
            }
        }
    }

    /// Entries on the wire are durable at their origin: they join the oracle.
    fn note_wire(&mut self, f: &Frame) {
        let entries: &[LogEntry] = match f {
            Frame::Mutations(es) => es,
            Frame::GapFill(g) => &g.entries,
            _ => return,
        };
        for e in entries {
            let key = (e.scope.clone(), e.origin.clone(), e.sequence);
            match self.checks.writes.get(&key) {
                Some(w) if w != e => self
                    .checks
                    .violations
                    .push(format!("C1: sequence {key:?} carries two different writes")),
                Some(_) => {}
                None => {
                    self.checks.writes.insert(key, e.clone());
                }
            }
        }
    }

    fn check_event(&mut self, id: &ReplicaId, e: &Event) {
        match e {
            Event::Applied {
                scope,
                origin,
                sequence,
                ..
            } => {
                let k = (id.clone(), scope.clone(), origin.clone());
                let prev = self.checks.applied.get(&k).copied().unwrap_or(0);
                if *sequence != prev + 1 && *sequence > prev {
                    self.checks.violations.push(format!(
                        "C2: {id} applied {scope}/{origin} #{sequence} after #{prev}"
                    ));
                }
                self.checks.applied.insert(k, prev.max(*sequence));
            }
            Event::WatermarkAdvanced {
                scope,
                origin,
                watermark,
            } => {
                let k = (id.clone(), scope.clone(), origin.clone());
                let applied = self.checks.applied.get(&k).copied().unwrap_or(0);
                if watermark.sequence > applied {
                    self.checks.violations.push(format!(
                        "C2: {id} advertises {scope}/{origin} #{} but applied only #{applied}",
                        watermark.sequence
                    ));
                }
                let prev = self
                    .checks
                    .advertised
                    .get(&k)
                    .copied()
                    .unwrap_or((0, Timestamp::ZERO));
                if (watermark.sequence, watermark.timestamp) < prev {
                    self.checks.violations.push(format!("C3: {id} watermark {scope}/{origin} went back from {prev:?} to {watermark:?}"));
                }
                self.checks
                    .advertised
                    .insert(k, prev.max((watermark.sequence, watermark.timestamp)));
            }
            Event::Committed(token) => {
                let key = (token.scope.clone(), token.origin.clone(), token.sequence);
                if let Some(entry) = self.checks.proposed.remove(&key) {
                    match self.checks.writes.get(&key) {
                        Some(w) if *w != entry => {
                            self.checks
                                .violations
                                .push(format!("C1: sequence {key:?} reused for another write"));
                        }
                        _ => {
                            self.checks.writes.insert(key, entry);
                        }
                    }
                }
                self.checks.acked.push(token.clone());
            }
            Event::SnapshotInstalled { scope, .. } => {
                // The snapshot's rows include everything up to its watermarks.
                if let Some(wm) = self.nodes[id]
                    .replica
                    .as_ref()
                    .and_then(|r| r.watermarks(scope))
                {
                    let _ = wm;
                }
                self.snapshot_installed(id, scope);
            }
            _ => {}
        }
    }

    fn snapshot_installed(&mut self, id: &ReplicaId, scope: &ScopeId) {
        // Applied state jumps to the snapshot's watermarks; read them from the
        // replica's streams via its next flush (durable = applied then).
        if let Some(r) = self.nodes.get(id).and_then(|n| n.replica.as_ref()) {
            let wms = r.storage().watermarks().expect("memory storage");
            for (s, o, w) in wms {
                if &s == scope {
                    let k = (id.clone(), s, o);
                    let e = self.checks.applied.entry(k).or_insert(0);
                    *e = (*e).max(w.sequence);
                }
            }
        }
    }

    fn random_write(&mut self) {
        let writers: Vec<ReplicaId> = self
            .nodes
            .iter()
            .filter(|(id, n)| {
                n.replica.is_some() && self.deployment.topology.replicas[*id].role.stores_rows()
            })
            .map(|(id, _)| id.clone())
            .collect();
        if writers.is_empty() {
            return;
        }
        let id = self.rng.pick(&writers).clone();
        let restricted = self
            .deployment
            .placement
            .policy(&ScopeId::new("restricted"))
            .is_some();
        // A quarter of the writes count: +1 to a counter of rows that only
        // ever count (C8 compares them with the increments acknowledged).
        if self.rng.chance(0.25) {
            let key = if restricted && self.rng.chance(0.4) {
                format!("r/n{}", self.rng.below(3))
            } else {
                format!("n{}", self.rng.below(3))
            };
            let m = Mutation::Increment {
                family: "n".into(),
                column: Bytes::from(format!("c{}", self.rng.below(2))),
                delta: 1,
            };
            return self.propose_at(id, key, m);
        }
        let key = if restricted && self.rng.chance(0.4) {
            format!("r/{}", self.rng.below(12))
        } else {
            format!("k{}", self.rng.below(24))
        };
        let scope = self.deployment.scope_of("t", key.as_bytes()).clone();
        if !self.deployment.allowed(&id, &scope) {
            return;
        }
        let family = ["f", "g", "h"][self.rng.below(3) as usize];
        let column = Bytes::from(format!("c{}", self.rng.below(3)));
        let m = match self.rng.below(10) {
            0 => Mutation::DeleteFromRow,
            1 => Mutation::DeleteFromFamily {
                family: family.into(),
            },
            2 => {
                let start = Timestamp::new(
                    self.base_wall_ms + self.rng.below(self.now_us / 1_000 + 1),
                    0,
                );
                Mutation::DeleteFromColumn {
                    family: family.into(),
                    column,
                    range: TimeRange { start, end: None },
                }
            }
            _ => Mutation::SetCell {
                family: family.into(),
                column,
                value: Bytes::from(vec![
                    self.rng.below(255) as u8;
                    1 + self.rng.below(40) as usize
                ]),
            },
        };
        self.propose_at(id, key, m);
    }

    /// Proposes `m` to row `key` of table "t" at replica `id` (one that may hold
    /// the row), noting it for the checkers.
    fn propose_at(&mut self, id: ReplicaId, key: String, m: Mutation) {
        let scope = self.deployment.scope_of("t", key.as_bytes()).clone();
        if !self.deployment.allowed(&id, &scope) {
            return;
        }
        let mutation = RowMutation::new("t", key, vec![m], &Limits::default()).expect("valid");
        let node = &self.nodes[&id];
        let now = self.now_for(node.skew_ms);
        let r = self
            .nodes
            .get_mut(&id)
            .and_then(|n| n.replica.as_mut())
            .expect("up");
        match r.propose(now, mutation.clone()) {
            Ok(token) => {
                let entry = LogEntry {
                    scope: token.scope.clone(),
                    origin: token.origin.clone(),
                    sequence: token.sequence,
                    timestamp: token.timestamp,
                    mutation,
                };
                self.checks.proposed.insert(
                    (token.scope.clone(), token.origin.clone(), token.sequence),
                    entry,
                );
                self.trace(&format!("propose {id} {token:?}"));
            }
            Err(e) => self
                .checks
                .violations
                .push(format!("propose at {id} failed: {e}")),
        }
        self.settle(&id);
    }

    /// C4: a watermark read of an acknowledged token at a random replica.
    fn random_watermark_read(&mut self) {
        if self.checks.acked.is_empty() {
            return;
        }
        let token = self.rng.pick(&self.checks.acked).clone();
        let members: Vec<ReplicaId> = self
            .deployment
            .scope_members(&token.scope)
            .into_iter()
            .filter(|m| self.nodes[m].replica.is_some())
            .collect();
        if members.is_empty() {
            return;
        }
        let id = self.rng.pick(&members).clone();
        let node = &self.nodes[&id];
        let now = self.now_for(node.skew_ms);
        let Some(r) = node.replica.as_ref() else {
            return;
        };
        let Some(wm) = r.watermarks(&token.scope) else {
            return;
        };
        self.checks.watermark_reads += 1;
        if decide(&Consistency::Watermark(token.clone()), &wm, now.wall_ms) == Decision::Serve {
            self.checks.watermark_reads_served += 1;
            let applied = self
                .checks
                .applied
                .get(&(id.clone(), token.scope.clone(), token.origin.clone()))
                .copied()
                .unwrap_or(0);
            if applied < token.sequence {
                self.checks.violations.push(format!(
                    "C4: {id} served a read of {token:?} having applied only #{applied}"
                ));
            }
        }
    }

    fn crash(&mut self, id: &ReplicaId, down_ms: u64) {
        let now_us = self.now_us;
        let Some(node) = self.nodes.get_mut(id) else {
            return;
        };
        let Some(r) = node.replica.take() else { return };
        let mut storage = r.into_storage();
        storage.crash();
        node.parked = Some(storage);
        node.restart_at_us = Some(now_us + down_ms * 1_000);
        // Applied-but-lost entries are gone: the tracker restarts from what survived.
        self.trace(&format!("crash {id}"));
    }

    fn restart(&mut self, id: &ReplicaId) {
        let skew = self.nodes[id].skew_ms;
        let now = self.now_for(skew);
        let deployment = self.deployment.clone();
        let config = self.s.config.clone();
        let seed = self.rng.next();
        let node = self.nodes.get_mut(id).expect("exists");
        let storage = node.parked.take().expect("parked while down");
        node.restart_at_us = None;
        let r = Replica::new(id.clone(), deployment, config, storage, seed, now).expect("restart");
        // C3 across restarts: what survived must cover what was advertised.
        let wms = r.storage().watermarks().expect("memory");
        let mut restored: BTreeMap<(ScopeId, ReplicaId), u64> = BTreeMap::new();
        for (s, o, w) in wms {
            restored.insert((s.clone(), o.clone()), w.sequence);
        }
        for ((rid, s, o), (seq, _)) in &self.checks.advertised {
            if rid == id && restored.get(&(s.clone(), o.clone())).copied().unwrap_or(0) < *seq {
                self.checks.violations.push(format!(
                    "C3: {id} restarted with {s}/{o} below advertised #{seq}"
                ));
            }
        }
        for ((rid, s, o), applied) in self.checks.applied.iter_mut() {
            if rid == id {
                *applied = restored.get(&(s.clone(), o.clone())).copied().unwrap_or(0);
            }
        }
        node.replica = Some(r);
        self.trace(&format!("restart {id}"));
    }

    fn next_timer(&self) -> Option<u64> {
        self.nodes
            .values()
            .filter_map(|n| n.replica.as_ref().and_then(|r| r.poll_timeout()))
            .min()
    }

    /// Advances virtual time to `until_us`, processing deliveries and timers.
    fn run_until(&mut self, until_us: u64) {
        loop {
            let next_delivery = self.queue.peek().map(|Reverse((t, _))| *t);
            let next_restart = self.nodes.values().filter_map(|n| n.restart_at_us).min();
            let next = [next_delivery, self.next_timer(), next_restart]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next.filter(|t| *t <= until_us) else {
                self.now_us = until_us;
                return;
            };
            self.now_us = self.now_us.max(next);
            if next_restart == Some(next) {
                let id = self
                    .nodes
                    .iter()
                    .find(|(_, n)| n.restart_at_us == Some(next))
                    .map(|(id, _)| id.clone())
                    .expect("found");
                self.restart(&id);
                self.settle(&id);
                continue;
            }
            if next_delivery == Some(next) {
                let Reverse((_, seq)) = self.queue.pop().expect("peeked");
                let d = self.in_flight.remove(&seq).expect("scheduled");
                if let Some(r) = self.nodes.get_mut(&d.from).and_then(|n| n.replica.as_mut()) {
                    r.handle_sent(&d.to, d.bytes);
                }
                if self.cut(&d.from, &d.to) {
                    continue;
                }
                let skew = self.nodes[&d.to].skew_ms;
                let now = self.now_for(skew);
                if let Some(r) = self.nodes.get_mut(&d.to).and_then(|n| n.replica.as_mut()) {
                    // A frame that fails to apply is a bug in the core, not a peer fault.
                    r.handle_frame(now, &d.from, d.frame)
                        .expect("memory storage does not fail");
                    self.settle(&d.to);
                }
                continue;
            }
            // Timers.
            let due: Vec<ReplicaId> = self
                .nodes
                .iter()
                .filter(|(_, n)| {
                    n.replica
                        .as_ref()
                        .and_then(|r| r.poll_timeout())
                        .is_some_and(|t| t <= next)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in due {
                let skew = self.nodes[&id].skew_ms;
                let now = self.now_for(skew);
                if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.replica.as_mut()) {
                    r.handle_timeout(now).expect("memory storage does not fail");
                }
                self.settle(&id);
            }
        }
    }

    /// Whether every live replica agrees: equal durable watermarks per scope and equal
    /// content digests, equal to the oracle's.
    fn converged(&mut self) -> Result<(), String> {
        let now_wall = self.base_wall_ms + self.now_us / 1_000;
        let d = self.deployment.clone();
        let schema = &d.placement.schema;
        for scope in d.scopes() {
            // The oracle: every durable write of the scope applied to empty rows.
            let mut rows: BTreeMap<(String, Bytes), RowState> = BTreeMap::new();
            let mut expected_wm: BTreeMap<ReplicaId, u64> = BTreeMap::new();
            for ((s, o, seq), e) in &self.checks.writes {
                if s != scope {
                    continue;
                }
                let w = expected_wm.entry(o.clone()).or_default();
                *w = (*w).max(*seq);
                let row = rows
                    .entry((e.mutation.table().to_string(), e.mutation.row_key().clone()))
                    .or_default();
                row.apply(
                    &e.mutation
                        .cell_version(&Version::new(e.timestamp, e.origin.clone())),
                    e.mutation.mutations(),
                    schema.table(e.mutation.table()),
                );
            }
            let mut oracle = ContentDigest::new();
            for ((table, key), row) in &rows {
                oracle.add(schema, table, key, row, now_wall);
            }
            for id in d.scope_members(scope) {
                if !d.topology.replicas[&id].role.stores_rows() {
                    continue;
                }
                let Some(r) = self.nodes[&id].replica.as_ref() else {
                    return Err(format!("{id} is down"));
                };
                let wm = r
                    .watermarks(scope)
                    .ok_or_else(|| format!("{id} lacks scope {scope}"))?;
                for (o, seq) in &expected_wm {
                    if wm.get(o).sequence < *seq {
                        let mut origin_state = String::new();
                        for (nid, n) in &self.nodes {
                            if let Some(nr) = &n.replica {
                                let t = nr
                                    .tree(scope)
                                    .map(|t| t.neighbours(nid).to_vec())
                                    .unwrap_or_default();
                                let sus: Vec<_> = nr.suspected().collect();
                                let edges: Vec<String> = nr
                                    .tree(scope)
                                    .map(|t| {
                                        t.edges.iter().map(|e| format!("{}-{}", e.a, e.b)).collect()
                                    })
                                    .unwrap_or_default();
                                origin_state += &format!(
                                    "  view of {nid}: neighbours {t:?} suspected {sus:?} edges {edges:?}\n"
                                );
                            }
                        }
                        return Err(format!(
                            "{id} has {scope}/{o} at #{} < #{seq}\n{}{origin_state}",
                            wm.get(o).sequence,
                            r.debug_state()
                        ));
                    }
                }
                let mut digest = ContentDigest::new();
                for (table, key, row) in r.storage().rows() {
                    if d.scope_of(table, key) == scope {
                        digest.add(schema, table, key, row, now_wall);
                    }
                }
                if digest.finish() != oracle.finish() {
                    let mut diff = Vec::new();
                    let mine: BTreeMap<(String, Bytes), &RowState> = r
                        .storage()
                        .rows()
                        .filter(|(t, k, _)| d.scope_of(t, k) == scope)
                        .map(|(t, k, row)| ((t.to_string(), k.clone()), row))
                        .collect();
                    for (k, row) in &rows {
                        let theirs = row.visible_digest(&k.1, schema.table(&k.0), now_wall);
                        let ours = mine
                            .get(k)
                            .and_then(|m| m.visible_digest(&k.1, schema.table(&k.0), now_wall));
                        if theirs != ours {
                            diff.push(format!(
                                "{:?}: replica {:?}\n      oracle {:?}",
                                k.1,
                                mine.get(k),
                                row
                            ));
                        }
                    }
                    return Err(format!(
                        "{id}: digest of {scope} differs from the oracle ({} vs {} rows): {}\n{}",
                        digest.rows(),
                        oracle.rows(),
                        diff.join("\n    "),
                        r.debug_state()
                    ));
                }
            }
        }
        Ok(())
    }

    /// C8: once converged, every counter reads, at every replica that holds its
    /// row, exactly the number of increments (+1 each) acknowledged to it —
    /// whatever drops, repeats, partitions, crashes, snapshots and folds did.
    fn check_counters(&mut self) {
        let mut expected: BTreeMap<(Bytes, Bytes), i64> = BTreeMap::new();
        for e in self.checks.writes.values() {
            for m in e.mutation.mutations() {
                if let Mutation::Increment { column, delta, .. } = m {
                    *expected
                        .entry((e.mutation.row_key().clone(), column.clone()))
                        .or_default() += delta;
                }
            }
        }
        let now_wall = self.base_wall_ms + self.now_us / 1_000;
        let d = self.deployment.clone();
        let table = d.placement.schema.table("t");
        let filter = ReadFilter {
            families: vec!["n".into()],
            ..ReadFilter::default()
        };
        for ((key, column), want) in &expected {
            let scope = d.scope_of("t", key);
            for id in d.scope_members(scope) {
                if !d.topology.replicas[&id].role.stores_rows() {
                    continue;
                }
                let Some(r) = self.nodes[&id].replica.as_ref() else {
                    continue;
                };
                let row = r.storage().get_row("t", key).ok().flatten();
                let got = row
                    .and_then(|row| row.read(key, &filter, table, now_wall))
                    .and_then(|row| {
                        row.families
                            .into_iter()
                            .flat_map(|f| f.cells)
                            .find(|c| c.column == *column)
                    })
                    .map_or(0, |c| pangea_core::row::count_of(&c.value));
                if got != *want {
                    self.checks.violations.push(format!(
                        "C8: {id} counts {got} on {key:?}/{column:?}, {want} increments acknowledged"
                    ));
                }
            }
        }
    }

    /// One full run: a safety phase with faults and writes, then a liveness phase with
    /// everything healed, until convergence or a deadline.
    pub(crate) fn run(mut self) -> Report {
        let ids: Vec<ReplicaId> = self.nodes.keys().cloned().collect();
        let safety_us = self.s.safety_ms * 1_000;
        let step_us = safety_us / (self.s.writes as u64 + 1);
        let mut next_fault_us = 200_000;
        let alt = Arc::new(deployment(&self.s, Some(&mut Rng::new(self.s.seed ^ 77))));
        for _ in 0..self.s.writes {
            let t = self.now_us + step_us;
            self.run_until(t);
            self.random_write();
            if self.rng.chance(0.5) {
                self.random_watermark_read();
            }
            if self.now_us >= next_fault_us {
                next_fault_us = self.now_us + 150_000 + self.rng.below(400_000);
                match self.rng.below(4) {
                    0 if self.s.crashes => {
                        let id = self.rng.pick(&ids).clone();
                        let down_ms = 50 + self.rng.below(1_500);
                        self.crash(&id, down_ms);
                    }
                    1 if self.s.partitions => {
                        if self.partition.is_some() {
                            self.partition = None;
                            self.trace("heal");
                        } else {
                            let regions: Vec<String> = self
                                .deployment
                                .topology
                                .regions
                                .keys()
                                .map(|r| r.to_string())
                                .collect();
                            let side: BTreeSet<String> = regions
                                .iter()
                                .filter(|_| self.rng.chance(0.5))
                                .cloned()
                                .collect();
                            self.trace(&format!("partition {side:?}"));
                            self.partition = Some(side);
                        }
                    }
                    2 if self.s.view_changes => {
                        // A different tree for some replicas only: views disagree.
                        let id = self.rng.pick(&ids).clone();
                        let skew = self.nodes[&id].skew_ms;
                        let now = self.now_for(skew);
                        if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.replica.as_mut()) {
                            r.handle_view(now, alt.clone());
                        }
                        self.settle(&id);
                        self.trace(&format!("view {id}"));
                    }
                    _ => {}
                }
            }
        }
        // Liveness: heal, restart everyone, stop dropping and duplicating.
        self.partition = None;
        self.s.drop_p = 0.0;
        self.s.dup_p = 0.0;
        let down: Vec<ReplicaId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.replica.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in down {
            self.restart(&id);
            self.settle(&id);
        }
        self.trace("liveness");
        let mut converged_at_ms = None;
        let healed_us = self.now_us;
        let deadline_us = self.now_us + 60_000_000;
        let mut early_failure = None;
        while self.now_us < deadline_us {
            if early_failure.is_none() && self.now_us > healed_us + 10_000_000 {
                early_failure = self.converged().err();
            }
            let t = self.now_us + 250_000;
            self.run_until(t);
            for _ in 0..3 {
                self.random_watermark_read();
            }
            if self.converged().is_ok() {
                converged_at_ms = Some(self.now_us / 1_000);
                break;
            }
        }
        if converged_at_ms.is_none() {
            let why = self.converged().err().unwrap_or_default();
            let early = early_failure.unwrap_or_default();
            self.checks.violations.push(format!(
                "C5: not converged 60 s after healing: {why}\n  10 s after healing: {early}"
            ));
        }
        // C1: every acknowledged write is covered everywhere (implied by convergence to
        // the oracle, which holds every acknowledged write).
        for t in &self.checks.acked {
            if !self
                .checks
                .writes
                .contains_key(&(t.scope.clone(), t.origin.clone(), t.sequence))
            {
                self.checks.violations.push(format!(
                    "C1: acknowledged {t:?} missing from the durable set"
                ));
            }
        }
        if converged_at_ms.is_some() {
            self.check_counters();
        }
        let (mut snapshots, mut gaps, mut rows_split) = (0, 0, 0);
        for n in self.nodes.values() {
            if let Some(r) = &n.replica {
                snapshots += r.stats().snapshots_installed;
                rows_split += r.stats().snapshot_rows_split;
                gaps += r.stats().gap_requests;
            }
        }
        Report {
            trace_hash: self.trace.digest(),
            violations: self.checks.violations,
            acked: self.checks.acked.len(),
            replicas: ids.len(),
            converged_at_ms,
            watermark_reads_served: self.checks.watermark_reads_served,
            snapshots,
            rows_split,
            gap_requests: gaps,
        }
    }
}
