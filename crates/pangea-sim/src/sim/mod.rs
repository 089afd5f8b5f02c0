//! The driver: `pangea_core` replicas over the simulated WAN, frontends that route
//! with `pangea_core::read`, a fault timeline, and checkers on every step.
//!
//! # Driving protocol (the one `Replica`'s module documentation prescribes)
//! After every input to a replica (`handle_frame`, `handle_timeout`, `propose`,
//! `handle_view`) the driver calls `flush(now)`, then drains `poll_transmit` (each
//! frame goes into the [`Network`]; `handle_sent` is called when it is delivered or
//! dropped), then `poll_event`, then arms the replica's timer at `poll_timeout()`.
//! Each replica has its own wall clock: virtual time plus a static skew plus any
//! clock fault, while `mono_us` is virtual time.
//!
//! # Clients
//! Frontends are modelled per region ([`client`]). Their requests do not go
//! through the [`Network`] (built from the topology's replicas, with per-connection
//! FIFO that QUIC streams of independent requests do not have): a request costs the
//! topology's round trip from the client's region to the replica
//! (`pangea_core::read::estimated_rtt_ms`) / 2 each way, plus the link override's
//! extra latency, jitter and loss retransmissions from the same [`NetConfig`], and
//! is refused while a partition cuts the path (checked when it is sent and when it
//! arrives). A crashed replica refuses connections (the client sees a transport
//! error after the round trip and marks it down for 1 s, as `pangea-client` does);
//! a partitioned or paused one is silent (the attempt runs into the deadline).
//! Client traffic has no bandwidth limit.
//!
//! Reads are served from `replica.storage().row` (`get_row` without the copy) once
//! the replica's readiness gate is open (after a restart) and
//! `pangea_core::read::decide` admits them against the replica's durable
//! `watermarks` of the scope `vouching_scope` picks; every answer carries those
//! watermarks back to the client, which remembers them for later plans. Every
//! decision of a read or write (hedging, failover, the watermark fallback race,
//! retries, deadlines) is taken by `pangea_core::frontend::call`, the state machines
//! `pangea-client` drives too (`ops`).
//!
//! # Files
//! `ops` (client operations and serving them), `client` (what a frontend keeps),
//! `faults` (the timeline), `checks` (the checkers' state and what they learn from
//! the wire), `metrics` and `report` (what is measured and reported), `shard` (a run
//! split across two threads).
//!
//! # Phases
//! The workload runs for the scenario's duration while faults come and go (the
//! safety phase). Then the workload stops, every fault still active heals (crashed
//! replicas restart, partitions heal, links are restored, paused replicas resume;
//! clock jumps and placement changes stay), and the run waits until every replica
//! has converged (the liveness phase), at most `drain_max`.

mod backup;
mod checks;
pub mod client;
mod faults;
mod jobs;
pub mod metrics;
mod ops;
mod report;
mod shard;

pub use shard::{Split, default_threads, plan_split, run_scenario, run_split};

use crate::host::{Host, Work};
use crate::ids::Interner;
use crate::net::{NetConfig, Network};
use crate::queue::EventQueue;
use crate::rng::SimRng;
use crate::scenario::{Fault, FaultKind, Scenario, WriteAck};
use crate::time::{SimDuration, SimTime};
use crate::workload::{Generator, Mode, OpKind};
use anyhow::{Context, Result};
use bytes::Bytes;
use checks::{Checks, Fingerprint, note_durable, note_wire};
use client::{Client, PROBE_INTERVAL, PROBE_TIMEOUT, View};
use hdrhistogram::Histogram;
use metrics::{
    Counters, FaultMarker, LagSummary, LogBins, OpStats, RunReport, SeriesPoint, WanBytes,
};
use pangea_core::digest::ContentDigest;
use pangea_core::frame::Frame;
use pangea_core::frontend::call::{self, Action, Outcome, ReadCall, Reply as CallReply, WriteCall};
use pangea_core::link::LinkEncoder;
use pangea_core::read::{
    Candidate, Candidates, Consistency, Decision, ReadRequest, Reason, RouteTable, decide,
    estimated_rtt_ms,
};
use pangea_core::readiness::{Gate, Phase as GatePhase};
use pangea_core::replica::{Event, Now, Replica};
use pangea_core::storage::{LogEntry, Storage};
use pangea_core::{
    Limits, MemStorage, Mutation, RowMutation, RowState, ScopeId, ScopeWatermarks, Timestamp,
    Token, Version,
};
use pangea_topology::{AppProfile, Deployment, LinkClass, RegionId, ReplicaId};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use xxhash_rust::xxh3::{Xxh3, Xxh3DefaultBuilder, xxh3_64};

/// Wall-clock time (Unix ms) at virtual time zero, as the core's cluster harness uses.
pub const BASE_WALL_MS: u64 = 1_700_000_000_000;

/// The wall clock, in ms since the Unix epoch, at simulated time `t` (an
/// unskewed host's).
pub fn wall_ms_at(t: SimTime) -> u64 {
    BASE_WALL_MS + t.as_us() / 1_000
}
/// Bytes of a request or response beyond its key and value (headers, watermarks).
const ENVELOPE_BYTES: usize = 96;
/// How often convergence is checked after a heal, and during the drain.
const CATCH_UP_CHECK: SimDuration = SimDuration::from_ms(50);
const DRAIN_CHECK: SimDuration = SimDuration::from_ms(250);
/// Latency-over-time charts use at most this many buckets.
const SERIES_BUCKETS_MAX: u64 = 300;

/// A frame on the simulated wire, tagged with the life of the replica that sent it
/// so that a restarted replica is not credited for its previous life's sends.
#[derive(Debug)]
struct Wire {
    frame: Frame,
    life: u32,
}

/// One replica slot: the running state machine, or its storage while it is down.
#[derive(Debug)]
struct Node {
    id: ReplicaId,
    region: usize,
    stores_rows: bool,
    replica: Option<Replica<MemStorage>>,
    /// The store while the replica is down.
    parked: Option<MemStorage>,
    /// Incremented at every restart.
    life: u32,
    /// Active faults that took it down / paused it (they may overlap).
    down: u32,
    paused: u32,
    /// Frames that arrived while paused, in arrival order.
    held_frames: VecDeque<(usize, Wire, usize)>,
    /// Client requests that arrived while paused.
    held_requests: Vec<Ev>,
    timer_gen: u64,
    timer_at: Option<u64>,
    skew_ms: i64,
    /// Index of the deployment this replica was last handed (`Sim::views`).
    view: usize,
    /// Run by another shard (`shard.rs`): never up here, never counted down.
    foreign: bool,
    /// Per receiver (by index, grown on use): the state of the stream this replica
    /// sends to it, which the wire-byte counts follow (heartbeats condensed, as
    /// `pangea-node` sends them). A restart starts them afresh, as new connections.
    links: Vec<LinkEncoder>,
    /// After a restart, the readiness gate (`pangea_core::readiness`, as the node
    /// runs it) until it opens: reads are refused `unavailable` meanwhile. Replicas
    /// that start with the run start open (a new cluster, empty for all).
    gate: Option<Box<Gate>>,
    /// The placement migration jobs it runs (`jobs.rs`), and when its next turn
    /// for them is queued.
    jobs: Vec<pangea_core::migration::Job>,
    jobs_at: Option<SimTime>,
    /// Its host's cores and disk (`crate::host`).
    host: Host,
    /// Frames that arrived and wait for a core, in arrival order, each with when
    /// its apply is done (never before the one ahead of it: a connection's frames
    /// are applied in order); `Ev::Inbox` hands them to the replica.
    inbox: VecDeque<Inbound>,
    inbox_gen: u64,
    /// This turn has writes for the disk, ready for it at this time (its CPU work
    /// done): its frames leave and its writes are acknowledged once the group
    /// commit that takes them ends.
    turn: Option<SimTime>,
    /// Active faults that took its host away (silence: requests and probes to it
    /// go unanswered rather than refused).
    silent: u32,
}

/// A request of a call that ended, followed until the call's deadline
/// (`call::Lesson::Follow`, `ops::learn`).
#[derive(Debug)]
struct Detached {
    client: u32,
    r: u32,
    since: SimTime,
    until: SimTime,
}

/// One region's frontends in one bucket of virtual time (`Metrics::series`):
/// answered-read latencies, failed reads and writes (by when they ended), and the
/// hedges and failovers sent.
#[derive(Debug, Clone, Default)]
struct Bucket {
    reads: LogBins,
    read_errors: u64,
    write_errors: u64,
    hedges: u64,
    failovers: u64,
}

impl Bucket {
    fn absorb(&mut self, o: &Bucket) {
        self.reads.absorb(&o.reads);
        self.read_errors += o.read_errors;
        self.write_errors += o.write_errors;
        self.hedges += o.hedges;
        self.failovers += o.failovers;
    }
}

/// A frame waiting in a replica's inbox (`Node::inbox`).
#[derive(Debug)]
struct Inbound {
    ready: SimTime,
    from: usize,
    frame: Frame,
}

impl Node {
    fn now(&self, t: SimTime) -> Now {
        let wall = wall_ms_at(t) as i64 + self.skew_ms;
        Now {
            mono_us: t.as_us(),
            wall_ms: wall.max(0) as u64,
        }
    }
}

/// Names an operation in the slab; stale references (a finished op) are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct OpRef {
    slot: u32,
    generation: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrKind {
    Deadline,
    NotCovered,
    TooStale,
    Unavailable,
    Policy,
}

impl ErrKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrKind::Deadline => "deadline",
            ErrKind::NotCovered => "not_covered",
            ErrKind::TooStale => "too_stale",
            ErrKind::Unavailable => "unavailable",
            ErrKind::Policy => "policy",
        }
    }

    /// How the call's state machine sees it (`pangea_client`'s `reply_of`).
    fn reply(self) -> CallReply {
        match self {
            ErrKind::Deadline => CallReply::DeadlineExceeded,
            ErrKind::NotCovered => CallReply::NotCovered,
            ErrKind::TooStale | ErrKind::Unavailable => CallReply::Retryable,
            ErrKind::Policy => CallReply::Final,
        }
    }
}

#[derive(Debug)]
enum Reply {
    Ok {
        wm: Option<ScopeWatermarks>,
        /// A write's token (a batch's: its first row's, when that row was taken).
        token: Option<Token>,
        /// Rows of a batch write the replica refused (each row is checked alone,
        /// as the node's `mutate_rows` does).
        failed_rows: u32,
    },
    Err(ErrKind, Option<ScopeWatermarks>),
    /// The replica's process is gone: a transport error, not an answer.
    Refused,
}

#[derive(Debug)]
enum Ev {
    Timer {
        r: u32,
        generation: u64,
    },
    Issue {
        region: u32,
    },
    Request {
        op: OpRef,
        attempt: u16,
        r: u32,
        client: u32,
        /// The rows a write sets (one, or a batch's).
        write: Option<Box<[RowMutation]>>,
        /// What a replica in another shard needs to serve a read (the operation
        /// lives in the client's shard).
        remote: Option<Box<RemoteRead>>,
    },
    Response {
        op: OpRef,
        attempt: u16,
        r: u32,
        reply: Box<Reply>,
        /// The frontend has spent its CPU on it (`Simulation::frontends`).
        received: bool,
    },
    /// An operation's call asked to be woken now (`poll_timeout`).
    Wake {
        op: OpRef,
    },
    /// A replica's migration jobs want another turn (`jobs.rs`).
    Jobs {
        r: u32,
    },
    /// A step of a backup's call (`backup.rs`).
    Backup {
        job: u32,
        scope: u32,
        call: u32,
        at: backup::BackupAt,
    },
    /// A request a call left out when it ended got no answer by its deadline
    /// (`ops::learn`).
    Silence {
        op: OpRef,
        attempt: u16,
    },
    /// A replica's host has applied the frame at the head of its inbox.
    Inbox {
        r: u32,
        generation: u64,
    },
    Probe {
        client: u32,
    },
    ProbeRequest {
        client: u32,
        r: u32,
        sent_at: SimTime,
    },
    ProbeReply {
        client: u32,
        r: u32,
        sent_at: SimTime,
        /// `None`: connection refused.
        wms: Option<Vec<(usize, ScopeWatermarks)>>,
    },
    ProbeTimeout {
        client: u32,
        r: u32,
        sent_at: SimTime,
    },
    FaultStart(u32),
    FaultEnd(u32),
    Rollout {
        fault: u32,
        step: u32,
    },
    CatchUpCheck,
    EndWorkload,
    DrainCheck,
}

/// A read as a replica of another shard serves it.
#[derive(Debug)]
struct RemoteRead {
    key: Bytes,
    consistency: Consistency,
}

#[derive(Debug)]
struct Attempt {
    /// The replica asked, by index.
    replica: usize,
    /// Its error, once it answered with one.
    err: Option<ErrKind>,
}

/// An operation's decisions: `pangea_core`'s state machines, which `pangea-client`
/// drives too.
#[derive(Debug)]
enum Call {
    Read(ReadCall<Candidates>),
    Write(WriteCall),
    /// Not planned yet, or waiting to be planned again after a refusal.
    Unplanned,
}

impl Call {
    fn poll_action(&mut self) -> Option<Action> {
        match self {
            Call::Read(c) => c.poll_action(),
            Call::Write(c) => c.poll_action(),
            Call::Unplanned => None,
        }
    }

    fn poll_timeout(&self) -> Option<u64> {
        match self {
            Call::Read(c) => c.poll_timeout(),
            Call::Write(c) => c.poll_timeout(),
            Call::Unplanned => None,
        }
    }

    fn attempt(&self, n: usize) -> Option<&call::Attempt> {
        match self {
            Call::Read(c) => c.attempts().get(n),
            Call::Write(c) => c.attempts().get(n),
            Call::Unplanned => None,
        }
    }

    fn handle_reply(&mut self, now: SimTime, n: usize, reply: CallReply) {
        match self {
            Call::Read(c) => c.handle_reply(now.as_us(), n, reply),
            Call::Write(c) => c.handle_reply(now.as_us(), n, reply),
            Call::Unplanned => {}
        }
    }

    fn outcome(&self) -> Option<Outcome> {
        match self {
            Call::Read(c) => c.outcome(),
            Call::Write(c) => c.outcome(),
            Call::Unplanned => None,
        }
    }
    /// `call::Lesson`s learned since last asked.
    fn lessons(&mut self) -> Vec<call::Lesson> {
        match self {
            Call::Read(c) => c.lessons().collect(),
            Call::Write(c) => c.lessons().collect(),
            Call::Unplanned => Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Op {
    client: usize,
    /// `None` for writes and deletes.
    mode: Option<Mode>,
    key: Bytes,
    scope: usize,
    consistency: Consistency,
    /// The rows a write sets: one, or a batch's (`batch`); none for a read.
    rows: Vec<RowMutation>,
    batch: bool,
    started: SimTime,
    call: Call,
    /// The replicas of `call`'s attempts, in its order.
    attempts: Vec<Attempt>,
    /// The earliest `Ev::Wake` of this operation in the queue.
    wake_at: Option<SimTime>,
    /// When the last answer that reached the frontend is done waiting for the
    /// frontend's CPU (`Simulation::frontends`): a timer due before then waits
    /// for it.
    answer_queued_until: SimTime,
    /// A read-back (`Workload::read_back`): the token of the write it reads back,
    /// never sent (the read is a plain affinity read), only checked.
    read_back: Option<Token>,
    /// Location refreshes after refusals so far (`Simulation::refused`), and when
    /// the next plan is due.
    round: u32,
    replan_at: Option<SimTime>,
}

/// Operations in flight, by slot; a slot's generation changes when it is reused.
#[derive(Debug, Default)]
struct Slab {
    ops: Vec<Option<Op>>,
    gens: Vec<u32>,
    free: Vec<u32>,
}

impl Slab {
    fn insert(&mut self, op: Op) -> OpRef {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.ops.push(None);
                self.gens.push(0);
                // Fewer than 2^32 operations are ever in flight at once.
                (self.ops.len() - 1) as u32
            }
        };
        self.ops[slot as usize] = Some(op);
        OpRef {
            slot,
            generation: self.gens[slot as usize],
        }
    }

    fn get(&self, r: OpRef) -> Option<&Op> {
        if self.gens.get(r.slot as usize) != Some(&r.generation) {
            return None;
        }
        self.ops[r.slot as usize].as_ref()
    }

    fn get_mut(&mut self, r: OpRef) -> Option<&mut Op> {
        if self.gens.get(r.slot as usize) != Some(&r.generation) {
            return None;
        }
        self.ops[r.slot as usize].as_mut()
    }

    /// Removes every operation `gone` picks; how many.
    fn remove_where(&mut self, mut gone: impl FnMut(&Op) -> bool) -> u64 {
        let mut n = 0;
        for slot in 0..self.ops.len() {
            if self.ops[slot].as_ref().is_some_and(&mut gone) {
                let r = OpRef {
                    slot: slot as u32,
                    generation: self.gens[slot],
                };
                self.remove(r);
                n += 1;
            }
        }
        n
    }

    fn remove(&mut self, r: OpRef) -> Option<Op> {
        if self.gens.get(r.slot as usize) != Some(&r.generation) {
            return None;
        }
        let op = self.ops[r.slot as usize].take()?;
        self.gens[r.slot as usize] = self.gens[r.slot as usize].wrapping_add(1);
        self.free.push(r.slot);
        Some(op)
    }
}

/// What is measured.
#[derive(Debug)]
struct Metrics {
    modes: [OpStats; Mode::ALL.len()],
    regions: Vec<OpStats>,
    /// By region, then mode (`Mode::index`).
    region_modes: Vec<[OpStats; Mode::ALL.len()]>,
    writes: OpStats,
    /// Batch writes: one per request, whatever its rows.
    batches: OpStats,
    reads: u64,
    reads_ok: u64,
    lag: Histogram<u64>,
    /// `[origin × replicas + replica]`.
    lag_matrix: Vec<LogBins>,
    bucket_us: u64,
    /// `[region][bucket]`: what the region's frontends saw.
    series: Vec<Vec<Bucket>>,
    lag_series: Vec<LogBins>,
    counters: Counters,
    client_cross_region_bytes: u64,
}

/// Per-fault runtime state.
#[derive(Debug, Default)]
struct FaultState {
    started: bool,
    ended: bool,
    partition: Option<crate::net::PartitionId>,
    /// Rollout order for a placement change.
    order: Vec<usize>,
    view: usize,
}

/// The catch-up measurement after the last heal.
#[derive(Debug)]
struct CatchUp {
    heal_at: SimTime,
    /// `[scope × replicas + origin]`: sequences every member must reach.
    targets: Vec<u64>,
    done_at: Option<SimTime>,
}

/// A write proposed and waiting for its `Committed` event: the operation, the
/// attempt and the client to answer, and the mutation (for the oracle, even when
/// the client has given up).
type PendingCommit = (OpRef, u16, u32, RowMutation);

/// A batch write's rows at the replica that took them, by (operation, attempt,
/// replica): answered once every row it proposed is durable (and applied in the
/// regions the write waits for), as the node's `mutate_rows` answers.
#[derive(Debug)]
struct BatchWait {
    /// Rows proposed and not yet done.
    left: u32,
    /// Rows the replica refused.
    failed: u32,
    /// The first row's (scope, sequence), if it was proposed, and its token
    /// once done: the token the answer carries.
    first: Option<(u32, u64)>,
    token: Option<Token>,
}

/// A committed write whose client waits for other regions to apply it
/// (`Workload::write_ack`), at its origin `r`; answered when the origin's
/// applied-watermark reports show `regions` other regions, checked as
/// heartbeats arrive there, as the node's `serve.rs` does.
#[derive(Debug)]
struct ReplicationWait {
    r: u32,
    op: OpRef,
    attempt: u16,
    client: u32,
    token: Token,
    regions: usize,
}

/// A trace hasher with a `Debug` that shows nothing (xxh3's state is opaque).
struct Trace(Xxh3);

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Trace")
    }
}

/// One simulation run. Build with [`Simulation::new`], run with [`Simulation::run`].
#[derive(Debug)]
pub struct Simulation {
    sc: Scenario,
    net: Network<Wire>,
    queue: EventQueue<Ev>,
    now: SimTime,
    nodes: Vec<Node>,
    names: Interner,
    scopes: Interner,
    /// By scope index: this run's `ScopeId`s.
    scope_ids: Vec<ScopeId>,
    /// Every deployment handed out so far (index 0: the initial one).
    views: Vec<Arc<Deployment>>,
    /// `[view][scope][replica]`: may the replica hold the scope's rows.
    allowed: Vec<Vec<Vec<bool>>>,
    /// The deployment clients plan with (the newest).
    client_view: usize,
    /// `[view][region]`: the routes clients of the region plan reads with.
    routes: Vec<Vec<RouteTable>>,
    /// The workload's table, as the deployment names it (the same `Arc`, so the
    /// placement's lookups compare it by address).
    workload_table: Arc<str>,
    /// `[view][rank]`: the replica index of each of the view's replicas, in id order
    /// (`PeerView::rtt_ms_ranked`).
    rank_replica: Vec<Vec<Option<usize>>>,
    /// `[view]`: the workload table's schema (a served read sizes its answer by it).
    workload_schema: Vec<Option<pangea_topology::schema::TableSchema>>,
    profile: AppProfile,
    /// `[region][replica]`: one-way client latency before overrides (µs).
    client_one_way_us: Vec<Vec<u64>>,
    clients: Vec<Client>,
    /// Client indices by region, and the load of each region.
    region_clients: Vec<Vec<usize>>,
    region_rate: Vec<f64>,
    /// Key prefix of each region's users.
    region_prefix: Vec<String>,
    /// Rows each region still has to write before its mix
    /// (`RegionLoad::fill`): the next of its prefix's then the global prefix's
    /// keys, `None` once done (or never asked).
    region_fill: Vec<Option<u64>>,
    /// Active faults that lost each region's frontends.
    region_lost: Vec<u32>,
    ops: Slab,
    /// Writes proposed and waiting for their `Committed` event:
    /// (replica, scope, sequence) → (op, attempt, client, the entry).
    pending_commits: HashMap<(u32, u32, u64), PendingCommit, Xxh3DefaultBuilder>,
    /// Committed writes waiting for other regions, in commit order.
    replication_waits: Vec<ReplicationWait>,
    /// Batch writes waiting for their rows, by (operation, attempt, replica).
    batch_waits: HashMap<(OpRef, u16, u32), BatchWait, Xxh3DefaultBuilder>,
    generator: Generator,
    path_rng: SimRng,
    fault_rng: SimRng,
    faults: Vec<FaultState>,
    checks: Checks,
    metrics: Metrics,
    /// Records of reads' calls (`Workload::record_reads`), and how many more to keep.
    recorded_reads: Vec<call::ReadLog>,
    record_reads_left: usize,
    /// The migration jobs `migrate` faults started (`jobs.rs`).
    migrations: Vec<metrics::MigrationSummary>,
    /// The backups `backup` faults run (`backup.rs`), and their report lines.
    backups: Vec<backup::BackupJob>,
    backup_summaries: Vec<metrics::BackupSummary>,
    /// A bug put in on purpose (tests), which C10 must catch.
    #[cfg(test)]
    backup_bug: Option<backup::Bug>,
    trace: Trace,
    workload_on: bool,
    catch_up: Option<CatchUp>,
    drain_started: Option<SimTime>,
    final_convergence: Option<SimTime>,
    stop: bool,
    events_buf: Vec<Event>,
    /// When the frames and acknowledgements of the turn being settled leave.
    turn_leave: SimTime,
    /// Requests of ended calls still followed (`ops::learn`).
    detached: HashMap<(OpRef, u16), Detached, Xxh3DefaultBuilder>,
    /// The frontends' CPU on the machine's cores, when they share it with the
    /// replicas (`Hosts::frontend_us`): every request sent and answer received
    /// takes a turn on them.
    frontends: Option<Host>,
    /// `xxh3_64` of each frame kind's name the trace has hashed, by the name's
    /// address (`Frame::kind` names are `'static`): hashed once per kind.
    kind_hashes: Vec<(&'static str, u64)>,
    leak_bytes: u64,
    /// Set when the run is split into shards (`shard.rs`).
    shard: Option<Box<shard::ShardCtx>>,
    /// The other shard's network counters, once merged (`shard.rs`).
    net_absorbed: Option<crate::net::NetStats>,
}

fn residency_bytes(e: &LogEntry) -> usize {
    e.wire_bytes()
}

impl Simulation {
    /// Builds the network, the replicas and the clients of a scenario, on its own
    /// copy of the scenario's deployments (`Scenario::detached`: one `Arc` per name,
    /// so that equal ids compare by pointer, and none shared with the caller).
    pub fn new(sc: Scenario) -> Result<Simulation> {
        Self::build(sc.detached(), None)
    }

    /// [`Simulation::new`], or one shard of a split run: it runs only the replicas
    /// and clients `shard` gives it, and draws from its own random streams.
    fn build(sc: Scenario, shard: Option<Box<shard::ShardCtx>>) -> Result<Simulation> {
        let d = sc.deployment.clone();
        let mut rng = SimRng::new(match &shard {
            None => sc.seed,
            Some(ctx) => {
                xxh3_64(&[sc.seed.to_le_bytes(), u64::from(ctx.me).to_le_bytes()].concat())
            }
        });
        let mut net: Network<Wire> =
            Network::new(&d.topology, sc.net.clone(), rng.next_u64()).context("network")?;
        if let Some(ctx) = &shard {
            net.hand_to(|to| ctx.replica[to.index()] != ctx.me);
        }
        let mut names = Interner::new(net.replicas().map(|(_, id)| id.as_str()));
        let n = names.len();
        // Every scope of every deployment the run will hand out, in a fixed order.
        let mut views = vec![d.clone()];
        for f in &sc.faults {
            if let FaultKind::ChangePlacement { deployment, .. } = &f.kind {
                views.push(deployment.clone());
            }
        }
        let mut scopes = Interner::default();
        // This run's own `ScopeId` of each scope (frames from another shard's
        // replicas get them, see `shard::take_over`).
        let mut scope_ids = Vec::new();
        for v in &views {
            for s in v.scopes() {
                if scopes.intern(s.as_str()) == scope_ids.len() {
                    scope_ids.push(s.clone());
                }
            }
        }
        // The ids replicas and frontends hand back are clones of the deployments'.
        for (_, id) in net.replicas() {
            names.pin(id);
        }
        pin_views(&mut names, &mut scopes, &views);
        let allowed = views
            .iter()
            .map(|v| {
                scope_ids
                    .iter()
                    .map(|scope| {
                        (0..n)
                            .map(|r| v.allowed(&ReplicaId::new(names.name(r)), scope))
                            .collect()
                    })
                    .collect()
            })
            .collect();

        let mut nodes = Vec::with_capacity(n);
        // One run (or shard) shares rows between its replicas, never with another.
        let shared_rows: Arc<dyn pangea_core::storage::RowSharing> =
            Arc::new(crate::shared_rows::SharedRows::new());
        // Every host on one machine, or each on its own cores.
        let machine = sc.host.machine_cores.map(|n| {
            let d = &sc.host.default;
            let seed = xxh3_64(&[sc.seed.to_le_bytes(), *b"machine\0"].concat());
            crate::host::Cores::machine(n, d.background, d.background_us, d.cpu_sigma, seed)
        });
        let skew_max = sc.clock_skew_ms_max as i64;
        let mut skew_rng = rng.fork(1);
        for (i, (idx, id)) in net.replicas().enumerate() {
            let skew_ms = if skew_max > 0 {
                skew_rng.next_u64_inclusive(2 * skew_max as u64) as i64 - skew_max
            } else {
                0
            };
            let region = net.region_idx_of(idx).expect("replica of the network");
            let stores_rows = d.topology.replicas[id].role.stores_rows();
            let mut node = Node {
                id: id.clone(),
                region,
                stores_rows,
                replica: None,
                parked: None,
                life: 0,
                down: 0,
                paused: 0,
                held_frames: VecDeque::new(),
                held_requests: Vec::new(),
                timer_gen: 0,
                timer_at: None,
                skew_ms,
                view: 0,
                foreign: false,
                links: Vec::new(),
                gate: None,
                jobs: Vec::new(),
                jobs_at: None,
                host: {
                    let model = sc
                        .host
                        .model(id.as_str(), d.topology.replicas[id].region.as_str());
                    let rng = SimRng::new(xxh3_64(
                        &[
                            sc.seed.to_le_bytes(),
                            (i as u64).to_le_bytes(),
                            *b"host\0\0\0\0",
                        ]
                        .concat(),
                    ));
                    match &machine {
                        Some(cores) => Host::on(model, rng, cores.clone()),
                        None => Host::new(model, rng),
                    }
                },
                inbox: VecDeque::new(),
                inbox_gen: 0,
                turn: None,
                silent: 0,
            };
            if shard.as_ref().is_some_and(|ctx| ctx.replica[i] != ctx.me) {
                node.foreign = true;
                nodes.push(node);
                continue;
            }
            // Only a replica a fault crashes needs its storage to keep what each
            // write replaced until the next sync (`MemStorage::crash`).
            let mut storage = MemStorage::new();
            storage.share_rows(shared_rows.clone());
            storage.set_crash_model(sc.faults.iter().any(|f| match &f.kind {
                FaultKind::Lose { replicas, .. } => replicas.contains(id),
                _ => false,
            }));
            let mut replica = Replica::new(
                id.clone(),
                d.clone(),
                sc.replica.clone(),
                storage,
                replica_seed(sc.seed, i, 0),
                node.now(SimTime::ZERO),
            )
            .with_context(|| format!("starting replica {id}"))?;
            // Every replica starts at time zero on an empty store.
            replica.created_with_deployment(node.now(SimTime::ZERO));
            node.replica = Some(replica);
            nodes.push(node);
        }

        let profile = d
            .topology
            .app_profiles
            .get(&sc.workload.app_profile)
            .cloned()
            .or_else(|| {
                (sc.workload.app_profile == "frontend").then(|| AppProfile {
                    name: "frontend".into(),
                    routing: pangea_topology::Routing::Nearest,
                    priority: pangea_topology::Priority::Serving,
                    writes: pangea_topology::WriteRouting::Nearest,
                    // Every table of the placement (system tables are never granted).
                    tables: d
                        .placement
                        .schema
                        .user_tables()
                        .map(|t| (t.clone(), pangea_topology::Access::ReadWrite))
                        .collect(),
                    policies: None,
                })
            })
            .with_context(|| {
                format!(
                    "app profile {:?} is not in the topology",
                    sc.workload.app_profile
                )
            })?;

        let regions: Vec<RegionId> = net.regions().to_vec();
        let client_one_way_us = regions
            .iter()
            .map(|region| {
                (0..n)
                    .map(|r| {
                        let rtt = estimated_rtt_ms(&d, region, &ReplicaId::new(names.name(r)));
                        SimDuration::from_ms_f64(rtt / 2.0).as_us()
                    })
                    .collect()
            })
            .collect();
        // Every view shares the topology (placement changes change the placement
        // only), so a replica's rank is the same in each.
        let mut rank_of = vec![usize::MAX; n];
        for (rank, id) in d.topology.replicas.keys().enumerate() {
            if let Some(r) = names.get(id.as_str()) {
                rank_of[r] = rank;
            }
        }
        let rank_of: Arc<[usize]> = rank_of.into();
        let mut clients = Vec::new();
        let mut region_clients = vec![Vec::new(); regions.len()];
        let mut region_rate = vec![0.0; regions.len()];
        let mut region_fill = vec![None; regions.len()];
        for load in &sc.workload.regions {
            let ri = net.region_idx(&load.region).with_context(|| {
                format!("workload region {} is not in the topology", load.region)
            })?;
            region_rate[ri] += load.rate;
            if load.fill {
                region_fill[ri] = Some(0);
            }
            // Where its frontends read location metadata: the region's first
            // replica that stores rows.
            let source = nodes.iter().position(|n| n.region == ri && n.stores_rows);
            for _ in 0..load.clients.max(1) {
                region_clients[ri].push(clients.len());
                let mut c = Client::new(
                    ri,
                    regions[ri].clone(),
                    rank_of.clone(),
                    scopes.len(),
                    SimTime::ZERO,
                    // Spread over the millisecond, the same in every run.
                    (clients.len() as u64).wrapping_mul(379),
                );
                c.location_source = source;
                clients.push(c);
            }
        }
        let routes = views
            .iter()
            .map(|v| {
                regions
                    .iter()
                    .map(|region| RouteTable::new(v, &profile, region))
                    .collect()
            })
            .collect();
        let rank_replica: Vec<Vec<Option<usize>>> = views
            .iter()
            .map(|v| {
                v.topology
                    .replicas
                    .keys()
                    .map(|id| names.get(id.as_str()))
                    .collect()
            })
            .collect();
        let workload_schema = views
            .iter()
            .map(|v| v.placement.schema.table(&sc.workload.table).cloned())
            .collect();
        debug_assert!(
            rank_replica.iter().all(|v| *v == rank_replica[0]),
            "views with other topologies: the clients' ranks (`rank_of`) assume one"
        );
        let region_prefix = regions
            .iter()
            .map(|r| {
                let continent = &d.topology.regions[r].continent;
                sc.workload
                    .prefixes
                    .get(continent)
                    .cloned()
                    .unwrap_or_else(|| sc.workload.global_prefix.clone())
            })
            .collect();

        let bucket_us = (sc.duration.as_us() / SERIES_BUCKETS_MAX).max(1_000_000);
        let buckets = (sc.duration.as_us() + sc.drain_max.as_us()) / bucket_us + 2;
        let metrics = Metrics {
            modes: Default::default(),
            regions: (0..regions.len()).map(|_| OpStats::default()).collect(),
            region_modes: (0..regions.len()).map(|_| Default::default()).collect(),
            writes: OpStats::default(),
            batches: OpStats::default(),
            reads: 0,
            reads_ok: 0,
            lag: metrics::histogram(),
            lag_matrix: vec![LogBins::default(); n * n],
            bucket_us,
            series: vec![vec![Bucket::default(); buckets as usize]; regions.len()],
            lag_series: vec![LogBins::default(); buckets as usize],
            counters: Counters::default(),
            client_cross_region_bytes: 0,
        };
        let s = scopes.len();
        let checks = Checks {
            replicas: n,
            scopes: s,
            applied: vec![0; n * s * n],
            advertised: vec![(0, Timestamp::ZERO); n * s * n],
            streams: vec![Vec::new(); s * n],
            // Kept for C10 only when a backup runs.
            log: if sc
                .faults
                .iter()
                .any(|f| matches!(f.kind, FaultKind::Backup { .. }))
            {
                vec![Vec::new(); s * n]
            } else {
                Vec::new()
            },
            proposed_us: vec![Vec::new(); s * n],
            acked_max: vec![0; s * n],
            oracle: BTreeMap::new(),
            lost_writes: 0,
            watermark_violations: 0,
            token_violations: 0,
            staleness_violations: 0,
            other_violations: 0,
            durable_history: vec![VecDeque::new(); n * s * n],
            durable_last: vec![u64::MAX; n * s * n],
            violations: Vec::new(),
            schema: d.placement.schema.clone(),
            counted: BTreeMap::new(),
            lost_increments: 0,
        };
        let frontends = match &machine {
            Some(cores) if sc.host.frontend_us > 0.0 => {
                let model = crate::host::HostModel {
                    read: crate::host::Cost {
                        mean_us: sc.host.frontend_us,
                        per_kib_us: 0.0,
                    },
                    background: 0.0,
                    // The frontends' threads are not the replicas'.
                    stall_per_s: 0.0,
                    ..sc.host.default
                };
                let rng = SimRng::new(xxh3_64(&[sc.seed.to_le_bytes(), *b"frontend"].concat()));
                Some(Host::on(model, rng, cores.clone()))
            }
            _ => None,
        };
        let generator = Generator::new(&sc.workload, rng.next_u64())?;
        let path_rng = rng.fork(2);
        // Split, both shards run every fault and must draw the same (a rollout's
        // order): the faults' stream does not depend on the shard.
        let fault_rng = match &shard {
            None => rng.fork(3),
            Some(_) => SimRng::new(xxh3_64(&[sc.seed.to_le_bytes(), *b"faults\0\0"].concat())),
        };
        let faults = sc.faults.iter().map(|_| FaultState::default()).collect();
        let n_regions = regions.len();
        let mut sim = Simulation {
            net,
            queue: EventQueue::with_capacity(4096),
            now: SimTime::ZERO,
            nodes,
            names,
            scopes,
            scope_ids,
            allowed,
            views,
            client_view: 0,
            routes,
            workload_table: d
                .placement
                .schema
                .tables
                .get_key_value(sc.workload.table.as_str())
                .map_or_else(|| sc.workload.table.as_str().into(), |(t, _)| t.clone()),
            rank_replica,
            workload_schema,
            profile,
            client_one_way_us,
            clients,
            region_clients,
            region_rate,
            region_prefix,
            region_fill,
            region_lost: vec![0; n_regions],
            ops: Slab::default(),
            pending_commits: HashMap::default(),
            replication_waits: Vec::new(),
            batch_waits: HashMap::default(),
            generator,
            path_rng,
            fault_rng,
            faults,
            checks,
            metrics,
            recorded_reads: Vec::new(),
            migrations: Vec::new(),
            backups: Vec::new(),
            backup_summaries: Vec::new(),
            #[cfg(test)]
            backup_bug: None,
            record_reads_left: 0,
            trace: Trace(Xxh3::new()),
            workload_on: true,
            catch_up: None,
            drain_started: None,
            final_convergence: None,
            stop: false,
            events_buf: Vec::new(),
            turn_leave: SimTime::ZERO,
            detached: HashMap::default(),
            frontends,
            kind_hashes: Vec::new(),
            leak_bytes: 0,
            shard,
            net_absorbed: None,
            sc,
        };
        for r in 0..n {
            sim.settle(r);
        }
        if sim.shard.is_none() {
            sim.record_reads_left = sim.sc.workload.record_reads;
        }
        Ok(sim)
    }

    /// Runs the scenario to the end and reports.
    pub fn run(mut self) -> Result<RunReport> {
        let wall = std::time::Instant::now();
        let cpu0 = thread_cpu_s();
        self.start();
        let end_workload = SimTime::ZERO + self.sc.duration;
        self.queue.push(end_workload, Ev::EndWorkload);
        let hard_end = end_workload + self.sc.drain_max;
        self.run_until(hard_end);
        if self.final_convergence.is_none() {
            self.explain_not_converged();
        }
        self.final_checks();
        let wall_s = wall.elapsed().as_secs_f64();
        let cpu_s = thread_cpu_s().zip(cpu0).map(|(b, a)| b - a);
        let mut report = self.report(wall_s);
        report.cpu_s = cpu_s;
        report.speedup_cpu = cpu_s.filter(|c| *c > 0.0).map(|c| report.virtual_s / c);
        Ok(report)
    }

    /// Queues the first events: each region's first request, each client's first
    /// probe round, the fault timeline (a shard: its own regions and clients only).
    fn start(&mut self) {
        for ri in 0..self.region_rate.len() {
            if self.region_rate[ri] > 0.0
                && !self.region_clients[ri].is_empty()
                && self.region_here(ri)
            {
                let dt = self.generator.interarrival(self.region_rate[ri]);
                self.queue
                    .push(SimTime::ZERO + dt, Ev::Issue { region: ri as u32 });
            }
        }
        for c in 0..self.clients.len() {
            if self.region_here(self.clients[c].region) {
                self.queue
                    .push(SimTime::ZERO, Ev::Probe { client: c as u32 });
            }
        }
        // Split, the coordinator runs the timeline at global instants (`shard.rs`).
        for (i, f) in self.sc.faults.iter().enumerate() {
            if f.at < self.sc.duration && self.shard.is_none() {
                self.queue
                    .push(SimTime::ZERO + f.at, Ev::FaultStart(i as u32));
            }
        }
    }

    /// Whether this run (or shard) runs replica `r`.
    fn replica_here(&self, r: usize) -> bool {
        self.shard.as_ref().is_none_or(|c| c.replica[r] == c.me)
    }

    /// Whether this run (or shard) runs the clients of `region`.
    fn region_here(&self, region: usize) -> bool {
        self.shard.as_ref().is_none_or(|c| c.region[region] == c.me)
    }

    /// Queues `ev` at `at` here, or hands it to shard `to` with the window's
    /// crossing (it is due in a later window: `at` is at least one cross-shard latency
    /// away).
    fn push_to(&mut self, to: Option<u8>, at: SimTime, ev: Ev) {
        match (to, self.shard.as_mut()) {
            (Some(k), Some(ctx)) if k != ctx.me => {
                debug_assert!(
                    at >= ctx.due_min,
                    "an event for another shard is due inside the window: the lookahead is wrong"
                );
                ctx.outbox.push((k, at, ev));
            }
            _ => self.queue.push(at, ev),
        }
    }

    /// The shard of replica `r` (`None` when the run is not split).
    fn shard_of_replica(&self, r: usize) -> Option<u8> {
        self.shard.as_ref().map(|c| c.replica[r])
    }

    /// The shard of `region`'s clients.
    fn shard_of_region(&self, region: usize) -> Option<u8> {
        self.shard.as_ref().map(|c| c.region[region])
    }

    // ---- the event loop ---------------------------------------------------------

    /// Handles every event due before `end` (a shard's window: `end` excluded).
    fn run_before(&mut self, end: SimTime) {
        while self.next_time().is_some_and(|t| t < end) {
            self.run_until(self.next_time().expect("checked"));
        }
    }

    fn run_until(&mut self, end: SimTime) {
        loop {
            if self.stop {
                return;
            }
            let tq = self.queue.peek_time();
            let tn = self.net.next_delivery();
            let net_first = match (tn, tq) {
                (Some(a), Some(b)) => a <= b,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return,
            };
            let next = if net_first { tn } else { tq }.expect("one is some");
            if next > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(next);
            self.metrics.counters.events += 1;
            if net_first {
                let d = self
                    .net
                    .pop_delivery(next)
                    .expect("a delivery is due at its time");
                self.deliver(d.from.index(), d.to.index(), d.msg, d.bytes);
            } else {
                let (_, ev) = self.queue.pop().expect("peeked");
                self.handle(ev);
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Timer { r, generation } => self.on_timer(r as usize, generation),
            Ev::Issue { region } => self.on_issue(region as usize),
            Ev::Request {
                op,
                attempt,
                r,
                client,
                write,
                remote,
            } => self.on_request(op, attempt, r as usize, client as usize, write, remote),
            Ev::Response {
                op,
                attempt,
                r,
                reply,
                received,
            } => self.on_response(op, attempt as usize, r as usize, reply, received),
            Ev::Wake { op } => self.on_wake(op),
            Ev::Jobs { r } => self.on_jobs(r as usize),
            Ev::Backup {
                job,
                scope,
                call,
                at,
            } => self.on_backup(job as usize, scope as usize, call, at),
            Ev::Inbox { r, generation } => self.on_inbox(r as usize, generation),
            Ev::Silence { op, attempt } => self.on_silence(op, attempt),
            Ev::Probe { client } => self.on_probe(client as usize),
            Ev::ProbeRequest { client, r, sent_at } => {
                self.on_probe_request(client as usize, r as usize, sent_at)
            }
            Ev::ProbeReply {
                client,
                r,
                sent_at,
                wms,
            } => self.on_probe_reply(client as usize, r as usize, sent_at, wms),
            Ev::ProbeTimeout { client, r, sent_at } => {
                self.on_probe_timeout(client as usize, r as usize, sent_at)
            }
            Ev::FaultStart(i) => self.fault_start(i as usize),
            Ev::FaultEnd(i) => self.fault_end(i as usize),
            Ev::Rollout { fault, step } => self.rollout_step(fault as usize, step as usize),
            Ev::CatchUpCheck => self.on_catch_up_check(),
            Ev::EndWorkload => self.on_end_workload(),
            Ev::DrainCheck => self.on_drain_check(),
        }
    }

    fn trace(&mut self, words: [u64; 4]) {
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&self.now.as_us().to_le_bytes());
        for (i, w) in words.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        self.trace.0.update(&b);
    }

    // ---- replicas ---------------------------------------------------------------

    /// After any input to replica `r`: flush, send what it transmits, handle its
    /// events, re-arm its timer.
    fn settle(&mut self, r: usize) {
        let jobs_again = self.step_jobs(r);
        let now = self.now;
        let node = &mut self.nodes[r];
        let nw = node.now(now);
        let life = node.life;
        let Some(rep) = node.replica.as_mut() else {
            return;
        };
        if let Err(e) = rep.flush(nw) {
            self.checks.other_violations += 1;
            self.checks
                .violation(format!("{}: flush failed: {e}", node.id));
        }
        // A turn that wrote waits for the group commit that makes it durable: its
        // frames leave and its writes are acknowledged then (`crate::host`).
        let leave = match node.turn.take() {
            Some(ready) => node.host.commit(ready.max(now)),
            None => now,
        };
        self.turn_leave = leave;
        if jobs_again && node.jobs_at.is_none() {
            let at = leave.max(now + SimDuration::from_us(1));
            node.jobs_at = Some(at);
            self.queue.push(at, Ev::Jobs { r: r as u32 });
        }
        // As the node's turn: rows a migration's flip moved away go once the new
        // placement is in force here.
        match rep.purge_moved_rows() {
            Ok(purged) => {
                for p in purged {
                    self.metrics.counters.rows_purged += p.rows;
                }
            }
            Err(e) => {
                self.checks.other_violations += 1;
                self.checks
                    .violation(format!("{}: purge failed: {e}", node.id));
            }
        }
        while let Some(t) = rep.poll_transmit() {
            let Some(to) = self.names.get(t.to.as_str()) else {
                rep.handle_sent(&t.to, t.bytes);
                continue;
            };
            let kind = t.frame.kind();
            // What the frame takes on the wire (the replica's own flow control
            // keeps its estimate, `t.bytes`).
            if node.links.len() <= to {
                node.links.resize_with(to + 1, LinkEncoder::default);
            }
            let wire_bytes = node.links[to].measure(&t.frame);
            let count = self.metrics.counters.frames_sent.entry(kind).or_default();
            count.frames += 1;
            count.items += t.frame.items() as u64;
            count.bytes += wire_bytes as u64;
            note_wire(&mut self.checks, &self.scopes, &self.names, &t.frame, now);
            // Frames leave once the turn is committed; a snapshot chunk once its
            // rows are read too.
            let at = match &t.frame {
                Frame::SnapshotChunk(c) => {
                    let cost = node.host.model().snapshot;
                    leave.max(node.host.run_driver(
                        now,
                        Work::Snapshot,
                        cost,
                        c.rows.len(),
                        t.bytes,
                    ))
                }
                _ => leave,
            };
            let out = self.net.send_idx(
                at,
                crate::net::ReplicaIdx::new(r),
                crate::net::ReplicaIdx::new(to),
                Wire {
                    frame: t.frame,
                    life,
                },
                t.bytes,
            );
            if matches!(out, crate::net::SendOutcome::Dropped { .. }) {
                rep.handle_sent(&t.to, t.bytes);
            }
            let mut b = [0u8; 40];
            b[..8].copy_from_slice(&now.as_us().to_le_bytes());
            b[8..16].copy_from_slice(&(r as u64).to_le_bytes());
            b[16..24].copy_from_slice(&(to as u64).to_le_bytes());
            let kind_hash = match self
                .kind_hashes
                .iter()
                .find(|(k, _)| std::ptr::eq(*k, kind))
            {
                Some(&(_, h)) => h,
                None => {
                    let h = xxh3_64(kind.as_bytes());
                    self.kind_hashes.push((kind, h));
                    h
                }
            };
            b[24..32].copy_from_slice(&kind_hash.to_le_bytes());
            b[32..40].copy_from_slice(&(t.bytes as u64).to_le_bytes());
            self.trace.0.update(&b);
        }
        let mut events = std::mem::take(&mut self.events_buf);
        while let Some(e) = rep.poll_event() {
            events.push(e);
        }
        let timeout = rep.poll_timeout();
        if let Some(t) = timeout
            && node.timer_at != Some(t)
        {
            node.timer_gen += 1;
            node.timer_at = Some(t);
            let generation = node.timer_gen;
            self.queue.push(
                SimTime::from_us(t).max(now),
                Ev::Timer {
                    r: r as u32,
                    generation,
                },
            );
        }
        for e in events.drain(..) {
            self.on_replica_event(r, e);
        }
        self.events_buf = events;
        self.update_gate(r);
    }

    /// After a flush of a restarted replica: advances its readiness gate, and
    /// drops it once open.
    fn update_gate(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        let (Some(gate), Some(rep)) = (node.gate.as_mut(), node.replica.as_ref()) else {
            return;
        };
        let relearning: Vec<ScopeId> = rep.relearning_scopes().cloned().collect();
        gate.update(
            std::time::Duration::from_micros(self.now.as_us()),
            rep.stats().frames_received,
            rep.stream_progress(),
            &rep.unheard_scopes(),
            &relearning,
        );
        if *gate.phase() == GatePhase::Ready {
            node.gate = None;
            self.trace([55, r as u64, 0, 0]);
        }
    }

    fn on_timer(&mut self, r: usize, generation: u64) {
        let node = &mut self.nodes[r];
        if node.timer_gen != generation {
            return;
        }
        node.timer_at = None;
        if node.paused > 0 {
            return; // re-armed on resume
        }
        let nw = node.now(self.now);
        let Some(rep) = node.replica.as_mut() else {
            return;
        };
        if let Err(e) = rep.handle_timeout(nw) {
            self.checks.other_violations += 1;
            let id = node.id.clone();
            self.checks.violation(format!("{id}: timeout failed: {e}"));
        }
        self.settle(r);
    }

    fn deliver(&mut self, from: usize, to: usize, msg: Wire, bytes: usize) {
        self.metrics.counters.messages_delivered += 1;
        // The frame has left the sender's transport: release its in-flight bytes,
        // unless the sender restarted since sending it.
        let to_id = self.nodes[to].id.clone();
        let sender = &mut self.nodes[from];
        if sender.foreign {
            // Its shard releases the bytes when it takes in this window's crossing.
            if let Some(ctx) = self.shard.as_mut() {
                ctx.sent_back.push((from, to, bytes, Some(msg.life)));
            }
        } else if sender.life == msg.life
            && let Some(rep) = sender.replica.as_mut()
        {
            rep.handle_sent(&to_id, bytes);
        }
        self.check_residency(from, to, &msg.frame, bytes);
        debug_assert!(
            !self.nodes[to].foreign,
            "a frame for another shard's replica was delivered here"
        );
        let node = &mut self.nodes[to];
        if node.paused > 0 {
            node.held_frames.push_back((from, msg, bytes));
            return;
        }
        self.enqueue(from, to, msg.frame, bytes);
    }

    /// A frame of `bytes` reached replica `to`'s host: it waits its turn for a
    /// core, behind every frame that arrived before it, and is applied when the
    /// core is done (at once when it costs nothing and nothing is ahead).
    fn enqueue(&mut self, from: usize, to: usize, frame: Frame, bytes: usize) {
        let now = self.now;
        let node = &mut self.nodes[to];
        if node.replica.is_none() {
            return; // no process to take it
        }
        let entries = match &frame {
            Frame::Mutations(es) => es.len(),
            Frame::GapFill(g) => g.entries.len(),
            Frame::SnapshotChunk(c) => c.rows.len(),
            Frame::Heartbeats(_) | Frame::GapRequest(_) | Frame::SnapshotRequest { .. } => 0,
        };
        let behind = node.inbox.back().map_or(now, |b| b.ready.max(now));
        let ready = match entries {
            0 => behind,
            n => {
                let cost = node.host.model().apply;
                node.host
                    .run_driver(now, Work::Apply, cost, n, bytes)
                    .max(behind)
            }
        };
        if ready == now && node.inbox.is_empty() {
            self.handle_frame(from, to, frame);
            return;
        }
        if node.inbox.is_empty() {
            node.inbox_gen += 1;
            let generation = node.inbox_gen;
            self.queue.push(
                ready,
                Ev::Inbox {
                    r: to as u32,
                    generation,
                },
            );
        }
        node.inbox.push_back(Inbound { ready, from, frame });
    }

    /// Replica `r`'s host is done with the frames at the head of its inbox.
    fn on_inbox(&mut self, r: usize, generation: u64) {
        if self.nodes[r].inbox_gen != generation || self.nodes[r].paused > 0 {
            return; // stale, or paused (`resume` hands the inbox on)
        }
        while let Some(head) = self.nodes[r].inbox.front()
            && head.ready <= self.now
        {
            let Inbound { from, frame, .. } = self.nodes[r].inbox.pop_front().expect("peeked");
            self.handle_frame(from, r, frame);
        }
        self.schedule_inbox(r);
    }

    /// Queues the turn of the frame at the head of replica `r`'s inbox.
    fn schedule_inbox(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        if let Some(head) = node.inbox.front() {
            node.inbox_gen += 1;
            let (at, generation) = (head.ready.max(self.now), node.inbox_gen);
            self.queue.push(
                at,
                Ev::Inbox {
                    r: r as u32,
                    generation,
                },
            );
        }
    }

    fn handle_frame(&mut self, from: usize, to: usize, frame: Frame) {
        let from_id = self.nodes[from].id.clone();
        let node = &mut self.nodes[to];
        let nw = node.now(self.now);
        let Some(rep) = node.replica.as_mut() else {
            return;
        };
        let heartbeats = matches!(frame, Frame::Heartbeats(_));
        if matches!(
            frame,
            Frame::Mutations(_) | Frame::GapFill(_) | Frame::SnapshotChunk(_)
        ) {
            node.turn.get_or_insert(self.now);
        }
        if let Err(e) = rep.handle_frame(nw, &from_id, frame) {
            self.checks.other_violations += 1;
            let id = node.id.clone();
            self.checks
                .violation(format!("{id}: frame from {from_id} failed: {e}"));
        }
        if heartbeats && !self.replication_waits.is_empty() {
            self.answer_replication_waits(to);
        }
        self.settle(to);
    }

    /// Regions besides `r`'s a write to `scope` at `r` waits for
    /// (`Workload::write_ack`); `None` when the policy spans fewer than asked
    /// (the node refuses such a write before writing).
    fn regions_to_wait_for(&self, r: usize, scope: &ScopeId) -> Option<usize> {
        let others = || {
            let rep = self.nodes[r].replica.as_ref()?;
            let (_, all) = rep.regions_applied(scope, rep.id(), 0)?;
            let own = &self.views[self.nodes[r].view]
                .topology
                .replicas
                .get(rep.id())?
                .region;
            Some(all.len() - usize::from(all.contains(own)))
        };
        match self.sc.workload.write_ack {
            WriteAck::Origin => Some(0),
            WriteAck::AllRegions => others(),
            WriteAck::Regions(n) => others().filter(|o| *o >= n as usize).map(|_| n as usize),
        }
    }

    /// Acknowledges the writes waiting at `r` that its reports now show applied in
    /// enough other regions; forgets those whose client gave up.
    fn answer_replication_waits(&mut self, r: usize) {
        let mut i = 0;
        while i < self.replication_waits.len() {
            let w = &self.replication_waits[i];
            if w.r as usize != r {
                i += 1;
                continue;
            }
            if self.ops.get(w.op).is_none() {
                let w = self.replication_waits.swap_remove(i);
                self.batch_waits.remove(&(w.op, w.attempt, w.r));
                continue;
            }
            let reached = self.nodes[r].replica.as_ref().and_then(|rep| {
                let (mut reached, _) =
                    rep.regions_applied(&w.token.scope, rep.id(), w.token.sequence)?;
                let view = &self.views[self.nodes[r].view];
                reached.remove(&view.topology.replicas.get(rep.id())?.region);
                Some(reached.len())
            });
            if reached.is_some_and(|n| n >= w.regions) {
                let w = self.replication_waits.remove(i);
                self.row_done(self.now, w.op, w.attempt, r, w.client as usize, w.token);
            } else {
                i += 1;
            }
        }
    }

    /// A row a write proposed at replica `r` is durable (and applied in the
    /// regions the write waits for) by `at`: a single write is answered then, a
    /// batch once its last row is.
    fn row_done(
        &mut self,
        at: SimTime,
        op: OpRef,
        attempt: u16,
        r: usize,
        client: usize,
        token: Token,
    ) {
        let key = (op, attempt, r as u32);
        let (token, failed_rows) = match self.batch_waits.get_mut(&key) {
            None => (Some(token), 0),
            Some(b) => {
                let row = (self.scopes.get(token.scope.as_str()), token.sequence);
                if b.first
                    .is_some_and(|(s, seq)| (Some(s as usize), seq) == row)
                {
                    b.token = Some(token);
                }
                b.left -= 1;
                if b.left > 0 {
                    return;
                }
                let b = self.batch_waits.remove(&key).expect("found above");
                (b.token, b.failed)
            }
        };
        let reply = Reply::Ok {
            wm: None,
            token,
            failed_rows,
        };
        self.answer_at(at, op, attempt, r, client, reply, ENVELOPE_BYTES);
    }

    /// I10: bytes of a restricted scope delivered to a replica outside its policy
    /// (under the newest deployment and under the sender's own view).
    fn check_residency(&mut self, from: usize, to: usize, frame: &Frame, bytes: usize) {
        let newest = self.views.len() - 1;
        let sender_view = self.nodes[from].view;
        let allowed = |sim: &Simulation, scope: &str| -> bool {
            let Some(s) = sim.scopes.get(scope) else {
                return false;
            };
            sim.allowed[newest][s][to] || sim.allowed[sender_view][s][to]
        };
        let leak: usize = match frame {
            Frame::Mutations(es) => es
                .iter()
                .filter(|e| !allowed(self, e.scope.as_str()))
                .map(residency_bytes)
                .sum(),
            Frame::Heartbeats(hbs) => hbs
                .iter()
                .filter(|h| !allowed(self, h.scope.as_str()))
                .map(|h| 48 + 24 * h.applied.len())
                .sum(),
            Frame::GapRequest(g) if !allowed(self, g.scope.as_str()) => bytes,
            Frame::GapFill(g) if !allowed(self, g.scope.as_str()) => bytes,
            Frame::SnapshotRequest { scope } if !allowed(self, scope.as_str()) => bytes,
            Frame::SnapshotChunk(c) if !allowed(self, c.scope.as_str()) => bytes,
            _ => 0,
        };
        if leak > 0 {
            self.residency_leak(from, to, frame, leak);
        }
    }

    fn residency_leak(&mut self, from: usize, to: usize, frame: &Frame, bytes: usize) {
        self.leak_bytes += bytes as u64;
        let (a, b) = (self.nodes[from].id.clone(), self.nodes[to].id.clone());
        self.checks.violation(format!(
            "I10: {a} sent {} bytes of a restricted scope to {b} ({})",
            bytes,
            frame.kind()
        ));
    }
}

/// CPU time of the calling thread in seconds (Linux; `None` elsewhere). Measurement
/// only: nothing in a run depends on it.
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

/// The seed of replica `i` in its `life`-th life.
fn replica_seed(seed: u64, i: usize, life: u32) -> u64 {
    xxh3_64(
        &[
            seed.to_le_bytes(),
            (i as u64).to_le_bytes(),
            u64::from(life).to_le_bytes(),
        ]
        .concat(),
    )
}

/// Lets `names` and `scopes` find the clones of `views`' ids without hashing.
fn pin_views(names: &mut Interner, scopes: &mut Interner, views: &[Arc<Deployment>]) {
    for v in views {
        for (id, r) in &v.topology.replicas {
            names.pin(id);
            names.pin(&r.id);
        }
        for region in v.topology.regions.values() {
            for id in &region.replicas {
                names.pin(id);
            }
        }
        for (s, p) in &v.placement.policies {
            scopes.pin(s);
            scopes.pin(&p.name);
        }
        for r in &v.placement.rules {
            scopes.pin(&r.policy);
        }
        for s in v.placement.table_defaults.values() {
            scopes.pin(s);
        }
    }
}

impl Simulation {
    fn on_replica_event(&mut self, r: usize, e: Event) {
        let c = &mut self.metrics.counters;
        match e {
            Event::Applied {
                scope,
                origin,
                sequence,
                ..
            } => {
                c.entries_applied += 1;
                let (Some(s), Some(o)) = (
                    self.scopes.get(scope.as_str()),
                    self.names.get(origin.as_str()),
                ) else {
                    return;
                };
                self.trace([1, r as u64, (s * 1024 + o) as u64, sequence]);
                let k = self.checks.idx(r, s, o);
                let prev = self.checks.applied[k];
                if sequence > prev + 1 {
                    self.checks.watermark_violations += 1;
                    self.checks.violation(format!(
                        "C2: {} applied {scope}/{origin} #{sequence} after #{prev}",
                        self.nodes[r].id
                    ));
                }
                self.checks.applied[k] = prev.max(sequence);
                // Replication lag: at replicas that store rows, for others' writes.
                if self.nodes[r].stores_rows && o != r {
                    let st = self.checks.stream(s, o);
                    if let Some(&t0) = self.checks.proposed_us[st].get((sequence - 1) as usize)
                        && t0 != u64::MAX
                    {
                        // Applied, and durable once this turn commits.
                        let lag_us = self.turn_leave.as_us().saturating_sub(t0);
                        metrics::record(&mut self.metrics.lag, lag_us);
                        let n = self.names.len();
                        self.metrics.lag_matrix[o * n + r].record(lag_us);
                        let b = self.bucket();
                        self.metrics.lag_series[b].record(lag_us);
                    }
                }
            }
            Event::WatermarkAdvanced {
                scope,
                origin,
                watermark,
            } => {
                let (Some(s), Some(o)) = (
                    self.scopes.get(scope.as_str()),
                    self.names.get(origin.as_str()),
                ) else {
                    return;
                };
                let k = self.checks.idx(r, s, o);
                let applied = self.checks.applied[k];
                if watermark.sequence > applied {
                    self.checks.watermark_violations += 1;
                    self.checks.violation(format!(
                        "C2: {} advertises {scope}/{origin} #{} but applied only #{applied}",
                        self.nodes[r].id, watermark.sequence
                    ));
                }
                let now_us = self.now.as_us();
                self.checks.note_durable(k, watermark.sequence, now_us);
                let prev = self.checks.advertised[k];
                let new = (watermark.sequence, watermark.timestamp);
                if new < prev {
                    self.checks.watermark_violations += 1;
                    self.checks.violation(format!(
                        "C3: {} watermark {scope}/{origin} went back from {prev:?} to {new:?}",
                        self.nodes[r].id
                    ));
                }
                self.checks.advertised[k] = prev.max(new);
            }
            Event::Committed(token) => {
                c.writes_acknowledged += 1;
                let (Some(s), Some(o)) = (
                    self.scopes.get(token.scope.as_str()),
                    self.names.get(token.origin.as_str()),
                ) else {
                    return;
                };
                self.trace([2, r as u64, (s * 1024 + o) as u64, token.sequence]);
                let st = self.checks.stream(s, o);
                let known = self.checks.streams[st]
                    .get((token.sequence - 1) as usize)
                    .is_some_and(|f| f.timestamp == token.timestamp.as_u64());
                if !known {
                    // Forwarded at flush, so normally already seen on the wire; a
                    // write with no peer to send to is still durable at its origin.
                    // The mutation is kept with the pending commit: the client may
                    // have given up on the write, which is applied all the same.
                    if let Some((_, _, _, m)) =
                        self.pending_commits
                            .get(&(r as u32, s as u32, token.sequence))
                    {
                        let m = m.clone();
                        let e = LogEntry {
                            scope: token.scope.clone(),
                            origin: token.origin.clone(),
                            sequence: token.sequence,
                            timestamp: token.timestamp,
                            mutation: m,
                        };
                        note_durable(&mut self.checks, &self.scopes, &self.names, &e);
                    }
                }
                self.checks.acked_max[st] = self.checks.acked_max[st].max(token.sequence);
                if let Some((op, attempt, client, _)) =
                    self.pending_commits
                        .remove(&(r as u32, s as u32, token.sequence))
                {
                    let regions = self.regions_to_wait_for(r, &token.scope).unwrap_or(0);
                    if regions > 0 {
                        if let Some(rep) = self.nodes[r].replica.as_mut() {
                            rep.want_reports(&token.scope, token.sequence);
                        }
                        self.replication_waits.push(ReplicationWait {
                            r: r as u32,
                            op,
                            attempt,
                            client,
                            token,
                            regions,
                        });
                        return;
                    }
                    self.row_done(self.turn_leave, op, attempt, r, client as usize, token);
                }
            }
            Event::SnapshotInstalled { scope, .. } => {
                c.snapshots_installed += 1;
                // Applied state jumps to the snapshot's watermarks.
                let Some(s) = self.scopes.get(scope.as_str()) else {
                    return;
                };
                self.trace([3, r as u64, s as u64, 0]);
                if let Some(rep) = self.nodes[r].replica.as_ref()
                    && let Ok(wms) = rep.storage().watermarks()
                {
                    for (ws, o, w) in wms {
                        if ws == scope
                            && let Some(o) = self.names.get(o.as_str())
                        {
                            let k = self.checks.idx(r, s, o);
                            self.checks.applied[k] = self.checks.applied[k].max(w.sequence);
                        }
                    }
                }
            }
            Event::GapDetected { .. } => {
                c.gap_requests += 1;
                self.trace([4, r as u64, 0, 0]);
            }
            Event::PeerSuspected(p) => {
                c.peer_suspicions += 1;
                let p = self.names.get(p.as_str()).unwrap_or(usize::MAX);
                self.trace([5, r as u64, p as u64, 0]);
            }
            Event::PeerRecovered(p) => {
                let p = self.names.get(p.as_str()).unwrap_or(usize::MAX);
                self.trace([6, r as u64, p as u64, 0]);
            }
            Event::Rejected { reason, .. } => {
                *c.frames_rejected
                    .entry(reason.as_str().to_owned())
                    .or_default() += 1;
                self.trace([7, r as u64, 0, 0]);
            }
            Event::TreeChanged { .. } | Event::SnapshotNeeded { .. } => {
                self.trace([8, r as u64, 0, 0]);
            }
            // Location entries come from migration jobs alone, which write valid
            // entries and flip only after their checkpoint says so.
            Event::LocationRefused(invalid) => {
                self.checks.other_violations += 1;
                let id = self.nodes[r].id.clone();
                self.checks
                    .violation(format!("{id}: location entry not in force: {invalid}"));
            }
            Event::PurgeWithheld { table, policy, .. } => {
                self.checks.other_violations += 1;
                let id = self.nodes[r].id.clone();
                self.checks.violation(format!(
                    "{id}: an entry moved rows of {table} to {policy} without a migration flip"
                ));
            }
            // Simulated replicas restart on their stores and never relearn their
            // streams.
            Event::OwnStreamLearned { .. } => {}
        }
    }

    /// The time-series bucket of now.
    fn bucket(&self) -> usize {
        let b = (self.now.as_us() / self.metrics.bucket_us) as usize;
        b.min(self.metrics.lag_series.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    //! The checkers must catch what they claim to: each test breaks one thing on
    //! purpose and expects the matching violation.
    use super::*;
    use pangea_core::storage::Watermark;
    use pangea_core::storage::{RowWrite, WriteBatch};
    use std::path::Path;

    fn small() -> Scenario {
        let topo = r#"
name = "three"
intra_region_rtt_ms = 1.0
[[continents]]
name = "c"
  [[continents.regions]]
  name = "r1"
    [[continents.regions.replicas]]
    id = "a"
    role = "serving"
    [[continents.regions.replicas]]
    id = "b"
    role = "serving"
  [[continents.regions]]
  name = "r2"
    [[continents.regions.replicas]]
    id = "c"
    role = "serving"
[[links]]
a = "r1"
b = "r2"
rtt_ms = 30.0
"#;
        let t = pangea_topology::Topology::parse(Path::new("three.toml"), topo).unwrap();
        let p = pangea_topology::Placement::parse(
            Path::new("p.toml"),
            "[[tables]]\nname = \"t\"\n[[tables.families]]\nname = \"f\"\nmax_versions = 1\n\
             [[tables.families]]\nname = \"n\"\ntype = \"counter\"\n",
            &t,
        )
        .unwrap();
        let d = Arc::new(Deployment {
            topology: t,
            placement: p,
        });
        let mut sc = Scenario::new("three", d.clone(), 3, SimDuration::from_secs(3));
        sc.workload = crate::scenario::Workload::ad_serving(&d, 200.0);
        sc
    }

    fn run_to(sim: &mut Simulation, t: SimTime) {
        let regions: Vec<usize> = (0..sim.region_rate.len()).collect();
        for ri in regions {
            if sim.region_rate[ri] > 0.0 {
                sim.queue
                    .push(SimTime::ZERO, Ev::Issue { region: ri as u32 });
            }
        }
        sim.run_until(t);
        sim.workload_on = false;
        sim.run_until(t + SimDuration::from_secs(5));
    }

    /// A region's fill writes every row of its prefix and of the global prefix
    /// once, in key order, before its mix: with a mix of reads only, the rows
    /// are there all the same, and on every replica.
    #[test]
    fn a_fill_writes_every_row_once_before_the_mix() {
        let mut sc = small();
        sc.workload.keys = 40;
        sc.workload.prefixes.insert("c".into(), "c/".into());
        (sc.workload.read, sc.workload.write, sc.workload.delete) = (1.0, 0.0, 0.0);
        let read_only = sc.clone();
        for l in &mut sc.workload.regions {
            l.fill = l.region.as_str() == "r1";
        }
        let rows = |sc: Scenario| {
            let mut sim = Simulation::new(sc).unwrap();
            run_to(&mut sim, SimTime::from_secs(2));
            assert!(
                sim.checks.violations.is_empty(),
                "{:?}",
                sim.checks.violations
            );
            let mut keys: Vec<usize> = sim
                .nodes
                .iter()
                .map(|n| {
                    let r = n.replica.as_ref().unwrap();
                    r.storage().rows().filter(|(t, ..)| &***t == "t").count()
                })
                .collect();
            keys.dedup();
            keys
        };
        assert_eq!(rows(read_only), vec![0], "reads alone write nothing");
        // r1's prefix and the global one: 2 x 40 rows, everywhere.
        assert_eq!(rows(sc), vec![80]);
    }

    /// C7 asks what a heard replica held durably at a past instant, from the
    /// history it keeps: it flags a reader that lacks a write the other had by
    /// then, not one the other applied only later, and keeps the value from before
    /// its horizon.
    #[test]
    fn c7_finds_a_write_a_heard_replica_had_by_then() {
        let mut sim = Simulation::new(small()).unwrap();
        let c = &mut sim.checks;
        let (reader, heard, origin, s) = (0, 1, 2, 0);
        let k = c.idx(heard, s, origin);
        c.note_durable(k, 4, 1_000_000);
        c.note_durable(k, 9, 3_000_000);
        // By 2 s it had #4: a reader holding #4 lacks nothing, one holding #3 does.
        assert_eq!(c.lacked(reader, s, origin, 4, &[(heard, 2_000_000)]), None);
        assert_eq!(
            c.lacked(reader, s, origin, 3, &[(heard, 2_000_000)]),
            Some((heard, 4))
        );
        // By 3 s it had #9; before anything, nothing.
        assert_eq!(
            c.lacked(reader, s, origin, 4, &[(heard, 3_000_000)]),
            Some((heard, 9))
        );
        assert_eq!(c.lacked(reader, s, origin, 0, &[(heard, 500_000)]), None);
        // The origin itself is not asked (it is the one gone quiet).
        assert_eq!(c.lacked(reader, s, origin, 0, &[(origin, 3_000_000)]), None);
        // Far later, the change before the horizon still answers for its time.
        c.note_durable(k, 12, 20_000_000);
        assert_eq!(
            c.lacked(reader, s, origin, 9, &[(heard, 15_000_000)]),
            None,
            "#9 from 3 s on"
        );
        assert_eq!(
            c.lacked(reader, s, origin, 9, &[(heard, 20_000_000)]),
            Some((heard, 12))
        );
        // Advances of the watermark's time alone record nothing: #12 still
        // dates from 20 s, and the history holds no more than before.
        let held = c.durable_history[k].len();
        c.note_durable(k, 12, 21_000_000);
        c.note_durable(k, 12, 22_000_000);
        assert_eq!(c.durable_history[k].len(), held);
        assert_eq!(
            c.lacked(reader, s, origin, 9, &[(heard, 19_000_000)]),
            None,
            "#12 not before 20 s"
        );
        assert_eq!(c.durable_at(k, 22_000_000), 12);
    }

    #[test]
    fn frames_from_the_other_shard_arrive_with_this_shards_ids_and_memory() {
        let sc = small();
        let sim = Simulation::new(sc.clone()).unwrap();
        // As the other shard's replicas would send them: names from its own copy.
        let other = sc.detached();
        let origin = other.deployment.topology.replicas.keys().next().unwrap();
        let hb = pangea_core::frame::Heartbeat {
            scope: ScopeId::global(),
            origin: origin.clone(),
            sequence: 3,
            timestamp: Timestamp::from_u64(5),
            applied: vec![(origin.clone(), Watermark::default())].into(),
            purge: Timestamp::ZERO,
            tree_edge: true,
            report_after: 0,
        };
        let entry = LogEntry {
            scope: ScopeId::global(),
            origin: origin.clone(),
            sequence: 1,
            timestamp: Timestamp::from_u64(7),
            mutation: RowMutation::new(
                "t",
                Bytes::from(b"user:1".to_vec()),
                vec![Mutation::DeleteFromRow],
                &Limits::default(),
            )
            .unwrap(),
        };
        let sent = [Frame::Heartbeats(vec![hb]), Frame::Mutations(vec![entry])];
        let mut got = sent.clone();
        let mut copies = shard::Copies::default();
        for f in &mut got {
            sim.take_over(f, &mut copies);
        }
        assert_eq!(got, sent);
        let own = sim.nodes[0].id.as_str().as_ptr();
        assert_ne!(origin.as_str().as_ptr(), own);
        let [Frame::Heartbeats(hbs), Frame::Mutations(es)] = &got else {
            unreachable!()
        };
        assert_eq!(hbs[0].origin.as_str().as_ptr(), own);
        assert_eq!(hbs[0].applied[0].0.as_str().as_ptr(), own);
        assert_eq!(es[0].origin.as_str().as_ptr(), own);
        let Frame::Mutations(was) = &sent[1] else {
            unreachable!()
        };
        assert_ne!(
            es[0].mutation.row_key().as_ptr(),
            was[0].mutation.row_key().as_ptr()
        );
        // So do the watermarks of a probe reply.
        let mut wm = ScopeWatermarks::new(ScopeId::global());
        wm.insert(origin.clone(), Watermark::default());
        let mut ev = Ev::ProbeReply {
            client: 0,
            r: 0,
            sent_at: SimTime::ZERO,
            wms: Some(vec![(0, wm.clone())]),
        };
        sim.take_over_event(&mut ev, &mut copies);
        let Ev::ProbeReply { wms: Some(wms), .. } = &ev else {
            unreachable!()
        };
        assert_eq!(wms[0].1, wm);
        let (id, _) = wms[0].1.iter().next().unwrap();
        assert_eq!(id.as_str().as_ptr(), own);
        // And a watermark read served across: its key, scope and token.
        let token = Token {
            scope: ScopeId::global(),
            origin: origin.clone(),
            sequence: 1,
            timestamp: Timestamp::from_u64(7),
        };
        let key = Bytes::from(b"user:1".to_vec());
        let mut ev = Ev::Request {
            op: OpRef {
                slot: 0,
                generation: 0,
            },
            attempt: 0,
            r: 0,
            client: 0,
            write: None,
            remote: Some(Box::new(RemoteRead {
                key: key.clone(),
                consistency: Consistency::Watermark(token.clone()),
            })),
        };
        sim.take_over_event(&mut ev, &mut copies);
        let Ev::Request {
            remote: Some(r), ..
        } = &ev
        else {
            unreachable!()
        };
        assert_eq!(
            (&r.key, &r.consistency),
            (&key, &Consistency::Watermark(token))
        );
        assert_ne!(r.key.as_ptr(), key.as_ptr());
        let Consistency::Watermark(t) = &r.consistency else {
            unreachable!()
        };
        assert_eq!(t.origin.as_str().as_ptr(), own);
    }

    /// `small`'s topology with the placement `text`.
    fn small_with_placement(text: &str) -> Arc<Deployment> {
        let topology = small().deployment.topology.clone();
        let placement =
            pangea_topology::Placement::parse(Path::new("p.toml"), text, &topology).unwrap();
        Arc::new(Deployment {
            topology,
            placement,
        })
    }

    /// `small` with a policy `r1` (region r1 alone) and, at 1 s, a migration of
    /// every row the workload writes (`g/`) from `global` into it.
    fn small_moving_to_r1() -> Scenario {
        let d = small_with_placement(
            "[[tables]]\nname = \"t\"\n[[tables.families]]\nname = \"f\"\nmax_versions = 1\n\
             [[policies]]\nname = \"r1\"\nregions = [\"r1\"]\n",
        );
        let mut sc = Scenario::new("moving", d.clone(), 3, SimDuration::from_secs(4));
        sc.workload = crate::scenario::Workload::ad_serving(&d, 200.0);
        sc.faults.push(Fault {
            at: SimDuration::from_secs(1),
            duration: None,
            label: "migrate g/ to r1".into(),
            kind: FaultKind::Migrate {
                table: "t".into(),
                prefix: "g/".into(),
                to: "r1".into(),
                home: String::new(),
            },
        });
        sc
    }

    /// `small` with a change stream on `t`, increments in the mix, and at 1 s:
    /// replica `c` (alone in r2) lost for 2 s, and a backup from r2 that reads
    /// from it first (deadline 500 ms).
    fn small_backup_through_a_loss() -> Scenario {
        let d = small_with_placement(
            "[[tables]]\nname = \"t\"\nchanges = { retention = \"1h\" }\n\
             [[tables.families]]\nname = \"f\"\nmax_versions = 1\n\
             [[tables.families]]\nname = \"n\"\ntype = \"counter\"\n",
        );
        let mut sc = Scenario::new("backup", d.clone(), 3, SimDuration::from_secs(3));
        sc.workload = crate::scenario::Workload::ad_serving(&d, 300.0);
        sc.workload.increment = 0.05;
        sc.workload.counter_family = "n".into();
        sc.faults.push(Fault {
            at: SimDuration::from_secs(1),
            duration: Some(SimDuration::from_secs(2)),
            label: "lose c".into(),
            kind: FaultKind::Lose {
                replicas: vec!["c".into()],
                regions: Vec::new(),
                silent: true,
            },
        });
        sc.faults.push(Fault {
            at: SimDuration::from_secs(1),
            duration: None,
            label: "backup from r2".into(),
            kind: FaultKind::Backup {
                region: "r2".into(),
                app_profile: "frontend".into(),
                policies: Vec::new(),
                deadline: SimDuration::from_ms(500),
            },
        });
        sc
    }

    fn run_backup(sc: Scenario, bug: Option<backup::Bug>) -> Simulation {
        let mut sim = Simulation::new(sc).unwrap();
        sim.backup_bug = bug;
        sim.queue.push(SimTime::from_secs(1), Ev::FaultStart(0));
        sim.queue.push(SimTime::from_secs(1), Ev::FaultStart(1));
        run_to(&mut sim, SimTime::from_secs(3));
        sim
    }

    /// A backup whose first replica goes silent finds out by the deadline,
    /// reads the scope from the next one, and holds exactly the writes up to
    /// its cut, counters included (C10).
    #[test]
    fn a_backup_fails_over_from_a_lost_replica_and_holds_its_cut() {
        let sim = run_backup(small_backup_through_a_loss(), None);
        assert!(
            sim.checks.violations.is_empty(),
            "{:?}",
            sim.checks.violations
        );
        let b = &sim.backup_summaries[0];
        let s = &b.scopes[0];
        assert_eq!(
            (s.scope.as_str(), s.state.as_str()),
            ("global", "done"),
            "{b:?}"
        );
        assert_eq!(s.failovers, ["no answer from c within 500 ms"], "{b:?}");
        assert_eq!(s.replica, "a");
        assert!(s.exact && s.rows > 0 && s.changes > 0, "{b:?}");
        assert!(s.rows_checked >= s.rows);
        // Found out by the deadline, then read over a 30 ms round trip.
        assert!(b.end_s.unwrap() > 1.5, "{b:?}");
    }

    /// C10 can fail: a backup that leaves its tail out is told apart from the
    /// writes up to its cut; one that leaves rows out, from the writes up to its
    /// start (a table without a change stream, so a backup not exact).
    #[test]
    fn the_backup_check_catches_a_lost_tail_or_lost_rows() {
        let sim = run_backup(small_backup_through_a_loss(), Some(backup::Bug::DropsTail));
        let s = &sim.backup_summaries[0].scopes[0];
        assert!(s.exact && s.state.starts_with("wrong: "), "{s:?}");
        assert!(
            sim.checks
                .violations
                .iter()
                .any(|v| v.starts_with("C10: backup from r2: scope global: ")),
            "{:?}",
            sim.checks.violations
        );
        let mut sc = small_backup_through_a_loss();
        sc.deployment = small().deployment; // no change stream
        for bug in [None, Some(backup::Bug::DropsRows)] {
            let sim = run_backup(sc.clone(), bug);
            let s = &sim.backup_summaries[0].scopes[0];
            assert!(!s.exact, "{s:?}");
            match bug {
                None => assert!(s.state == "done" && s.rows_checked > 0, "{s:?}"),
                Some(_) => assert!(
                    s.state.contains("it lacks writes before its start"),
                    "{s:?}"
                ),
            }
        }
    }

    /// A migration runs to its end on its runner; the replica outside the new
    /// policy purges the rows, its frontends, refused after the flip, refresh
    /// their location metadata and plan again; and the convergence check catches
    /// a moved row left behind (I10 at rest).
    #[test]
    fn a_migration_moves_rows_and_the_check_catches_a_row_left_behind() {
        let mut sim = Simulation::new(small_moving_to_r1()).unwrap();
        sim.queue.push(SimTime::from_secs(1), Ev::FaultStart(0));
        run_to(&mut sim, SimTime::from_secs(4));
        assert_eq!(sim.migrations.len(), 1);
        let m = &sim.migrations[0];
        assert_eq!(
            (m.runner.as_str(), m.phase.as_str()),
            ("a", "done"),
            "{m:?}"
        );
        assert!(m.rows_copied > 0 && m.rows_copied >= m.rows_total, "{m:?}");
        let c = sim.nodes[2].replica.as_ref().unwrap();
        assert_eq!(c.storage().rows().filter(|(t, ..)| &***t == "t").count(), 0);
        assert!(sim.metrics.counters.rows_purged > 0);
        assert!(sim.metrics.counters.policy_refreshes > 0);
        assert!(
            sim.checks.violations.is_empty(),
            "{:?}",
            sim.checks.violations
        );
        assert_eq!(sim.digests_agree(), Ok(()));
        // c keeps one moved row after all.
        let (table, key, row) = {
            let a = sim.nodes[0].replica.as_ref().unwrap();
            let (t, k, r) = a.storage().rows().find(|(t, ..)| &***t == "t").unwrap();
            (t.clone(), k.clone(), r.clone())
        };
        let c = sim.nodes[2].replica.as_mut().unwrap();
        c.storage_mut()
            .write(WriteBatch {
                rows: vec![RowWrite {
                    table,
                    key,
                    row: Some(row),
                }],
                ..WriteBatch::default()
            })
            .unwrap();
        let err = sim.digests_agree().unwrap_err();
        assert!(
            err.starts_with("c: holds a row") && err.contains("I10 at rest"),
            "{err}"
        );
    }

    #[test]
    fn c5_catches_a_replica_that_lost_a_row() {
        let mut sim = Simulation::new(small()).unwrap();
        run_to(&mut sim, SimTime::from_secs(3));
        assert_eq!(sim.digests_agree(), Ok(()), "a healthy run converges");
        let rep = sim.nodes[1].replica.as_mut().unwrap();
        let (table, key) = {
            let (t, k, _) = rep.storage().rows().next().expect("rows were written");
            (t.clone(), k.clone())
        };
        drop_row(&mut sim, 1, table, key);
        let err = sim.digests_agree().unwrap_err();
        assert!(err.starts_with("b: digest"), "{err}");
    }

    /// Deletes row `key` of `table` from node `n`'s store behind its back.
    fn drop_row(sim: &mut Simulation, n: usize, table: Arc<str>, key: Bytes) {
        let rep = sim.nodes[n].replica.as_mut().unwrap();
        rep.storage_mut()
            .write(WriteBatch {
                rows: vec![RowWrite {
                    table,
                    key,
                    row: None,
                }],
                ..WriteBatch::default()
            })
            .unwrap();
    }

    /// C8: with increments in the mix, every replica counts what was
    /// acknowledged; one that loses a counter's row is caught, naming it.
    #[test]
    fn c8_catches_a_replica_that_lost_an_increment() {
        let mut sc = small();
        (sc.workload.read, sc.workload.write, sc.workload.delete) = (0.5, 0.1, 0.0);
        sc.workload.increment = 0.4;
        sc.workload.counter_family = "n".into();
        let mut sim = Simulation::new(sc).unwrap();
        run_to(&mut sim, SimTime::from_secs(3));
        let counted: usize = sim.checks.counted.values().map(Vec::len).sum();
        assert!(counted > 50, "{counted} increments acknowledged");
        sim.final_checks();
        assert_eq!(sim.checks.lost_increments, 0, "{:?}", sim.checks.violations);
        let (table, key, ..) = sim.checks.counted.keys().next().unwrap().clone();
        drop_row(&mut sim, 1, table, key);
        sim.final_checks();
        assert!(sim.checks.lost_increments > 0);
        assert!(
            sim.checks
                .violations
                .iter()
                .any(|v| v.starts_with("C8: b counts 0")),
            "{:?}",
            sim.checks.violations
        );
    }

    #[test]
    fn c2_and_c3_catch_bad_watermarks() {
        let mut sim = Simulation::new(small()).unwrap();
        run_to(&mut sim, SimTime::from_secs(2));
        assert_eq!(sim.checks.watermark_violations, 0);
        let scope = ScopeId::global();
        // Advertising beyond what was applied (C2).
        sim.on_replica_event(
            0,
            Event::WatermarkAdvanced {
                scope: scope.clone(),
                origin: "c".into(),
                watermark: Watermark {
                    sequence: 1_000_000,
                    timestamp: Timestamp::ZERO,
                },
            },
        );
        assert_eq!(sim.checks.watermark_violations, 1);
        // Going backwards (C3).
        sim.on_replica_event(
            0,
            Event::WatermarkAdvanced {
                scope,
                origin: "c".into(),
                watermark: Watermark::default(),
            },
        );
        assert_eq!(sim.checks.watermark_violations, 2);
        assert!(sim.checks.violations.iter().any(|v| v.starts_with("C3")));
    }

    #[test]
    fn c1_catches_a_reused_sequence() {
        let mut sim = Simulation::new(small()).unwrap();
        run_to(&mut sim, SimTime::from_secs(2));
        let m =
            RowMutation::new("t", "x", vec![Mutation::DeleteFromRow], &Limits::default()).unwrap();
        let e = |ts: u64| LogEntry {
            scope: ScopeId::global(),
            origin: "a".into(),
            // Far beyond anything the workload wrote.
            sequence: 5_000,
            timestamp: Timestamp::from_u64(ts),
            mutation: m.clone(),
        };
        note_durable(&mut sim.checks, &sim.scopes, &sim.names, &e(1));
        note_durable(&mut sim.checks, &sim.scopes, &sim.names, &e(1));
        assert_eq!(
            sim.checks.lost_writes, 0,
            "a second copy of one write is fine"
        );
        note_durable(&mut sim.checks, &sim.scopes, &sim.names, &e(2));
        assert_eq!(
            sim.checks.lost_writes, 1,
            "another write under the same sequence"
        );
    }
}
